"""The method training scripts on a real (tiny) T5X checkpoint.

A tiny T5 1.1 target is written as a T5X checkpoint by our own training
code (`training.save_checkpoint` of `training.init_state`);
scripts/train_heads.py and scripts/train_pass.py train on it, run as
commands (a subprocess each), the reruns that resume them in this process
(their `main`). (What the trained weights buy is measured by
the heads and lookahead specs, tests/experiments/test_methods_spec.py.)
"""

import argparse
import json
import os
import pathlib
import runpy
import shutil
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from command_line import run_script
from specdec_jax import arrays
from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import network
from specdec_jax import training
from specdec_jax import models
from specdec_jax.drafters import heads

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEC = 't5_1_1_tiny,vocab_size=32,dtype=float32'
LENGTH = 10




def _copy_task(rows, seed):
  """inputs: random tokens + EOS; targets: the same tokens (a copy task)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, LENGTH - 1, rows)
  tokens = np.zeros((rows, LENGTH), np.int32)
  for i, n in enumerate(lengths):
    tokens[i, :n] = rng.integers(2, 32, n)
    tokens[i, n] = 1
  return {'inputs': tokens, 'targets': tokens.copy()}


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """(root, arrays dir, checkpoint) of a tiny target and a copy task."""
  root = tmp_path_factory.mktemp('method_scripts')
  data = root / 'arrays'
  for split, rows, seed in (('train', 64, 0), ('validation', 8, 1),
                            ('test', 16, 2)):
    arrays.save(str(data / 'copy' / f'{split}.npz'), _copy_task(rows, seed))
  # What training.train writes at step 0 (params + optimizer state, T5X
  # orbax layout); its few-step run would cost ~7 s more of compiling here.
  model = network.T5Model(models.config(SPEC))
  ckpt = training.save_checkpoint(training.init_state(model, seed=0),
                                  str(root / 'target'))
  return root, str(data), ckpt


def _params(path):
  return jax.tree.leaves(checkpoints.load_t5x_params(path))


def _main(script):
  """scripts/<script>.py's `main`, run in this process."""
  return runpy.run_path(str(ROOT / 'scripts' / f'{script}.py'))['main']


def test_heads_train_on_a_t5x_checkpoint_and_resume_exactly(tiny, gcs,
                                                            capsys):
  """A run to step 3 saves at 2 and 3; with its last checkpoint gone (a
  run stopped after its save at 2), the rerun resumes from step 2, mid
  chunk (AdamW's state, the chunk's rows and the batches' generator as
  saved), and ends with the uninterrupted run's head, bit for bit. Its
  --arrays and --export_dir are in a bucket (neither worked there once)."""
  root, data, ckpt = tiny
  assert ckpt.endswith('checkpoint_0')
  out = root / 'heads' / 'copy'
  for split in ('train', 'test'):  # --arrays in the bucket too
    arrays.save(f'{gcs}/arrays/copy/{split}.npz',
                arrays.load(f'{data}/copy', split))
  argv = ['--target', ckpt, '--target_config', SPEC, '--arrays',
          f'{gcs}/arrays',
          '--task', 'copy', '--out_dir', str(out), '--steps', '3',
          '--save_every', '2', '--batch_size', '4', '--positions', '4',
          '--mlp_dim', '16', '--depth', '1', '--chunk_rows', '32',
          '--eval_rows', '8', '--export_dir', f'{gcs}/export']
  run_script('train_heads', *argv)
  want = _params(str(out / 'checkpoint_3'))
  # What to ship: the head in bfloat16 and the log.
  assert checkpoints.read_bytes(f'{gcs}/export/log.jsonl') == (
      out / 'log.jsonl').read_bytes()
  exported = _params(f'{gcs}/export/checkpoint_3')
  assert {x.dtype for x in exported} == {np.dtype(jnp.bfloat16)}
  for got, expected in zip(exported, want, strict=True):
    np.testing.assert_array_equal(got, expected.astype(jnp.bfloat16))
  shutil.rmtree(out / 'checkpoint_3')
  capsys.readouterr()
  _main('train_heads')(argv)  # resumed (in this process: no new start)
  *_, said, last = capsys.readouterr().out.splitlines()
  # The same head, exported again: kept; another one is refused.
  assert said == f'exported {gcs}/export/checkpoint_3 (already there)'
  head, head_cfg = heads.load_head(str(out / 'checkpoint_3'),
                                   models.config(SPEC))
  with pytest.raises(checks.InputError, match='holds another head'):
    runpy.run_path(str(ROOT / 'scripts' / 'train_heads.py'))['export'](
        argparse.Namespace(export_dir=f'{gcs}/export', steps=3), str(out),
        jax.tree.map(lambda x: x + 1, head), head_cfg, models.config(SPEC))
  # The last line: where the run stands, its last figures, its files.
  assert last.startswith(f'{out}: complete at step 3 of 3 (step 3 trained '
                         'here, resumed at step 2; '), last
  assert ' s of training in all; loss ' in last
  assert '; held-out alpha by head step ' in last
  assert last.endswith(' (arrays copy test rows 0..7)); checkpoint_3, '
                       'log.jsonl'), last
  for got, expected in zip(_params(str(out / 'checkpoint_3')), want,
                           strict=True):
    np.testing.assert_array_equal(got, expected)
  log = [json.loads(line) for line in (out / 'log.jsonl').read_text(
      ).splitlines()]
  # The first run's records after its step-2 save are the rerun's.
  assert [r.get('step') for r in log] == [1, 3, None]
  assert len(log[-1]['held_out_alpha_t0']) == 1
  assert 'test rows 0..7' in log[-1]['rows']
  # Other settings of the head or the data: refused, each named (before:
  # resumed on the old data); more --eval_rows only measure: not a change.
  with pytest.raises(checks.InputError, match=(
      r'holds a run with other settings \(max_decode_len: 10 -> 6; '
      r'mlp_dim: 16 -> 8\)')):
    _main('train_heads')(argv + ['--mlp_dim', '8', '--max_decode_len', '6',
                                 '--eval_rows', '4'])


