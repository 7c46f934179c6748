"""A plan of specs run on programs compiled ahead of time.

The eval job, and so every sweep spec, compiles each program it runs
through one seam (`scaffold.programs_from`), which asks a provider for a
traced program's executable by its fingerprint (the same on the device's
arrays and on shape structs of a compile-only twin). So a budgeted run on
a rented accelerator spends its minutes timing, not compiling:

  build    here: each cell of the plan run on shape structs within a
           `Recorder` (`record_cell`), every program it asks for compiled
           for the twin into an executable store under its fingerprint;
  project  the run's seconds on the device's hardware profile;
  run      there: the plan's specs under one clock within
           `scaffold.programs_from(Provider(store))` (a program the store
           lacks compiles there, and the run's log says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shlex
import shutil
import tarfile
import tempfile
import threading
import time
from typing import (Any, Dict, Iterator, List, Mapping, Optional, Sequence,
                    Tuple)

import jax
import numpy as np

from specdec_jax import checks
from specdec_jax import compiled
from specdec_jax import hardware
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import programs
from specdec_jax import scaffold
from specdec_jax import unit_loop
from specdec_jax.bench import budget
from specdec_jax.bench import report
from specdec_jax.experiments import reproduce
from specdec_jax.experiments import specs as specs_lib
from specdec_jax.experiments import sweep
from tools.accelerator import aot

# The plan a run takes by default, the next GPU's table in priority order
# (the items: tools/accelerator/README.md); 16 examples a row, each timed
# once after its warm-up.
ONCE = ';num_examples=16;timing_repeats=1'
DEFAULT_PLAN = (
    'profile:xxl_cost',
    'table2:xxl_cost;batch_gamma=always' + ONCE,
    'trees:xxl_cost;temperature=0;drafting=chain 7|beam:8,4,12/64|'
    'beam:16,4,16/64|beam:8,8,8/64|beam:8,16,8/64|chosen 64' + ONCE,
    'batches:xxl_cost;temperature=0;batch_size=8|32;batching=fixed' + ONCE,
    'hf:shipped' + ONCE,
    'trees:xxl_cost;model_fields=attention_kernel=cudnn;temperature=0;'
    'drafting=chain 7|beam:8,16,8/64' + ONCE,
    'trees:xxl_cost;model_fields=attention_kernel=cudnn,dense_kernel=pallas;'
    'temperature=0;drafting=chain 7|beam:8,16,8/64' + ONCE)


Plan = Sequence[Tuple[sweep.Spec, sweep.Options]]


# What a plan item may set (its other `field=value`s select cells).
ITEM_OPTIONS = {'num_examples': int, 'timing_repeats': int,
                'model_fields': lambda v: tuple(v.split(','))}


def parse_plan(items: Sequence[str], **common
               ) -> List[Tuple[sweep.Spec, sweep.Options]]:
  """`spec:models[;shrink][;field=value...]` items, in priority order, as
  (spec, options; `common`: other `sweep.Options` fields of every item).
  A `field=value` sets an option of `ITEM_OPTIONS`, or keeps the cells it
  matches (`sweep.matches`: 'a|b' for either value)."""
  plan = []
  for item in items:
    name, _, rest = item.partition(':')
    models, *parts = rest.split(';')
    pairs = [p.partition('=')[::2] for p in parts if '=' in p]
    if any(p != 'shrink' for p in parts if '=' not in p):
      raise ValueError(f'plan item {item!r}: '
                       'spec:models[;shrink][;field=value...]')
    set_ = {k: ITEM_OPTIONS[k](v) for k, v in pairs if k in ITEM_OPTIONS}
    plan.append((specs_lib.get(name), sweep.Options(
        models=models or 'shipped', shrink='shrink' in parts,
        where=tuple(f'{k}={v}' for k, v in pairs if k not in ITEM_OPTIONS),
        **set_, **common)))
  return plan


def item_name(spec: sweep.Spec, options: sweep.Options) -> str:
  """A plan item's name: the spec's and its model fields' ('trees
  attention_kernel=cudnn')."""
  return ' '.join((spec.name,) + options.model_fields)


def spec_command(spec: sweep.Spec, o: sweep.Options) -> str:
  """The experiments command that runs a plan item's cells itself (its
  results' header: the programs the store gives are those it compiles)."""
  return shlex.join(['python', '-m', 'specdec_jax.experiments', 'run',
                     spec.name, f'--models={o.models}'] + [
      f'--{k}={v}' for k, v in (('tasks', ','.join(o.tasks or ())), (
          'num_examples', o.num_examples), ('repeats', o.timing_repeats))
      if v] + ['--shrink'] * o.shrink + [f'--where={w}' for w in o.where] + [
          f'--model_fields={f}' for f in o.model_fields])


