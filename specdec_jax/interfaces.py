"""The contracts between the decoding loops, models, caches and drafters.

The loops (decoding.py, speculative.py) and the measurements (measure.py)
never see a network class; they call the members below and nothing else.
`network.T5Model` is a `DecodingModel`, `network.DecoderCache` a `Cache`,
every registered drafter kind (`specdec_jax.drafters.KINDS`) builds a
`Drafter` (tests/drafters/test_drafters.py checks it), and the kinds whose drafting
rides on the target's verification call (PaSS, self-drafting heads) build a
`MergedDrafter`. The protocols are `runtime_checkable`,
so `isinstance(x, Drafter)` tells whether x has the members (not their
signatures).

Models and drafters are static arguments of the compiled loops: they must be
hashable and compare equal exactly when they compute the same function of
their params (a frozen dataclass of configs does).

Shapes: `batch` rows, `vocab` = `vocab_size`, `k` tokens per call. Token ids
are int32; logits float32. Decoder token 0 is BOS (the decoder start).

References: Leviathan et al. 2023, arXiv 2211.17192, Algorithm 1.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple, runtime_checkable

import jax

Array = jax.Array
Params = Any  # a pytree of arrays
State = Any  # a drafter's state: a pytree (a `Cache`, or `()`)
SamplingConfig = Any  # a `sampling.SamplingConfig` (not imported: floor 1)


@runtime_checkable
class Cache(Protocol):
  """A decoder cache: a pytree passed into and out of `extend`.

  Slots at or after a row's `position` are stale: never attended to, and
  overwritten by the next `extend`. So moving `position` back (`rewind`)
  drops tokens, at no cost.
  """

  @property
  def position(self) -> Array:
    """`[batch]` int32: the decoder tokens each row holds."""

  def rewind(self, position: Array) -> Cache:
    """The same cache with each row's position set to `position` `[batch]`."""


@runtime_checkable
class DecodingModel(Protocol):
  """What the loops and the measurements call on a model.

  The baseline (`decoding.temperature_sample`) uses `vocab_size`,
  `check_params`, `init_cache`, `extend` (and, for `block_size` > 1, the
  cache's `rewind`);
  the speculative loop also rewinds the target's cache; `measure.alpha` and
  the drafters' `score` use `logits`.
  """

  @property
  def vocab_size(self) -> int:
    """Number of token ids (the logits' last dimension)."""

  def init_cache(self, params: Params, encoder_input_tokens: Array,
                 max_length: int) -> Cache:
    """Encodes the inputs once; an empty cache (position 0) of max_length.

    Args:
      params: the model's parameters.
      encoder_input_tokens: `[batch, input_length]`, 0-padded.
      max_length: decoder slots (static).
    """

  def extend(self, params: Params, tokens: Array,
             cache: Cache) -> Tuple[Array, Cache]:
    """Appends `tokens` `[batch, k]` at each row's position.

    Returns:
      `(logits [batch, k, vocab], cache)`: logits[:, i] is the next-token
      distribution after tokens[:, i]; the cache's position advanced by k
      (callers keep position + k <= max_length).
    """

  def logits(self, params: Params, encoder_input_tokens: Array,
             decoder_input_tokens: Array,
             decoder_target_tokens: Any = None) -> Array:
    """Teacher-forced logits, no cache: the reference `extend` must match.

    Args:
      params: the model's parameters.
      encoder_input_tokens: `[batch, input_length]`.
      decoder_input_tokens: `[batch, length]` (BOS first).
      decoder_target_tokens: optional `[batch, length]`; 0 marks padding.

    Returns:
      `[batch, length, vocab]`.
    """

  def check_params(self, params: Params) -> None:
    """Raises unless `params` fit this model (tree and shapes).

    The decoders call it before anything is traced, so that parameters of
    another configuration fail with a message naming them instead of deep
    inside the network. Leaves may be `jax.ShapeDtypeStruct`s (the
    `lower` functions); it must not compile anything.

    Raises:
      ValueError: a missing, unexpected or mis-shaped parameter.
    """


