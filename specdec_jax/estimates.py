r"""The compiler's counts as estimates: a roofline, a profile, Table 2 on it.

From the programs of `specdec_jax.compiled` (bytes per device) and its step
programs (`step_facts`: `T5Model.extend` of k tokens; the compiler counts a
decode loop's body once, so per-step figures come from these), for one
compile-only target: the largest batch that fits each program
(`memory_summary`), a roofline time of every step with the chip's published
peak flops and HBM bandwidth (`roofline_s`, plus `ops x overhead_s` when an
overhead per executed op is given), the `hardware.HardwareProfile` they make
(`estimated_profile`), and with --paper_table the paper's Table 2 on it
(`table2`), with the one per-op overhead that brings it closest to the
paper's measured speed-ups (`fit_overhead`) and our shipped drafters'
measured alpha on it (`shipped_alpha_rows`). ESTIMATED from the compiler's
counts, never measured. A TPU v4 device is one TensorCore: the roofline
uses half the chip's figures per device, the whole chip's for a program of
one megacore device (`--megacore_steps`, a replicated drafter).

  python -m specdec_jax.estimates --target=tpu:v4:1x1x1 [flags]
  python -m specdec_jax.estimates --reestimate=<results json>

write results/compiled/<target>.{json,md} (`main`); `--reestimate`
recomputes a results json's estimates from the counts it holds, compiling
nothing. docs/tpu.md explains them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import pathlib
import shlex
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import jax

from specdec_jax import checks
from specdec_jax import compiled
from specdec_jax import hardware
from specdec_jax import network
from specdec_jax import paper as paper_lib
from specdec_jax import partitioning
from specdec_jax import theory
from specdec_jax.bench import report

COMMAND = 'python -m specdec_jax.estimates'
ESTIMATED = "estimated from the compiler's counts, not measured"
GIB = compiled.GIB
FULL_KS = tuple(range(1, 17)) + (24, 32, 64)
BATCH_KS = (1, 2, 4, 8, 16)
GOAL = {'small': 0.10, 'base': 0.10, 'large': 0.15}


def roofline_s(flops: float, bytes_accessed: float, chip: compiled.Chip,
               ops: int = 0, overhead_s: float = 0.0,
               whole_chip: bool = False) -> float:
  """max(flops / peak, bytes / bandwidth) + ops x overhead: ESTIMATED.

  `flops` and `bytes_accessed` are one device's: a TensorCore's (the chip's
  figures divided by `chip.cores`), or with `whole_chip` the chip's (a
  program a TPU VM runs on one megacore device, e.g. a replicated drafter).
  """
  share = 1 if whole_chip else chip.cores
  return max(flops * share / chip.peak_flops,
             bytes_accessed * share / chip.hbm_bandwidth
             ) + ops * overhead_s


def step_facts(config: network.T5Config, target: compiled.Target, *, batch: int,
               tokens: int, input_length: int, cache_length: int,
               num_partitions: Optional[int] = None,
               replicated: bool = False,
               param_dtype: str = 'bfloat16',
               one_device: bool = False) -> Dict[str, Any]:
  """Compile facts of one decoder step: `T5Model.extend` of `tokens` tokens
  on a cache of `cache_length` slots, batch `batch` (the step of every
  loop; a drafter: `replicated`, data-parallel rules as the loops use;
  `one_device`: on one device, e.g. a TPU v4 core standing for the
  megacore device of a TPU VM)."""
  part = compiled.partitioner(target, num_partitions, one_device)
  model = part.sharded_model(network.T5Model(config), (
      partitioning.data_parallel_rules() if replicated else None))
  params = compiled.abstract_params(model, part, param_dtype)
  inputs = compiled.tokens(part, batch, input_length)
  cache = jax.eval_shape(lambda p, t: model.init_cache(p, t, cache_length),
                         params, inputs)
  cache = compiled.abstract(cache, model.cache_shardings(cache))
  block = compiled.tokens(part, batch, tokens)
  return compiled.compile_lowered(
      jax.jit(model.extend).lower(params, block, cache), target,
      f'extend({tokens} tokens) batch {batch}')


def step_seconds(facts: Mapping[str, Any], chip: compiled.Chip,
                 overhead_s: float = 0.0, whole_chip: bool = False) -> float:
  """The roofline time of a step program's facts (ESTIMATED)."""
  return roofline_s(facts['cost']['flops'], facts['cost']['bytes_accessed'],
                    chip, facts['hlo']['entry_ops'], overhead_s, whole_chip)