def abstract_loaded(setup: loading.EvalSetup,
                    cache: Optional[loading.LoadCache] = None
                    ) -> loading.Loaded:
  """`loading.build(setup)` with the params as shape structs: the build
  traced (`jax.eval_shape`), so a widened model costs no memory; what it
  reads from files (the shipped weights, a task's vocabulary and train
  split) is read."""
  made = {}

  def build():
    made['loaded'] = loaded = loading.build(setup, cache=cache)
    return loaded.target_params, loaded.draft_params

  target_params, draft_params = jax.eval_shape(build)
  return dataclasses.replace(made['loaded'], target_params=target_params,
                             draft_params=draft_params)


# The alphas a build prices the gammas a job may choose at (its drafters'
# alphas are measured on the device; the choice's best gammas over these).
LIKELY_ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)


def _gammas(loaded: loading.Loaded, profile=None,
            drafter: Optional[str] = None) -> Tuple[int, ...]:
  """The gammas the job may decode a setup with: the configured one; where
  it chooses (`unit_loop.chooses_gamma`), all but 0, or those it would
  choose at `LIKELY_ALPHAS` on the device's `profile` (`drafter`: its c)."""
  setup = loaded.setup
  if not unit_loop.chooses_gamma(loaded):
    return (setup.gamma,)
  if profile is None:
    return tuple(range(1, setup.batch.max_gamma + 1))
  return tuple(sorted({setup.gamma} | {_speedup(
      profile, setup, drafter, alpha)[1] for alpha in LIKELY_ALPHAS} - {0}))


def decode_programs(loaded: loading.Loaded, gammas: Sequence[int]
                    ) -> Iterator[Tuple[programs.Program, tuple]]:
  """The decode programs the eval job runs on `loaded`'s setup, each with
  its arguments as shape structs: the baseline and the speculative loop of
  each of `gammas` (`_gammas`) at the input shape of each unit
  (`unit_loop.units`; a short last one has its own)."""
  setup = loaded.setup
  rows = setup.data.num_examples or setup.batch.size
  dummy = np.zeros((rows, setup.data.task_feature_lengths['inputs']), np.int32)
  shapes = sorted({x.shape for _, _, _, x in unit_loop.units(setup, dummy)})
  rng = jax.eval_shape(lambda: jax.random.key(0))
  seen = set()
  for shape in shapes:
    inputs = jax.ShapeDtypeStruct(shape, np.int32)
    for gamma in gammas:
      for program in filter(None, unit_loop.programs_at(loaded, gamma)):
        args = ((loaded.target_params, inputs, rng)
                if program.spec.kind == 'baseline' else
                (loaded.target_params, loaded.draft_params, inputs, rng))
        if (program.spec, shape) not in seen:
          seen.add((program.spec, shape))
          yield program, args


