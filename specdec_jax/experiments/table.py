"""A sweep's results: one row schema, the one repredict, one writer.

A row is a cell's identifying fields (`sweep.Cell.fields`), the eval job's
summary figures under the job's own names (`SUMMARY_FIELDS`), the cell's
extra measurements (`measured`), and predicted figures, recomputed from
those measured values alone by `repredict` through `hardware.predict`
(`predict_row`: on the row's own measured costs, `predicted_speedup`, and
on a measured hardware profile, `predicted_on_profile`; a spec's own,
`Spec.predict`). `write` writes results/<spec>/<models>.json (what
`repredict` reads back), .md (the spec's columns) and .png (its plot).
"""

from __future__ import annotations

import pathlib
import time
from typing import Any, Dict, Optional

import jax

from specdec_jax import measure
from specdec_jax import theory
from specdec_jax import hardware
from specdec_jax.bench import at_xxl_cost
from specdec_jax.bench import report

RESULTS = hardware.ROOT / 'results'
SUFFIXES = ('.json', '.md', '.png')  # what `write` writes at OUT
FORMAT = 'specdec_jax.experiments/1'

# The eval job's summary fields a row keeps, under the job's names
# (summary.summarize / summary.write).
SUMMARY_FIELDS = (
    'examples', 'status', 'batching', 'gamma_used', 'baseline_s',
    'speculative_s', 'walltime_speedup', 'throughput_speedup',
    'baseline_tokens', 'speculative_tokens', 'baseline_tokens_per_s',
    'speculative_tokens_per_s', 'alpha', 'acceptance_rate',
    'mean_accepted_length', 'target_calls_per_token', 'differing_examples',
    'near_ties', 'mismatches', 'baseline_metrics', 'speculative_metrics',
    'gamma_choices', 'other_load_cores')


def new_result(spec, options, command: str, partitioner=None
               ) -> Dict[str, Any]:
  """An empty results dict with its header (and the cells' mesh)."""
  mesh = {} if partitioner is None else {'mesh': dict(
      partitioner.mesh.shape, processes=jax.process_count(),
      shard_drafter=options.shard_drafter)}
  return dict(
      format=FORMAT, spec=spec.name, title=spec.title,
      models=options.models, command=report.portable(command),
      machine=measure.machine(), date=time.strftime('%Y-%m-%d'),
      num_examples=options.num_examples,
      timing_repeats=options.timing_repeats, shrunk=options.shrink,
      rows=[], skipped=[], failed=[], **mesh, **({'model_fields': list(
          options.model_fields)} if options.model_fields else {}))


def row_of(cell, summary: Optional[Dict[str, Any]], values: Dict[str, Any]
           ) -> Dict[str, Any]:
  """A cell's row: its fields, the job's summary figures (none for a cell
  that is not decoded: `summary` None), measurements."""
  row = {'cell': cell.name, **({} if summary is None else {
      'kind': summary.get('drafter')}), **cell.fields()}
  if summary is not None:
    row.update({k: summary.get(k) for k in SUMMARY_FIELDS})
    choices = summary.get('gamma_choices')
    if choices and summary.get('gamma') is not None:
      # What it decoded with, where the job chose (the cell's: a warm-up's
      # gamma; a tree's 'choose:N')
      row['configured_gamma'], row['gamma'] = row.get('gamma'), summary['gamma']
      if row.get('tree') and choices[0].get('tree'):
        row['configured_tree'], row['tree'] = row['tree'], choices[0]['tree']
  row['measured'] = values
  return row


def run_profile(row: Dict[str, Any],
                result: Optional[Dict[str, Any]] = None
                ) -> Optional[hardware.HardwareProfile]:
  """The profile of a row's measured costs (None without them); `result`
  (the results dict) names where it was measured."""
  costs = (row.get('measured') or {}).get('costs')
  if costs is None:
    return None
  meta = {'spec': '', 'machine': '', 'models': '', 'command': '',
          'date': '', **(result or {})}
  batch = int(costs['batch'])
  return hardware.HardwareProfile(
      name=f"{meta['spec']} costs: {row['cell']}",
      device=meta['machine'], target=f"{row['task']} target",
      t1_ms=costs['t1_ms'], floor_ms=None, bandwidth=None, launch_ms=None,
      cost={batch: {int(k): float(v) for k, v in costs['cost'].items()}},
      c={batch: {row['drafter']: float(costs['c'])}},
      source=f"results/{meta['spec']}/{meta['models']}.json",
      command=meta['command'], date=meta['date'])


