"""The benchmark scripts' predicted figures, profile and shipping.

Every committed predicted column must be what `hardware.predict`
gives from the file's own measured values (each script's `--repredict`,
run as a command, reproduces it), the CPU costs run must write the profile
its json gives (`bench.costs`), the mesh's on-paper figures must come from
a profile (`bench.tensor_parallel`), and shipping the T5s
(scripts/ship_models.py, run as a command) must keep the method weights
already shipped.
"""

import hashlib
import json
import pathlib
import runpy
import shutil
import sys

import numpy as np
import pytest

from command_line import refusal
from command_line import run_script
from specdec_jax import arrays
from specdec_jax import checks
from specdec_jax import shipped
from specdec_jax.bench import costs
from specdec_jax import hardware
from specdec_jax.bench import tensor_parallel

ROOT = pathlib.Path(__file__).resolve().parents[1]




def _without(d, keys):
  if isinstance(d, dict):
    return {k: _without(v, keys) for k, v in d.items() if k not in keys}
  if isinstance(d, list):
    return [_without(v, keys) for v in d]
  return d


def _md_lines(text):
  return [line for line in text.splitlines()
          if 'recomputed' not in line]


@pytest.mark.parametrize('script,stem', [
    ('benchmark_mesh', 'mesh_cpu'),
])
def test_committed_predictions_are_what_predict_gives(tmp_path, script, stem):
  committed = ROOT / 'results' / f'{stem}.json'
  copy = tmp_path / f'{stem}.json'
  shutil.copy(committed, copy)
  run_script(script, '--repredict', str(copy))
  keys = {'predicted_by', 'out'}
  want = _without(json.loads(committed.read_text()), keys)
  assert _without(json.loads(copy.read_text()), keys) == want
  assert _md_lines(copy.with_suffix('.md').read_text()) == _md_lines(
      committed.with_suffix('.md').read_text())
  assert ('through hardware.predict' in
          committed.with_suffix('.md').read_text())


@pytest.mark.parametrize('args,said', [
    (['--meshes', '0,3'], 'argument --meshes'),
    (['--allreduce_latency_us', '-1'], 'argument --allreduce_latency_us'),
    (['--repredict', 'ALPHA'], 'not a results file'),
])
def test_mesh_refuses_its_flags_before_work(tmp_path, args, said, capsys,
                                            monkeypatch):
  alpha = tmp_path / 'alpha.json'
  alpha.write_text('{"alpha": 0.5}')
  message = refusal('benchmark_mesh', '--out', str(tmp_path / 'mesh'), *[
      a.replace('ALPHA', str(alpha)) for a in args], capsys=capsys,
                    monkeypatch=monkeypatch)
  assert said in message, message
  assert alpha.read_text() == '{"alpha": 0.5}'
  assert sorted(p.name for p in tmp_path.iterdir()) == ['alpha.json']


def test_costs_run_writes_the_profile_its_json_gives(tmp_path):
  run = json.loads((ROOT / 'results' / 'costs.json').read_text())
  run.update(drafter=costs.DRAFTER_NAME, target=costs.TARGET_DESCRIPTION,
             date='2026-01-01')
  profile, path = costs.write_results(tmp_path / 'results', run, '# costs\n',
                                      tmp_path / 'profiles')
  assert path == tmp_path / 'profiles' / f'{hardware.CPU}.json'
  assert profile.name == hardware.CPU == costs.profile_name(run['machine'])
  loaded = hardware.load(str(path))
  assert loaded.to_json() == profile.to_json()
  assert loaded.c[1] == {costs.DRAFTER_NAME: run['c']}
  assert loaded.target == costs.TARGET_DESCRIPTION
  assert loaded.date == '2026-01-01'
  assert loaded.source.endswith('results/costs.json')
  # Everything measured is the committed CPU profile's.
  committed = hardware.load(hardware.CPU)
  assert loaded.cost == committed.cost and loaded.t1_ms == committed.t1_ms
  assert (tmp_path / 'results' / 'costs.md').read_text() == '# costs\n'


