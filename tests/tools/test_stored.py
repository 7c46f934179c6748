"""The box's stored programs: a plan of specs built ahead of time into an
executable store, then run on it.

On the CPU the "device" is this machine: the build compiles every program
the plan's cells run, recorded from the cells' own code on shape structs
(the weights never loaded as arrays: `abstract_loaded`), and the run takes
each program the job and the measurements ask for from the store by its
fingerprint. What the device run needs of it: no program compiled during
the run, and the same rows as the sweep compiling its own.
"""

import dataclasses
import importlib
import json
import shlex
import tarfile

import jax
import pytest

from specdec_jax import checks
from specdec_jax import eval as eval_lib
from specdec_jax import hardware
from specdec_jax import measure
from specdec_jax import scaffold
from specdec_jax import unit_loop

from specdec_jax.experiments import reproduce
from specdec_jax.experiments import specs as specs_lib
from specdec_jax.experiments import sweep
from specdec_jax.experiments.specs import profile
from specdec_jax.experiments.specs import table3
from specdec_jax.experiments.specs import trees
from tools.accelerator import aot
from tools.accelerator import stored

pytestmark = pytest.mark.usefixtures('fast_xz_packs')

# Shrunk further: the profile's t(k), a model-free drafter's c and a tree
# level; one Table 3 cell (greedy, the model-free drafter).
PROFILE = dataclasses.replace(profile.SPEC, cells=lambda o, t: [
    c for c in profile.cells(o, t) if c.drafter != 'small'])
TABLE3 = dataclasses.replace(table3.SPEC, cells=lambda o, t: [
    c for c in table3.cells(o, t)
    if c.drafter == 'lookup' and c.changes['temperature'] == 0])


def _outputs(folder):
  """Every cell's records: (cell, index) -> (baseline, speculative)."""
  out = {}
  for path in sorted(folder.glob('table3/shipped/cells/*/examples.jsonl')):
    for line in path.read_text().splitlines():
      r = json.loads(line)
      out[(path.parent.name, r['index'])] = (r['baseline'], r['speculative'])
  return out


def test_a_plan_runs_on_the_programs_built_for_it(tmp_path):
  """Every program the run asks for, the profile's timing loops and the
  decodes alike, comes from the store (none compiled on the "device");
  the decodes give the rows of the sweep compiling its own."""
  options = sweep.Options(shrink=True, work_dir=str(tmp_path / 'work'))
  plan = [(PROFILE, options), (TABLE3, options)]
  store = aot.Store(tmp_path / 'store', 'cpu')
  store.describe(jax.devices()[0])
  built = stored.build(plan, store, jax.devices()[0], log=lambda _: None)
  assert built['built'] == len(built['programs']) > 0
  assert all(store.built(f) for f in built['programs'])
  assert built['dropped'] == []
  # The check of the first target-call loop loaded, against the same
  # program compiled here (a CPU's timings: trusted whatever they say).
  result = stored.run(plan, store, tmp_path / 'out', provider=stored.Provider(
      store, slower=float('inf')))
  check = result['check']
  assert check['function'] == stored.CHECKED
  assert check['verdict'] == 'trusted' and check['loaded_ms'] > 0
  log = result['program_log']
  assert all(e['source'] == 'loaded' for e in log), [
      (e['function'], e['why']) for e in log if e['source'] != 'loaded']
  assert {e['program'] for e in log} <= set(built['programs'])
  functions = {e['function'] for e in log}
  assert {'_call[SampleLoop]', '_call[SpecLoop]', stored.CHECKED,
          '_repeated_proposals[LookupDrafter]', '_repeated_levels[T5Model]'
          } <= functions, functions
  assert result['specs']['table3']['rows'] == 1
  assert result['specs']['profile']['rows'] >= 3
  assert result['device_facts']['platform'] == 'cpu'
  # Three files back, whatever the plan: the results packed, the run's
  # log, XLA's dump of t(1)'s loop and the chain (no tree in this plan).
  out = tmp_path / 'out'
  assert sorted(p.name for p in out.iterdir()) == [
      'results.tar.xz', 'stored_run.json', 'xla_dump.tar.xz']
  with tarfile.open(out / 'results.tar.xz') as tar:
    names = tar.getnames()
    header = tar.extractfile('table3_shipped.md').read().decode()
  assert {'profile_shipped.json', 'table3_shipped.md'} <= set(names), names
  # Each spec's results name the command that runs its cells without the
  # store (`spec_command`).
  assert ('Command: `python -m specdec_jax.experiments run table3 '
          '--models=shipped --shrink`') in header, header[:300]
  # ... and every finished cell, in its spec's work folder.
  assert any(n.startswith('work/table3_shipped/cells/') and
             n.endswith('summary.json') for n in names), names
  dumped = result['xla_dump']['files']
  assert sorted(dumped) == ['chain', 't(k)'] and all(
      any(f.endswith('after_optimizations.txt') for f in fs)
      for fs in dumped.values()), dumped
  # A check the loaded program fails (no slowdown allowed): that program and
  # every later one compiled here, giving the rows of the sweep compiling
  # its own programs.
  refusing = stored.Provider(store, check='_call[SampleLoop]', slower=0.0)
  reference = dataclasses.replace(options, work_dir=str(
      tmp_path / 'reference'))
  again = stored.run([(TABLE3, reference)], store, tmp_path / 'out2',
                     provider=refusing)
  assert again['check']['verdict'] == 'refused' and again['refused']
  assert [e['source'] for e in again['program_log']] == (
      ['loaded'] + ['compiled'] * (len(again['program_log']) - 1))
  ours, theirs = _outputs(tmp_path / 'work'), _outputs(tmp_path / 'reference')
  assert ours and ours == theirs
  # Built again for Table 3 alone: nothing compiles, and what the plan no
  # longer runs (the profile's loops, first in the store) goes first.
  rebuilt = stored.build(plan[1:], store, None, log=lambda _: None)
  assert rebuilt['built'] == 0 and rebuilt['kept'] == len(rebuilt['programs'])
  gone = set(store.fit(store.total_bytes() - 1))
  assert gone and not gone & set(rebuilt['programs'])


