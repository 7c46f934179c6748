"""bfloat16 numerics made explicit: activation dtype, near ties, bugs.

On a GPU, bfloat16 greedy speculative outputs differ from the baseline's at
numerical near ties (../shared/GPU.md). These tests pin down, on CPU:
- `T5Config.activation_dtype`: bfloat16 weights with float32 activations
  compute exactly a float32 network on the rounded weights, and the default
  is T5X's (activations in `dtype`);
- a bfloat16 model built to have near ties (every token has a twin whose
  logits-kernel column differs by a relative 2^-22) makes the 1-token
  baseline and the (gamma + 1)-token verification choose differently; each
  such row is diagnosed a `near_tie`, and the same-shape baseline
  (`block_size = gamma + 1`) gives the speculative tokens bit for bit;
- a planted bug (a verifier accepting every draft) is diagnosed a
  `mismatch`, and the eval job fails on it but not on near ties.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import diagnostics
from specdec_jax import drafters
from specdec_jax import eval as eval_lib
from specdec_jax import loading
from specdec_jax import network
from specdec_jax import speculative

from conftest import TINY_V11
from test_eval import args as eval_args

GAMMA = 3
LENGTH = 24


def rounded(params, keep=('logits_dense',)):
  """Every weight rounded to bfloat16 (as float32) but the `keep` ones."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  out = {}
  for path, x in flat:
    keys = [p.key for p in path]
    node = out
    for k in keys[:-1]:
      node = node.setdefault(k, {})
    node[keys[-1]] = x if any(k in keep for k in keys) else (
        x.astype(jnp.bfloat16).astype(jnp.float32))
  return out


@pytest.fixture(scope='module')
def v11_inputs():
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.integers(2, 128, (3, 10)), jnp.int32),
          jnp.asarray(rng.integers(2, 128, (3, 7)), jnp.int32))


def logits(model, params, enc, dec):
  return np.asarray(jax.jit(model.logits)(params, enc, dec))


def test_float32_activations_on_bfloat16_weights(v11, v11_inputs):
  """bf16 weights + f32 activations == a float32 net on rounded weights."""
  model, params = v11
  enc, dec = v11_inputs
  mixed = network.T5Model(TINY_V11.replace(dtype='bfloat16',
                                           activation_dtype='float32'))
  reference = network.T5Model(TINY_V11)  # float32 everything
  got = logits(mixed, params, enc, dec)
  want = logits(reference, rounded(params), enc, dec)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # Not float32 weights: the rounding shows.
  assert np.abs(got - logits(model, params, enc, dec)).max() > 1e-4
  # bfloat16 activations are further from it than float32 ones.
  bf16 = network.T5Model(TINY_V11.replace(dtype='bfloat16'))
  err = lambda x: np.abs(x - want).max()
  assert err(logits(bf16, params, enc, dec)) > 30 * max(err(got), 1e-7)
  # Same parameter tree (T5X's), a float32 cache.
  # (Shapes and dtypes, traced, not run: op by op these are dozens of
  # small compiles.)
  assert jax.tree_util.tree_structure(jax.eval_shape(
      mixed.init_params, jax.random.key(0))) == jax.tree_util.tree_structure(
          params)
  cache = jax.eval_shape(lambda: mixed.init_cache(params, enc, 8))
  assert cache.self_key[0].dtype == jnp.float32
  assert cache.cross_key[0].dtype == jnp.float32


def test_default_activations_are_the_weights_dtype(v11, v11_inputs):
  """activation_dtype None is T5X's behaviour: everything in dtype."""
  _, params = v11
  enc, dec = v11_inputs
  default = network.T5Model(TINY_V11.replace(dtype='bfloat16'))
  explicit = network.T5Model(TINY_V11.replace(dtype='bfloat16',
                                              activation_dtype='bfloat16'))
  np.testing.assert_array_equal(logits(default, params, enc, dec),
                                logits(explicit, params, enc, dec))
  assert default.config.compute_dtype == 'bfloat16'
  assert jax.eval_shape(lambda: default.init_cache(params, enc, 8)).self_key[
      0].dtype == jnp.bfloat16