def test_the_committed_profiles_are_their_runs_written_again(
    tmp_path, monkeypatch, capsys):
  """`python -m specdec_jax.hardware RUN.json` writes the profile the
  committed one is (each kind of run); what is no run is one line."""
  committed = {n: hardware.load(n) for n in hardware.names()}
  monkeypatch.setattr(hardware, 'PROFILES_DIR', tmp_path)
  for name, profile in committed.items():
    hardware.main([str(ROOT / profile.source)])
    assert hardware.load(name).to_json() == profile.to_json(), name
  (tmp_path / 'not_a_run.json').write_text('{}')
  for given, said in ((tmp_path / 'not_a_run.json', "KeyError: 't_target"),
                      (tmp_path / 'absent.json', 'No such file')):
    with pytest.raises(SystemExit) as e:
      checks.run_main(hardware.main, [str(given)])
    assert str(e.value.code).startswith('error: ') and said in str(
        e.value.code), e.value.code
  capsys.readouterr()


@pytest.mark.parametrize('script,args,said', [
    ('benchmark_costs', ['--repeats', '1', '--profile_dir', 'FILE'],
     'error: --profile_dir'),
    ('benchmark_baseline', ['--repeats', '1', '--decode_len', '1',
                            '--input_len', '1', '--out_dir', 'FILE/x'],
     'error: --out_dir'),
])
def test_benchmarks_refuse_their_flags_before_measuring(tmp_path, script,
                                                       args, said):
  (tmp_path / 'file').write_text('')
  proc = run_script(script, *[a.replace('FILE', str(tmp_path / 'file'))
                              for a in args], check=False)
  assert proc.returncode in (1, 2) and said in proc.stderr, proc.stderr
  assert 'Traceback' not in proc.stderr and not proc.stdout, proc.stdout


def test_mesh_on_paper_comes_from_the_profile():
  profile = hardware.load(hardware.H100)
  link, latency = 450e9, 10e-6
  paper = tensor_parallel.on_paper(profile, link, latency, tokens=1)
  comm = 73 * (latency + 2 * 7 / 8 * 4096 * 2 / link)
  assert paper['allreduces_per_call'] == 73
  assert paper['call_ms'] == pytest.approx(profile.t1_ms / 8 + 1e3 * comm)
  tp = tensor_parallel.tensor_parallel_profile(profile, link, latency)
  assert tp.t1_ms == pytest.approx(paper['call_ms'])
  assert tp.c[1]['dec2'] == pytest.approx(
      profile.c[1]['dec2'] * profile.t1_ms / tp.t1_ms)
  assert 'assumed' in tp.name
  rows = tensor_parallel.on_paper_speedups(profile, link, latency,
                                           alpha=0.7)['rows']
  one = [r for r in rows if r['chips'] == 1 and r['drafter'] == 'dec2'][0]
  assert one['speedup'] == round(hardware.predict(
      profile, alpha=0.7, drafter='dec2').speedup, 2)
  # No hardware figure typed by hand (the scripts' and the package's code:
  # tests/bench/test_bench.py).
  assert not hasattr(tensor_parallel, 'HARDWARE')
  assert not hasattr(tensor_parallel, 'DRAFT_MS')


def _sha(path):
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _fake_export(root):
  """An export folder of two models (a file each) as train_shipped_models."""
  cfg = json.loads((ROOT / 'specdec_jax' / 'assets' / 'mini' /
                    'models.json').read_text())['models']['dec2']['config']
  models = {}
  for name, kind, step in (('target', 'xxl', 5), ('dec2_fkl', 'dec2', 3)):
    ckpt = root / name / f'checkpoint_{step}'
    (ckpt / 'state').mkdir(parents=True)
    (ckpt / 'state' / 'data').write_bytes(name.encode())
    models[name] = dict(kind=kind, checkpoint=f'{name}/checkpoint_{step}',
                        config=cfg, step=step, validation=None)
  (root / 'models.json').write_text(json.dumps(dict(
      models=models, target={'checkpoint': 'x'}, command='python train')))


