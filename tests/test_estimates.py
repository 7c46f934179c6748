"""The estimates report: the compiler's counts as a roofline and a profile.

`specdec_jax.estimates` turns what `specdec_jax.compiled` says
of each program and step into the largest batch, roofline times, a
`hardware.HardwareProfile` and the paper's Table 2 on it. These tests check
the roofline and the batch line, that the profile goes through the one
`hardware.predict`, and that every committed results/compiled/ page is what
the command writes again from its json's counts.
"""

import json
import logging
import pathlib
import shutil

import pytest

from specdec_jax import checks
from specdec_jax import compiled
from specdec_jax import hardware
from specdec_jax import estimates

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted(p.stem for p in (ROOT / 'results' / 'compiled').glob('*.json'))
assert PAGES, 'no committed results/compiled pages found'  # never skipped


def test_roofline_and_largest_batch():
  """The estimate is the larger of the flops and bytes bounds (plus the
  per-op overhead), and the largest batch follows the bytes' line."""
  chip = compiled.CHIPS['v5e']
  assert estimates.roofline_s(197e12, 819e9, chip) == pytest.approx(1.0)
  assert estimates.roofline_s(0, 409.5e9, chip, ops=10, overhead_s=0.01) == (
      pytest.approx(0.6))
  # A v4 device is one of the chip's two TensorCores: half its figures.
  assert estimates.roofline_s(0, 600e9, compiled.CHIPS['v4']) == (
      pytest.approx(1.0))
  gib = compiled.GIB
  assert estimates.largest_batch({8: 10 * gib, 32: 22 * gib}, 32 * gib) == 52
  assert estimates.largest_batch({8: 10 * gib, 32: 22 * gib}, 32 * gib,
                                multiple=8) == 48
  assert estimates.largest_batch({1: 40 * gib, 8: 41 * gib}, 32 * gib) is None
  assert estimates.largest_batch({1: gib}, 32 * gib) is None  # One point.


def test_estimated_profile_goes_through_the_one_predict():
  """The compiler's step counts become a `hardware.HardwareProfile` whose
  prediction is Theorem 3.8 (t(k) bytes-bound: cost 1; c = byte ratio)."""
  step = lambda b: {'cost': {'flops': 1.0, 'bytes_accessed': b},
                    'hlo': {'entry_ops': 100}}
  steps = {1: {k: step(819e9) for k in range(1, 9)}}
  # Batch 32's target step did not compile (too big): its drafter's c has
  # no t(1) and is left out, not an error.
  profile = estimates.estimated_profile(
      compiled.get_target('tpu:v5e:1x1'), steps,
      {1: {'small': step(16.38e9)}, 32: {'small': step(16.38e9)}})
  assert profile.batches() == (1,)
  assert profile.t1_ms == pytest.approx(1000.0)
  assert profile.c[1]['small'] == pytest.approx(0.02)
  p = hardware.predict(profile, alpha=0.75, gamma=7, drafter='small')
  assert p.speedup == pytest.approx(
      (1 - 0.75 ** 8) / (0.25 * (7 * 0.02 + 1)))
  assert estimates.ESTIMATED in profile.name


@pytest.mark.parametrize('stem', PAGES)
def test_committed_pages_are_what_reestimate_writes(tmp_path, monkeypatch,
                                                    stem):
  """Each committed results/compiled/ page and json is what
  `--reestimate` writes again from the compiler's counts the json holds
  (with this code's chip figures, Table 2 and drafters' alpha): a change
  to the estimates shows as a changed page, never as a stale one. The
  json's command is the estimates command, whose flags it parses again."""
  committed = ROOT / 'results' / 'compiled' / f'{stem}.json'
  copy = tmp_path / committed.name
  shutil.copy(committed, copy)
  monkeypatch.chdir(ROOT)  # --alphas is relative to the repository
  estimates.reestimate(str(copy))
  want = json.loads(committed.read_text())
  assert want['command'].startswith(estimates.COMMAND + ' ')
  got = json.loads(copy.read_text())
  for r in (want, got):
    r.pop('reestimated_by', None)
  assert got == want
  assert copy.with_suffix('.md').read_text() == (
      committed.with_suffix('.md').read_text())


def test_a_missing_compiler_ends_the_command_in_one_line(monkeypatch,
                                                         tmp_path):
  """A target whose compiler plugin is not installed (as on a machine
  without the CUDA plugin): the fix in one line, nothing written."""
  def missing(*args, **kwargs):
    raise compiled.BackendMissing('no CUDA plugin: pip install ...')
  monkeypatch.setattr(compiled, 'compile_program', missing)
  level = logging.getLogger().level
  with pytest.raises(SystemExit) as e:
    estimates.main(['--target=gpu:h100', '--programs=baseline', '--ks=',
                    f'--out_dir={tmp_path}'])
  assert e.value.code == 'error: no CUDA plugin: pip install ...'
  assert logging.getLogger().level == level  # a caller's, restored
  assert not list(tmp_path.iterdir())