def test_a_plan_items_command_is_the_spec_command_of_its_options():
  """`spec_command`, parsed by the experiments command line, gives back
  the plan item's spec and options: what its results' header reruns."""
  cli = importlib.import_module('specdec_jax.experiments.__main__')
  plan = stored.parse_plan(stored.DEFAULT_PLAN + ('trees:mini;shrink',),
                           tasks=('en_de', 'synopsis'))
  for spec, options in plan:
    argv = shlex.split(stored.spec_command(spec, options))
    assert argv[:4] == ['python', '-m', 'specdec_jax.experiments', 'run']
    args = cli.parse_args(argv[3:])
    assert (args.spec, args.models, tuple(args.tasks.split(',')),
            args.num_examples, args.repeats, args.shrink, tuple(args.where),
            tuple(args.model_fields)) == (
                spec.name, options.models, options.tasks,
                options.num_examples, options.timing_repeats, options.shrink,
                options.where, options.model_fields), argv


class _Clock:
  """A clock with `left` seconds, spent `step` a look."""

  def __init__(self, left, step):
    self.seconds, self.step = left, step

  def left(self):
    self.seconds -= self.step
    return self.seconds


def test_the_run_stops_at_its_clock_with_what_finished_written(monkeypatch):
  """`_watch` (the run's hard stop) writes the log and the packed results
  while the clock runs, and when it runs out, once more before it ends the
  process with `DEADLINE_EXIT`, a spec in flight or not; a run that
  finished first is left to end itself."""
  monkeypatch.setattr(stored, 'PACK_EVERY_S', 0.001)
  ended = []

  def exit_(code):
    ended.append(code)
    raise SystemExit(code)
  monkeypatch.setattr(stored.os, '_exit', exit_)
  writes, logged = [], []
  with pytest.raises(SystemExit):
    stored._watch(lambda: writes.append(1), _Clock(1.0, 0.1),
                  stored.threading.Event(), logged.append)
  assert ended == [stored.DEADLINE_EXIT] and len(writes) >= 2, writes
  assert 'clock ran out' in logged[-1]
  finished = stored.threading.Event()
  finished.set()
  writes.clear()
  stored._watch(lambda: writes.append(1), _Clock(1.0, 0.1), finished,
                logged.append)
  assert writes == [] and ended == [stored.DEADLINE_EXIT]