def test_shipping_keeps_the_method_weights(tmp_path, monkeypatch, capsys):
  shipped_dir = pathlib.Path(shipped.ASSETS_DIR)
  index = json.loads((shipped_dir / shipped.MODELS).read_text())
  assert index.get('methods'), 'nothing to keep: the test needs methods'
  assets = tmp_path / 'assets'
  assets.mkdir()
  for name in ('models.json', 'MANIFEST.json', 'small', 'heads',
               'lookahead'):
    src = shipped_dir / name
    (shutil.copytree if src.is_dir() else shutil.copy)(src, assets / name)
  method_files = {
      rel: _sha(assets / rel) for rel in json.loads(
          (shipped_dir / 'MANIFEST.json').read_text())
      if rel.split('/')[0] in ('heads', 'lookahead')}
  assert method_files
  _fake_export(tmp_path / 'export')
  for task_dir in ('debian_desc_en_de', 'debian_synopsis'):
    arrays.save(str(tmp_path / 'arrays' / task_dir / 'test.npz'),
                {'inputs': np.ones((4, 6), np.int32),
                 'targets': np.ones((4, 5), np.int32)})
  monkeypatch.setenv('SPECDEC_DATA_DIR', str(ROOT / 'tests' / 'testdata' /
                                             'debian'))
  ship = ['ship', '--export_dir', str(tmp_path / 'export'), '--arrays',
          str(tmp_path / 'arrays'), '--models', 'target,dec2_fkl',
          '--assets', str(assets), '--slice_examples', '2']
  # A bad input is refused before the folder is touched.
  before = _tree(assets)
  refused = lambda *args: refusal('ship_models', *args, capsys=capsys,
                                  monkeypatch=monkeypatch)
  typo = ship[:6] + ['target,dec2_fk'] + ship[7:]
  said = refused(*typo)
  assert said.startswith("error: --models: ['dec2_fk']"), said
  assert _tree(assets) == before
  # A folder that holds no shipped set is not emptied.
  other = tmp_path / 'other'
  other.mkdir()
  (other / 'notes.txt').write_text('mine')
  said = refused(*ship[:-3], str(other), *ship[-2:])
  assert said.startswith('error: ') and 'no shipped set' in said, said
  assert _tree(other) == {'notes.txt': _sha(other / 'notes.txt')}
  run_script('ship_models', *ship)
  assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')]

  new = json.loads((assets / 'models.json').read_text())
  assert list(new['models']) == ['target', 'dec2']
  assert new['methods'] == index['methods']
  assert not (assets / 'small').exists()  # the old T5s are replaced
  manifest = json.loads((assets / 'MANIFEST.json').read_text())
  for rel, sha in method_files.items():
    assert _sha(assets / rel) == sha, rel
    assert manifest[rel]['sha256'] == sha, rel
  assert shipped.verify(root=str(assets)) == len(manifest)
  monkeypatch.setenv('SPECDEC_ASSETS', str(assets))
  assert shipped.method_names() == list(index['methods'])
  assert pathlib.Path(shipped.resolve('shipped:heads/en_de')).is_dir()

  # A listed method whose weights are gone stops the next ship.
  shutil.rmtree(assets / 'lookahead')
  said = refused(*ship)
  assert said.startswith('error: ') and 'not there' in said, said
  assert (assets / 'heads').is_dir() and (assets / 'models.json').is_file()
  # Method weights that no models.json lists are not dropped.
  (assets / 'models.json').unlink()
  before = _tree(assets)
  said = refused(*ship)
  assert said.startswith('error: ') and 'no models.json' in said, said
  assert _tree(assets) == before


def _tree(folder):
  return {str(p.relative_to(folder)): _sha(p)
          for p in folder.rglob('*') if p.is_file()}


