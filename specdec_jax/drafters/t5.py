"""A separate T5 drafts: the paper's T5-small / base / large drafters.

`T5Drafter` keeps its own decoder cache and drafts gamma tokens with a
2-token catch-up call and gamma - 1 one-token calls; kind 't5' builds it
from DRAFT_MODEL / DRAFT_CHECKPOINT.

References: Leviathan et al. 2023, arXiv 2211.17192, sec. 2.3 and 4.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import interfaces
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import registry
from specdec_jax.network import T5Model

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class T5Drafter:
  """A T5 (usually much smaller than the target) drafting with its own cache.

  Catch-up: when every draft of the previous iteration was accepted the
  drafter never consumed the last draft x_gamma. So `propose` starts with
  one 2-token call on the last two committed tokens (x_gamma and the bonus
  token there); rows that had consumed the first of them rewrite its slot
  with the same token (`catch_up`). A cache further behind (a
  `CombinedDrafter` that did not call this drafter for a while) is first
  fed the missing committed tokens (`catch_up_from_behind`).

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
    decoding.check_is('T5Drafter model', self.model,
                      interfaces.DecodingModel, 'network.T5Model(config)')
    if not checks.is_number(self.confidence) or not (
        0.0 <= self.confidence < 1.0):
      raise checks.InputError(
          'T5Drafter confidence (adaptive draft length) must be a number '
          f'in [0, 1), got {self.confidence!r}.')

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def check_params(self, params) -> None:
    """Raises InputError unless params have the model's tree and shapes
    (the model's `check_params`)."""
    self.model.check_params(params)

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

  def _sync(self, params, cache, sequences, lengths, chunk: int):
    """Feeds committed tokens until every row's cache is at most 1 behind.

    A row whose cache holds fewer than lengths - 2 tokens gets the next
    `chunk` committed ones per call; the others rewrite their slot
    lengths - 1, which the next `catch_up` rewrites anyway. Does nothing
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

  def catch_up(self, params, cache, sequences, lengths):
    """The cache after every committed token; the logits after the last.

    For a cache holding at least lengths - 2 tokens, the loop's own case:
    a row that had all its drafts accepted never consumed x_gamma, the
    others did. One call feeds every row its last two committed tokens
    (the first rewrites a slot already holding that token where it was
    consumed): one program whichever rows were accepted, no `lax.cond`
    (on a GPU, outside a CUDA graph, XLA reads its predicate on the host
    every iteration) and, on an accelerator, about the cost of a 1-token
    call.

    Returns:
      `(logits [batch, vocab], cache)`: the logits draft 1 is drawn from;
      cache.position = lengths.
    """
    start = jnp.maximum(lengths - 2, 0)
    idx = start[:, None] + jnp.arange(2)
    # [batch, 2]; at length 1 the second token is a dummy.
    tokens = jnp.take_along_axis(sequences, idx, axis=1)
    logits, cache = self.model.extend(params, tokens, cache.rewind(start))
    last = jnp.take_along_axis(
        logits, (lengths - 1 - start)[:, None, None], axis=1)[:, 0]
    return last, cache.rewind(lengths)

  def catch_up_from_behind(self, params, cache, sequences, lengths,
                           chunk: int):
    """`catch_up` for a cache any number of tokens behind.

    A row whose cache holds fewer than lengths - 2 tokens (a
    `CombinedDrafter` that did not call this drafter for a while) is first
    fed the missing committed tokens, `chunk` per call (`_sync`).
    """
    cache = self._sync(params, cache, sequences, lengths, chunk)
    return self.catch_up(params, cache, sequences, lengths)

  def propose(self, params, cache, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """gamma one-token calls after the catch-up; see `interfaces.Drafter`."""
    last, cache = self.catch_up(params, cache, sequences, lengths)
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


def build(source: registry.DraftSource, kind: str = 't5'):
  """A `T5Drafter` of `source.draft_model` (with `source.confidence`)."""
  if source.draft_model is None or source.draft_params is None:
    given = 'None' if source.draft_params is None else 'given'
    raise checks.InputError(
        f'drafter kind {kind!r} needs a draft model and its params '
        '(DRAFT_MODEL / DRAFT_CHECKPOINT); got draft_model='
        f'{source.draft_model!r}, draft_params {given}.')
  return (T5Drafter(source.draft_model, source.confidence),
          source.draft_params)


KIND = registry.DrafterKind(
    't5', needs_model=True, build=build, reads_confidence=True,
    description='a separate T5 (e.g. T5 1.1 small) with its own cache')


def check_target_source(source: registry.DraftSource, kind: str) -> None:
  """Raises InputError unless `source` has the target a self-drafting kind
  (`SelfDrafting`: 'pass', 'heads', ...) drafts with."""
  if source.target_model is None or source.target_params is None:
    raise checks.InputError(
        f"drafter kind '{kind}' drafts with the target itself; the source "
        'has no target_model / target_params.')


@dataclasses.dataclass(frozen=True)
class SelfDrafting:
  """Base of the drafters that draft with the target itself (PaSS, heads).

  params: `{'target': the target's params, ...}` (shared, not copied). Draft
  1 is drawn from the target's own next-token distribution, so `score` is
  the target's logits and `prefill` feeds a copy of the target's cache, both
  through `own`, the target as its own `T5Drafter`. Later drafts come from
  the target's states (look-ahead slots, a head), not from `score` after
  the drafts: `drafts_from_score` is False (`interfaces.MergedDrafter`).
  """

  model: T5Model
  own: T5Drafter = dataclasses.field(init=False, repr=False, compare=False)

  drafts_from_score = False

  def __post_init__(self):
    decoding.check_is(f'{type(self).__name__} model', self.model,
                      interfaces.DecodingModel, 'the target network.T5Model')
    object.__setattr__(self, 'own', T5Drafter(self.model))

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def check_target(self, target, loop: str) -> None:
    """Raises unless `target` is a `network.T5Model` (or a
    `partitioning.ShardedModel` of one) of the network this drafter was
    built for: its `loop` rides on the target's call (look-ahead slots
    and heads read the target's states), so a drafter built for another
    target would fail deep in the trace."""
    name = type(self).__name__
    got = partitioning.unwrap(target)
    if not isinstance(got, T5Model):
      raise checks.InputError(
          f"the {name}'s {loop} reads the final states of a "
          'network.T5Model target (or a partitioning.ShardedModel of one), '
          f'got {type(target).__name__}.')
    mine = partitioning.unwrap(self.model).config.replace(
        fused_projections=False)
    network.check_params(
        T5Model(mine).param_shapes(),
        got.config.replace(fused_projections=False),
        source=f'the {name} was built for another target than its {loop} '
        "rides on (build it from this one); its model's")

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    """The target's logits (q_1's; later drafts come from its states)."""
    return self.own.score(params['target'], encoder_input_tokens,
                          decoder_input_tokens)

  def prefill(self, params, cache, sequences, lengths):
    """Consumes `sequences[b, :lengths[b] - 1]` into its target cache."""
    return self.own.prefill(params['target'], cache, sequences, lengths)
