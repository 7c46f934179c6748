"""The experiments layer: task table, sweep runner, results table.

A spec's cell is the eval job: its records equal the job's for the same
`EvalSetup` in every field but the timings; a rerun resumes (nothing
decoded twice; its work folder in a bucket too); `repredict` reproduces a
written results file exactly; the task table is what the gin files
configure.
"""

import dataclasses
import json
import pathlib
import re
import shutil

import gin
import jax
import jax.numpy as jnp
import pytest

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import eval as eval_lib
from specdec_jax import gin_utils
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import partitioning
from specdec_jax import run_folder
from specdec_jax import hardware
from specdec_jax import task_table
from specdec_jax.experiments import __main__ as cli
from specdec_jax.experiments import reproduce
from specdec_jax.experiments import specs
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

from conftest import loads_every_time
import fake_gcs  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Record fields that are timings (or say where a run was).
TIMED = {'baseline_batch_s', 'speculative_batch_s', 'other_load'}
# Row fields that are timings (a rerun reproduces every other field).
TIMING_FIELDS = ('baseline_s', 'speculative_s', 'walltime_speedup',
                 'throughput_speedup', 'baseline_tokens_per_s',
                 'speculative_tokens_per_s', 'measured', 'gamma_choices',
                 'predicted_speedup', 'predicted_label',
                 'measured_over_predicted', 'other_load_cores')


@pytest.mark.parametrize('models', task_table.MODEL_SETS)
def test_the_task_table_is_what_the_gin_files_configure(models):
  for entry in task_table.TASKS.values():
    gin.clear_config(clear_constants=True)
    gin.add_config_file_search_path(str(gin_utils.GIN_DIR))
    gin.parse_config_files_and_bindings([entry.gin_file(models)], [
        "TARGET_CHECKPOINT = '/t'", "DRAFT_CHECKPOINT = '/d'",
        "EVAL_OUTPUT_DIR = '/o'", "GAMMA = 1"])
    fields = entry.fields(models)
    assert gin.query_parameter('%MIXTURE_OR_TASK_NAME') == (
        fields['mixture_or_task_name'])
    assert dict(gin.query_parameter('%TASK_FEATURE_LENGTHS')) == (
        fields['task_feature_lengths'])
  gin.clear_config(clear_constants=True)
  with pytest.raises(ValueError, match="Unknown task 'fr_en'"):
    task_table.get('fr_en')
  with pytest.raises(ValueError, match="Unknown model set 'big'"):
    task_table.check_model_set('big')


def test_no_module_holds_a_copy_of_the_task_table():
  """The shipped assets, the demo, the device run and the scripts read their
  tasks from task_table; a copy of a task's seqio name or gin file written
  elsewhere would drift from it (tasks.py registers the seqio tasks under
  those names: the one place they are defined)."""
  written = {f"'{name}'" for entry in task_table.TASKS.values()
             for name in entry.task.values()}
  written |= {f"'{entry.gin_file(models)}'"
              for entry in task_table.TASKS.values()
              for models in ('mini', 'shipped')}
  homes = {ROOT / 'specdec_jax' / 'task_table.py',
           ROOT / 'specdec_jax' / 'tasks.py'}
  copies = [f'{path.relative_to(ROOT)}: {text}'
            for folder in ('specdec_jax', 'scripts')
            for path in sorted((ROOT / folder).rglob('*.py'))
            if path not in homes
            for text in written if text in path.read_text(encoding='utf-8')]
  assert not copies, copies


def _tiny(changes=None, variants=('tiny',)):
  """A spec on the shipped models, one cell per variant (the same setup):
  1 example, gamma 2."""
  def cells(options, tasks):
    del options
    return [sweep.Cell(tasks[0], 'dec2', dict(gamma=2, max_gamma=2,
                                              **(changes or {})),
                       {'variant': v}, ('costs',)) for v in variants]
  return sweep.Spec(name='tiny', title='tiny', about='A test spec.',
                    cells=cells, columns=(('task', 'task'),
                                          ('alpha', 'alpha'),
                                          ('predicted', 'predicted_speedup')),
                    num_examples=1, timing_repeats=1)


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  """Two cells of one setup, run as a sweep on a mesh (this one device's:
  the job's mesh path; the T5 drafter sharded as the target is), counting
  checkpoint loads."""
  root = tmp_path_factory.mktemp('sweep')
  spec = _tiny(variants=('a', 'b'))
  options = sweep.Options(tasks=('en_de',), work_dir=str(root / 'work'),
                          num_partitions=1, shard_drafter=True)
  loads = []
  with pytest.MonkeyPatch.context() as patch, loads_every_time():
    load = loading.checkpoints.load_t5x_params
    patch.setattr(loading.checkpoints, 'load_t5x_params',
                  lambda path, **kw: loads.append(path) or load(path, **kw))
    result = sweep.run(spec, options, profile=hardware.load(hardware.H100),
                       command='test', out=str(root / 'out' / 'shipped'))
  return spec, options, root, result, loads


