"""No decode loop rewrites a weight on every iteration.

A loop's weights are loop-invariant: each iteration should read them as they
are. A compiler that merges two matmuls sharing an input (a GPU build with
cuBLAS GEMMs merges T5X's query/key/value projections) joins their weights
with a concatenate INSIDE the loop, every iteration, and a float32 logits
layer on bfloat16 weights converts the kernel on every call: at T5 1.1-XXL
cost about 3.7 GB more per target call than the 11 GB of weights it reads.
So `scaffold.run` lays the weights out once, before the loop
(`network.decoding_layout`: fused projections), and the logits read the
kernel as stored (`layers.float32_dot`).

`partitioning.loop_weight_rewrites` reads a compiled program's optimized HLO
and lists each concatenate / convert / copy / transpose / slice (or fusion
holding one) in a while body whose operands derive only from loop-invariant
values. The finder is shown to bite on the CPU (a weight joined inside a
loop's conditional, which XLA cannot hoist) and on a compile-only H100 with
cuBLAS GEMMs (T5X's unfused layout, the loop run without
`decoding_layout`; and a batch-1 logits product at T5 1.1-XXL size, which
that build runs as a float32 GEMM unless it has two rows): the latter need
the CUDA plugin at jax's version (docs/decoding.md: a Python 3.12 venv with
jax[cuda13]) and are skipped without it. Every decode program, compiled for
a TPU v5e (and for an H100 where it can), must have none.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import compiled
from specdec_jax import decoding
from specdec_jax import layers
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax.sampling import SamplingConfig

# bfloat16 weights and activations (a bf16 checkpoint decoded as T5X does);
# every kernel >= 2 KiB, so `MIN_BYTES` skips scalars and masks.
TINY = network.T5Config(
    vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
    num_encoder_layers=1, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
    dtype=jnp.bfloat16)
MIN_BYTES = 2048
# Where the CUDA plugin is installed: it registers without a GPU only if
# told before jax first looks for backends (as `compiled.devices` does).
os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
SETUP = compiled.Setup(target=TINY, draft=TINY.replace(num_decoder_layers=1),
                       batch=2, input_length=8, max_decode_len=6, gamma=2,
                       param_dtype='bfloat16')
# Every loop kind: the baseline, the chain, the token tree, the merged
# loops (PaSS look-ahead, heads) and a streaming loop (its refill encodes
# inside the loop).
PROGRAMS = ('baseline', 't5', 'tree', 'pass', 'heads', 'stream:t5')


def _setup(name):
  return dataclasses.replace(SETUP, tree='beam:2,1,2') if name == 'tree' else (
      SETUP)


def _rewrites(lowered, **options):
  return partitioning.loop_weight_rewrites(
      lowered.compile(**options).as_text(), MIN_BYTES)


def _planted(wk, wv, x, join_before: bool):
  """A loop whose conditional multiplies by [wk | wv] (joined in the body,
  or once before the loop)."""
  joined = jnp.concatenate([wk, wv], 1) if join_before else None

  def body(carry):
    i, y = carry

    def project(y):
      w = joined if join_before else jnp.concatenate([wk, wv], 1)
      z = y @ w
      # A concatenate of loop-varying values: not a weight's rewrite.
      return jnp.concatenate([z[:, :32], z[:, 32:]], 0)[:8]
    return i + 1, jax.lax.cond(i % 2 == 0, project, lambda y: 2 * y, y)

  return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]


@pytest.mark.parametrize('join_before', [False, True])
def test_finder_flags_a_weight_joined_inside_a_loop(join_before):
  """The finder bites: a concatenate of two weights inside a loop (in a
  conditional, where XLA's loop-invariant code motion leaves it) is
  reported, with its shape and the jax op it came from; joined before the
  loop, nothing is, and neither is the concatenate of loop-varying values."""
  w = jax.ShapeDtypeStruct((32, 32), jnp.float32)
  x = jax.ShapeDtypeStruct((8, 32), jnp.float32)
  lowered = jax.jit(_planted, static_argnums=3).lower(w, w, x, join_before)
  found = _rewrites(lowered)
  if join_before:
    assert found == []
  else:
    assert [(r['op'], r['bytes']) for r in found] == [
        ('concatenate', 32 * 64 * 4)], found
    assert 'while/body' in found[0]['op_name'], found


@pytest.mark.parametrize('name', PROGRAMS)
def test_decode_loops_rewrite_no_weight_on_tpu(tpu_v5e, name):
  """Every decode program, compiled for a TPU v5e from bf16 T5X params,
  reads its weights in the loop as laid out before it."""
  lowered, _ = compiled.lower_program(name, _setup(name), tpu_v5e)
  assert _rewrites(lowered) == []


def test_decode_loop_rewrites_no_weight_on_cpu():
  """The baseline compiled for this CPU from bf16 T5X params (one program:
  the CPU compiler hoists what the TPU's does)."""
  model = network.T5Model(TINY)
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, TINY.dtype),
                        model.param_shapes())
  lowered = decoding.temperature_sample.lower(
      model, params, jax.ShapeDtypeStruct((2, 8), jnp.int32),
      max_decode_len=6)
  assert _rewrites(lowered) == []