def test_both_decoders_use_the_activation_dtype(v11, v11_inputs):
  """Greedy speculative == baseline with bf16 weights, f32 activations."""
  _, params = v11
  enc, _ = v11_inputs
  mixed = network.T5Model(TINY_V11.replace(dtype='bfloat16',
                                           activation_dtype='float32'))
  base = decoding.temperature_sample(mixed, params, enc, max_decode_len=12,
                                     eos_id=-1)
  spec = speculative.speculative_sample(
      mixed, params, drafters.T5Drafter(mixed), params, enc, gamma=2,
      max_decode_len=12, eos_id=-1)
  np.testing.assert_array_equal(spec.tokens, base.tokens)


# -- Near ties ----------------------------------------------------------------

TWIN_CONFIG = network.T5Config(
    vocab_size=512, emb_dim=128, num_heads=4, head_dim=32, mlp_dim=256,
    num_encoder_layers=1, num_decoder_layers=1,
    mlp_activations=('gelu', 'linear'), dtype='bfloat16')


@pytest.fixture(scope='module')
def twins():
  """A bfloat16 T5 whose every odd token nearly ties with the even before.

  Column 2j+1 of the (float32) logits kernel is column 2j times 1 + 2^-22,
  so the two logits differ by ~1e-7 |z|: any difference in rounding between
  two ways of computing the same position can flip the argmax.
  """
  model = network.T5Model(TWIN_CONFIG)
  params = model.init_params(jax.random.key(1))
  kernel = np.array(params['decoder']['logits_dense']['kernel'])
  kernel[:, 1::2] = kernel[:, 0::2] * np.float32(1 + 2 ** -22)
  params['decoder']['logits_dense']['kernel'] = jnp.asarray(kernel)
  rng = np.random.default_rng(0)
  rows = [rng.integers(2, 512, (1, 8)) for _ in range(4)]
  outputs = []
  for enc in rows:  # batch 1: the 1-token call is a matrix-vector product
    base = decoding.temperature_sample(model, params, enc,
                                       max_decode_len=LENGTH, eos_id=-1)
    spec = speculative.speculative_sample(
        model, params, drafters.T5Drafter(model), params, enc, gamma=GAMMA,
        max_decode_len=LENGTH, eos_id=-1)
    block = decoding.temperature_sample(
        model, params, enc, max_decode_len=LENGTH, eos_id=-1,
        block_size=GAMMA + 1)
    outputs.append((enc, base.tokens, spec.tokens, block.tokens))
  return model, params, outputs


def test_near_ties_are_classified_near_tie(twins):
  model, params, outputs = twins
  found = []
  for enc, base, spec, _ in outputs:
    found += diagnostics.diagnose(model, params, enc, base, spec)
  # The construction must actually produce divergences to test anything.
  assert len(found) >= 2
  for d in found:
    assert d.kind == diagnostics.NEAR_TIE, d
    assert d.culprit == ''
    assert d.top2_gap < 1e-5
    assert {d.baseline_token, d.speculative_token} <= set(d.top_tokens)
    assert max(d.baseline_deficit, d.speculative_deficit) < 1e-5
    assert 0 < d.baseline_bound < 1  # bf16: ~u sqrt(n_r) (S_a + S_b)


def test_same_shape_baseline_is_bitwise_equal(twins):
  """block_size = gamma + 1: the speculative tokens, bit for bit."""
  _, _, outputs = twins
  differ_1token = 0
  for _, base, spec, block in outputs:
    np.testing.assert_array_equal(block, spec)
    differ_1token += int(not np.array_equal(base, spec))
  assert differ_1token >= 2  # while the 1-token baseline does differ


