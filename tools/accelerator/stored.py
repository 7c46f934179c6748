"""A plan of specs run on programs compiled ahead of time.

The eval job, and so every sweep spec, compiles each decode program it
runs through one seam (`scaffold.programs_from`), which asks a provider
for the executable of a traced program by its fingerprint (its jaxpr and
XLA options: the same for the program traced on the device's arrays and
on shape structs of a compile-only twin). So a budgeted run on a rented
accelerator can spend its minutes timing instead of compiling:

  build   on a machine without the device: every cell of every spec in
          the plan built as the job builds it, its weights as shapes only
          (`abstract_loaded`: widening is traced, never run), its decode
          programs (`decode_programs`: the baseline and speculative loop
          of each gamma the job may use, at each unit's input shape)
          lowered for the device's compile-only twin, compiled and kept in
          an executable store under their fingerprints;
  run     on the device: the plan's specs, one after another under one
          clock, within `scaffold.programs_from(Provider(store))`. A
          program the store holds is loaded; any other (a measurement's
          timing loop, a tree the job chooses there) is compiled on the
          device, and the provider's log says which and how long.

  python -m tools.accelerator.stored build --plan table2:xxl_cost \
      --target gpu:h100 --store aot
  python -m tools.accelerator.stored run --plan table2:xxl_cost \
      --store aot --out results/<device>
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec_jax import compiled
from specdec_jax import loading
from specdec_jax import programs
from specdec_jax import scaffold
from specdec_jax import unit_loop
from specdec_jax.bench import budget
from specdec_jax.experiments import specs as specs_lib
from specdec_jax.experiments import sweep
from tools.accelerator import aot

# The plan a run takes by default: the profile first (every later
# prediction rests on it), then the headline table, trees, batches.
DEFAULT_PLAN = ('profile:xxl_cost', 'table2:xxl_cost', 'trees:xxl_cost',
                'batches:xxl_cost')


def parse_plan(items: Sequence[str], **common
               ) -> List[Tuple[str, sweep.Options]]:
  """`spec:models[:shrink]` items, in priority order, as (spec name,
  options; `common`: other `sweep.Options` fields of every item)."""
  plan = []
  for item in items:
    name, _, rest = item.partition(':')
    models, _, shrink = rest.partition(':')
    specs_lib.get(name)  # a clear error for an unknown spec
    if shrink not in ('', 'shrink'):
      raise ValueError(f'plan item {item!r}: spec:models[:shrink]')
    plan.append((name, sweep.Options(models=models or 'shipped',
                                     shrink=shrink == 'shrink', **common)))
  return plan


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


def _gammas(setup: loading.EvalSetup) -> Tuple[int, ...]:
  """The gammas the job may decode a setup with: the configured one, and
  every one a profile may choose (0, no speculation, needs no program)."""
  if setup.batch.profile_gamma and not setup.draft.chooses_tree:
    return tuple(range(1, setup.batch.max_gamma + 1))
  return (setup.gamma,)


def decode_programs(loaded: loading.Loaded
                    ) -> Iterator[Tuple[programs.Program, tuple]]:
  """The decode programs the eval job runs on `loaded`'s setup, each with
  its arguments as shape structs: the baseline and the speculative loop of
  each gamma (`_gammas`) at the input shape of each unit (`unit_loop
  .units`; a short last one has its own)."""
  setup = loaded.setup
  rows = setup.num_examples or setup.batch.size
  dummy = np.zeros((rows, setup.task_feature_lengths['inputs']), np.int32)
  shapes = sorted({x.shape for _, _, _, x in unit_loop.units(setup, dummy)})
  rng = jax.eval_shape(lambda: jax.random.key(0))
  seen = set()
  for shape in shapes:
    inputs = jax.ShapeDtypeStruct(shape, np.int32)
    for gamma in _gammas(setup):
      for program in unit_loop.programs_at(loaded, gamma):
        if program is None:
          continue
        args = ((loaded.target_params, inputs, rng)
                if program.spec.kind == 'baseline' else
                (loaded.target_params, loaded.draft_params, inputs, rng))
        if (program.spec, shape) not in seen:
          seen.add((program.spec, shape))
          yield program, args


def _placed(tree, device):
  """Shape structs placed on `device` (a compile-only twin's)."""
  sharding = jax.sharding.SingleDeviceSharding(device)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=sharding), tree)


def build(plan: Sequence[Tuple[str, sweep.Options]], store: aot.Store,
          device: Any, log=print) -> Dict[str, Any]:
  """Compiles the decode programs of every cell of `plan` for `device`
  (a compile-only twin, or this machine's own) into `store`, each under
  its fingerprint; programs already there are kept.

  Returns:
    {'programs': the fingerprints, 'built', 'kept', 'compile_s'}.
  """
  cache = loading.LoadCache()
  done: Dict[str, None] = {}
  built = kept = 0
  seconds = 0.0
  for priority, (name, options) in enumerate(plan):
    spec = specs_lib.get(name)
    options = sweep.options_of(spec, options)
    models = sweep.model_set(options)
    for cell in sweep.plan(spec, options) if spec.decode else ():
      loaded = abstract_loaded(sweep.cell_setup(models, cell, options), cache)
      for program, args in decode_programs(loaded):
        args = _placed(args, device)
        fingerprint = program.identity(*args)
        key = aot.program_name([fingerprint])
        if fingerprint in done:
          continue
        done[fingerprint] = None
        if store.built(key):
          kept += 1
          continue
        start = time.perf_counter()
        store.save(key, program.lower(*args).compile(),
                   time.perf_counter() - start, priority)
        store.write()
        seconds += time.perf_counter() - start
        built += 1
        log(f'{name} {cell.name}: {program.spec.kind} gamma '
            f'{program.spec.gamma} built in {time.perf_counter() - start:.1f}'
            ' s')
  store.pack(final=True)  # xz packs: about half the bytes to carry
  return dict(programs=list(done), built=built, kept=kept,
              compile_s=round(seconds, 1), bytes=store.total_bytes())


