"""The sweep runner: a spec's cells, each decoded by the eval job itself.

A benchmark is a `Spec`: data naming its cells. A `Cell` is the eval job's
`loading.EvalSetup` for a (task, drafter) of a model set
(`reproduce.eval_setup`) with changes, plus named extra measurements
(`MEASUREMENTS`). `run` decodes every cell with the eval job into its own
folder (so a cell's figure IS the job's figure for that setup; the cells
that share a baseline together, `eval.evaluate_together`), resuming,
under a time budget, on one device or the job's mesh, and rewrites the
results after each cell (`table.write`). docs/experiments.md tells how.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import pathlib
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec_jax import bucket_folder
from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import data
from specdec_jax import eval as eval_lib
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import models as models_lib
from specdec_jax import partitioning
from specdec_jax import programs
from specdec_jax import run_folder
from specdec_jax import sampling
from specdec_jax import task_table
from specdec_jax import unit_loop
from specdec_jax.bench import budget
from specdec_jax.experiments import reproduce
from specdec_jax.experiments import table

MAX_NAME = 160  # bytes of a cell's folder name
Measurement = Tuple[Callable[..., Dict[str, Any]], Tuple[str, ...]]


class CellsFailed(RuntimeError):
  """Cells of a sweep failed; every other cell ran and was written."""


@dataclasses.dataclass(frozen=True)
class Cell:
  """One eval job run of a sweep.

  Attributes:
    task: a `task_table` name.
    drafter: a drafter of the model set (a T5 size, or any model-free kind).
    changes: `EvalSetup` fields set on the model set's setup (gamma,
      temperature, batch_size, batching, draft_confidence, tree, ...).
    labels: row fields that are no setup field (e.g. a variant's name).
    measure: names in `MEASUREMENTS` taken next to the decode.
  """
  task: str
  drafter: str
  changes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  labels: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  measure: Tuple[str, ...] = ()

  def fields(self) -> Dict[str, Any]:
    """The row's identifying fields: task, drafter, labels, changes."""
    changes = {('kind' if k == 'drafter' else k):
               dict(v) if isinstance(v, Mapping) else v
               for k, v in self.changes.items()}
    return {'task': self.task, 'drafter': self.drafter, **self.labels,
            **changes}

  @property
  def name(self) -> str:
    """A folder name naming every identifying field (a long one cut, with
    the hash of the whole: a file name has at most 255 bytes)."""
    parts = [f'{k}={v}' for k, v in self.fields().items()]
    name = ','.join(parts).replace('/', '_').replace(' ', '_')
    if len(name.encode()) <= MAX_NAME:
      return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return name.encode()[:MAX_NAME - 17].decode(errors='ignore') + '-' + digest


@dataclasses.dataclass(frozen=True)
class Options:
  """How a spec runs: models, sizes, where (the command line's flags)."""
  models: str = 'shipped'
  tasks: Optional[Tuple[str, ...]] = None
  num_examples: Optional[int] = None
  timing_repeats: Optional[int] = None
  shrink: bool = False
  only: Optional[str] = None
  where: Tuple[str, ...] = ()
  work_dir: str = '~/.cache/specdec_jax/experiments'
  models_dir: str = '~/models'
  checkpoints: str = ''
  data_dir: Optional[str] = None
  max_minutes: float = 24 * 60.0
  model_fields: Tuple[str, ...] = ()  # 'field=value' of every T5Config
  num_partitions: Optional[int] = None  # a mesh's 'model' axis (the job's)
  global_mesh: bool = False  # the mesh of every process's devices
  shard_drafter: bool = False  # a T5 drafter sharded as the target is

  def __post_init__(self):  # the flags' numbers, before any cell runs
    for name, n in (('num_examples', self.num_examples),
                    ('timing_repeats', self.timing_repeats)):
      if n is not None:
        checks.check_int(name, n, 1, " (or None: the spec's)")
    checks.check_positive('max_minutes', self.max_minutes, 'minutes')
    models_lib.with_fields(models_lib.config('t5_1_1_small'),  # names, types
                           self.model_fields, '--model_fields')

  @property
  def meshed(self) -> bool:  # the cells on a mesh, not one device
    return (self.num_partitions is not None or self.global_mesh or
            self.shard_drafter)


@dataclasses.dataclass(frozen=True)
class Spec:
  """A benchmark as data.

  Attributes:
    name: the spec's name (`python -m specdec_jax.experiments run <name>`;
      its results go to results/<name>/<model set>.{json,md,png}).
    title: the results' title.
    about: markdown: what the table shows and how it is read.
    cells: the cells for a model set and its tasks: `cells(options, tasks)`.
    columns: the table's columns, `(header, row field or function)`.
    num_examples: examples per cell.
    timing_repeats: timed repeats of each unit (medians).
    shrunk: `Options` changes of `--shrink` (tiny rows: the tests' run).
    predict: extra predicted figures of a row: `predict(row, profile)`
      sets fields on it (through `hardware.predict` only).
    plot: draws the results' png: `plot(result, path)`, or None.
    measurements: the spec's own named measurements, in `MEASUREMENTS`'
      form (the keywords a fn may name beside its two: `measured`).
    decode: False: a cell is its measurements alone, on its setup built
      as the job builds it (no decode, no summary figures: the profile).
    finish: `finish(result, out)` once every cell ran, before the results'
      last write: what the spec makes of all its rows beside them (`out`
      the results' path without suffix; e.g. a hardware profile), or None.
  """
  name: str
  title: str
  about: str
  cells: Callable[[Options, Sequence[str]], Sequence[Cell]]
  columns: Sequence[Tuple[str, Any]]
  num_examples: int = 16
  timing_repeats: int = 3
  shrunk: Mapping[str, Any] = dataclasses.field(default_factory=lambda: dict(
      num_examples=2, timing_repeats=1, tasks=('en_de',)))
  predict: Optional[Callable[[Dict[str, Any], Any], None]] = None
  plot: Optional[Callable[[Dict[str, Any], pathlib.Path], None]] = None
  measurements: Mapping[str, Measurement] = dataclasses.field(
      default_factory=dict)
  decode: bool = True
  finish: Optional[Callable[[Dict[str, Any], pathlib.Path], None]] = None


# Named extra measurements: fn(loaded, inputs) -> JSON, kept in a file named
# by what it depends on (so cells that share it measure it once).

def costs(loaded: loading.Loaded, inputs: np.ndarray) -> Dict[str, Any]:
  """t(1) and cost(k) = t(k) / t(1) of the target at the cell's batch for
  k = 1 .. max_gamma + 1, and the drafter's c = t_draft / t(1), timed as
  the job's gamma choice times them (`unit_loop.call_times`)."""
  seconds, t_draft, context = unit_loop.call_times(loaded, inputs)
  t1 = seconds[1]
  return {'batch': loaded.setup.batch.size, 'context': context,
          't1_ms': t1 * 1e3, 'c': t_draft / t1,
          'cost': {str(k): t / t1 for k, t in sorted(seconds.items())}}


# What each measurement depends on: the setup fields naming its file (the
# target on its task's data; its calls at a batch; the drafter; the rows).
TASK_FIELDS = ('target_config', 'target_checkpoint', 'mixture_or_task_name',
               'task_feature_lengths', 'split', 'data_dir', 'activation_dtype')
TARGET_FIELDS = TASK_FIELDS + ('target_widen_to', 'batch_size', 'max_gamma')
DRAFT_FIELDS = TARGET_FIELDS + ('drafter', 'draft_config', 'draft_checkpoint',
                                'tree', 'draft_confidence', 'draft_widen_to')
EXAMPLE_FIELDS = TASK_FIELDS + sampling.FIELDS + (
    'seed', 'num_examples', 'truncate_inputs', 'eos_id')
MEASUREMENTS: Dict[str, Measurement] = {'costs': (costs, DRAFT_FIELDS)}


def _measurement_key(name: str, setup: loading.EvalSetup, known) -> str:
  flat = setup.flat()
  text = json.dumps({f: repr(flat[f]) for f in known[name][1]}, sort_keys=True)
  return f'{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}'


def measured(name: str, setup: loading.EvalSetup,
             folder: bucket_folder.Folder, spec_measurements=None, load=None,
             context: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """A named measurement of a setup (`MEASUREMENTS` or a spec's own),
  from its file or measured now on `load()` (the built setup and its first
  batch's inputs; default: `built`). `context`: what a measurement may read
  beside them, given to the keywords its fn names (`run_cells`: 'records',
  the decoded cell's records in index order; 'timing_repeats')."""
  known = {**MEASUREMENTS, **(spec_measurements or {})}
  if name not in known:
    raise ValueError(f'Unknown measurement {name!r}; expected one of '
                     f'{list(known)}.')
  path = str(bucket_folder.join(
      folder, f'{_measurement_key(name, setup, known)}.json'))
  if partitioning.agree(checkpoints.isfile(path)):  # process 0's file
    return json.loads(checkpoints.read_bytes(path))
  with measure.decided_by(partitioning.agree):  # process 0's clock, so that
    value = partitioning.agree(take(known[name][0], *(load or functools.partial(
        built, setup))(), context))  # all make the same calls (a mesh)
  if jax.process_index() == 0:
    bucket_folder.write_file(path, json.dumps(value, indent=1).encode())
  return value


def take(fn, loaded: loading.Loaded, inputs: np.ndarray,
         context: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """A measurement's fn on the built setup, its inputs and the keywords of
  `context` it names."""
  wants = inspect.signature(fn).parameters
  return fn(loaded, inputs, **{k: v for k, v in (context or {}).items()
                               if k in wants})


def built(setup: loading.EvalSetup, cache: Optional[loading.LoadCache] = None,
          partitioner=None, shard_drafter: bool = False
          ) -> Tuple[loading.Loaded, np.ndarray]:
  """The setup built as the job builds it (`eval.load`: on the mesh, from
  `cache` when given) and its first batch's inputs."""
  loaded = eval_lib.load(setup, partitioner=partitioner, cache=cache,
                         shard_drafter=shard_drafter)
  return loaded, first_inputs(setup, loaded.task, cache)


def first_inputs(setup: loading.EvalSetup, task,
                 cache: Optional[loading.LoadCache] = None,
                 n: Optional[int] = None) -> np.ndarray:
  """The setup's first batch's inputs (or first `n` examples'), padded as
  the job pads them."""
  examples = loading.read_examples(setup, task, n or setup.batch.size, cache)
  return data.pad_rows([ids for _, ids, _, _ in examples],
                       setup.data.task_feature_lengths['inputs'])


# The runner.

def options_of(spec: Spec, options: Options) -> Options:
  """`options` with the spec's defaults filled in (and `--shrink`'s)."""
  defaults = dict(num_examples=spec.num_examples,
                  timing_repeats=spec.timing_repeats)
  if options.shrink:
    defaults.update(spec.shrunk)
  return dataclasses.replace(options, **{
      k: v for k, v in defaults.items() if getattr(options, k) is None})


def matches(cell: Cell, where: Sequence[str]) -> bool:
  """Whether each `field=value` of `where` holds of the cell's fields
  (`Cell.fields`; `value`: one value, or several joined by '|')."""
  fields = cell.fields()
  for condition in where:
    key, sep, wanted = condition.partition('=')
    if not sep:
      raise ValueError(f'--where {condition!r}: field=value[|value...]')
    if key not in fields or _value(fields[key]) not in map(
        _value, wanted.split('|')):
      return False
  return True


def _value(value) -> Any:
  """A number's value ('0' matches 0.0), else (a bool too) its text."""
  try:
    return str(value) if isinstance(value, bool) else float(value)
  except (TypeError, ValueError):
    return str(value)


def plan(spec: Spec, options: Options) -> List[Cell]:
  """The cells a run decodes: all, those whose fields `options.where`
  matches (`matches`; an alternative that no cell has is refused), or the
  one `options.only` names."""
  task_table.check_model_set(options.models)
  tasks = options.tasks or task_table.names()
  list(map(task_table.get, tasks))  # an unknown task: refused, named
  if len(set(tasks)) < len(tasks):
    raise checks.InputError(f'--tasks names a task twice: {list(tasks)}')
  cells = list(spec.cells(options, tasks))
  names = [c.name for c in cells]
  if len(set(names)) != len(names):
    raise ValueError(f'spec {spec.name!r} names a cell twice: {names}')
  if options.where:
    every, cells = cells, [c for c in cells if matches(c, options.where)]
    none = [f'{k}={w}' for k, _, v in (c.partition('=') for c in options.where)
            for w in v.split('|') if not any(matches(c, [f'{k}={w}'])
                                             for c in every)]
    if none or not cells:  # each field with the values the cells give it
      taken = {}
      for k, v in (kv for c in every for kv in c.fields().items()):
        taken.setdefault(k, {})[str(v)] = None
      said = '; '.join(f'{k}={"|".join(v)}' for k, v in taken.items())
      raise ValueError(f'spec {spec.name!r} has no cell where ' + ' and '.join(
          none or options.where) + f'; its cells have {said}')
  if options.only is not None:
    cells = [c for c in cells if c.name == options.only]
    if not cells:
      raise ValueError(f'spec {spec.name!r} has no cell {options.only!r}; '
                       f'its cells: {names}')
  return cells


def model_set(options: Options):
  """The setup of the options' model set (`reproduce.make_setup`; its
  widenings shrunk with `--shrink`)."""
  return reproduce.make_setup(options.models, options.models_dir,
                              options.checkpoints, options.data_dir,
                              shrink=options.shrink)


def cell_setup(models, cell: Cell, options: Options) -> loading.EvalSetup:
  """The eval job's setup of a cell."""
  changes = dict(cell.changes)
  changes.setdefault('num_examples', options.num_examples)
  if options.data_dir is not None:
    changes.setdefault('data_dir', options.data_dir)
  setup = reproduce.eval_setup(models, cell.task, cell.drafter, **changes)
  if not options.model_fields:
    return setup
  # Both decoders' target and the drafter (e.g. attention_kernel=cudnn).
  return setup.replace(**{name: models_lib.with_fields(
      config, options.model_fields, '--model_fields') for name, config in (
          ('target_config', setup.target_config),
          ('draft_config', setup.draft.config))})


def results_name(options: Options) -> str:
  """The model set's name, its `model_fields` and mesh (the work and
  results folders': 'xxl_cost', 'xxl_cost_attention_kernel-cudnn',
  'xxl_cost_partitions-4', 'xxl_cost_partitions-8-global')."""
  mesh = (f'partitions-{options.num_partitions or 1}' + '-global' * bool(
      options.global_mesh) + '-shard_drafter' * bool(options.shard_drafter),
          ) if options.meshed else ()
  return '_'.join((options.models,) + tuple(
      f.replace('=', '-') for f in options.model_fields) + mesh)


def method_checkpoint(options: Options, method: str, task: str) -> str:
  """A trained method's weights for a task (`method` 'heads' or
  'lookahead'): the shipped ones, or a model set's in `<models_dir>/
  <method>/<task>` (scripts/train_heads.py / train_pass.py --out_dir)."""
  return (f'shipped:{method}/{task}' if options.models == 'shipped' else
          os.path.join(options.models_dir, method, task))


def work_folder(spec: Spec, options: Options) -> bucket_folder.Folder:
  """The spec's cells and measurements, in the work dir (local or gs://)."""
  return bucket_folder.join(options.work_dir, spec.name, results_name(options))


def groups(models, cells: Sequence[Cell], options: Options) -> List[List[Cell]]:
  """The cells decoded together: those whose setups share one baseline
  (`EvalSetup.baseline_fields`), in the order of their first cells."""
  out: Dict[str, List[Cell]] = {}
  for cell in cells:
    try:
      key = json.dumps(cell_setup(models, cell, options).baseline_fields(),
                       sort_keys=True, default=str)
    except ValueError:  # fails alone, when it runs (`run` records why)
      key = f'cell {cell.name}'
    out.setdefault(key, []).append(cell)
  return list(out.values())


def run_cells(models, group: Sequence[Cell], options: Options,
              folder: bucket_folder.Folder, spec_measurements=None,
              cache: Optional[loading.LoadCache] = None, decode: bool = True,
              partitioner=None
              ) -> List[Tuple[Optional[Dict[str, Any]], Dict[str, Any]]]:
  """Decodes cells that share a baseline with the eval job, each into its
  own folder (resuming it): one baseline decode a unit, timed alternately
  with every cell's speculative decode (`eval.evaluate_together`); returns
  per cell (the job's summary, or None without a decode; {measurement
  name: value}). `cache`: the run's `loading.LoadCache` (what an earlier
  cell loaded is not loaded again), or None; `decode` False: the cells'
  measurements only (`Spec.decode`); `partitioner`: the cells' mesh, or None."""
  setups = [cell_setup(models, cell, options) for cell in group]
  summaries = eval_lib.evaluate_together(
      [(setup, str(bucket_folder.join(folder, 'cells', cell.name)),
        setup.describe())
       for cell, setup in zip(group, setups)],
      timing_repeats=options.timing_repeats, cache=cache,
      partitioner=partitioner, shard_drafter=options.shard_drafter
  ) if decode else [None] * len(group)
  out, measurements = [], bucket_folder.join(folder, 'measurements')
  for cell, setup, summary in zip(group, setups, summaries):
    load = functools.cache(functools.partial(
        built, setup, cache, partitioner, options.shard_drafter))  # once
    context = {'timing_repeats': options.timing_repeats}
    if decode and cell.measure:
      records = bucket_folder.all_records(
          bucket_folder.join(folder, 'cells', cell.name))
      context['records'] = sorted(records, key=lambda r: r['index'])
    out.append((summary, {name: measured(name, setup, measurements,
                                         spec_measurements, load, context)
                          for name in cell.measure}))
  return out


def run(spec: Spec, options: Options, *, profile=None, command: str = '',
        out: Optional[str] = None) -> Dict[str, Any]:
  """Runs every cell of a spec (resuming), writing its results after each;
  returns them (as written: .json / .md / .png). `options`: the command
  line's (`options_of` fills the spec's defaults in); `profile`: a
  `hardware.HardwareProfile` for the rows' "predicted <profile>" figures,
  or None; `command`: the one that reruns it (the results' header); `out`:
  the results' path without suffix (default results/<spec>/<model set>;
  shrunk: <work folder>/results, since tiny rows are no results), its rows
  of cells not run kept (`earlier_rows`)."""
  if out is not None and os.path.basename(out) in ('', '.', '..'):
    raise checks.InputError(f'--out {out!r} ends in no file name: give the '
                            "results' path without suffix (OUT.json, ...)")
  options = options_of(spec, options)
  bucket_folder.check_folder('work_dir', options.work_dir)
  folder = work_folder(spec, options)
  if out is None:
    out = str(bucket_folder.join(folder, 'results') if options.shrink else
              table.RESULTS / spec.name / results_name(options))
  cells, ran = [], []  # counted by the line Ctrl-C or SIGTERM ends it with
  stopped = lambda name: '; '.join((
      f'interrupted ({name}) with {len(cells) - len(ran)} of {len(cells)} '
      'cells left', f'the others are in {out}.json' if ran else
      'no cell finished', 'rerun the same command to resume'))
  with bucket_folder.written_here('out', out, table.SUFFIXES) as (here, sync), \
      run_folder.stops_in_one_line(stopped):
    cells = plan(spec, options)
    names = list(dict.fromkeys(c.name for c in plan(spec, dataclasses.replace(
        options, tasks=None, only=None, where=())) + cells))  # rows' order
    models = model_set(options)
    clock = budget.Clock(options.max_minutes)
    cache = loading.LoadCache()  # the cells share their models and examples
    partitioner = partitioning.Partitioner(options.num_partitions, global_mesh=(
        options.global_mesh)) if options.meshed else None
    result = table.new_result(spec, options, command, partitioner)
    result['rows'] = earlier_rows(out, names, result)  # the others' kept
    plan_groups = groups(models, cells, options)
    peers = run_folder.job_processes_here()  # not other load
    for i, group in enumerate(plan_groups):
      if partitioning.agree(clock.left() <= 0):
        skipped = [c.name for g in plan_groups[i:] for c in g]
        result['skipped'] += skipped
        print(f'time budget spent: {len(skipped)} cells skipped', flush=True)
        break
      start = time.perf_counter()
      try:
        with measure.job_processes(peers), measure.OtherLoad() as load:
          done = run_cells(models, group, options, folder, spec.measurements,
                           cache, spec.decode, partitioner)
      except Exception as e:  # pylint: disable=broad-except
        # Recorded with its error; the other cells run on (a rerun resumes).
        if (len(group) > 1 and jax.process_count() == 1 and isinstance(
            e, (*checks.REFUSED, eval_lib.MismatchError))):  # maybe one cell's
          print(f'{e!r}: its cells again, one by one', flush=True)
          plan_groups[i + 1:i + 1] = [[cell] for cell in group]
          continue
        error = checks.failure(e)
        result['failed'] += [{'cell': cell.name, **cell.fields(),
                              'error': error} for cell in group]
        gone = {cell.name for cell in group}  # an earlier row: no longer so
        result['rows'] = [r for r in result['rows'] if r['cell'] not in gone]
        print(f"{', '.join(c.name for c in group)} failed: {error}", flush=True)
      else:
        clock.note(', '.join(c.name for c in group),
                   time.perf_counter() - start, kind='cell', units=len(group))
        rows = [table.row_of(cell, summary, values)
                for cell, (summary, values) in zip(group, done)]
        for row in rows:  # a cell the job did not time: its group's span
          if row.get('other_load_cores') is None and load.cpu_s is not None:
            row['other_load_cores'] = load.cpu_s / load.seconds
        rows = {r['cell']: r for r in result['rows'] + rows}  # the new last
        result['rows'] = [rows[name] for name in names if name in rows]
      table.write(spec, table.repredict(spec, result, profile), out, here)
      sync()
      ran += group
      programs.release_if_crowded()  # a long sweep compiles many programs
      if result['failed'] and jax.process_count() > 1:
        break  # a peer may wait in a collective the failure skipped: end
    result['time_log'] = clock.log
    if spec.finish is not None and jax.process_index() == 0:
      spec.finish(result, pathlib.Path(here or out))
    table.write(spec, table.repredict(spec, result, profile), out, here)
    if result['failed']:  # each error once, with the cells it ended
      ended = {e: [f['cell'] for f in result['failed'] if f['error'] == e]
               for e in dict.fromkeys(f['error'] for f in result['failed'])}
      raise CellsFailed(
          f"{len(result['failed'])} of {len(cells)} cells failed (all are in "
          f"{out}.json): " + '; '.join(
              f"{', '.join(names)}: {e}" for e, names in ended.items()))
    return result


def earlier_rows(out: str, cells, header) -> List[Dict[str, Any]]:
  """The rows of OUT.json (local or gs://, if there) of the cells named in
  `cells`. Refused, not overwritten: a file that is no results file, or
  another spec's, or a run's of another header (machine, examples,
  repeats, mesh...) with rows (this one's would not keep them)."""
  path = f'{out}.json'
  try:
    earlier = json.loads(checkpoints.read_bytes(path)) if checkpoints.isfile(
        path) else {'spec': header['spec'], 'rows': []}  # none: none kept
    kept = [row for row in earlier['rows'] if row['cell'] in cells]
    theirs = {k: earlier[k] if k == 'spec' else earlier.get(k) for k in (
        'spec', 'models', 'machine', 'num_examples', 'timing_repeats',
        'shrunk', 'mesh', 'model_fields')}  # the header the rows are under
  except (ValueError, KeyError, TypeError) as e:
    raise checks.InputError(f'{path} is no results file to update ({e!r}); '
                            'move it away or give another --out') from None
  ours = json.loads(json.dumps({k: header.get(k) for k in theirs}))
  differ = [f'{k} {theirs[k]} vs {ours[k]}' for k in theirs
            if theirs[k] != ours[k]]
  if differ and (earlier['rows'] or theirs['spec'] != ours['spec']):
    raise checks.InputError(
        f"{path} holds another run's results ({'; '.join(differ)} in this "
        'one): this run would drop them; give another --out or move it away')
  return kept
