"""Decode loops compiled for a Cloud TPU this machine does not have.

libtpu (the test extra pins it to jax's version) describes a TPU slice
without the chips; `specdec_jax.compiled` compiles the package's own loops
for it from abstract, sharded parameters. These tests check what the TPU
compiler says about a tiny speculative loop and its baseline on a 2 x 2
('data' x 'model') mesh of TPU v5e chips: the parameters' bytes per device
are the unsharded bytes divided as T5X's rules say, and each loop is one
while loop that never waits on the host. They also check that installing
libtpu leaves the rest of the suite on the CPU.
"""

import math
import subprocess
import sys

from flax import traverse_util
import jax
import jax.numpy as jnp
import pytest

from specdec_jax import compiled
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import hardware

# Every sharded dimension a multiple of 128 after the split, so the TPU's
# tiled layouts add no padding to the parameters' bytes.
TINY = network.T5Config(
    vocab_size=256, emb_dim=256, num_heads=4, head_dim=64, mlp_dim=512,
    num_encoder_layers=1, num_decoder_layers=1,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
    dtype=jnp.float32)
TARGET = 'tpu:v5e:2x2'
SETUP = compiled.Setup(target=TINY, draft=TINY, batch=2, input_length=16,
                       max_decode_len=8, gamma=3, param_dtype='float32')
# The rules' split of each logical axis over a 2 x 2 mesh (T5X's standard
# rules: heads, mlp, vocab, joined_kv over 'model'; the rest whole).
MODEL_AXES = {'heads': 2, 'mlp': 2, 'vocab': 2, 'joined_kv': 2}
# The TPU's tiled layouts pad the few small arrays (relative-position
# tables, the inputs, the key) by a few KiB; the split checked is MiBs.
PAD = 16 * 1024


@pytest.fixture(scope='module')
def loops():
  """The baseline and the T5-drafted speculative loop, compiled for TPU."""
  return {name: compiled.compile_program(name, SETUP,
                                         compiled.get_target(TARGET),
                                         num_partitions=2)
          for name in ('baseline', 't5')}


def _param_bytes_per_device(config, rules_split):
  """Bytes of one device's shard of every parameter, from logical names."""
  model = network.T5Model(config)
  names = traverse_util.flatten_dict(partitioning.logical_specs(model))
  shapes = traverse_util.flatten_dict(
      jax.eval_shape(model.init_params, jax.random.key(0)))
  total = 0
  for key, shape in shapes.items():
    split = math.prod(rules_split.get(n, 1) for n in names[key])
    total += shape.size * shape.dtype.itemsize // split
  return total


def test_loops_compile_for_tpu(loops):
  """Both loops compile for TPU v5e chips from abstract parameters."""
  for facts in loops.values():
    assert facts['compiled'], facts.get('error')
    assert facts['fits']
    assert facts['cost']['flops'] > 0


def test_parameter_bytes_are_divided_as_the_rules_say(loops):
  """What a device holds is its shard: the target's weights split over the
  'model' axis by T5X's rules, the drafter's replicated (data-parallel
  rules), the batch over 'data'. The compiler's argument bytes per device
  are that sum, up to the tile padding of the small arrays."""
  target = _param_bytes_per_device(TINY, MODEL_AXES)
  whole = _param_bytes_per_device(TINY, {})
  assert whole - target > 100 * PAD
  inputs = SETUP.batch // 2 * SETUP.input_length * 4
  rng = 8  # A threefry key: two uint32.
  base = loops['baseline']['memory']['argument_bytes']
  # The baseline's arguments: target params, inputs, rng, max_steps.
  assert abs(base - (target + inputs + rng + 4)) <= PAD, (base, target)
  spec = loops['t5']['memory']['argument_bytes']
  # The speculative loop's: target params, draft params, inputs twice, rng.
  assert abs(spec - (target + whole + 2 * inputs + rng)) <= PAD, (spec,
                                                                 target)


def test_each_loop_is_one_while_loop_without_host_transfers(loops):
  """The whole decode runs on the device: the program is one while loop
  (the decode) with no infeed / outfeed / host callback, and the sharded
  target's collectives sit inside it."""
  for name, facts in loops.items():
    hlo = facts['hlo']
    assert hlo['entry_while_loops'] == 1, (name, hlo)
    assert hlo['host_transfers'] == 0, (name, hlo)
    assert hlo['collectives']['all-reduce'] > 0, (name, hlo)


def test_unknown_target_is_a_named_error():
  """A typo lists the targets one can name."""
  with pytest.raises(ValueError, match=r"unknown compile-only target "
                     r"'tpu:v9'.*tpu:v4:1x1x1.*gpu:h100"):
    compiled.get_target('tpu:v9')
  with pytest.raises(ValueError, match='unknown program'):
    compiled.lower_program('nope', SETUP, None)


def test_roofline_and_largest_batch():
  """The estimate is the larger of the flops and bytes bounds (plus the
  per-op overhead), and the largest batch follows the bytes' line."""
  chip = compiled.CHIPS['v5e']
  assert compiled.roofline_s(197e12, 819e9, chip) == pytest.approx(1.0)
  assert compiled.roofline_s(0, 409.5e9, chip, ops=10, overhead_s=0.01) == (
      pytest.approx(0.6))
  # A v4 device is one of the chip's two TensorCores: half its figures.
  assert compiled.roofline_s(0, 600e9, compiled.CHIPS['v4']) == (
      pytest.approx(1.0))
  gib = compiled.GIB
  assert compiled.largest_batch({8: 10 * gib, 32: 22 * gib}, 32 * gib) == 52
  assert compiled.largest_batch({8: 10 * gib, 32: 22 * gib}, 32 * gib,
                                multiple=8) == 48
  assert compiled.largest_batch({1: 40 * gib, 8: 41 * gib}, 32 * gib) is None
  assert compiled.largest_batch({1: gib}, 32 * gib) is None  # One point.


def test_estimated_profile_goes_through_the_one_predict():
  """The compiler's step counts become a `hardware.HardwareProfile` whose
  prediction is Theorem 3.8 (t(k) bytes-bound: cost 1; c = byte ratio)."""
  step = lambda b: {'cost': {'flops': 1.0, 'bytes_accessed': b},
                    'hlo': {'entry_ops': 100}}
  steps = {1: {k: step(819e9) for k in range(1, 9)}}
  # Batch 32's target step did not compile (too big): its drafter's c has
  # no t(1) and is left out, not an error.
  profile = compiled.estimated_profile(
      compiled.get_target('tpu:v5e:1x1'), steps,
      {1: {'small': step(16.38e9)}, 32: {'small': step(16.38e9)}})
  assert profile.batches() == (1,)
  assert profile.t1_ms == pytest.approx(1000.0)
  assert profile.c[1]['small'] == pytest.approx(0.02)
  p = hardware.predict(profile, alpha=0.75, gamma=7, drafter='small')
  assert p.speedup == pytest.approx(
      (1 - 0.75 ** 8) / (0.25 * (7 * 0.02 + 1)))
  assert compiled.ESTIMATED in profile.name


def test_cpu_stays_the_default_backend_with_libtpu_installed():
  """libtpu in the test install must not move the suite off the CPU: a
  plain process (this suite's XLA flags inherited) still gets CPU devices,
  and jax's TPU backend is not started until a topology is asked for."""
  out = subprocess.run(
      [sys.executable, '-c', 'import jax; print(jax.default_backend())'],
      capture_output=True, text=True, timeout=120, check=True)
  assert out.stdout.strip() == 'cpu', out.stderr[-2000:]