def test_a_sweep_loads_each_checkpoint_once(tiny_run):
  """The cells (two jobs and a measurement) share the run's `LoadCache`:
  the target and the drafter are each read once, not once per cell, on the
  mesh too (the target kept placed by its shardings)."""
  _, options, root, result, loads = tiny_run
  assert len(result['rows']) == 2
  assert len(loads) == len(set(loads)) == 2, loads
  assert result['mesh'] == {'data': 1, 'model': 1, 'processes': 1,
                            'shard_drafter': True}
  assert sweep.results_name(options) == 'shipped_partitions-1-shard_drafter'
  assert 'Mesh: 1 data x 1 model, 1 process(es), a T5 drafter sharded' in (
      root / 'out' / 'shipped.md').read_text()
  cells = list((root / 'work').glob('*/*/cells/*'))  # as each job ran
  assert len(cells) == 2 and all(json.loads((c / 'run.json').read_text())[
      'identity']['mesh']['shard_drafter'] is True for c in cells)


def test_the_load_cache_keeps_its_most_recent_models():
  cache = loading.LoadCache(max_models=2)
  made = []
  get = lambda k: cache.model(('model', k), lambda: made.append(k) or (
      k, {'w': [k]}))
  get('x'), get('y'), get('x'), get('z')  # 'y' is the least recent
  assert made == ['x', 'y', 'z'] and cache.loads['model'] == 3
  model, params = get('x')
  assert made == ['x', 'y', 'z'] and model == 'x'
  params['w'] = None  # fresh containers: the kept tree is untouched
  assert get('x')[1] == {'w': ['x']}
  get('y')
  assert made == ['x', 'y', 'z', 'y']
  rows = cache.examples('k', lambda: [1, 2])
  rows.append(3)
  assert cache.examples('k', lambda: []) == [1, 2]
  with pytest.raises(ValueError, match='max_models'):
    loading.LoadCache(max_models=0)


def test_the_load_cache_keeps_a_data_built_drafter_per_data_folder(
    monkeypatch):
  """A bigram's table is built once per task split it counts: again for the
  same task name read from another data folder (other train targets), not
  the first folder's table."""
  train = {'/a': [[5, 6, 1]] * 3, '/b': [[7, 8, 1]] * 3}
  setup = reproduce.eval_setup(reproduce.make_setup('shipped'), 'en_de',
                               'bigram')
  task = setup.data.mixture_or_task_name
  read = []

  class Task:  # what load_drafter reads of a task: its name, its train split
    name = task

  def train_targets(task_, n):
    del task_, n
    read.append(folder)
    return iter(train[folder])

  monkeypatch.setattr(loading.data, 'train_targets', train_targets)
  cache = loading.LoadCache()
  tables = {}
  for folder in ('/a', '/b', '/a'):
    _, params = loading.load_drafter(setup.replace(data_dir=folder), Task(),
                                     cache=cache)
    tables.setdefault(folder, []).append(params['next_tokens'])
  assert read == ['/a', '/b'] and cache.loads['drafter'] == 2
  assert (tables['/a'][0] == tables['/a'][1]).all()
  assert not (tables['/a'][0] == tables['/b'][0]).all()


def _records(folder):
  return [{k: v for k, v in r.items() if k not in TIMED}
          for r in run_folder.read_records(pathlib.Path(folder) /
                                           'examples.jsonl')]


