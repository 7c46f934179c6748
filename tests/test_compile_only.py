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
from specdec_jax import models
from specdec_jax import network
from specdec_jax import partitioning

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


def test_the_command_compiles_what_its_flags_name():
  """--programs=all is every program at the first batch and the baseline
  and t5 loops at the others; a named list is those at every batch; a
  program or target that does not exist is the parser's error, naming the
  known ones."""
  args = compiled.parse_flags(['--target=tpu:v5e:2x2', '--batches=1,8'])
  plan = compiled.plan(args)
  assert plan[:len(compiled.program_names())] == [
      (1, name) for name in compiled.program_names()]
  assert plan[len(compiled.program_names()):] == [(8, 'baseline'), (8, 't5')]
  args = compiled.parse_flags(['--target=gpu:h100', '--batches=2,4',
                               '--programs=tree, stream:t5'])
  assert compiled.plan(args) == [(2, 'tree'), (2, 'stream:t5'), (4, 'tree'),
                                 (4, 'stream:t5')]
  assert compiled.setup(args).draft == compiled.configs(args)[1]['small']
  # A drafter spec keeps its FIELD=VALUEs: the comma before the next name
  # parts the specs.
  drafts = compiled.configs(compiled.parse_flags([
      '--target=gpu:h100',
      '--drafts=t5_1_1_small,emb_dim=256,num_heads=4,t5_1_1_base']))[1]
  assert list(drafts) == ['small,emb_dim=256,num_heads=4', 'base']
  assert (drafts['small,emb_dim=256,num_heads=4'] == models.config(
      't5_1_1_small').replace(emb_dim=256, num_heads=4))
  assert drafts['base'] == models.config('t5_1_1_base')
  # A tuple value's comma parts nothing.
  drafts = compiled.configs(compiled.parse_flags([
      '--target=gpu:h100',
      "--drafts=t5_1_1_small,mlp_activations=('swish',),t5_1_1_base"]))[1]
  assert list(drafts) == ["small,mlp_activations=('swish',)", 'base']
  assert drafts["small,mlp_activations=('swish',)"].mlp_activations == (
      'swish',)
  # --model_fields sets a T5Config field of every model.
  args = compiled.parse_flags(['--target=gpu:h100', '--model_fields',
                               'attention_kernel=cudnn'])
  target, drafts = compiled.configs(args)
  assert {c.attention_kernel for c in (target, *drafts.values())} == {'cudnn'}
  assert compiled.configs(compiled.parse_flags(['--target=gpu:h100']))[
      0].attention_kernel == 'dot_product'
  for bad in (['--target=tpu:v9'], ['--target=gpu:h100', '--programs=nope'],
              []):
    with pytest.raises(SystemExit):
      compiled.parse_flags(bad)


@pytest.mark.parametrize('flag, message', [
    ('--gamma=0', 'gamma must be an int >= 1, got 0'),
    ('--batches=8,0', "comma-separated ints >= 1 expected, got '8,0'"),
    ('--batches=8,x', "comma-separated ints >= 1 expected, got '8,x'"),
    ('--batches=', '--batches names no batch'),
    ('--drafts=', '--drafts names no model'),  # a StopIteration, before
    ('--max_decode_len=-3', 'max_decode_len must be an int >= 1, got -3'),
    ('--input_length=0', 'input_length must be an int >= 1, got 0'),
    ('--temperature=-1', 'temperature must be a finite number >= 0'),
    ('--tree=beam:x', "Bad tree spec 'beam:x'"),
    ('--model=t5_1_1_nope', "unknown model config 't5_1_1_nope'"),
    # A model no T5 can be, named with its flag (each program 'not
    # compiled', exit status 0, before).
    ('--model=t5_1_1_small,num_heads=abc', "--model 't5_1_1_small,"
     "num_heads=abc'.num_heads must be an int >= 1, got 'abc'"),
    ('--drafts=t5_1_1_small,num_heads=0', "--drafts 't5_1_1_small,"
     "num_heads=0'.num_heads must be an int >= 1, got 0"),
    ('--model=t5_1_1_base,emb_dim=-4', 'emb_dim must be an int >= 1, got -4'),
    ('--model_fields=dtype=foo', '--model_fields.dtype must be a float dtype'),
    ('--model_fields=attention_kernel=bogus',
     "--model_fields.attention_kernel must be one of ('dot_product'"),
    # A 'model' axis the devices cannot make (a traceback, before).
    ('--num_partitions=2', '--num_partitions=2 does not divide the 1 devices '
     'of tpu:v5e:1x1'),
    # The options of --iterations alone (ignored, before).
    ('--captured_us=2.4', '--captured_us and --xla_option are options of '
     '--iterations'),
    ('--xla_option=xla_gpu_enable_triton_gemm=True',
     '--captured_us and --xla_option are options of --iterations'),
    ('--captured_us=-5', "--captured_us: a finite number >= 0 expected, got "
     "'-5'"),  # a table at a negative cost, before
])
def test_a_bad_value_is_the_parsers_error_before_anything_compiles(
    flag, message, capsys):
  """A value no program can be compiled with is the parser's one-line error
  (exit status 2), not a table of programs that each failed to lower (exit
  status 0) nor a traceback from inside the decoder (a negative length: a
  numpy shape error)."""
  with pytest.raises(SystemExit) as e:
    compiled.parse_flags(['--target=tpu:v5e:1x1', flag])
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_a_missing_compiler_ends_the_command_in_one_line(monkeypatch):
  """A target whose compiler plugin is not installed: the command's one
  line names the fix, not a traceback (--iterations, where the CUDA plugin
  is absent: tests/test_program_cost.py)."""
  def missing(*args, **kwargs):
    raise compiled.BackendMissing('no CUDA plugin: pip install ...')
  monkeypatch.setattr(compiled, 'compile_program', missing)
  with pytest.raises(SystemExit) as e:
    compiled.main(['--target=gpu:h100', '--programs=baseline', '--batches=1'])
  assert e.value.code == 'error: no CUDA plugin: pip install ...'


