"""The one entry of every decode loop (`scaffold`): the XLA options its
programs compile with.

A decode program hands the dots smaller than the target's weight matmuls
to XLA's own fused kernels (`network.small_dot_threshold`); on a GPU the
rest are cuBLAS GEMMs, which XLA captures in command buffers by tracing
them where the driver allows it (CUDA >= 12.3), as on the device and on
its compile-only twin, told the driver's version
(`compiled.gpu_target_config`).
"""

import dataclasses
import os

import jax
from jax.experimental import serialize_executable
import numpy as np

from specdec_jax import compiled
from specdec_jax import drafters
from specdec_jax import measure
from specdec_jax import models
from specdec_jax import network
from specdec_jax import programs
from specdec_jax import scaffold

# A compile-only GPU needs no driver (tests/test_weight_layout.py).
os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')


def _params(name, **changes):
  """Shape structs of a model's T5X params (no memory)."""
  return network.T5Model(models.config(name, **changes)).param_shapes()


def test_small_dots_are_below_the_targets_smallest_weight_matmul():
  """The threshold sits between the drafter's and the target's matmuls:
  the largest params tree is the target (whatever the argument order), its
  smallest 2-D kernel bounds the threshold, capped where cuBLAS's gain
  outweighs a launch; tiny models keep XLA's default (no option)."""
  xxl, small = _params('t5_1_1_xxl'), _params('t5_1_1_small')
  base = _params('t5_1_1_base')
  assert network.small_dot_threshold((small, {'x': 1}, xxl)) == (
      network.SMALL_DOT_CAP)
  assert network.small_dot_threshold((base, small)) == 768 * 768
  assert network.small_dot_threshold(({'tokens': 3},)) == 0
  assert scaffold.compiler_options((base, small)) == (
      ('xla_gpu_gemm_rewrite_size_threshold', 768 * 768),)
  assert scaffold.compiler_options((_params('t5_1_1_tiny'),)) == ()
  # The fused decoding layout gives the same threshold.
  assert network.small_dot_threshold(jax.eval_shape(
      network.decoding_layout, (base, small))) == 768 * 768


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


def test_a_decode_inside_the_callers_jit_compiles():
  """A decode called inside a caller's own `jax.jit` (a caller may wrap
  its decoders so) is a nested jit, which takes no compiler options:
  it compiles without them, and the caller passes `compiler_options` to
  its own jit. Before, a model with options raised a ValueError there."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  model = network.T5Model(models.config(
      't5_1_1_tiny', emb_dim=16, head_dim=8, vocab_size=64, dtype='float32'))
  params = model.param_shapes()
  tokens = jax.ShapeDtypeStruct((1, 5), jnp.int32)
  options = scaffold.compiler_options((params,))
  assert options  # this model's kernels are above XLA's default
  decode = lambda p, x: decoding.temperature_sample(model, p, x,
                                                    max_decode_len=3)
  jax.jit(decode, compiler_options=dict(options)).lower(
      params, tokens).compile()
  assert decoding.temperature_sample.lower(
      model, params, tokens, max_decode_len=3).compile() is not None


def test_the_drafters_timing_loop_compiles_as_in_a_decode_loop():
  """c is timed on the drafter alone; given the target it drafts for, its
  loop compiles with the decode loop's options (the target's threshold),
  not the drafter's own (where its matmuls would stay cuBLAS GEMMs). Run
  on shapes within a provider whose stand-in returns zeros (as a stored
  build records a cell's programs): nothing is compiled."""
  import time  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  small = models.config('t5_1_1_tiny', emb_dim=16, head_dim=8,
                        vocab_size=64, dtype='float32')
  drafter = drafters.T5Drafter(network.T5Model(small))
  draft = network.T5Model(small).param_shapes()
  target = network.T5Model(small.replace(emb_dim=64, mlp_dim=128)
                           ).param_shapes()
  want = scaffold.compiler_options((target,))
  assert want and want != scaffold.compiler_options((draft,))
  asked = []

  def provider(traced, fingerprint, lower_on, name):
    del lower_on
    asked.append((name, fingerprint == scaffold.fingerprint(traced, want)))
    zeros = jax.tree.map(lambda i: np.zeros(i.shape, i.dtype),
                         traced.out_info)

    def stand_in(*args):
      del args
      time.sleep(0.06)  # past loop_time's shortest loop: one try
      return zeros
    return stand_in

  with scaffold.programs_from(provider):
    measure.drafter_token_time(drafter, draft, jnp.ones((1, 5), jnp.int32),
                               2, repeats=1, n_calls=1, context=2,
                               target_params=target)
  assert asked == [('_repeated_proposals[T5Drafter]', True)]


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
    jax.jit(lambda e: program(2)(params, params, e, rng).tokens)(enc)
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
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      np.shape(x), x.dtype, sharding=placed), (params, params, enc, rng))
  assert program(2).identity(*shapes) == asked[0]
  # The timing loops of a profile are programs of the same seam: the
  # context cache and each k's loop of calls, asked once each.
  asked.clear()
  with scaffold.programs_from(provider):
    for _ in range(2):
      measure.cost_curve(model, params, enc[:1], [2], repeats=1, n_calls=2,
                         context=4, jit_setup=True)
  assert len(asked) == len(set(asked)) == 3
