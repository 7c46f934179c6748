"""Baseline decoding: T5X temperature_sample semantics, exact and sampled."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax import decoding
from specdec_jax.sampling import SamplingConfig
from specdec_jax import scaffold

from conftest import teacher_forced_logits
from reference import reference_distribution

EOS = 1


@dataclasses.dataclass(frozen=True)
class StepStub:
  """A decoder whose next token is (input token + params[b, position]) % V.

  Exact-token tests need logits we control: the expected output can then be
  computed by hand, independent of the decoder under test.
  """

  vocab_size: int = 16

  def check_params(self, params):
    del params  # a stub's params are whatever its test gives

  def init_cache(self, params, encoder_input_tokens, max_length):
    return {'position': jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32)}

  def extend(self, params, tokens, cache):
    pos = cache['position'][:, None] + jnp.arange(tokens.shape[1])
    offset = jnp.take_along_axis(params, pos, axis=1)
    nxt = (tokens + offset) % self.vocab_size
    logits = 10.0 * jax.nn.one_hot(nxt, self.vocab_size)
    return logits, {'position': cache['position'] + tokens.shape[1]}

  def logits(self, *args):
    raise NotImplementedError('a decoding stub: no teacher-forced pass')


def expected_stub_output(offsets, steps, vocab=16):
  out = np.zeros((offsets.shape[0], steps), np.int32)
  for b in range(offsets.shape[0]):
    tok = 0
    for t in range(steps):
      tok = (tok + offsets[b, t]) % vocab
      out[b, t] = tok
      if tok == EOS:
        break
  return out


def test_eos_and_lengths_per_row():
  """Rows stop at their own EOS; later positions stay 0; others go on."""
  offsets = np.full((3, 12), 3)
  offsets[0, 3] = (EOS - 9) % 16  # row 0: 3, 6, 9, then EOS
  offsets[2, 0] = EOS  # row 2: EOS first
  got = decoding.temperature_sample(
      StepStub(), jnp.asarray(offsets), jnp.ones((3, 4), jnp.int32),
      max_decode_len=10, eos_id=EOS)
  want = expected_stub_output(offsets, 10)
  np.testing.assert_array_equal(got.tokens, want)
  np.testing.assert_array_equal(want[0, :5], [3, 6, 9, EOS, 0])
  np.testing.assert_array_equal(got.lengths, [4, 10, 1])


def test_max_decode_steps_caps_every_row():
  """Rows stop at the steps (or their EOS before them); a row's length is
  the tokens it decoded, not max_decode_len."""
  offsets = np.full((2, 12), 2)
  offsets[1, 1] = (EOS - 2) % 16  # row 1: 2, then EOS
  got = decoding.temperature_sample(
      StepStub(), jnp.asarray(offsets), jnp.ones((2, 4), jnp.int32),
      max_decode_len=10, eos_id=EOS, max_decode_steps=3)
  np.testing.assert_array_equal(got.tokens[:, :4], [[2, 4, 6, 0],
                                                    [2, EOS, 0, 0]])
  assert not np.asarray(got.tokens[:, 3:]).any()
  np.testing.assert_array_equal(got.lengths, [3, 2])


# t = 1 unfiltered is no case of its own: sampling divides by t as at 0.7
# (no path for t = 1), and top-k samples at t = 1.
@pytest.mark.parametrize('temperature,topk,topp', [
    (0.7, 0, 1.0), (1.0, 5, 1.0), (0.8, 0, 0.6),
])
def test_first_token_histogram_matches_softmax(v11, temperature, topk, topp):
  """Chi-square goodness of fit (p > 1e-4) of 20k first tokens vs softmax.

  Tokens outside the top-k / top-p set must never be sampled.
  """
  model, params = v11
  n = 20_000
  enc = jnp.tile(jnp.array([[7, 9, 11, 13, 1]]), (n, 1))
  logits = teacher_forced_logits(model, params, enc[:1],
                                 jnp.zeros((1, 1), jnp.int32))[0, 0]
  p = reference_distribution(logits, temperature, topk, topp)
  got = decoding.temperature_sample(
      model, params, enc, max_decode_len=1,
      sampling=SamplingConfig(temperature, topk, topp),
      rng=jax.random.key(11))
  counts = np.bincount(np.asarray(got.tokens[:, 0]), minlength=p.size)
  assert counts[p == 0].sum() == 0
  expected = n * p
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  assert big.sum() >= 4  # a distribution worth testing
  assert stats.chisquare(obs, exp).pvalue > 1e-4


class Untouchable:
  """A model that fails loudly if decoding reaches it."""

  vocab_size = 32

  def check_params(self, params):
    del params  # a stub's params are whatever its test gives

  def init_cache(self, *args):
    raise AssertionError('validation must happen before tracing')

  extend = logits = init_cache


@pytest.mark.parametrize('kwargs,message', [
    (dict(sampling_args=dict(temperature=-0.5)), 'temperature'),
    (dict(sampling_args=dict(temperature=1.0, topp=0.0)), 'topp'),
    (dict(sampling_args=dict(temperature=1.0, topp=1.5)), 'topp'),
    (dict(sampling_args=dict(temperature=1.0, topk=4, topp=0.9)),
     'At most one'),
    (dict(sampling_args=dict(temperature=1.0, topk=-1)), 'topk'),
    (dict(sampling_args=dict(temperature=1.0, topk=33)), 'vocabulary'),
    (dict(max_decode_len=0), 'max_decode_len'),
    (dict(max_decode_len=4, max_decode_steps=5), 'max_decode_steps'),
    (dict(max_decode_len=4, max_decode_steps=3.0), r'max_decode_steps .*3\.0'),
    (dict(inputs=np.ones((4,), np.int32)), 'batch, length'),
    (dict(inputs=[[3, 4, 1], [5, 1]]), 'rows of different lengths .pad them'),
    (dict(sampling_args=dict(topk=5)), 'topk 5 has no effect when greedy'),
    (dict(sampling_args=dict(temperature=1.0), rng=None), 'rng'),
])
def test_bad_arguments_raise_before_compiling(kwargs, message):
  kwargs = dict(kwargs)
  sampling_args = kwargs.pop('sampling_args', {})
  inputs = kwargs.pop('inputs', np.ones((2, 3), np.int32))
  kwargs.setdefault('max_decode_len', 4)
  kwargs.setdefault('rng', jax.random.key(0))
  with pytest.raises(ValueError, match=message):
    decoding.temperature_sample(
        Untouchable(), {}, inputs,
        sampling=SamplingConfig(**sampling_args), **kwargs)


def test_no_recompile_for_new_inputs_and_weights(v11):
  model, params = v11
  enc = np.random.default_rng(0).integers(2, 100, (2, 6))
  decoding.temperature_sample(model, params, enc, max_decode_len=5)
  size = scaffold.cache_size()
  other = jax.tree_util.tree_map(lambda x: x * 1.01, params)
  decoding.temperature_sample(model, other, enc[::-1] + 1, max_decode_len=5)
  assert scaffold.cache_size() == size
