"""The method scripts on a real (tiny) T5X checkpoint, and their predictions.

A tiny T5 1.1 target is written as a T5X checkpoint by our own training
code (`training.save_checkpoint` of `training.init_state`);
scripts/train_heads.py trains a head on it and scripts/benchmark_heads.py
measures it (greedy rows identical to the baseline; the predicted column
comes from a named hardware profile). Every committed predicted column of
the method scripts' results must be what `--repredict` gives from the
file's own measured values.
"""

import json
import pathlib
import shutil

import numpy as np
import pytest

from script_modules import load_script
from specdec_jax import arrays
from specdec_jax import network
from specdec_jax import training
from specdec_jax.bench import hardware
from specdec_jax.bench import models

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


def test_heads_train_and_benchmark_on_a_t5x_checkpoint(tiny):
  root, data, ckpt = tiny
  assert ckpt.endswith('checkpoint_0')
  target = ['--target', ckpt, '--target_config', SPEC, '--arrays', data]
  load_script('train_heads').main(target + [
      '--task', 'copy', '--out_dir', str(root / 'heads' / 'copy'),
      '--steps', '3', '--save_every', '3', '--batch_size', '4',
      '--positions', '4', '--mlp_dim', '16', '--depth', '1',
      '--chunk_rows', '32', '--eval_rows', '8'])
  assert (root / 'heads' / 'copy' / 'checkpoint_3').is_dir()
  log = [json.loads(line) for line in
         (root / 'heads' / 'copy' / 'log.jsonl').read_text().splitlines()]
  assert len(log[-1]['held_out_alpha_t0']) == 1
  assert 'test rows 0..7' in log[-1]['rows']

  out = root / 'bench' / 'heads'
  bench = load_script('benchmark_heads')
  result = bench.main(target + [
      '--draft', ckpt, '--draft_config', SPEC, '--tasks', 'copy',
      '--heads_dir', str(root / 'heads'), '--temperatures', '0',
      '--max_gamma', '1', '--draft_gamma', '2', '--num_examples', '3',
      '--alpha_examples', '1', '--repeats', '1', '--c_sizes', '',
      '--out', str(out)])
  saved = json.loads(out.with_suffix('.json').read_text())
  assert saved['profile'] == hardware.H100 == result['profile']
  assert saved['target'] == ckpt and saved['target_config']['emb_dim'] == 8
  assert [r['gamma'] for r in saved['rows']] == [2, 1]
  for r in saved['rows']:
    assert r['identical'] == '3/3', r
    assert r['predicted']['profile'] == hardware.H100
    assert r['predicted']['label'].startswith(f'predicted on {hardware.H100}')
    assert r['predicted']['speedup'] > 0
  head_c = saved['heads']['copy']['predicted_c']
  assert head_c['c_how'] == hardware.BYTES_MODEL
  assert 'c bytes / launches model' in saved['rows'][1]['predicted']['label']
  md = out.with_suffix('.md').read_text()
  assert f'predicted on profile {hardware.H100}' in md
  assert 'through bench.hardware.predict' in md
  assert out.with_name('heads_alpha.png').is_file()
  # --repredict from the json gives the same predicted column.
  again = bench.main(['--repredict', str(out.with_suffix('.json'))])
  assert ([r['predicted'] for r in again['rows']] ==
          [r['predicted'] for r in saved['rows']])


def test_train_pass_on_a_t5x_checkpoint(tiny):
  root, data, ckpt = tiny
  load_script('train_pass').main([
      '--target', ckpt, '--target_config', SPEC, '--arrays', data,
      '--task', 'copy', '--num_lookahead', '2', '--steps', '2',
      '--save_every', '2', '--batch_size', '4', '--positions', '4',
      '--max_decode_len', str(LENGTH), '--out_dir', str(root / 'pass')])
  assert (root / 'pass' / 'checkpoint_2').is_dir()


@pytest.mark.parametrize('script', ['benchmark_pass', 'benchmark_heads',
                                    'benchmark_draft_free', 'train_heads',
                                    'train_pass'])
def test_a_checkpoint_path_needs_its_config(script, capsys):
  argv = ['--target', '/no/such/checkpoint_1']
  if script.startswith('train'):
    argv += ['--out_dir', '/no/such/out']
  with pytest.raises(SystemExit):
    load_script(script).main(argv)
  err = capsys.readouterr().err
  assert 'is a checkpoint path: give its --target_config' in err


def _without(d, keys):
  if isinstance(d, dict):
    return {k: _without(v, keys) for k, v in d.items() if k not in keys}
  if isinstance(d, list):
    return [_without(v, keys) for v in d]
  return d


@pytest.mark.parametrize('script,path', [
    ('benchmark_pass', 'results/pass_shipped.json'),
    ('benchmark_heads', 'results/heads_shipped.json'),
    ('benchmark_draft_free', 'results/draft_free/draft_free.json'),
])
def test_committed_predictions_are_what_repredict_gives(tmp_path, script,
                                                        path):
  committed = ROOT / path
  copy = tmp_path / committed.name
  shutil.copy(committed, copy)
  load_script(script).main(['--repredict', str(copy)])
  want = json.loads(committed.read_text())
  assert want['profile'] == hardware.H100
  # table2: Table 2's own predictions, reread from its results file.
  keys = {'predicted_by', 'table2'}
  assert (_without(json.loads(copy.read_text()), keys) ==
          _without(want, keys))
  lines = lambda p: [x for x in p.read_text().split('For comparison')[0]
                     .splitlines() if 'recomputed' not in x]
  assert lines(copy.with_suffix('.md')) == lines(committed.with_suffix('.md'))
  assert 'through bench.hardware.predict' in committed.with_suffix(
      '.md').read_text()
