"""The network has T5X's parameter tree and loads a real T5X checkpoint."""

import flax.serialization
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import layers
from specdec_jax import network

from conftest import teacher_forced_logits  # pylint: disable=g-bad-import-order

# T5X's gin dimensions (t5x/examples/t5/t5_1_1/{size}.gin).
T5_1_1 = {
    'small': dict(emb_dim=512, num_heads=6, num_encoder_layers=8,
                  num_decoder_layers=8, head_dim=64, mlp_dim=1024),
    'base': dict(emb_dim=768, num_heads=12, num_encoder_layers=12,
                 num_decoder_layers=12, head_dim=64, mlp_dim=2048),
    'large': dict(emb_dim=1024, num_heads=16, num_encoder_layers=24,
                  num_decoder_layers=24, head_dim=64, mlp_dim=2816),
    'xl': dict(emb_dim=2048, num_heads=32, num_encoder_layers=24,
               num_decoder_layers=24, head_dim=64, mlp_dim=5120),
    'xxl': dict(emb_dim=4096, num_heads=64, num_encoder_layers=24,
                num_decoder_layers=24, head_dim=64, mlp_dim=10240),
}


def t5x_expected_tree(vocab, emb_dim, num_heads, num_encoder_layers,
                      num_decoder_layers, head_dim, mlp_dim, mlp_names,
                      separate_logits):
  """T5X's parameter paths -> (shape, logical axes), written from T5X's rules.

  Independent of specdec_jax's code: attention kernels are 2-D joined heads,
  MLP kernels wi/wi_i/wo, one relpos table per stack.
  """
  joined = num_heads * head_dim
  tree = {'token_embedder/embedding': ((vocab, emb_dim), ('vocab', 'embed'))}

  def attn(prefix):
    for name in ('query', 'key', 'value'):
      tree[f'{prefix}/{name}/kernel'] = ((emb_dim, joined),
                                         ('embed', 'joined_kv'))
    tree[f'{prefix}/out/kernel'] = ((joined, emb_dim), ('joined_kv', 'embed'))

  def mlp(prefix):
    for name in mlp_names:
      tree[f'{prefix}/mlp/{name}/kernel'] = ((emb_dim, mlp_dim),
                                             ('embed', 'mlp'))
    tree[f'{prefix}/mlp/wo/kernel'] = ((mlp_dim, emb_dim), ('mlp', 'embed'))

  def norm(path):
    tree[f'{path}/scale'] = ((emb_dim,), ('embed',))

  for stack, n in (('encoder', num_encoder_layers),
                   ('decoder', num_decoder_layers)):
    tree[f'{stack}/relpos_bias/rel_embedding'] = ((num_heads, 32),
                                                  ('heads', 'relpos_buckets'))
    norm(f'{stack}/{stack}_norm')
    for i in range(n):
      p = f'{stack}/layers_{i}'
      if stack == 'encoder':
        norm(f'{p}/pre_attention_layer_norm')
        attn(f'{p}/attention')
      else:
        norm(f'{p}/pre_self_attention_layer_norm')
        attn(f'{p}/self_attention')
        norm(f'{p}/pre_cross_attention_layer_norm')
        attn(f'{p}/encoder_decoder_attention')
      norm(f'{p}/pre_mlp_layer_norm')
      mlp(p)
  if separate_logits:
    tree['decoder/logits_dense/kernel'] = ((emb_dim, vocab), ('embed', 'vocab'))
  return tree


