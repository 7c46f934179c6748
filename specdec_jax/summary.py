"""The eval job's summary: totals of the records, summary.json / .md.

`summarize` turns the records (examples.jsonl) into the run's figures:
times and speed-ups (walltime and tokens/s), alpha and the rates of
`spec_stats.rates`, differing greedy examples split into near-ties and
mismatches (`diagnostics`), with the run's settings. `write` adds the
task's metrics of both outputs, the status (`status`: 'complete' only when
every wanted example has its record) and the gamma choices, and replaces
summary.json and summary.md atomically.
"""

from __future__ import annotations

import collections
import json
import pathlib
from typing import Any, Dict, Optional

from specdec_jax import data
from specdec_jax import run_folder
from specdec_jax import spec_stats


def summarize(records, settings) -> Dict[str, Any]:
  """Totals of the records: times, speed-ups, alpha, rates, differences."""
  if not records:
    return {'examples': 0}
  sum_ = lambda k: float(sum(r[k] for r in records))
  batch_times = {}  # per timed call: a batch, or streamed a chunk
  for r in records:
    unit = ('chunk', r['chunk']) if 'chunk' in r else ('batch', r['batch'])
    batch_times[unit] = (r['baseline_batch_s'], r['speculative_batch_s'])
  base_s = sum(b for b, _ in batch_times.values())
  spec_s = sum(s for _, s in batch_times.values())
  tokens = sum_('speculative_length')
  base_tokens = sum_('baseline_length')
  greedy = settings['temperature'] == 0
  summary = {
      'examples': len(records),
      'batches': len({r['batch'] for r in records}),
      'timed_calls': len(batch_times),
      # Records of runs from before streaming say nothing: fixed.
      'batching': records[0].get('batching', 'fixed'),
      # examples per gamma decoded with (`BatchSpec.gamma_rule`); records
      # from before that option: the configured gamma.
      'gamma_used': {str(g): n for g, n in sorted(collections.Counter(
          r.get('gamma', settings['gamma']) for r in records).items())},
      'baseline_s': base_s,
      'speculative_s': spec_s,
      'walltime_speedup': base_s / spec_s if spec_s else None,
      **spec_stats.rates(
          iterations=sum_('iterations'), drafted=sum_('drafted'),
          accepted=sum_('accepted'), beta_sum=sum_('beta_sum'),
          beta_count=sum_('beta_count'), tokens=tokens),
      'baseline_tokens': base_tokens,
      'speculative_tokens': tokens,
      # Sampled outputs differ in length between the two decoders; tokens/s
      # compares them fairly (for greedy it equals walltime_speedup).
      'baseline_tokens_per_s': base_tokens / base_s if base_s else None,
      'speculative_tokens_per_s': tokens / spec_s if spec_s else None,
      'throughput_speedup': (tokens / spec_s) / (base_tokens / base_s)
                            if spec_s and base_s and base_tokens else None,
      # Only greedy outputs must be identical; sampled ones match in law.
      'differing_examples': int(sum(not r['identical'] for r in records))
                            if greedy else None,
  }
  if greedy:
    kinds = [(r.get('divergence') or {}).get('kind') for r in records
             if not r['identical']]
    summary['near_ties'] = kinds.count('near_tie')
    summary['mismatches'] = kinds.count('mismatch')
    # Rows from a run before diagnostics existed.
    summary['undiagnosed'] = kinds.count(None)
  summary.update(settings)
  return summary


def markdown(summary, base_metrics, spec_metrics) -> str:
  cols = ['task', 'drafter', 'temperature', 'gamma', 'examples', 'alpha',
          'walltime_speedup', 'mean_accepted_length', 'target_calls_per_token',
          'differing_examples', 'near_ties', 'mismatches']
  cells = []
  for c in cols:
    v = summary.get(c)
    cells.append(f'{v:.3f}' if isinstance(v, float) else str(v))
  metric_names = sorted(base_metrics)
  header = cols + [f'baseline {m}' for m in metric_names] + [
      f'speculative {m}' for m in metric_names]
  cells += [f'{base_metrics[m]:.2f}' for m in metric_names]
  cells += [f'{spec_metrics.get(m, float("nan")):.2f}' for m in metric_names]
  return ('| ' + ' | '.join(header) + ' |\n|' + '---|' * len(header) +
          '\n| ' + ' | '.join(cells) + ' |\n')


def status(records, wanted: set, error: Optional[BaseException]) -> str:
  """'complete' only when every wanted example has its record."""
  missing = len(wanted - {r['index'] for r in records})
  if isinstance(error, KeyboardInterrupt):
    cause = ('SIGTERM' if isinstance(error, run_folder.Terminated) else
             'SIGINT / Ctrl-C')
    return (f'interrupted ({cause}) with {missing} of {len(wanted)} examples '
            'left; rerun the same command to resume')
  if error is not None:
    return (f'failed with {missing} of {len(wanted)} examples left: '
            f'{error!r}; rerun the same command to resume')
  if missing:
    return f'incomplete: {missing} of {len(wanted)} examples left'
  return 'complete'


def start_line(out: pathlib.Path, wanted: int, reused: int) -> str:
  """The job's first console line: what it decodes, what it reuses."""
  if not reused:
    return f'decoding {wanted} example{"s" * (wanted != 1)} into {out}'
  left = wanted - reused
  return (f'{reused} of {wanted} examples found in {out} (records of an '
          'earlier run with these settings): reusing them, '
          + (f'decoding the other {left}' if left else 'nothing to decode')
          + '; delete the folder or pass a fresh EVAL_OUTPUT_DIR to decode '
          'them again')


def write(out: pathlib.Path, task, records, settings, wanted: set,
                   error: Optional[BaseException], reused: int = 0
                   ) -> Dict[str, Any]:
  """summary.json and summary.md of the finished records (and the error).

  `reused`: how many of the wanted examples had records of an earlier run
  when this one started (summary.json's `reused_records`).
  """
  records.sort(key=lambda r: r['index'])
  summary = summarize(records, settings)
  base_m = spec_m = {}
  if records:
    targets = [r['target'] for r in records]
    base_m = data.task_metrics(task, targets,
                               [r['baseline'] for r in records])
    spec_m = data.task_metrics(task, targets,
                               [r['speculative'] for r in records])
  summary['baseline_metrics'] = base_m
  summary['speculative_metrics'] = spec_m
  summary['status'] = status(records, wanted, error)
  summary['reused_records'] = reused
  # How gamma was chosen (`unit_loop.choose_gamma`), one entry per process.
  summary['gamma_choices'] = [json.loads(f.read_text()) for f in
                              sorted(out.glob('gamma_choice*.json'))]
  if summary['status'] == 'complete' and summary.get('mismatches'):
    summary['status'] = (
        f"failed: {summary['mismatches']} of "
        f"{summary['differing_examples']} differing greedy rows differ "
        'beyond rounding (real mismatches; see "divergence" in '
        'examples.jsonl)')
  run_folder.write_atomic(out / 'summary.json', json.dumps(summary, indent=1))
  run_folder.write_atomic(out / 'summary.md',
                          markdown(summary, base_m, spec_m))
  return summary