def _zeros(info):
  """Zeros of an output's shape and dtype (a PRNG key's: key data 0)."""
  if jax.dtypes.issubdtype(info.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(np.zeros(info.shape + (2,), np.uint32))
  return np.zeros(info.shape, info.dtype)


class Recorder:
  """A provider that runs nothing: it keeps every program it is asked for
  (fingerprint -> its function's name and `lower_on`) and answers with a
  stand-in returning zeros of the program's outputs at once (what a timing
  of it says is never used): within it a cell's own code runs on shape
  structs, naming its programs."""

  def __init__(self):
    self.programs: Dict[str, Tuple[str, Any]] = {}

  def __call__(self, traced, fingerprint: str, lower_on, name: str):
    self.programs.setdefault(fingerprint, (name, lower_on))
    outputs = jax.tree.map(_zeros, traced.out_info)
    return lambda *args: outputs


def record_cell(spec: sweep.Spec, cell: sweep.Cell, setup: loading.EvalSetup,
                recorder: Recorder, cache=None, log=print, profile=None,
                drafter: Optional[str] = None) -> None:
  """Runs a cell on shape structs within `recorder`: its decode programs
  (`decode_programs`), the profile the job measures for a gamma
  (`unit_loop.call_times`) or a tree (`unit_loop.tree_evidence`, the
  trees `likely_trees`), and the cell's measurements (the spec's own
  functions). A measurement that cannot run on shapes (it computes on a
  weight outside a program) is named and left to the device."""
  loaded = abstract_loaded(setup, cache)
  inputs = sweep.first_inputs(setup, loaded.task, cache)
  known = {**sweep.MEASUREMENTS, **spec.measurements}
  steps = [(m, lambda m=m: sweep.take(known[m][0], loaded, inputs, {
      'timing_repeats': 1})) for m in cell.measure]  # any count: one program
  if spec.decode:
    decoded = [(loaded, _gammas(loaded, profile, drafter))]
    if setup.draft.chooses_tree:  # its choice's measurements and trees
      decoded = [(at, (at.drafter.shape.depth,)) for at in (
          unit_loop.with_tree(loaded, t) for t in likely_trees(
              setup, profile, drafter, log))] or [(loaded, (0,))]
      n = unit_loop.choice_examples(setup)
      rows, out = (np.zeros((n, setup.data.task_feature_lengths[k]), np.int32)
                   for k in ('inputs', 'targets'))
      steps.insert(0, ('tree choice', lambda: unit_loop.tree_evidence(
          loaded, rows, (out, np.zeros(n, np.int32)))))
    steps.insert(0, ('decode', lambda: [
        program(*args) for at, gammas in decoded
        for program, args in decode_programs(at, gammas)]))
    if unit_loop.chooses_gamma(loaded):
      steps.insert(1, ('gamma profile',
                       lambda: unit_loop.call_times(loaded, inputs)))
  with scaffold.programs_from(recorder):
    for what, step in steps:
      try:
        step()
      except Exception as e:  # pylint: disable=broad-except
        log(f'{spec.name} {cell.name}: {what} not built ({e!r:.200})')


def likely_trees(setup: loading.EvalSetup, profile, drafter: Optional[str],
                 log=print) -> Tuple[str, ...]:
  """The trees a job choosing its tree ('choose:N') likely decodes on the
  device of `profile` (`unit_loop.predicted_choice`, made here on the
  setup's models unwidened: a widening keeps their tokens; not from a
  cache of shapes), then the one it takes; none without a profile."""
  if profile is None:
    return ()
  plain = setup.replace(target_widen_to=None, draft_widen_to=None)
  try:
    loaded = loading.build(plain)
    choice = unit_loop.predicted_choice(loaded, sweep.first_inputs(
        plain, loaded.task, n=unit_loop.choice_examples(setup)), profile,
                                        drafter)
  except Exception as e:  # pylint: disable=broad-except
    log(f'{setup.data.mixture_or_task_name}: no likely tree ({e!r:.200})')
    return ()
  return tuple(dict.fromkeys([t['spec'] for t in choice['trees']] + [
      choice['tree']] * bool(choice['gamma'])))


def record_plan(plan: Plan, profile=None, log=print
                ) -> Iterator[Tuple[int, str, str, Tuple[str, Any]]]:
  """Each new program the cells of `plan` run (`record_cell`; with the
  device's `profile`, a job choosing gamma at the gammas it likely
  chooses, `_gammas`) as (its cell's place in the plan, the cell's name,
  its fingerprint, (its function's name, `lower_on`)), in plan order."""
  cache, recorder = loading.LoadCache(), Recorder()
  order = 0
  for spec, options in plan:
    options = sweep.options_of(spec, options)
    models = sweep.model_set(options)
    for cell in sweep.plan(spec, options):
      order += 1
      before = set(recorder.programs)
      record_cell(spec, cell, sweep.cell_setup(models, cell, options),
                  recorder, cache, log, profile,
                  reproduce.profile_name(options.models, cell.drafter))
      for fingerprint in [f for f in recorder.programs if f not in before]:
        yield (order, f'{spec.name} {cell.name}', fingerprint,
               recorder.programs[fingerprint])


def build(plan: Plan, store: aot.Store,
          device: Any, log=print, limit_bytes: Optional[int] = None,
          profile=None) -> Dict[str, Any]:
  """Compiles every program of `plan` (`record_plan`) for `device` (a
  compile-only twin, or this machine's own) into `store` under its
  fingerprint, in the plan's order (those there kept); with `limit_bytes`
  the plan's last programs (first, those of no cell of it) are dropped
  until the store fits (`aot.Store.fit`). Returns {'programs' (the
  fingerprints), 'built', 'kept', 'compile_s', 'bytes', 'dropped'}."""
  built = kept = 0
  seconds, programs_, orders = 0.0, {}, {}
  for order, where, fingerprint, (function, lower_on) in record_plan(
      plan, profile, log):
    programs_[fingerprint] = function
    orders.setdefault(fingerprint, order)
    if store.built(fingerprint):
      kept += 1
      continue
    start = time.perf_counter()
    executable = lower_on(device).compile()
    took = time.perf_counter() - start
    store.save(fingerprint, executable, took, order)['function'] = function
    store.write()
    seconds += took
    built += 1
    log(f'{where}: {function} built in {took:.1f} s')
  # Every program the plan runs, built or not: what a projection counts.
  store.manifest['plan_programs'] = programs_
  for key, entry in store.manifest['programs'].items():  # this plan's order
    entry['priority'] = orders.get(key, 1 << 30)  # of no cell: dropped first
  store.pack(final=True)  # xz packs: about half the bytes to carry
  dropped = [] if limit_bytes is None else store.fit(limit_bytes)
  return dict(programs=list(programs_), built=built, kept=kept,
              compile_s=round(seconds, 1), bytes=store.total_bytes(),
              dropped=dropped)


# The first target-call loop a run loads is checked (`Provider`).
CHECKED = '_repeated_calls[T5Model]'
AOT_SLOWER = 1.03
# The programs a run's XLA dump keeps: t(1)'s loop, a chain's, a tree's.
DUMPED = {'t(k)': CHECKED, 'chain': '_call[SpecLoop]',
          'tree': '_call[TreeLoop]'}


class Provider:
  """`scaffold.programs_from`'s provider over an executable store: a
  program the store holds (by fingerprint) is loaded, any other compiled
  here; `log` says which, and the seconds each took.

  The first loaded program named `check` is timed at its first call
  against itself compiled here (`measure.time_alternating`, medians of 5;
  `check`: the verdict). Slower than `slower` allows, the store is refused
  (`refused` says why) and every later program compiled here: no figure
  sets a loaded program beside one compiled here. The first program of
  each name in `dump` is kept (`traced`) for `dump_programs`."""

  def __init__(self, store: aot.Store, device: Any = None,
               check: Optional[str] = CHECKED,
               dump: Mapping[str, str] = DUMPED, slower: float = AOT_SLOWER):
    self.store = store
    self.device = device or jax.devices()[0]
    self.log: List[Dict[str, Any]] = []
    self.check_name, self.dump, self.slower = check, dump, slower
    self.check: Optional[Dict[str, Any]] = None
    self.refused: Optional[str] = None
    self.traced: Dict[str, Any] = {}

  def __call__(self, traced, fingerprint: str, lower_on, name: str):
    del lower_on  # the store's programs were lowered for this device's twin
    for label, wanted in self.dump.items():
      if name == wanted:
        self.traced.setdefault(label, traced)
    start = time.perf_counter()
    executable, why = (None, self.refused) if self.refused else (
        self.store.load(fingerprint, self.device))
    if executable is None:
      executable = traced.lower().compile()
    self.log.append(dict(
        program=fingerprint, function=name,
        source='compiled' if why else 'loaded',
        why=why or None, seconds=round(time.perf_counter() - start, 3)))
    if not why and self.check is None and name == self.check_name:
      self.check = dict(function=name, program=fingerprint,
                        verdict='not run yet')
      return self._checked(traced, executable)
    return executable

  def _checked(self, traced, loaded):
    """`loaded`, checked at its first call against `traced` compiled
    here (see the class); what the verdict keeps runs from then on."""
    chosen = []

    def run(*args):
      if not chosen:
        start = time.perf_counter()
        here = traced.lower().compile()
        compile_s = time.perf_counter() - start
        calls = {'loaded': lambda: loaded(*args), 'here': lambda: here(*args)}
        measure.time_alternating(calls)  # warm-up
        seconds = measure.time_alternating(calls, 5)[1]  # medians
        loaded_ms, here_ms = 1e3 * seconds['loaded'], 1e3 * seconds['here']
        ratio = loaded_ms / here_ms
        trusted = ratio <= self.slower
        self.check.update(
            loaded_ms=loaded_ms, compiled_here_ms=here_ms,
            loaded_over_compiled_here=ratio, limit=self.slower,
            compile_here_s=round(compile_s, 2),
            verdict='trusted' if trusted else 'refused')
        if not trusted:
          self.refused = (f'refused by the check: a loaded program ran '
                          f'{ratio:.2f}x the time of the one compiled here')
        chosen.append(loaded if trusted else here)
      return chosen[0](*args)
    return run

  def counts(self) -> Dict[str, Any]:
    """Programs loaded and compiled here, and the seconds of each kind."""
    of = lambda s: [e['seconds'] for e in self.log if e['source'] == s]
    return {k: v for s in ('loaded', 'compiled') for k, v in (
        (s, len(of(s))), (f'{s}_s', round(sum(of(s)), 2)))}


XLA_DUMP = 'xla_dump.tar.xz'
# What a dump keeps of each program: the thunks a GPU's runtime launches
# (`program_cost` reads them) and the optimized HLO.
DUMP_FILES = ('thunk_sequence_after_thunk_passes.txt',
              'after_optimizations.txt')


def dump_programs(provider: Provider, out: pathlib.Path) -> Dict[str, Any]:
  """XLA's dump of the programs `provider` kept (`Provider.traced`), each
  compiled again here with `xla_dump_to`, the files of `DUMP_FILES` in one
  `XLA_DUMP` in `out` (what checks the compiled-program cost model against
  the device's own build): {'file' (None: none), 'files': {label: names},
  'errors', 'note'}."""
  record = dict(file=None, files={}, errors={})
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    for label, traced in provider.traced.items():
      try:
        traced.lower().compile(compiler_options=dict(
            xla_dump_to=str(tmp / 'xla' / label), xla_dump_hlo_as_text=True))
      except Exception as e:  # pylint: disable=broad-except
        record['errors'][label] = f'{type(e).__name__}: {e}'[:500]
        continue
      kept = sorted(f for f in (tmp / 'xla' / label).glob('*.jit_*')
                    if f.name.endswith(DUMP_FILES))
      for f in kept:
        (tmp / 'kept' / label).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, tmp / 'kept' / label / f.name)
      record['files'][label] = [f.name for f in kept]
    if not any('thunk_sequence' in f for fs in record['files'].values()
               for f in fs):
      record['note'] = ('no thunk sequence: XLA writes one for a GPU; '
                        f'this run is on {jax.devices()[0].platform}')
    if (tmp / 'kept').is_dir():
      with tarfile.open(out / XLA_DUMP, 'w:xz') as tar:
        tar.add(tmp / 'kept', arcname='xla_dump')
      record['file'] = XLA_DUMP
  return record


