"""Continuous batching (row refill) for both decoders, in one jitted loop each.

A fixed batch (`speculative.speculative_sample`, `decoding.temperature_sample`)
runs its `lax.while_loop` until the slowest row ends: rows that ended early
idle, and at batch 8 each iteration waits for the row that accepted least.
Here the loop runs over `batch_size` *slots* fed from an on-device queue of
N examples:

  1. one iteration of the decoder for every slot (the speculative body is
     the loop's own `body_fn`, of any `speculative.VerifyLoop`: `SpecLoop`
     or a drafter's `MergedLoop`; the baseline's is a per-row variant of
     `decoding.SampleLoop.body_fn`: every row feeds its own last token at its
     own cache position, `DecoderCache.position` being per row);
  2. slots whose row ended in this iteration flush their tokens, length and
     counters to the output buffers at their example's index;
  3. under a `lax.cond` taken only when some slot ended and examples remain,
     the next examples go to the ended slots in slot order (cumsum over the
     ended mask); they are encoded (`init_cache` / `drafter.init` on a
     gathered sub-batch of just those k inputs, padded to the next power of
     two: `_encode_assigned`; the drafter's state of new rows comes from the
     loop's `init_draft`: a merged loop's rows start with no drafts) and merged row-wise into the existing caches
     and drafter states (`merge_rows`: `where` over the leading batch axis),
     and the slots' tokens, lengths, ended flags and counters are reset.
     (Encoding a full slot batch per refill instead made the CPU baseline
     stream ~2x slower than fixed batches: the encoder pass over B x
     input_length tokens dwarfs a B-token decoder step.)

The loop ends when every slot has ended and the queue is empty. Each example
is decoded exactly as alone (rows never see each other), so greedy outputs
equal the fixed-batch decoders' token for token and sampled outputs follow
the target's distribution (tests/test_streaming.py).

Contract this needs beyond `interfaces`: every leaf of the target's cache and
of the drafter's state has the batch as its leading axis (true of
`network.DecoderCache`, every registered kind's state, a merged loop's
`speculative.Pending`; `()` has no leaves; both streams check it on shapes
when they compile, before any row is indexed, and name any leaf without
it), and a row's cache `position` may be set back to 0 (`rewind`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence, Tuple

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import partitioning
from specdec_jax import sampling as sampling_lib
from specdec_jax import scaffold
from specdec_jax import spec_stats
from specdec_jax import speculative
from specdec_jax.sampling import SamplingConfig

Array = jax.Array


def merge_rows(old, new, mask: Array):
  """`new`'s rows where mask `[batch]`, `old`'s elsewhere, leaf by leaf.

  Raises:
    ValueError: a leaf without the batch as its leading axis (at trace time).
  """
  batch = mask.shape[0]

  def merge(o, n):
    if o.ndim == 0 or o.shape[0] != batch or n.shape != o.shape:
      raise ValueError(
          f'merge_rows needs the batch ({batch}) as the leading axis of '
          f'every cache / drafter-state leaf; got shapes {o.shape} and '
          f'{n.shape}.')
    return jnp.where(mask.reshape((batch,) + (1,) * (o.ndim - 1)), n, o)

  return jax.tree_util.tree_map(merge, old, new)


def check_row_leaves(init_fn, params, rows: Array, what: str,
                     counts: Tuple[int, int] = (1, 2)) -> None:
  """Raises unless every leaf `init_fn(params, rows)` makes has the rows as
  its leading axis (checked on shapes only, for two row `counts`: the
  streams check the slot batch and twice it, which a mesh's 'data' axis
  divides when it divides the batch).

  A refill encodes a few rows and merges them into the slot batch leaf by
  leaf, so a leaf without that axis (a scalar counter, a table shared by
  all rows) cannot be refilled.

  Args:
    init_fn: `(params, rows [k, n]) -> tree` (a cache or a drafter state).
    params: its params (arrays, tracers or `jax.ShapeDtypeStruct`s).
    rows: `[N, n]` input ids (only their shape and dtype are used).
    what: names the tree and the argument it comes from, in the error.

  Raises:
    ValueError: naming each leaf that lacks the leading row axis.
  """
  bad = {}
  for k in counts:
    row_shape = jax.ShapeDtypeStruct((k,) + tuple(rows.shape[1:]),
                                     rows.dtype)
    tree = jax.eval_shape(init_fn, params, row_shape)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      if len(leaf.shape) == 0 or leaf.shape[0] != k:
        bad.setdefault(jax.tree_util.keystr(path), []).append(
            f'{tuple(leaf.shape)} for {k} row{"s" if k > 1 else ""}')
  if bad:
    leaves = '; '.join(f'leaf {path or "(the state itself)"}: '
                       f'{", ".join(shapes)}'
                       for path, shapes in bad.items())
    raise ValueError(
        f'streaming refills slots row by row, so every leaf of {what} needs '
        f'the rows (the batch) as its leading axis; {leaves}.')


def check_batch_size(batch_size) -> None:
  checks.check_int('batch_size', batch_size)


def _assign(newly: Array, next_example: Array, n_examples: int):
  """Examples for the slots in `newly` (slot order): `(assign, example)`."""
  rank = jnp.cumsum(newly.astype(jnp.int32)) - 1
  candidate = next_example + rank
  assign = newly & (candidate < n_examples)
  return assign, jnp.clip(candidate, 0, n_examples - 1)


def bucket_sizes(batch: int, refill_sizes=None, multiple: int = 1
                 ) -> Tuple[int, ...]:
  """Sub-batch sizes a refill encodes in: `refill_sizes` below batch (default
  `multiple` times the powers of two), then batch itself.

  Each size is one branch of the refill's `lax.switch` (compiled once per
  size); `(batch,)` always encodes a full slot batch (one branch).
  `multiple`: the parts a mesh splits every batch into
  (`partitioning.batch_multiple` of the model), which must divide each size.
  """
  if refill_sizes is None:
    refill_sizes = [multiple << i for i in range(
        max(batch // multiple - 1, 1).bit_length())]
  if not isinstance(refill_sizes, (list, tuple)):
    raise checks.InputError(
        f'refill_sizes must be a list of ints >= 1, got {refill_sizes!r}.')
  bad = [x for x in refill_sizes if not checks.is_int(x) or x < 1]
  if bad:
    raise checks.InputError(
        f'refill_sizes must be ints >= 1, got {refill_sizes!r}.')
  bad = [int(x) for x in refill_sizes if x % multiple]
  if bad:
    raise checks.InputError(
        f'refill_sizes {bad} do not divide into the {multiple} parts the '
        "target's mesh splits every batch into (its 'batch' axis): choose "
        f'multiples of {multiple}.')
  return tuple(sorted({int(x) for x in refill_sizes if x < batch})) + (
      int(batch),)


def _encode_assigned(init_fn, example: Array, assign: Array, sizes):
  """`init_fn` on the assigned slots' examples only, as a slot-batch tree.

  The k assigned examples are encoded in ONE sub-batch of the smallest
  `bucket_sizes` size >= k (a `lax.switch` over the sizes): the encoder's
  work follows the rows refilled, not the slot batch. Row j of the result
  belongs to slot j where assign[j] (elsewhere it is a copy of some row,
  for `merge_rows` to ignore).

  Args:
    init_fn: example indices `[s]` -> a tree whose leaves have s leading
      rows (caches / drafter states of those examples).
    example: `[batch]` example index per slot (valid where assign).
    assign: `[batch]` bool.
    sizes: `bucket_sizes(batch, ...)`.
  """
  batch = assign.shape[0]
  rank = jnp.cumsum(assign.astype(jnp.int32)) - 1
  # compact[r] = the example of the r-th assigned slot (0 past the count).
  compact = jnp.zeros((batch,), jnp.int32).at[
      jnp.where(assign, rank, batch)].set(example, mode='drop')

  def branch(size):
    def encode(_):
      tree = init_fn(compact[:size])
      pick = jnp.clip(rank, 0, size - 1)
      return jax.tree_util.tree_map(lambda x: jnp.take(x, pick, axis=0),
                                    tree)
    return encode

  count = jnp.sum(assign.astype(jnp.int32))
  which = jnp.searchsorted(jnp.asarray(sizes, jnp.int32), count)
  if len(sizes) == 1:
    return branch(sizes[0])(None)
  return jax.lax.switch(which, [branch(s) for s in sizes], None)


def _scatter(buffer: Array, rows: Array, idx: Array) -> Array:
  """buffer.at[idx].set(rows), dropping idx == len(buffer)."""
  return buffer.at[idx].set(rows.astype(buffer.dtype), mode='drop')


# ---------------------------------------------------------------------------
# Speculative decoding.
# ---------------------------------------------------------------------------


@struct.dataclass
class SpecStreamState:
  """Loop state: the slots' `SpecState` plus the queue and the outputs.

  Attributes:
    spec: `speculative.SpecState` of the `[slots]` rows (its stats per slot
      since the slot's example started; `iterations` counts loop iterations).
    example: `[slots]` the example each slot decodes (N: none).
    flushed: `[slots]` bool, the slot's row has been written out.
    next_example: scalar, the queue's head.
    tokens, lengths: `[N, max_decode_len]`, `[N]` outputs.
    stats: per-example `SpecStats` (`[N]` counters; `accepted_at` summed).
  """

  spec: speculative.SpecState
  example: Array
  flushed: Array
  next_example: Array
  tokens: Array
  lengths: Array
  stats: spec_stats.SpecStats


@dataclasses.dataclass(frozen=True)
class SpecStreamLoop:
  """Any `speculative.VerifyLoop` over `batch_size` refilled slots."""

  loop: speculative.VerifyLoop
  batch_size: int
  refill_sizes: Tuple[int, ...]

  def _slot_outputs(self, spec: speculative.SpecState):
    m = self.loop.max_decode_len
    out = spec.sequences[:, 1:1 + m]
    return jnp.where(jnp.arange(m) < spec.lengths[:, None] - 1, out, 0)

  def _refill(self, target_params, draft_params, inputs, draft_inputs,
              state: SpecStreamState, newly: Array) -> SpecStreamState:
    n_examples = inputs.shape[0]
    assign, example = _assign(newly, state.next_example, n_examples)
    s = state.spec

    def init_fn(idx):
      return (self.loop.init_target_cache(target_params, inputs[idx]),
              self.loop.init_draft(draft_params, draft_inputs[idx]))

    cache, draft_state = merge_rows(
        (s.target_cache, s.draft_state),
        _encode_assigned(init_fn, example, assign, self.refill_sizes),
        assign)
    zero = lambda x: jnp.where(assign, jnp.zeros_like(x), x)
    st = s.stats
    stats = st.replace(row_iterations=zero(st.row_iterations),
                       drafted=zero(st.drafted), accepted=zero(st.accepted),
                       beta_sum=zero(st.beta_sum),
                       beta_count=zero(st.beta_count))
    spec = s.replace(
        sequences=jnp.where(assign[:, None], 0, s.sequences),
        lengths=jnp.where(assign, 1, s.lengths),
        ended=s.ended & ~assign, target_cache=cache, draft_state=draft_state,
        stats=stats)
    return state.replace(
        spec=spec, example=jnp.where(assign, example, state.example),
        flushed=state.flushed & ~assign,
        next_example=state.next_example + jnp.sum(assign.astype(jnp.int32)))

  def _flush_refill(self, target_params, draft_params, inputs, draft_inputs,
                    state: SpecStreamState, newly: Array) -> SpecStreamState:
    n_examples = inputs.shape[0]
    s = state.spec
    idx = jnp.where(newly, state.example, n_examples)
    st, out = s.stats, state.stats
    out = out.replace(
        row_iterations=_scatter(out.row_iterations, st.row_iterations, idx),
        drafted=_scatter(out.drafted, st.drafted, idx),
        accepted=_scatter(out.accepted, st.accepted, idx),
        beta_sum=_scatter(out.beta_sum, st.beta_sum, idx),
        beta_count=_scatter(out.beta_count, st.beta_count, idx))
    state = state.replace(
        tokens=_scatter(state.tokens, self._slot_outputs(s), idx),
        lengths=_scatter(state.lengths, s.lengths - 1, idx), stats=out,
        flushed=state.flushed | newly)
    return jax.lax.cond(
        state.next_example < n_examples,
        functools.partial(self._refill, target_params, draft_params, inputs,
                          draft_inputs),
        lambda st_, _: st_, state, newly)

  def body_fn(self, target_params, draft_params, inputs, draft_inputs,
              state: SpecStreamState) -> SpecStreamState:
    spec = self.loop.body_fn(target_params, draft_params, state.spec)
    state = state.replace(spec=spec)
    newly = spec.ended & ~state.flushed
    return jax.lax.cond(
        jnp.any(newly),
        functools.partial(self._flush_refill, target_params, draft_params,
                          inputs, draft_inputs),
        lambda st_, _: st_, state, newly)

  def check_rows(self, target_params, draft_params, inputs, draft_inputs
                 ) -> None:
    """Raises unless the target's cache and the drafter's state have the
    rows as every leaf's leading axis (shapes only: no work)."""
    counts = (self.batch_size, 2 * self.batch_size)
    check_row_leaves(
        self.loop.init_target_cache,
        target_params, inputs, "the target's cache (`target.init_cache`)",
        counts)
    check_row_leaves(
        self.loop.init_draft, draft_params, draft_inputs,
        f"the drafter's state (`{self.loop.draft_init_name}` of "
        'draft_params)', counts)

  def __call__(self, target_params, draft_params, inputs, draft_inputs, rng):
    draft_params = self.loop.with_target(draft_params, target_params)
    # Once per compilation (at trace time), before any row is indexed.
    self.check_rows(target_params, draft_params, inputs, draft_inputs)
    n_examples = inputs.shape[0]
    b = self.batch_size
    g = self.loop.gamma
    first = jnp.arange(b)
    spec = self.loop.start(target_params, draft_params, inputs[first],
                           draft_inputs[first], rng)
    zn = jnp.zeros((n_examples,), jnp.int32)
    state = SpecStreamState(
        spec=spec, example=first.astype(jnp.int32),
        flushed=jnp.zeros((b,), bool), next_example=jnp.int32(b),
        tokens=jnp.zeros((n_examples, self.loop.max_decode_len), jnp.int32),
        lengths=zn,
        stats=spec_stats.SpecStats.zeros(n_examples, g))
    state = jax.lax.while_loop(
        lambda st: ~jnp.all(st.spec.ended),
        functools.partial(self.body_fn, target_params, draft_params, inputs,
                          draft_inputs), state)
    stats = state.stats.replace(iterations=state.spec.stats.iterations,
                                accepted_at=state.spec.stats.accepted_at)
    return spec_stats.SpecResult(state.tokens, state.lengths, stats)


@scaffold.decoder
def speculative_stream(
    target,
    target_params,
    drafter,
    draft_params,
    inputs,
    *,
    batch_size: int,
    gamma: int,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int = 1,
    rng: Optional[Array] = None,
    draft_input_tokens=None,
    refill_sizes: Optional[Sequence[int]] = None,
    merged: Optional[bool] = None,
) -> spec_stats.SpecResult:
  """Speculative decoding of N examples through `batch_size` refilled slots.

  A `scaffold.decoder` (`.lower`, `.prepare`), as `speculative_sample`.

  Args:
    target, target_params, drafter, draft_params, gamma, max_decode_len,
      sampling, eos_id, rng, draft_input_tokens, merged: as
      `speculative.speculative_sample` (validated by it; its loop, merged
      for a `MergedDrafter` by default, runs in the slots).
    inputs: `[N, input_length]` encoder input ids of all examples.
    batch_size: slots decoded at once (static); min(batch_size, N) are used.
    refill_sizes: sub-batch sizes a refill encodes in (`bucket_sizes`;
      default powers of two, times the parts a sharded target's mesh splits
      a batch into; `(batch_size,)`: always the full slot batch).

  Returns:
    `spec_stats.SpecResult` over the N examples: tokens
    `[N, max_decode_len]`, lengths `[N]`, and `SpecStats` whose
    `row_iterations`, `drafted`, `accepted`, `beta_sum`, `beta_count` are
    per example `[N]` (row_iterations: iterations the example was decoded
    in), `iterations` the loop's iterations (target calls of the slot
    batch) and `accepted_at` summed over everything, so
    `spec_stats.summarize` applies unchanged.
  """
  check_batch_size(batch_size)
  loop, args = speculative.speculative_sample.prepare(
      target, target_params, drafter, draft_params, inputs, gamma=gamma,
      max_decode_len=max_decode_len, sampling=sampling, eos_id=eos_id,
      rng=rng, draft_input_tokens=draft_input_tokens, merged=merged)
  b = int(min(batch_size, np.shape(inputs)[0]))
  return SpecStreamLoop(loop, b, bucket_sizes(
      b, refill_sizes, partitioning.batch_multiple(target))), args


# ---------------------------------------------------------------------------
# Baseline (autoregressive) decoding with per-row positions.
# ---------------------------------------------------------------------------


@struct.dataclass
class SampleStreamState:
  """Slots `[slots]`: last token, output so far, tokens emitted, ended,
  cache (per-row positions); the queue and the `[N]` outputs."""

  cur_token: Array
  slot_tokens: Array
  steps: Array
  ended: Array
  cache: Any
  rng: Array
  iterations: Array
  example: Array
  flushed: Array
  next_example: Array
  tokens: Array
  lengths: Array


@struct.dataclass
class SampleStreamResult:
  """tokens `[N, max_decode_len]` (EOS kept, 0 after), lengths `[N]` (= the
  decoder calls of each example), iterations: the loop's decoder calls."""

  tokens: Array
  lengths: Array
  iterations: Array


@dataclasses.dataclass(frozen=True)
class SampleStreamLoop:
  """Baseline decoding over `batch_size` refilled slots."""

  model: Any
  sampling: SamplingConfig
  eos_id: int
  max_decode_len: int
  batch_size: int
  refill_sizes: Tuple[int, ...]

  def _step(self, params, state: SampleStreamState) -> SampleStreamState:
    """One decoder call per slot, each row at its own cache position."""
    rng, step_rng = jax.random.split(state.rng)
    logits, cache = self.model.extend(params, state.cur_token[:, None],
                                      state.cache)
    active = ~state.ended
    token = sampling_lib.sample(step_rng, logits[:, 0], self.sampling)
    token = jnp.where(active, token, 0).astype(jnp.int32)
    write = (jnp.arange(self.max_decode_len) == state.steps[:, None]) & (
        active[:, None])
    slot_tokens = jnp.where(write, token[:, None], state.slot_tokens)
    steps = state.steps + active.astype(jnp.int32)
    ended = state.ended | (active & ((token == self.eos_id) |
                                     (steps >= self.max_decode_len)))
    # An ended row idles at position 0 (its next writes stay in the cache).
    cache = cache.rewind(jnp.where(ended, 0, cache.position))
    return state.replace(cur_token=jnp.where(active, token, 0),
                         slot_tokens=slot_tokens, steps=steps, ended=ended,
                         cache=cache, rng=rng,
                         iterations=state.iterations + 1)

  def _refill(self, params, inputs, state, newly):
    assign, example = _assign(newly, state.next_example, inputs.shape[0])
    cache = merge_rows(
        state.cache,
        _encode_assigned(
            lambda idx: self.model.init_cache(params, inputs[idx],
                                              self.max_decode_len),
            example, assign, self.refill_sizes), assign)
    return state.replace(
        cur_token=jnp.where(assign, 0, state.cur_token),
        slot_tokens=jnp.where(assign[:, None], 0, state.slot_tokens),
        steps=jnp.where(assign, 0, state.steps),
        ended=state.ended & ~assign, cache=cache,
        example=jnp.where(assign, example, state.example),
        flushed=state.flushed & ~assign,
        next_example=state.next_example + jnp.sum(assign.astype(jnp.int32)))

  def _flush_refill(self, params, inputs, state, newly):
    n_examples = inputs.shape[0]
    idx = jnp.where(newly, state.example, n_examples)
    state = state.replace(
        tokens=_scatter(state.tokens, state.slot_tokens, idx),
        lengths=_scatter(state.lengths, state.steps, idx),
        flushed=state.flushed | newly)
    return jax.lax.cond(state.next_example < n_examples,
                        functools.partial(self._refill, params, inputs),
                        lambda st, _: st, state, newly)

  def body_fn(self, params, inputs, state):
    state = self._step(params, state)
    newly = state.ended & ~state.flushed
    return jax.lax.cond(jnp.any(newly),
                        functools.partial(self._flush_refill, params, inputs),
                        lambda st, _: st, state, newly)

  def __call__(self, params, inputs, rng):
    # Once per compilation (at trace time), before any row is indexed.
    check_row_leaves(
        lambda p, x: self.model.init_cache(p, x, self.max_decode_len),
        params, inputs, "the model's cache (`model.init_cache`)",
        (self.batch_size, 2 * self.batch_size))
    n_examples = inputs.shape[0]
    b = self.batch_size
    first = jnp.arange(b)
    state = SampleStreamState(
        cur_token=jnp.zeros((b,), jnp.int32),
        slot_tokens=jnp.zeros((b, self.max_decode_len), jnp.int32),
        steps=jnp.zeros((b,), jnp.int32), ended=jnp.zeros((b,), bool),
        cache=self.model.init_cache(params, inputs[first],
                                    self.max_decode_len),
        rng=rng, iterations=jnp.zeros((), jnp.int32),
        example=first.astype(jnp.int32), flushed=jnp.zeros((b,), bool),
        next_example=jnp.int32(b),
        tokens=jnp.zeros((n_examples, self.max_decode_len), jnp.int32),
        lengths=jnp.zeros((n_examples,), jnp.int32))
    state = jax.lax.while_loop(
        lambda st: ~jnp.all(st.ended),
        functools.partial(self.body_fn, params, inputs), state)
    return SampleStreamResult(state.tokens, state.lengths, state.iterations)


@scaffold.decoder
def sample_stream(
    model,
    params,
    inputs,
    *,
    batch_size: int,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int = 1,
    rng: Optional[Array] = None,
    refill_sizes: Optional[Sequence[int]] = None,
) -> SampleStreamResult:
  """Baseline decoding of N examples through `batch_size` refilled slots.

  A `scaffold.decoder` (`.lower`, `.prepare`), as `temperature_sample`.

  Args:
    model, params, max_decode_len, sampling, eos_id, rng: as
      `decoding.temperature_sample` (validated by it); the model's
      cache must have per-row `position` and `rewind`
      (`network.DecoderCache`).
    inputs: `[N, input_length]` encoder input ids of all examples.
    batch_size: slots decoded at once (static); min(batch_size, N) are used.
    refill_sizes: as `speculative_stream`.

  Returns:
    `SampleStreamResult`: per example the tokens `decoding.temperature_sample`
    would give (greedy: equal), lengths; the loop's decoder calls.
  """
  check_batch_size(batch_size)
  loop, (params, inputs, rng, _) = decoding.temperature_sample.prepare(
      model, params, inputs, max_decode_len=max_decode_len,
      sampling=sampling, eos_id=eos_id, rng=rng)
  b = int(min(batch_size, np.shape(inputs)[0]))
  return (SampleStreamLoop(loop.model, loop.sampling, loop.eos_id,
                           loop.max_decode_len, b,
                           bucket_sizes(b, refill_sizes,
                                        partitioning.batch_multiple(model))),
          (params, inputs, rng))