def predict_row(row: Dict[str, Any], result: Dict[str, Any],
                profile: Optional[hardware.HardwareProfile]) -> None:
  """Sets a row's predicted figures from its measured values: Theorem 3.8
  with its alpha at the gamma it decoded with on its own costs, and on
  `profile` the best gamma at T5-XXL target cost (batch 1) or its gamma (a
  batch the profile measured); None where the profile cannot price it."""
  used = row.get('gamma_used') or {}  # the one gamma it decoded with
  gamma = int(next(iter(used))) if len(used) == 1 else None
  batch = int(row.get('batch_size', 1))
  row.update(predicted_speedup=None, predicted_label=None,
             measured_over_predicted=None, predicted_on_profile=None)
  own = run_profile(row, result)
  if row.get('alpha') is None:
    return
  alpha = theory.clamp_alpha(row['alpha'])
  if own is not None and gamma:
    p = hardware.predict(own, alpha=alpha, gamma=gamma,
                         drafter=row['drafter'], batch=batch)
    measured_speedup = row.get('throughput_speedup')
    row.update(predicted_speedup=p.speedup, predicted_label=p.label,
               measured_over_predicted=(
                   measured_speedup / p.speedup if measured_speedup
                   else None))
  if profile is None:
    return
  if batch == 1:
    row['predicted_on_profile'] = at_xxl_cost.predict(
        profile, alpha, row['drafter'])
  elif (batch in profile.batches() and gamma and
        row['drafter'] in profile.drafters(1)):
    row['predicted_on_profile'] = hardware.predict(
        profile, alpha=alpha, gamma=gamma, drafter=row['drafter'],
        batch=batch).to_json()


def predict_counters(row: Dict[str, Any],
                     profile: Optional[hardware.HardwareProfile], *,
                     width: int, drafter_calls: float,
                     drafter: Optional[str] = None, **step) -> None:
  """Sets `predicted_counters`: the speed-up PREDICTED on `profile` from
  the row's counters (`hardware.predict`: tokens per target call /
  (cost(width) + drafter calls per target call x c)).

  c is the profile's measured c of `drafter` (an `at_xxl_cost.
  STAND_INS` name), or with `step` (step_bytes, kernels) its
  bytes / launches model; no drafter call (drafter_calls 0) costs nothing.
  None without a profile or counters, or where the profile did not time
  the drafter."""
  row['predicted_counters'] = None
  calls = row.get('target_calls_per_token')
  if profile is None or not calls:
    return
  if drafter_calls and not step and drafter not in profile.drafters(1):
    return  # the profile did not time this drafter
  row['predicted_counters'] = hardware.predict(
      profile, tokens_per_call=1.0 / calls, gamma=row.get('gamma'),
      width=width, drafter_calls_per_call=drafter_calls,
      drafter=drafter if drafter_calls else None, **step).to_json()


def counters_cell(row: Dict[str, Any]) -> str:
  """The "predicted (counters)" cell: '2.31x (c 0.018)'; † c from the
  bytes / launches model, ‡ cost(width) beyond the measured k."""
  p = row.get('predicted_counters')
  if p is None:
    return '-'
  c = '' if not p['c'] else f" (c {p['c']:.3f}" + (
      '' if p['c_how'].startswith(hardware.MEASURED) else ' †') + ')'
  return f"{p['speedup']:.2f}x{c}" + (
      '' if p['cost_how'] == hardware.MEASURED else ' ‡')


def repredict(spec, result: Dict[str, Any],
              profile: Optional[hardware.HardwareProfile],
              command: Optional[str] = None) -> Dict[str, Any]:
  """Every predicted figure of a results dict from its measured values
  (a spec that decodes nothing has only its own, `Spec.predict`)."""
  for row in result['rows']:
    if spec.decode:
      predict_row(row, result, profile)
    if spec.predict is not None:
      spec.predict(row, profile)
  result['profile'] = None if profile is None else profile.name
  result['profile_note'] = (None if profile is None else
                            at_xxl_cost.note(profile))
  if command:
    result['predicted_by'] = report.portable(command)
  return result


# Writers.

def cell(row: Dict[str, Any], column) -> str:
  """A table cell: a row field by name (dotted for nested), or fn(row)."""
  if callable(column):
    return str(column(row))
  value: Any = row
  for part in column.split('.'):
    value = value.get(part) if isinstance(value, dict) else None
  if isinstance(value, float):
    return report.fmt(value, '.3f' if abs(value) < 1 else '.2f')
  return '-' if value is None else str(value)