def test_same_shape_baseline_is_the_baseline_in_float32(v11):
  """block_size only changes shapes: float32 greedy tokens are unchanged."""
  model, params = v11
  enc = np.random.default_rng(4).integers(2, 128, (3, 9))
  plain = decoding.temperature_sample(model, params, enc, max_decode_len=15,
                                      eos_id=67)
  block = decoding.temperature_sample(model, params, enc, max_decode_len=15,
                                      eos_id=67, block_size=4)
  np.testing.assert_array_equal(block.tokens, plain.tokens)
  np.testing.assert_array_equal(block.lengths, plain.lengths)
  assert len(set(np.asarray(plain.lengths).tolist())) > 1  # EOS at work
  with pytest.raises(ValueError, match='block_size'):
    decoding.temperature_sample(model, params, enc, max_decode_len=15,
                                block_size=0)


def plant(monkeypatch, change):
  """Wraps speculative.verify with `change(outputs, drafts)`.

  Compiled loops keep the verifier they were traced with and stay cached
  after the test: only decode with an output length no other test uses.
  """
  real = speculative.verify

  def verify(rng, drafts, q, p, sampling):
    return change(real(rng, drafts, q, p, sampling), drafts)

  monkeypatch.setattr(speculative, 'verify', verify)


def accept_everything(outputs, drafts):
  """A planted bug: the verifier accepts every draft, right or wrong."""
  n, accepted, next_token, beta = outputs
  return (jnp.full_like(n, drafts.shape[1]), jnp.ones_like(accepted),
          next_token, beta)


def other_twin(outputs, drafts):
  """Not a bug with exact twins: the other of two equal argmaxes."""
  n, accepted, next_token, beta = outputs
  return n, accepted, next_token ^ 1, beta


def test_planted_bug_is_classified_mismatch(twins, monkeypatch):
  model, params, outputs = twins
  plant(monkeypatch, accept_everything)
  small = network.T5Model(TWIN_CONFIG.replace(emb_dim=64, mlp_dim=128))
  found = []
  for enc, base, _, _ in outputs[:3]:
    # LENGTH - 1: a fresh compile (see plant); greedy prefixes agree.
    spec = speculative.speculative_sample(
        model, params, drafters.T5Drafter(small),
        small.init_params(jax.random.key(5)), enc, gamma=GAMMA,
        max_decode_len=LENGTH - 1, eos_id=-1)
    found += diagnostics.diagnose(model, params, enc,
                                  np.asarray(base)[:, :LENGTH - 1],
                                  spec.tokens)
  assert len(found) == 3
  for d in found:
    assert d.kind == diagnostics.MISMATCH and d.culprit == 'speculative', d
    assert d.speculative_deficit > d.speculative_bound
    assert d.baseline_deficit <= d.baseline_bound  # the baseline is right
  assert diagnostics.counts(found) == {'differing': 3, 'near_ties': 0,
                                       'mismatches': 3}


def test_classify_names_the_decoder_off_the_top():
  z = np.array([5.0, 4.99, 1.0, 4.0])
  s = np.full(4, 10.0)
  rel = 1e-3  # bound = 1e-3 * (10 + 10) = 0.02 per token
  tie = diagnostics.classify(z, s, 1, 0, rel)
  assert tie['kind'] == 'near_tie' and tie['top2_gap'] == pytest.approx(0.01)
  spec_bug = diagnostics.classify(z, s, 0, 3, rel)
  assert spec_bug['kind'] == 'mismatch' and spec_bug['culprit'] == (
      'speculative')
  base_bug = diagnostics.classify(z, s, 2, 1, rel)
  assert base_bug['culprit'] == 'baseline'
  assert diagnostics.classify(z, s, 2, 3, rel)['culprit'] == 'both'
  # A larger rounding error (e.g. deeper model) widens the bound.
  assert diagnostics.classify(z, s, 0, 3, 0.06)['kind'] == 'near_tie'