def flat(tree):
  return {
      '/'.join(k.key for k in path): leaf
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def our_tree(model):
  """(shape, axes) per path, at zero cost via jax.eval_shape."""
  variables = jax.eval_shape(
      model.module.init, jax.random.key(0), jnp.ones((1, 4), jnp.int32),
      jnp.ones((1, 4), jnp.int32),
  )
  shapes = flat(variables['params'])
  axes = {
      '/'.join(k.key for k in path).removesuffix('_axes'): leaf.names
      for path, leaf in jax.tree_util.tree_flatten_with_path(
          variables['params_axes'],
          is_leaf=lambda x: hasattr(x, 'names'))[0]
  }
  return {k: (tuple(v.shape), axes[k]) for k, v in shapes.items()}, shapes


# 'large' and 'xl' (24 layers each side, as 'xxl') with `pytest -m slow`.
@pytest.mark.parametrize('size', [
    pytest.param(s, marks=[pytest.mark.slow] if s in ('large', 'xl') else [])
    for s in T5_1_1])
def test_t5_1_1_tree_matches_t5x(size):
  """Names, shapes and logical axes equal T5X's for every T5 1.1 size."""
  dims = T5_1_1[size]
  model = network.T5Model(network.T5Config(
      vocab_size=32128, mlp_activations=('gelu', 'linear'),
      logits_via_embedding=False, **dims))
  ours, shapes = our_tree(model)
  expected = t5x_expected_tree(32128, mlp_names=('wi_0', 'wi_1'),
                               separate_logits=True, **dims)
  assert ours == expected
  assert all(v.dtype == jnp.float32 for v in shapes.values())
  if size == 'small':
    assert sum(int(np.prod(s)) for s, _ in ours.values()) == 76_961_152


def test_t5_1_0_tree_matches_t5x():
  """T5 1.0: one `wi` (relu) and logits through the shared embedding."""
  dims = dict(emb_dim=512, num_heads=8, num_encoder_layers=6,
              num_decoder_layers=6, head_dim=64, mlp_dim=2048)
  model = network.T5Model(network.T5Config(
      vocab_size=32128, mlp_activations=('relu',), logits_via_embedding=True,
      **dims))
  ours, _ = our_tree(model)
  assert ours == t5x_expected_tree(32128, mlp_names=('wi',),
                                   separate_logits=False, **dims)
  # T5 1.0 small (t5-small) has 60,506,624 parameters.
  assert sum(int(np.prod(s)) for s, _ in ours.values()) == 60_506_624


TINY_FIXTURE_CONFIG = network.T5Config(
    vocab_size=32128, emb_dim=8, num_heads=4, head_dim=3, mlp_dim=16,
    num_encoder_layers=2, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
)


def test_t5x_written_checkpoint_loads_without_renaming(fixtures_dir):
  """A checkpoint written by T5X itself has exactly our tree and runs."""
  raw = (fixtures_dir / 'test_t5_tiny.checkpoint_0').read_bytes()
  params = flax.serialization.msgpack_restore(raw)['optimizer']['target']
  model = network.T5Model(TINY_FIXTURE_CONFIG)
  expected = jax.eval_shape(model.init_params, jax.random.key(0))
  assert (jax.tree_util.tree_structure(params)
          == jax.tree_util.tree_structure(expected))
  assert jax.tree_util.tree_map(np.shape, params) == jax.tree_util.tree_map(
      lambda x: x.shape, expected)
  enc = jnp.array([[37, 8, 120, 1, 0, 0], [5, 6, 7, 8, 9, 1]])
  dec = jnp.array([[0, 11, 12], [0, 13, 14]])
  logits = teacher_forced_logits(model, params, enc, dec)
  assert logits.shape == (2, 3, 32128)
  assert np.isfinite(np.asarray(logits)).all()
  # The checkpoint's weights are used: other weights give other logits.
  other = teacher_forced_logits(
      model, jax.jit(model.init_params)(jax.random.key(5)), enc, dec)
  assert not np.allclose(logits, other)


@pytest.mark.parametrize('path', [
    ('decoder', 'layers_1', 'mlp', 'wo', 'kernel'),  # DenseGeneral
    ('token_embedder', 'embedding'),  # Embed (set up in `setup`)
    ('encoder', 'encoder_norm', 'scale'),  # LayerNorm
    ('decoder', 'relpos_bias', 'rel_embedding'),  # RelativePositionBiases
])
def test_a_parameter_of_the_wrong_shape_is_named(np_v11, path):
  """Applying the model checks each parameter's shape (as flax does, but
  without tracing its initializer): a wrong one is an error naming it;
  the model's teacher-forced call names it first (`check_params`)."""
  model, params = np_v11
  params = jax.tree_util.tree_map(lambda x: x, params)
  leaf = params
  for key in path[:-1]:
    leaf = leaf[key]
  leaf[path[-1]] = np.zeros(leaf[path[-1]].shape[:-1] + (3,), np.float32)
  enc = jnp.array([[5, 6, 7, 1]])
  dec = jnp.array([[0, 5]])
  with pytest.raises(checks.InputError,
                     match='/'.join(path) + r': \(.*3,?\) vs config'):
    model.logits(params, enc, dec)
  with pytest.raises(flax.errors.ScopeParamShapeError,
                     match=path[-1] + '.*' + path[-2]):
    jax.eval_shape(lambda p: model.module_for(p).apply({'params': p}, enc,
                                                       dec), params)


def test_the_shapes_of_a_config_made_in_a_trace_add_no_op():
  """A loop's trace checks its params (`init_cache`), which may trace a
  config's shapes first there: that must leave the loop's program as it
  is (before, the key and ids made for `init` were ops in it, so the
  first program of a configuration had another fingerprint)."""
  config = network.T5Config(vocab_size=40, emb_dim=12, num_heads=3,
                            head_dim=4, mlp_dim=20, num_encoder_layers=1,
                            num_decoder_layers=1)  # no other test's: cold
  jaxpr = jax.make_jaxpr(
      lambda x: (network.T5Model(config).param_shapes(), x)[1])(1.0)
  assert not jaxpr.eqns, jaxpr


def test_axes_sown_twice_in_one_apply_must_match():
  """A parameter read twice in one apply with `params_axes` mutable sows
  its logical axes twice: as flax's own `param_with_axes`, the second must
  name the same axes (a module that names them two ways is an error, not
  the last one silently kept)."""

  class Inner(nn.Module):

    @nn.compact
    def __call__(self, x, axes):
      return x @ layers.param_with_axes(self, 'w', nn.initializers.ones,
                                        (2, 3), jnp.float32, axes)

  class Twice(nn.Module):  # one Inner, called twice
    second: tuple

    @nn.compact
    def __call__(self, x):
      inner = Inner()
      return inner(x, ('embed', 'mlp')) + inner(x, self.second)

  x = jnp.ones((1, 2))
  params = Twice(('embed', 'mlp')).init(jax.random.key(0), x)['params']
  _, sown = Twice(('embed', 'mlp')).apply({'params': params}, x,
                                          mutable=['params_axes'])
  assert sown['params_axes']['Inner_0']['w_axes'] == (
      nn_partitioning.AxisMetadata(('embed', 'mlp')))
  with pytest.raises(ValueError, match='sown twice'):
    Twice(('mlp', 'embed')).apply({'params': params}, x,
                                  mutable=['params_axes'])


@pytest.mark.parametrize('bias_shape', [(1, 3, 5, 9), (2, 1, 1, 9)])
def test_cudnn_attention_kernel_adds_and_softmaxes_in_float32(bias_shape):
  """`attention_kernel='cudnn'` is attention with float32 logits, bias and
  softmax, the probabilities rounded to the value's dtype (cuDNN's math;
  off a CUDA GPU XLA computes the same): in bfloat16 it is within half a
  bfloat16 step of that, computed here in numpy, where T5X's kernel (its
  softmax in bfloat16) is off by more. A self-attention bias per head and
  a cross-attention mask broadcast over heads and queries."""
  rng = np.random.default_rng(0)
  bf16, f32 = jnp.bfloat16, lambda x: np.asarray(x, np.float32)
  q, k, v = (jnp.asarray(rng.normal(size=s), bf16) for s in (
      (2, 5, 3, 16), (2, 9, 3, 16), (2, 9, 3, 16)))
  bias = (jnp.asarray(rng.normal(size=bias_shape), bf16)
          if bias_shape[1] > 1 else layers.mask_to_bias(
              jnp.asarray(rng.random(bias_shape) < 0.7), bf16))
  logits = np.einsum('bqhd,bkhd->bhqk', f32(q), f32(k)) + f32(bias)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs = f32(jnp.asarray(probs / probs.sum(-1, keepdims=True), bf16))
  want = np.einsum('bhqk,bkhd->bqhd', probs, f32(v))
  got = layers.dot_product_attention(q, k, v, bias, bf16, kernel='cudnn')
  assert got.dtype == bf16
  np.testing.assert_allclose(f32(got), want, rtol=2 ** -8, atol=2 ** -8)
  t5x = f32(layers.dot_product_attention(q, k, v, bias, bf16))
  assert np.abs(t5x - want).max() > 2 * np.abs(f32(got) - want).max()


@pytest.mark.parametrize('change, message', [
    (dict(attention_kernel='flash'),
     r"T5Config.attention_kernel must be one of \('dot_product', 'cudnn'\), "
     r"got 'flash'"),
    (dict(dense_kernel='triton'), r"T5Config.dense_kernel .*'pallas'.*triton"),
    (dict(dtype='float16x'), r"T5Config.dtype must be a float dtype .*"
     "'float16x'"),
    (dict(dtype='int32'), r'T5Config.dtype must be a float dtype'),
    (dict(activation_dtype='bf16'), r'T5Config.activation_dtype must be a '),
    (dict(num_heads=0), r'T5Config.num_heads must be an int >= 1, got 0'),
    (dict(emb_dim=8.0), r'T5Config.emb_dim must be an int >= 1, got 8.0'),
    (dict(mlp_activations=('gelu', 'swishy')),
     r"unknown activation 'swishy' \('linear' or a function of flax.linen"),
    (dict(mlp_activations='gelu'), r'mlp_activations must be a non-empty '
     r"sequence of names.*got 'gelu'"),
])
def test_a_config_no_t5_can_have_is_named_when_given(change, message):
  """`T5Model` checks its config as it is made (an `InputError` naming the
  field, which a command says in one line), not in a trace of the model:
  before, a dtype jnp does not know was a TypeError from inside jax."""
  config = network.T5Config(**{
      **dict(vocab_size=32, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8,
             num_encoder_layers=1, num_decoder_layers=1), **change})
  with pytest.raises(checks.InputError, match=message):
    network.T5Model(config)
  network.T5Model(config.replace(  # the same config, that field as T5X's
      **{k: getattr(network.T5Config(1), k) for k in change}))
