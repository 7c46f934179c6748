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
  call; rows that did not need it rewrite a slot with the same token.
  """

  model: T5Model

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

  def propose(self, params, cache, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """gamma one-token calls after the catch-up; see `interfaces.Drafter`."""
    # A row whose cache holds fewer than length-1 tokens had all its drafts
    # accepted: it never consumed x_gamma. Then (and only then) the first
    # call feeds the last two committed tokens; otherwise just the last one.
    behind = jnp.any(cache.position < lengths - 1)
    last, cache = jax.lax.cond(
        behind, functools.partial(self._feed_last, 2),
        functools.partial(self._feed_last, 1), params, cache, sequences,
        lengths)
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
      draft with the target itself.
    target_params: its parameters.
  """

  vocab_size: int
  draft_model: Any = None
  draft_params: Any = None
  train_targets: Optional[Callable[[], Iterable[Sequence[int]]]] = None
  target_model: Any = None
  target_params: Any = None


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
  """

  name: str
  needs_model: bool
  build: Callable[[DraftSource], Tuple[interfaces.Drafter, Any]]
  description: str
  data_only: bool = False


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


def _build_t5(source: DraftSource):
  if source.draft_model is None or source.draft_params is None:
    raise ValueError("drafter kind 't5' needs a draft model and its params "
                     '(DRAFT_MODEL / DRAFT_CHECKPOINT); got draft_model='
                     f'{source.draft_model!r}, draft_params '
                     f'{"None" if source.draft_params is None else "given"}.')
  return T5Drafter(source.draft_model), source.draft_params


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


@dataclasses.dataclass(frozen=True)
class LookupDrafter:
  """Prompt-lookup (LLMA-style) drafts: copies what followed a match.

  T5's encoder and decoder share one vocabulary, so a source token can be
  proposed as an output token. For each row and each draft, the context is
  the decoder prefix (committed tokens, BOS first, then the drafts proposed
  so far in this call); its last n tokens are looked up, n = n_max down to
  n_min, in the stream `source ++ prefix`:

  - source: the row's encoder input tokens (the drafter's state, from
    `init`), without padding 0 and `eos_id` (never matched, never copied);
  - prefix: the context's earlier positions, BOS excluded (a match must be
    followed by a token of the context, so the suffix never matches
    itself); a pattern may not include BOS either.

  Matching rule: the longest n that matches anywhere wins; among the matches
  of that n, the most recent one in the stream (the latest in the prefix,
  else the latest in the source). The draft is the token that followed the
  match. Fallback, where no n matches: `eos_id` (lookup never copies EOS,
  so this is its only way to propose the end of the output, and the source
  has no continuation after its last token). Each draft re-runs the lookup on
  prefix ++ drafts so far, so a match continues copying.

  Deterministic: q is one-hot on the draft (logits 0 there, -inf elsewhere,
  through `sampling.draw`), so the acceptance probability is p(draft) in
  every sampling mode. No parameters: params are `()` (or None). All jnp with
  static shapes, vectorized over the batch; rows are independent.
  """

  vocab_size: int
  n_max: int = 3
  n_min: int = 1
  eos_id: int = 1

  def __post_init__(self):
    ints = (self.vocab_size, self.n_max, self.n_min, self.eos_id)
    if any(isinstance(x, bool) or not isinstance(x, int) for x in ints):
      raise ValueError(f'LookupDrafter fields must be ints, got {self!r}.')
    if not 1 <= self.n_min <= self.n_max:
      raise ValueError(f'LookupDrafter needs 1 <= n_min <= n_max, got '
                       f'n_min={self.n_min}, n_max={self.n_max}.')
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
    """The state is the source: `[batch, input_length]` int32."""
    del params, max_length
    return jnp.asarray(encoder_input_tokens, jnp.int32)

  def prefill(self, params, state, sequences, lengths):
    """Nothing to consume: every lookup reads the whole prefix."""
    del params, sequences, lengths
    return state

  def lookup(self, source: Array, context: Array, length: Array) -> Array:
    """The draft after `context[b, :length[b]]` (BOS first), `[batch]` int32.

    Args:
      source: `[batch, input_length]` encoder input tokens.
      context: `[batch, width]` decoder tokens; those at or after `length`
        are ignored.
      length: `[batch]` int32 tokens of the context (>= 1).
    """
    b, width = context.shape
    source = source.astype(jnp.int32)
    context = context.astype(jnp.int32)
    length = length.astype(jnp.int32)
    # Sentinels (< 0) never equal a token: -1 ignored source, -2 not prefix.
    src = jnp.where((source != 0) & (source != self.eos_id), source, -1)
    pos = jnp.arange(width)[None]
    pre = jnp.where((pos >= 1) & (pos < length[:, None]), context, -2)
    stream = jnp.concatenate(
        [src, jnp.full((b, 1), -1, jnp.int32), pre,
         jnp.full((b, self.n_max), -2, jnp.int32)], axis=1)
    starts = src.shape[1] + 1 + width  # candidate match starts (static)
    token = jnp.full((b,), self.eos_id, jnp.int32)
    found = jnp.zeros((b,), bool)
    for n in range(self.n_max, self.n_min - 1, -1):
      idx = jnp.clip(length[:, None] - n + jnp.arange(n), 0, width - 1)
      pattern = jnp.take_along_axis(context, idx, axis=1)  # [batch, n]
      match = length - n >= 1  # the pattern holds no BOS
      match = match[:, None] & (stream[:, n:n + starts] >= 0)
      for k in range(n):
        match &= stream[:, k:k + starts] == pattern[:, k:k + 1]
      best = jnp.max(jnp.where(match, jnp.arange(starts), -1), axis=1)
      copied = jnp.take_along_axis(
          stream, (jnp.maximum(best, 0) + n)[:, None], axis=1)[:, 0]
      token = jnp.where(found | (best < 0), token, copied)
      found |= best >= 0
    return token

  def _logits(self, token: Array) -> Array:
    """One-hot logits: 0 at `token` `[...]`, -inf elsewhere."""
    iota = jnp.arange(self.vocab_size, dtype=jnp.int32)
    return jnp.where(iota == token[..., None], 0.0, -jnp.inf)

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    del params
    decoder_input_tokens = jnp.asarray(decoder_input_tokens, jnp.int32)
    b, n = decoder_input_tokens.shape
    source = jnp.asarray(encoder_input_tokens, jnp.int32)
    # [length, batch]: position t looks up after tokens :t + 1.
    tokens = jax.vmap(
        lambda t: self.lookup(source, decoder_input_tokens,
                              jnp.full((b,), t + 1, jnp.int32)))(
                                  jnp.arange(n))
    return self._logits(tokens.T)

  def propose(self, params, state, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """gamma lookups, each after the prefix and the drafts before it."""
    del params
    context = jnp.pad(sequences.astype(jnp.int32), ((0, 0), (0, gamma)))
    pos = jnp.arange(context.shape[1])[None]

    def step(context, i_rng):
      i, rng_i = i_rng
      token = self.lookup(state, context, lengths + i)
      token, q = sampling_lib.draw(rng_i, self._logits(token), sampling)
      context = jnp.where(pos == (lengths + i)[:, None], token[:, None],
                          context)
      return context, (token, q)

    _, (tokens, qs) = jax.lax.scan(
        step, context, (jnp.arange(gamma), jax.random.split(rng, gamma)))
    return tokens.T, jnp.moveaxis(qs, 0, 1), state


def _build_lookup(source: DraftSource):
  """Needs nothing but the vocabulary: it copies from each row's own input
  and output."""
  return LookupDrafter(source.vocab_size), ()


register(DrafterKind(
    'lookup', needs_model=False, build=_build_lookup,
    description='prompt lookup: copies what followed the longest recent '
                'match of the last 1-3 tokens in the input or the output'))
