"""Speculative decoding is exact: the paper's promise, tested directly.

Greedy: tokens equal the baseline's, row for row, for every gamma and drafter.
Sampling: the distribution over whole short sequences, enumerated exactly from
the target, matches tens of thousands of speculative samples (chi-square),
including adversarial drafters.
"""

import collections
import dataclasses
import functools
import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax import checks
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import speculative
from specdec_jax.sampling import SamplingConfig
from specdec_jax import scaffold
from specdec_jax import spec_stats
from specdec_jax import synthetic

from conftest import RAGGED_EOS
from conftest import RAGGED_MAX_LEN
from conftest import TINY_V11
from conftest import teacher_forced_logits
from reference import reference_distribution

MAX_LEN = RAGGED_MAX_LEN
EOS = RAGGED_EOS


def perturbed(params, scale, seed):
  """A 'good drafter': the target's weights plus noise (agrees often);
  the package's rule (`synthetic.perturbed`), drawn from `seed`."""
  return synthetic.perturbed(params, scale, jax.random.key(seed))


@pytest.fixture(scope='module')
def greedy_setup(v11, ragged_greedy):
  model, params = v11
  enc, base = ragged_greedy
  small = network.T5Model(TINY_V11.replace(
      emb_dim=16, num_heads=2, mlp_dim=32, num_encoder_layers=1,
      num_decoder_layers=1))
  return model, params, enc, base, {
      'self': (drafters.T5Drafter(model), params),
      'good': (drafters.T5Drafter(model), perturbed(params, 0.1, 0)),
      'random': (drafters.T5Drafter(small), small.init_params(
          jax.random.key(9))),
  }


def test_greedy_setup_is_not_trivial(greedy_setup):
  """Rows must end at different times for the equality tests to mean much."""
  _, _, _, base, _ = greedy_setup
  lengths = np.asarray(base.lengths)
  assert len(set(lengths.tolist())) >= 3 and lengths.max() == MAX_LEN


# 'self' and 'good' share one compiled loop per gamma (the same drafter
# model, other weights); 'random' (a smaller model) is a program of its own
# per gamma, so it runs at the two ends of the range only.
@pytest.mark.parametrize('drafter,gamma', [
    (d, g) for d in ('self', 'good') for g in (1, 2, 3, 5, 8)] + [
        ('random', 1), ('random', 8)])
