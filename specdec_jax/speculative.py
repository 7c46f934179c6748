"""Speculative decoding (Algorithm 1) in one jitted `lax.while_loop`.

One iteration, for every row of the batch at once:
  1. the drafter proposes gamma tokens x_1..x_gamma with distributions q_i;
  2. ONE target call on gamma+1 positions (the last committed token and the
     gamma drafts) gives p_1..p_{gamma+1};
  3. draft i is accepted while r_i < p_i(x_i) / q_i(x_i), r_i ~ U[0, 1);
     n = number of leading accepted drafts;
  4. the next token t ~ norm(max(0, p_{n+1} - q_{n+1})) if n < gamma, else the
     bonus t ~ p_{gamma+1};
  5. the row commits x_1..x_n, t (cut at EOS or the length limit) and both
     models' caches move to the row's new length (the target's is rewound;
     the drafter re-synchronises itself from `lengths`, see drafters.py).

p and q are both the *standardized* distributions (sampling.py), so greedy,
temperature, top-k and top-p are all exact: the output distribution equals
the baseline's (`decoding.temperature_sample`), and greedy outputs are equal
token for token.

References: Leviathan, Kalman & Matias 2023, arXiv 2211.17192, Algorithm 1,
sec. 2.3 and Appendix A.1.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, Optional

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding
from specdec_jax import layers
from specdec_jax import sampling as sampling_lib
from specdec_jax.sampling import SamplingConfig

Array = jax.Array


@struct.dataclass
class SpecStats:
  """Counters of one speculative decode (all int32 / float32 arrays).

  Attributes:
    iterations: scalar, loop iterations = target calls (for the batch).
    row_iterations: `[batch]` iterations in which the row was still active.
    drafted: `[batch]` drafts verified (gamma per active iteration, fewer
      where an adaptive drafter stopped early).
    accepted: `[batch]` drafts accepted by the rejection test.
    accepted_at: `[gamma]` how often draft position i was accepted (summed
      over rows and iterations; divide by `row_iterations.sum()`).
    beta_sum: `[batch]` sum of beta = sum_x min(p, q) over verified positions.
    beta_count: `[batch]` number of verified positions.
  """

  iterations: Array
  row_iterations: Array
  drafted: Array
  accepted: Array
  accepted_at: Array
  beta_sum: Array
  beta_count: Array

  @classmethod
  def zeros(cls, rows: int, gamma: int) -> 'SpecStats':
    """All counters 0, for `rows` rows (or examples) and gamma positions."""
    z = jnp.zeros((rows,), jnp.int32)
    return cls(iterations=jnp.zeros((), jnp.int32), row_iterations=z,
               drafted=z, accepted=z,
               accepted_at=jnp.zeros((gamma,), jnp.int32),
               beta_sum=jnp.zeros((rows,), jnp.float32), beta_count=z)


@struct.dataclass
class SpecResult:
  """Tokens `[batch, max_decode_len]` (EOS kept, 0 after), lengths and stats."""

  tokens: Array
  lengths: Array
  stats: SpecStats


def rates(iterations, drafted, accepted, beta_sum, beta_count,
          tokens=None) -> Dict[str, float]:
  """The acceptance figures from summed counters (plain numbers).

  Names follow the paper (alpha) and vLLM's metrics (acceptance rate =
  accepted / drafted; mean acceptance length = 1 + accepted / iterations).
  The counters may be summed over rows, batches and examples (`SpecStats`
  per row, or per-example records) before the call: every rate is a ratio
  of sums.

  Args:
    iterations: row iterations: loop iterations counted once per row still
      active in them (`SpecStats.row_iterations` summed), i.e. target calls
      per row.
    drafted: drafts verified.
    accepted: drafts accepted.
    beta_sum: sum of beta = sum_x min(p, q) over verified positions.
    beta_count: verified positions.
    tokens: optional output tokens (EOS included) of the same rows.

  Returns:
    `{'acceptance_rate', 'mean_accepted_length', 'alpha'}` floats, and
    `'target_calls_per_token'` when `tokens` is given.
  """
  iterations, drafted, accepted = (float(iterations), float(drafted),
                                   float(accepted))
  out = {
      'acceptance_rate': accepted / max(drafted, 1.0),
      'mean_accepted_length': 1.0 + accepted / max(iterations, 1.0),
      'alpha': float(beta_sum) / max(float(beta_count), 1.0),
  }
  if tokens is not None:
    out['target_calls_per_token'] = iterations / max(float(tokens), 1.0)
  return out


def summarize(stats: SpecStats) -> dict:
  """Python floats of one decode: `rates`, target calls, per position.

  Returns:
    {'target_calls', 'row_iterations', 'acceptance_rate',
     'mean_accepted_length', 'per_position_acceptance' (the share of row
     iterations accepting draft i), 'alpha'}.
  """
  row_iters = float(jnp.sum(stats.row_iterations))
  r = rates(row_iters, jnp.sum(stats.drafted), jnp.sum(stats.accepted),
            jnp.sum(stats.beta_sum), jnp.sum(stats.beta_count))
  return {
      'target_calls': int(stats.iterations),
      'row_iterations': row_iters,
      'acceptance_rate': r['acceptance_rate'],
      'mean_accepted_length': r['mean_accepted_length'],
      'per_position_acceptance': [
          float(a) / max(row_iters, 1.0) for a in stats.accepted_at
      ],
      'alpha': r['alpha'],
  }


@struct.dataclass
class SpecState:
  """Loop state.

  Attributes:
    sequences: `[batch, buffer]` committed decoder tokens, BOS (0) at index 0.
    lengths: `[batch]` committed tokens per row, BOS included (>= 1).
    ended: `[batch]` bool.
    target_cache: the target's decoder cache.
    draft_state: the drafter's state (e.g. its cache).
    rng: PRNG key.
    stats: running `SpecStats`.
  """

  sequences: Array
  lengths: Array
  ended: Array
  target_cache: Any
  draft_state: Any
  rng: Array
  stats: SpecStats


def _gather(x: Array, idx: Array) -> Array:
  """x `[batch, n, vocab]` at idx `[batch]` -> `[batch, vocab]`."""
  return jnp.take_along_axis(x, idx[:, None, None], axis=1)[:, 0]


def verify(rng: Array, drafts: Array, q: Array, p: Array,
           sampling: SamplingConfig):
  """The modified rejection sampling of Algorithm 1 for every row.

  Args:
    rng: PRNG key.
    drafts: `[batch, gamma]` drafted tokens x_i ~ q_i.
    q: `[batch, gamma, vocab]` the drafter's (standardized) distributions.
    p: `[batch, gamma + 1, vocab]` the target's (standardized) distributions.
    sampling: the sampling mode (greedy takes argmax of the residual).

  Returns:
    `(n [batch], accepted [batch, gamma] bool prefix mask, next_token [batch],
    beta [batch, gamma])` where beta_i = sum_x min(p_i, q_i).

  A draft position with q_i = 0 everywhere is undrafted (see `ok` below).
  """
  gamma = drafts.shape[1]
  accept_rng, residual_rng = jax.random.split(rng)
  p_x = jnp.take_along_axis(p[:, :gamma], drafts[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
  r = jax.random.uniform(accept_rng, drafts.shape)
  # Accept while r < p/q; r < 1 always. A drafted x ~ q has q(x) > 0; a
  # position whose q is all 0 was not drafted (adaptive draft lengths,
  # `interfaces.Drafter.propose`): it is never accepted, and as
  # q_pad[n] = 0 there the next token is drawn from p itself: an iteration
  # with m drafts is exactly Algorithm 1 with gamma = m.
  ok = (r * q_x < p_x) & (q_x > 0)
  accepted = jnp.cumprod(ok.astype(jnp.int32), axis=1).astype(bool)
  n = jnp.sum(accepted, axis=1)
  p_next = _gather(p, n)
  q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)
  residual = jnp.maximum(p_next - _gather(q_pad, n), 0.0)
  # norm(residual) is never divided out: argmax and categorical(log) are
  # scale-free, so any residual of mass > 0 is sampled exactly, however
  # small. Mass 0 means p <= q everywhere, i.e. p == q: then x ~ q is
  # accepted with probability 1 in exact arithmetic (and in float32 too,
  # since r < 1 gives r * q(x) < q(x) for any normal q(x)), so this path is
  # never sampled; if a caller forces it (q(x) = p(x) = 0), draw from p
  # rather than from log(0) = -inf everywhere (token 0, a pad).
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  residual = jnp.where(mass > 0, residual, p_next)
  if sampling.greedy:
    next_token = jnp.argmax(residual, axis=-1)
  else:
    next_token = jax.random.categorical(residual_rng, jnp.log(residual))
  beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)
  return n, accepted, next_token.astype(jnp.int32), beta


def accept_and_commit(rng: Array, drafts: Array, q: Array, p: Array,
                      sampling: SamplingConfig, eos_id: int,
                      max_decode_len: int, sequences: Array, lengths: Array,
                      ended: Array, stats: SpecStats):
  """Steps 3-5 of an iteration for every row: verify, commit, count.

  Rows commit x_1..x_n and the residual / bonus token t, cut at EOS and at
  `max_decode_len`; ended rows change nothing. Shared by every loop that
  verifies drafts (`_SpecLoop`, PaSS's merged loop).

  Args:
    rng: PRNG key of the verification.
    drafts, q, p, sampling: as `verify`.
    eos_id, max_decode_len: the loop's.
    sequences: `[batch, buffer]` committed tokens (BOS first).
    lengths: `[batch]` committed tokens per row.
    ended: `[batch]` bool.
    stats: the running `SpecStats`.

  Returns:
    `(sequences, lengths, ended, stats, n)`, n `[batch]` the accepted drafts.
  """
  g = drafts.shape[1]
  active = ~ended
  n, accepted, next_token, beta = verify(rng, drafts, q, p, sampling)
  new = jnp.where(jnp.arange(g + 1) < n[:, None],
                  jnp.pad(drafts, ((0, 0), (0, 1))), next_token[:, None])
  is_eos = (new == eos_id) & (jnp.arange(g + 1) <= n[:, None])
  first_eos = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1), g + 1)
  room = max_decode_len - (lengths - 1)
  keep = jnp.minimum(jnp.minimum(n + 1, first_eos + 1), room)
  sequences = layers.write_rows(sequences, new, lengths)
  new_lengths = jnp.where(active, lengths + keep, lengths)
  ended = ended | (active & (
      (first_eos < keep) | (new_lengths - 1 >= max_decode_len)))
  # Verified positions: 1..n+1 (the first rejected one included), <= gamma,
  # among those drafted (q_i = 0 marks a position not drafted).
  has_draft = jnp.any(q > 0, axis=-1)
  verified = (jnp.arange(g) <= n[:, None]) & has_draft
  act = active.astype(jnp.int32)
  s = stats
  stats = SpecStats(
      iterations=s.iterations + 1,
      row_iterations=s.row_iterations + act,
      drafted=s.drafted + jnp.sum(has_draft, 1) * act,
      accepted=s.accepted + n * act,
      accepted_at=s.accepted_at + jnp.sum(accepted * act[:, None], axis=0),
      beta_sum=s.beta_sum + jnp.sum(jnp.where(verified, beta, 0.0), 1) * act,
      beta_count=s.beta_count + jnp.sum(verified, 1) * act,
  )
  return sequences, new_lengths, ended, stats, n


@struct.dataclass
class MergedState:
  """State of a loop whose drafts ride on the verification call.

  `SpecState`'s, with the drafts of the next iteration instead of a drafter
  state: drafts `[batch, gamma]` and q `[batch, gamma, vocab]` were drawn in
  the previous iteration (PaSS's look-ahead slots, self-drafting heads); q =
  0 marks a row with no drafts (the first iteration; PaSS after a
  rejection), which `verify` then accepts none of.
  """

  sequences: Array
  lengths: Array
  ended: Array
  target_cache: Any
  drafts: Array
  q: Array
  rng: Array
  stats: SpecStats

  @classmethod
  def start(cls, target_cache, buffer: int, gamma: int, vocab_size: int,
            rng: Array) -> 'MergedState':
    """Every row at BOS, no drafts yet."""
    batch = target_cache.position.shape[0]
    return cls(sequences=jnp.zeros((batch, buffer), jnp.int32),
               lengths=jnp.ones((batch,), jnp.int32),
               ended=jnp.zeros((batch,), bool), target_cache=target_cache,
               drafts=jnp.zeros((batch, gamma), jnp.int32),
               q=jnp.zeros((batch, gamma, vocab_size), jnp.float32),
               rng=rng, stats=SpecStats.zeros(batch, gamma))


def result_of(state, max_decode_len: int) -> SpecResult:
  """The outputs of a finished loop's state (BOS-first `sequences`)."""
  out = state.sequences[:, 1:1 + max_decode_len]
  out = jnp.where(jnp.arange(max_decode_len) < state.lengths[:, None] - 1,
                  out, 0)
  return SpecResult(out, state.lengths - 1, state.stats)


@dataclasses.dataclass(frozen=True)
class MergedLoop:
  """Base of the loops whose drafting rides on the verification call.

  Subclasses (PaSS's `pass_drafter._MergedLoop`, `draft_heads._HeadLoop`)
  add their fields and `body_fn(target_params, draft, state)`, which makes
  one `width`-token target call, verifies the pending drafts and draws the
  next ones; `draft` is what they draft with (look-ahead embeddings, a
  head's params). Run with `run_merged`.
  """

  target: Any
  gamma: int
  sampling: SamplingConfig
  eos_id: int
  max_decode_len: int

  @property
  def width(self) -> int:
    """Tokens per target call (the cache keeps room for one more call)."""
    return self.gamma + 1

  @property
  def buffer(self) -> int:
    return self.max_decode_len + self.gamma + 2

  def cond_fn(self, state: MergedState) -> Array:
    return ~jnp.all(state.ended)

  def body_fn(self, target_params, draft, state: MergedState) -> MergedState:
    raise NotImplementedError

  def __call__(self, target_params, draft, inputs, rng) -> SpecResult:
    state = MergedState.start(
        self.target.init_cache(target_params, inputs,
                               self.max_decode_len + self.width),
        self.buffer, self.gamma, self.target.vocab_size, rng)
    state = jax.lax.while_loop(
        self.cond_fn, functools.partial(self.body_fn, target_params, draft),
        state)
    return result_of(state, self.max_decode_len)


@functools.partial(jax.jit, static_argnums=(0,))
def run_merged(loop: MergedLoop, target_params, draft, inputs, rng):
  """A `MergedLoop`, compiled once per loop configuration and shapes."""
  return loop(target_params, draft, inputs, rng)


@dataclasses.dataclass(frozen=True)
class _SpecLoop:
  """cond_fn/body_fn of the speculative `lax.while_loop`."""

  target: Any
  drafter: Any
  gamma: int
  sampling: SamplingConfig
  eos_id: int
  max_decode_len: int

  @property
  def buffer(self) -> int:
    # BOS + max_decode_len outputs + room for a full gamma+1 block write.
    return self.max_decode_len + self.gamma + 2

  def cond_fn(self, state: SpecState) -> Array:
    return ~jnp.all(state.ended)

  def body_fn(self, target_params, draft_params, state: SpecState):
    g = self.gamma
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    lengths = state.lengths
    # 1. Drafts and their q: [batch, gamma], [batch, gamma, vocab].
    drafts, q, draft_state = self.drafter.propose(
        draft_params, state.draft_state, state.sequences, lengths, g,
        self.sampling, draft_rng)
    # 2. One target call on [last committed token, x_1..x_gamma].
    last = jnp.take_along_axis(state.sequences, (lengths - 1)[:, None], 1)
    block = jnp.concatenate([last, drafts], axis=1)
    logits, target_cache = self.target.extend(
        target_params, block, state.target_cache.rewind(lengths - 1))
    p = sampling_lib.probabilities(logits, self.sampling)
    # 3.-5. Accept/reject, residual or bonus token, commit.
    sequences, new_lengths, ended, stats, _ = accept_and_commit(
        verify_rng, drafts, q, p, self.sampling, self.eos_id,
        self.max_decode_len, state.sequences, lengths, state.ended,
        state.stats)
    return SpecState(sequences, new_lengths, ended, target_cache, draft_state,
                     rng, stats)

  def __call__(self, target_params, draft_params, inputs, draft_inputs, rng):
    batch = inputs.shape[0]
    cache_len = self.max_decode_len + self.gamma + 1
    state = SpecState(
        sequences=jnp.zeros((batch, self.buffer), jnp.int32),
        lengths=jnp.ones((batch,), jnp.int32),
        ended=jnp.zeros((batch,), bool),
        target_cache=self.target.init_cache(target_params, inputs, cache_len),
        draft_state=self.drafter.init(draft_params, draft_inputs, cache_len),
        rng=rng,
        stats=SpecStats.zeros(batch, self.gamma),
    )
    state = jax.lax.while_loop(
        self.cond_fn,
        functools.partial(self.body_fn, target_params, draft_params), state)
    return result_of(state, self.max_decode_len)


@functools.partial(jax.jit, static_argnums=(0,))
def _run(loop: _SpecLoop, target_params, draft_params, inputs, draft_inputs,
         rng):
  return loop(target_params, draft_params, inputs, draft_inputs, rng)


def sampler(drafter) -> Callable[..., SpecResult]:
  """The loop `drafter` decodes with: `speculative_sample`'s signature.

  A drafter whose drafting rides on the target's verification call (PaSS's
  look-ahead slots, self-drafting heads) names its own loop as
  `merged_loop`; every other drafter runs in `speculative_sample`.
  """
  return getattr(drafter, 'merged_loop', None) or speculative_sample


def speculative_sample(
    target,
    target_params,
    drafter,
    draft_params,
    encoder_input_tokens,
    *,
    gamma: int,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int = 1,
    rng: Optional[Array] = None,
    draft_input_tokens=None,
) -> SpecResult:
  """Speculative decoding of a batch; same output distribution as the target.

  Args:
    target: the large model, an `interfaces.DecodingModel` (e.g.
      `network.T5Model`).
    target_params: its parameters.
    drafter: an `interfaces.Drafter` (drafters.py): `T5Drafter`,
      `NgramDrafter`, ...
    draft_params: the drafter's parameters.
    encoder_input_tokens: `[batch, input_length]` int ids in [0, vocab),
      0-padded.
    gamma: drafts per iteration (static, >= 1).
    max_decode_len: output length (static).
    sampling: greedy / temperature / top-k / top-p, applied to p and q alike.
    eos_id: end-of-sequence id in [0, vocab) (-1: none).
    rng: PRNG key (required unless greedy).
    draft_input_tokens: the drafter's inputs if they differ (default: same):
      `[batch, draft_input_length]` int ids, the same rows.

  Returns:
    `SpecResult`: tokens `[batch, max_decode_len]`, lengths, statistics.

  Raises:
    ValueError (TypeError for non-integer token ids or parameters): a bad
      argument, named, before anything is compiled (`_prepare`); draft_params
      are checked by the drafter's `check_params`.

  References: Leviathan et al. 2023, arXiv 2211.17192, Algorithm 1.
  """
  loop, args = _prepare(target, target_params, drafter, draft_params,
                        encoder_input_tokens, gamma, max_decode_len, sampling,
                        eos_id, rng, draft_input_tokens)
  return _run(loop, *args)


def lower_speculative_sample(target, target_params, drafter, draft_params,
                             encoder_input_tokens, *, gamma: int,
                             max_decode_len: int,
                             sampling: SamplingConfig = SamplingConfig(),
                             eos_id: int = 1, rng: Optional[Array] = None,
                             draft_input_tokens=None):
  """`speculative_sample`'s compiled program, lowered but not run.

  `.compile()` on the result compiles it ahead of time (e.g. several at once
  in threads) into jax's cache: a later `speculative_sample` call with the
  same arguments' shapes runs without compiling. Arguments as
  `speculative_sample` (arrays or `jax.ShapeDtypeStruct`s).

  Returns:
    A `jax.stages.Lowered`.
  """
  loop, args = _prepare(target, target_params, drafter, draft_params,
                        encoder_input_tokens, gamma, max_decode_len, sampling,
                        eos_id, rng, draft_input_tokens)
  return _run.lower(loop, *args)


def check_gamma(gamma) -> None:
  """Raises ValueError unless gamma (drafts per iteration) is an int >= 1."""
  if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
    raise ValueError(f'gamma must be an int >= 1, got {gamma!r}.')


def check_vocab(target_vocab_size: int, draft_vocab_size: int) -> None:
  """Raises ValueError unless the drafter's vocabulary is the target's."""
  if draft_vocab_size != target_vocab_size:
    raise ValueError(
        f'Draft and target vocabularies differ: drafter has '
        f'{draft_vocab_size} tokens, target {target_vocab_size}. Speculative '
        'decoding needs the same vocabulary (the same SentencePiece model).')


def _prepare(target, target_params, drafter, draft_params,
             encoder_input_tokens, gamma, max_decode_len, sampling, eos_id,
             rng, draft_input_tokens):
  """Validated loop and arguments of `_run`."""
  decoding.check_common_args(target, encoder_input_tokens, max_decode_len,
                             sampling, eos_id)
  check_gamma(gamma)
  check_vocab(target.vocab_size, drafter.vocab_size)
  try:
    drafter.check_params(draft_params)
  except (TypeError, ValueError) as e:
    raise type(e)(f'draft_params do not fit the {type(drafter).__name__}: '
                  f'{e}') from e
  if draft_input_tokens is not None:
    batch = decoding.check_token_ids('draft_input_tokens', draft_input_tokens,
                                     drafter.vocab_size)[0]
    if batch != np.shape(encoder_input_tokens)[0]:
      raise ValueError(
          f'draft_input_tokens has {batch} rows, encoder_input_tokens '
          f'{np.shape(encoder_input_tokens)[0]}: the drafter drafts for the '
          'same rows.')
  rng = decoding.default_rng(rng, sampling)
  as_ids = lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else (
      jnp.asarray(x, jnp.int32))
  inputs = as_ids(encoder_input_tokens)
  draft_inputs = inputs if draft_input_tokens is None else as_ids(
      draft_input_tokens)
  loop = _SpecLoop(target, drafter, gamma, sampling, int(eos_id),
                   int(max_decode_len))
  return loop, (target_params, draft_params, inputs, draft_inputs, rng)