def test_a_plan_names_specs_and_model_sets():
  (spec, options), = stored.parse_plan(['trees:xxl_cost;shrink'])
  assert spec.name == 'trees' and options.models == 'xxl_cost'
  assert options.shrink
  with pytest.raises(ValueError, match='Unknown spec'):
    stored.parse_plan(['tables:shipped'])
  # Conditions on the cells' fields: Table 2 at the rule's gamma alone, a
  # row per (task, drafter, temperature); batches 8 and 16 at t = 0.
  (spec, options), (batches, at) = stored.parse_plan([
      'table2:xxl_cost;batch_gamma=always',
      'batches:xxl_cost;temperature=0;batch_size=8|16;num_examples=16'])
  assert at.num_examples == 16 and at.where == ('temperature=0',
                                                'batch_size=8|16')
  cells = sweep.plan(spec, options)
  everything = sweep.plan(spec, dataclasses.replace(options, where=()))
  assert cells == [c for c in everything
                   if c.changes.get('batch_gamma') == 'always']
  assert len({(c.task, c.drafter, c.changes['temperature'])
              for c in everything}) == len(cells) > 0
  assert {(c.changes['temperature'], c.changes['batch_size'])
          for c in sweep.plan(batches, at)} == {(0.0, 8), (0.0, 16)}
  with pytest.raises(ValueError, match='no cell where'):
    sweep.plan(spec, dataclasses.replace(options, where=('gamma=99',)))
  # The run packs the work folders from this machine: a local one.
  with pytest.raises(ValueError, match="work_dir 'gs://b/w' is not a local"):
    stored.main(['project', '--store', 'unused', '--work_dir', 'gs://b/w'])
  with pytest.raises(ValueError, match='field=value'):
    stored.parse_plan(['table2:xxl_cost;fast'])
  # model_fields=... sets every model's T5Config fields (not a condition).
  (trees, fused), = stored.parse_plan(
      ['trees:xxl_cost;model_fields=attention_kernel=cudnn;temperature=0'])
  assert fused.model_fields == ('attention_kernel=cudnn',)
  assert fused.where == ('temperature=0',)
  # Its records keep it apart from the plain item of the same spec.
  assert stored.item_name(trees, fused) == 'trees attention_kernel=cudnn'
  assert stored.item_name(trees, dataclasses.replace(
      fused, model_fields=())) == 'trees'
  # The default plan: every item names cells; its trees: the best chain,
  # four trees and the tree the job chooses a task, then the best chain
  # and tree with cuDNN's attention, and with the Pallas norm kernels too.
  trees, fused, pallas = [o for spec, o in stored.parse_plan(
      stored.DEFAULT_PLAN) if spec.name == 'trees']
  assert pallas.model_fields == ('attention_kernel=cudnn',
                                 'dense_kernel=pallas')
  assert stored.item_name(specs_lib.get('trees'), pallas) == (
      'trees attention_kernel=cudnn dense_kernel=pallas')
  assert sorted({c.labels['drafting'] for c in sweep.plan(
      specs_lib.get('trees'), trees)}) == [
          'beam:16,4,16/64', 'beam:8,16,8/64', 'beam:8,4,12/64',
          'beam:8,8,8/64', 'chain 7', 'chosen 64']
  assert fused.model_fields == ('attention_kernel=cudnn',)
  for item in (fused, pallas):
    assert sorted({c.labels['drafting'] for c in sweep.plan(
        specs_lib.get('trees'), item)}) == ['beam:8,16,8/64', 'chain 7']
  assert all(sweep.plan(*item) for item in stored.parse_plan(
      stored.DEFAULT_PLAN))