class Provider:
  """`scaffold.programs_from`'s provider over an executable store: a
  program the store holds (by fingerprint) is loaded, any other compiled
  here; `log` says which, and the seconds each took."""

  def __init__(self, store: aot.Store, device: Any = None):
    self.store = store
    self.device = device or jax.devices()[0]
    self.log: List[Dict[str, Any]] = []

  def __call__(self, traced, fingerprint: str, lower_on):
    del lower_on  # the store's programs were lowered for this device's twin
    start = time.perf_counter()
    executable, why = self.store.load(aot.program_name([fingerprint]),
                                      self.device)
    if executable is None:
      executable = traced.lower().compile()
    self.log.append(dict(
        program=fingerprint, function=traced.fun_name,
        source='compiled' if why else 'loaded',
        why=why or None, seconds=round(time.perf_counter() - start, 3)))
    return executable

  def counts(self) -> Dict[str, Any]:
    """Programs loaded and compiled here, and the seconds of each kind."""
    out = {}
    for source in ('loaded', 'compiled'):
      entries = [e for e in self.log if e['source'] == source]
      out[source] = len(entries)
      out[f'{source}_s'] = round(sum(e['seconds'] for e in entries), 2)
    return out


def run(plan: Sequence[Tuple[str, sweep.Options]], store: aot.Store,
        out: pathlib.Path, max_minutes: Optional[float] = None,
        log=print) -> Dict[str, Any]:
  """Runs the plan's specs in order within one clock, on the store's
  programs (`Provider`); each spec's results in `out/<spec>_<models>`.
  A spec that no longer fits the clock is left out (named).

  Returns:
    {'specs': {name: {'rows', 'failed', 'skipped'}}, 'left_out',
    'programs': `Provider.counts`, 'time_log'}.
  """
  clock = budget.Clock(float('inf') if max_minutes is None else max_minutes)
  provider = Provider(store)
  result = dict(specs={}, left_out=[])
  out.mkdir(parents=True, exist_ok=True)
  with scaffold.programs_from(provider):
    for name, options in plan:
      left = clock.left()
      if left <= 0:
        result['left_out'].append(name)
        continue
      options = dataclasses.replace(options, max_minutes=min(
          options.max_minutes, left / 60))
      start = time.perf_counter()
      try:
        spec_result = sweep.run(specs_lib.get(name), options,
                                out=str(out / f'{name}_{options.models}'))
      except sweep.CellsFailed as e:
        log(f'{name}: {e}')
        spec_result = None
      clock.note(name, time.perf_counter() - start, kind='spec')
      if spec_result is not None:
        result['specs'][name] = {k: len(spec_result[k]) for k in
                                 ('rows', 'failed', 'skipped')}
  result['programs'] = provider.counts()
  result['program_log'] = provider.log
  result['time_log'] = clock.log
  (out / 'stored_run.json').write_text(json.dumps(result, indent=1))
  return result


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  parser = argparse.ArgumentParser(
      prog='python -m tools.accelerator.stored', description=__doc__.split(
          '\n\n')[0])
  parser.add_argument('what', choices=('build', 'run'))
  parser.add_argument('--plan', action='append', default=None,
                      help='spec:models[:shrink], in priority order '
                      f'(default: {", ".join(DEFAULT_PLAN)})')
  parser.add_argument('--store', required=True, help='the store folder')
  parser.add_argument('--target', default=None,
                      help='build: a compiled.TARGETS name (default: this '
                      "machine's own device)")
  parser.add_argument('--out', default='results/stored_run')
  parser.add_argument('--max_minutes', type=float, default=None)
  args = parser.parse_args(argv)
  plan = parse_plan(args.plan or DEFAULT_PLAN)
  if args.what == 'build':
    if args.target is None:
      device, target = jax.devices()[0], jax.devices()[0].platform
    else:
      device, target = compiled.devices(args.target)[0], args.target
    store = aot.Store(pathlib.Path(args.store), target)
    store.describe(device)
    result = build(plan, store, device)
    store.write()
  else:
    device = jax.devices()[0]
    store = aot.Store(pathlib.Path(args.store), args.target or
                      device.platform)
    result = run(plan, store, pathlib.Path(args.out), args.max_minutes)
  print(json.dumps({k: v for k, v in result.items()
                    if k not in ('program_log', 'time_log')}, indent=1))
  return result


if __name__ == '__main__':
  main()
