"""A decoder call on k tokens as a GPU runs it: whole rows of 8, one bias.

cuBLAS runs a bfloat16 GEMM on a multiple of 8 rows, so a GPU build of a
call on k % 8 != 0 tokens pads the operand of each of a layer's matmuls and
slices its result: about 9 kernels a decoder layer more, and at T5
1.1-XXL cost 0.24 GB more of a 65-token tree call's 12.2 GB
(results/compiled/tree_call_bytes_h100.md). `network.Decoder.extend` runs the
layers on k rounded up to 8 rows on a CUDA GPU only
(`jax.lax.platform_dependent`: the same jaxpr on every platform), and makes
the self-attention bias once per call (XLA recomputed a tree's in every
layer, in a kernel of its own). The padded rows must not show in any output;
the CUDA lowering is read here without a GPU (`jax.export`), the kernels a
compile-only H100 runs where the CUDA plugin is installed (else skipped).
"""

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import compiled
from specdec_jax import layers
from specdec_jax import network

from conftest import extend
from conftest import init_cache

os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
CONTEXT, LENGTH = 5, 40


def _tree(k: int, batch: int, base):
  """A `TreeMask` of k slots at `base`: slot i's parent is (i - 1) // 2."""
  depth, visible = np.zeros(k, np.int32), np.eye(k, dtype=bool)
  for i in range(1, k):
    depth[i] = depth[(i - 1) // 2] + 1
    visible[i] |= visible[(i - 1) // 2]
  return network.TreeMask(
      base=jnp.asarray(base, jnp.int32),
      depth=jnp.broadcast_to(jnp.asarray(depth), (batch, k)),
      visible=jnp.broadcast_to(jnp.asarray(visible), (batch, k, k)))


@pytest.mark.parametrize('batch', [1, 2])
@pytest.mark.parametrize('tree', [False, True])
def test_padded_rows_change_nothing(batch, tree, v11):
  """A call on 7 tokens run on 8 or 16 rows (forced here with `rows`: the
  CPU runs k) gives the logits, hidden states and cache of the 7 rows
  alone, to float32 rounding (a CPU's matmul may sum in another order for
  another row count; a masking slip would be off by far more), and leaves
  every slot after its 7 as it was: the padded rows write nothing. Rows at
  different positions, a chain and a token tree, one row (its cache
  written by an update slice) and two (a scatter)."""
  model, params = v11
  rng = np.random.default_rng(0)
  enc = jnp.asarray(rng.integers(2, model.vocab_size, (batch, 6)))
  cache = init_cache(model, params, enc, LENGTH)
  cache = extend(model, params, jnp.asarray(
      rng.integers(2, model.vocab_size, (batch, 2 * CONTEXT))), cache)[1]
  starts = np.asarray([CONTEXT, CONTEXT + 3][:batch])
  cache = cache.rewind(jnp.asarray(starts))
  tokens = jnp.asarray(rng.integers(2, model.vocab_size, (batch, 7)))
  mask = _tree(7, batch, cache.position) if tree else None
  call = jax.jit(lambda rows: model.extend(
      params, tokens, cache, return_hidden=True, tree=mask, rows=rows),
                 static_argnums=0)
  want = call(None)
  after = np.arange(LENGTH)[None, :] >= starts[:, None] + 7  # [batch, len]
  for rows in (8, 16):
    got = call(rows)
    assert got[0][0].shape == want[0][0].shape == (batch, 7, model.vocab_size)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
    for new, old in zip(got[1].self_key + got[1].self_value,
                        cache.self_key + cache.self_value):
      np.testing.assert_array_equal(np.asarray(new)[after],
                                    np.asarray(old)[after])
    np.testing.assert_array_equal(got[1].position, starts + 7)
  with pytest.raises(ValueError, match='fewer than the 7 tokens'):
    call(6)


# No dimension of 7 or 8 but the call's rows (`_dot_dims`).
SMALL = network.T5Config(
    vocab_size=160, emb_dim=48, num_heads=3, head_dim=16, mlp_dim=96,
    num_encoder_layers=1, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'))


def _dot_dims(k: int, platform: str):
  """Every dimension of every matmul's result in `extend` on k tokens
  (batch 1) of a `SMALL` model lowered for `platform` (no device
  needed, no weight made), and the lowered module's text."""
  model = network.T5Model(SMALL)
  params = model.param_shapes()
  enc = jax.ShapeDtypeStruct((1, 6), jnp.int32)
  cache = jax.eval_shape(lambda p, e: model.init_cache(p, e, LENGTH), params,
                         enc)
  text = jax.export.export(jax.jit(model.extend), platforms=(platform,))(
      params, jax.ShapeDtypeStruct((1, k), jnp.int32), cache).mlir_module()
  dims = set()
  for line in text.splitlines():
    if 'stablehlo.dot_general' in line:
      result = re.search(r'-> tensor<([0-9x]+)x[a-z]', line).group(1)
      dims |= {int(d) for d in result.split('x')}
  return dims, text


def test_a_gpu_lowering_runs_whole_rows_of_8():
  """What a CUDA GPU compiles: a 7-token call's matmuls on 8 rows (every
  platform else, 7); a 1-token step stays one row; no scatter writes a
  one-row cache (a GPU build lowers it with a bounds check and a select:
  a kernel more for each layer's key / value write)."""
  for platform in ('cpu', 'tpu'):
    dims = _dot_dims(7, platform)[0]
    assert 7 in dims and 8 not in dims, (platform, sorted(dims))
  dims, text = _dot_dims(7, 'cuda')
  assert 7 not in dims and 8 in dims, sorted(dims)
  assert 'scatter' not in text
  assert 8 not in _dot_dims(1, 'cuda')[0]


def test_write_rows_one_row_clamps_as_the_scatter_does():
  """One row's write (a plain update slice) and the batched scatter agree,
  a start that would overflow the buffer included (both clamp it)."""
  buffer = jnp.arange(2 * 10 * 3, dtype=jnp.float32).reshape(2, 10, 3)
  update = -jnp.ones((2, 4, 3))
  for start in (0, 5, 8):
    starts = jnp.asarray([start, start], jnp.int32)
    both = layers.write_rows(buffer, update, starts)
    one = layers.write_rows(buffer[:1], update[:1], starts[:1])
    np.testing.assert_array_equal(one, both[:1])
    assert int(np.sum(np.asarray(both[0]) == -1)) == 12


def _extend_module(model, part, k: int, tree: bool):
  """`model.extend` on k tokens compiled for a compile-only H100 with
  cuBLAS GEMMs: its optimized HLO (`program_cost.Module`)."""
  from specdec_jax import program_cost  # pylint: disable=g-import-not-at-top
  device = jax.sharding.SingleDeviceSharding(part.mesh.devices.flat[0])
  place = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
  params = jax.tree.map(place, compiled.abstract_params(
      model, part, 'bfloat16'))
  enc = place(jax.ShapeDtypeStruct((1, 6), jnp.int32))
  cache = jax.tree.map(place, jax.eval_shape(
      lambda p, e: model.init_cache(p, e, 96), params, enc))
  mask = jax.tree.map(place, jax.eval_shape(
      lambda c: _tree(k, 1, c.position), cache)) if tree else None
  tokens = place(jax.ShapeDtypeStruct((1, k), jnp.int32))
  return program_cost.Module(jax.jit(
      lambda p, t, c, m: model.extend(p, t, c, tree=m)).lower(
          params, tokens, cache, mask).compile(
              dict(program_cost.UNTUNED_OPTIONS)).as_text())


def _layer_kernels(model, part, k: int, tree: bool) -> int:
  """Fusions and library calls of `model.extend`'s decoder layers on k
  tokens (`_extend_module`'s top-level ops whose op_name is under a
  layer)."""
  module = _extend_module(model, part, k, tree)
  return sum(1 for i in module.computations[module.entry]
             if i.opcode in ('fusion', 'custom-call') and re.search(
                 r'/layers_\d+/', module.op_name(i)))


GPU_CONFIG = network.T5Config(
    vocab_size=256, emb_dim=128, num_heads=4, head_dim=32, mlp_dim=256,
    num_encoder_layers=1, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'), dtype=jnp.bfloat16,
    fused_projections=True)


def test_a_call_s_layers_run_as_on_whole_rows_on_a_gpu(h100):
  """On a compile-only H100 a decoder layer of a 7-token call runs as many
  kernels as one of an 8-token call (no pad before, no slice after a
  matmul), and a token tree's layer as many as a chain's (its bias made
  once, not a kernel per layer)."""
  model = network.T5Model(GPU_CONFIG)
  chain = _layer_kernels(model, h100, 8, tree=False)
  assert _layer_kernels(model, h100, 7, tree=False) == chain
  assert _layer_kernels(model, h100, 8, tree=True) == chain
  assert _layer_kernels(model, h100, 65, tree=True) == chain


@pytest.mark.parametrize('tree', [False, True])
def test_layers_share_one_bias_uncopied_on_a_gpu(h100, tree):
  """The self-attention bias `[heads, rows, slots]` every layer adds is
  made once and copied by none (cuBLAS-Lt writes a matmul's output over
  its C operand: with the bias added there, XLA copied it for each layer
  but the last, at T5 1.1-XXL width 23 kernels and 82 MB of a tree's
  call). It bites: 3 layers, a chain's 8 rows and a tree's 65."""
  model = network.T5Model(GPU_CONFIG.replace(num_decoder_layers=3))
  k = 65 if tree else 8
  module = _extend_module(model, h100, k, tree)
  bias = (1, GPU_CONFIG.num_heads, network.padded_rows(k), 96)
  copies = [i.name for c in module.computations.values() for i in c
            if i.opcode == 'copy' and tuple(i.shape[1])[-3:] == bias[1:]]
  assert copies == [], copies


def test_a_tree_call_runs_as_many_kernels_as_a_chain_call_on_a_gpu(
    h100, xxl_tree_setup):
  """The decode loops as compiled for a compile-only H100 (cuBLAS GEMMs;
  a 4-layer target of T5 1.1-XXL width, the dec2 drafter): the tree's
  target call on 65 positions runs at most one kernel more than the
  chain's on 7 (its bias; XLA made it in every layer before, one kernel
  a layer), a tree level's drafter call at most 45 on average (59
  before: the rows of its fed nodes padded and its cache written by
  scatters), and the accepted path's move into the target's chain slots
  no kernel of its own (the next call's writes make it: the iteration's
  cache copies are the drafter's, 6, where a move took 2 more a target
  layer)."""
  from specdec_jax import program_cost  # pylint: disable=g-import-not-at-top
  setup = dataclasses.replace(xxl_tree_setup, target=(
      xxl_tree_setup.target.replace(num_decoder_layers=4)))
  parts = {}
  for name, gamma, tree in (('t5', 6, None), ('tree', 12, 'beam:8,4,12/64')):
    lowered = compiled.lower_program(name, dataclasses.replace(
        setup, gamma=gamma, tree=tree), h100)[0]
    parts[name] = program_cost.compile_iteration(lowered, 'gpu').parts
  target = {name: p['target call'].kernels for name, p in parts.items()}
  assert target['tree'] <= target['t5'] + 1, target
  assert parts['tree']['cache copies'].kernels <= 6, parts['tree']
  # Every level's call (call 1 is the catch-up); the scheduler may move a
  # call's first small ops (its bias) next to the call before: the mean.
  levels = [parts['tree'][f'drafter call {n}'].kernels for n in range(2, 13)]
  assert 'drafter call 13' not in parts['tree']
  assert sum(levels) / len(levels) <= 45, levels


@pytest.mark.parametrize('tree', [False, True])
def test_the_cudnn_kernel_runs_an_attention_in_one_kernel_on_a_gpu(h100,
                                                                    tree):
  """With `attention_kernel='cudnn'` each of a decoder layer's two
  attentions is one cuDNN call on a compile-only H100 where XLA's is a
  matmul, a softmax and a matmul: 4 kernels a layer fewer, less the one
  kernel a call that broadcasts the cross-attention's input mask to the
  queries (cuDNN takes a bias of their length; XLA's softmax reads the
  mask as it is). A chain's 8 rows and a tree's 65."""
  k = 65 if tree else 8
  fused = network.T5Model(GPU_CONFIG.replace(attention_kernel='cudnn'))
  module = _extend_module(fused, h100, k, tree)
  calls = [i for i in module.computations[module.entry]
           if i.opcode == 'custom-call' and 'cudnn$fmha' in i.attrs]
  layers_ = GPU_CONFIG.num_decoder_layers
  assert len(calls) == 2 * layers_, [i.name for i in calls]
  plain = _layer_kernels(network.T5Model(GPU_CONFIG), h100, k, tree)
  assert plain - _layer_kernels(fused, h100, k, tree) == 4 * layers_ - 1