def draft_seconds(facts: Mapping[str, Any], chip: compiled.Chip,
                  overhead_s: float = 0.0) -> float:
  """A replicated drafter's step: every core computes the whole step here,
  where a TPU VM runs it on one device per chip, both cores (megacore), so
  it is timed with the whole chip's figures (ESTIMATED)."""
  return step_seconds(facts, chip, overhead_s, whole_chip=True)


def estimated_profile(target: compiled.Target,
                      steps: Mapping[int, Mapping[int, Any]],
                      draft_steps: Mapping[int, Mapping[str, Any]], *,
                      overhead_s: float = 0.0, label: str = '',
                      megacore: bool = False) -> hardware.HardwareProfile:
  """A `hardware.HardwareProfile` built from the compiler's counts.

  Args:
    target: the compile-only target.
    steps: batch -> k -> `step_facts` of the target's k-token step.
    draft_steps: batch -> drafter name -> `step_facts` of its 1-token step.
    overhead_s: seconds per executed op (0: a pure roofline).
    megacore: the target's steps were compiled on one device and stand for
      a whole chip (`one_device` steps): timed with the chip's figures.
    label: what the target is (dimensions).

  Returns:
    The profile; its name says ESTIMATED, its source the compiler.
  """
  chip = target.spec
  t = {b: {k: step_seconds(f, chip, overhead_s, megacore)
           for k, f in curve.items()}
       for b, curve in steps.items()}
  t1 = t[min(t)][1]
  c = {b: {name: draft_seconds(f, chip, overhead_s) / t[b][1]
           for name, f in ds.items()}
       for b, ds in draft_steps.items() if 1 in t.get(b, {})}
  return hardware.HardwareProfile(
      name=(f'{target.name} ({ESTIMATED}; overhead '
            f'{overhead_s * 1e6:g} us per op)'),
      device=chip.name, target=label, t1_ms=t1 * 1e3,
      floor_ms=None, bandwidth=chip.hbm_bandwidth,
      launch_ms=overhead_s * 1e3,
      cost={b: {k: v / curve[1] for k, v in curve.items()}
            for b, curve in t.items()},
      c=c, source='the XLA compiler for ' + target.name, command='', date='')


def table2(profile: hardware.HardwareProfile) -> List[Dict[str, Any]]:
  """The paper's Table 2 rows predicted on `profile` (`hardware.predict`,
  Theorem 3.8 with cost(gamma + 1)) from the paper's alpha and gamma, with
  the profile's c and with the paper's c, beside the paper's measured
  speed-up: the ratio per row; `bound_c0`, the expected tokens per
  iteration (Theorem 3.8 with c = 0 and cost 1), bounds every profile's
  prediction from the paper's alpha."""
  rows = []
  cells = [(column, temp, size, values)
           for (column, temp), row in paper_lib.TABLE2.items()
           for size, values in row.items()]
  for column, temp, size, (gamma, alpha, paper) in cells:
    ours = hardware.predict(profile, alpha=alpha, gamma=gamma, drafter=size)
    paper_c = paper_lib.TABLE4_C[size]
    with_paper_c = hardware.predict(profile, alpha=alpha, gamma=gamma,
                                    c=paper_c)
    rows.append({
        'task': {'EnDe': 'ende', 'CNNDM': 'cnndm'}[column],
        'temperature': temp, 'drafter': size, 'gamma': gamma,
        'alpha': alpha, 'c_estimated': round(ours.c, 4),
        'c_paper': paper_c, 'cost_gamma_plus_1': round(ours.cost, 3),
        'speedup_estimated': round(ours.speedup, 2),
        'speedup_with_paper_c': round(with_paper_c.speedup, 2),
        'speedup_paper_measured': paper,
        # Free drafts and a free wider call: no profile predicts more.
        'bound_c0': round(theory.expected_tokens_per_iteration(alpha, gamma),
                          2),
        'ratio': round(ours.speedup / paper, 3),
        'within_goal': abs(ours.speedup / paper - 1) <= GOAL[size]})
  return rows