def test_a_cell_is_the_eval_job_on_its_setup(tiny_run):
  """The second cell decoded with the models the first loaded: its records
  are those of the job run alone on its setup."""
  spec, options, root, result, _ = tiny_run
  options = sweep.options_of(spec, options)
  _, cell = sweep.plan(spec, options)
  setup = sweep.cell_setup(reproduce.make_setup('shipped'), cell, options)
  assert (setup.gamma, setup.data.num_examples, setup.draft.kind) == (
      2, 1, 't5')
  job = root / 'job'
  summary = eval_lib.evaluate(setup, str(job), timing_repeats=1)
  cell_dir = sweep.work_folder(spec, options) / 'cells' / cell.name
  assert _records(cell_dir) == _records(job)
  _, row = result['rows']
  for field in table.SUMMARY_FIELDS:
    if field not in TIMING_FIELDS:
      assert row[field] == summary[field], field
  assert row['differing_examples'] == 0 and row['status'] == 'complete'
  assert row['measured']['costs']['batch'] == 1
  # Theorem 3.8 on the row's own measured costs, through predict.
  costs = row['measured']['costs']
  want = hardware.predict(table.run_profile(row, result),
                          alpha=row['alpha'], gamma=2, drafter='dec2')
  assert row['predicted_speedup'] == want.speedup
  assert want.cost == costs['cost']['3']
  assert row['predicted_on_profile']['profile'] == hardware.H100


def test_a_work_folder_in_a_bucket_resumes_and_measures_there(
    tiny_run, gcs, capsys):
  """A rerun resumes every cell, here from the sweep's work folder copied
  to a gs:// address: each cell resumed by its eval job from the bucket
  (nothing decoded again), the measurement missing there taken again by
  the first cell, written there and read there by the second, and the
  results written there (named by the address); the rows are the first
  run's but for the measurement's timings."""
  spec, options, root, result, _ = tiny_run
  work = fake_gcs.upload(root / 'work', f'{gcs}/work')
  options = dataclasses.replace(options, work_dir=work)
  folder = sweep.work_folder(spec, sweep.options_of(spec, options))
  assert folder == f"{work}/tiny/{sweep.results_name(options)}"
  [measurement] = [n for n in checkpoints.list_files(folder)
                   if n.startswith('measurements/')]
  checkpoints.delete(f'{folder}/{measurement}')
  capsys.readouterr()
  again = sweep.run(spec, options, profile=hardware.load(hardware.H100),
                    command='test', out=f'{gcs}/out/shipped')
  assert capsys.readouterr().out.count('found in') == 2  # nothing decoded
  assert again['out'] == f'{gcs}/out/shipped'
  assert checkpoints.list_files(f'{gcs}/out') == ['shipped.json',
                                                  'shipped.md']
  assert json.loads(checkpoints.read_bytes(f'{gcs}/out/shipped.json'))[
      'rows'] == again['rows']
  costs = json.loads(checkpoints.read_bytes(f'{folder}/{measurement}'))
  assert all(r['measured']['costs'] == costs for r in again['rows'])
  timed = lambda r: r == 'measured' or 'predicted' in r or r == 'out'
  strip = lambda rows: [{k: v for k, v in r.items() if not timed(k)}
                        for r in rows]
  assert strip(again['rows']) == strip(result['rows'])


@pytest.mark.parametrize('where', ['local', 'gs'])
def test_repredict_reproduces_the_written_file(tiny_run, tmp_path,
                                              monkeypatch, request, where):
  """`repredict` of a results file whose predicted figures were spoilt
  writes them again in place (json and md), local or at a gs:// address:
  the rows are the written ones, the results still named by their file."""
  spec, _, root, *_ = tiny_run
  monkeypatch.setitem(specs.SPECS, spec.name, spec)
  written = root / 'out' / 'shipped.json'
  folder = (str(tmp_path) if where == 'local' else
            request.getfixturevalue('gcs') + '/results')
  copy = f'{folder}/shipped.json'
  data = json.loads(written.read_text())
  for row in data['rows']:  # spoil every predicted figure
    row['predicted_speedup'] = row['predicted_on_profile'] = 0.0
  checkpoints.write_bytes(copy, json.dumps(data).encode())
  cli.main(['repredict', copy, '--profile', hardware.H100])
  got = json.loads(checkpoints.read_bytes(copy))
  want = json.loads(written.read_text())
  drop = lambda d: {k: v for k, v in d.items()
                    if k not in ('out', 'predicted_by')}
  assert [drop(r) for r in got['rows']] == [drop(r) for r in want['rows']]
  assert 'predicted_by' in got
  assert got['out'] == (copy[:-5] if where == 'gs' else
                        str(tmp_path / 'shipped'))
  assert checkpoints.read_bytes(f'{folder}/shipped.md').decode() == (
      table.markdown(spec, got))


