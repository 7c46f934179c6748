"""The one entry of every decode loop (`scaffold`): the programs it
compiles, and a provider's executables in their place.

On a GPU a decode iteration's kernels, cuBLAS GEMMs included, run inside
command buffers, which XLA builds by tracing them where the driver allows
it (CUDA >= 12.3), as on the device and on its compile-only twin, told the
driver's version (`compiled.gpu_target_config`).
"""

import dataclasses
import os

import jax
from jax.experimental import serialize_executable
import numpy as np

from specdec_jax import compiled
from specdec_jax import drafters
from specdec_jax import measure
from specdec_jax import programs
from specdec_jax import scaffold

# A compile-only GPU needs no driver (tests/test_weight_layout.py).
os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')


def test_a_tree_iteration_is_one_command_buffer_on_a_gpu(h100,
                                                        xxl_tree_setup):
  """A token tree's iteration on an H100 (cuBLAS GEMMs, the builds' way) at
  T5 1.1-XXL target cost: every part, the target call's cuBLAS GEMMs
  included, runs inside one command buffer (host launches: it and the
  loop's condition), as on the device, whose driver lets XLA trace them in;
  a twin without the driver's version left every GEMM a launch of its own
  (needs the CUDA plugin: skipped without it)."""
  from specdec_jax import program_cost  # pylint: disable=g-import-not-at-top
  setup = dataclasses.replace(xxl_tree_setup, gamma=8, tree='beam:4,2,8')
  lowered = compiled.lower_program('tree', setup, h100)[0]
  it = program_cost.compile_iteration(lowered, 'gpu')
  levels = {k: v for k, v in it.parts.items() if k.startswith('drafter call')}
  assert len(levels) == 8, sorted(it.parts)
  assert it.total.launches <= 2 and it.total.command_buffers == 1, it.total
  assert it.parts['target call'].kernels >= 24 * 6, it.parts['target call']


def test_a_provider_gives_the_programs_run_runs(v11, ragged_greedy):
  """Within `programs_from`, each decode program comes from the provider
  (here: compiled, serialized as a store would keep it, and loaded back),
  asked once per program and signature, keyed by a fingerprint that tells
  programs apart; the tokens are those of jax's own compile. A decode
  traced inside a caller's jit asks nothing."""
  model, params = v11
  enc, _ = ragged_greedy
  asked, names = [], []

  def provider(traced, fingerprint, lower_on, name):
    asked.append(fingerprint)
    names.append(name)
    # Compiled as a build would, for a device named apart from the trace.
    compiled_ = lower_on(jax.devices()[0]).compile()
    return serialize_executable.deserialize_and_load(
        *serialize_executable.serialize(compiled_))

  def program(gamma):
    return programs.Program(programs.ProgramSpec(
        'speculative', 'fixed', max_decode_len=8, eos_id=-1, gamma=gamma),
                            model, drafters.T5Drafter(model))

  rng = jax.random.key(0)
  ref = program(2)(params, params, enc, rng)
  with scaffold.programs_from(provider):
    out = program(2)(params, params, enc, rng)
    again = program(2)(params, params, enc, rng)
    other = program(3)(params, params, enc, rng)
    # (Traced, not compiled: whether to ask is decided in the trace.)
    jax.jit(lambda e: program(2)(params, params, e, rng).tokens).trace(enc)
  assert len(asked) == 2 and asked[0] != asked[1]
  assert all(f.startswith('sha256:') for f in asked)
  assert names == ['_call[SpecLoop]'] * 2  # what each is: a chain's loop
  for res in (out, again, other):
    np.testing.assert_array_equal(res.tokens, ref.tokens)
  # The program's identity, built anew, is the one the provider was asked,
  # also from shape structs placed on a device (a compile-only one's, for
  # a build ahead of time), whose lowering differs in its annotations.
  assert program(2).identity(params, params, enc, rng) == asked[0]
  placed = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  # In jax's types, as a build's structs are (numpy's int64 inputs are
  # int32 to jax; a struct of int64 is truncated, with a warning).
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      np.shape(x), jax.typeof(x).dtype, sharding=placed),
      (params, params, enc, rng))
  assert program(2).identity(*shapes) == asked[0]
  # The timing loops of a profile are programs of the same seam: the
  # context cache and each k's loop of calls, asked once each.
  asked.clear()
  with scaffold.programs_from(provider):
    for _ in range(2):
      measure.cost_curve(model, params, enc[:1], [2], repeats=1, n_calls=2,
                         context=4, jit_setup=True)
  assert len(asked) == len(set(asked)) == 3