def test_unit_roundoff_and_bound_inputs():
  assert diagnostics.unit_roundoff('bfloat16', 'gpu') == 2 ** -8
  assert diagnostics.unit_roundoff('float32', 'cpu') == 2 ** -24
  # float32 matmuls run as TF32 on a GPU and bfloat16 passes on a TPU.
  assert diagnostics.unit_roundoff('float32', 'gpu', 'default') == 2 ** -11
  assert diagnostics.unit_roundoff('float32', 'tpu', None) in (2 ** -8,
                                                               2 ** -24)
  assert diagnostics.unit_roundoff('float32', 'tpu', 'default') == 2 ** -8
  assert diagnostics.unit_roundoff('float32', 'gpu', 'highest') == 2 ** -24
  assert diagnostics.unit_roundoff('float32', 'gpu', 'bfloat16') == 2 ** -11
  assert diagnostics.unit_roundoff('float32', 'tpu', 'BF16_BF16_F32_X3') == (
      2 ** -16)
  assert diagnostics.unit_roundoff('bfloat16', 'tpu', 'highest') == 2 ** -8
  assert diagnostics.unit_roundoff('float32', 'cpu', 'bfloat16') == 2 ** -24
  # A misspelling was the default's 2^-11: a bound 8,192x too loose.
  with pytest.raises(checks.InputError, match="matmul_precision must be one "
                     r".*\(any_f8.*; any case\), got 'higest'"):
    diagnostics.unit_roundoff('float32', 'gpu', 'higest')
  with pytest.raises(checks.InputError, match="must be one of jax's .*got 3"):
    diagnostics.unit_roundoff('float32', 'gpu', 3)
  with pytest.raises(ValueError, match='dtype'):
    diagnostics.unit_roundoff('int32', 'cpu')
  with pytest.raises(ValueError, match='backend'):
    diagnostics.unit_roundoff('float32', 'fpga')
  with pytest.raises(checks.InputError, match="backend must be 'cpu'"):
    diagnostics.unit_roundoff('float32', 3)  # before: an AttributeError
  cfg = TWIN_CONFIG
  assert diagnostics.stream_roundings(cfg) == 6 * 1 + 4 * 1 + 1
  bf16 = diagnostics.relative_error(cfg, 'cpu')
  f32 = diagnostics.relative_error(cfg.replace(activation_dtype='float32'),
                                   'cpu')
  assert bf16 == pytest.approx(np.sqrt(11) * (2 ** -8 + 2 ** -24))
  assert f32 < bf16 / 1e4
  with pytest.raises(ValueError, match='baseline_tokens'):
    diagnostics.first_differences(np.zeros((2, 3)), np.zeros((2, 4)))
  assert diagnostics.first_differences(
      [[1, 2, 3], [1, 2, 3]], [[1, 2, 3], [1, 5, 3]]).tolist() == [-1, 1]
  # Ids no decode gives, or rows of other examples, are named before any
  # model call (before: -1 read the last logit, an id past the vocabulary
  # an IndexError, and a wrong encoder id went unseen).
  model, v = network.T5Model(cfg), cfg.vocab_size
  for enc, base, spec, said in (
      ([[3, 1]], [[5, 1]], [[-1, 1]], 'speculative_tokens must be token ids'),
      ([[3, 1]], [[v, 1]], [[5, 1]], 'baseline_tokens must be token ids'),
      ([[v + 5, 1]], [[5, 1]], [[6, 1]], 'encoder_input_tokens must be'),
      ([[3, 1]] * 2, [[5, 1]], [[6, 1]],
       'baseline_tokens has 1 rows, encoder_input_tokens 2')):
    with pytest.raises(checks.InputError, match=said):
      diagnostics.diagnose(model, None, np.array(enc), np.array(base),
                           np.array(spec))