def test_a_measurement_times_by_process_0s_clock(tmp_path, monkeypatch):
  """On a mesh spanning processes every process times the same calls: how
  long a measurement times (`measure.loop_time`'s doubling) and what it
  found are process 0's (`partitioning.agree`), as in the eval job; each
  process's own clock would stop at its own n and the collectives of the
  loops would no longer pair (before: its own)."""
  agreed = []
  monkeypatch.setattr(partitioning, 'agree',
                      lambda value: agreed.append(value) or value)
  spec = _tiny()
  options = sweep.options_of(spec, sweep.Options(shrink=True))
  setup = sweep.cell_setup(reproduce.make_setup('shipped'),
                           sweep.plan(spec, options)[0], options)
  probe = lambda loaded, inputs: {'s': measure.loop_time(
      lambda n: jnp.zeros(n), 1, 1, min_seconds=0.0)}
  value = sweep.measured('probe', setup, tmp_path, {'probe': (probe, ())},
                         load=lambda: (None, None))
  # The file's existence, the doubling's stop, the value: each agreed.
  assert agreed == [False, True, value]


def test_cells_and_flags_are_checked():
  spec = _tiny()
  with pytest.raises(ValueError, match="has no cell 'nope'"):
    sweep.plan(spec, sweep.Options(only='nope'))
  with pytest.raises(ValueError, match="Unknown model set 'tiny'"):
    sweep.plan(spec, sweep.Options(models='tiny'))
  with pytest.raises(ValueError, match="Unknown spec 'nope'"):
    specs.get('nope')
  with pytest.raises(ValueError, match="Unknown measurement 'speed'"):
    sweep.measured('speed', None, pathlib.Path('.'))
  twice = sweep.Spec(name='twice', title='', about='', columns=(),
                     cells=lambda o, t: [sweep.Cell('en_de', 'dec2')] * 2)
  with pytest.raises(ValueError, match='names a cell twice'):
    sweep.plan(twice, sweep.Options())
  with pytest.raises(ValueError,
                     match="work_dir 's3://b/w' is neither a local"):
    sweep.run(spec, sweep.Options(work_dir='s3://b/w'))
  with pytest.raises(ValueError, match="out 's3://b/r' is neither a local"):
    sweep.run(spec, sweep.Options(), out='s3://b/r')
  for bad, message in ((dict(num_examples=0), 'num_examples must be an int'),
                       (dict(timing_repeats=True), 'timing_repeats must be'),
                       (dict(max_minutes=-5.0), 'max_minutes must be a'),
                       (dict(model_fields=('nofield=1',)),  # before: per cell
                        r"--model_fields: T5Config has no field\(s\) \['no")):
    with pytest.raises(ValueError, match=message):
      sweep.Options(**bad)