@pytest.mark.parametrize('held', [
    ('data/', 'checkpoint_60/', 'log.jsonl'),  # a PaSS run's folder
    ('checkpoint_2/draft_head.json', 'notes.txt'),  # a head, and else
    ('checkpoint_3/_CHECKPOINT_METADATA', 'log.jsonl'),  # not a head
])
def test_heads_refuse_an_export_dir_of_other_files(tiny, tmp_path, held):
  """An --export_dir holding anything but exported heads and their log is
  refused, naming what it holds, before training (before: the export
  replaced its log.jsonl)."""
  root, data, ckpt = tiny
  export = tmp_path / 'export'
  for name in held:
    if name.endswith('/'):
      (export / name).mkdir(parents=True)
    else:
      (export / name).parent.mkdir(parents=True, exist_ok=True)
      (export / name).write_text('{"step": 60}\n')
  with pytest.raises(checks.InputError, match=(
      f'--export_dir {export} holds '
      + ', '.join(sorted(n.split('/')[0] for n in held))
      + ': not exported heads \\(checkpoint_<step> with draft_head.json\\)')):
    _main('train_heads')([
        '--target', ckpt, '--target_config', SPEC, '--arrays', data,
        '--task', 'copy', '--out_dir', str(tmp_path / 'out'), '--steps',
        '3', '--batch_size', '4', '--mlp_dim', '16', '--depth', '1',
        '--export_dir', str(export)])
  for name in held:
    assert name.endswith('/') or (export / name).read_text() == (
        '{"step": 60}\n')
  assert not (tmp_path / 'out').exists()


