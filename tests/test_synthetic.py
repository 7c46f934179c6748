"""Synthetic checkpoints: random weights and noisy copies of them, by name.

The 'synthetic' model set runs every spec with no trained weights: its
target is 'synthetic:seed=S' and its drafters 'synthetic:seed=S,noise=
SIGMA', with alpha set by SIGMA. That rests on what is checked here: the
seed names the model's own random init (what random weights are
everywhere else), a noisy copy adds exactly the stated noise to every leaf,
the same name always loads the same weights (the `LoadCache` keys models by
the name), a larger sigma agrees less with the target, and a malformed name
fails with an error that says what is wrong, before anything loads.
"""

import jax
import numpy as np
import pytest

from specdec_jax import loading
from specdec_jax import models
from specdec_jax import network
from specdec_jax import synthetic

TINY = models.config('t5_1_1_tiny', vocab_size=64, dtype='float32')


def leaves(params):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]


@pytest.fixture(scope='module')
def init():
  return leaves(network.T5Model(TINY).init_params(jax.random.key(3)))


def test_a_seed_names_the_models_own_random_init(init):
  got = leaves(synthetic.params(TINY, 'synthetic:seed=3'))
  assert len(got) == len(init)
  for x, y in zip(got, init):
    np.testing.assert_array_equal(x, y)
  other = leaves(synthetic.params(TINY, 'synthetic:seed=4'))
  assert not all(np.array_equal(x, y) for x, y in zip(other, init))


def test_a_noisy_copy_adds_sigma_times_each_leafs_std(init):
  """Every leaf moves by N(0, (sigma std(leaf))^2) noise: its sample std
  and mean within 5 standard errors; a constant leaf (the layer norms'
  scales at init) stays as it is."""
  sigma = 0.3
  noisy = leaves(synthetic.params(TINY, f'synthetic:seed=3,noise={sigma}'))
  moved = 0
  for x, y in zip(noisy, init):
    assert x.shape == y.shape and x.dtype == y.dtype
    scale = sigma * y.std()
    if scale == 0:
      np.testing.assert_array_equal(x, y)
      continue
    noise, n = (x - y).astype(np.float64), y.size
    assert abs(noise.std() / scale - 1) < 5 / np.sqrt(2 * n), (n, noise.std())
    assert abs(noise.mean()) < 5 * scale / np.sqrt(n)
    moved += 1
  assert moved >= len(init) // 2
  # Traced (in a jit; `jax.eval_shape`, as a build ahead of time traces
  # the models for their shapes): the same noise, in jnp's arithmetic.
  params = network.T5Model(TINY).init_params(jax.random.key(3))
  noisy_at = lambda p: synthetic.perturbed(p, sigma, jax.random.key(7))
  eager, traced = leaves(noisy_at(params)), leaves(jax.jit(noisy_at)(params))
  for x, y in zip(traced, eager):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  assert jax.eval_shape(noisy_at, params) == jax.eval_shape(lambda p: p,
                                                            params)


def test_a_noisy_copy_is_the_same_for_the_same_name_only():
  def noise(name):
    return np.concatenate([
        (x - y).ravel() for x, y in zip(
            leaves(synthetic.params(TINY, name)),
            leaves(synthetic.params(TINY, 'synthetic:seed=3')))])
  first = noise('synthetic:seed=3,noise=0.1')
  np.testing.assert_array_equal(first, noise('synthetic:seed=3,noise=0.1'))
  # The same sigma written otherwise is the same weights.
  np.testing.assert_array_equal(first, noise('synthetic: noise=1e-1, seed=3'))
  # Another sigma draws noise of its own, not a rescaled copy.
  other = noise('synthetic:seed=3,noise=0.2')
  assert abs(np.corrcoef(first, other)[0, 1]) < 0.1
  spec = synthetic.parse('synthetic: noise=1e-1, seed=3')
  assert spec == synthetic.Spec(3, 0.1)
  assert spec.checkpoint == 'synthetic:seed=3,noise=0.1'
  assert synthetic.Spec(3).checkpoint == 'synthetic:seed=3'
  assert synthetic.parse(spec.checkpoint) == spec


def test_a_larger_sigma_agrees_less_with_the_target():
  """What the model set's sigmas rest on: the drafter's argmax matches the
  target's less often as the noise grows (teacher-forced, random tokens)."""
  model = network.T5Model(TINY)
  logits = jax.jit(model.logits)
  rng = np.random.default_rng(0)
  enc, dec = (rng.integers(2, 64, (16, 8)) for _ in range(2))
  target = np.argmax(logits(synthetic.params(TINY, 'synthetic:seed=3'), enc,
                            dec), -1)
  agreement = [
      np.mean(target == np.argmax(logits(synthetic.params(
          TINY, f'synthetic:seed=3,noise={sigma}'), enc, dec), -1))
      for sigma in (0.0, 0.05, 0.2, 0.8)]
  assert agreement[0] == 1
  assert agreement == sorted(agreement, reverse=True), agreement
  assert agreement[-1] < 0.5, agreement


@pytest.mark.parametrize('checkpoint,error', [
    ('shipped:target', 'Not a synthetic checkpoint'),
    ('synthetic:', "entry '' is not KEY=VALUE"),
    ('synthetic:seed', "entry 'seed' is not KEY=VALUE"),
    ('synthetic:seed=1,,noise=0.1', "entry '' is not KEY=VALUE"),
    ('synthetic:noise=0.1', 'has no seed'),
    ('synthetic:seed=1,sigma=0.1', "unknown key 'sigma'"),
    ('synthetic:seed=1,seed=2', "'seed' given twice"),
    ('synthetic:seed=-1', 'the seed must be an integer in'),
    ('synthetic:seed=1.5', 'the seed must be an integer in'),
    (f'synthetic:seed={2**32}', 'the seed must be an integer in'),
    ('synthetic:seed=1,noise=-0.1', 'the noise must be a finite number >= 0'),
    ('synthetic:seed=1,noise=nan', 'the noise must be a finite number >= 0'),
    ('synthetic:seed=1,noise=big', 'the noise must be a finite number >= 0'),
])
def test_a_malformed_name_is_refused_clearly(checkpoint, error):
  with pytest.raises(ValueError, match=error):
    synthetic.parse(checkpoint)


def test_load_model_reads_the_scheme(init):
  """`loading.load_model` (so the target, a drafter and a cached load)
  reads the scheme as it reads 'shipped:': the named weights, loaded once
  per name; a malformed name is a ValueError, not a missing file."""
  name = 'synthetic:seed=3,noise=0.1'
  model, params = loading.load_model(TINY, name)
  assert model.config == TINY
  for x, y in zip(leaves(params), leaves(synthetic.params(TINY, name))):
    np.testing.assert_array_equal(x, y)
  cache = loading.LoadCache()
  first = loading.load_model(TINY, 'synthetic:seed=3', cache=cache)[1]
  for x, y in zip(leaves(first), init):
    np.testing.assert_array_equal(x, y)
  loading.load_model(TINY, 'synthetic:seed=3', cache=cache)
  loading.load_model(TINY, name, cache=cache)
  assert cache.loads['model'] == 2
  with pytest.raises(ValueError, match="unknown key 'sed'"):
    loading.load_model(TINY, 'synthetic:sed=3')