@pytest.mark.parametrize('argv, message', [
    (['run', 'table3', '--where', 'gamma'], "--where 'gamma': field=value"),
    (['run', 'table3', '--where', 'gama=4'], 'no cell where gama=4; its cells '
     r'have task=en_de\|synopsis; drafter=lookup\|dec2\|small; gamma=4; '),
    (['run', 'table3', '--only', 'nope'], "spec 'table3' has no cell 'nope'"),
    (['run', 'table3', '--tasks', 'de_en'], "Unknown task 'de_en'"),
    (['run', 'table3', '--tasks', ''], "Unknown task ''"),  # before: all
    (['run', 'table3', '--tasks', 'en_de,en_de'], '--tasks names a task tw'),
    (['run', 'table3', '--where', 'drafter=small|smal'],  # before: small's
     'no cell where drafter=smal; its cells have task=en_de'),
    (['run', 'table3', '--num_examples', '0'], "--num_examples: an int >= 1"),
    (['run', 'table3', '--timing_repeats', '0'], '--timing_repeats: an int'),
    (['run', 'table3', '--max_minutes', '-5'], '--max_minutes: a finite num'),
    (['run', 'table3', '--num_partitions', '0'], 'an int >= 1 expected'),
    (['run', 'table3', '--profile', '{tmp}/none'],
     "no hardware profile '.*none'"),
    (['repredict', '{tmp}/none.json'],
     'none.json is no results file to repredict: FileNotFoundError'),
    (['repredict', '{tmp}/list.json'],
     'list.json is no results file to repredict: TypeError'),
    (['repredict', '{tmp}/other.json'],
     "other.json is no results file to repredict: KeyError: 'spec'"),
    (['repredict', '{tmp}/text.json'],
     'text.json is no results file to repredict: InputError: .* is not '
     'valid'),
    (['repredict', '{tmp}/bare.json'],  # before: KeyError's traceback
     "bare.json is no results file to repredict: KeyError: 'title'"),
    (['repredict', '{tmp}/cut.json'],
     "cut.json is no results file to repredict: KeyError: 'examples'"),
])
def test_bad_flags_end_the_command_in_one_line(argv, message, tmp_path,
                                               capsys, monkeypatch):
  """Flags that name no cell, task or file, or bad numbers: one line
  ('error: ...', exit status 1) before anything loads or runs, not a
  traceback, nor cells failing one by one (a budget below zero: every cell
  skipped); a results file that is none is left as it was."""
  shipped = json.loads((ROOT / 'results/table3/shipped.json').read_text())
  del shipped['rows'][0]['examples']
  files = {'list.json': '[1]', 'other.json': '{"rows": []}',
           'text.json': 'rows', 'bare.json': '{"spec": "table3", "rows": []}',
           'cut.json': json.dumps(shipped)}
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  monkeypatch.setattr(sweep, 'run', lambda *a, **k: pytest.fail('it ran'))
  argv = [a.format(tmp=tmp_path) for a in argv]
  if '--profile' not in argv:
    argv += ['--profile', 'none']
  if argv[0] == 'run':  # where a check missed would write
    argv += ['--work_dir', str(tmp_path / 'work'), '--out',
             str(tmp_path / 'out')]
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  said = f'{e.value.code} {capsys.readouterr().err}'  # ours; argparse's
  assert re.search(f'error: .*{message}', said), said
  assert not (tmp_path / 'work').exists()
  assert not (tmp_path / 'out.json').exists()
  assert {n: (tmp_path / n).read_text() for n in files} == files


def test_model_fields_set_every_model_and_name_the_folders():
  """`--model_fields attention_kernel=cudnn` runs a spec's cells with the
  field set in the target both decoders run and in the drafter (widened
  as the model set widens them), in work and results folders of their
  own; an unknown field is named."""
  spec = specs.get('trees')
  plain = sweep.options_of(spec, sweep.Options(models='xxl_cost'))
  fused = dataclasses.replace(plain, model_fields=('attention_kernel=cudnn',))
  models = sweep.model_set(plain)
  cell = sweep.plan(spec, plain)[0]
  setup = sweep.cell_setup(models, cell, fused)
  configs = (setup.target_config, setup.decoding_config,
             setup.draft.config, setup.draft.decoding_config)
  assert {c.attention_kernel for c in configs} == {'cudnn'}
  before = sweep.cell_setup(models, cell, plain)
  assert setup.replace(target_config=before.target_config,
                       draft_config=before.draft.config) == before
  assert sweep.work_folder(spec, plain).name == 'xxl_cost'
  assert sweep.work_folder(spec, fused).name == (
      'xxl_cost_attention_kernel-cudnn')
  with pytest.raises(ValueError, match=r"--model_fields.*\['kernel'\]"):
    sweep.cell_setup(models, cell, dataclasses.replace(
        plain, model_fields=('kernel=cudnn',)))


