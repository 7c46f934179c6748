"""A compile watch, an ahead-of-time compile pool, and the projected wall
time of a run from a measured one.

A run that must fit a device lease (`python -m tools.accelerator`: one call
of at most 9 minutes) spends most of its time compiling. Beside its
`specdec_jax.bench.budget.Clock` (wall time, the budget, the time log),
here:

- `CompileWatch`: records the programs jax compiles outside the pool (a
  compile inside a timed section would be timed);
- `Pool`: compiles lowered programs several at once in threads (and runs
  untimed jobs there), or loads them from executables compiled ahead of
  time elsewhere (`aot`), and keeps each executable and where it
  came from; it also compiles a later step's programs in threads of their
  own while the run times something else (`ahead`), and `compile` takes
  them when that step comes;
- `unit_seconds` / `projected_seconds`: the seconds of each kind of step in
  a measured run's time log, per unit, and the wall time of a plan of units
  at those rates.

The projection (`projected_seconds`): work in the pool (compiles,
calibration jobs, loads) runs in waves of as many jobs as the plan has
threads, at most as many as the measured run had (more threads are not
assumed to help: they may share the same cores), each wave as long as one
job's measured thread-seconds (an entry's busy thread-seconds / its units):
3 compiles on 8 threads take one compile's time, not 3/8 of it (the H100's
three token-tree compiles took 60 s, where 3/8 of the mean compile
projected 17). Every other kind costs its measured seconds per unit,
sequentially ('lower': the programs a step compiles ahead, lowered while
nothing is timed; 'ahead': the wait for them when their step comes, which
their compile beside the earlier steps' timing has shortened). Kinds the
measured run never timed are
listed in `unmeasured` and cost nothing; kinds of the run the plan does not
name are left out.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import re
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from specdec_jax.bench.budget import Clock

# Kinds of work that run in the pool's threads (the rest run one at a time).
POOLED = ('compile', 'calibration', 'load')
# What the accelerator run (`run`) ran with before its
# json recorded its kinds, units and sizes (the H100 run in results/):
# examples per Table 2 row, per sweep row, repeats, numerics repeats.
LEGACY = dict(examples=2, sweep_examples=1, repeats=3, numerics_repeats=2)


class CompileWatch(logging.Handler):
  """Records the programs lowered outside the compile pool's threads.

  jax logs (at DEBUG) every program it compiles; one of `names` compiled in
  a thread that is not the pool's is a program that was not compiled ahead
  of time. Install it once every timed program is in the pool's plans.
  """

  LOGGER = 'jax._src.interpreters.pxla'

  def __init__(self, names=('run', 'repeated_calls', '_repeated_proposals',
                            '_reference', 'copy_passes', 'context_cache')):
    super().__init__(logging.DEBUG)
    self.names = tuple(names)
    self.misses: List[str] = []
    self._parent = None

  def emit(self, record):
    if record.levelno >= logging.WARNING and self._parent is not None:
      self._parent.handle(record)  # what the logger would print anyway
    if threading.current_thread().name.startswith(Pool.THREADS):
      return
    match = re.match(r'Compiling (?:jit\()?(\w+)', record.getMessage())
    if match and match.group(1) in self.names:
      self.misses.append(match.group(1))

  def install(self) -> None:
    logger = logging.getLogger(self.LOGGER)
    self._parent = logger.parent
    logger.addHandler(self)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False

  def remove(self) -> None:
    logger = logging.getLogger(self.LOGGER)
    if self in logger.handlers:
      logger.removeHandler(self)
      logger.propagate = True
      logger.setLevel(logging.NOTSET)


class Pool:
  """Compiles programs (and runs untimed jobs) several at once in threads.

  `.compile()` of a lowered program puts it in jax's caches, so the call
  that runs it later (`decoding.temperature_sample`, `measure.call_time`,
  ...) starts at once. Keys name programs: each is compiled once per run.
  """

  THREADS = 'compile'

  def __init__(self, workers: int, clock: Clock):
    self.workers = workers
    self.clock = clock
    self.executor = concurrent.futures.ThreadPoolExecutor(
        workers, thread_name_prefix=self.THREADS)
    # The compiles of later steps (`ahead`): threads of their own, so that
    # a step's loads and compiles never queue behind them.
    self.ahead_executor = concurrent.futures.ThreadPoolExecutor(
        workers, thread_name_prefix=f'{self.THREADS}-ahead')
    self.pending: Dict[Any, Tuple[concurrent.futures.Future, str]] = {}
    self.compiled = set()
    self.executables: Dict[Any, Any] = {}
    self.sources: Dict[Any, str] = {}
    self.program_seconds: Dict[Any, float] = {}  # key -> its compile's

  @staticmethod
  def _timed(fn):
    start = time.perf_counter()
    return fn(), time.perf_counter() - start

  def submit(self, jobs: Mapping[Any, Callable[[], Any]]):
    """Starts `jobs` (key -> call); `collect` waits for them."""
    return time.perf_counter(), {key: self.executor.submit(self._timed, fn)
                                 for key, fn in jobs.items()}

  def ahead(self, compiles: Mapping[Any, Callable[[], Any]],
            source: str) -> List[Any]:
    """Starts compiling programs a later step needs (key -> a call that
    returns the executable), in order, in the ahead threads; the step's
    `compile` takes them (`source`: what its record says of each). Keys
    compiled or started already are left alone; returns the keys started.
    """
    new = [k for k in compiles if k not in self.compiled and
           k not in self.pending]
    for k in new:
      self.pending[k] = (self.ahead_executor.submit(self._timed, compiles[k]),
                         source)
    return new

  def collect(self, what: str, submitted, kind: str = 'untimed',
              units: Optional[float] = None) -> Dict[Any, Any]:
    """Waits for submitted jobs; notes their wall and busy thread seconds.

    Returns:
      key -> the job's result; `self.seconds`: key -> its seconds.
    """
    start, futures = submitted
    done = {key: future.result() for key, future in futures.items()}
    self.seconds = {key: s for key, (_, s) in done.items()}
    if futures:
      n = len(futures)
      self.clock.note(f'{what} ({n} jobs, {self.workers} threads)',
                      time.perf_counter() - start, kind=kind,
                      units=n if units is None else units, jobs=n,
                      workers=self.workers, thread_seconds=round(
                          sum(self.seconds.values()), 3))
    return {key: out for key, (out, _) in done.items()}

  def run(self, what: str, jobs: Mapping[Any, Callable[[], Any]],
          kind: str = 'untimed') -> Dict[Any, Any]:
    return self.collect(what, self.submit(jobs), kind)

  def compile(self, what: str, lowerings: Mapping[Any, Callable[[], Any]],
              load: Optional[Callable[[Any], Tuple[Any, str]]] = None,
              unloaded: str = '') -> int:
    """Compiles the programs not compiled yet; returns how many.

    Args:
      what: the step's name in the time log.
      lowerings: key -> a call with no arguments that lowers the program.
      load: key -> (an executable compiled ahead of time, or None and why
        not); the programs it gives are loaded (time-log kind 'load'), the
        others compiled here.
      unloaded: without `load`, why nothing is loaded (said of each
        program compiled).

    A program `ahead` started is waited for (time-log kind 'ahead'), not
    loaded or compiled again. `self.executables`: key -> the executable;
    `self.sources`: key -> 'loaded', the source `ahead` was given, or
    'compiled' (with why it was not loaded);
    `self.program_seconds`: key -> the thread-seconds of its compile.
    """
    new = {k: fn for k, fn in lowerings.items() if k not in self.compiled}
    why = {} if load is not None else dict.fromkeys(new, unloaded)
    ahead = {k: self.pending.pop(k) for k in list(new) if k in self.pending}
    if ahead:  # compiled beside earlier steps; one that failed is compiled
      start = time.perf_counter()  # below, saying why
      for k, (future, source) in ahead.items():
        try:
          exe, seconds = future.result()
        except Exception as e:  # pylint: disable=broad-except
          why[k] = f'its compile ahead failed: {e!r}'[:300]
          continue
        self.executables[k], self.sources[k] = exe, source
        self.program_seconds[k] = seconds
        self.compiled.add(k)
        del new[k]
      self.clock.note(f'{what}: wait for the {len(ahead)} compiled ahead',
                      time.perf_counter() - start, kind='ahead',
                      units=len(ahead))
    if load is not None and set(new) - set(why):
      loaded = self.collect(f'{what}: load', self.submit(
          {k: functools.partial(load, k) for k in new if k not in why}),
                            'load')
      for k, (exe, reason) in loaded.items():
        if exe is not None:
          self.executables[k], self.sources[k] = exe, 'loaded'
          self.compiled.add(k)
          del new[k]
        else:
          why[k] = reason
    done = self.collect(f'{what}: compile', self.submit(
        {k: (lambda lower=fn: lower().compile()) for k, fn in new.items()}),
                        'compile')
    self.program_seconds.update(self.seconds)
    for k, exe in done.items():
      self.executables[k] = exe
      self.sources[k] = 'compiled' + (f' ({why[k]})' if why.get(k) else '')
    self.compiled |= set(new)
    return len(new)

  def forget_loaded(self) -> List[Any]:
    """Drops the executables loaded (not compiled here): the next
    `compile` of their keys compiles them. Returns their keys."""
    keys = [k for k, v in self.sources.items() if v == 'loaded']
    for k in keys:
      del self.executables[k], self.sources[k]
      self.compiled.discard(k)
    return keys

  def adopt(self, key, executable, source: str) -> None:
    """`executable`, compiled elsewhere in the run, as the program `key`."""
    self.executables[key], self.sources[key] = executable, source
    self.compiled.add(key)

  def shutdown(self) -> None:
    self.executor.shutdown(wait=False, cancel_futures=True)
    self.ahead_executor.shutdown(wait=False, cancel_futures=True)


def _legacy(entry: Mapping[str, Any], run: Mapping[str, Any]
            ) -> Tuple[str, float]:
  """(kind, units) of a time-log entry written before entries had them."""
  what, s = entry['what'], LEGACY
  calls = lambda examples, decoders, repeats: (
      examples * decoders * repeats + decoders)  # + the first, untimed run
  if what.startswith('setup'):
    return 'setup', 1
  if 'jobs' in entry:
    return ('calibration' if 'calibration' in what else 'compile',
            entry['jobs'])
  if 'bandwidth' in what:
    return 'bandwidth', 1
  match = re.match(r'time t\(k\).*k = \[(.*)\]', what)
  if match:  # 0 s: every k was measured already
    return 'calls', len(match.group(1).split(',')) if entry['seconds'] else 0
  match = re.match(r'time drafters, batch (\d+)', what)
  if match:
    return 'drafters', sum(match.group(1) in d['t_draft_ms']
                           for d in run['drafters'].values())
  if re.match(r'batch \d+: decode', what):
    return 'batch_decode', calls(1, 2, s['repeats'])
  match = re.match(r'numerics, .*\((\d+) rows\)', what)
  if match:
    return 'numerics', calls(int(match.group(1)), 3, s['numerics_repeats'])
  if what.startswith('Table 2'):
    return 'decode', calls(s['examples'], 2, s['repeats'])
  if what.startswith('gamma sweep'):
    return 'decode', calls(s['sweep_examples'], 2, s['repeats'])
  return 'other', 1


def unit_seconds(run: Mapping[str, Any]) -> Dict[str, Dict[str, float]]:
  """Per kind of step in a run's time log: seconds, units, workers.

  An entry's seconds are wall seconds; a pooled entry's thread-seconds are
  the sum of its jobs' seconds (logged by `Pool`; in older logs its seconds
  x min(jobs, workers): every thread busy throughout). The wall time between
  entries that no entry covers is kind 'gap' (in runs before every step was
  logged: the caches built op by op before a t(k) timing).
  """
  out: Dict[str, Dict[str, float]] = {}
  last = 0.0
  for e in run['time_log']:
    kind, units = ((e['kind'], e['units']) if 'kind' in e
                   else _legacy(e, run))
    gap = e['at_s'] - e['seconds'] - last
    last = max(last, e['at_s'])
    if gap > 0.5:
      g = out.setdefault('gap', dict(seconds=0.0, units=0, workers=1))
      g['seconds'] += gap
      g['units'] += 1
    k = out.setdefault(kind, dict(seconds=0.0, units=0, workers=1,
                                  thread_seconds=0.0))
    workers = int(e.get('workers') or re.search(
        r'(\d+) threads', e['what']).group(1)) if kind in POOLED else 1
    k['seconds'] += e['seconds']
    k['thread_seconds'] += e.get('thread_seconds', e['seconds'] * min(
        e.get('jobs', 1), workers))
    k['units'] += units
    k['workers'] = max(k['workers'], workers)
  return out


def projected_seconds(run: Mapping[str, Any], plan: Mapping[str, float],
                      workers: Optional[int] = None, source: str = ''
                      ) -> Dict[str, Any]:
  """The wall time of `plan` (kind -> units) at a measured run's rates.

  Pooled kinds (`POOLED`) cost ceil(units / min(workers, the run's
  workers)) waves (`workers` None: the run's) of their thread-seconds per
  unit; the others their seconds per unit (see the module docstring).

  Returns:
    {'seconds', 'by_kind': {kind: {units, unit_s, seconds}}, 'unmeasured',
     'device', 'source', 'workers'}.
  """
  rates = unit_seconds(run)
  by_kind, unmeasured = {}, []
  for kind, units in plan.items():
    rate = rates.get(kind)
    if not units:
      continue
    if rate is None or not rate['units']:
      unmeasured.append(kind)
      continue
    if kind in POOLED:
      threads = max(1, rate['workers'] if workers is None else min(
          workers, rate['workers']))
      seconds = math.ceil(units / threads) * (
          rate['thread_seconds'] / rate['units'])
    else:
      seconds = units * rate['seconds'] / rate['units']
    by_kind[kind] = dict(units=units, unit_s=round(seconds / units, 3),
                         seconds=round(seconds, 1))
  return dict(seconds=round(sum(v['seconds'] for v in by_kind.values()), 1),
              by_kind=by_kind, unmeasured=unmeasured,
              device=run.get('device'), source=source, workers=workers)