CUBLAS = {'compiler_options': {'xla_gpu_enable_triton_gemm': False}}


def test_unfused_layout_is_caught_on_a_gpu(h100):
  """The bite on the real network: the baseline's loop run on T5X's unfused
  params (not through `scaffold.run`, so not laid out) compiled for an H100
  with cuBLAS GEMMs joins each decoder layer's query/key/value kernels in
  the loop; through `scaffold.run` (fused, before the loop) it joins none."""
  model = h100.sharded_model(network.T5Model(TINY))
  params = compiled.abstract_params(model, h100, 'bfloat16')
  inputs = compiled.tokens(h100, 2, 8)
  loop, args = decoding.temperature_sample.prepare(
      model, params, inputs, max_decode_len=6, sampling=SamplingConfig())
  unfused = jax.jit(lambda *a: loop(*a)).lower(*args)
  joined = [r for r in _rewrites(unfused, **CUBLAS)
            if 'concatenate' in r['op']]
  assert len(joined) >= TINY.num_decoder_layers, joined
  assert any('self_attention' in (r['op_name'] or '') for r in joined)
  assert _rewrites(decoding.temperature_sample.lower(
      model, params, inputs, max_decode_len=6), **CUBLAS) == []


@pytest.mark.parametrize('name', PROGRAMS)
def test_decode_loops_rewrite_no_weight_on_a_gpu(h100, name):
  """Every decode program compiled for an H100 with cuBLAS GEMMs (the
  build that joined weights in the loop) reads its weights as laid out."""
  lowered, _ = compiled.lower_program(name, _setup(name), h100)
  assert _rewrites(lowered, **CUBLAS) == []


def test_float32_activations_convert_no_weight_in_the_loop_on_a_gpu(h100):
  """float32 activations on bfloat16 weights at T5 1.1-XXL width, batch 1,
  on an H100: each weight's convert is fused into the matmul that reads
  it. With XLA's small-dot threshold raised (an option decode loops once
  compiled with, to fuse a drafter's dots), XLA wrote the attention's
  query and output kernels in float32 inside the loop, every call: an
  H200 ran such a target's t(1) at 2.7x its floor, 1.7x its bfloat16
  twin's bytes."""
  wide = TINY.replace(dtype='float32', emb_dim=4096, num_heads=64,
                      head_dim=64, mlp_dim=10240, vocab_size=1024)
  setup = dataclasses.replace(SETUP, target=wide, draft=wide, batch=1)
  lowered, _ = compiled.lower_program('baseline', setup, h100)
  assert _rewrites(lowered) == []
  raised = _rewrites(lowered, compiler_options={
      'xla_gpu_gemm_rewrite_size_threshold': 1 << 22})
  assert len(raised) == 3 * wide.num_decoder_layers, raised
  assert all(r['op'] == 'fusion:convert' and r['bytes'] == 4 * 4096 * 4096
             for r in raised), raised


@pytest.mark.parametrize('rows', [1, 3])
def test_float32_dot_is_the_float32_product(rows):
  """The logits' product: bf16 x bf16 accumulated in float32 (one row run
  as two) gives the float32 product of the same values (products of two
  bf16 are exact in float32); a float32 kernel is not rounded."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(1, rows, 64)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(64, 96)), jnp.bfloat16)
  want = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
  got = layers.float32_dot(x, w)
  assert got.dtype == jnp.float32 and got.shape == (1, rows, 96)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  table = jnp.asarray(rng.normal(size=(96, 64)), jnp.float32)
  np.testing.assert_allclose(layers.float32_dot(x, table, contract=1),
                             np.asarray(x, np.float32) @ np.asarray(table).T,
                             rtol=1e-5, atol=1e-5)


def test_one_row_logits_keep_the_kernel_on_a_gpu(h100):
  """At T5 1.1-XXL's logits size (4096 x 32128) XLA's cuBLAS build makes a
  one-row bf16 x bf16 -> f32 product an f32 GEMM, converting the kernel
  every call (a batch-1 step's logits): a bare `dot_general` is caught;
  `layers.float32_dot` (two rows) keeps the kernel as stored."""
  sharding = jax.sharding.SingleDeviceSharding(h100.mesh.devices.flat[0])
  w = jax.ShapeDtypeStruct((4096, 32128), jnp.bfloat16, sharding=sharding)
  y = jax.ShapeDtypeStruct((1, 1, 4096), jnp.float32, sharding=sharding)

  def loop(product):
    def run(w, y):
      def body(carry):
        i, y = carry
        return i + 1, y + product(y.astype(jnp.bfloat16), w)[..., :4096]
      return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, y))[1]
    return _rewrites(jax.jit(run).lower(w, y), **CUBLAS)

  bare = loop(lambda x, k: jax.lax.dot_general(
      x, k, (((2,), (0,)), ((), ())), preferred_element_type=jnp.float32))
  assert [r['op'] for r in bare] == ['fusion:convert'], bare
  assert loop(layers.float32_dot) == []