def fit_overhead(target: compiled.Target, steps, draft_steps,
                 grid_us: Sequence[float] = tuple(
                     x / 10 for x in range(0, 201)),
                 megacore: bool = False) -> float:
  """The ONE per-op overhead (seconds) whose profile's Table 2 is closest to
  the paper's measured speed-ups (least squares of log ratios, on a grid)."""
  def loss(us):
    prof = estimated_profile(target, steps, draft_steps,
                             overhead_s=us * 1e-6, megacore=megacore)
    return sum(math.log(r['ratio']) ** 2 for r in table2(prof))
  return min(grid_us, key=loss) * 1e-6


def shipped_alpha_rows(profile: hardware.HardwareProfile,
                       alphas: Mapping[str, Mapping[str, float]]
                       ) -> List[Dict[str, Any]]:
  """Predicted speed-ups (`hardware.predict`, the best gamma within the
  profile's k) of our shipped drafters' measured alpha, with the c of the
  T5 1.1 size of their role ('small_fkl' -> small)."""
  rows = []
  for task, per in alphas.items():
    for name, temps in per.items():
      size = name.split('_')[0]
      if size not in profile.drafters(1):
        continue
      for temp, alpha in temps.items():
        p = hardware.predict(profile, alpha=alpha, drafter=size)
        rows.append({'task': task, 'drafter': name, 'temperature': temp,
                     'alpha': round(alpha, 3), 'c_estimated': round(p.c, 4),
                     'gamma': p.gamma, 'speedup_estimated':
                         round(p.speedup, 2)})
  return rows


