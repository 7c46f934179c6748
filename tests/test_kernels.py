"""The norm fused into the projection (`kernels.norm_dense`, opt-in with
`T5Config.dense_kernel = 'pallas'`).

The kernel is checked where a CPU can run it, through Pallas's interpreter,
against the math it replaces (the norm, then the product, then the gate);
the model's plumbing (a decoder layer's norms handed to the projections
that read them) against the model without it: off a CUDA GPU the deferred
norm is the norm, so the logits are the same bits. On a compile-only H100
the kernel is one custom call where the norm, the GEMM and the gate were
three or more kernels (tests skipped without the CUDA plugin).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import kernels
from specdec_jax import layers
from specdec_jax import network

from conftest import TINY_V11, numpy_params, teacher_forced_logits

K, N = 2 * kernels.BLOCK_K, 2 * kernels.BLOCK_N


def _case(rows, gate, seed=0, n=N):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(0, 2, (rows, K)), jnp.bfloat16)
  scale = jnp.asarray(rng.uniform(0.5, 1.5, K), jnp.bfloat16)
  kernel = jnp.asarray(rng.normal(0, K ** -0.5, (K, n * (2 if gate else 1))),
                       jnp.bfloat16)
  return kernels.Normed(x, scale, 1e-6, jnp.bfloat16), kernel


def _exact(normed, kernel, gate):
  """The norm, the product and the gate in float64 (numpy)."""
  x, s, w = (np.asarray(a, np.float64) for a in (normed.x, normed.scale,
                                                 kernel))
  h = x / np.sqrt((x * x).mean(-1, keepdims=True) + normed.epsilon) * s @ w
  if not gate:
    return h
  g, v = h.reshape(h.shape[0], -1, 2)[..., 0], h.reshape(
      h.shape[0], -1, 2)[..., 1]
  return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (
      g + 0.044715 * g ** 3))) * v  # jax.nn.gelu's tanh form


@pytest.mark.parametrize('gate', [False, True], ids=['dense', 'gated'])
@pytest.mark.parametrize('rows,n', [(1, N), (7, N), (65, N), (
    7, kernels.PROGRAMS * kernels.BLOCK_N)], ids=['1', '7', '65', '7-wide'])
def test_the_kernel_computes_the_norm_the_product_and_the_gate(rows, n,
                                                              gate):
  """Interpreted, on bfloat16: the norm, the product and the gate on the
  projections' interleaved columns (`layers.interleave`), for a block of
  rows larger than the call's (1 -> 16, 65 -> 128), as close to the exact
  math (float64) as XLA's norm, then GEMM, then gate in bfloat16 are: the
  kernel rounds the rows once at another point (scaled, not normalized
  and scaled), so the two differ by bfloat16 steps and neither is the
  other's bits. Measured: root-mean-square error 0.0023-0.0028 against
  XLA's 0.0029-0.0039, outputs of about unit scale. Programs of half
  `BLOCK_N` columns (fewer than `PROGRAMS` of it) and of `BLOCK_N`
  ('wide')."""
  normed, kernel = _case(rows, gate, n=n)
  got = np.asarray(kernels.norm_dense(normed, kernel, gate, interpret=True),
                   np.float32)
  h = jnp.dot(normed.value(), kernel, preferred_element_type=jnp.float32
              ).astype(jnp.bfloat16)
  xla = np.asarray(kernels.gated(h.reshape(rows, n, 2)) if gate else h,
                   np.float32)
  exact = _exact(normed, kernel, gate)
  assert got.shape == exact.shape == (rows, n)
  rms = lambda y: float(np.sqrt(np.mean((y - exact) ** 2)))
  assert rms(got) <= 1.1 * rms(xla), (rms(got), rms(xla))
  assert np.abs(got - exact).max() <= 2 * np.abs(xla - exact).max()
  # Not the product of unnormalized rows, nor the gate's halves swapped.
  wrong = jnp.dot(normed.x, kernel).astype(jnp.bfloat16)
  wrong = (jax.nn.gelu(wrong.reshape(rows, n, 2)[..., 1]) *
           wrong.reshape(rows, n, 2)[..., 0]) if gate else wrong
  assert rms(np.asarray(wrong, np.float32)) > 20 * rms(xla)


def test_shapes_off_its_tiles_or_float32_take_the_plain_path():
  normed, kernel = _case(3, False)
  assert kernels.fits(normed, kernel, False)
  assert not kernels.fits(normed, kernel[:, :N - 1], False)
  assert not kernels.fits(kernels.Normed(normed.x, normed.scale, 1e-6,
                                         jnp.float32), kernel, False)
  with pytest.raises(ValueError, match='tiles'):
    kernels.norm_dense(normed, kernel[:, :N - 1])


# Wide enough for the kernel's tiles: off a CUDA GPU the model with
# dense_kernel 'pallas' must give the same bits as without.
WIDE = TINY_V11.replace(emb_dim=K, head_dim=K // 4, mlp_dim=N,
                        dtype=jnp.bfloat16)


@pytest.mark.parametrize('fused', [False, True], ids=['t5x', 'fused'])
def test_a_model_with_the_kernel_is_the_model_off_a_gpu(fused):
  """The parameter tree is T5X's either way (the norms' scales and the
  projections' kernels where they were), and the logits are the same bits:
  the deferred norm, the projection and the gate compute the same math in
  the same order (`Normed.value`, `kernels.gated`)."""
  params = numpy_params(WIDE, 0, 1.0)
  plain = network.T5Model(WIDE)
  opted = network.T5Model(WIDE.replace(dense_kernel='pallas'))
  if fused:
    (plain, params), (opted, _) = (network.for_decoding(m, params)
                                   for m in (plain, opted))
  assert jax.tree.structure(opted.param_shapes()) == jax.tree.structure(
      plain.param_shapes())
  enc = jnp.array([[3, 4, 5, 6, 7, 1], [8, 9, 1, 0, 0, 0]])
  dec = jnp.array([[0, 10, 11, 12], [0, 13, 14, 15]])
  want = teacher_forced_logits(plain, params, enc, dec)
  got = teacher_forced_logits(opted, params, enc, dec)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_layer_norm_deferred_is_the_norm():
  """`LayerNorm(defer=True)` hands its rows and rounded scale on; their
  `value()` is the norm's output."""
  norm = layers.LayerNorm(dtype=jnp.bfloat16, weight_dtype=jnp.bfloat16)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 8)),
                  jnp.bfloat16)
  params = norm.init(jax.random.key(0), x)
  deferred = norm.apply(params, x, True)
  assert isinstance(deferred, kernels.Normed) and deferred.x is x
  np.testing.assert_array_equal(np.asarray(deferred.value()),
                                np.asarray(norm.apply(params, x)))