def test_train_pass_on_a_t5x_checkpoint_into_a_bucket(tiny, gcs, capsys):
  """--out_dir at a gs:// address (the suite's local GCS): the data, the
  checkpoints and the log written there. With the last checkpoint gone (a
  run stopped after its save at step 2), a rerun resumes from the bucket
  (Adam's moments and the batches' generator as saved) and ends with the
  uninterrupted run's embeddings, bit for bit."""
  _, data, ckpt = tiny
  out = f'{gcs}/pass'
  argv = ('--target', ckpt, '--target_config', SPEC, '--arrays', data,
          '--task', 'copy', '--num_lookahead', '2', '--save_every', '2',
          '--batch_size', '4', '--positions', '4', '--max_decode_len',
          str(LENGTH), '--out_dir', out, '--steps', '3')
  run_script('train_pass', *argv)
  files = checkpoints.list_files(out)
  assert 'data/train-00000-of-00001.npz' in files and 'log.jsonl' in files
  assert any(f.startswith('checkpoint_2/') for f in files), files
  assert checkpoints.latest_checkpoint(out) == f'{out}/checkpoint_3'
  want = _params(f'{out}/checkpoint_3')
  for name in files:
    if name.startswith('checkpoint_3/'):
      checkpoints.delete(f'{out}/{name}')
  assert checkpoints.latest_checkpoint(out) == f'{out}/checkpoint_2'
  capsys.readouterr()
  _main('train_pass')(list(argv))  # resumed, in this process
  last = capsys.readouterr().out.splitlines()[-1]
  assert last.startswith(f'{out}: complete at step 3 of 3 (step 3 trained '
                         'here, resumed at step 2; '), last
  assert last.endswith('; checkpoint_3, log.jsonl'), last
  for got, expected in zip(_params(f'{out}/checkpoint_3'), want,
                           strict=True):
    np.testing.assert_array_equal(got, expected)
  log = [json.loads(line) for line in checkpoints.read_bytes(
      f'{out}/log.jsonl').decode().splitlines()]
  assert [r['step'] for r in log] == [1, 3]  # step 3's record once
  # A rerun with settings that change the data or the model is refused,
  # each named, before anything is written (before: it resumed on the old
  # data, or a traceback for another --num_lookahead); one asking for
  # fewer steps than the run holds is refused too (before: 'complete at
  # step 3 of 2').
  held = {name: checkpoints.read_bytes(f'{out}/{name}') for name in files
          if not name.startswith('checkpoint_3/')}
  other = list(argv) + ['--max_decode_len', '6', '--num_lookahead', '3',
                        '--train_rows', '8:40']
  with pytest.raises(checks.InputError, match=(
      r'holds a run with other settings \(max_decode_len: 10 -> 6; '
      r'num_lookahead: 2 -> 3; train_inputs: "\w+" -> "\w+"; train_rows: '
      r'":" -> "8:40"\)')):
    _main('train_pass')(other)
  with pytest.raises(checks.InputError, match=(
      r'/pass already holds step 3, more than the 2 asked')):
    _main('train_pass')(list(argv[:-1]) + ['2'])
  assert {name: checkpoints.read_bytes(f'{out}/{name}') for name in held
          } == held
  assert checkpoints.latest_checkpoint(out) == f'{out}/checkpoint_3'


def test_sigterm_saves_the_step_running_and_ends_as_killed(tiny, tmp_path,
                                                           capsys):
  """SIGTERM (a preemption's notice) during a PaSS run, sent here as its
  save at step 2 is copied up: step 3 runs, is saved although --save_every
  is 2, and the command ends saying so, with a killed process's status."""
  _, data, ckpt = tiny
  namespace = runpy.run_path(str(ROOT / 'scripts' / 'train_pass.py'))
  args = namespace['parse_flags']([
      '--target', ckpt, '--target_config', SPEC, '--arrays', data, '--task',
      'copy', '--num_lookahead', '2', '--save_every', '2', '--batch_size',
      '4', '--positions', '4', '--max_decode_len', str(LENGTH), '--out_dir',
      str(tmp_path), '--steps', '6'])
  sent = []

  def saved():
    if not sent:
      sent.append(os.kill(os.getpid(), signal.SIGTERM))

  with pytest.raises(SystemExit) as e:
    namespace['train'](args, str(tmp_path), saved)
  assert e.value.code == 128 + signal.SIGTERM
  assert checkpoints.latest_checkpoint(str(tmp_path)) == str(
      tmp_path / 'checkpoint_3')
  last = capsys.readouterr().out.splitlines()[-1]
  assert last.startswith(f'{tmp_path}: stopped at step 3 of 6 by SIGTERM '
                         '(steps 1-3 trained here; '), last
  assert last.endswith('); checkpoint_3, log.jsonl; rerun the same command '
                       'to continue'), last
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