def test_the_build_prices_the_gammas_and_the_run_is_projected(tmp_path):
  """A cell whose job chooses gamma gets the programs of the gammas the
  device's profile makes likely (each the argmax of Theorem 3.8 at one of
  `LIKELY_ALPHAS`, and the warm-up's), all of them without a profile; the
  projection counts a spec's decodes in proportion to its examples, and
  with no build every program the plan runs as a compile on the device."""
  profile = hardware.load(hardware.H100)
  plan = stored.parse_plan(stored.DEFAULT_PLAN)
  (spec, options), = [p for p in plan if p[0].name == 'table2']
  options = sweep.options_of(spec, options)
  models = sweep.model_set(options)
  cell = sweep.plan(spec, options)[0]
  setup = sweep.cell_setup(models, cell, options)
  name = reproduce.profile_name(options.models, cell.drafter)
  assert name in profile.c[1]
  loaded = stored.abstract_loaded(setup)
  likely = stored._gammas(loaded, profile, name)  # pylint: disable=protected-access
  want = {setup.gamma} | {hardware.predict(
      profile, alpha=a, drafter=name, max_gamma=setup.batch.max_gamma).gamma
                          for a in stored.LIKELY_ALPHAS}
  assert set(likely) == want and len(likely) < setup.batch.max_gamma
  assert stored._gammas(loaded) == tuple(range(  # pylint: disable=protected-access
      1, setup.batch.max_gamma + 1))
  built = aot.Store(tmp_path, 'gpu:h200')
  built.manifest['plan_programs'] = {}  # as a build that recorded none
  projected = stored.project(plan, profile, built)
  assert set(projected['specs']) == {stored.item_name(*p) for p in plan}
  assert projected['seconds'] == sum(
      v['seconds'] for v in projected['specs'].values())
  (trees, at), = [p for p in plan if stored.item_name(*p) == 'trees']
  fixed, chosen = (dataclasses.replace(at, where=(
      'temperature=0', f'drafting={d}')) for d in ('chain 7|default',
                                                  'chosen 64'))
  seconds = lambda o, n: stored.project([(trees, dataclasses.replace(
      o, num_examples=n))], profile, built)['specs']['trees']['seconds']
  assert seconds(fixed, 32) == pytest.approx(2 * seconds(fixed, 16), abs=1)
  # A tree choice decodes its first examples, however many the cell has.
  assert 2 * seconds(chosen, 16) > seconds(chosen, 32) > seconds(chosen, 16)
  unbuilt = stored.project([(TABLE3, sweep.Options(shrink=True))], profile,
                           log=lambda _: None)['programs']
  assert unbuilt['compiled_on_device'] == unbuilt['recorded'] >= 2
  assert unbuilt['compile_s'] == round(
      unbuilt['recorded'] * stored.ASSUMED['compile_s'])


def test_a_setup_chooses_gamma_by_its_batch_rule_unless_it_chooses_a_tree():
  """The rule the projection counts a gamma choice by (its loops, the
  first examples decoded once more for alpha): the job's
  (`unit_loop.chooses_gamma`) as far as the setup says, without the
  drafter it has not built."""
  (spec, options), = [p for p in stored.parse_plan(stored.DEFAULT_PLAN)
                      if p[0].name == 'table2']
  options = sweep.options_of(spec, options)
  setup = sweep.cell_setup(sweep.model_set(options),
                           sweep.plan(spec, options)[0], options)
  assert setup.batch.profile_gamma and setup.chooses_gamma
  assert unit_loop.chooses_gamma(stored.abstract_loaded(setup))
  tree = setup.replace(draft=setup.draft.replace(kind='tree',
                                                  tree='choose:16'))
  assert tree.batch.profile_gamma and not tree.chooses_gamma
  fixed = setup.replace(batch=setup.batch.replace(gamma_rule='config'))
  assert not fixed.chooses_gamma


def test_a_build_for_a_recorded_device_needs_its_topology(tmp_path):
  """`build --device_facts` takes the topology a run's log recorded; a log
  without one is named, before anything compiles."""
  log = tmp_path / stored.RUN_LOG
  log.write_text(json.dumps({'device_facts': {'platform': 'gpu'}}))
  with pytest.raises(checks.InputError, match='stored_run.json: no '
                     'topology in its device_facts'):
    stored.build_device('gpu:h100', None, log)


@pytest.mark.parametrize('item, said', [
    ('bogus', "--plan: ValueError: Unknown spec 'bogus'"),
    ('table3:shipped;num_examples=x', '--plan: ValueError: invalid literal'),
    ('table3:shipped;gama=4', "--plan: ValueError: spec 'table3' has no cell "
     'where gama=4'),
    ('table3:shipped;shrink', "unknown compile-only target 'gpu'"),  # build
])
def test_a_plan_item_that_runs_nothing_is_one_line_before_any_work(
    tmp_path, item, said):
  """A plan item naming no spec, a bad count or no cell: one line, before
  anything is recorded or compiled (a traceback, before)."""
  command = ['build', '--target', 'gpu'] if 'target' in said else ['project']
  with pytest.raises(SystemExit, match=f'^error: {said}'):
    checks.run_main(stored.main, command + [
        '--store', str(tmp_path), '--plan', item])


