"""A device run's results page and plots.

`markdown` is the page of a run's json: the setup, the phases and where
their programs came from, the floor, the cost curves, the drafters, the
spec's row sections (`DeviceSpec.sections`), the skipped steps and the time
log; `write_plots` draws the cost curves, Table 2, the gamma sweep and the
batches.
"""

from __future__ import annotations

import pathlib
from typing import Any, Dict, List

import numpy as np

from specdec_jax.bench import report
from tools.accelerator import plan


def cell(value) -> str:
  """A table cell: floats to 3 significant digits, None as '-'."""
  if isinstance(value, float):
    return f'{value:.3g}'
  if isinstance(value, dict):  # the paper's figures
    return ' / '.join(f'{k} {cell(v)}' for k, v in value.items() if k != 'task')
  return '-' if value is None else str(value)


def markdown(spec: plan.DeviceSpec, r: Dict[str, Any]) -> str:
  """The results page: every table of the json (`spec`'s sections)."""
  setup, fl, bw, p = r['setup'], r['floor'], r['bandwidth'], r.get(
      'projection') or {}
  lines = [f"# {spec.title} on {r['device']}" +
           ' (SYNTHETIC)' * r['synthetic'], '']
  if r['synthetic']:
    lines += [f"> **{r['label']}.** Alphas are set by the noise, not earned "
              'by a drafter: these figures measure the engine.', '']
  if r['smoke']:
    lines += ['> **SMOKE RUN**: tiny models; the numbers mean nothing.', '']
  lines += [report.header_md(r), f"Status: {r['status']}; wall "
            f"{r.get('wall_s')} s of a {r['max_minutes']} min budget" + (
                f"; projected for {p['of']}: {p['seconds']:.0f} s on "
                f"{p['device']} (`{p['source']}`)" if 'seconds' in p else
                '') + '.', '',
            '## Setup', '', f"Target: {r['label']}; "
            f"{setup.get('target_params', 0) / 1e9:.2f} B parameters, "
            f"activations {setup.get('activation_dtype')}, "
            f"{setup.get('input_length')} input tokens, up to "
            f"{setup.get('output_length')} output tokens."] + [
                f'- {n}' for n in setup.get('notes', []) +
                setup.get('skipped_drafters', [])]
  lines += phases_md(r)
  lines += programs_md(r)
  if fl:
    lines += ['', '## Baseline step vs its floor', '', report.table(
        ['t(1) ms', 'GB per step', 'bandwidth (copy) GB/s', 'floor ms',
         't(1) / floor'], [[cell(fl['t1_ms']), cell(fl['step_bytes'] / 1e9),
                            cell(bw['bytes_per_s'] / 1e9),
                            cell(fl['floor_ms']), cell(fl['ratio'])]]), '',
              f"Bandwidth: {bw['how']}."]
  for act, by_b in r['costs'].items():
    ks = sorted({int(k) for v in by_b.values() for k in v['cost']})
    lines += ['', f'## cost(k) = t(k) / t(1) of one target call on k tokens, '
              f'{act} activations', '', report.table(
                  ['batch', 't(1) ms'] + [f'k={k}' for k in ks],
                  [[b, cell(v['t_ms'].get('1'))] + [
                      cell(v['cost'].get(str(k))) for k in ks]
                   for b, v in by_b.items()])]
  if r['drafters']:
    lines += ['', '## Drafters: t_draft per token and c = t_draft / t(1) by '
              'batch', '', report.table(
                  ['drafter', 'cost', 't_draft ms', 'c'],
                  [[d['label'], d['cost'], cell(d['t_draft_ms']),
                    cell(d['c'])] for d in r['drafters'].values()])]
  for key, title, note, columns in spec.sections:
    rows = batch_rows(r) if key == 'batches' else r[key]
    if r[key]:
      lines += ['', f'## {title}', ''] + [note, ''] * bool(note) + [
          report.table([c if isinstance(c, str) else c[0] for c in columns],
                       [[cell(x.get(c)) if isinstance(c, str) else c[1](x)
                         for c in columns] for x in rows])]
  if r.get('plots'):
    lines += ['', '## Plots', ''] + [f'![{x}]({x})' for x in r['plots']]
  if r['skipped']:
    lines += ['', '## Skipped (time budget)', ''] + [
        f"- {x['what']}: needed ~{x['needed_s']} s, {x['left_s']} s left"
        for x in r['skipped']]
  return '\n'.join(lines + ['', '## Time log', '', report.table(
      ['at s', 'what', 's', 'kind', 'units'], [
          [e['at_s'], e['what'], e['seconds'], e.get('kind'), e.get('units')]
          for e in r['time_log']]), '', 'Compiles inside timed code (must be '
                            f"none): {r['compile_misses'] or 'none'}"]) + '\n'