@runtime_checkable
class Drafter(Protocol):
  """Anything that proposes gamma tokens with the distributions q they were
  drawn from (speculative.py steps 1 and 3).

  The loop's buffers: `sequences` `[batch, buffer]` holds each row's
  committed decoder tokens (BOS = 0 at index 0, stale values after them) and
  `lengths` `[batch]` int32 how many there are (>= 1). A drafter keeps
  whatever state it needs to continue from any committed prefix (the loop
  never tells it how many drafts were accepted: `lengths` does).
  """

  @property
  def vocab_size(self) -> int:
    """Must equal the target's (`speculative.check_vocab`)."""

  def check_params(self, params: Params) -> None:
    """Raises unless `params` fit this drafter (keys, shapes, dtypes).

    The loop calls it before anything is traced (`speculative.speculative_sample`'s
    prepare),
    so that wrong parameters (a bigram table of another vocabulary, a T5 of
    another config) fail with a message naming `draft_params` instead of
    deep inside jax. It must accept `jax.ShapeDtypeStruct` leaves (the
    `lower_*` functions) and check values only on concrete arrays; it must
    not compile anything.

    Raises:
      ValueError: a missing or mis-shaped parameter; TypeError: a wrong
        dtype (e.g. float token ids).
    """

  def init(self, params: Params, encoder_input_tokens: Array,
           max_length: int) -> State:
    """The state before any decoder token, for `max_length` decoder slots.

    Args:
      params: the drafter's parameters.
      encoder_input_tokens: `[batch, input_length]`.
      max_length: the loop's decoder length (static).
    """

  def prefill(self, params: Params, state: State, sequences: Array,
              lengths: Array) -> State:
    """The state after consuming an existing prefix, as the loop leaves it.

    Consumes each row's committed tokens but its last,
    `sequences[b, :lengths[b] - 1]` (as after an iteration that ended with a
    rejection); the next `propose` feeds the last one. Afterwards `propose`
    drafts exactly as the loop's drafter would after committing that prefix.

    Args:
      params: the drafter's parameters.
      state: a state from `init` (its contents are replaced).
      sequences: `[batch, n]`, lengths <= n; the work grows with n (pass
        `sequences[:, :max(lengths)]` to bound it); `init`'s max_length must
        hold n - 1 tokens.
      lengths: `[batch]` int32, >= 1.
    """

  def propose(self, params: Params, state: State, sequences: Array,
              lengths: Array, gamma: int, sampling: SamplingConfig,
              rng: Array) -> Tuple[Array, Array, State]:
    """Drafts gamma tokens after each row's committed prefix.

    Args:
      params: the drafter's parameters.
      state: the state the previous `propose` (or `init` / `prefill`)
        returned.
      sequences: `[batch, buffer]` committed tokens (see the class).
      lengths: `[batch]` committed tokens per row.
      gamma: drafts per row (static, >= 1).
      sampling: the sampling mode (static), the same as the target's.
      rng: PRNG key.

    Returns:
      `(drafts [batch, gamma] int32, q [batch, gamma, vocab] float32, state)`:
      draft i ~ q_i, and q_i is the *standardized* distribution
      (`sampling.probabilities`) of the logits `score` gives after the prefix
      and drafts 1..i-1, so the loop's acceptance test is exact. Greedy:
      q_i is one-hot on draft i.

      Adaptive draft lengths: q_i = 0 everywhere marks position i (and, by
      convention, every later one) as not drafted; the verification stops
      there and draws the next token from the target's p_i, i.e. that row
      ran Algorithm 1 with gamma = i - 1 in this iteration. The decision to
      stop before draft i may depend on the prefix, drafts 1..i-1 and q_i,
      never on x_i itself (then the output law stays exactly the target's).
      drafts[:, i] must still be a valid token id (it fills the target
      call's slot).
    """

  def score(self, params: Params, encoder_input_tokens: Array,
            decoder_input_tokens: Array) -> Array:
    """Teacher-forced logits: those `propose` draws from after each prefix.

    Args:
      params: the drafter's parameters.
      encoder_input_tokens: `[batch, input_length]`.
      decoder_input_tokens: `[batch, length]` (BOS first).

    Returns:
      `[batch, length, vocab]`: position t holds the logits of the token
      after `decoder_input_tokens[:, :t + 1]` (unadjusted: the caller
      applies the sampling mode).
    """


@runtime_checkable
class MergedDrafter(Drafter, Protocol):
  """A drafter whose drafting rides on the target's verification call.

  Besides the `Drafter` members (with which it also runs in the ordinary
  loop, at the cost of its own target call per iteration), it names its
  merged loop: one target call per iteration both verifies the pending
  drafts and yields the next ones (PaSS's look-ahead slots, a head on the
  target's final states). `speculative.speculative_sample` decodes with it
  by default.

  Its `propose` may draw q_2.. from the target's own states rather than from
  `score` after the drafts (`drafts_from_score` False); q_1 is always the
  standardized `score` after the prefix.
  """

  @property
  def drafts_from_score(self) -> bool:
    """Whether q_i for every i is `score`'s after the prefix and drafts
    1..i-1 (else only q_1 is; tests/drafters/test_drafters.py checks which)."""

  def max_gamma(self, merged: bool) -> Optional[int]:
    """The largest gamma it drafts per iteration in its merged loop
    (`merged` True) or in the ordinary one; None: no limit."""

  def merged_loop(self, target: DecodingModel, gamma: int,
                  sampling: SamplingConfig, eos_id: int,
                  max_decode_len: int) -> Any:
    """Its loop: a `speculative.MergedLoop` (hashable, static under jit)
    that `scaffold.run` runs on `(target_params, draft_params, inputs,
    draft_inputs, rng)`; raises ValueError for a target it cannot use."""


@runtime_checkable
class StoreDrafter(Drafter, Protocol):
  """A drafter that drafts from a store its caller grows (the output
  cache: kinds whose `drafters.registry.DrafterKind.uses_cache` is set).

  The store is host-side; its arrays reach the jitted loop as part of the
  drafter's params. After the store changed (the eval job adds each unit's
  outputs), `with_store` gives the params to decode the next unit with.
  """

  def with_store(self, params: Params, store: Any) -> Params:
    """`params` after `store` (an `output_cache.OutputCache`) changed."""


@runtime_checkable
class TargetReader(Drafter, Protocol):
  """A drafter that reads the target's own parameters (the output cache
  embeds each request with the target's encoder).

  Its params hold none of the target's: the loops hand them in inside the
  compiled program (`with_target`), so the target's weights are one
  argument of the program, not two. (A compiler counts two arguments twice
  even when they are the same arrays: T5 1.1-XXL's encoder a second time
  does not fit one TPU v4 chip.) A caller that runs the drafter's methods
  itself (`score`, a timing) gives them `speculative.with_target`'s params.
  """

  def with_target(self, params: Params, target_params: Params) -> Params:
    """The params the drafter's methods read: `params` with the target's."""