@pytest.mark.parametrize('script, flag, message', [
    ('train_heads', '--steps=0', "--steps: an int >= 1 expected, got '0'"),
    ('train_heads', '--depth=two', "--depth: an int >= 1 expected, got 'two'"),
    ('train_heads', '--learning_rate=-1e-3',
     "--learning_rate: a finite number > 0 expected, got '-1e-3'"),
    ('train_pass', '--batch_size=0', '--batch_size: an int >= 1 expected'),
    ('train_pass', '--train_rows=64-256',
     "--train_rows: rows start:stop expected, got '64-256'"),
    ('train_shipped_models', '--drafters=small_fkl,tiny_fkl',
     "--drafters: unknown ['tiny_fkl']; known: xxl_ref,"),
    ('train_shipped_models', '--stages=target,train', "--stages: unknown"),
    ('train_shipped_models', '--target_lrs=0.01,0',
     "--target_lrs: a finite number > 0 expected, got '0'"),
    ('train_shipped_models', '--gen_examples=0', '--gen_examples: an int'),
    ('train_shipped_models', '--work_dir=gs://b/w',
     "--work_dir: a local path expected (its files are written here), got "
     "'gs://b/w'"),
    ('train_shipped_models', '--seed=small_fkl',
     "--seed: RUN=CHECKPOINT expected"),
    ('train_heads', '--weight_decay=nan',
     "--weight_decay: a finite number >= 0 expected, got 'nan'"),
    ('train_pass', '--seed=-1', "--seed: an int >= 0 expected, got '-1'"),
])
def test_a_bad_count_or_rate_is_the_parsers_error(script, flag, message,
                                                  capsys):
  """Before anything loads or trains (before: --steps 0 was optax's
  'decay_steps=-1', --batch_size 0 a ZeroDivisionError, --depth 0 an
  error from inside jax, a negative learning rate trained, and an unknown
  drafter was found after the target's hours of training; a negative
  seed was numpy's traceback after the data's generation, and a nan
  weight decay trained to a loss of nan)."""
  namespace = runpy.run_path(str(ROOT / 'scripts' / f'{script}.py'))
  where = (['--arrays', '/no/such/arrays', '--work_dir', '/no/such/work']
           if script == 'train_shipped_models' else
           ['--out_dir', '/no/such/out'])
  with pytest.raises(SystemExit) as e:
    namespace['parse_flags'](where + [flag])
  assert e.value.code == 2
  assert f'error: argument {message}' in capsys.readouterr().err


@pytest.mark.parametrize('script', ['train_heads', 'train_pass'])
def test_a_checkpoint_not_found_ends_the_command_in_one_line(
    script, tmp_path, monkeypatch, capsys):
  """A checkpoint, data or value the script's job refuses as it loads is
  its one line (`checks.REFUSED`, the scripts' `__main__`), not a
  traceback."""
  monkeypatch.setattr(sys, 'argv', [
      script, '--target', str(tmp_path / 'checkpoint_1'), '--target_config',
      't5_1_1_small', '--arrays', str(tmp_path), '--out_dir',
      str(tmp_path / 'out')])
  with pytest.raises(SystemExit) as e:
    runpy.run_path(str(ROOT / 'scripts' / f'{script}.py'),
                   run_name='__main__')
  assert str(e.value.code).startswith('error: '), e.value.code
  assert 'checkpoint_1' in str(e.value.code)
  assert 'Traceback' not in capsys.readouterr().err


@pytest.mark.parametrize('script', ['train_heads', 'train_pass'])
def test_an_out_dir_of_another_program_is_refused_in_one_line(
    script, tiny, tmp_path, monkeypatch, capsys):
  """A train.py model dir as --out_dir: refused in one line naming what it
  holds, before anything is written into it (before: PaSS wrote data/
  there, then a traceback from the model's checkpoint)."""
  root, data, ckpt = tiny
  model_dir = tmp_path / 'model'
  shutil.copytree(root / 'target', model_dir)
  before = sorted(os.listdir(model_dir))
  monkeypatch.setattr(sys, 'argv', [
      script, '--target', ckpt, '--target_config', SPEC, '--arrays', data,
      '--task', 'copy', '--out_dir', str(model_dir)])
  with pytest.raises(SystemExit) as e:
    runpy.run_path(str(ROOT / 'scripts' / f'{script}.py'),
                   run_name='__main__')
  assert str(e.value.code) == (
      f'error: {model_dir} holds {", ".join(before)} and no settings.json: '
      f'not a run of {script}.py (another program\'s folder, or a run from '
      'before runs recorded their settings); give another --out_dir, a new '
      'or empty one.')
  assert 'Traceback' not in capsys.readouterr().err
  assert sorted(os.listdir(model_dir)) == before