def largest_batch(bytes_at: Mapping[int, int], capacity: int,
                  multiple: int = 1) -> Optional[int]:
  """The largest batch (a multiple of `multiple`) whose peak bytes fit in
  `capacity`, by the line through the two largest compiled batches (bytes
  grow linearly with the batch: caches, activations); None if none fits or
  fewer than two batches were compiled."""
  bs = sorted(bytes_at)
  if len(bs) < 2:
    return None
  b0, b1 = bs[-2], bs[-1]
  slope = (bytes_at[b1] - bytes_at[b0]) / (b1 - b0)
  base = bytes_at[b1] - slope * b1
  if base > capacity:
    return None
  if slope <= 0:
    return None
  best = int((capacity - base) // slope)
  best -= best % multiple
  return best if best >= 1 else None


def memory_summary(programs, target: compiled.Target, args
                   ) -> Dict[str, Any]:
  """Per program: peak bytes per device at each compiled batch, fits
  (False also where the compiler refused the program for want of HBM),
  and the largest batch that fits (`largest_batch`, a multiple of the data
  axis, below the smallest batch the compiler refused)."""
  n = target.devices
  data = n // (args.num_partitions or n)
  out = {}
  for f in programs:
    if 'fits' not in f:
      continue
    row = out.setdefault(f['name'], {'peak_bytes': {}, 'fits': {}})
    row['fits'][str(f['batch'])] = f['fits']
    if f['compiled']:
      row['peak_bytes'][str(f['batch'])] = f['memory']['peak_bytes']
  for row in out.values():
    bytes_at = {int(b): v for b, v in row['peak_bytes'].items()}
    refused = [int(b) for b, ok in row['fits'].items() if not ok]
    best = largest_batch(bytes_at, target.spec.device_hbm_bytes, data)
    if best is not None and refused:
      best = min(best, min(refused) - data)
    row['largest_batch'] = best if best and best >= 1 else None
    row['largest_batch_how'] = (
        'linear in the batch through the two largest compiled batches'
        if len(bytes_at) > 1 else 'one batch compiled: not estimated')
  return out


def estimates(target: compiled.Target, steps, draft_steps, model, args
              ) -> Dict[str, Any]:
  """t(1), cost(k), c per batch from the compiler's counts (ESTIMATED), the
  hardware profiles (pure roofline; with the one fitted per-op overhead)
  and, with --paper_table, Table 2 on them."""
  label = (f"T5 1.1 {args.model}: emb {model.emb_dim}, "
           f"{model.num_encoder_layers}+{model.num_decoder_layers} layers, "
           f"bf16, input {args.input_length}, cache "
           f"{args.max_decode_len + max(args.ks) + 1}")
  chip = target.spec
  mega = bool(args.megacore_steps)
  out = {'per_step': {}, 'megacore_steps': mega}
  for b, curve in steps.items():
    t1 = step_seconds(curve[1], chip, whole_chip=mega)
    out['per_step'][str(b)] = {
        't1_ms': round(t1 * 1e3, 4),
        'bytes_bound_ms': round(roofline_s(
            0, curve[1]['cost']['bytes_accessed'], chip,
            whole_chip=mega) * 1e3, 4),
        'cost': {str(k): round(step_seconds(f, chip, whole_chip=mega) / t1,
                               4)
                 for k, f in curve.items()},
        'c': {n: round(draft_seconds(f, chip) / t1, 4)
              for n, f in draft_steps.get(b, {}).items()},
        'ops_per_step': curve[1]['hlo']['entry_ops'],
        'draft_ops_per_step': {n: f['hlo']['entry_ops'] for n, f in
                               draft_steps.get(b, {}).items()}}
  pure = estimated_profile(target, steps, draft_steps, label=label,
                           megacore=mega)
  out['profile'] = pure.to_json()
  if args.paper_table and not (set(compiled.DRAFTS) <=
                                set(draft_steps.get(1, {}))):
    out['table2_error'] = ('--paper_table needs batch 1 and the drafters '
                           f'{", ".join(compiled.DRAFTS)} (T5 1.1 configs)')
  elif args.paper_table:
    out['table2'] = table2(pure)
    overhead = fit_overhead(target, steps, draft_steps, megacore=mega)
    fitted = estimated_profile(target, steps, draft_steps, megacore=mega,
                               overhead_s=overhead, label=label)
    out['overhead_us_per_op'] = round(overhead * 1e6, 2)
    out['profile_fitted'] = fitted.to_json()
    out['table2_fitted'] = table2(fitted)
    try:
      alphas = {task: v['alpha'] for task, v in report.read_json(
          args.alphas)['tasks'].items()}
      alphas = {t: {n: {k: x['alpha'] for k, x in temps.items()}
                    for n, temps in a.items()} for t, a in alphas.items()}
      out['shipped_alpha'] = {
          'source': report.portable(args.alphas),
          'rows': shipped_alpha_rows(pure, alphas),
          'rows_fitted': shipped_alpha_rows(fitted, alphas)}
    except (OSError, KeyError, ValueError) as e:
      out['shipped_alpha'] = {'source': report.portable(args.alphas),
                              'error': str(e)}
  return out


# --- The command. ----------------------------------------------------------


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
  """The command's flags: `compiled.add_flags`' and the estimates' own."""
  parser = argparse.ArgumentParser(prog=COMMAND,
                                   description=__doc__.split('\n')[0])
  compiled.add_flags(parser)
  parser.add_argument('--reestimate', default=None, type=checks.local_path,
                      help='a results json of this command: recompute its '
                      'estimates (profiles, Table 2) from the compiler '
                      'counts it holds, compiling nothing, and rewrite it')
  parser.add_argument('--ks', default=','.join(map(str, FULL_KS)),
                      type=checks.counts,
                      help='k of the target steps at batch 1 (empty: '
                      'compile the programs only)')
  parser.add_argument('--batch_ks', default=','.join(map(str, BATCH_KS)),
                      type=checks.counts, help='k of the target steps '
                      'at the other batches')
  parser.add_argument('--megacore_steps', action='store_true',
                      help='compile the step programs on one device (a v4 '
                      "/ v5p core) and time them with the whole chip's "
                      'figures: the megacore device a TPU VM runs (the '
                      "paper's one TPU v4)")
  parser.add_argument('--paper_table', action='store_true',
                      help="the paper's Table 2 on the estimated profile "
                      '(the paper ran on one TPU v4 chip)')
  parser.add_argument('--alphas', default='results/drafters_alpha.json',
                      type=checks.local_path,
                      help="our shipped drafters' measured alpha (a "
                      'results json with tasks/<task>/alpha)')
  parser.add_argument('--out_dir', type=checks.local_path,
                      default='results/compiled')
  args = parser.parse_args(argv)
  if args.reestimate:
    return args
  try:  # where the results go, before anything compiles
    checks.check_local_folder('--out_dir', args.out_dir)
  except checks.InputError as e:
    parser.error(str(e))
  return compiled.check_flags(parser, args)


def _log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, argv: Sequence[str],
        save: Callable[[Dict[str, Any]], Any] = lambda out: None
        ) -> Dict[str, Any]:
  """Everything the command reports for one target (see `main`); what
  finished is given to `save` after each program and after the steps."""
  target = compiled.get_target(args.target)
  model, drafts = compiled.configs(args)
  setup = compiled.setup(args)
  out = {
      'command': report.portable(' '.join([COMMAND] + list(argv))),
      'date': time.strftime('%Y-%m-%d'), 'versions': report.versions(),
      'target': dataclasses.asdict(target),
      'chip': dataclasses.asdict(target.spec),
      'label': ESTIMATED,
      'setup': {'target': report.config_dict(model),
                'drafts': {n: report.config_dict(c)
                           for n, c in drafts.items()},
                'input_length': args.input_length,
                'max_decode_len': args.max_decode_len, 'gamma': args.gamma,
                'temperature': args.temperature,
                'devices': target.devices,
                'num_partitions': args.num_partitions or target.devices},
      'programs': []}
  for batch, name in compiled.plan(args):
    facts = compiled.compile_program(
        name, dataclasses.replace(setup, batch=batch), target,
        args.num_partitions)
    facts.update(name=name, batch=batch)
    out['programs'].append(facts)
    jax.clear_caches()  # never run; an XXL loop's program holds GBs of RAM
    _log(f"{facts['program']}: " + (
        f"{facts['memory']['peak_bytes'] / GIB:.2f} GiB, "
        f"{facts['compile_s']} s" if facts['compiled'] else
        facts['error'][:300]))
    out['memory'] = memory_summary(out['programs'], target, args)
    save(out)
  out['memory'] = memory_summary(out['programs'], target, args)
  if not args.ks:  # --ks=: the programs only.
    return out
  steps, draft_steps = _steps(args, target, model, drafts)
  out['steps'] = {str(b): {str(k): _slim(f) for k, f in curve.items()}
                  for b, curve in steps.items()}
  out['draft_steps'] = {str(b): {n: _slim(f) for n, f in ds.items()}
                        for b, ds in draft_steps.items()}
  save(out)
  # A batch whose 1-token step did not compile (e.g. does not fit) has no
  # t(1) to divide by: its steps stay in the results, out of the estimates.
  steps = {b: c for b, c in steps.items() if 1 in c}
  if all(f['cost'] for c in steps.values() for f in c.values()) and steps:
    try:
      out.update(estimates(target, steps, draft_steps, model, args))
    except (KeyError, ValueError, ZeroDivisionError) as e:
      out['estimates_error'] = f'{type(e).__name__}: {e}'
  return out