def test_greedy_equals_baseline(greedy_setup, gamma, drafter):
  model, params, enc, base, drafts = greedy_setup
  dr, dparams = drafts[drafter]
  out = speculative.speculative_sample(
      model, params, dr, dparams, enc, gamma=gamma, max_decode_len=MAX_LEN,
      eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  summary = spec_stats.summarize(out.stats)
  if drafter == 'self' and gamma == 1:  # the result for its stats: named
    with pytest.raises(checks.InputError, match=(
        "stats must be a SpecStats .a decode's `.stats`., got a SpecResult")):
      spec_stats.summarize(out)
  if drafter == 'self':
    # alpha = 1: every iteration of a row yields gamma+1 tokens (the last one
    # may be cut by EOS or the length limit). This fails if the drafter does
    # not catch up on x_gamma after a fully accepted iteration.
    expected = np.ceil(np.asarray(base.lengths) / (gamma + 1))
    np.testing.assert_array_equal(out.stats.row_iterations, expected)
    assert summary['acceptance_rate'] == 1.0
    assert summary['alpha'] == pytest.approx(1.0, abs=1e-5)
  if drafter == 'good':  # partial agreement: both branches of the test run
    assert 0.0 < summary['acceptance_rate'] < 1.0
    assert summary['per_position_acceptance'][0] > 0.2
  if drafter == 'random':
    assert summary['acceptance_rate'] < 0.3
  assert int(out.stats.iterations) == int(out.stats.row_iterations.max())


# ---------------------------------------------------------------------------
# Sampling: exact distribution over whole sequences.
# ---------------------------------------------------------------------------

VOCAB = 6
SEQ_LEN = 3
SMALL_EOS = 1
N_SAMPLES = 30_000
# One layer and one head each side: a law test decodes N_SAMPLES rows, so the
# model's size is its run time (multi-layer, multi-head caches are the greedy
# tests' job, on TINY_V11).
TINY = TINY_V11.replace(vocab_size=VOCAB, num_heads=1, head_dim=16,
                        num_encoder_layers=1, num_decoder_layers=1)
# The target's logits are scaled by this factor: a random init this small is
# nearly uniform over the V^3 sequences, and there the total-variation bound
# of `assert_matches` (0.02) is within the sampling noise of N_SAMPLES draws.
LOGIT_SCALE = 3.25
# The expected total variation of N_SAMPLES exact draws from the t = 1 law,
# the noise the 0.02 bound must stay clear of, is at most this
# (test_tiny_target_law_is_not_flat): at 0.0145 (sd ~0.0018) a draw exceeds
# 0.02 by chance once in ~300.
MAX_NOISE_TV = 0.0145
# XLA's CPU optimization level of the law tests' programs (the suite compiles
# at level 0, conftest): they decode N_SAMPLES rows, which level 0 runs ~2x
# slower (a tree loop's run: 6.1 s of CPU, 3.8 s at level 1) while level 1
# compiles in half level 3's time and runs as fast (measured, compile + run CPU
# seconds at levels 0 / 1 / 3: t5 3.4 / 3.4 / 4.8, tree 7.5 / 7.7 / 10.6, heads
# tree 13.3 / 7.6 / 10.5, combined 7.0 / 6.4 / 8.9, heads 5.2 / 3.3 / 5.4).
# Every law test decodes through `run_optimized` or `sample_optimized`.
OPTIMIZED = {'xla_backend_optimization_level': 1}


@functools.partial(jax.jit, static_argnums=0, compiler_options=OPTIMIZED)
def run_optimized(loop, *args):
  """`scaffold.run(loop, *args)`, its program compiled `OPTIMIZED` (once per
  loop and argument shapes: a law test that decodes a loop another one
  compiled, as the two adversarial unigram drafters do with other weights,
  neither traces nor compiles it again)."""
  return loop(*args)


def sample_optimized(decode, *args, **kwargs):
  """`decode(*args, **kwargs)` (a `scaffold.decoder`) compiled `OPTIMIZED`."""
  loop, loop_args = decode.prepare(*args, **kwargs)
  return run_optimized(loop, *loop_args)


@pytest.fixture(scope='module')
def tiny_target():
  model = network.T5Model(TINY)
  params = model.init_params(jax.random.key(4))
  dense = params['decoder']['logits_dense']
  params['decoder']['logits_dense'] = {'kernel': LOGIT_SCALE * dense['kernel']}
  enc = jnp.array([[3, 4, 5, 2, 1]])
  return model, params, enc


def exact_sequence_distribution(model, params, enc, config):
  """P(x_1..x_3) from teacher-forced target logits, standardized in numpy.

  Sequences that emit EOS early are padded with 0 (the decoders' output).
  """
  seqs = np.array(list(itertools.product(range(VOCAB), repeat=SEQ_LEN)))
  dec_in = np.concatenate([np.zeros((len(seqs), 1), int), seqs[:, :-1]], 1)
  logits = np.asarray(teacher_forced_logits(
      model, params, jnp.tile(enc, (len(seqs), 1)), jnp.asarray(dec_in)))
  dist = {}
  for s, lg in zip(seqs, logits):
    prob, out = 1.0, []
    for t in range(SEQ_LEN):
      prob *= reference_distribution(lg[t], config.temperature, config.topk,
                                     config.topp)[s[t]]
      out.append(int(s[t]))
      if s[t] == SMALL_EOS:
        break
    key = tuple(out + [0] * (SEQ_LEN - len(out)))
    # Continuations after EOS are enumerated V^k times; count once.
    if key not in dist:
      dist[key] = prob
  assert abs(sum(dist.values()) - 1.0) < 1e-6
  return dist


def total_variation(samples, dist):
  """Total variation between the samples' frequencies and `dist`."""
  counts = collections.Counter(map(tuple, np.asarray(samples).tolist()))
  return 0.5 * sum(abs(counts.get(k, 0) / len(samples) - p)
                   for k, p in dist.items())


def law_fit(samples, dist):
  """How `[n, SEQ_LEN]` samples fit the law `dist`: (the samples outside
  its support, the chi-square goodness-of-fit p-value pooling the cells
  that expect < 5, the cells that expect >= 5). A law with one cell (one
  sequence, or all pooled) has nothing to test but its support: p = 1."""
  keys = list(dist)
  index = {k: i for i, k in enumerate(keys)}
  counts, impossible = np.zeros(len(keys)), []
  for row in map(tuple, np.asarray(samples).tolist()):
    if row in index and dist[row] > 0:
      counts[index[row]] += 1
    else:
      impossible.append(row)
  expected = len(samples) * np.array([dist[k] for k in keys])
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] < 1e-9:
    obs, exp = obs[:-1], exp[:-1]
  p = stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue if (
      len(obs) > 1) else 1.0
  return impossible, float(p), int(big.sum())