def test_a_decoder_layer_s_norms_and_gate_go_into_its_projections_on_a_gpu(
    h100):
  """On a compile-only H100 (lowered within `kernels.abstract_gpu`) each
  decoder layer runs its qkv, cross-attention query and gated wi as three
  Pallas kernels, and at least the three norms and the gate fewer kernels
  than without (a chain's 8 rows and a tree's 65)."""
  from test_call_rows import GPU_CONFIG, _extend_module  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  device = h100.mesh.devices.flat[0]

  def layer_ops(config, k, tree):
    with kernels.abstract_gpu(device):
      module = _extend_module(network.T5Model(config), h100, k, tree)
    ops = [i for i in module.computations[module.entry]
           if i.opcode in ('fusion', 'custom-call') and re.search(
               r'/layers_0/', module.op_name(i))]
    return len(ops), sum('__gpu$xla.gpu.triton' in i.attrs for i in ops)

  for k, tree in ((8, False), (65, True)):
    plain, none = layer_ops(GPU_CONFIG, k, tree)
    fused, pallas = layer_ops(GPU_CONFIG.replace(dense_kernel='pallas'), k,
                              tree)
    assert none == 0 and pallas == 3, (none, pallas)
    assert fused <= plain - 4, (plain, fused)


def test_the_kernel_spills_no_register_on_a_gpu(h100, xxl_tree_setup):
  """ptxas on a compile-only H100 spills no register of the kernel
  (`xla_gpu_fail_ptx_compilation_on_register_spilling`: a kernel that
  spills fails its compile) at each block of rows a call takes (1, 17, 33
  and 65 rows: 16 to 128) for the XXL-width target's gated wi (64 columns
  a program), and at 65 rows for its dec2-shaped drafter's (32 columns)."""
  device = h100.mesh.devices.flat[0]
  place = jax.sharding.SingleDeviceSharding(device)
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16,
                                             sharding=place)
  target, draft = xxl_tree_setup.target, xxl_tree_setup.draft
  for rows, k_dim, n in [(r, target.emb_dim, target.mlp_dim)
                         for r in (1, 17, 33, 65)] + [
                             (65, draft.emb_dim, draft.mlp_dim)]:
    with kernels.abstract_gpu(device):
      lowered = jax.jit(lambda x, s, w: kernels.norm_dense(
          kernels.Normed(x, s, 1e-6, jnp.bfloat16), w, gate=True)).lower(
              spec(rows, k_dim), spec(k_dim), spec(k_dim, 2 * n))
    # At XLA's default LLVM level (the suite's XLA_FLAGS set 0, for its
    # CPU programs: unoptimized PTX, which ptxas spills more of).
    lowered.compile(
        {'xla_gpu_fail_ptx_compilation_on_register_spilling': True,
         'xla_backend_optimization_level': 2})