def _steps(args, target: compiled.Target, model, drafts):
  """({batch: {k: step_facts}}, {batch: {drafter: step_facts}}) of every
  step that compiled: the target's k-token steps (--ks at the first batch,
  --batch_ks at the others) and each drafter's 1-token step."""
  cache_length = args.max_decode_len + max(args.ks) + 1
  steps, draft_steps = {}, {}
  for batch in args.batches:
    ks = args.ks if batch == args.batches[0] else args.batch_ks
    for k in ks:
      f = step_facts(model, target, batch=batch, tokens=k,
                     input_length=args.input_length,
                     cache_length=cache_length,
                     num_partitions=args.num_partitions,
                     one_device=args.megacore_steps)
      _log(f"{target.name} {f['program']}: {f.get('cost')}")
      jax.clear_caches()  # as `run` does after each program
      if f['compiled']:
        steps.setdefault(batch, {})[k] = f
    for name, cfg in drafts.items():
      f = step_facts(cfg, target, batch=batch, tokens=1,
                     input_length=args.input_length,
                     cache_length=cache_length,
                     num_partitions=args.num_partitions, replicated=True,
                     one_device=args.megacore_steps)
      _log(f"{target.name} draft {name} {f['program']}: {f.get('cost')}")
      jax.clear_caches()
      if f['compiled']:
        draft_steps.setdefault(batch, {})[name] = f
  return steps, draft_steps