# What `run` leaves in its output folder (a lent machine sends back 8 files).
PACKED = 'results.tar.xz'
RUN_LOG = 'stored_run.json'


def _pack(results: pathlib.Path, out: pathlib.Path,
          work: Sequence[pathlib.Path] = ()) -> None:
  """Every results file so far and the specs' work folders (each finished
  cell's summary and examples), as one xz tar in `out` (replaced whole)."""
  pending = out / (PACKED + '.pending')
  with tarfile.open(pending, 'w:xz') as tar:
    for path in sorted(results.iterdir()):
      tar.add(path, arcname=path.name)
    for folder in filter(pathlib.Path.is_dir, work):
      tar.add(folder, arcname=f'work/{folder.parent.name}_{folder.name}')
  os.replace(pending, out / PACKED)


# The run's hard stop (a lent machine kills a command at its limit and
# sends back what is written): `_watch`.
PACK_EVERY_S = 30.0
DEADLINE_EXIT = 3


def _watch(write, clock, finished: threading.Event, log) -> None:
  """`write()` every `PACK_EVERY_S` until `clock` runs out; then, unless
  the run `finished`, once more, and the process ends (`run`'s daemon)."""
  while True:
    ended = finished.wait(min(PACK_EVERY_S, max(clock.left(), 0.01)))
    if ended:
      return
    try:
      write()
    except (OSError, RuntimeError) as e:  # a file or a dict in flux
      log(f'pack skipped: {e!r:.200}')
    if clock.left() <= 0:
      log('the clock ran out inside a spec: stopped, what finished packed')
      os._exit(DEADLINE_EXIT)  # pylint: disable=protected-access


