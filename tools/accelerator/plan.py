"""A device run's plan: its spec, drafters, programs, phases and projection.

A device run (`run`: `python -m tools.accelerator`) is described by a
`DeviceSpec` (`spec`): its
phases in priority order, its sizes, temperatures, activations and result
sections. This module turns a spec and a run's flags into what the run
will do, before any model is loaded: the drafters (`roster`), every
program it compiles, by part and by phase (`programs`, `phase_keys`), the
units of work of each phase (`plan_units`) and their projected seconds.

Projection (`project`; `projection` in the json; printed first;
`--project` only prints it): the full plan's units per kind (programs
compiled, calibration decodes, t(k) and drafter timings, decode calls of
the table and sweep, of the numerics, of the batches) times that kind's
seconds per unit in a measured run's time log (`--project_from`: the spec's
H100 run in results/), `pool.projected_seconds`: compiles and
calibration as measured thread-seconds over the threads (no more than the
run had), the rest in sequence. The number of speculative programs follows
from the gammas the rule picks on that run's calibrated alphas, c and costs
(one per row for a drafter it did not time). A smoke run projects the full
run.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import pathlib
import subprocess
from typing import (Any, Collection, Dict, List, Mapping, Optional, Sequence,
                    Tuple)

from specdec_jax import hardware
from specdec_jax import task_table
from specdec_jax import theory
from specdec_jax.bench import report
from specdec_jax.drafters.tree import shape as shape_lib
from tools.accelerator import aot
from tools.accelerator import pool

# The repository (a run reads the measured run it projects from there, and
# keeps jax's compilation cache in its cache/).
ROOT = pathlib.Path(__file__).resolve().parents[2]

# What one command to a lent device machine carries in all: the working tree
# (the files git tracks and the untracked ones it does not ignore, the
# shipped models among them) and the ignored paths it names (aot/).
TRAVEL_LIMIT = 64 * 2 ** 20
# Left free of executables for files committed between a build and the run.
TRAVEL_MARGIN = 2 * 2 ** 20
# How much slower than the same program compiled on the device a loaded
# executable's t(1) may run before a run stops trusting its ahead-of-time
# build: over it, every program is compiled on the device (`aot`: a
# build without the device's autotune results ran 2.5x slower), so that no
# table sets loaded programs beside compiled ones. Within it, a table may
# mix them: a ratio of speeds is then off by at most this (t(1) on a GPU
# times to about 1%).
AOT_SLOWER = 1.03


def working_tree_bytes(root: pathlib.Path = ROOT) -> int:
  """The bytes of the files a device command sends besides the paths it
  carries: those git tracks in `root` and the untracked ones it does not
  ignore, as they are now. An OSError or CalledProcessError where `root`
  is not a git checkout."""
  names = subprocess.run(
      ['git', '-C', str(root), 'ls-files', '-z', '--cached', '--others',
       '--exclude-standard'], capture_output=True, check=True).stdout
  paths = {root / os.fsdecode(n) for n in names.split(b'\0') if n}
  return sum(p.lstat().st_size for p in paths if p.is_file())


def aot_budget(root: pathlib.Path = ROOT) -> int:
  """The bytes left for the executables a device command carries beside
  the working tree of `root` (`TRAVEL_LIMIT` less the tree and
  `TRAVEL_MARGIN`)."""
  return TRAVEL_LIMIT - TRAVEL_MARGIN - working_tree_bytes(root)


# What differs between a full run and --smoke. costs: cost name -> the
# dimensions models are widened to, or None (nothing widened); target: the
# shipped model that is the target.
Sizes = collections.namedtuple('Sizes', (
    's0 costs target input_length output_length batches profile_ks sweep '
    'max_gamma examples repeats numerics_examples calib_examples '
    'ngram_examples context copy_mib cost_repeats ngram_orders trees'))


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
  """A device run as data.

  Attributes:
    name: the spec's name (`python -m tools.accelerator` runs 'accelerator';
      its results are <out_dir>/<name>_<source>.{md,json,png}).
    title: the results' title (`<title> on <device>`).
    about: what the run measures (the command's help).
    phase_plan: the phases in priority order: (id, title, the parts it
      runs); the first is the hardware profile every later one needs.
    phases: the parts `--phases` names (costs always run).
    not_implemented: phase id -> what it would measure (not measured yet).
    profile_gaps: what the hardware profile does not measure yet.
    full: the sizes of a full run.
    smoke: the sizes of `--smoke` (tiny models, nothing widened).
    sigmas: the synthetic drafters' noise (x std(leaf)) by T5 size.
    t5_sizes: the paper's T5 drafters.
    temps: the temperatures of the table.
    acts: the activation dtypes of the numerics.
    sparse_ks: the k of the batch-1 cost curve beyond 17.
    paper_task: task -> the paper's task its rows are compared with.
    sections: the row lists of the json as markdown tables: (key, title,
      note, columns); a column is a row key or (header, function of a row).
    project_from: the measured run (json, repository-relative) whose time
      log projects a run.
  """
  name: str
  title: str
  about: str
  phase_plan: Tuple[Tuple[str, str, Tuple[str, ...]], ...]
  phases: Tuple[str, ...]
  not_implemented: Mapping[str, str]
  profile_gaps: Sequence[str]
  full: Sizes
  smoke: Sizes
  sigmas: Mapping[str, float]
  t5_sizes: Tuple[str, ...]
  temps: Tuple[float, ...]
  acts: Tuple[str, ...]
  sparse_ks: Tuple[int, ...]
  paper_task: Mapping[str, str]
  sections: Tuple[Tuple[str, str, str, Tuple[Any, ...]], ...]
  project_from: str

  @property
  def titles(self) -> Dict[str, str]:
    """Phase id -> its title."""
    return {pid: title for pid, title, _ in self.phase_plan}


@dataclasses.dataclass
class Draft:
  """A drafter of the table. group 1: the paper's drafters at T5 1.1 cost
  (and the first shipped one), 2: own-cost T5s, 3: n-grams, 4: the first
  drafter's token trees (P3; `tree` its shape); `proxy`: the
  unwidened model its alpha is calibrated with (the same function)."""
  name: str
  cost: str
  proxy: str
  paper: Optional[str]
  group: int
  label: str = ''
  drafter: Any = None
  params: Dict[str, Any] = dataclasses.field(default_factory=dict)
  tree: Optional[str] = None  # a token tree's shape (`shape.parse`)


def stream_rows(slots: int) -> int:
  """Examples of P4's streamed decode through `slots` slots: twice as
  many, so that finished rows are refilled."""
  return 2 * slots


def tree_name(main: str, tree: str) -> str:
  """The name of the first drafter's token tree of shape `tree`."""
  return f'{main} tree {tree}'


# P5's target: the unwidened model (as trained, bfloat16), in place of an
# activation dtype in a program's key; its drafter is the first drafter's
# unwidened proxy (`peer_name`). HF transformers decodes the same two.
AS_TRAINED = 'as trained'


def peer_name(proxy: str) -> str:
  """The name of P5's drafter: the first drafter's proxy, as trained."""
  return f'{proxy} {AS_TRAINED}'


def tree_keys(s: Sizes, main: str, act: str) -> List[tuple]:
  """The token trees' programs: greedy, batch 1, gamma = the depth."""
  return [('spec', act, tree_name(main, t), 1, shape_lib.parse(t).depth, 0.0)
          for t in s.trees]


def roster(spec: DeviceSpec, source: str, names: Sequence[str],
           s: Sizes) -> List[Draft]:
  """The drafters of a run, before any model is loaded."""
  sizes = spec.t5_sizes
  out = [Draft(n, f't5_1_1_{n}_cost', n, n, 1) for n in sizes
         ] if source == 'synthetic' else []
  for n in (n for n in names if n != 'target'):
    out.append(Draft(n, 'own', n, n if n in sizes else None,
                     2 if n in sizes else 1))
    if n in sizes:
      out.append(Draft(f'{n}@t5_1_1_{n}_cost', f't5_1_1_{n}_cost', n, n, 1))
  out += [Draft(n, 'own', n, n, 3, n) for order, n in (
      (1, 'unigram'), (2, 'bigram')) if order in s.ngram_orders]
  return sorted(out, key=lambda d: d.group)  # stable: the paper's first


def tasks_of(source: str) -> List[str]:
  """The tasks a run decodes: 'synthetic' inputs, or the task table's."""
  return ['synthetic'] if source == 'synthetic' else list(task_table.names())


def programs(spec: DeviceSpec, s: Sizes, drafts, tasks, gammas, phases,
             act: str):
  """{part: (keys compiled before the gammas are known, keys after)}.

  Keys: ('copy',), ('reference',), ('cache', act, batch), ('call', act,
  batch, k), ('draft', name, batch), ('base', act, batch, temp, block),
  ('spec', act, name, batch, gamma, temp), greedy streams of `rows`
  examples through `slots` refilled slots: ('sbase', act, slots, rows),
  ('sspec', act, name, slots, gamma, rows); `gammas` (task, name, temp) ->
  gamma by the profile, (task, name, temp, 'paper') -> by the paper's rule
  (the first drafter's), (task, name, 0.0, 'batch', b) -> by the profile
  at batch b; a row missing from it has a program of its own.
  """
  main, big = drafts[0].name, [b for b in s.batches if b > 1]
  g = lambda task, n, t, *rule: gammas.get((task, n, t, *rule)) or (
      '?', task, n, t, *rule)
  g0 = g(tasks[0], main, 0.0)
  k0 = g0 + 1 if isinstance(g0, int) else ('?', g0)
  out = {'costs': ([('copy',), ('reference',)] + [
      x for b in s.batches if needed_ks(s, b, phases) for x in (
          [('cache', act, b)] + [('call', act, b, k)
                                 for k in needed_ks(s, b, phases)] + [
              ('draft', d.name, b) for d in (drafts if b == 1 else drafts[:1])
          ])], [])}
  for t in spec.temps if 'table2' in phases else ():
    out[f'table2@{t:g}'] = ([('base', act, 1, t, 1)], [
        ('spec', act, d.name, 1, g(task, d.name, t), t)
        for task in tasks for d in drafts] + [
            ('spec', act, main, 1, g(task, main, t, 'paper'), t)
            for task in tasks])
  if 'trees' in phases:
    out['trees'] = ([('base', act, 1, 0.0, 1)] + tree_keys(s, main, act), [])
  if 'hf' in phases:
    out['hf'] = ([('base', AS_TRAINED, 1, 0.0, 1)], [
        ('spec', AS_TRAINED, peer_name(drafts[0].proxy), 1,
         g(task, main, 0.0), 0.0) for task in tasks])
  if 'sweep' in phases:
    out['sweep'] = ([('base', act, 1, 0.0, 1)],
                    [('spec', act, main, 1, x, 0.0) for x in s.sweep])
  if 'numerics' in phases:
    out['numerics'] = ([x for a in spec.acts for x in (
        ('base', a, 1, 0.0, 1), ('cache', a, 1), ('call', a, 1, 1))], [
            x for a in spec.acts for x in (('base', a, 1, 0.0, k0), (
                'spec', a, main, 1, g0, 0.0), ('call', a, 1, k0))])
  if 'batches' in phases:
    gb = {b: g(tasks[0], main, 0.0, 'batch', b) for b in big}
    out['batches'] = ([x for b in big for x in (
        ('base', act, b, 0.0, 1), ('cache', act, b), ('call', act, b, 1),
        ('draft', main, b), ('sbase', act, b, stream_rows(b)))], [
            x for b in big for x in (
                ('spec', act, main, b, g0, 0.0), ('call', act, b, k0),
                ('spec', act, main, b, gb[b], 0.0),
                ('sspec', act, main, b, gb[b], stream_rows(b)))])
  if 'cost_curve' in phases:
    out['cost_curve'] = ([('cache', act, b) for b in s.batches] + [
        ('call', act, b, k) for b in s.batches for k in curve(spec, s, b)
        if k not in needed_ks(s, b, phases)] + [('draft', main, b)
                                               for b in big], [])
  return out


def needed_ks(s: Sizes, b: int, phases: Collection[str]) -> Tuple[int, ...]:
  """The k whose t(k) the first phase times at batch b ('costs'): what the
  later phases' rows need, no more. At batch 1: 1..max_gamma + 1 (the
  gamma rules, every chain's cost(gamma + 1)) and, with the token trees,
  each tree's greedy verified width (its cost in P3's prediction). At a
  larger batch, with the batches run: 1..max_gamma + 1 (the rule at that
  batch in P4); else none. The rest of the curve (`curve`) is the part
  'cost_curve', in the last phase: its t(k) are each a program of their
  own, which the device compiles when the executables a command carries
  cannot hold them all (the shipped run on an H100: P1 with the whole
  curve projected 467 of the run's 480 seconds; docs/accelerator.md)."""
  if b != 1 and 'batches' not in phases:
    return ()
  ks = set(range(1, s.max_gamma + 2))
  if b == 1 and 'trees' in phases:
    ks |= set(tree_widths(s))
  return tuple(sorted(ks))


def tree_widths(s: Sizes) -> Tuple[int, ...]:
  """Each token tree's greedy verified width: the k of its target call."""
  return tuple(shape_lib.parse(t).verified_width(True) for t in s.trees)


def curve(spec: DeviceSpec, s: Sizes, b: int) -> tuple:
  """The k of the cost curve at batch b: at batch 1, 1..17 and the spec's
  `sparse_ks` up to `profile_ks[0]` (the token trees' widths); at larger
  batches 1..`profile_ks[1]`.

  Beyond k = 17 the batch-1 curve is timed at the sparse k only
  (`HardwareProfile.cost_at` interpolates the rest, labelled): every k is a
  program of its own, and 1..65 dense would be 99 programs with the larger
  batches' (P1 alone 780 s projected).
  """
  top = s.profile_ks[0 if b == 1 else 1]
  dense = tuple(range(1, min(top, 17) + 1))
  if b != 1:
    return dense
  return dense + tuple(k for k in spec.sparse_ks if 17 < k <= top)


def paper_gamma(alpha: float, c: float, max_gamma: int) -> int:
  """The paper's rule: the gamma that maximises Theorem 3.8's speed-up with
  a target call whose cost does not grow with k (cost(gamma + 1) = 1)."""
  a = min(theory.clamp_alpha(alpha), 0.999)
  return max(range(1, max_gamma + 1), key=lambda g: (1 - a ** (g + 1)) / (
      (1 - a) * (g * c + 1)))


def phase_keys(spec: DeviceSpec, s: Sizes, drafts, tasks, gammas, phases,
               act: str):
  """{phase id: (its programs, those no earlier phase compiles)}."""
  parts = programs(spec, s, drafts, tasks, gammas, phases, act)
  out, seen = {}, set()
  for pid, _, names in spec.phase_plan:
    keys = list(dict.fromkeys(
        k for n in parts for half in parts[n] for k in half
        if n.partition('@')[0] in names))
    out[pid] = (keys, [k for k in keys if k not in seen])
    seen |= set(keys)
  return out


def plan_units(spec: DeviceSpec, s: Sizes, drafts, tasks, gammas, phases,
               act: str, built: Collection[str] = (),
               calibrated: bool = False):
  """{phase id: its units per kind of step} (`pool.unit_seconds`'
  kinds; the run's setup belongs to no phase). `built`: the program names
  (`aot.program_name`) compiled ahead of time: each a 'load', not a
  'compile'; `calibrated`: the build computed the alpha calibration."""
  keys = phase_keys(spec, s, drafts, tasks, gammas, phases, act)
  main = drafts[0].name
  calls = lambda n, decoders: (n * s.repeats + 1) * decoders
  out = {}
  for pid, (_, new) in keys.items():
    count = lambda kind, new=new: sum(k[0] == kind for k in new)
    loads = sum(aot.program_name(k) in built for k in new)
    units = dict(compile=len(new) - loads, load=loads, calls=count('call'),
                 drafters=count('draft'))
    if pid == 'p1':
      units.update(bandwidth=1, calibration=0 if calibrated else len(
          tasks) * len(spec.temps))
    if pid == 'p2' and 'table2' in phases:
      units['decode'] = sum(calls(s.examples, 1 + len(
          {(d.name, gammas.get((task, d.name, t), d.name)) for d in drafts} |
          {(main, gammas.get((task, main, t, 'paper'), 'paper'))}))
                            for task in tasks for t in spec.temps)
    if pid == 'p3' and 'trees' in phases:
      units['decode'] = calls(s.examples, 1 + len(s.trees)) * len(tasks)
    if pid == 'p5' and 'hf' in phases:  # HF's two decodes counted alike
      units['decode'] = calls(s.examples, 4) * len(tasks)
    if pid == 'p4' and 'batches' in phases:
      # Fixed batches at two gammas and their baseline; the streams (two
      # batches' rows each) and theirs.
      units['batch_decode'] = sum(calls(1, 3 + 2 * 2) for b in s.batches
                                  if b > 1)
    if pid == 'p6':
      units['decode'] = calls(s.examples, 1 + len(s.sweep)) * (
          'sweep' in phases)
      units['numerics'] = len(spec.acts) * calls(s.numerics_examples, 3) * (
          'numerics' in phases)
    out[pid] = {k: v for k, v in units.items() if v}
  return out


def rule_gammas(spec: DeviceSpec, profile, alphas, s: Sizes, drafts, tasks):
  """The gammas of a run's rows, from a profile and calibrated alphas
  ((task, proxy, temperature) -> alpha), for the rows they can say:
  (task, drafter, temperature) -> the profile's rule (`hardware.predict`
  maximised), (..., 'paper') -> the paper's rule for the first drafter,
  and (task, first drafter, 0.0, 'batch', b) -> the profile's rule at
  batch b where the profile has b's cost curve and the drafter's c there.
  """
  alpha = lambda task, d, t: theory.clamp_alpha(alphas[task, d.proxy, t])
  known = [(task, d, t) for task in tasks for t in spec.temps for d in drafts
           if (task, d.proxy, t) in alphas and d.name in profile.drafters(1)]
  out = {(task, d.name, t): hardware.predict(
      profile, alpha=alpha(task, d, t), drafter=d.name,
      max_gamma=s.max_gamma).gamma for task, d, t in known}
  out.update({(task, d.name, t, 'paper'): paper_gamma(
      alphas[task, d.proxy, t], profile.c_of(d.name)[0], s.max_gamma)
              for task, d, t in known if d is drafts[0]})
  main = drafts[0]
  for b in (b for b in s.batches if b > 1):
    if b in profile.batches() and main.name in profile.drafters(b):
      out.update({(task, main.name, 0.0, 'batch', b): hardware.predict(
          profile, alpha=alpha(task, main, 0.0), drafter=main.name, batch=b,
          max_gamma=s.max_gamma).gamma for task in tasks
                  if (task, main.proxy, 0.0) in alphas})
  return out


def previous_gammas(spec: DeviceSpec, prev, prev_path: str, s: Sizes, drafts,
                    tasks):
  """`rule_gammas` on a measured run's profile and calibrated alphas."""
  return rule_gammas(
      spec, hardware.from_accelerator_run(prev, prev_path),
      {(a['task'], a['drafter'], a['temperature']): a['alpha']
       for a in prev.get('alpha_calibration', [])}, s, drafts, tasks)


# The kinds of a phase's steps that load or compile its programs (the rest
# is its timing, beside which programs of later phases compile).
PROGRAM_KINDS = ('compile', 'load', 'lower', 'ahead')


def compile_seconds(run) -> Optional[float]:
  """The thread-seconds of one compile in a run's time log, or None where
  it timed none."""
  rate = pool.unit_seconds(run).get('compile')
  return rate['thread_seconds'] / rate['units'] if rate and rate[
      'units'] and rate['thread_seconds'] else None


def ahead_count(timing_s: float, workers: int, compile_s: float,
                outstanding: int) -> int:
  """How many programs of later phases a phase lowers before it times, to
  compile beside its `timing_s` seconds: as many as keep `workers` threads
  busy that long at `compile_s` thread-seconds each, rounded up and at
  least one (a program still compiling when the next phase starts has
  saved it part of its compile, and its lowering is spent either way),
  less the `outstanding` ones still compiling."""
  return max(0, max(1, math.ceil(timing_s * workers / compile_s)) -
             outstanding)


def ahead_plan(prev, units, workers: Optional[int],
               lower_s: Optional[float]):
  """(units, extra) of a run that compiles ahead (`Runner.compile_ahead`),
  at the rates of the measured run `prev`: from the second phase on, each
  lowers `ahead_count` programs of the phases after it (one at a time at
  `lower_s` seconds, or `prev`'s own 'lower' seconds; tracing holds
  Python's lock), taken from their 'compile' units as 'lower' units of its
  own and 'ahead' units of theirs; they compile in order on the run's
  threads at `prev`'s thread-seconds per compile, and a phase waits for
  its last one ('ahead') before its own loads and compiles. `extra`:
  {phase id: its seconds lowering and waiting}. `units` unchanged and
  `extra` empty where `prev` timed no compile or no lowering seconds are
  known."""
  rates, job = pool.unit_seconds(prev), compile_seconds(prev)
  measured = rates.get('lower')
  if measured and measured['units']:
    lower_s = measured['seconds'] / measured['units']
  if job is None or lower_s is None:
    return units, {}
  workers_then = rates['compile']['workers']
  threads = max(1, min(workers or workers_then, workers_then))
  seconds = lambda u, kinds: pool.projected_seconds(
      prev, {k: v for k, v in u.items() if k in kinds}, workers)['seconds']
  out = {pid: dict(u) for pid, u in units.items()}
  pids, free, done_at = list(out), [0.0] * threads, []
  ready, extra, now = {}, {}, 0.0
  for i, pid in enumerate(pids):
    u = out[pid]
    wait = max(0.0, ready.get(pid, 0.0) - now)
    now += wait + seconds(u, ('compile', 'load'))
    timing = seconds(u, set(u) - set(PROGRAM_KINDS))
    n = ahead_count(timing, threads, job, sum(t > now for t in done_at)
                    ) if i else 0
    taken = []
    for q in pids[i + 1:]:
      take = min(n - len(taken), out[q].get('compile', 0))
      out[q]['compile'] = out[q].get('compile', 0) - take
      out[q]['ahead'] = out[q].get('ahead', 0) + take
      taken += [q] * take
    lower = len(taken) * lower_s
    for q in taken:  # compiled in order, each on the first free thread
      j = free.index(min(free))
      free[j] = max(free[j], now + lower) + job
      done_at.append(free[j])
      ready[q] = max(ready.get(q, 0.0), free[j])
    if taken:
      u['lower'] = len(taken)
    now += lower + timing
    if wait + lower:
      extra[pid] = wait + lower
  return {pid: {k: v for k, v in u.items() if v} for pid, u in out.items()
          }, extra


def project(spec: DeviceSpec, prev_path: str, s: Sizes, drafts, tasks,
            phases, act: str, workers: Optional[int],
            of: str, built: Collection[str] = (),
            calibrated: bool = False, ahead: bool = False,
            lower_s: Optional[float] = None) -> Dict[str, Any]:
  """The projected wall time of a plan, per phase (the module docstring);
  `built`: the programs compiled ahead of time (loaded, not compiled: a
  load's seconds are unmeasured until a run has loaded some);
  `calibrated`: the build computed the alpha calibration; `ahead`: the
  run compiles the later phases' other programs beside the earlier ones'
  timing (`ahead_plan`, with `lower_s` a build's seconds to lower a
  program)."""
  prev = report.read_json(ROOT / prev_path)  # an absolute path stays itself
  gammas = previous_gammas(spec, prev, prev_path, s, drafts, tasks)
  units = plan_units(spec, s, drafts, tasks, gammas, phases, act, built,
                     calibrated)
  planned, extra = ahead_plan(prev, units, workers, lower_s) if ahead else (
      units, {})
  modelled, units = planned is not units, planned
  total = collections.Counter(setup=1)
  for u in units.values():
    total.update(u)
  out = pool.projected_seconds(prev, dict(total), workers, source=prev_path)
  # A phase's lowering and waits for programs compiled ahead: `extra`.
  steps = lambda u: {k: v for k, v in u.items() if not modelled or k not in (
      'lower', 'ahead')}
  out.update(of=of, gammas_from_previous_run=sum(
      len(k) == 3 for k in gammas), plan=dict(total), phases={
          pid: dict(title=spec.titles[pid], units=u, seconds=round(
              pool.projected_seconds(prev, steps(u), workers)['seconds'] +
              extra.get(pid, 0.0), 1) if u else 0.0)
          for pid, u in units.items()})
  for pid, s_ in extra.items():
    out['phases'][pid]['ahead_s'] = round(s_, 1)
  # Each phase compiles in waves of its own: the run is its phases, not one
  # pool of all their programs.
  out['seconds'] = round(pool.projected_seconds(prev, {'setup': 1})[
      'seconds'] + sum(v['seconds'] for v in out['phases'].values()), 1)
  print(f"projected wall time of {of} on {out['device']}: {out['seconds']:.0f}"
        f' s (from {prev_path}: ' + ', '.join(
            f"{k} {v['units']} x {v['unit_s']:g} s"
            for k, v in out['by_kind'].items()) + ')', flush=True)
  if total.get('load') or total.get('ahead'):
    unmeasured = [k for k in ('load', 'lower', 'ahead') if k in out[
        'unmeasured'] and not (modelled and k in ('lower', 'ahead'))]
    print(f"  {total['load']} programs loaded from the ahead-of-time build, "
          f"{total['compile']} compiled on the device as their phase starts"
          + (f", {total['ahead']} beside the earlier phases' timing" if
             total.get('ahead') else '') + (
                 f" ({', '.join(unmeasured)} seconds unmeasured: not "
                 'counted)' if unmeasured else ''), flush=True)
  for pid, v in out['phases'].items():
    print(f"  {pid.upper()} {v['title']}: {v['seconds']:.0f} s" + (
        f' ({spec.not_implemented[pid]})' if pid in spec.not_implemented
        else ''), flush=True)
  return out