def test_a_run_on_a_store_without_programs_is_refused(tmp_path, capsys):
  """A store folder that holds no program for this device (a wrong --store,
  or a build for another --target) ends `run` before anything runs: with
  none, every program would compile on the borrowed device. A budget or a
  store's weight not above 0 is the parser's error."""
  aot.Store(tmp_path / 'store', 'gpu:h200').write()  # another target's
  with pytest.raises(SystemExit, match=r'error: no program in .*store/cpu: '
                     'give the --store and --target of a build'):
    stored.main(['run', '--store', str(tmp_path / 'store'), '--out',
                 str(tmp_path / 'out'), '--work_dir', str(tmp_path / 'work'),
                 '--plan', 'table3:shipped;shrink;drafter=lookup'])
  assert not (tmp_path / 'out').exists()
  with pytest.raises(SystemExit):
    stored.main(['run', '--store', str(tmp_path / 'store'),
                 '--max_minutes', '0'])
  assert "--max_minutes: a finite number > 0 expected, got '0'" in (
      capsys.readouterr().err)
  with pytest.raises(SystemExit):  # was: a store of no program
    stored.main(['build', '--store', str(tmp_path / 'store'),
                 '--limit_mib', '-1'])
  assert "--limit_mib: a finite number > 0 expected, got '-1'" in (
      capsys.readouterr().err)


def test_a_cell_choosing_its_tree_gets_the_programs_its_choice_runs(
    tmp_path, monkeypatch):
  """A cell whose job chooses its tree ('choose:N') is built what its
  choice runs: the drafter's ranks, the target's call at each width a tree
  verifies, a level of each tree weighed, and a decode of each tree the
  choice likely decodes and takes on the device's profile (`likely_trees`:
  `unit_loop.predicted_choice` made here, on the models unwidened). Where
  the device's costs are the profile's, the job's own choice asks for no
  decode the build did not record (but the tree its first timed decode
  makes it take, where that is another). Without a profile: no tree."""
  options = sweep.Options(models='xxl_cost', shrink=True, num_examples=2)
  cell = sweep.Cell('en_de', 'dec2', dict(
      drafter='tree', tree='choose:4', gamma=2, temperature=0.0), {})
  setup = sweep.cell_setup(sweep.model_set(options), cell, options)
  setup = setup.replace(target_widen_to={  # as the xxl_cost set widens
      'mlp_dim': setup.target_config.mlp_dim + 64})
  # The device: a target call of 1 ms at any width, a level and a drafter
  # step of 0.1 ms (its c), as the job times them below.
  profile = hardware.HardwareProfile.of_run(
      'a device', 1, 1e-3, dict.fromkeys(range(1, 10), 1.0), {'dec2': 0.1})
  chosen_on = []
  predicted = unit_loop.predicted_choice
  monkeypatch.setattr(unit_loop, 'predicted_choice', lambda loaded, *a: (
      chosen_on.append(loaded.setup) or predicted(loaded, *a)))
  recorder, said = stored.Recorder(), []
  stored.record_cell(trees.SPEC, cell, setup, recorder, log=said.append,
                     profile=profile, drafter='dec2')
  assert not said and chosen_on[0].target_widen_to is None
  names = [name for name, _ in recorder.programs.values()]
  assert names.count('_repeated_calls[T5Model]') == len(
      unit_loop.tree_widths(4))
  # A level of the default tree, and of the beam that fills a level.
  assert names.count('_repeated_levels[T5Model]') == 2
  assert '_score_ranks_of[TreeDrafter]' in names
  monkeypatch.setattr(measure, 'cost_curve', lambda model, params, rows, ks,
                      **k: dict.fromkeys(sorted(set(ks) | {1}), 1e-3))
  monkeypatch.setattr(measure, 'drafter_token_time', lambda *a, **k: 1e-4)
  monkeypatch.setattr(measure, 'tree_level_time', lambda *a, **k: 1e-4)
  asked = {}

  def compiled_here(traced, fingerprint, lower_on, name):
    del lower_on
    asked[fingerprint] = name
    return traced.lower().compile()

  with scaffold.programs_from(compiled_here):
    choice, = eval_lib.evaluate(setup, str(tmp_path / 'job'))[
        'gamma_choices']
  likely = {t['spec'] for t in choice['trees']} | {choice['first_tree']}
  assert names.count('_call[TreeLoop]') == len(likely) >= 2
  missing = [asked[f] for f in set(asked) - set(recorder.programs)]
  assert missing == ['_call[TreeLoop]'] * (choice['tree'] not in likely)
  bare = stored.Recorder()
  stored.record_cell(trees.SPEC, cell, setup, bare, log=said.append)
  assert '_call[TreeLoop]' not in [n for n, _ in bare.programs.values()]