def test_the_kernel_in_the_model_keeps_greedy_decoding_exact(monkeypatch):
  """The GPU's branch, run here (the kernel interpreted): the model's
  logits are the plain model's within bfloat16 rounding, and a greedy
  speculative decode equals the baseline decoded with the same kernel,
  token for token (a drafter of the same model, perturbed: calls of 1 and
  gamma + 1 rows)."""
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax import drafters  # pylint: disable=g-import-not-at-top
  from specdec_jax import speculative  # pylint: disable=g-import-not-at-top
  params = numpy_params(WIDE, 0, 1.0)
  plain, params = network.for_decoding(network.T5Model(WIDE), params)
  opted = network.T5Model(plain.config.replace(dense_kernel='pallas'))
  enc = jnp.array([[3, 4, 5, 6, 7, 1], [8, 9, 1, 0, 0, 0]])
  dec = jnp.array([[0, 10, 11, 12], [0, 13, 14, 15]])
  want = teacher_forced_logits(plain, params, enc, dec)
  interpreted = kernels.norm_dense
  monkeypatch.setattr(kernels, 'on_cuda', lambda cuda, default: cuda())
  monkeypatch.setattr(kernels, 'norm_dense', lambda *a: interpreted(
      *a, interpret=True))
  # A jit of its own: a trace of `opted` from before the patches would be
  # reused (teacher_forced_logits keys on the model).
  got = jax.jit(lambda p: opted.logits(p, enc, dec))(params)
  np.testing.assert_allclose(np.asarray(got, np.float32),
                             np.asarray(want, np.float32), atol=0.1)
  assert not np.array_equal(np.asarray(got), np.asarray(want))  # its path
  base = decoding.temperature_sample(opted, params, enc, max_decode_len=8,
                                     eos_id=1)
  noisy = jax.jit(lambda p: jax.tree.map(lambda w: w * 1.05, p))(params)
  out = speculative.speculative_sample(
      opted, params, drafters.T5Drafter(opted), noisy, enc, gamma=3,
      max_decode_len=8, eos_id=1)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  assert int(np.sum(out.stats.accepted)) > 0
