"""Fused projections: the same model in fewer matmuls per decoding step.

`network.for_decoding` joins T5X's query/key/value (and cross-attention's
key/value, and a gated MLP's wi_0/wi_1) kernels into one kernel each. It is
a layout change only: if a split were out of order or a kernel fused twice,
decoding would silently produce another model's tokens, so logits and tokens
are compared with the unfused model's, and the saved matmuls are counted.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import speculative

from conftest import extend
from conftest import init_cache
from conftest import teacher_forced_logits
from test_network import T5_1_1

# float32 on CPU: the fused matmul computes the same dot products; observed
# bit-identical (max |diff| 0), asserted to 1e-5 so other backends pass.
ATOL = 1e-5
LENGTH = 12


def _flat(tree):
  return {'/'.join(k.key for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _data(vocab, batch=3, seed=0):
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, vocab, (batch, 10))
  enc[1, 6:] = 0
  enc[2, 3:] = 0
  dec = rng.integers(2, vocab, (batch, LENGTH))
  dec[:, 0] = 0
  return jnp.asarray(enc), jnp.asarray(dec)


@pytest.fixture(params=['v11', 'v10'])
def both(request):
  """(unfused model, params, fused model, fused params), gated and relu."""
  model, params = request.getfixturevalue(request.param)
  return (model, params) + network.for_decoding(model, params)


def test_fuse_layout_and_unfuse_is_identity(both):
  """Fused names and shapes as documented; unfuse(fuse(p)) == p exactly."""
  model, params, fused_model, fused = both
  cfg = model.config
  joined = cfg.num_heads * cfg.head_dim
  got = {k: v.shape for k, v in _flat(fused).items()}
  dec = 'decoder/layers_1/'
  assert got[dec + 'self_attention/qkv/kernel'] == (cfg.emb_dim, 3 * joined)
  assert got['decoder/cross_kv/kernel'] == (
      cfg.emb_dim, cfg.num_decoder_layers * 2 * joined)
  assert got[dec + 'encoder_decoder_attention/query/kernel'] == (cfg.emb_dim,
                                                                 joined)
  assert got['encoder/layers_0/attention/qkv/kernel'] == (cfg.emb_dim,
                                                          3 * joined)
  gated = len(cfg.mlp_activations) == 2
  mlp = 'mlp/wi_fused/kernel' if gated else 'mlp/wi/kernel'
  assert got[dec + mlp] == (cfg.emb_dim, (1 + gated) * cfg.mlp_dim)
  assert not any('/key/' in k or '/value/' in k or 'wi_0' in k for k in got)
  # Fused params are exactly the fused model's tree (what check_params wants).
  want = jax.eval_shape(fused_model.init_params, jax.random.key(0))
  assert got == {k: v.shape for k, v in _flat(want).items()}
  count = lambda tree: sum(x.size for x in jax.tree_util.tree_leaves(tree))
  assert count(fused) == count(params)
  assert network.is_fused(fused) and not network.is_fused(params)

  back = network.unfuse_params(fused, cfg)
  assert jax.tree_util.tree_structure(back) == (
      jax.tree_util.tree_structure(params))
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)
  with pytest.raises(ValueError, match='already fused'):
    network.fuse_params(fused, cfg)
  with pytest.raises(ValueError, match='not fused'):
    network.unfuse_params(params, cfg)
  assert network.for_decoding(fused_model, fused) == (fused_model, fused)


def test_fused_logits_equal_unfused(both):
  """Teacher-forced logits and cached extend (k = 1, 3) match the unfused."""
  model, params, fused_model, fused = both
  enc, dec = _data(model.vocab_size)
  np.testing.assert_allclose(
      teacher_forced_logits(fused_model, fused, enc, dec),
      teacher_forced_logits(model, params, enc, dec), atol=ATOL, rtol=0)
  for k in (1, 3):
    caches = [init_cache(m, p, enc, LENGTH)
              for m, p in ((model, params), (fused_model, fused))]
    for start in range(0, LENGTH, k):
      tokens = dec[:, start:start + k]
      want, caches[0] = extend(model, params, tokens, caches[0])
      got, caches[1] = extend(fused_model, fused, tokens, caches[1])
      np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=ATOL, rtol=0),
        caches[1], caches[0])


def test_fused_greedy_tokens_equal_unfused(v11):
  """Baseline and speculative greedy decodes give the same tokens fused.

  On the gated model alone: the loops call the model as they do any, and
  the relu model's fused calls and caches match its unfused ones
  (`test_fused_logits_equal_unfused`)."""
  model, params = v11
  fused_model, fused = network.for_decoding(model, params)
  enc, _ = _data(model.vocab_size, batch=4, seed=1)
  base = decoding.temperature_sample(model, params, enc, max_decode_len=10)
  got = decoding.temperature_sample(fused_model, fused, enc,
                                    max_decode_len=10)
  np.testing.assert_array_equal(got.tokens, base.tokens)
  # A T5 drafter (the target plus noise), itself fused by for_decoding.
  rng = np.random.default_rng(7)
  draft_params = jax.tree_util.tree_map(
      lambda x: x + 0.3 * np.std(x) * rng.standard_normal(x.shape), params)
  draft_model, fused_draft = network.for_decoding(model, draft_params)
  runs = [speculative.speculative_sample(
      target, tparams, drafters.T5Drafter(dmodel), dparams, enc, gamma=3,
      max_decode_len=10)
          for target, tparams, dmodel, dparams in (
              (model, params, model, draft_params),
              (fused_model, fused, draft_model, fused_draft))]
  np.testing.assert_array_equal(runs[0].tokens, base.tokens)
  np.testing.assert_array_equal(runs[1].tokens, base.tokens)
  # Same drafts accepted: the fused drafter proposes what the unfused does.
  np.testing.assert_array_equal(runs[1].stats.accepted,
                                runs[0].stats.accepted)
  assert 0 < int(np.sum(runs[0].stats.accepted)) < int(
      np.sum(runs[0].stats.drafted))


def count_dots(jaxpr) -> int:
  """dot_general equations in a jaxpr, each call site of a sub-jaxpr counted."""
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == 'dot_general'
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, 'jaxpr', sub)
        if hasattr(sub, 'eqns'):
          n += count_dots(sub)
  return n


def step_dots(config):
  """Dots of one 1-token `extend` and of `init_cache`, traced at no cost."""
  model = network.T5Model(config)
  params = jax.eval_shape(model.init_params, jax.random.key(0))
  enc = jax.ShapeDtypeStruct((1, 64), jnp.int32)
  init = lambda p, e: model.init_cache(p, e, 128)
  cache = jax.eval_shape(init, params, enc)
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  return (count_dots(jax.make_jaxpr(model.extend)(params, tokens,
                                                  cache).jaxpr),
          count_dots(jax.make_jaxpr(init)(params, enc).jaxpr))


@pytest.mark.parametrize('activations,saved', [
    (('gelu', 'linear'), 3),  # q/k/v -> 1 (2 saved), wi_0/wi_1 -> 1 (1)
    (('relu',), 2),  # q/k/v only; one `wi` stays
])
def test_fused_step_has_fewer_dots(activations, saved):
  """T5 1.1-small shape: a decoder layer's step has 13 (gated) dots, 10 fused.

  Per decoder layer, unfused: q, k, v, q.k, p.v, out (self-attention); q,
  q.k, p.v, out (cross); wi_0, wi_1, wo — plus one logits dot per step. In
  init_cache, the encoder saves as much per layer and every decoder layer's
  cross-attention k, v become one dot.
  """
  config = network.T5Config(vocab_size=32128, mlp_activations=activations,
                            logits_via_embedding=False, **T5_1_1['small'])
  layers = config.num_decoder_layers
  extend, init = step_dots(config)
  fused_extend, fused_init = step_dots(
      config.replace(fused_projections=True))
  assert extend == (10 + saved) * layers + 1
  assert fused_extend == 10 * layers + 1
  assert extend - fused_extend == saved * layers  # 24 (gated), 16 (relu)
  assert init - fused_init == (saved * config.num_encoder_layers +
                                2 * layers - 1)


def test_a_fused_tree_is_not_saved_as_a_checkpoint(both, tmp_path):
  """Fused params are a decoding layout; checkpoints keep T5X's tree."""
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  model, params, fused_model, fused = both
  assert network.is_fused(fused) and not network.is_fused(params)
  with pytest.raises(ValueError, match='fused decoding layout'):
    checkpoints.save_t5x_params(fused, str(tmp_path), 1)
  assert not (tmp_path / 'checkpoint_1').exists()
  path = checkpoints.save_t5x_params(
      network.unfuse_params(fused, fused_model.config), str(tmp_path), 1)
  back = checkpoints.load_t5x_params(path, config=model.config)
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(
      lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
      back, params))