def _slim(f: Mapping[str, Any]) -> Dict[str, Any]:
  return {k: f[k] for k in ('compiled', 'compile_s', 'memory', 'cost',
                            'hlo', 'error') if k in f}


# --- The results page. -----------------------------------------------------


def markdown(r: Mapping[str, Any]) -> str:
  """The results .md of one target: its programs and memory, and where
  the json has them, the per-step estimates, Table 2 and our drafters."""
  lines = _programs_md(r)
  if 'per_step' in r:
    lines += _per_step_md(r)
  for key in ('table2', 'table2_fitted'):
    if key in r:
      lines += _table2_md(r, key)
  if 'shipped_alpha' in r and 'rows' in r['shipped_alpha']:
    lines += _shipped_md(r)
  return '\n'.join(lines) + '\n'


def _programs_md(r: Mapping[str, Any]) -> List[str]:
  """The header, every program's compile facts, the largest batches."""
  t, chip = r['target'], r['chip']
  versions = ', '.join(f'{k} {v}' for k, v in r['versions'].items())
  usable = (f" ({chip['usable_bytes'] / GIB:.2f} GiB usable per device, as "
            'the compiler says)' if chip.get('usable_bytes') else '')
  lines = [f"# Compiled for {t['name']} without one ({ESTIMATED})", '',
           f"Command: `{r['command']}`  ", f"Date: {r['date']}; {versions}",
           '',
           f"{t['chips']} x {chip['name']}, {chip.get('cores', 1)} "
           f"device(s) per chip: {chip['hbm_bytes'] / GIB:.1f} GiB HBM "
           f'per chip{usable}, '
           f"{chip['hbm_bandwidth'] / 1e9:.0f} GB/s, "
           f"{chip['peak_flops'] / 1e12:.0f} TFLOP/s bf16 (published). "
           f"Target {r['setup']['target']['emb_dim']}-wide "
           f"({r['setup']['target']['num_decoder_layers']} decoder layers), "
           f"drafters {', '.join(r['setup']['drafts'])}; bf16; input "
           f"{r['setup']['input_length']}, output "
           f"{r['setup']['max_decode_len']}, gamma {r['setup']['gamma']}, "
           f"temperature {r['setup']['temperature']}; 'model' axis "
           f"{r['setup']['num_partitions']}.", '',
           '## Every decode program', '',
           'Bytes per device from `memory_analysis()` (parameters + inputs, '
           'outputs, temporaries); one while loop, no host transfer: read '
           'from the compiled HLO.', '']
  lines.append(report.table(compiled.PROGRAM_COLUMNS, [
      compiled.program_row(f) for f in r['programs']]))
  plain = sorted({f['name'] for f in r['programs']
                  if f.get('target_model') == 'T5Model'})
  older = (f"{', '.join(plain)} compiled with the plain `network.T5Model` "
           'target, its parameters sharded (their loops took no '
           '`partitioning.ShardedModel` yet when these were compiled). '
           if plain else '')
  lines += ['', 'Notes: ' + older + "The parameters of the kinds that draft "
            "or embed with the target ('cache', 'combined', 'pass', "
            "'heads', 'heads_tree') hold the target's parameters again: the "
            'same arrays when run, but counted again in the argument bytes '
            "(of what the program reads: e.g. the encoder for an output "
            "cache's embedder), so their peak bytes are an upper bound."]
  lines += ['', '## Largest batch that fits (per device)', '']
  lines.append(report.table(
      ['program', 'peak GiB per compiled batch', 'largest batch', 'how'],
      [[n, ', '.join(f'{b}: {v / GIB:.2f}' for b, v in
                     m['peak_bytes'].items()), m['largest_batch'],
        m['largest_batch_how']] for n, m in r['memory'].items()]))
  return lines


