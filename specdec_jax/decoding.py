"""Baseline autoregressive decoding (T5X `temperature_sample` semantics).

This is the baseline every speed-up is measured against, so it is as lean as
the speculative loop: one jitted `lax.while_loop`, the encoder run once,
cross-attention keys/values computed once, a one-token decoder call per step
and an explicit cache.

Decoding never sees the network class: it takes a *model* object with

  init_cache(params, encoder_input_tokens, max_length) -> cache
  extend(params, tokens [batch, k], cache) -> (logits [batch, k, vocab], cache)
  vocab_size: int

(`interfaces.DecodingModel`, of which it uses these three members;
`network.T5Model` is one). The model object must be hashable; it is a static
argument of the compiled function.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

from flax import struct
import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import interfaces
from specdec_jax import network
from specdec_jax import sampling as sampling_lib
from specdec_jax import scaffold
from specdec_jax.sampling import SamplingConfig

Array = jax.Array


@struct.dataclass
class DecodeState:
  """Loop state of the baseline decoder.

  Attributes:
    step: scalar int32, number of decoder calls made.
    cur_token: `[batch]` the last token of each row (0 = BOS to start).
    tokens: `[batch, max_decode_len]` the output so far, 0 after EOS.
    ended: `[batch]` bool, row has emitted EOS or reached its length limit.
    cache: the model's decoder cache.
    rng: PRNG key.
  """

  step: Array
  cur_token: Array
  tokens: Array
  ended: Array
  cache: Any
  rng: Array


@struct.dataclass
class DecodeResult:
  """Decoded tokens `[batch, max_decode_len]` (EOS kept, 0 after it) and
  `lengths` `[batch]` (tokens up to and including EOS; in a row without
  one, the tokens decoded: max_decode_len, or the steps `max_decode_steps`
  stopped it at, 0s after them)."""

  tokens: Array
  lengths: Array


def output_lengths(tokens: Array, eos_id: int) -> Array:
  """Tokens per row up to and including the first EOS (or all of them)."""
  is_eos = tokens == eos_id
  first = jnp.argmax(is_eos, axis=-1)
  return jnp.where(jnp.any(is_eos, axis=-1), first + 1, tokens.shape[-1])


def check_fits(name: str, holder, params) -> None:
  """`holder.check_params(params)` (a model's or a drafter's), its refusal
  said as `name` (the argument) not fitting the holder.

  Raises:
    checks.InputError (TypeError for a TypeError): naming `name`.
  """
  try:
    holder.check_params(params)
  except (TypeError, ValueError) as e:  # refused input, named as such
    error = TypeError if isinstance(e, TypeError) else checks.InputError
    raise error(f'{name} do not fit the {type(holder).__name__}: {e}'
                ) from e


def check_is(name: str, value, protocol, example: str) -> None:
  """Raises InputError unless `value` is an instance (not a class) of the
  runtime-checkable `protocol` (an `interfaces` contract): arguments
  given in another order, a class for its instance (`checks.check_type`)."""
  checks.check_type(name, value, protocol,
                    f'an interfaces.{protocol.__name__}, e.g. {example}')


def check_common_args(model, params, encoder_input_tokens, max_decode_len,
                      sampling: SamplingConfig, eos_id,
                      params_name: str = 'params') -> None:
  """Raises on arguments both decoders take, before anything is traced.

  Args:
    model: the (target) model: its `vocab_size` and `check_params`.
    params: its parameters (`check_fits`, said as `params_name`).
    encoder_input_tokens: `[batch, input_length]` int ids in [0, vocab)
      (values checked when concrete: `network.check_token_ids`), or its
      `jax.ShapeDtypeStruct`.
    max_decode_len: output length, an int >= 1.
    sampling: a `SamplingConfig` whose top-k fits the vocabulary.
    eos_id: an int in [0, vocab), or -1 for none (rows run to
      max_decode_len; scripts/benchmark_*.py time fixed lengths so).

  Raises:
    ValueError: naming the argument; TypeError for a non-integer dtype of
      the token ids.
  """
  check_is('model', model, interfaces.DecodingModel,
           'network.T5Model(config)')
  if not isinstance(sampling, SamplingConfig):
    raise checks.InputError(
        f'sampling must be a SamplingConfig, got {sampling!r}.')
  vocab_size = model.vocab_size
  sampling.check_vocab(vocab_size)
  checks.check_int('max_decode_len', max_decode_len)
  checks.check_eos_id(eos_id, vocab_size)
  network.check_token_ids('encoder_input_tokens', encoder_input_tokens,
                          vocab_size)
  check_fits(params_name, model, params)


def as_ids(tokens):
  """int32 token ids as a jax array (a `jax.ShapeDtypeStruct` unchanged)."""
  if isinstance(tokens, jax.ShapeDtypeStruct):
    return tokens
  return jnp.asarray(tokens, jnp.int32)


def default_rng(rng: Optional[Array], sampling: SamplingConfig) -> Array:
  """`rng`, or a fixed key when greedy (which draws nothing); else an error.

  Raises:
    ValueError: rng is None and the sampling mode samples (temperature > 0),
      or not one key (`network.check_key`).
  """
  if rng is not None:
    network.check_key('rng', rng)
    return rng
  if not sampling.greedy:
    raise checks.InputError('rng is required when temperature > 0.')
  return jax.random.key(0)


@dataclasses.dataclass(frozen=True)
class SampleLoop:
  """cond_fn/body_fn of the baseline `lax.while_loop`.

  With `block_size` k > 1 every step is a k-token call: the row's token then
  k - 1 copies of it as dummies, written past the row's position (stale
  slots: never attended to, overwritten by the next step), on a cache of
  max_decode_len + k slots. Those are the shapes of a speculative
  verification with gamma = k - 1, so both decoders run the same kernels.
  """

  model: Any
  sampling: SamplingConfig
  eos_id: int
  max_decode_len: int
  block_size: int = 1

  @property
  def cache_length(self) -> int:
    # As speculative.SpecLoop's target cache for gamma = block_size - 1.
    if self.block_size == 1:
      return self.max_decode_len
    return self.max_decode_len + self.block_size

  def cond_fn(self, state: DecodeState) -> Array:
    return ~jnp.all(state.ended)

  def body_fn(self, params, max_steps, state: DecodeState) -> DecodeState:
    rng, step_rng = jax.random.split(state.rng)
    if self.block_size == 1:
      # [batch, 1] -> [batch, 1, vocab]
      logits, cache = self.model.extend(params, state.cur_token[:, None],
                                        state.cache)
    else:
      # [batch, k] (the token, then k - 1 dummies) -> [batch, k, vocab]; the
      # cache keeps the token only.
      block = jnp.repeat(state.cur_token[:, None], self.block_size, axis=1)
      logits, cache = self.model.extend(params, block, state.cache)
      cache = cache.rewind(state.cache.position + 1)
    token = sampling_lib.sample(step_rng, logits[:, 0], self.sampling)
    token = jnp.where(state.ended, 0, token)
    tokens = jax.lax.dynamic_update_slice(
        state.tokens, token[:, None], (0, state.step)
    )
    step = state.step + 1
    ended = state.ended | (token == self.eos_id) | (step >= max_steps)
    return DecodeState(step, token, tokens, ended, cache, rng)

  def __call__(self, params, encoder_input_tokens, rng, max_steps):
    batch = encoder_input_tokens.shape[0]
    cache = self.model.init_cache(
        params, encoder_input_tokens, self.cache_length
    )
    state = DecodeState(
        step=jnp.zeros((), jnp.int32),
        cur_token=jnp.zeros((batch,), jnp.int32),
        tokens=jnp.zeros((batch, self.max_decode_len), jnp.int32),
        ended=jnp.zeros((batch,), bool),
        cache=cache,
        rng=rng,
    )
    state = jax.lax.while_loop(
        self.cond_fn, functools.partial(self.body_fn, params, max_steps), state
    )
    # A row without EOS decoded `step` tokens (max_steps may stop it short).
    lengths = jnp.minimum(output_lengths(state.tokens, self.eos_id),
                          state.step)
    return DecodeResult(state.tokens, lengths)


@scaffold.decoder
def temperature_sample(
    model,
    params,
    encoder_input_tokens,
    *,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int = 1,
    rng: Optional[Array] = None,
    max_decode_steps: Optional[int] = None,
    block_size: int = 1,
) -> DecodeResult:
  """Autoregressive decoding of a batch, compiled once per shape and config.

  A `scaffold.decoder`: `temperature_sample(...)` decodes;
  `temperature_sample.lower(...)` lowers the program ahead of time (arrays
  or `jax.ShapeDtypeStruct`s); `temperature_sample.prepare(...)` returns the
  validated `(SampleLoop, args)` (the body below).

  Args:
    model: an `interfaces.DecodingModel` (see module docstring), e.g.
      `T5Model`.
    params: the model's parameters.
    encoder_input_tokens: `[batch, input_length]` int ids in [0, vocab),
      0-padded; rows may have different lengths.
    max_decode_len: output length (static).
    sampling: greedy / temperature / top-k / top-p.
    eos_id: end-of-sequence id in [0, vocab); a row stops after emitting it
      (-1: no EOS, every row runs to max_decode_len).
    rng: PRNG key (required unless greedy).
    max_decode_steps: optional dynamic cap <= max_decode_len on the steps.
    block_size: 1 (one token per decoder call), or k > 1: each step is a
      k-token call (the token and k - 1 dummies, dropped from the cache) on a
      cache of max_decode_len + k slots, the shapes of the speculative loop's
      verification at gamma = k - 1. The step then runs the same kernels as
      the verification: where a backend gives each row of a call the same
      bits whatever the other rows hold (the usual case: the reduction order
      depends on shapes, not values), greedy outputs equal the speculative
      ones bit for bit in any dtype, at the cost of a k-token step
      (cost(k) ~ 1 on a GPU at batch 1). Needs a cache with `position` and
      `rewind` (`network.DecoderCache`).

  Returns:
    `DecodeResult` with `tokens` `[batch, max_decode_len]`.

  Raises:
    ValueError (TypeError for non-integer token ids): a bad argument, named,
      before anything is compiled (`check_common_args`; params of another
      configuration: the model's `check_params`).
  """
  check_common_args(model, params, encoder_input_tokens, max_decode_len,
                    sampling, eos_id)
  if max_decode_steps is not None and not (
      checks.is_int(max_decode_steps) and 1 <= max_decode_steps <= (
          max_decode_len)):
    raise checks.InputError(
        f'max_decode_steps must be in [1, max_decode_len={max_decode_len}], '
        f'got {max_decode_steps!r}.'
    )
  checks.check_int('block_size', block_size)
  rng = default_rng(rng, sampling)
  loop = SampleLoop(model, sampling, int(eos_id), int(max_decode_len),
                    int(block_size))
  max_steps = jnp.int32(max_decode_steps or max_decode_len)
  return loop, (params, as_ids(encoder_input_tokens), rng, max_steps)