def test_a_failed_cell_is_written_and_named(gcs, capsys, monkeypatch):
  """A cell whose setup cannot be built fails alone: the others run, the
  results name it with its error, and the run ends with CellsFailed; the
  results are written (here at a gs:// address, copied up as the run
  fails). A refused value is said in its line, with no traceback (a fault
  of the code has one: `checks.failure`); the command ends in one line,
  an error of several cells said once."""
  spec = sweep.Spec(
      name='broken', title='broken', about='Cells that cannot run.',
      columns=(('task', 'task'),),
      cells=lambda o, t: [sweep.Cell('en_de', 'trigram'),
                          sweep.Cell('en_de', 'fourgram')])
  out = f'{gcs}/out'
  with pytest.raises(sweep.CellsFailed, match='2 of 2 cells failed') as e:
    sweep.run(spec, sweep.Options(work_dir=f'{gcs}/work'), out=out)
  assert "Unknown drafter 'trigram'" in str(e.value)
  written = json.loads(checkpoints.read_bytes(f'{out}.json'))
  assert [f['drafter'] for f in written['failed']] == ['trigram', 'fourgram']
  md = checkpoints.read_bytes(f'{out}.md').decode()
  assert "- task=en_de,drafter=fourgram: InputError: Unknown drafter" in md
  assert 'Traceback' not in capsys.readouterr().err
  # One error of every cell (a --data_dir with no data) is said once.
  with monkeypatch.context() as patch, pytest.raises(
      sweep.CellsFailed, match=(
          r'2 of 2 cells failed \(all are in .*\): task=en_de,drafter='
          'trigram, task=en_de,drafter=fourgram: InputError: no data$')):
    patch.setattr(sweep, 'run_cells', lambda *_: (_ for _ in ()).throw(
        checks.InputError('no data')))
    sweep.run(spec, sweep.Options(work_dir=f'{gcs}/work1'), out=f'{out}1')
  # Of several processes, one's failure may leave the others waiting in a
  # collective it skipped: the run ends there (a rerun resumes), not
  # running on out of step with them.
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(partitioning, 'agree', lambda value: value)
  monkeypatch.setattr(run_folder, 'job_processes_here', lambda: ())
  with pytest.raises(sweep.CellsFailed, match='1 of 2 cells failed'):
    sweep.run(spec, sweep.Options(work_dir=f'{gcs}/work2'), out=f'{out}2')
  written = json.loads(checkpoints.read_bytes(f'{out}2.json'))
  assert [f['drafter'] for f in written['failed']] == ['trigram']
  monkeypatch.setattr(sweep, 'run', lambda *a, **k: (_ for _ in ()).throw(
      sweep.CellsFailed('1 of 3 cells failed: ...')))
  with pytest.raises(SystemExit, match='^error: 1 of 3 cells failed: ...$'):
    cli.main(['run', 'table3'])


def _decoded(alpha):
  """A `run_cells` that decodes nothing: every cell's alpha is `alpha`."""
  return lambda models, group, *args: [({'alpha': alpha}, {})] * len(group)