def _per_step_md(r: Mapping[str, Any]) -> List[str]:
  """The roofline of each step: t(1), cost(k), c per batch."""
  how = ('compiled on one device standing for the whole chip (the '
         "megacore device of a TPU VM), timed with the chip's figures"
         if r.get('megacore_steps') else
         "compiled on every device, timed with one device's share of the "
         "chip's figures; a replicated drafter with the whole chip's "
         '(one megacore device per chip on a TPU VM)')
  lines = ['', f'## Per step ({ESTIMATED})', '',
           "A roofline of one `T5Model.extend` call: max(flops / peak, "
           "bytes accessed / HBM bandwidth), from the compiler's "
           'counts. cost(k) = t(k) / t(1); c = drafter step / target '
           f'step. Steps {how}.', '']
  rows = []
  for b, s in r['per_step'].items():
    costs = ', '.join(f'{k}: {v:.3f}' for k, v in s['cost'].items())
    cs = ', '.join(f'{n} {v:.3f}' for n, v in s['c'].items())
    rows.append([b, s['t1_ms'], costs, cs, s['ops_per_step']])
  lines.append(report.table(['batch', 't(1) ms', 'cost(k)', 'c',
                             'ops per target step'], rows))
  return lines


def _table2_md(r: Mapping[str, Any], key: str) -> List[str]:
  """The paper's Table 2 on the pure (`key` 'table2') or the fitted
  ('table2_fitted') profile; a fitted overhead of 0 as one paragraph."""
  if key == 'table2_fitted' and not r.get('overhead_us_per_op'):
    return ['', '## One fitted per-op overhead', '',
            'Fitted (least squares of the log ratios over the 12 rows, '
            'grid 0-20 us per executed op): 0 us. Any overhead raises '
            'every c and lowers every estimate, and the rows are '
            'mostly below the paper already: the pure roofline stands.']
  title = 'pure roofline' if key == 'table2' else (
      f"roofline + {r.get('overhead_us_per_op')} us per op (fitted)")
  lines = ['', f"## The paper's Table 2 on this profile: {title}", '',
           f'{ESTIMATED.capitalize()}: Theorem 3.8 with cost(gamma + 1) '
           '(`hardware.predict`), the paper\'s alpha and gamma, our '
           "c beside the paper's c (Table 4), against the paper's "
           'measured TPU v4 speed-up. Goal: within 10% (small, base), '
           '15% (large).', '']
  lines.append(report.table(
      ['task', 't', 'drafter', 'gamma', 'alpha', 'c est.', 'c paper',
       'cost(g+1)', 'est.', 'with paper c', 'bound (c = 0)',
       'paper measured', 'ratio', 'in goal'],
      [[x['task'], x['temperature'], x['drafter'], x['gamma'], x['alpha'],
        x['c_estimated'], x['c_paper'], x['cost_gamma_plus_1'],
        f"{x['speedup_estimated']}x", f"{x['speedup_with_paper_c']}x",
        f"{x.get('bound_c0', '-')}x", f"{x['speedup_paper_measured']}x",
        x['ratio'], 'yes' if x['within_goal'] else 'no']
       for x in r[key]]))
  if key == 'table2':
    lines += ['', "'bound (c = 0)': the expected tokens per iteration, "
              'Theorem 3.8 with free drafts and cost(gamma + 1) = 1: no '
              "hardware profile predicts more from the paper's alpha and "
              'gamma; where the paper measured more, the i.i.d. '
              'acceptance of Theorem 3.8 underestimates it.']
  return lines


