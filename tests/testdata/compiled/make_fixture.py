"""Writes the fixture of tests/test_program_cost.py: a tiny loop compiled
for a compile-only H100, its dumps gzipped beside this file.

Needs the CUDA plugin (jax-cuda12/13-plugin at the installed jax version):
  python tests/testdata/compiled/make_fixture.py

The loop body: a 'target' GEMM (the first argument's weight), a 'drafter'
GEMM (the second's), a tanh (selection), five row stores (a command
buffer: cache copies) and a nested 3-trip loop of one fused op (draft
steps); tests/test_program_cost.py counts them by hand.
"""

import gzip
import os
import pathlib
import tempfile

os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from specdec_jax import compiled  # pylint: disable=g-import-not-at-top

HERE = pathlib.Path(__file__).resolve().parent
# What `program_cost.read_dump` reads, named as XLA names them.
SUFFIXES = ('thunk_sequence_after_thunk_passes.txt', 'after_optimizations.txt',
            'thunk_metadata.txt')


def program(*args):
  target_w, draft_w, x, rows = args

  def body(carry):
    i, x, rows = carry
    with jax.named_scope('Transformer.extend'):
      y = x @ target_w  # [8, 256] x [256, 256]
    with jax.named_scope('Transformer.extend'):
      y = y @ draft_w
    with jax.named_scope('select_tokens'):
      y = jnp.tanh(y)
    with jax.named_scope('cache'):
      rows = tuple(r.at[i].set(y[k]) for k, r in enumerate(rows))
    y = jax.lax.fori_loop(0, 3, lambda j, z: z * z + 1, y)
    return i + 1, y, rows

  return jax.lax.while_loop(lambda c: c[0] < 10, body, (0, x, rows))[1:]


def main():
  device = compiled.devices('gpu:h100')[0]
  place = lambda shape: jax.ShapeDtypeStruct(
      shape, jnp.bfloat16,
      sharding=jax.sharding.SingleDeviceSharding(device))
  lowered = jax.jit(program, donate_argnums=3).lower(
      place((256, 256)), place((256, 256)), place((8, 256)),
      (place((10, 256)),) * 5)
  with tempfile.TemporaryDirectory() as folder:
    lowered.compile({'xla_dump_to': folder, 'xla_dump_hlo_as_text': True,
                     'xla_gpu_enable_triton_gemm': False})
    for suffix in SUFFIXES:
      (path,) = pathlib.Path(folder).glob(f'*{suffix}')
      text = path.read_text()
      # No machine path in the fixture: the source file's name only.
      text = text.replace(str(HERE) + os.sep, '')
      (HERE / f'tiny_loop.{suffix}.gz').write_bytes(
          gzip.compress(text.encode(), mtime=0))


if __name__ == '__main__':
  main()