def test_measure_and_report_check_their_inputs_first(tmp_path, monkeypatch,
                                                     capsys):
  _fake_export(tmp_path / 'export')  # its checkpoints do not load
  for task_dir in ('debian_desc_en_de', 'debian_synopsis'):
    arrays.save(str(tmp_path / 'arrays' / task_dir / 'test.npz'),
                {'inputs': np.ones((4, 6), np.int32),
                 'targets': np.ones((4, 5), np.int32)})
  monkeypatch.setenv('SPECDEC_DATA_DIR', 'shipped')
  (tmp_path / 'file').write_text('')
  measure = ['measure', '--export_dir', str(tmp_path / 'export'),
             '--arrays', str(tmp_path / 'arrays'), '--candidates',
             'dec2_fkl', '--out', str(tmp_path / 'new' / 'alpha.json')]
  for change, said in (
      ({6: 'dec2_fkl,nope'}, "--candidates: ['nope']"),
      ({8: str(tmp_path / 'file' / 'a.json')}, 'cannot be a folder')):
    args = [change.get(i, a) for i, a in enumerate(measure)]
    message = refusal('ship_models', *args, capsys=capsys,
                      monkeypatch=monkeypatch)
    assert message.startswith('error: ') and said in message, message
  # Data of another vocabulary than the models'.
  monkeypatch.setenv('SPECDEC_DATA_DIR', str(ROOT / 'tests' / 'testdata' /
                                             'debian'))
  proc = run_script('ship_models', *measure, check=False)
  assert proc.returncode == 1 and 'another vocabulary' in proc.stderr, (
      proc.stderr)
  assert not (tmp_path / 'new').exists()

  assert 'needs --measured' in refusal('ship_models', 'report',
                                       capsys=capsys, monkeypatch=monkeypatch)
  measured = tmp_path / 'alpha.json'
  measured.write_text(json.dumps(dict(command='c', num_examples=1,
                                      tasks={})))
  committed = _sha(ROOT / 'results' / 'drafters_alpha.md')
  run_script('ship_models', 'report', '--measured', str(measured), '--out',
             str(tmp_path / 'out' / 'alpha.json'), '--profile',
             hardware.CPU)
  assert 'before and after' in (tmp_path / 'out' / 'alpha.md').read_text()
  assert _sha(ROOT / 'results' / 'drafters_alpha.md') == committed


def test_training_report_checks_every_log_before_writing(tmp_path,
                                                         monkeypatch):
  """scripts/training_report.py: a run with no validation record yet is
  '-' in its row (before: a TypeError formatting None); a task with no
  logs among --tasks, or a log whose last line was cut off as it was
  written, ends it in one line naming it before anything is written
  (before: the first task's png written, or a JSONDecodeError's
  traceback)."""
  models, out = tmp_path / 'models', tmp_path / 'out'
  log = models / 'en_de_mini_small' / 'log.jsonl'
  log.parent.mkdir(parents=True)
  record = json.dumps(dict(step=10, split='train', loss=2.5, accuracy=0.4,
                           seconds=60.0)) + '\n'
  def report(tasks):  # as its command runs it (its __main__)
    monkeypatch.setattr(sys, 'argv', [
        'training_report.py', '--models_dir', str(models), '--out_dir',
        str(out), '--tasks', tasks])
    runpy.run_path(str(ROOT / 'scripts' / 'training_report.py'),
                   run_name='__main__')
  for text, tasks, said in (
      (record, 'en_de,synopsys', f'no training logs under {models} for '
       'synopsys'),
      (record + record[:20], 'en_de', f'{log} is no training log')):
    log.write_text(text)
    with pytest.raises(SystemExit) as e:
      report(tasks)
    assert str(e.value.code).startswith(f'error: {said}'), e.value.code
    assert not out.exists()
  log.write_text(record)
  report('en_de')
  assert '| en_de | en_de_mini_small | 10 | 2.500 | - | - | 1.0 |' in (
      out / 'training.md').read_text()
  assert (out / 'training_en_de.png').exists()