def _shipped_md(r: Mapping[str, Any]) -> List[str]:
  """Our shipped drafters' measured alpha on the profile (and the fitted
  one's best gamma and estimate where an overhead was fitted)."""
  lines = ['', "## Our shipped drafters' measured alpha on this profile",
           '', f"alpha from `{r['shipped_alpha']['source']}`; c of the "
           'T5 1.1 size of the role; best gamma. '
           f'{ESTIMATED.capitalize()}.', '']
  key = lambda x: (x['task'], x['drafter'], x['temperature'])
  fitted = {key(x): x for x in r['shipped_alpha']['rows_fitted']}
  columns = ['task', 'drafter', 't', 'alpha', 'c est.', 'gamma',
             'estimated']
  if r.get('overhead_us_per_op'):
    columns += ['gamma / est. (fitted overhead)']
  rows = []
  for x in r['shipped_alpha']['rows']:
    row = [x['task'], x['drafter'], x['temperature'], x['alpha'],
           x['c_estimated'], x['gamma'], f"{x['speedup_estimated']}x"]
    if r.get('overhead_us_per_op'):
      y = fitted[key(x)]
      row.append(f"{y['gamma']} / {y['speedup_estimated']}x")
    rows.append(row)
  lines.append(report.table(columns, rows))
  return lines


def reestimate(path: str):
  """Recomputes a results json's verdicts and estimates (fits, largest
  batch, profiles, Table 2) from the compiler's counts it holds (with its
  own command's flags and `compiled`'s chip figures), compiling nothing,
  and rewrites its .json and .md."""
  said = f'{path} is no estimates file to reestimate: '
  with checks.one_line(OSError, ValueError, KeyError, TypeError,
                       AttributeError, said=said):
    r = report.read_json(path)
    command = shlex.split(r['command'])
    try:
      args = parse_flags(command[3:])
    except SystemExit as e:  # its own command's flags, said above
      raise checks.InputError(f'its command is none of {COMMAND}\'s: '
                              f'{r["command"]}') from e
    target = compiled.get_target(args.target)
    steps = {int(b): {int(k): f for k, f in curve.items()}
             for b, curve in r.get('steps', {}).items() if '1' in curve}
    draft_steps = {int(b): ds for b, ds in r.get('draft_steps', {}).items()}
    model, _ = compiled.configs(args)
    r['chip'] = dataclasses.asdict(target.spec)
    r['reestimated_by'] = report.portable(f'{COMMAND} --reestimate={path}')
    for f in r['programs']:
      if f['compiled']:
        f['fits'] = f['memory']['peak_bytes'] <= target.spec.device_hbm_bytes
    r['memory'] = memory_summary(r['programs'], target, args)
    if steps:
      r.update(estimates(target, steps, draft_steps, model, args))
  out = report.write_json(path, r)
  report.write_md(out.with_suffix('.md'), markdown(r))
  return out


def main(argv: Optional[Sequence[str]] = None) -> None:
  """`python -m specdec_jax.estimates --target=tpu:v4:1x1x1
  [flags]`: writes OUT_DIR/<target>.json and .md (every program, memory
  per device, per-step estimates; with --paper_table the paper's Table 2
  on them); `--reestimate=<json>` rewrites one from its counts."""
  os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_flags(argv)
  if args.reestimate:
    print(reestimate(args.reestimate))
    return
  if args.paper_table and not args.ks:  # what the table reads: before compiles
    raise checks.InputError('--paper_table is of the steps: give --ks')
  if args.paper_table and not os.path.isfile(args.alphas):
    raise checks.InputError(f'--alphas {args.alphas!r}: no such file (the '
                            "shipped drafters' measured alpha)")
  stem = args.target.replace(':', '_') + (
      '_megacore' if args.megacore_steps else '')
  path = pathlib.Path(args.out_dir) / f'{stem}.json'
  saved = []

  def save(result):  # what finished, kept if a later compile is stopped
    report.write_json(path, result)
    report.write_md(path.with_suffix('.md'), markdown(result))
    saved[:] = [f"programs: {len(result['programs'])}" + (
        ', the steps' if 'steps' in result else '')]

  with checks.one_line(compiled.BackendMissing), checks.root_logger_at(
      logging.ERROR), compiled.ends_on_ctrl_c(
      lambda: 'stopped by SIGINT: ' + (
          f'{path} holds what finished: {saved[0]}' if saved else
          'no program had finished, nothing written')):
    save(run(args, argv, save))
  print(path)


if __name__ == '__main__':
  checks.run_main(main)
