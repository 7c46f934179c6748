"""Widening a trained T5 keeps its function while growing its cost.

Cost-realistic speculative decoding experiments use a small trained target
widened to T5 1.1 base/large/XXL shapes. If widening changed the function even
slightly, acceptance rates (and "exact" outputs) measured on the widened
target would no longer be those of the trained one; if it did not produce
exactly the big model's shapes, the cost would not be the big model's.

The widened model computes the old logits up to float rounding only (the
residual stream is rescaled so RMS-norm epsilon cancels exactly; see
specdec_jax/widening.py), so the tolerance is float32 rounding: observed
max |diff| ~2e-6 on logits of magnitude ~5.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import network
from specdec_jax import widening
from conftest import numpy_params
from conftest import TINY_V11
from test_network import T5_1_1
from test_network import flat
from test_network import t5x_expected_tree

ATOL = 2e-5
# Every growable dimension grows, both layer counts by different amounts.
BIG = dict(emb_dim=48, num_heads=6, head_dim=12, mlp_dim=96,
           num_encoder_layers=3, num_decoder_layers=4)
# One dimension at a time, from a one-layer model (half the compile time);
# heads and head_dim grow alone to catch a joined-heads layout error that
# the combined case could mask.
MINI = TINY_V11.replace(emb_dim=16, num_heads=2, head_dim=4, mlp_dim=32,
                        num_encoder_layers=1, num_decoder_layers=1)
ALONE = dict(emb_dim=24, num_heads=3, head_dim=6, mlp_dim=48,
             num_encoder_layers=2, num_decoder_layers=3)


# The original and the widened model are compiled alike (at the suite's
# XLA level 0, tests/conftest.py: compiling dominates these tests).
_jit = functools.partial(jax.jit, static_argnums=0)


@_jit
def _forward(model, params, enc, dec):
  """Teacher-forced logits `[b, t, vocab]` and encoder output `[b, s, emb]`."""
  encoded = model.module.apply({'params': params}, enc,
                               method=network.Transformer.encode)
  return model.logits(params, enc, dec), encoded


def _logits(model, params, enc, dec):
  return np.asarray(_forward(model, params, enc, dec)[0])


@_jit
def _cached_logits(model, params, enc, dec):
  """Logits from init_cache + extend in chunks of 3 tokens (as gamma = 2)."""
  cache = model.init_cache(params, enc, dec.shape[1])
  chunks = []
  for start in range(0, dec.shape[1], 3):
    logits, cache = model.extend(params, dec[:, start:start + 3], cache)
    chunks.append(logits)
  return jnp.concatenate(chunks, axis=1), cache


def _data(vocab, batch=3, seed=0):
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, vocab, (batch, 10))
  enc[1, 6:] = 0  # padded rows
  enc[2, 3:] = 0
  dec = rng.integers(2, vocab, (batch, 12))
  dec[:, 0] = 0  # BOS
  return jnp.asarray(enc), jnp.asarray(dec)


def _shapes(tree):
  return jax.tree.map(lambda x: tuple(x.shape), tree)


@pytest.mark.parametrize('which,noise', [
    ('np_v11', 0.0), ('np_v11', 0.5), ('np_v10', 0.0)])
def test_teacher_forced_logits_equal(which, noise, request):
  """The core promise, for T5 1.1 (gated gelu, separate logits) and T5 1.0
  (relu, tied logits, which need the sqrt(emb_dim) divisor to cancel); noise
  in dead weights must not leak into the output. Also the construction's
  invariant: the encoder output is the old one in the old dims and exactly 0
  in the new ones (appended layers add exact zeros)."""
  model, params = request.getfixturevalue(which)
  enc, dec = _data(model.vocab_size)
  new_params, new_config = widening.widen_to(
      params, model.config, BIG, noise=noise, rng=jax.random.key(7))
  ref, ref_encoded = _forward(model, params, enc, dec)
  got, encoded = _forward(network.T5Model(new_config), new_params, enc, dec)
  assert got.shape == ref.shape
  np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
  old_emb = model.config.emb_dim
  np.testing.assert_array_equal(encoded[..., old_emb:], 0)
  np.testing.assert_allclose(encoded[..., :old_emb], ref_encoded, atol=ATOL,
                             rtol=0)


def test_norm_epsilon_cancels_for_small_activations(np_v11):
  """With activations near RMS-norm epsilon (mean square ~1e-6), merely
  rescaling the norm scales by sqrt(E / E') would be off by O(1) (it turns
  eps into (E'/E) eps; 0.8 max logit error measured); the rescaled residual
  stream keeps mean(x^2) and so eps exactly."""
  model, params = np_v11
  params = dict(params, token_embedder={
      'embedding': params['token_embedder']['embedding'] * 1e-3})
  enc, dec = _data(model.vocab_size, seed=1)
  new_params, new_config = widening.widen_to(params, model.config, BIG)
  ref = _logits(model, params, enc, dec)
  got = _logits(network.T5Model(new_config), new_params, enc, dec)
  np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_greedy_decode_tokens_equal(np_v11):
  """Decoding goes through init_cache/extend, not the teacher-forced path;
  greedy tokens must be identical, row for row (T5 1.1 here, T5 1.0 in the
  cached-extend test)."""
  model, params = np_v11
  enc, _ = _data(model.vocab_size, seed=2)
  new_params, new_config = widening.widen_to(params, model.config, BIG,
                                             noise=0.1)
  ref = decoding.temperature_sample(model, params, enc, max_decode_len=16)
  got = decoding.temperature_sample(network.T5Model(new_config), new_params,
                                    enc, max_decode_len=16)
  assert len(np.unique(np.asarray(ref.tokens))) > 2  # a non-trivial output
  np.testing.assert_array_equal(got.tokens, ref.tokens)
  np.testing.assert_array_equal(got.lengths, ref.lengths)


def test_cached_multi_token_extend_equal(np_v10):
  """Speculative decoding scores gamma+1 tokens per cached call; the widened
  cache (zero key dims, extra layers' caches) must give the old logits (T5
  1.0 here: tied logits through the cached path)."""
  model, params = np_v10
  enc, dec = _data(model.vocab_size, seed=3)
  new_params, new_config = widening.widen_to(params, model.config, BIG)
  ref = _logits(model, params, enc, dec)
  got, cache = _cached_logits(network.T5Model(new_config), new_params, enc,
                              dec)
  assert cache.self_key[0].shape[2:] == (6, 12)
  np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize('which', ['np_v11', 'np_v10'])
def test_tree_has_the_big_models_shapes(which, request):
  """The widened tree must be exactly what the big model's init produces
  (names, nesting, shapes, dtypes), or it costs something else or fails to
  load."""
  model, params = request.getfixturevalue(which)
  new_params, new_config = widening.widen_to(params, model.config, BIG)
  want = jax.eval_shape(network.T5Model(new_config).init_params,
                        jax.random.key(0))
  assert _shapes(new_params) == _shapes(want)
  assert jax.tree.map(lambda x: x.dtype, new_params) == jax.tree.map(
      lambda x: x.dtype, want)


@pytest.fixture(scope='module')
def mini():
  return network.T5Model(MINI), numpy_params(MINI, 2, 1.0)


@pytest.mark.parametrize('field', widening.GROWABLE)
def test_each_dimension_grows_alone(field, mini):
  """Each growth rule on its own (the combined test could hide a rule that
  only works when another dimension also grows)."""
  model, params = mini
  enc, dec = _data(model.vocab_size, seed=4)
  new_params, new_config = widening.widen_to(
      params, model.config, {field: ALONE[field]})
  want = jax.eval_shape(network.T5Model(new_config).init_params,
                        jax.random.key(0))
  assert _shapes(new_params) == _shapes(want)
  ref = _logits(model, params, enc, dec)
  got = _logits(network.T5Model(new_config), new_params, enc, dec)
  np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_noise_fills_dead_weights_only(np_v11):
  """noise > 0 must make the new weights non-zero (not an all-zero model)
  while pinned zeros stay zero (the logits tests check the output)."""
  model, params = np_v11
  zero, _ = widening.widen_to(params, model.config, BIG)
  noisy, _ = widening.widen_to(params, model.config, BIG, noise=0.1)
  count = lambda t, f: sum(int(np.sum(f(np.asarray(x))))
                           for x in jax.tree.leaves(t))
  total = widening.param_count(zero)
  assert count(zero, lambda x: x == 0) > total // 2
  assert count(noisy, lambda x: x == 0) < total // 3
  # Pinned: the embedding's new dims, key columns of old heads' new head_dim
  # dims, and new layers' out/wo.
  np.testing.assert_array_equal(noisy['token_embedder']['embedding'][:, 32:],
                                0)
  key = noisy['encoder']['layers_0']['attention']['key']['kernel']
  np.testing.assert_array_equal(key.reshape(48, 6, 12)[:, :4, 8:], 0)
  layer = noisy['decoder']['layers_3']
  np.testing.assert_array_equal(layer['self_attention']['out']['kernel'], 0)
  np.testing.assert_array_equal(layer['mlp']['wo']['kernel'], 0)
  assert np.all(layer['mlp']['wi_0']['kernel'] != 0)


@pytest.mark.parametrize('field', widening.GROWABLE)
def test_shrinking_raises(field):
  """A smaller dimension cannot preserve the function; the error names it."""
  small = TINY_V11.replace(**{field: getattr(TINY_V11, field) - 1})
  with pytest.raises(ValueError, match=field):
    widening.check_growth(TINY_V11, small)


@pytest.mark.parametrize('change', [
    dict(vocab_size=256),
    dict(mlp_activations=('relu',)),
    dict(logits_via_embedding=True),
])
def test_fixed_fields_must_match(change, np_v11):
  """Vocabulary, activations and logits tying change the function."""
  model, params = np_v11
  (field,) = change
  with pytest.raises(ValueError, match=field):
    widening.widen(params, model.config, model.config.replace(**change))


def test_sizes_and_noise_no_model_can_have_are_named(np_v11):
  """A size that is no int (before: a config of emb_dim 64.5, or deep
  inside jnp.pad), a size that is no mapping, and an infinite noise (before:
  a widened model of NaNs, silently) are refused by name."""
  model, params = np_v11
  for size, said in (({'emb_dim': 64.5}, 'emb_dim must be an int >= 1, got '
                      '64.5'), ({'num_heads': True}, 'num_heads must be an '
                                'int >= 1, got True'),
                     (64, r"size must be a PRESETS name, .*, got 64\.")):
    with pytest.raises(checks.InputError, match=said):
      widening.widened_config(model.config, size)
  with pytest.raises(checks.InputError, match=(
      'noise must be a finite number >= 0, got inf')):
    widening.widen_to(params, model.config, {'emb_dim': 64},
                      noise=float('inf'))


def test_params_not_matching_config_raise(np_v11):
  """Widening parameters under the wrong config would silently produce a
  broken model; it must fail loudly instead."""
  model, params = np_v11
  wrong = model.config.replace(emb_dim=24)
  with pytest.raises(ValueError, match='embedding'):
    widening.widen(params, wrong, wrong.replace(emb_dim=48))
  wrong = model.config.replace(num_encoder_layers=1)
  with pytest.raises(ValueError, match='layers'):
    widening.widen(params, wrong, model.config)


def test_presets_have_t5_1_1_shapes_and_cost(np_v11):
  """The presets reach T5 1.1 base/large/XXL shapes -- compared with the T5X
  tree written independently in test_network, at no cost via eval_shape --
  and the parameter count, a proxy for cost, grows with size."""
  model, params = np_v11
  counts = [widening.param_count(params)]
  for size in ('base', 'large', 'xxl'):
    assert widening.PRESETS[f't5_1_1_{size}_cost'] == T5_1_1[size]
    config = widening.preset_config(model.config, f't5_1_1_{size}_cost')
    got = jax.eval_shape(
        lambda p, c=config: widening.widen(p, model.config, c), params)
    want = t5x_expected_tree(128, mlp_names=('wi_0', 'wi_1'),
                             separate_logits=True, **T5_1_1[size])
    assert {k: v.shape for k, v in flat(got).items()} == {
        k: shape for k, (shape, _) in want.items()}
    counts.append(widening.param_count(got))
  assert counts == sorted(counts) and len(set(counts)) == 4
  # T5 1.1 XXL has 11.1e9 parameters with its 32128-token vocabulary.
  vocab_params = 2 * (32128 - 128) * 4096
  assert math.isclose(counts[-1] + vocab_params, 11.1e9, rel_tol=0.01)