def temperature(row: Dict[str, Any]) -> str:
  """The "t" cell: '0', '1'."""
  return f"{row['temperature']:g}"


def identical(row: Dict[str, Any]) -> str:
  """The "identical (greedy)" cell: '30/32' rows equal to the baseline,
  '-' for sampled rows (they match in law, not token for token)."""
  if row['differing_examples'] is None:
    return '-'
  return f"{row['examples'] - row['differing_examples']}/{row['examples']}"


def tokens_per_call(row: Dict[str, Any]) -> str:
  """The "tokens / call" cell: 1 / the job's target_calls_per_token."""
  return f"{1 / row['target_calls_per_token']:.2f}"


def on_profile(row: Dict[str, Any]) -> str:
  """The "predicted <profile>" cell: '2.05x (5)', † where c is modelled."""
  return at_xxl_cost.cell(row.get('predicted_on_profile'))


# The columns of a spec that reads tokens per target call (the method
# specs), after its own: what each call yields, whether the greedy rows are
# the baseline's, and the speed-up measured here beside the one predicted.
COUNTER_COLUMNS = (
    ('tokens / call', tokens_per_call),
    ('mean accepted length', 'mean_accepted_length'),
    ('alpha', 'alpha'),
    ('identical (greedy)', identical),
    ('measured speed-up', 'throughput_speedup'),
    ('predicted (counters) on {profile}', counters_cell))


def markdown(spec, result: Dict[str, Any]) -> str:
  """The results' markdown: header, the spec's about, its table."""
  lines = [f"# {result['title']} ({result['models']} models)", '',
           f"Command: `{result['command']}`  ",
           f"Machine: {result['machine']}  "]
  if result.get('mesh'):
    lines.append('Mesh: {data} data x {model} model, {processes} '
                 'process(es)'.format(**result['mesh']) + (
                     ', a T5 drafter sharded' if result['mesh'].get(
                         'shard_drafter') else '') + '  ')
  loads = [r['other_load_cores'] for r in result['rows']
           if r.get('other_load_cores') is not None]
  if loads:  # how busy other processes kept the machine (the job's)
    lines.append(f'Other processes while timing: {max(loads):.2f} cores busy '
                 'on average in the busiest cell' + (
                     ' (**timed beside other work: rerun on a quiet '
                     'machine**)' if max(loads) > measure.BUSY_CORES else '')
                 + '  ')
  lines.append(f"Date: {result['date']}")
  if result.get('predicted_by'):
    lines.append('Predicted columns recomputed from the measured values by '
                 f"`{result['predicted_by']}`.")
  lines += ['', spec.about.strip(), '',
            f"Every cell is the eval job (`python -m specdec_jax.eval`) on "
            f"{result['num_examples']} examples, timed as the job times "
            f"({result['timing_repeats']} alternating repeats of each unit, "
            'medians). Predicted figures are PREDICTED, not measured, '
            'through hardware.predict.' if spec.decode else
            'Every cell is measured on its setup as the eval job builds it '
            '(nothing decoded).']
  if result.get('profile_note') and any('{profile}' in h
                                       for h, _ in spec.columns):
    lines += ['', result['profile_note']]
  columns = [(h.replace('{profile}', result['profile'] or ''), c)
             for h, c in spec.columns
             if result.get('profile') or '{profile}' not in h]
  lines += ['', report.table([h for h, _ in columns], [
      [cell(r, c) for _, c in columns] for r in result['rows']]).rstrip()]
  if result.get('skipped'):
    lines += ['', 'Skipped (time budget): ' + ', '.join(result['skipped'])]
  if result.get('failed'):
    lines += ['', 'Failed cells (rerun the command to resume them):', '']
    lines += [f"- {f['cell']}: {f['error']}" for f in result['failed']]
  return '\n'.join(lines) + '\n'


def write(spec, result: Dict[str, Any], out, here=None) -> Dict[str, Any]:
  """Writes OUT.json, OUT.md and (with a plot) OUT.png (across processes,
  process 0: each ran the cells alike), or `here` a copy of OUT's (gs://)."""
  if jax.process_index() != 0:
    return result
  name = here and str(out)  # a gs:// address, written at `here`
  out = pathlib.Path(here or out)  # its folder made by write_json
  result['out'] = name or report.portable(hardware.in_repository(out))
  report.write_json(f'{out}.json', result)  # not with_suffix: 'v1.5' too
  report.write_md(f'{out}.md', markdown(spec, result))
  if spec.plot is not None and result['rows']:
    spec.plot(result, pathlib.Path(f'{out}.png'))
  return result