def phases_md(r: Dict[str, Any]) -> List[str]:
  """The phases in priority order with their status, seconds and what the
  projection gave them."""
  phases = r.get('phases') or {}
  projected = (r.get('projection') or {}).get('phases') or {}
  if not phases:
    return []
  return ['', '## Phases (priority order)', '', report.table(
      ['phase', 'what', 'status', 's', 'projected s'],
      [[pid.upper(), v['title'], v['status'] + ' (an earlier run)' * bool(
          v.get('earlier_run')), cell(v.get('seconds')),
        cell(projected.get(pid, {}).get('seconds'))]
       for pid, v in phases.items()])] + [
           f"- {pid.upper()}: {x}" for pid, v in phases.items()
           for x in ([v['note']] if v.get('note') else []) + v.get(
               'not_measured', [])]


def programs_md(r: Dict[str, Any]) -> List[str]:
  """Where each program came from: loaded (compiled ahead of time) or
  compiled here, and why; the device's facts for the next build."""
  sources = r.get('programs') or {}
  if not sources:
    return []
  loaded = sum(v == 'loaded' for v in sources.values())
  lines = ['', '## Programs: loaded or compiled here', '',
           f'{loaded} of {len(sources)} loaded from `{r.get("aot_dir")}`; '
           'compiled here:', '']
  lines += [f'- {k}: {v}' for k, v in sources.items() if v != 'loaded']
  check = r.get('aot_check')
  if check:
    verdict = (f": {check['verdict']} (limit {check['limit']:g}x)."
               if 'verdict' in check else '.')
    lines += ['', f"t(1) check: loaded {check['loaded_ms']:.3f} ms, "
              f"compiled here {check['compiled_here_ms']:.3f} ms "
              f"({check['program']})" + verdict]
  facts = r.get('device_facts') or {}
  topology = (', its topology recorded for the next build'
              if facts.get('topology') else '')
  lines += ['', 'Device: ' + ', '.join(
      f'{k} {v}' for k, v in facts.items() if k != 'topology') +
            topology + '.']
  if r.get('alpha_calibration_from'):
    lines += ['', 'Alpha calibration: computed by '
              f"{r['alpha_calibration_from']}."]
  return lines


def batch_rows(r):
  """Batch 1 (the main drafter's first greedy Table 2 row) and the rest."""
  return [x for x in r['table2'] if x['temperature'] == 0 and x[
      'drafter'] == r.get('main_drafter')][:1] + r['batches']


def write_plots(r: Dict[str, Any], out_dir: pathlib.Path, stem: str
                ) -> List[str]:
  """Cost curves, Table 2, the gamma sweep and the batches, as the panels
  of ONE figure (a lent device sends back at most 8 files); its file name
  (none without any rows)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  t2 = r['table2']
  panels = [p for p in [
      ('costs', r['costs'], f"Target call cost on {r['device']}",
       'k (tokens per call)', 'cost(k) = t(k) / t(1)'),
      ('table2', t2, 'Table 2 at T5-XXL cost', '', 'speed-up'),
      ('sweep', r['sweep'], 'gamma sweep', 'gamma', 'speed-up'),
      ('batches', r['batches'], 'Per-row acceptance by batch', '',
       'mean accepted length per row')] if p[1]]
  if not panels:
    return []
  fig, axes = plt.subplots(len(panels), 1, squeeze=False, figsize=(
      max(6, len(t2) / 2), 4 * len(panels)))
  for ax, (name, rows, title, xlabel, ylabel) in zip(axes[:, 0], panels):
    if name == 'costs':
      for act, by_b in rows.items():
        for b, v in by_b.items():
          ks = sorted(int(k) for k in v['cost'])
          ax.plot(ks, [v['cost'][str(k)] for k in ks], 'o-',
                  label=f'batch {b}, {act}')
    elif name == 'table2':
      x = np.arange(len(rows))
      ax.bar(x - 0.2, [y['predicted'] for y in rows], 0.4, label='predicted')
      ax.bar(x + 0.2, [y['measured'] for y in rows], 0.4, label='measured')
      ax.set_xticks(x, [f"{y['task'][:6]} {y['drafter'][:14]} t"
                        f"{y['temperature']:g}" for y in rows], rotation=70,
                    fontsize=6)
    elif name == 'sweep':
      for key, style in (('measured', 'o-'), ('predicted', 's--')):
        ax.plot([y['gamma'] for y in rows], [y[key] for y in rows], style,
                label=key)
    else:
      rows = batch_rows(r)
      ax.boxplot([y['per_row_accepted_length'] for y in rows])
      ax.set_xticks(range(1, len(rows) + 1),
                    [f"batch {y['batch']} {y.get('batching', '')}"
                     for y in rows])
    ax.set_title(title + ' (SYNTHETIC)' * r['synthetic'], fontsize=9)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.tight_layout()
  report.save_plot(fig, out_dir / f'{stem}_plots.png')
  return [f'{stem}_plots.png']
