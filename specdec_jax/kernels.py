"""A T5 RMS norm fused into the dense projection that reads it (Pallas).

A decoder layer normalizes its input three times, each norm read by one
projection (the self-attention's qkv, the cross-attention's query, the
MLP's wi), and the gated MLP's `gelu(h_0) * h_1` is applied to wi's output
before wo reads it. XLA 0.11.2 fuses neither the norm's reduction nor the
gate into a GEMM (cuBLAS or its own Triton fusions), so each writes an
activation the next kernel reads: on a 65-row token tree call at
T5 1.1-XXL cost 0.19 GB of the 11.76 a call moves
(results/compiled/iterations_h100.md). `norm_dense` is one kernel that
reads the unnormalized rows once, multiplies them (scaled) into the
kernel's columns while it sums their squares, and applies 1 / rms to the
product: `rms_norm`'s math, rounded at another point (a bfloat16 step
apart from XLA's norm then GEMM); it applies the gate before it writes
where asked.

Opt-in, per model (`network.T5Config.dense_kernel = 'pallas'`): on a
CUDA GPU the Pallas kernel (its Triton backend; a compile-only GPU lowers
it within `abstract_gpu`), elsewhere the same math as the norm and the
projection apart (`Normed.value`). Its speed beside cuBLAS is a device's
to measure; it runs on one device (a mesh that shards the projections
would gather their kernels for it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

Array = Any

# Tiles: rows in one block (a power of 2, at least 16: a Triton dot's
# least), BLOCK_N output columns a program (half as many where that leaves
# fewer than PROGRAMS programs: a GPU's SMs idle, 132 on an H100), BLOCK_K
# of the contraction a step.
BLOCK_N = 64
PROGRAMS = 128
BLOCK_K = 128
# Warps a program runs on, by its block of rows: a program holds its
# accumulators (rows x columns, twice with the gate, in float32) and a
# step's tiles in registers, which Triton's default of 4 warps spills to
# local memory from 64 rows on. ptxas on a compile-only H200 (sm_90a,
# CUDA 13.5; T5 1.1-XXL's gated wi, 4096 x 2 x 10240, 64 columns a
# program): 4 warps spill 80 bytes at 64 rows and 1,128 at 128 (the
# tree's 65-row call), its qkv 140 at 128 rows, a dec2 drafter's gated wi
# (32 columns) 264; 8 warps spill none (142-188 registers a thread).
# At 16 and 32 rows 4 warps spill none (8 would, 4 bytes at 32).
WIDE_BLOCK, WIDE_WARPS, WARPS = 64, 8, 4
# The gate the kernel applies: T5 1.1's gated GeLU (wi_0 through GeLU,
# times wi_1), the MLP's activations.
GATE = ('gelu', 'linear')


def rms_norm(x: Array, epsilon: float, dtype) -> Array:
  """T5's RMS norm before its scale: `x / rms(x)` in float32, rounded to
  `dtype`."""
  x = jnp.asarray(x, jnp.float32)
  mean2 = jnp.mean(jax.lax.square(x), axis=-1, keepdims=True)
  return jnp.asarray(x * jax.lax.rsqrt(mean2 + epsilon), dtype)


@dataclasses.dataclass(frozen=True)
class Normed:
  """Rows a `layers.LayerNorm` normalizes, handed to the projection that
  reads them unnormalized (`layers.DenseGeneral`): `value()` is the norm's
  output."""

  x: Array
  scale: Array
  epsilon: float
  dtype: Any

  def value(self) -> Array:
    return rms_norm(self.x, self.epsilon, self.dtype) * self.scale


def gated(h: Array) -> Array:
  """`GATE` on a projection's `[..., n, 2]` output: gelu(h_0) * h_1."""
  return jax.nn.gelu(h[..., 0]) * h[..., 1]


def _columns(n: int) -> int:
  """Output columns a program: `BLOCK_N`, or half where `n` makes fewer
  than `PROGRAMS` programs of them (the cross-attention's query at T5
  1.1-XXL width: 64 programs, 128 at half)."""
  return BLOCK_N // 2 if n // BLOCK_N < PROGRAMS else BLOCK_N