def test_ctrl_c_prints_the_programs_that_finished(monkeypatch, capsys):
  """Ctrl-C between compiles: the table of the programs that finished and
  the signal's exit status (which `checks.run_main` leaves at once), not a
  KeyboardInterrupt's traceback."""
  def compile_program(name, setup, target, num_partitions):
    del setup, target, num_partitions
    if name != 'baseline':
      raise KeyboardInterrupt
    return {'program': name, 'compiled': False, 'error': 'refused'}
  monkeypatch.setattr(compiled, 'compile_program', compile_program)
  try:
    compiled.main(['--target=tpu:v5e:1x1', '--programs=baseline,t5',
                   '--batches=1'])
    error = None
  except BaseException as e:  # pylint: disable=broad-except
    error = e
  assert isinstance(error, SystemExit) and error.code == 130, repr(error)
  out = capsys.readouterr().out
  assert '| baseline | 1 | - | **no**: refused |' in out
  assert out.endswith('|\nstopped by SIGINT\n'), out


def test_a_programs_row_says_whether_it_fits_or_why_not():
  """The command's table: bytes per device in GiB and the fit, or the
  compiler's error in the 'compiled' column (a '|' cannot break the table)."""
  gib = compiled.GIB
  facts = {'name': 't5', 'batch': 8, 'gamma': 7, 'compiled': True,
           'fits': False, 'compile_s': 3.0,
           'memory': {'argument_bytes': gib, 'temp_bytes': gib // 2,
                      'peak_bytes': 3 * gib // 2},
           'hlo': {'entry_while_loops': 1, 'host_transfers': 0}}
  row = compiled.program_row(facts)
  assert len(row) == len(compiled.PROGRAM_COLUMNS)
  assert row == ['t5', 8, 7, 'yes', '1.00', '0.50', '1.50', '**no**',
                 '1 / 0', 3.0]
  row = compiled.program_row({'name': 'baseline', 'batch': 1,
                              'compiled': False, 'error': 'a | b'})
  assert row[:4] == ['baseline', 1, '-', '**no**: a / b'] and len(row) == 10


def test_cpu_stays_the_default_backend_with_libtpu_installed():
  """libtpu in the test install must not move the suite off the CPU: a
  plain process (this suite's XLA flags inherited) still gets CPU devices,
  and jax's TPU backend is not started until a topology is asked for."""
  out = subprocess.run(
      [sys.executable, '-c', 'import jax; print(jax.default_backend())'],
      capture_output=True, text=True, timeout=120, check=True)
  assert out.stdout.strip() == 'cpu', out.stderr[-2000:]


def test_a_widening_writes_each_device_its_shard():
  """'widen' (a small model widened to the target's config, as the
  'xxl_cost' models are) writes each device its shard of the widened
  tree, from the small model replicated: its output bytes per device are
  the target's shard, not the whole (as on a mesh without a 'model'
  axis)."""
  small = TINY.replace(emb_dim=128, num_heads=2, mlp_dim=256)
  setup = compiled.Setup(target=TINY, draft=small, param_dtype='float32')
  target = compiled.get_target(TARGET)
  out = {n: compiled.compile_program('widen', setup, target, num_partitions=n)
         for n in (1, 2)}
  assert all(f['compiled'] for f in out.values()), out
  mem = {n: f['memory'] for n, f in out.items()}
  shard = _param_bytes_per_device(TINY, MODEL_AXES)
  whole = _param_bytes_per_device(TINY, {})
  assert abs(mem[2]['output_bytes'] - shard) <= PAD, (mem, shard)
  assert abs(mem[1]['output_bytes'] - whole) <= PAD, (mem, whole)
  source = _param_bytes_per_device(small, {})
  assert abs(mem[2]['argument_bytes'] - (source + 8 + 4)) <= PAD, mem