# Seconds a dump's compiles may take at most: left out when fewer remain.
DUMP_S = 120.0


def run(plan: Plan, store: aot.Store,
        out: pathlib.Path, max_minutes: Optional[float] = None,
        results: Optional[pathlib.Path] = None, log=print,
        provider: Optional[Provider] = None) -> Dict[str, Any]:
  """Runs the plan's specs in order within one clock, on the store's
  programs (`Provider`, and its check). Each spec's results go to
  `results/<spec>_<models>.*` (default: beside the first spec's work
  folder); `out` holds them in one xz tar (`PACKED`) with the run's log
  (`RUN_LOG`), and where the clock leaves `DUMP_S`, XLA's dump of the
  programs `Provider.dump` names (`XLA_DUMP`). A spec that no longer fits
  the clock is left out (named); at the clock's end the run stops
  wherever it is, what finished packed (`_watch`).

  Returns:
    {'device_facts', 'check', 'specs': {name: {'rows', 'failed',
    'skipped'}}, 'left_out', 'xla_dump', 'programs': `Provider.counts`,
    'program_log', 'time_log'}.
  """
  clock = budget.Clock(float('inf') if max_minutes is None else max_minutes)
  provider = provider or Provider(store)
  result = dict(device_facts=aot.device_facts(), specs={}, left_out=[])
  out.mkdir(parents=True, exist_ok=True)
  if results is None:
    results = pathlib.Path(plan[0][1].work_dir).expanduser() / 'stored_results'
  results.mkdir(parents=True, exist_ok=True)

  work = [sweep.work_folder(spec, sweep.options_of(spec, options))
          for spec, options in plan]
  lock, finished = threading.Lock(), threading.Event()

  def write():
    with lock:
      result.update(check=provider.check, refused=provider.refused,
                    programs=provider.counts(),
                    program_log=list(provider.log), time_log=clock.log)
      (out / RUN_LOG).write_text(json.dumps(result, indent=1))
      _pack(results, out, work)

  if max_minutes is not None:
    threading.Thread(target=_watch, args=(write, clock, finished, log),
                     daemon=True).start()
  with scaffold.programs_from(provider):
    for spec, options in plan:
      name = item_name(spec, options)
      left = clock.left()
      if left <= 0:
        result['left_out'].append(name)
        continue
      options = dataclasses.replace(options, max_minutes=min(
          options.max_minutes, left / 60))
      start = time.perf_counter()
      try:
        spec_result = sweep.run(spec, options, command=spec_command(
            spec, options), out=str(
                results / f'{spec.name}_{sweep.results_name(options)}'))
      except sweep.CellsFailed as e:
        log(f'{name}: {e}')
        spec_result = None
      clock.note(name, time.perf_counter() - start, kind='spec')
      if spec_result is not None:
        result['specs'][name] = {k: len(spec_result[k]) for k in
                                 ('rows', 'failed', 'skipped')}
        written = spec_result.get('hardware_profile')  # the profile spec's
        if written and pathlib.Path(written).parent != results:
          shutil.copy(written, results / pathlib.Path(written).name)
      write()
  if clock.fits(DUMP_S, 'XLA dump'):
    start = time.perf_counter()
    result['xla_dump'] = dump_programs(provider, out)
    clock.note('XLA dump', time.perf_counter() - start, kind='dump')
  else:
    result['xla_dump'] = dict(file=None, note='left out: the clock')
  finished.set()
  write()
  return result