def assert_matches(samples, dist):
  """Chi-square goodness of fit, p > 1e-4, pooling cells with < 5 expected.

  Also: no sample outside the support, and total variation < 0.02.
  """
  impossible, p, cells = law_fit(samples, dist)
  assert not impossible, f'impossible sequences {impossible[:5]}'
  assert cells >= 10
  assert total_variation(samples, dist) < 0.02
  assert p > 1e-4


def test_tiny_target_law_is_not_flat(tiny_target):
  """The law tests' 0.02 total-variation bound is above their sampling noise.

  For N exact draws from a law p, the expected total variation is about
  sum_i sqrt(2 p_i (1 - p_i) / (pi N)) / 2: over a near-uniform law on the
  V^3 sequences it reaches 0.02 by itself, and the law tests would fail by
  chance.
  """
  model, params, enc = tiny_target
  law = np.array(list(exact_sequence_distribution(
      model, params, enc, SAMPLING_CASES['t1']).values()))
  noise = np.sqrt(2 * law * (1 - law) / (np.pi * N_SAMPLES)).sum() / 2
  assert noise < MAX_NOISE_TV


def assert_sampled_law(tiny_target, config, drafter, dparams, key: str,
                       gamma: int, dist=None, **kwargs):
  """N_SAMPLES rows that `drafter` drafts for the target follow the target's
  exact law of SEQ_LEN tokens (`assert_matches`); `key` seeds the rng.
  Returns the decode (`kwargs`: more `speculative_sample` arguments)."""
  model, params, enc = tiny_target
  if dist is None:
    dist = exact_sequence_distribution(model, params, enc, config)
  out = sample_optimized(
      speculative.speculative_sample,
      model, params, drafter, dparams, jnp.tile(enc, (N_SAMPLES, 1)),
      gamma=gamma, max_decode_len=SEQ_LEN, sampling=config, eos_id=SMALL_EOS,
      rng=jax.random.key(zlib.crc32(key.encode())), **kwargs)
  assert_matches(np.asarray(out.tokens), dist)
  return out


def adversarial_unigram(support):
  """A unigram drafter with q = 0 outside `support` (and uniform on it)."""
  logq = np.full(VOCAB, -np.inf, np.float32)
  logq[list(support)] = 0.0
  return (drafters.NgramDrafter(VOCAB, order=1),
          {'log_unigram': jnp.asarray(logq)})


SAMPLING_CASES = {
    't1': SamplingConfig(temperature=1.0),
    't0.7': SamplingConfig(temperature=0.7),
    'topk3': SamplingConfig(temperature=1.0, topk=3),
    'topp0.8': SamplingConfig(temperature=0.9, topp=0.8),
}


# The adversarial unigrams are uniform on their support, so a temperature
# leaves their q as it is and reshapes p alone, as t = 1 does: they are not
# sampled at t = 0.7. The T5 drafter, whose q a temperature reshapes too,
# is sampled at t = 0.7 and at top-p (t = 0.9), not at t = 1 (the same
# division, by 1: the unigrams' t = 1 cases take this loop there) nor at
# top-k 3, which this loop's verifier meets with the unigrams here and
# tests/drafters/test_drafters.py samples with a T5 draft model inside the
# 'combined' kind (the same `sampling.draw` for its drafts).
LAW_CASES = [('t0.7', 't5'), ('topp0.8', 't5')] + [
    (case, kind) for kind in ('q_zero_where_p', 'q_off_p')
    for case in ('t1', 'topk3', 'topp0.8')]


@pytest.mark.parametrize('case,drafter_kind', LAW_CASES,
                         ids=[f'{k}-{c}' for c, k in LAW_CASES])
def test_sampled_sequences_follow_target_distribution(tiny_target, case,
                                                      drafter_kind):
  model, params, enc = tiny_target
  config = SAMPLING_CASES[case]
  dist = exact_sequence_distribution(model, params, enc, config)
  if drafter_kind == 't5':
    dr = drafters.T5Drafter(model)
    dparams = model.init_params(jax.random.key(77))  # a different model
  elif drafter_kind == 'q_zero_where_p':
    # q is 0 on tokens the target likes: those can only come from residuals.
    dr, dparams = adversarial_unigram([0, 1])
  else:
    # q puts its mass where p has little or none (least likely tokens).
    first = np.array([sum(v for k, v in dist.items() if k[0] == t)
                      for t in range(VOCAB)])
    dr, dparams = adversarial_unigram(np.argsort(first)[:2])
  assert_sampled_law(tiny_target, config, dr, dparams,
                     f'{case}/{drafter_kind}', 3, dist)


