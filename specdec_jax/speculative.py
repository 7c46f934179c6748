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
     the drafter re-synchronises itself from `lengths`: `interfaces.Drafter`).

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
from typing import Any, Optional

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import interfaces
from specdec_jax import layers
from specdec_jax import network
from specdec_jax import sampling as sampling_lib
from specdec_jax import scaffold
from specdec_jax.sampling import SamplingConfig
from specdec_jax.spec_stats import SpecResult
from specdec_jax.spec_stats import SpecStats

Array = jax.Array


@struct.dataclass
class SpecState:
  """Loop state of every loop that verifies drafts.

  Attributes:
    sequences: `[batch, buffer]` committed decoder tokens, BOS (0) at index 0.
    lengths: `[batch]` committed tokens per row, BOS included (>= 1).
    ended: `[batch]` bool.
    target_cache: the target's decoder cache.
    draft_state: the drafter's state: its own (e.g. its cache) in a
      `SpecLoop`; a `Pending` (the next iteration's drafts) in a
      `MergedLoop`. Every leaf has the batch as its leading axis.
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
    sampling: the sampling mode. Greedy: p is the one-hot of the target's
      argmax (`sampling.probabilities`), so a draft is accepted iff p(x) > 0,
      with no random draw, and the next token is the residual's argmax.

  Returns:
    `(n [batch], accepted [batch, gamma] bool prefix mask, next_token [batch],
    beta [batch, gamma])` where beta_i = sum_x min(p_i, q_i).

  A draft position with q_i = 0 everywhere is undrafted (see `ok` below).

  Raises:
    checks.InputError (TypeError for float drafts): `check_verify_args`.
  """
  rng = check_verify_args(rng, drafts, q, p, sampling)
  gamma = drafts.shape[1]
  p_x = jnp.take_along_axis(p[:, :gamma], drafts[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
  if sampling.greedy:
    # p is one-hot (0 or 1 exactly): r * q(x) < p(x) holds for every r in
    # [0, 1) iff p(x) = 1, so r = 0 decides the same and greedy decoding
    # draws no random numbers (nor compiles their generator).
    r = jnp.zeros(drafts.shape, jnp.float32)
  else:
    accept_rng, residual_rng = jax.random.split(rng)
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


def check_verify_args(rng, drafts, q, p, sampling: SamplingConfig):
  """Raises unless `verify`'s arguments fit each other; returns the rng
  (`decoding.default_rng`: a greedy verification draws nothing).

  Shapes, dtypes and types only (Python at trace time, nothing added to a
  loop's program), and the drafts' values where they are concrete
  (`network.check_token_ids`; inside a jitted loop they are tracers).

  Raises:
    checks.InputError: sampling not a `SamplingConfig`, rng not one key
      (or None when sampling), drafts not `[batch, gamma]` ids of p's
      vocabulary, q not `[batch, gamma, vocab]`, p not `[batch, gamma + 1,
      vocab]`.
    TypeError: drafts not integer ids.
  """
  checks.check_type('sampling', sampling, SamplingConfig, 'a SamplingConfig')
  rng = decoding.default_rng(rng, sampling)
  if np.ndim(p) != 3:
    raise checks.InputError(
        f'p must be [batch, gamma + 1, vocab] probabilities, got shape '
        f'{np.shape(p)}.')
  vocab = np.shape(p)[-1]
  batch, gamma = network.check_token_ids('drafts', drafts, vocab)
  for name, value, want, said in (
      ('q', q, (batch, gamma, vocab), '[batch, gamma, vocab]'),
      ('p', p, (batch, gamma + 1, vocab), '[batch, gamma + 1, vocab]')):
    if np.shape(value) != want:
      raise checks.InputError(
          f'{name} must be {said} = {want} (drafts [batch, gamma] = '
          f"{(batch, gamma)}, vocab {vocab}: p's last axis); got shape "
          f'{np.shape(value)}.')
  return rng


def accept_and_commit(rng: Array, drafts: Array, q: Array, p: Array,
                      sampling: SamplingConfig, eos_id: int,
                      max_decode_len: int, sequences: Array, lengths: Array,
                      ended: Array, stats: SpecStats):
  """Steps 3-5 of an iteration for every row: verify, commit, count.

  Rows commit x_1..x_n and the residual / bonus token t, cut at EOS and at
  `max_decode_len`; ended rows change nothing. Shared by every loop that
  verifies drafts (`SpecLoop`, every `MergedLoop`).

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
  sequences, new_lengths, ended = commit_tokens(
      drafts, n, next_token, eos_id, max_decode_len, sequences, lengths,
      ended)
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


def commit_tokens(drafts: Array, n: Array, next_token: Array, eos_id: int,
                  max_decode_len: int, sequences: Array, lengths: Array,
                  ended: Array):
  """Step 5 for every row: commit drafts[:, :n] and next_token.

  Cut at EOS and at `max_decode_len`; ended rows change nothing. Shared by
  every loop that verifies drafts (a chain's drafts, a tree's accepted
  path).

  Args:
    drafts: `[batch, g]` the accepted drafts first (the rest ignored).
    n: `[batch]` accepted drafts.
    next_token: `[batch]` the residual / bonus token.
    eos_id, max_decode_len: the loop's.
    sequences, lengths, ended: the loop's buffers (`SpecState`).

  Returns:
    `(sequences, lengths, ended)`.
  """
  g = drafts.shape[1]
  active = ~ended
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
  return sequences, new_lengths, ended


def result_of(state: SpecState, max_decode_len: int) -> SpecResult:
  """The outputs of a finished loop's state (BOS-first `sequences`)."""
  out = state.sequences[:, 1:1 + max_decode_len]
  out = jnp.where(jnp.arange(max_decode_len) < state.lengths[:, None] - 1,
                  out, 0)
  return SpecResult(out, state.lengths - 1, state.stats)


@dataclasses.dataclass(frozen=True)
class VerifyLoop:
  """What every loop that verifies drafts shares (static under `jit`).

  A subclass says how drafts are made: `init_draft` (the drafter's state of
  new rows) and `body_fn` (one iteration: drafts, one target call, then
  `accept_and_commit`). The start, the `lax.while_loop` and the result are
  here, and `streaming` refills rows of any subclass through `init_draft`.
  """

  target: Any
  gamma: int
  sampling: SamplingConfig
  eos_id: int
  max_decode_len: int

  @property
  def buffer(self) -> int:
    # BOS + max_decode_len outputs + room for a full gamma+1 block write.
    return self.max_decode_len + self.gamma + 2

  @property
  def cache_length(self) -> int:
    """Decoder slots of the target's cache (and the drafter's `init`)."""
    return self.max_decode_len + self.gamma + 1

  def init_draft(self, draft_params, draft_inputs: Array):
    """The drafter's state of rows that start (`draft_inputs` `[rows, n]`)."""
    raise NotImplementedError

  def init_target_cache(self, target_params, inputs: Array):
    """The target's cache of rows that start (`inputs` `[rows, length]`)."""
    return self.target.init_cache(target_params, inputs, self.cache_length)

  def with_target(self, draft_params, target_params):
    """The draft params the loop's drafter reads (`with_target`): applied
    once, inside the compiled program, before anything else."""
    del target_params
    return draft_params

  @property
  def draft_init_name(self) -> str:
    """What `init_draft` calls, as errors name it."""
    return f'{type(self).__name__}.init_draft'

  def body_fn(self, target_params, draft_params,
              state: SpecState) -> SpecState:
    raise NotImplementedError

  def cond_fn(self, state: SpecState) -> Array:
    return ~jnp.all(state.ended)

  def start(self, target_params, draft_params, inputs: Array,
            draft_inputs: Array, rng: Array) -> SpecState:
    """Every row at BOS: the target's cache and the drafter's state."""
    batch = inputs.shape[0]
    return SpecState(
        sequences=jnp.zeros((batch, self.buffer), jnp.int32),
        lengths=jnp.ones((batch,), jnp.int32),
        ended=jnp.zeros((batch,), bool),
        target_cache=self.init_target_cache(target_params, inputs),
        draft_state=self.init_draft(draft_params, draft_inputs),
        rng=rng,
        stats=SpecStats.zeros(batch, self.gamma))

  def __call__(self, target_params, draft_params, inputs, draft_inputs,
               rng) -> SpecResult:
    draft_params = self.with_target(draft_params, target_params)
    state = self.start(target_params, draft_params, inputs, draft_inputs, rng)
    state = jax.lax.while_loop(
        self.cond_fn,
        functools.partial(self.body_fn, target_params, draft_params), state)
    return result_of(state, self.max_decode_len)


class DrafterLoop(VerifyLoop):
  """A loop whose drafts come from a drafter of its own (`self.drafter`,
  a field of the subclass): its `init` starts rows, and it reads the
  target's params where it is an `interfaces.TargetReader`. `SpecLoop`
  (a chain) and the token trees' `TreeLoop`."""

  def init_draft(self, draft_params, draft_inputs):
    return self.drafter.init(draft_params, draft_inputs, self.cache_length)

  def with_target(self, draft_params, target_params):
    return with_target(self.drafter, draft_params, target_params)

  @property
  def draft_init_name(self) -> str:
    return f'{type(self.drafter).__name__}.init'


@dataclasses.dataclass(frozen=True)
class SpecLoop(DrafterLoop):
  """Algorithm 1 with an ordinary drafter (`interfaces.Drafter.propose`)."""

  drafter: Any

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


@struct.dataclass
class Pending:
  """A merged loop's drafter state: the drafts of the next iteration.

  drafts `[batch, gamma]` and q `[batch, gamma, vocab]` were drawn in the
  previous iteration (PaSS's look-ahead slots, self-drafting heads); q = 0
  marks a row with no drafts (a row that starts; PaSS after a rejection),
  which `verify` then accepts none of: its token comes from p_1.
  """

  drafts: Array
  q: Array


@dataclasses.dataclass(frozen=True)
class MergedLoop(VerifyLoop):
  """Base of the loops whose drafting rides on the verification call.

  A `interfaces.MergedDrafter`'s `merged_loop` returns a subclass, which
  adds its fields and `body_fn(target_params, draft_params, state)`: one
  `width`-token target call verifies `state.draft_state` (a `Pending`) and
  draws the next drafts. Rows start with no drafts.
  """

  @property
  def width(self) -> int:
    """Tokens per target call (the cache keeps room for one more call)."""
    return self.gamma + 1

  @property
  def cache_length(self) -> int:
    return self.max_decode_len + self.width

  def init_draft(self, draft_params, draft_inputs):
    del draft_params
    batch = draft_inputs.shape[0]
    return Pending(
        drafts=jnp.zeros((batch, self.gamma), jnp.int32),
        q=jnp.zeros((batch, self.gamma, self.target.vocab_size),
                    jnp.float32))


def check_gamma(gamma) -> None:
  """Raises ValueError unless gamma (drafts per iteration) is an int >= 1."""
  checks.check_int('gamma', gamma)


def check_vocab(target_vocab_size: int, draft_vocab_size: int) -> None:
  """Raises ValueError unless the drafter's vocabulary is the target's."""
  if draft_vocab_size != target_vocab_size:
    raise checks.InputError(
        f'Draft and target vocabularies differ: drafter has '
        f'{draft_vocab_size} tokens, target {target_vocab_size}. Speculative '
        'decoding needs the same vocabulary (the same SentencePiece model).')


def with_target(drafter, draft_params, target_params):
  """The params `drafter`'s methods read: an `interfaces.TargetReader`'s
  with the target's own params handed in, any other's as they are. The
  loops apply it inside their compiled program; a caller that runs a
  drafter's methods itself (scores, timings) applies it first."""
  if isinstance(drafter, interfaces.TargetReader):
    return drafter.with_target(draft_params, target_params)
  return draft_params


def check_drafter_gamma(drafter, gamma: int,
                        merged: Optional[bool] = None) -> None:
  """Raises ValueError if `drafter` drafts fewer than gamma per iteration
  in the loop `merged` selects (`decodes_merged`; a `MergedDrafter`'s
  `max_gamma`)."""
  if not isinstance(drafter, interfaces.MergedDrafter):
    return
  merged = decodes_merged(drafter, merged)
  top = drafter.max_gamma(merged)
  if top is not None and gamma > top:
    raise checks.InputError(
        f'gamma={gamma} > {top}: the {type(drafter).__name__} drafts at '
        f'most {top} tokens per iteration in its '
        f'{"merged" if merged else "ordinary"} loop.')


def decodes_merged(drafter, merged: Optional[bool] = None) -> bool:
  """Whether `speculative_sample` runs `drafter`'s merged loop.

  merged None: the drafter's own loop (merged for an
  `interfaces.MergedDrafter`); True refuses any other drafter.
  """
  is_merged = isinstance(drafter, interfaces.MergedDrafter)
  if merged is None:
    return is_merged
  if merged and not is_merged:
    raise checks.InputError(
        'merged=True needs a drafter whose drafting rides on the '
        'verification call (interfaces.MergedDrafter), got '
        f'{type(drafter).__name__}.')
  return bool(merged)


@scaffold.decoder
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
    merged: Optional[bool] = None,
) -> SpecResult:
  """Speculative decoding of a batch; same output distribution as the target.

  A `scaffold.decoder`: `speculative_sample(...)` decodes;
  `speculative_sample.lower(...)` lowers the program ahead of time (arrays
  or `jax.ShapeDtypeStruct`s); `speculative_sample.prepare(...)` returns the
  validated `(loop, args)` (the body below; `streaming` wraps the loop).

  Args:
    target: the large model, an `interfaces.DecodingModel` (e.g.
      `network.T5Model`).
    target_params: its parameters.
    drafter: an `interfaces.Drafter` (`specdec_jax.drafters`).
    draft_params: the drafter's parameters.
    encoder_input_tokens: `[batch, input_length]` int ids in [0, vocab),
      0-padded.
    gamma: drafts per iteration (static, >= 1; at most the drafter's
      `max_gamma` for a `MergedDrafter`).
    max_decode_len: output length (static).
    sampling: greedy / temperature / top-k / top-p, applied to p and q alike.
    eos_id: end-of-sequence id in [0, vocab) (-1: none).
    rng: PRNG key (required unless greedy).
    draft_input_tokens: the drafter's inputs if they differ (default: same):
      `[batch, draft_input_length]` int ids, the same rows.
    merged: which loop: None (default) the drafter's own, i.e. its
      `merged_loop` for an `interfaces.MergedDrafter` (one target call per
      iteration; drafting rides on it), else `SpecLoop`; False forces
      `SpecLoop` (propose, then verify); True requires a `MergedDrafter`.

  Returns:
    `SpecResult`: tokens `[batch, max_decode_len]`, lengths, statistics
    (`stats.iterations` counts target calls).

  Raises:
    ValueError (TypeError for non-integer token ids or parameters): a bad
      argument, named, before anything is compiled; target_params are
      checked by the target's `check_params`, draft_params by the
      drafter's.

  References: Leviathan et al. 2023, arXiv 2211.17192, Algorithm 1.
  """
  decoding.check_common_args(target, target_params, encoder_input_tokens,
                             max_decode_len, sampling, eos_id,
                             params_name='target_params')
  check_gamma(gamma)
  decoding.check_is('drafter', drafter, interfaces.Drafter,
                    'drafters.T5Drafter(draft_model)')
  check_vocab(target.vocab_size, drafter.vocab_size)
  use_merged = decodes_merged(drafter, merged)
  check_drafter_gamma(drafter, gamma, use_merged)
  decoding.check_fits('draft_params', drafter, draft_params)
  if isinstance(drafter, interfaces.TargetReader):  # built for this target?
    decoding.check_fits(  # shapes alone: the values were checked above
        'target_params, which the drafter reads,', drafter, jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype),
            with_target(drafter, draft_params, target_params)))
  if draft_input_tokens is not None:
    batch = network.check_token_ids('draft_input_tokens', draft_input_tokens,
                                     drafter.vocab_size)[0]
    network.check_rows('draft_input_tokens', batch, 'encoder_input_tokens',
                       np.shape(encoder_input_tokens)[0])
  rng = decoding.default_rng(rng, sampling)
  inputs = decoding.as_ids(encoder_input_tokens)
  draft_inputs = inputs if draft_input_tokens is None else decoding.as_ids(
      draft_input_tokens)
  shape = dict(target=target, gamma=int(gamma), sampling=sampling,
               eos_id=int(eos_id), max_decode_len=int(max_decode_len))
  if use_merged:
    loop = drafter.merged_loop(**shape)
  else:
    loop = SpecLoop(drafter=drafter, **shape)
  return loop, (target_params, draft_params, inputs, draft_inputs, rng)