# What a projection takes where nothing has measured it yet (its output
# names them): alpha of every drafter; a timing loop's calls per k (20
# calls, in the compiling run, one check and 5 repeats: `measure.loop_time`);
# the seconds of a program compiled on the device; a store's load rate; the
# trees a tree choice decodes.
ASSUMED = dict(alpha=0.7, loop_calls=140, compile_s=30.0,
               load_mib_per_s=100.0, choice_trees=5)


def _near(profile, batch: int) -> int:
  """The profile's measured batch nearest `batch` (a batch it lacks)."""
  return min(profile.batches(), key=lambda m: (abs(m - batch), m))


def _speedup(profile, setup: loading.EvalSetup, drafter: str,
             alpha: float = ASSUMED['alpha']) -> Tuple[float, int]:
  """A speculative decode's predicted (speed-up, gamma): Theorem 3.8 at
  `alpha` with `drafter`'s c (where the job chooses gamma: the best one;
  0 where even that is slower); (2, its gamma) where the profile cannot
  price the drafter (a tree, no c for it)."""
  if setup.draft.tree is not None:
    return 2.0, setup.gamma
  try:
    best = hardware.predict(
        profile, alpha=alpha, drafter=drafter,
        gamma=None if setup.batch.profile_gamma else setup.gamma,
        batch=_near(profile, setup.batch.size),
        max_gamma=setup.batch.max_gamma)
  except (KeyError, ValueError):
    return 2.0, setup.gamma
  return max(1.0, best.speedup), int(best.gamma if best.speedup >= 1 else 0)