@pytest.mark.parametrize('script, flags, message', [
    ('train_heads', ['--target', '/no/such/checkpoint_1'],
     'is a checkpoint path: give its --target_config'),
    ('train_pass', ['--target', '/no/such/checkpoint_1'],
     'is a checkpoint path: give its --target_config'),
    ('train_pass', ['--target', '/no/such/checkpoint_1', '--arrays', '/a',
                    '--target_config', 't5_1_1_tiny,nofield=1'],
     "--target_config 't5_1_1_tiny,nofield=1': T5Config has no field(s) "
     "['nofield']"),
    ('train_heads', ['--target_config', 't5_1_1_tiny'],
     '--target_config is for a checkpoint --target; shipped:target is a '
     'shipped model, whose config ships with it'),
    ('train_heads', ['--train_rows', '8', '--batch_size', '16'],
     '--train_rows 8 is fewer than --batch_size 16'),
])
def test_model_flags_are_checked_by_the_parser(script, flags, message,
                                               capsys):
  """A checkpoint needs its config, a config must be one (before: models.
  config's traceback as the model loaded), a shipped model's is refused
  (before: ignored), and a batch needs as many rows (before: numpy's
  traceback once the data was generated)."""
  namespace = runpy.run_path(str(ROOT / 'scripts' / f'{script}.py'))
  with pytest.raises(SystemExit) as e:
    namespace['parse_flags'](flags + ['--out_dir', '/no/such/out'])
  assert e.value.code == 2  # argparse's usage error
  assert message in capsys.readouterr().err


@pytest.mark.parametrize('case', [
    'train_pass_rows', 'stages_without_target', 'seed_not_there',
    'training_log', 'models_json', 'measured_folder', 'compile_profiles',
    'fuzz_log'])
def test_bad_input_ends_a_command_in_one_line_before_its_work(
    case, tiny, tmp_path, monkeypatch, capsys):
  """Each command (its `__main__`) refuses these in one line, writing
  nothing (before: a traceback each, after the data's generation for
  train_pass's rows; the work dir made for train_shipped_models')."""
  _, data, ckpt = tiny
  out = tmp_path / 'out'  # where a command would write: never made
  models_log = tmp_path / 'models' / 'en_de_mini_small' / 'log.jsonl'
  models_log.parent.mkdir(parents=True)
  models_log.write_text('[1, 2]\n')
  (tmp_path / 'export').mkdir()
  (tmp_path / 'export' / 'models.json').write_text('[]')
  (tmp_path / 'fuzz.jsonl').write_text('{bad\n')
  script, argv, said = {  # the command, its flags, its line
      'train_pass_rows': (
          'scripts/train_pass.py',
          ['--target', ckpt, '--target_config', SPEC, '--arrays', data,
           '--task', 'copy', '--train_rows', '0:3', '--batch_size', '4',
           '--out_dir', str(out)],
          '--train_rows 0:3 of copy are 3 rows, fewer than --batch_size 4'),
      'stages_without_target': (
          'scripts/train_shipped_models.py',
          ['--arrays', data, '--work_dir', str(out), '--stages', 'export'],
          f"--stages export needs the target stage's {out}/target.json"),
      'seed_not_there': (
          'scripts/train_shipped_models.py',
          ['--arrays', data, '--work_dir', str(out), '--seed',
           f'small_fkl={tmp_path}/no'],
          f'--seed small_fkl={tmp_path}/no: {tmp_path}/no is not a '
          'checkpoint folder'),
      'training_log': (
          'scripts/training_report.py',
          ['--models_dir', str(tmp_path / 'models'), '--tasks', 'en_de',
           '--out_dir', str(out)],
          f'{models_log} is no training log of scripts/train.py'),
      'models_json': (
          'scripts/ship_models.py',
          ['measure', '--export_dir', str(tmp_path / 'export'), '--out',
           str(out / 'a.json')],
          f'--export_dir: {tmp_path}/export/models.json is not the '
          'models.json of'),
      'measured_folder': (
          'scripts/ship_models.py',
          ['report', '--measured', str(tmp_path), '--out',
           str(out / 'a.json')],
          f'--measured: {tmp_path} is a folder, not the json of'),
      'compile_profiles': (
          'tests/compile_profile.py', [str(tmp_path)],
          f'{tmp_path} holds no compile-*.json'),
      'fuzz_log': (
          'tests/fuzz_exactness.py',
          ['--greedy', '1', '--out', str(tmp_path / 'fuzz')],
          f'{tmp_path}/fuzz.jsonl line 1 is not a case'),
  }[case]
  monkeypatch.setattr(sys, 'argv', [script, *argv])
  # fuzz_exactness sets XLA_FLAGS as a program (this process's jax has
  # started: no effect); restored after.
  monkeypatch.setitem(os.environ, 'XLA_FLAGS', os.environ.get('XLA_FLAGS',
                                                              ''))
  with pytest.raises(SystemExit) as e:
    runpy.run_path(str(ROOT / script), run_name='__main__')
  assert str(e.value.code).startswith(f'error: {said}'), e.value.code
  assert 'Traceback' not in capsys.readouterr().err
  assert not out.exists()