def _kernel(x_ref, s_ref, w_ref, o_ref, *, epsilon, gate, k_dim, bn):
  """One program: `bn` output columns of every row, in one pass over the
  contraction: each step's rows, scaled, go into the product and their
  squares into 1 / rms, which the product takes at the end (the norm's
  math with the rows rounded once, scaled, not normalized and scaled: a
  second pass reading the rows again for 1 / rms first would double what
  every program reads of them)."""
  j = pl.program_id(0)
  chunk = lambda i: pl.ds(i * BLOCK_K, BLOCK_K)
  # The gate's two projections: interleaved columns (`layers.interleave`).
  cols = ([pl.ds(2 * j * bn + g, bn, stride=2) for g in (0, 1)]
          if gate else [pl.ds(j * bn, bn)])

  def step(i, carry):
    squares, accs = carry
    x = x_ref[:, chunk(i)].astype(jnp.float32)
    y = (x * s_ref[chunk(i)][None, :].astype(jnp.float32)).astype(
        o_ref.dtype)
    return squares + jnp.sum(x * x, axis=1), tuple(
        a + jnp.dot(y, w_ref[chunk(i), c], preferred_element_type=jnp.float32)
        for a, c in zip(accs, cols))
  rows = x_ref.shape[0]
  squares, accs = jax.lax.fori_loop(0, k_dim // BLOCK_K, step, (
      jnp.zeros((rows,), jnp.float32),
      tuple(jnp.zeros((rows, bn), jnp.float32) for _ in cols)))
  r = jax.lax.rsqrt(squares / k_dim + epsilon)[:, None]
  h = [(a * r).astype(o_ref.dtype) for a in accs]
  o_ref[...] = (jax.nn.gelu(h[0].astype(jnp.float32)).astype(o_ref.dtype)
                * h[1] if gate else h[0])


def norm_dense(normed: Normed, kernel: Array, gate: bool = False,
               interpret: bool = False) -> Array:
  """`normed.value() @ kernel` (`[..., K] x [K, N]`) in one Pallas kernel;
  with `gate`, `gated` of it (`kernel`'s columns `GATE`'s two
  projections interleaved: `[..., N / 2]`). `interpret`: Pallas's
  interpreter (any platform: the tests' check of the kernel)."""
  lead, k_dim = normed.x.shape[:-1], normed.x.shape[-1]
  rows = normed.x.reshape(-1, k_dim)
  n = _outputs(kernel, gate)
  if not _in_tiles(k_dim, n):
    raise ValueError(f'norm_dense: {k_dim} x {n} is not in tiles of '
                     f'{BLOCK_K} x {BLOCK_N}')
  block, bn = max(16, 1 << (rows.shape[0] - 1).bit_length()), _columns(n)
  out = pl.pallas_call(
      functools.partial(_kernel, epsilon=normed.epsilon, gate=gate,
                        k_dim=k_dim, bn=bn),
      grid=(n // bn,),
      in_specs=[pl.BlockSpec((block, k_dim), lambda j: (0, 0)),
                pl.BlockSpec((k_dim,), lambda j: (0,)),
                pl.BlockSpec(kernel.shape, lambda j: (0, 0))],
      out_specs=pl.BlockSpec((block, bn), lambda j: (0, j)),
      out_shape=jax.ShapeDtypeStruct((rows.shape[0], n), normed.dtype),
      compiler_params=plgpu.CompilerParams(num_warps=warps(block)),
      interpret=interpret,
  )(rows, jnp.asarray(normed.scale, normed.dtype),
    jnp.asarray(kernel, normed.dtype))
  return out.reshape(lead + (n,))


def warps(block: int) -> int:
  """Warps of a program of `block` rows (`WIDE_WARPS` from `WIDE_BLOCK`
  rows on: no spilled register)."""
  return WIDE_WARPS if block >= WIDE_BLOCK else WARPS


def on_cuda(cuda, default):
  """`cuda()` in a program lowered for a CUDA GPU, `default()` elsewhere
  (`jax.lax.platform_dependent`): where `DenseGeneral` picks the kernel."""
  return jax.lax.platform_dependent(cuda=cuda, default=default)


def _outputs(kernel: Array, gate: bool) -> int:
  """Output columns of `norm_dense` (the gate joins pairs of them)."""
  return kernel.shape[1] // (2 if gate else 1)


def _in_tiles(k_dim: int, n: int) -> bool:
  return k_dim % BLOCK_K == 0 and n % BLOCK_N == 0


def fits(normed: Normed, kernel: Array, gate: bool) -> bool:
  """Whether `norm_dense` takes these: its tiles, and bfloat16 (a Triton
  dot of float32 operands would round them to TF32)."""
  return (_in_tiles(normed.x.shape[-1], _outputs(kernel, gate)) and
          jnp.dtype(normed.dtype) == jnp.bfloat16)


def abstract_gpu(device: Optional[Any]):
  """The context a program with `norm_dense` is lowered in for `device`:
  Pallas's GPU lowering reads the GPU's kind from an abstract mesh of it
  where jax's default device is not that GPU (a compile-only one); for any
  other device, nothing."""
  if device is None or device.platform != 'gpu':
    return contextlib.nullcontext()
  return jax.sharding.use_abstract_mesh(
      jax.sharding.Mesh([device], ('device',)).abstract_mesh)