def test_bound_covers_measured_rounding(v11, v11_inputs):
  """The stated bound holds where it is claimed: bf16 vs f32 activations."""
  _, params = v11
  enc, dec = v11_inputs
  cfg = TINY_V11.replace(dtype='bfloat16')
  bf16 = network.T5Model(cfg)
  z_hat = logits(bf16, params, enc, dec)
  ref = diagnostics.reference_model(bf16)
  with jax.default_matmul_precision('highest'):
    z, h = jax.jit(ref.logits_and_hidden)(params, enc, dec)
  w = np.asarray(params['decoder']['logits_dense']['kernel'])
  s = np.abs(np.asarray(h, np.float32)) @ np.abs(w)
  eps = diagnostics.relative_error(cfg, 'cpu') * s
  assert np.all(np.abs(z_hat - np.asarray(z)) <= eps)


# -- The eval job -------------------------------------------------------------


def exact_twins(monkeypatch):
  """The eval job's target gets exact twin tokens (equal kernel columns)."""
  real = loading.load_model

  def load(config, checkpoint, seed=0, what='model', shardings=None,
           cache=None):
    model, params = real(config, checkpoint, seed, what, shardings, cache)
    if what == 'target':
      kernel = np.array(params['decoder']['logits_dense']['kernel'])
      kernel[:, 1::2] = kernel[:, 0::2]
      params['decoder']['logits_dense']['kernel'] = jnp.asarray(kernel)
    return model, params

  monkeypatch.setattr(loading, 'load_model', load)


def test_eval_counts_near_ties_and_passes(tmp_path, monkeypatch):
  """A tie broken the other way is reported, not failed on."""
  exact_twins(monkeypatch)
  plant(monkeypatch, other_twin)
  out = tmp_path / 'ties'
  # 'targets': 11, a length no other test compiles (see plant).
  summary = eval_lib.main(eval_args(out, NUM_EXAMPLES='2', BATCH_SIZE='2',
                                    **{'TASK_FEATURE_LENGTHS':
                                       "{'inputs': 512, 'targets': 11}"}))
  assert summary['status'] == 'complete'
  assert summary['differing_examples'] == 2
  assert summary['near_ties'] == 2 and summary['mismatches'] == 0
  records = [json.loads(l) for l in
             (out / 'examples.jsonl').read_text().splitlines()]
  for r in records:
    d = r['divergence']
    assert d['kind'] == 'near_tie' and d['top2_gap'] == 0.0
    assert d['baseline_token'] ^ 1 == d['speculative_token']
  assert 'near_ties' in (out / 'summary.md').read_text()


def test_eval_fails_on_a_real_mismatch(tmp_path, monkeypatch):
  """Also: ACTIVATION_DTYPE reaches the model both decoders run."""
  plant(monkeypatch, accept_everything)
  seen = []
  for module, name in ((decoding, 'temperature_sample'),
                       (speculative, 'speculative_sample')):
    real = getattr(module, name)

    def spy(model, *a, real=real, **k):
      seen.append(model.config.activation_dtype)
      return real(model, *a, **k)

    monkeypatch.setattr(module, name, spy)
  out = tmp_path / 'bug'
  with pytest.raises(eval_lib.MismatchError, match='beyond rounding'):
    eval_lib.main(eval_args(out, NUM_EXAMPLES='2', DTYPE="'bfloat16'",
                            ACTIVATION_DTYPE="'float32'", **{
                                'TASK_FEATURE_LENGTHS':
                                    "{'inputs': 512, 'targets': 13}"}))
  summary = json.loads((out / 'summary.json').read_text())
  assert summary['mismatches'] >= 1
  assert summary['status'].startswith('failed')
  assert (out / 'summary.md').read_text().startswith(
      f"**Status: {summary['status']}.**")
  assert seen and set(seen) == {'float32'}
  run = json.loads((out / 'run.json').read_text())
  assert run['identity']['activation_dtype'] == 'float32'
  with pytest.raises(ValueError, match='activation_dtype'):
    eval_lib.main(eval_args(tmp_path / 'bad', ACTIVATION_DTYPE="'int8'"))