def test_a_selection_updates_its_rows_and_keeps_the_others(
    tmp_path, monkeypatch):
  """--only / --where / --tasks rerun some cells: their rows are replaced
  in the results file, the others' kept, in the spec's order (before: the
  file held the selection's rows alone); a row of no cell of the spec
  goes. Refused before any cell runs, not overwritten (before: emptied):
  a file that is no results file, another spec's, or one of another
  header with rows; an --out that ends in no file name (before: 'keep/'
  read keep/.json, wrote keep.json), and a dotted one is the same file
  read and written (before: 'v1.5' read v1.5.json, wrote v1.json)."""
  spec, out = _tiny(variants=('a', 'b', 'c')), str(tmp_path / 'out')
  options = sweep.Options(work_dir=str(tmp_path / 'work'))
  monkeypatch.setattr(sweep, 'run_cells', _decoded(0.5))
  sweep.run(spec, options, out=out)
  a, b, c = [cell.name for cell in sweep.plan(spec, options)]
  written = json.loads((tmp_path / 'out.json').read_text())
  written['rows'].append(dict(written['rows'][0], cell='gone'))
  (tmp_path / 'out.json').write_text(json.dumps(written))
  monkeypatch.setattr(sweep, 'run_cells', _decoded(0.7))
  sweep.run(spec, dataclasses.replace(options, only=b), out=out)
  alphas = lambda: [(r['cell'], r['alpha']) for r in json.loads(
      (tmp_path / 'out.json').read_text())['rows']]
  assert alphas() == [(a, 0.5), (b, 0.7), (c, 0.5)]
  monkeypatch.setattr(sweep, 'run_cells', _decoded(0.9))
  sweep.run(spec, dataclasses.replace(options, where=('variant=c|a',),
                                      tasks=('en_de',)), out=out)
  assert sweep.plan(specs.get('numerics'), dataclasses.replace(
      options, where=('same_shape_baseline=True',)))  # a bool's text
  assert alphas() == [(a, 0.9), (b, 0.7), (c, 0.9)]
  assert '| en_de | 0.700 |' in (tmp_path / 'out.md').read_text()
  # A cell that fails now keeps no earlier row beside its failure.
  monkeypatch.setattr(sweep, 'run_cells', lambda *_: 1 / 0)
  with pytest.raises(sweep.CellsFailed):
    sweep.run(spec, dataclasses.replace(options, only=b), out=out)
  assert alphas() == [(a, 0.9), (c, 0.9)]
  # Rows of another machine's run are not put under this one's header,
  # nor dropped: refused, naming what differs.
  written = json.loads((tmp_path / 'out.json').read_text())
  for other, said in ((dict(written, machine='x'), 'machine x vs '),
                      (dict(written, spec='t', rows=[]), 'spec t vs tiny'),
                      ({'rows': []}, "no results file.*KeyError.'spec'"),
                      ([1], 'out.json is no results file')):
    (tmp_path / 'out.json').write_text(json.dumps(other))
    with pytest.raises(checks.InputError, match=said):
      sweep.run(spec, dataclasses.replace(options, only=b), out=out)
    assert json.loads((tmp_path / 'out.json').read_text()) == other
  (tmp_path / 'out.json').write_text(json.dumps(dict(written, machine='x',
                                                     rows=[])))
  monkeypatch.setattr(sweep, 'run_cells', _decoded(0.7))
  sweep.run(spec, dataclasses.replace(options, only=b), out=out)
  assert alphas() == [(b, 0.7)]
  with pytest.raises(checks.InputError, match="'.*keep/' ends in no file"):
    sweep.run(spec, options, out=f'{tmp_path}/keep/')
  (tmp_path / 'md.md').mkdir()  # where OUT.md goes (before: cells ran)
  monkeypatch.setattr(sweep, 'run_cells', lambda *_: pytest.fail('ran'))
  with pytest.raises(checks.InputError, match='md.md is a folder, where'):
    sweep.run(spec, options, out=str(tmp_path / 'md'))
  for only, alpha in ((a, 0.1), (c, 0.2)):
    monkeypatch.setattr(sweep, 'run_cells', _decoded(alpha))
    sweep.run(spec, dataclasses.replace(options, only=only),
              out=str(tmp_path / 'v1.5'))
  assert [r['alpha'] for r in json.loads(
      (tmp_path / 'v1.5.json').read_text())['rows']] == [0.1, 0.2]


@pytest.mark.parametrize('error', [
    checks.InputError('no draft_head.json'),
    eval_lib.MismatchError('1 greedy mismatch')])
def test_a_refused_cell_fails_alone_not_the_cells_of_its_baseline(
    error, tmp_path, monkeypatch):
  """Cells that share a baseline are decoded together; where one's setup
  is refused (e.g. heads without weights for the model set: the trees
  spec on synthetic) or its greedy outputs differ from the baseline's,
  each is decoded again alone (resumed), so only it fails (before: every
  cell of the group failed with its error, its rows gone)."""
  spec = _tiny(variants=('a', 'heads', 'b'))  # one baseline: one group
  def decoded(models, group, *args):
    if any(c.labels['variant'] == 'heads' for c in group):
      raise error
    return [({'alpha': 0.5}, {})]
  monkeypatch.setattr(sweep, 'run_cells', decoded)
  with pytest.raises(sweep.CellsFailed, match='1 of 3 cells failed'):
    sweep.run(spec, sweep.Options(work_dir=str(tmp_path)),
              out=str(tmp_path / 'out'))
  written = json.loads((tmp_path / 'out.json').read_text())
  assert [r['variant'] for r in written['rows']] == ['a', 'b']
  assert [f['variant'] for f in written['failed']] == ['heads']
  assert written['failed'][0]['error'].startswith(type(error).__name__)


@pytest.mark.parametrize('name, interrupt, status', [
    ('SIGINT', KeyboardInterrupt(), 130),
    ('SIGTERM', run_folder.Terminated('SIGTERM'), 143)])