def test_the_paper_table_needs_its_steps_and_alphas_before_compiling(
    tmp_path):
  """--paper_table without the steps (--ks=) or with an --alphas file that
  is not there: refused before any compile (the table was left out, or its
  alphas an error inside the results, after every program compiled)."""
  common = ['--target=tpu:v4:1x1x1', '--paper_table', f'--out_dir={tmp_path}']
  with pytest.raises(checks.InputError, match='--paper_table is of the st'):
    estimates.main(common + ['--ks='])
  with pytest.raises(checks.InputError, match="--alphas '.*none.json': no"):
    estimates.main(common + [f'--alphas={tmp_path}/none.json'])
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize('content,error', [
    (None, 'FileNotFoundError'), ('[1]', 'TypeError'),
    ('{"spec": "table2"}', "KeyError: 'command'"),
    ('{"command"', 'InputError: .* is not valid JSON'),
])
def test_reestimate_says_a_file_it_cannot_read_in_one_line(
    tmp_path, content, error):
  """`--reestimate` of a file that is no estimates results (none, not
  JSON, another kind of results) ends in one line naming it."""
  path = tmp_path / 'r.json'
  if content is not None:
    path.write_text(content)
  with pytest.raises(SystemExit, match=(
      f'error: {path} is no estimates file to reestimate: {error}')):
    estimates.main([f'--reestimate={path}'])


@pytest.mark.parametrize('flag, message', [
    # Before: compiled first, then a FileExistsError, nothing written.
    ('--out_dir={file}', "--out_dir '{file}' cannot be a folder: {file} is "
     'a file'),
    # Before: a traceback from inside the model, once --ks's steps compile.
    ('--model_fields=num_heads=0', '--model_fields.num_heads must be an int '
     '>= 1, got 0'),
])
def test_a_bad_flag_is_the_parsers_error_before_anything_compiles(
    tmp_path, capsys, flag, message):
  """A folder the results cannot go to, a model no T5 can be: the
  parser's one line (exit status 2), before anything compiles."""
  file = tmp_path / 'afile'
  file.write_text('')
  with pytest.raises(SystemExit) as e:
    estimates.parse_flags(['--target=tpu:v5e:1x1', '--ks=1',
                           flag.format(file=file)])
  assert e.value.code == 2
  assert message.format(file=file) in capsys.readouterr().err


def test_file_flags_expand_the_home_folder(monkeypatch, tmp_path):
  """--reestimate and --alphas as --out_dir: a quoted '~' (as the shell
  leaves it) is the home folder, not a folder named '~'."""
  monkeypatch.setenv('HOME', str(tmp_path))
  args = estimates.parse_flags(['--reestimate=~/r.json'])
  assert args.reestimate == str(tmp_path / 'r.json')
  args = estimates.parse_flags(['--target=tpu:v5e:1x1',
                                '--alphas=~/alpha.json', '--out_dir=~/out'])
  assert (args.alphas, args.out_dir) == (str(tmp_path / 'alpha.json'),
                                         str(tmp_path / 'out'))


def test_ctrl_c_keeps_the_programs_that_finished(monkeypatch, tmp_path,
                                                 capsys):
  """Ctrl-C in a later compile: the json and page hold the programs that
  finished (written after each), and the command ends with one line and
  the signal's exit status (which `checks.run_main` leaves at once), not a
  KeyboardInterrupt's traceback with nothing written."""
  gib = compiled.GIB

  def compile_program(name, setup, target, num_partitions):
    del setup, num_partitions
    if name != 'baseline':
      raise KeyboardInterrupt
    return {'program': f'{name} on {target.name}', 'compiled': True,
            'fits': True, 'compile_s': 1.0, 'cost': {},
            'memory': {'argument_bytes': gib, 'temp_bytes': gib,
                       'peak_bytes': 2 * gib},
            'hlo': {'entry_while_loops': 1, 'host_transfers': 0}}
  monkeypatch.setattr(compiled, 'compile_program', compile_program)
  try:
    estimates.main(['--target=tpu:v5e:1x1', '--programs=baseline,t5',
                    '--batches=1', '--ks=', f'--out_dir={tmp_path}'])
    error = None
  except BaseException as e:  # pylint: disable=broad-except
    error = e
  assert isinstance(error, SystemExit) and error.code == 130, repr(error)
  path = tmp_path / 'tpu_v5e_1x1.json'
  assert f'stopped by SIGINT: {path} holds what finished: programs: 1' in (
      capsys.readouterr().out)
  assert [f['name'] for f in json.loads(path.read_text())['programs']] == [
      'baseline']
  assert '| baseline | 1 | - | yes | 1.00 | 1.00 | 2.00 | yes |' in (
      path.with_suffix('.md').read_text())