# ---------------------------------------------------------------------------
# Compilation, target calls, bad arguments.
# ---------------------------------------------------------------------------

TARGET_CALLS = []


@dataclasses.dataclass(frozen=True)
class CountingTarget:
  """Wraps a model; counts executed target calls on gamma+1 tokens."""

  model: network.T5Model

  @property
  def vocab_size(self):
    return self.model.vocab_size

  def check_params(self, params):
    self.model.check_params(params)

  def init_cache(self, *args):
    return self.model.init_cache(*args)

  def logits(self, *args):
    return self.model.logits(*args)

  def extend(self, params, tokens, cache):
    jax.debug.callback(lambda: TARGET_CALLS.append(tokens.shape[1]),
                       ordered=False)
    return self.model.extend(params, tokens, cache)


def test_target_calls_equal_iterations_and_no_recompile(greedy_setup):
  model, params, enc, base, drafts = greedy_setup
  dr, dparams = drafts['good']
  target = CountingTarget(model)
  TARGET_CALLS.clear()
  out = speculative.speculative_sample(
      target, params, dr, dparams, enc, gamma=3, max_decode_len=MAX_LEN,
      eos_id=EOS)
  jax.effects_barrier()
  assert TARGET_CALLS == [4] * int(out.stats.iterations)
  assert int(out.stats.iterations) < MAX_LEN  # speculation saved calls
  size = scaffold.cache_size()
  other = perturbed(dparams, 0.1, 5)
  speculative.speculative_sample(
      target, params, dr, other, enc[::-1], gamma=3, max_decode_len=MAX_LEN,
      eos_id=EOS)
  assert scaffold.cache_size() == size


class Untouchable:
  vocab_size = 128

  def check_params(self, params):
    del params  # a stub's params are whatever its test gives

  def init_cache(self, *args):
    raise AssertionError('validation must happen before tracing')

  # a target and a drafter (`interfaces`), each member failing if traced
  init = extend = propose = prefill = score = logits = init_cache


@pytest.mark.parametrize('kwargs,message', [
    (dict(gamma=0), 'gamma'),
    (dict(gamma=2.0), 'gamma'),
    (dict(drafter_vocab=100), 'vocabularies differ'),
    (dict(sampling=dict(temperature=-1.0)), 'temperature'),
    (dict(sampling=dict(temperature=1.0, topp=0.0)), 'topp'),
    (dict(sampling=dict(temperature=1.0, topk=5, topp=0.5)), 'At most one'),
    (dict(max_decode_len=0), 'max_decode_len'),
])
def test_bad_arguments_raise_before_compiling(kwargs, message):
  drafter = Untouchable()
  if 'drafter_vocab' in kwargs:
    drafter = drafters.NgramDrafter(kwargs.pop('drafter_vocab'), order=1)
  sampling = kwargs.pop('sampling', {})
  kwargs.setdefault('gamma', 3)
  kwargs.setdefault('max_decode_len', 8)
  with pytest.raises(ValueError, match=message):
    speculative.speculative_sample(
        Untouchable(), {}, drafter, {}, np.ones((2, 3), np.int32),
        sampling=SamplingConfig(**sampling), rng=jax.random.key(0), **kwargs)


def test_rates_are_ratios_of_summed_counters():
  """`summarize` is `rates` of the counters summed over rows.

  The eval job sums per-example counters and calls `rates` itself, so both
  must be ratios of sums (not means of per-row ratios), 0-safe.
  """
  stats = spec_stats.SpecStats(
      iterations=jnp.int32(5), row_iterations=jnp.array([5, 3]),
      drafted=jnp.array([15, 9]), accepted=jnp.array([10, 2]),
      accepted_at=jnp.array([6, 4, 2]), beta_sum=jnp.array([3.5, 1.0]),
      beta_count=jnp.array([7, 5]))
  summary = spec_stats.summarize(stats)
  assert summary['acceptance_rate'] == 12 / 24
  assert summary['mean_accepted_length'] == 1 + 12 / 8
  assert summary['alpha'] == 4.5 / 12
  assert summary['per_position_acceptance'] == [6 / 8, 4 / 8, 2 / 8]
  rates = spec_stats.rates(8, 24, 12, 4.5, 12, tokens=16)
  assert {k: summary[k] for k in rates if k in summary} == {
      k: v for k, v in rates.items() if k != 'target_calls_per_token'}
  assert rates['target_calls_per_token'] == 8 / 16
  assert spec_stats.rates(0, 0, 0, 0.0, 0, tokens=0) == {
      'acceptance_rate': 0.0, 'mean_accepted_length': 1.0, 'alpha': 0.0,
      'target_calls_per_token': 0.0}