def test_an_interrupted_run_ends_in_one_line(name, interrupt, status,
                                             tmp_path, monkeypatch, capsys):
  """Ctrl-C (or SIGTERM) ends the command as it ends training: a line
  saying where what finished is (or that none did: before, a file never
  written) and to rerun, the signal's exit status (before: a traceback
  through jax); the results written before are kept, and the rerun runs
  the cells left."""
  spec = dataclasses.replace(_tiny(), cells=lambda options, tasks: [
      sweep.Cell('en_de', 'dec2', dict(gamma=2, temperature=t))
      for t in (0.0, 1.0)])  # two groups: a baseline each
  out, work = str(tmp_path / 'out'), str(tmp_path / 'work')
  options = sweep.Options(work_dir=work)
  first, second = [cell.name for cell in sweep.plan(spec, options)]
  def decoded_then_stopped(models, group, *args):
    if group[0].name == second:
      raise interrupt
    return [({'alpha': 0.5}, {})]
  monkeypatch.setitem(specs.SPECS, 'tiny', spec)
  monkeypatch.setattr(sweep, 'run_cells', lambda *_: (_ for _ in ()).throw(
      interrupt))
  with pytest.raises(SystemExit):
    cli.main(['run', 'tiny', '--work_dir', work, '--out', out, '--profile',
              'none'])
  assert capsys.readouterr().out.splitlines()[-1] == (
      f'interrupted ({name}) with 2 of 2 cells left; no cell finished; '
      'rerun the same command to resume')
  monkeypatch.setattr(sweep, 'run_cells', decoded_then_stopped)
  with pytest.raises(SystemExit) as e:
    cli.main(['run', 'tiny', '--work_dir', work, '--out', out, '--profile',
              'none'])
  said = capsys.readouterr()
  assert e.value.code == status and 'Traceback' not in said.err
  assert said.out.splitlines()[-1] == (
      f'interrupted ({name}) with 1 of 2 cells left; the others are in '
      f'{out}.json; rerun the same command to resume')
  written = json.loads((tmp_path / 'out.json').read_text())
  assert [r['cell'] for r in written['rows']] == [first]
  monkeypatch.setattr(sweep, 'run_cells', _decoded(0.5))
  result = sweep.run(spec, options, out=out)
  assert [r['cell'] for r in result['rows']] == [first, second]


@pytest.mark.parametrize('name', sorted(specs.SPECS))
def test_committed_results_repredict_to_themselves(name, tmp_path):
  """Every committed results file of a spec is what `repredict` gives
  from its own measured values."""
  files = sorted((ROOT / 'results' / name).glob('*.json'))
  for committed in files:
    copy = tmp_path / committed.name
    shutil.copy(committed, copy)
    data = json.loads(committed.read_text())
    cli.main(['repredict', str(copy), '--profile',
              data.get('profile') or 'none'])
    drop = lambda d: {k: v for k, v in d.items()
                      if k not in ('out', 'predicted_by')}
    assert drop(json.loads(copy.read_text())) == drop(data)
    md = lambda p: [x for x in p.read_text().splitlines()
                    if 'recomputed' not in x]
    assert md(copy.with_suffix('.md')) == md(committed.with_suffix('.md'))


@pytest.mark.parametrize('name', sorted(specs.SPECS))
def test_every_spec_plans_its_cells_on_every_model_set(name, capsys):
  """On every model set a spec's cells name drafters the set has (before:
  batches and trees named dec2 everywhere) and heads of the set's own
  (`sweep.method_checkpoint`; before: trees took the shipped heads)."""
  spec = specs.get(name)
  for models in task_table.MODEL_SETS:
    options = sweep.options_of(spec, sweep.Options(models=models))
    cells = sweep.plan(spec, options)
    assert cells, (name, models)
    assert {c.task for c in cells} <= set(task_table.names())
    assert all(len(c.name.encode()) <= sweep.MAX_NAME for c in cells)
    shrunk = sweep.plan(spec, sweep.options_of(spec, sweep.Options(
        models=models, shrink=True)))
    assert 0 < len(shrunk) <= len(cells)
    offered = sweep.model_set(options).drafters
    for cell in cells + shrunk:
      assert cell.drafter in offered, (models, cell.name)
      if cell.drafter in ('heads', 'heads_tree'):
        assert cell.changes['draft_checkpoint'] == sweep.method_checkpoint(
            options, 'heads', cell.task), (models, cell.name)
  cli.main(['list'])
  assert f'{name}: {spec.title}' in capsys.readouterr().out
