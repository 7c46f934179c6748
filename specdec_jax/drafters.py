"""Drafters: anything that proposes gamma tokens with their distributions q.

The speculative loop (speculative.py) talks to a drafter through the
`interfaces.Drafter` protocol: `init`, `propose` (drafts and the standardized
q they were drawn from, so that the loop's acceptance test is exact),
`prefill` (start from an existing prefix, for measurements), `score` (the
teacher-forced logits `propose` draws from, for measuring alpha),
`check_params` (called before compiling) and `vocab_size`. A drafter that
is deterministic returns one-hot q; exactness holds for any q.

Two classes live here: `T5Drafter` (a small T5 with its own cache, the
paper's T5-small/base/large drafts) and `NgramDrafter` (unigram / bigram
token statistics, the paper's Table 3 baselines). The *kinds* a job may name
('t5', 'unigram', 'bigram') and how each is built from what the job has at
hand (`DraftSource`) are registered once, in `KINDS`; a new kind is one
`register(DrafterKind(...))` call (tests/test_drafters.py then checks it).

References: Leviathan et al. 2023, arXiv 2211.17192, sec. 2.3 and Table 3.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import (Any, Callable, Dict, Iterable, Mapping, Optional,
                    Sequence, Tuple)

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding
from specdec_jax import interfaces
from specdec_jax import sampling as sampling_lib
from specdec_jax.network import T5Model

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class T5Drafter:
  """A T5 (usually much smaller than the target) drafting with its own cache.

  Catch-up: when every draft of the previous iteration was accepted the
  drafter never consumed the last draft x_gamma. `propose` then starts with
  one 2-token call (x_gamma and the bonus token) instead of the usual 1-token
  call; rows that did not need it rewrite a slot with the same token. A cache
  further behind (a `CombinedDrafter` that did not call this drafter for a
  while) is first fed the missing committed tokens, gamma + 1 per call.

  Adaptive draft length (`confidence` > 0, HF's assistant confidence
  threshold): a row stops drafting before the first position where the
  drafter's most likely next token has probability < confidence (softmax of
  its raw logits; q_i = 0 from there on: `interfaces.Drafter.propose`),
  and the draft calls stop once every row has stopped: fewer drafter calls
  where the drafter is unsure, the same output law (the stop is decided from
  q_i before x_i is drawn). Draft 1 is always made.
  """

  model: T5Model
  confidence: float = 0.0

  def __post_init__(self):
    if not 0.0 <= self.confidence < 1.0:
      raise ValueError('T5Drafter confidence (adaptive draft length) must be '
                       f'in [0, 1), got {self.confidence!r}.')

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def check_params(self, params) -> None:
    """Raises ValueError unless params have the model's tree and shapes.

    The reference is `jax.eval_shape` of the model's `init_params`, traced
    once per model; a model without `init_params` is not checked.
    """
    if not hasattr(self.model, 'init_params'):
      return
    want, got = _model_shapes(self.model), _shapes(params)
    problems = [f'{k}: missing, want {want[k]}' for k in want if k not in got]
    problems += [f'{k}: not a parameter of the model' for k in got
                 if k not in want]
    problems += [f'{k}: shape {got[k]}, want {want[k]}' for k in got
                 if k in want and got[k] != want[k]]
    if problems:
      raise ValueError(f'{len(problems)} parameters differ from the model '
                       f'({self.model!r}): ' + '; '.join(problems[:6]))

  def init(self, params, encoder_input_tokens, max_length: int):
    return self.model.init_cache(params, encoder_input_tokens, max_length)

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    return self.model.logits(params, encoder_input_tokens,
                             decoder_input_tokens)

  def prefill(self, params, cache, sequences, lengths):
    """Consumes `sequences[b, :lengths[b] - 1]`; see `interfaces.Drafter`.

    One call on the first n - 1 tokens of every row (n = sequences' width),
    then each row's position is set to lengths - 1: what a row holds past
    it is stale.
    """
    n = sequences.shape[1] - 1
    cache = cache.rewind(jnp.zeros_like(lengths))
    if n > 0:
      _, cache = self.model.extend(params, sequences[:, :n], cache)
    return cache.rewind(lengths - 1)

  def _feed_last(self, k: int, params, cache, sequences, lengths):
    """Feeds the last k committed tokens; logits after the last one.

    Returns:
      `(logits [batch, vocab], cache)` with cache.position = lengths.
    """
    start = jnp.maximum(lengths - k, 0)
    idx = start[:, None] + jnp.arange(k)
    # [batch, k]; at length 1 with k = 2 the second token is a dummy.
    tokens = jnp.take_along_axis(sequences, idx, axis=1)
    logits, cache = self.model.extend(params, tokens, cache.rewind(start))
    last = jnp.take_along_axis(
        logits, (lengths - 1 - start)[:, None, None], axis=1)[:, 0]
    return last, cache.rewind(lengths)

  def _sync(self, params, cache, sequences, lengths, chunk: int):
    """Feeds committed tokens until every row's cache is at most 1 behind.

    A row whose cache holds fewer than lengths - 2 tokens gets the next
    `chunk` committed ones per call; the others rewrite their slot
    lengths - 1, which the next `_feed_last` rewrites anyway. Does nothing
    (no call) when no row is that far behind, the loop's usual case.
    """

    def far(cache):
      return jnp.any(cache.position < lengths - 2)

    def feed(cache):
      behind = cache.position < lengths - 1
      start = jnp.where(behind, cache.position, lengths - 1)
      idx = start[:, None] + jnp.arange(chunk)
      tokens = jnp.take_along_axis(sequences, idx, axis=1)
      _, cache = self.model.extend(params, tokens, cache.rewind(start))
      return cache.rewind(jnp.minimum(start + chunk, lengths - 1))

    return jax.lax.while_loop(far, feed, cache)

  def propose(self, params, cache, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """gamma one-token calls after the catch-up; see `interfaces.Drafter`."""
    cache = self._sync(params, cache, sequences, lengths, gamma + 1)
    # A row whose cache holds fewer than length-1 tokens had all its drafts
    # accepted: it never consumed x_gamma. Then (and only then) the first
    # call feeds the last two committed tokens; otherwise just the last one.
    behind = jnp.any(cache.position < lengths - 1)
    last, cache = jax.lax.cond(
        behind, functools.partial(self._feed_last, 2),
        functools.partial(self._feed_last, 1), params, cache, sequences,
        lengths)
    if self.confidence > 0:
      return self._propose_adaptive(params, cache, last, gamma, sampling,
                                    rng)
    rngs = jax.random.split(rng, gamma)

    def step(carry, rng_i):
      logits_i, cache = carry
      token, q = sampling_lib.draw(rng_i, logits_i, sampling)
      next_logits, cache = self.model.extend(params, token[:, None], cache)
      return (next_logits[:, 0], cache), (token, q)

    (last, cache), (tokens, qs) = jax.lax.scan(
        step, (last, cache), rngs[:-1])
    token, q = sampling_lib.draw(rngs[-1], last, sampling)
    # [gamma-1, batch(, vocab)] + last -> [batch, gamma(, vocab)]
    drafts = jnp.concatenate([tokens.T, token[:, None]], axis=1)
    qs = jnp.concatenate([jnp.moveaxis(qs, 0, 1), q[:, None]], axis=1)
    return drafts, qs, cache

  def _propose_adaptive(self, params, cache, last, gamma, sampling, rng):
    """Drafts while some row is confident; see the class docstring.

    A `lax.while_loop` over draft positions: draft i of a row is made while
    the row has made drafts 1..i-1 and max q_i >= confidence (draft 1
    always); a call feeds draft i only when a draft i + 1 may follow. Each
    row's cache ends holding its prefix and its drafts but the last, as in
    the fixed-length path, so the next catch-up works unchanged.
    """
    batch = last.shape[0]
    rngs = jax.random.split(rng, gamma)
    drafts0 = jnp.zeros((batch, gamma), jnp.int32)
    qs0 = jnp.zeros((batch, gamma, self.vocab_size), jnp.float32)

    def cond(carry):
      i, _, _, going, _, _ = carry
      return (i < gamma) & jnp.any(going)

    def body(carry):
      i, logits, cache, going, drafts, qs = carry
      token, q = sampling_lib.draw(rngs[i], logits, sampling)
      # Confidence from the unadjusted softmax (as HF's assistant threshold;
      # under greedy q itself is one-hot), a function of the prefix only.
      sure = jnp.max(jax.nn.softmax(logits.astype(jnp.float32)), axis=-1)
      going = going & ((i == 0) | (sure >= self.confidence))
      drafts = drafts.at[:, i].set(jnp.where(going, token, 0))
      qs = qs.at[:, i].set(jnp.where(going[:, None], q, 0.0))
      # Rows still drafting consume draft i (its cache slot lengths + i - 1
      # is then valid); the others keep their position.
      position = cache.position
      feed = going & (i + 1 < gamma)
      next_logits, cache = jax.lax.cond(
          jnp.any(feed),
          lambda c: self.model.extend(params, drafts[:, i][:, None], c),
          lambda c: (logits[:, None], c), cache)
      cache = cache.rewind(jnp.where(feed, position + 1, position))
      return i + 1, next_logits[:, 0], cache, going, drafts, qs

    going = jnp.ones((batch,), bool)
    _, _, cache, _, drafts, qs = jax.lax.while_loop(
        cond, body, (jnp.int32(0), last, cache, going, drafts0, qs0))
    return drafts, qs, cache


@dataclasses.dataclass(frozen=True)
class NgramDrafter:
  """Unigram (order 1) or bigram (order 2) drafts from token statistics.

  params: for order 1, `{'log_unigram': [vocab]}`; for order 2 also
  `next_tokens` `[vocab, k]` int32 and `next_log_probs` `[vocab, k]`, the k
  most frequent successors of each token with their smoothed log-probabilities,
  and `log_backoff` `[vocab]`: every other successor x of token a gets
  `log_backoff[a] + log_unigram[x]`. This keeps a bigram over a 32k vocabulary
  at vocab * k entries instead of vocab^2.
  Build params with `ngram_params`.
  """

  vocab_size: int
  order: int = 2

  def __post_init__(self):
    if self.order not in (1, 2):
      raise ValueError(f'NgramDrafter order must be 1 or 2, got {self.order}.')

  def check_params(self, params) -> None:
    """Raises unless params have the keys and shapes of the class docstring.

    Shapes are read from arrays and `jax.ShapeDtypeStruct`s alike;
    `next_tokens` must be integer ids in [0, vocab_size) (values checked
    when concrete, as `decoding.check_token_ids`).

    Raises:
      ValueError: a missing key or a wrong shape; TypeError: next_tokens
        not integer.
    """
    if not isinstance(params, Mapping):
      raise ValueError(f'params must be a dict of arrays, got '
                       f'{type(params).__name__}.')
    v = self.vocab_size
    want = {'log_unigram': (v,)}
    if self.order == 2:
      k = np.shape(params.get('next_tokens', ()))[1:2] or ('k',)
      want.update(next_tokens=(v,) + k, next_log_probs=(v,) + k,
                  log_backoff=(v,))
    for name, shape in want.items():
      if name not in params:
        raise ValueError(f'{name!r} is missing (order {self.order} needs '
                         f'{sorted(want)}).')
      if tuple(np.shape(params[name])) != shape or 0 in shape:
        raise ValueError(
            f'{name!r} has shape {tuple(np.shape(params[name]))}; '
            f'vocab_size={v}, order={self.order} needs {shape}.')
    if self.order == 2:
      decoding.check_token_ids('next_tokens', params['next_tokens'], v)

  def init(self, params, encoder_input_tokens, max_length: int):
    del params, encoder_input_tokens, max_length
    return ()

  def log_q(self, params, prev: Array) -> Array:
    """`[batch]` previous tokens -> `[batch, vocab]` log-probabilities."""
    log_uni = jnp.broadcast_to(params['log_unigram'],
                               prev.shape + (self.vocab_size,))
    if self.order == 1:
      return log_uni
    tokens = params['next_tokens'][prev]  # [batch, k]
    log_p = params['next_log_probs'][prev]
    rows = jnp.arange(prev.shape[0])[:, None]
    base = log_uni + params['log_backoff'][prev][:, None]
    return base.at[rows, tokens].set(log_p)

  def prefill(self, params, state, sequences, lengths):
    """Nothing to consume: `propose` reads the last committed token."""
    del params, sequences, lengths
    return state

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    del encoder_input_tokens
    b, n = decoder_input_tokens.shape
    log_q = self.log_q(params, decoder_input_tokens.reshape(-1))
    return log_q.reshape(b, n, self.vocab_size)

  def propose(self, params, state, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """Drafts from the last committed token on; see `interfaces.Drafter`."""
    prev = jnp.take_along_axis(sequences, (lengths - 1)[:, None], axis=1)[:, 0]

    def step(prev, rng_i):
      token, q = sampling_lib.draw(rng_i, self.log_q(params, prev), sampling)
      return token, (token, q)

    _, (tokens, qs) = jax.lax.scan(step, prev, jax.random.split(rng, gamma))
    return tokens.T, jnp.moveaxis(qs, 0, 1), state


def _shapes(tree) -> Dict[str, Tuple[int, ...]]:
  """{'a/b/c': shape} of a params tree (arrays or ShapeDtypeStructs)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {'/'.join(str(getattr(key, 'key', key)) for key in path):
          tuple(np.shape(leaf)) for path, leaf in leaves}


@functools.lru_cache(maxsize=None)
def _model_shapes(model) -> Dict[str, Tuple[int, ...]]:
  return _shapes(jax.eval_shape(model.init_params, jax.random.key(0)))


def ngram_params(sequences: Sequence[Sequence[int]], vocab_size: int,
                 order: int = 2, top_k: int = 64, smoothing: float = 0.1,
                 bos_id: int = 0):
  """Estimates NgramDrafter params from target-side token sequences.

  Args:
    sequences: token id sequences (decoder targets, without BOS).
    vocab_size: vocabulary size.
    order: 1 (unigram) or 2 (bigram).
    top_k: successors kept per token for the bigram.
    smoothing: mass given to the unigram back-off for each previous token
      (add-one smoothing keeps every unigram probability > 0).
    bos_id: the decoder start token; the first token's context.

  Returns:
    A params dict for `NgramDrafter(vocab_size, order)`.
  """
  if not 0 < smoothing <= 1:
    raise ValueError(f'smoothing must be in (0, 1], got {smoothing}.')
  counts = np.ones(vocab_size, np.float64)
  pairs = {}
  for seq in sequences:
    seq = [int(t) for t in seq]
    if any(not 0 <= t < vocab_size for t in seq):
      raise ValueError(f'token id outside [0, {vocab_size}) in {seq[:10]}...')
    np.add.at(counts, seq, 1)
    for a, b in zip([bos_id] + seq[:-1], seq):
      pairs.setdefault(a, {}).setdefault(b, 0)
      pairs[a][b] += 1
  unigram = counts / counts.sum()
  params = {'log_unigram': jnp.asarray(np.log(unigram), jnp.float32)}
  if order == 1:
    return params
  # Tokens never seen as a context: pure unigram (slot 0 restates token 0).
  next_tokens = np.zeros((vocab_size, top_k), np.int32)
  next_log_probs = np.full((vocab_size, top_k), np.log(unigram[0]), np.float32)
  log_backoff = np.zeros(vocab_size, np.float32)
  for a, succ in pairs.items():
    items = sorted(succ.items(), key=lambda kv: -kv[1])[:top_k]
    total = sum(succ.values())
    toks = np.array([t for t, _ in items])
    # Kept successors get (1 - smoothing) of their empirical share; the rest
    # of the mass (>= smoothing) is spread over all tokens by the unigram.
    kept = (1 - smoothing) * np.array([c for _, c in items]) / total
    backoff = 1.0 - kept.sum()
    probs = kept + backoff * unigram[toks]
    # Unused slots repeat the first kept token with its own probability.
    pad = top_k - len(toks)
    next_tokens[a] = np.concatenate([toks, np.full(pad, toks[0])])
    next_log_probs[a] = np.log(np.concatenate([probs, np.full(pad, probs[0])]))
    log_backoff[a] = np.log(backoff)
  params.update(
      next_tokens=jnp.asarray(next_tokens),
      next_log_probs=jnp.asarray(next_log_probs),
      log_backoff=jnp.asarray(log_backoff),
  )
  return params


# ---------------------------------------------------------------------------
# Drafter kinds: what a job may name, and how each is built.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DraftSource:
  """What a drafter kind may be built from (a kind reads what it needs).

  Attributes:
    vocab_size: the target's vocabulary size.
    draft_model: a separate draft model (`network.T5Model`), loaded by the
      caller when the kind `needs_model`.
    draft_params: its parameters.
    train_targets: a callable returning the task's train target ids, read
      only by kinds that need them (lazily: reading a train split costs):
      an iterable of token id sequences as the decoder emits them: no BOS,
      no padding (0s dropped), EOS kept.
    target_model: the target (`interfaces.DecodingModel`), for kinds that
      draft with the target itself or embed requests with it.
    target_params: its parameters.
    train_pairs: like train_targets, (input ids, target ids) pairs: what
      an output cache is seeded with when it starts empty.
    output_cache: an `output_cache.OutputCache` (the 'cache' and 'combined'
      kinds draft from it; the eval job appends to it), or None: a new one,
      seeded with train_pairs.
    output_length: the task's target length (a new cache's output width).
    confidence: adaptive draft length: > 0 makes model drafters stop below
      this confidence and copying drafters stop where nothing matches
      (`T5Drafter`, `LookupDrafter.adaptive`); 0 drafts gamma always.
    draft_checkpoint: DRAFT_CHECKPOINT for kinds that read their own
      parameters from a checkpoint without a separate model ('pass': the
      look-ahead embeddings).
  """

  vocab_size: int
  draft_model: Any = None
  draft_params: Any = None
  train_targets: Optional[Callable[[], Iterable[Sequence[int]]]] = None
  target_model: Any = None
  target_params: Any = None
  train_pairs: Optional[Callable[[], Iterable[Tuple[Sequence[int],
                                                    Sequence[int]]]]] = None
  output_cache: Any = None
  output_length: int = 64
  confidence: float = 0.0
  draft_checkpoint: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class DrafterKind:
  """A kind of drafter a job may name (`EvalSetup.drafter`).

  Attributes:
    name: the name ('t5', 'bigram', ...).
    needs_model: built from `DraftSource.draft_model` / `draft_params`, a
      separate model the caller loads (DRAFT_MODEL / DRAFT_CHECKPOINT).
    build: `DraftSource -> (drafter, params)`, the drafter an
      `interfaces.Drafter`. Raises ValueError when the source lacks what the
      kind needs.
    description: one line for listings and error messages.
    data_only: built from `DraftSource.train_targets` and `vocab_size`
      alone, so the result is a function of (task, vocab_size): a caller may
      build it once per task and reuse it.
    uses_cache: drafts from `DraftSource.output_cache`: the caller opens
      (or creates) the store and appends finished outputs to it (the
      function `with_store` refreshes the drafter's params).
    needs_target: built from `DraftSource.target_model` / `target_params`
      (drafts with the target itself, or embeds requests with it).
  """

  name: str
  needs_model: bool
  build: Callable[[DraftSource], Tuple[interfaces.Drafter, Any]]
  description: str
  data_only: bool = False
  uses_cache: bool = False
  needs_target: bool = False


KINDS: Dict[str, DrafterKind] = {}


def register(kind: DrafterKind) -> DrafterKind:
  """Adds a kind to `KINDS`; refuses a name that is already there."""
  if kind.name in KINDS:
    raise ValueError(f'A drafter kind named {kind.name!r} is already '
                     'registered.')
  KINDS[kind.name] = kind
  return kind


def get_kind(name: str) -> DrafterKind:
  """The registered kind `name`; ValueError naming the known ones."""
  if name not in KINDS:
    raise ValueError(f'Unknown drafter kind {name!r}; known kinds: '
                     f'{sorted(KINDS)}.')
  return KINDS[name]


def _build_t5(source: DraftSource, kind: str = 't5'):
  if source.draft_model is None or source.draft_params is None:
    raise ValueError(f'drafter kind {kind!r} needs a draft model and its '
                     'params (DRAFT_MODEL / DRAFT_CHECKPOINT); got '
                     f'draft_model='
                     f'{source.draft_model!r}, draft_params '
                     f'{"None" if source.draft_params is None else "given"}.')
  return (T5Drafter(source.draft_model, source.confidence),
          source.draft_params)


def _build_ngram(order: int, source: DraftSource):
  name = {1: 'unigram', 2: 'bigram'}[order]
  if source.train_targets is None:
    raise ValueError(f'drafter kind {name!r} is estimated from the task\'s '
                     'train targets; the source has no train_targets.')
  params = ngram_params(list(source.train_targets()), source.vocab_size,
                        order)
  return NgramDrafter(source.vocab_size, order), params


register(DrafterKind(
    't5', needs_model=True, build=_build_t5,
    description='a separate T5 (e.g. T5 1.1 small) with its own cache'))
register(DrafterKind(
    'unigram', needs_model=False, data_only=True,
    build=functools.partial(_build_ngram, 1),
    description="unigram statistics of the task's train targets"))
register(DrafterKind(
    'bigram', needs_model=False, data_only=True,
    build=functools.partial(_build_ngram, 2),
    description="bigram statistics of the task's train targets"))


# ---------------------------------------------------------------------------
# Prompt lookup: drafts copied from the input and the output so far.
# ---------------------------------------------------------------------------


def lookup_next(stream: Array, context: Array, length: Array, n_max: int,
                n_min: int) -> Tuple[Array, Array]:
  """The token that followed the longest recent match of a context's suffix.

  For each row, the last n tokens of `context[b, :length[b]]` (n = n_max
  down to n_min; a pattern may include BOS, never a position before it) are
  looked up in `stream[b] ++ context[b, 1:length[b]]`, the context's own
  positions after BOS (so a suffix never matches itself). The longest n that
  matches anywhere wins; among its matches the latest, i.e. the own prefix
  first, then the stream from its end. Entries < 0 in `stream` never match
  and are never copied (separators, ignored tokens); a 0 in it matches BOS
  (how a cached output's first token can follow BOS).

  Args:
    stream: `[batch, s]` int32 reference tokens (negative: none).
    context: `[batch, width]` decoder tokens, BOS first; those at or after
      `length` are ignored.
    length: `[batch]` int32 tokens of the context (>= 1).
    n_max, n_min: the pattern lengths tried (static).

  Returns:
    `(token [batch] int32, n [batch] int32)`: the copied token and the
    length of the match, n = 0 (and token -1) where none matched.
  """
  b, width = context.shape
  context = context.astype(jnp.int32)
  length = length.astype(jnp.int32)
  pos = jnp.arange(width)[None]
  pre = jnp.where((pos >= 1) & (pos < length[:, None]), context, -2)
  full = jnp.concatenate(
      [stream.astype(jnp.int32), jnp.full((b, 1), -1, jnp.int32), pre,
       jnp.full((b, n_max), -2, jnp.int32)], axis=1)
  starts = stream.shape[1] + 1 + width  # candidate match starts (static)
  token = jnp.full((b,), -1, jnp.int32)
  found = jnp.zeros((b,), jnp.int32)
  for n in range(n_max, n_min - 1, -1):
    idx = jnp.clip(length[:, None] - n + jnp.arange(n), 0, width - 1)
    pattern = jnp.take_along_axis(context, idx, axis=1)  # [batch, n]
    match = length - n >= 0  # the pattern lies in the context
    match = match[:, None] & (full[:, n:n + starts] >= 0)
    for k in range(n):
      match &= full[:, k:k + starts] == pattern[:, k:k + 1]
    best = jnp.max(jnp.where(match, jnp.arange(starts), -1), axis=1)
    copied = jnp.take_along_axis(
        full, (jnp.maximum(best, 0) + n)[:, None], axis=1)[:, 0]
    hit = (found == 0) & (best >= 0)
    token = jnp.where(hit, copied, token)
    found = jnp.where(hit, n, found)
  return token, found


def source_stream(encoder_input_tokens: Array, eos_id: int) -> Array:
  """A lookup stream of encoder inputs: padding 0 and EOS become -1."""
  source = jnp.asarray(encoder_input_tokens, jnp.int32)
  return jnp.where((source != 0) & (source != eos_id), source, -1)


def one_hot_logits(token: Array, vocab_size: int) -> Array:
  """Logits 0 at `token` `[...]`, -inf elsewhere (a deterministic draft)."""
  iota = jnp.arange(vocab_size, dtype=jnp.int32)
  return jnp.where(iota == token[..., None], 0.0, -jnp.inf)


@dataclasses.dataclass(frozen=True)
class LookupDrafter:
  """Prompt-lookup (LLMA-style) drafts: copies what followed a match.

  T5's encoder and decoder share one vocabulary, so a source token can be
  proposed as an output token. For each row and each draft, the context is
  the decoder prefix (committed tokens, BOS first, then the drafts proposed
  so far in this call); its last n tokens are looked up (`lookup_next`),
  n = n_max down to n_min, in the stream `source ++ prefix`:

  - source: the row's encoder input tokens (the drafter's state, from
    `init`), without padding 0 and `eos_id` (never matched, never copied);
  - prefix: the context's earlier positions, BOS excluded (a match must be
    followed by a token of the context, so the suffix never matches
    itself); a pattern including BOS matches nothing here.

  Matching rule: the longest n that matches anywhere wins; among the matches
  of that n, the most recent one in the stream (the latest in the prefix,
  else the latest in the source). The draft is the token that followed the
  match. Where no n matches: `eos_id` (lookup never copies EOS, so this is
  its only way to propose the end of the output, and the source has no
  continuation after its last token), or, with `adaptive`, no draft at all:
  the row stops drafting there (q = 0 from that position on,
  `interfaces.Drafter.propose`). Each draft re-runs the lookup on
  prefix ++ drafts so far, so a match continues copying.

  Deterministic: q is one-hot on the draft (logits 0 there, -inf elsewhere,
  through `sampling.draw`), so the acceptance probability is p(draft) in
  every sampling mode. No parameters: params are `()` (or None). All jnp with
  static shapes, vectorized over the batch; rows are independent.
  Subclasses draft from other streams by overriding `init`.
  """

  vocab_size: int
  n_max: int = 3
  n_min: int = 1
  eos_id: int = 1
  adaptive: bool = False

  def __post_init__(self):
    ints = (self.vocab_size, self.n_max, self.n_min, self.eos_id)
    if any(isinstance(x, bool) or not isinstance(x, int) for x in ints):
      raise ValueError(f'{type(self).__name__} fields must be ints, got '
                       f'{self!r}.')
    if not 1 <= self.n_min <= self.n_max:
      raise ValueError(f'{type(self).__name__} needs 1 <= n_min <= n_max, '
                       f'got n_min={self.n_min}, n_max={self.n_max}.')
    if not 0 <= self.eos_id < self.vocab_size:
      raise ValueError(f'eos_id={self.eos_id} is outside [0, '
                       f'{self.vocab_size}).')

  def check_params(self, params) -> None:
    """Accepts `()` or None (no parameters); ValueError otherwise."""
    if params is None or (isinstance(params, tuple) and not params):
      return
    raise ValueError('the lookup drafter has no parameters: draft_params '
                     f'must be () or None, got {type(params).__name__}.')

  def init(self, params, encoder_input_tokens, max_length: int):
    """The state is the lookup stream `[batch, s]` (`source_stream`)."""
    del params, max_length
    return source_stream(encoder_input_tokens, self.eos_id)

  def prefill(self, params, state, sequences, lengths):
    """Nothing to consume: every lookup reads the whole prefix."""
    del params, sequences, lengths
    return state

  def lookup(self, stream: Array, context: Array, length: Array):
    """`(token, matched)` `[batch]` after `context[b, :length[b]]`.

    token is the copied token, or `eos_id` where nothing matched
    (matched False).
    """
    token, n = lookup_next(stream, context, length, self.n_max, self.n_min)
    return jnp.where(n > 0, token, self.eos_id), n > 0

  def score_tokens(self, params, encoder_input_tokens, decoder_input_tokens):
    """`(tokens, matched)` `[batch, length]`: the lookup after each prefix."""
    decoder_input_tokens = jnp.asarray(decoder_input_tokens, jnp.int32)
    b, n = decoder_input_tokens.shape
    stream = self.init(params, encoder_input_tokens, n)
    # [length, batch]: position t looks up after tokens :t + 1.
    tokens, matched = jax.vmap(
        lambda t: self.lookup(stream, decoder_input_tokens,
                              jnp.full((b,), t + 1, jnp.int32)))(
                                  jnp.arange(n))
    return tokens.T, matched.T

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    """One-hot logits of the draft after each prefix (the fallback where
    nothing matched, also when `adaptive`, which does not draft there)."""
    tokens, _ = self.score_tokens(params, encoder_input_tokens,
                                  decoder_input_tokens)
    return one_hot_logits(tokens, self.vocab_size)

  def propose(self, params, state, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """gamma lookups, each after the prefix and the drafts before it."""
    del params
    context = jnp.pad(sequences.astype(jnp.int32), ((0, 0), (0, gamma)))
    pos = jnp.arange(context.shape[1])[None]

    def step(carry, i_rng):
      context, going = carry
      i, rng_i = i_rng
      token, matched = self.lookup(state, context, lengths + i)
      token, q = sampling_lib.draw(
          rng_i, one_hot_logits(token, self.vocab_size), sampling)
      if self.adaptive:
        going = going & matched
        q = jnp.where(going[:, None], q, 0.0)
      context = jnp.where(pos == (lengths + i)[:, None], token[:, None],
                          context)
      return (context, going), (token, q)

    going = jnp.ones(lengths.shape, bool)
    _, (tokens, qs) = jax.lax.scan(
        step, (context, going),
        (jnp.arange(gamma), jax.random.split(rng, gamma)))
    return tokens.T, jnp.moveaxis(qs, 0, 1), state


@dataclasses.dataclass(frozen=True)
class CacheDrafter(LookupDrafter):
  """Drafts copied from the outputs of the most similar earlier requests.

  `init` embeds each row's request with the target's encoder
  (`output_cache.embed`), retrieves its `neighbours` nearest entries of the
  cache (`output_cache.retrieve`: a matrix product and top-k, on device)
  and lays out the lookup stream `source, neighbour_k, ..., neighbour_1`
  (`output_cache.neighbour_stream`: the most similar last, each output
  after a BOS marker, EOS kept). Drafting is then `LookupDrafter`'s: the
  longest recent match of the prefix's last n tokens in the row's own
  output, else its nearest neighbours' outputs, else its source; a prefix
  of BOS alone matches the start of every neighbour's output, so the first
  token is drafted too. One-hot q: exact in every sampling mode.

  params: `{'embedder': the target's params, 'keys', 'outputs', 'valid'}`
  (`output_cache.OutputCache.device_params`; the function `with_store`
  refreshes them after the cache grew).
  """

  embedder: Any = None  # the target's T5Model: embeds the requests
  neighbours: int = 4

  def __post_init__(self):
    super().__post_init__()
    if self.embedder is None:
      raise ValueError('CacheDrafter needs embedder, the target T5Model '
                       'whose encoder embeds the requests.')
    if isinstance(self.neighbours, bool) or not isinstance(
        self.neighbours, int) or self.neighbours < 1:
      raise ValueError(f'neighbours must be an int >= 1, got '
                       f'{self.neighbours!r}.')

  def check_params(self, params) -> None:
    """Raises unless params hold the embedder's params and a cache."""
    if not isinstance(params, Mapping) or not {
        'embedder', 'keys', 'outputs', 'valid'} <= set(params):
      raise ValueError("the cache drafter's params are {'embedder': target "
                       "params, 'keys', 'outputs', 'valid'} "
                       '(OutputCache.device_params), got '
                       f'{type(params).__name__}.')
    T5Drafter(self.embedder).check_params(params['embedder'])
    c, d = np.shape(params['keys'])
    if d != self.embedder.config.emb_dim:
      raise ValueError(f"cache keys have dim {d}; the embedder's emb_dim is "
                       f'{self.embedder.config.emb_dim} (a cache built by '
                       'another model).')
    if np.shape(params['outputs'])[0] != c or np.shape(
        params['valid']) != (c,):
      raise ValueError(f'cache arrays disagree: keys {np.shape(params["keys"])}'
                       f', outputs {np.shape(params["outputs"])}, valid '
                       f'{np.shape(params["valid"])}.')
    if c < self.neighbours:
      raise ValueError(f'cache capacity {c} < neighbours {self.neighbours}.')
    decoding.check_token_ids('cache outputs', params['outputs'],
                             self.vocab_size)

  def init(self, params, encoder_input_tokens, max_length: int):
    """The stream `source, neighbours (least similar first)` `[batch, s]`."""
    from specdec_jax import output_cache  # pylint: disable=g-import-not-at-top
    del max_length
    queries = output_cache.embed(self.embedder, params['embedder'],
                                 encoder_input_tokens)
    index, ok = output_cache.retrieve(params, queries, self.neighbours)
    source = source_stream(encoder_input_tokens, self.eos_id)
    gap = jnp.full((source.shape[0], 1), -1, jnp.int32)
    return jnp.concatenate(
        [source, gap, output_cache.neighbour_stream(params, index, ok)], 1)


@dataclasses.dataclass(frozen=True)
class CombinedDrafter:
  """A copying drafter where it has a draft, a model drafter elsewhere.

  Per row and per draft position: where the `reference` (a `LookupDrafter`
  or `CacheDrafter`) matches the context (prefix ++ drafts so far) and
  either the model is unsure (its top token's probability, softmax of its
  raw logits, below `trust`) or the match is the longest the reference
  tries (`n_max` tokens), its copied token with one-hot q; elsewhere the
  `model` drafter's (a `T5Drafter`) sample and q, the model consuming
  whichever token was drafted. (trust = 1: copy wherever anything matches.)
  In an iteration where every row's first draft is such a sure copy (or the
  row has ended) the model is not called at all: the rows copy as far as
  the reference matches and stop there (q = 0 after), and the model's cache
  is caught up later (`T5Drafter._sync`). Where copying works the drafter
  costs ~0, elsewhere it costs the model's calls. Exact in every sampling
  mode: each draft carries the q it was drawn from, and the choice between
  the two is made before drawing. (The model's own `confidence` is not
  applied here.)

  params: `{'reference': ..., 'model': ...}`; state: `(reference state,
  model cache)`.
  """

  reference: LookupDrafter
  model: T5Drafter
  trust: float = 1.0

  def __post_init__(self):
    if not self.reference.adaptive:
      object.__setattr__(self, 'reference',
                         dataclasses.replace(self.reference, adaptive=True))
    check_vocab = self.reference.vocab_size != self.model.vocab_size
    if check_vocab:
      raise ValueError(f'CombinedDrafter: the reference drafts ids of '
                       f'{self.reference.vocab_size} tokens, the model of '
                       f'{self.model.vocab_size}.')

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def check_params(self, params) -> None:
    if not isinstance(params, Mapping) or set(params) != {'reference',
                                                          'model'}:
      raise ValueError("the combined drafter's params are {'reference': ..., "
                       f"'model': ...}}, got {type(params).__name__}"
                       f'{sorted(params) if isinstance(params, Mapping) else ""}.')
    self.reference.check_params(params['reference'])
    self.model.check_params(params['model'])

  def init(self, params, encoder_input_tokens, max_length: int):
    return (self.reference.init(params['reference'], encoder_input_tokens,
                                max_length),
            self.model.init(params['model'], encoder_input_tokens,
                            max_length))

  def prefill(self, params, state, sequences, lengths):
    return (state[0], self.model.prefill(params['model'], state[1],
                                         sequences, lengths))

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    """The reference's one-hot logits where it matches, the model's
    elsewhere (per position, as `propose`)."""
    tokens, matched = self.reference.score_tokens(
        params['reference'], encoder_input_tokens, decoder_input_tokens)
    model = self.model.score(params['model'], encoder_input_tokens,
                             decoder_input_tokens)
    return jnp.where(matched[..., None],
                     one_hot_logits(tokens, self.vocab_size), model)

  def propose(self, params, state, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """Per position: the reference's draft where it matches, else the
    model's; the model is skipped when every row's first draft matches."""
    ref_state, cache = state
    ref, model = self.reference, self.model
    context = jnp.pad(sequences.astype(jnp.int32), ((0, 0), (0, gamma)))
    pos = jnp.arange(context.shape[1])[None]
    # With trust < 1 the model may overrule a copy unless its match is the
    # longest (n_max): only such rows may skip the model.
    sure_n = ref.n_min if self.trust >= 1 else ref.n_max
    _, first_n = lookup_next(ref_state, context, lengths, ref.n_max,
                             ref.n_min)
    last_token = jnp.take_along_axis(sequences, (lengths - 1)[:, None], 1)
    need = (first_n < sure_n) & (last_token[:, 0] != ref.eos_id)
    # Slots from lengths - 1 on may hold drafts that were not committed.
    cache = cache.rewind(jnp.minimum(cache.position, lengths - 1))
    rngs = jax.random.split(rng, gamma)

    def copy_only(cache):
      drafts, q, _ = ref.propose(params['reference'], ref_state, sequences,
                                 lengths, gamma, sampling, rng)
      return drafts, q, cache

    def mixed(cache):
      mp = params['model']
      cache = model._sync(mp, cache, sequences, lengths, gamma + 1)  # pylint: disable=protected-access
      behind = jnp.any(cache.position < lengths - 1)
      logits, cache = jax.lax.cond(
          behind, functools.partial(model._feed_last, 2),  # pylint: disable=protected-access
          functools.partial(model._feed_last, 1), mp, cache, sequences,  # pylint: disable=protected-access
          lengths)

      def choose(i, context, logits):
        token_r, n = lookup_next(ref_state, context, lengths + i, ref.n_max,
                                 ref.n_min)
        unsure = jnp.max(jax.nn.softmax(logits.astype(jnp.float32)),
                         axis=-1) < self.trust
        hit = (n > 0) & (unsure | (n >= ref.n_max))
        token_r = jnp.where(n > 0, token_r, ref.eos_id)
        token_r, q_r = sampling_lib.draw(
            rngs[i], one_hot_logits(token_r, self.vocab_size), sampling)
        token_m, q_m = sampling_lib.draw(rngs[i], logits, sampling)
        token = jnp.where(hit, token_r, token_m)
        q = jnp.where(hit[:, None], q_r, q_m)
        context = jnp.where(pos == (lengths + i)[:, None], token[:, None],
                            context)
        return token, q, context

      def step(carry, i):
        context, logits, cache = carry
        token, q, context = choose(i, context, logits)
        next_logits, cache = model.model.extend(mp, token[:, None], cache)
        return (context, next_logits[:, 0], cache), (token, q)

      # As T5Drafter: gamma - 1 calls; x_gamma is not consumed (the next
      # catch-up feeds it if it was accepted).
      (ctx, logits, cache), (tokens, qs) = jax.lax.scan(
          step, (context, logits, cache), jnp.arange(gamma - 1))
      token, q, _ = choose(gamma - 1, ctx, logits)
      drafts = jnp.concatenate([tokens.T, token[:, None]], axis=1)
      return drafts, jnp.concatenate(
          [jnp.moveaxis(qs, 0, 1), q[:, None]], axis=1), cache

    drafts, q, cache = jax.lax.cond(jnp.any(need), mixed, copy_only, cache)
    return drafts, q, (ref_state, cache)


def _build_lookup(source: DraftSource):
  """Needs nothing but the vocabulary: it copies from each row's own input
  and output."""
  return LookupDrafter(source.vocab_size, adaptive=source.confidence > 0), ()


def open_cache(source: DraftSource):
  """`source.output_cache`, or a new store seeded with its train pairs."""
  from specdec_jax import output_cache  # pylint: disable=g-import-not-at-top
  if source.target_model is None or source.target_params is None:
    raise ValueError('an output cache embeds requests with the target: the '
                     'source needs target_model and target_params.')
  if source.output_cache is not None:
    return source.output_cache
  store = output_cache.OutputCache.for_model(
      source.target_model, source.target_params, source.output_length)
  store.add_pairs(source.target_model, source.target_params,
                  list(source.train_pairs()) if source.train_pairs else [])
  return store


def _cache_drafter(source: DraftSource):
  store = open_cache(source)
  drafter = CacheDrafter(source.vocab_size, adaptive=source.confidence > 0,
                         embedder=source.target_model)
  return drafter, dict({'embedder': source.target_params},
                       **store.device_params())


# The 'combined' kind's rule: copy where the draft model's top token is less
# likely than COMBINED_TRUST, or where the match is COMBINED_LONG_MATCH
# tokens long; else the model's draft. On the shipped synopsis rows (cache
# of other rows' outputs, gamma 6, greedy) copying wherever anything matched
# lowered alpha (0.585 vs dec2's 0.619); this rule raised it (0.629).
COMBINED_TRUST = 0.3
COMBINED_LONG_MATCH = 6


def _build_combined(source: DraftSource):
  """The cache (or, without a target to embed with, lookup) over the draft
  model, by the rule above."""
  model, model_params = _build_t5(source, 'combined')
  if source.target_model is None:
    reference, ref_params = LookupDrafter(source.vocab_size, adaptive=True), ()
  else:
    reference, ref_params = _cache_drafter(source)
  reference = dataclasses.replace(reference, n_max=COMBINED_LONG_MATCH)
  return (CombinedDrafter(reference, model, COMBINED_TRUST),
          {'reference': ref_params, 'model': model_params})


def with_store(drafter, params, store):
  """A 'cache' / 'combined' drafter's params after `store` changed."""
  if isinstance(drafter, CombinedDrafter):
    return dict(params, reference=with_store(drafter.reference,
                                             params['reference'], store))
  if isinstance(drafter, CacheDrafter):
    return dict(params, **store.device_params())
  return params


register(DrafterKind(
    'lookup', needs_model=False, build=_build_lookup,
    description='prompt lookup: copies what followed the longest recent '
                'match of the last 1-3 tokens in the input or the output'))
register(DrafterKind(
    'cache', needs_model=False, build=_cache_drafter, uses_cache=True,
    needs_target=True,
    description='semantic output cache: copies from the outputs of the most '
                'similar earlier requests (and the input, the output)'))
register(DrafterKind(
    'combined', needs_model=True, build=_build_combined, uses_cache=True,
    description='the cache / lookup draft where one matches, the draft '
                'model elsewhere (per row, per iteration)'))


# Kinds written in modules of their own register themselves when imported;
# importing them here keeps `KINDS` complete for every caller. (They import
# this module, whose names are all defined by now.)
from specdec_jax import pass_drafter  # pylint: disable=g-import-not-at-top,unused-import,wrong-import-position
from specdec_jax import draft_heads  # pylint: disable=g-import-not-at-top,unused-import,wrong-import-position