def project(plan: Plan, profile, store: Optional[aot.Store] = None,
            log=print) -> Dict[str, Any]:
  """The seconds a run of `plan` would take on `profile`'s device
  (PROJECTED, from its t(1) and cost(k) and `ASSUMED`): per spec, its
  decodes (a unit: the output length's steps at t(1), the baseline and
  each cell's speculative decode at its predicted speed-up, a warm-up and
  the timed repeats; cells that share a baseline decode together) and
  timing loops (a profile's cells, a job's gamma choice, a cell's 'costs'
  measurement: `ASSUMED['loop_calls']` calls per k); and the programs:
  loaded from `store`, or compiled on the device (those the build recorded
  but left out; with no build, every one the plan runs, recorded here).
  """
  t1 = profile.t1_ms / 1e3
  loops = lambda ks, b=1: sum(ASSUMED['loop_calls'] * t1 * profile.cost_at(
      k, _near(profile, b))[0] for k in ks)
  out = dict(specs={}, assumed=ASSUMED, profile=profile.name)
  for spec, options in plan:
    options = sweep.options_of(spec, options)
    models = sweep.model_set(options)
    cells = sweep.plan(spec, options)
    seconds = 0.0
    for group in sweep.groups(models, cells, options):
      setups = [sweep.cell_setup(models, c, options) for c in group]
      named = [reproduce.profile_name(options.models, c.drafter) for c in group]
      first = setups[0]
      top, b = first.batch.max_gamma, first.batch.size
      names = {m for c in group for m in c.measure}
      seconds += loops(range(1, top + 2), b) * (
          ('costs' in names) + sum(s.chooses_gamma for s in setups))
      if not spec.decode:  # one measurement a cell
        seconds += sum(loops(range(1, top + 2) if c.labels.get(
            'measurement') == 't(k)' else [1]) for c in group)
        continue
      base = first.data.task_feature_lengths['targets'] * t1
      seconds += sum(  # a tree choice: loops, a baseline and trees at 2x
          loops(unit_loop.tree_widths(s.draft.tree_budget)) + base * (
              unit_loop.choice_examples(s) * (1 + ASSUMED['choice_trees'] / 2))
          for s in setups if s.draft.chooses_tree)
      units = -(-first.data.num_examples // b)
      spec_s = [base / _speedup(profile, s, n)[0]
                for s, n in zip(setups, named)]
      seconds += units * (1 + options.timing_repeats) * (base + sum(spec_s))
      seconds += first.data.num_examples * base * ('calibration' in names)
      # A gamma choice's alpha: the first examples' units decoded once more.
      seconds += -(-min(first.data.num_examples, unit_loop.CHOICE_EXAMPLES) // b
                   ) * sum(x for x, s in zip(spec_s, setups)
                           if s.chooses_gamma)
    out['specs'][item_name(spec, options)] = dict(cells=len(cells),
                                                  seconds=round(seconds))
  recorded = store.manifest['plan_programs'] if store and (
      'plan_programs' in store.manifest) else {
          f: name for _, _, f, (name, _) in record_plan(plan, profile, log)}
  stored_ = sum(bool(store and store.built(f)) for f in recorded)
  left = len(recorded) - stored_
  out['programs'] = programs = dict(
      recorded=len(recorded), stored=stored_, compiled_on_device=left,
      load_s=round(store.total_bytes() / 2**20 / ASSUMED['load_mib_per_s'])
      if store else 0, compile_s=round(left * ASSUMED['compile_s']))
  out['seconds'] = round(sum(v['seconds'] for v in out['specs'].values()) +
                         programs['load_s'] + programs['compile_s'])
  return out


def build_device(target: str, autotune: Optional[pathlib.Path],
                 facts_file: Optional[pathlib.Path]
                 ) -> Tuple[Any, Optional[str]]:
  """(device, config) a build compiles for: the compile-only twin of the
  device a run on it recorded (`facts_file`: a run log with its
  `device_facts`; XLA then describes the twin exactly as it did the
  device, and the device's `autotune` results, keyed by that, match),
  else `target`'s compile-only device; config: what the store's manifest
  says of it (a GPU's always: another makes other programs, e.g. another
  driver version captures other commands)."""
  if facts_file is not None:
    facts = report.read_json(facts_file).get('device_facts') or {}
    topology = aot.device_topology(facts)
    if topology is None:
      raise checks.InputError(f'{facts_file}: no topology in its device_facts')
    device = aot.twin_devices(compiled.TARGETS[target], topology)[0]
    aot.check_compiles(device)
    return device, (f'the device topology in {facts_file.name} (sha256 '
                    f'{aot.sha256(topology)[:16]})')
  if autotune is not None:
    raise checks.InputError('--autotune_results needs --device_facts (the '
                            'run log written with them): XLA keys the '
                            "results by the device's own description")
  if compiled.get_target(target).platform != 'gpu':
    return compiled.devices(target)[0], None
  config = compiled.default_target_config(target)
  return compiled.devices(target, config)[0], config


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  parser = argparse.ArgumentParser(prog='python -m tools.accelerator.stored',
                                   description=__doc__.split('\n\n')[0])
  parser.add_argument('what', choices=('build', 'run', 'project'))
  parser.add_argument('--plan', action='append', default=None, help=(
      'spec:models[;shrink][;field=value...], in priority order (default: '
      f'{", ".join(DEFAULT_PLAN)})'))
  parser.add_argument('--store', required=True, help='the store folder')
  parser.add_argument('--target', help=(
      "a compiled.TARGETS name (default: this machine's own device)"))
  parser.add_argument('--autotune_results', default=None, help=(
      f'build for a GPU: the {aot.AUTOTUNE_FILE} a run on it left (with '
      '--device_facts); without them the GEMMs are left to cuBLAS'))
  parser.add_argument('--device_facts', default=None, help=(
      f'build: a run log ({RUN_LOG}) holding the device\'s topology'))
  parser.add_argument('--out', default='results/stored_run',
                      help='run: where results.tar.xz, the run log, the XLA '
                      'dump and the autotune results go')
  parser.add_argument('--work_dir', help="the sweep's work folder (local)")
  parser.add_argument('--max_minutes', type=checks.positive, default=None)
  parser.add_argument('--profile', default=hardware.H100, help=(
      'build, project: the device\'s hardware profile (a name in '
      "specdec_jax/profiles/, or a file): the gammas likely chosen there"))
  parser.add_argument('--limit_mib', type=checks.positive, default=None, help=(
      "build: the store's most MiB (the plan's last programs dropped to fit)"))
  args = parser.parse_args(argv)
  checks.check_local_folder('work_dir', args.work_dir or '.')  # packed here
  checks.check_no_file_in_the_way('--store', args.store)
  with checks.one_line(ValueError, said='--plan: '):  # before any work
    plan = parse_plan(args.plan or DEFAULT_PLAN, **(
        {} if args.work_dir is None else {'work_dir': args.work_dir}))
    for spec, options in plan:  # an item matching no cell is refused
      sweep.plan(spec, sweep.options_of(spec, options))
  if args.what == 'build' and args.target is not None:  # a compile-only one
    compiled.get_target(args.target)  # else the known ones named
  path = lambda x: None if x is None else pathlib.Path(x)
  autotune, flags = path(args.autotune_results), []
  if args.what == 'build':
    # An executable jax took from its persistent cache serializes without
    # all of its code: never while building.
    jax.config.update('jax_enable_compilation_cache', False)
    if args.target is not None:
      # No GPU here: the CUDA plugin's check of the driver would leave it
      # unregistered; its XLA flags are read when the backend starts.
      os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
      flags = aot.build_flags(compiled.get_target(args.target).platform,
                              autotune)
  elif args.what == 'run':  # a GPU writes the autotune results it makes
    dumped = pathlib.Path(tempfile.mkdtemp()) / aot.AUTOTUNE_FILE
    flags = aot.dump_flags(dumped)
  os.environ['XLA_FLAGS'] = ' '.join(
      [os.environ.get('XLA_FLAGS', '')] + flags).strip()
  if args.what == 'project':
    result = project(plan, hardware.load(args.profile), aot.Store(
        pathlib.Path(args.store), args.target or 'gpu:h100'))
  elif args.what == 'build':
    target = args.target or aot.target_of(jax.devices()[0])
    device, config = (jax.devices()[0], None) if args.target is None else (
        build_device(target, autotune, path(args.device_facts)))
    store = aot.Store(pathlib.Path(args.store), target)
    store.describe(device, target_config=config, xla_flags=flags,
                   autotune=autotune and aot.autotune_record(
                       autotune, autotune.name))
    result = build(plan, store, device, limit_bytes=None if (
        args.limit_mib is None) else int(args.limit_mib * 2**20),
                   profile=hardware.load(args.profile))
    store.write()
  else:
    device = jax.devices()[0]
    store = aot.Store(pathlib.Path(args.store), args.target or
                      aot.target_of(device))
    if not store.manifest['programs']:  # else the device compiles them all
      raise SystemExit(f'error: no program in {store.dir}: give the --store '
                       'and --target of a build, or run the specs themselves')
    out = pathlib.Path(args.out)
    result = run(plan, store, out, args.max_minutes)
    if dumped.is_file():  # for the next build
      aot.rewrite_autotune_results()
      if aot.autotune_device(dumped.read_text()):
        shutil.copyfile(dumped, out / aot.AUTOTUNE_FILE)
    shutil.rmtree(dumped.parent, ignore_errors=True)
  print(json.dumps({k: v for k, v in result.items()
                    if k not in ('program_log', 'time_log', 'device_facts')},
                   indent=1))
  return result


if __name__ == '__main__':
  checks.run_main(main)
