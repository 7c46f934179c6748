"""The eval job's summary: totals of the records, summary.json / .md.

`summarize` turns the records (examples.jsonl) into the run's figures:
times and speed-ups (walltime and tokens/s), how busy other processes
kept the machine while it timed (`timing_load`), alpha and the rates of
`spec_stats.rates`, differing greedy examples split into near-ties and
mismatches (`diagnostics`), with the run's settings. `write` adds the
task's metrics of both outputs, the status (`status`: 'complete' only when
every wanted example has its record) and the gamma choices, and replaces
summary.json and summary.md atomically. `write_started`, when a job
begins, replaces them with what it is about to do: a job that ends without
writing its own (killed, or aborted by jax.distributed) leaves that.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import pathlib
import socket
from typing import Any, Dict, Optional

from specdec_jax import checks
from specdec_jax import data
from specdec_jax import measure
from specdec_jax import run_folder
from specdec_jax import spec_stats
from specdec_jax import sampling as sampling_lib
from specdec_jax.sampling import FIELDS


def gamma_label(used: Dict[str, int], choices=()) -> str:
  """What gamma the records decoded with, in words.

  Args:
    used: examples per gamma (`summarize`'s `gamma_used`).
    choices: the run's gamma choices (`unit_loop.choose_gamma`): a gamma 0
      says the speed-up its choice predicted for the best gamma.

  Returns:
    '4'; '0: no speculation (predicted 0.72x < 1 at gamma 1, on this run,
    batch 8)'; '1 (8 examples), 2 (8 examples)' where units differ.
  """
  def one(g: int) -> str:
    if g:
      return str(g)
    why = [c['prediction'] for c in choices
           if c.get('gamma') == 0 and 'prediction' in c]
    if not why:
      return '0: no speculation'
    p = why[0]
    return (f"0: no speculation (predicted {p['speedup']:.2f}x < 1 at gamma "
            f"{p['gamma']}, on {p['profile']}, batch {p['batch']})")
  if len(used) == 1:
    return one(int(next(iter(used))))
  return ', '.join(f'{one(int(g))} ({n} example{"s" * (n != 1)})'
                   for g, n in used.items())


def summarize(records, settings, choices=()) -> Dict[str, Any]:
  """Totals of the records: times, speed-ups, alpha, rates, differences.

  Every figure is of the records alone, but `configured_gamma` and the
  other settings, and the predicted speed-up a gamma 0 says it was chosen
  for (`choices`, the run's gamma choices). gamma is what the records
  decoded with (`gamma_used` per gamma; `gamma` the one gamma of every
  record, else None); alpha and the acceptance rate are None where no
  draft was verified (every record at gamma 0).
  """
  said = {('configured_gamma' if k == 'gamma' else k): v
          for k, v in settings.items()}
  if not records:
    return {'examples': 0, **said}
  sum_ = lambda k: float(sum(r[k] for r in records))
  batch_times = {}  # per timed call: a batch, or streamed a chunk
  loads = {}  # per timed call: [other processes' CPU s, wall s]
  for r in records:
    unit = ('chunk', r['chunk']) if 'chunk' in r else ('batch', r['batch'])
    batch_times[unit] = (r['baseline_batch_s'], r['speculative_batch_s'])
    loads[unit] = r.get('other_load')
  base_s = sum(b for b, _ in batch_times.values())
  spec_s = sum(s for _, s in batch_times.values())
  tokens = sum_('speculative_length')
  base_tokens = sum_('baseline_length')
  greedy = settings['temperature'] == 0
  # examples per gamma decoded with (`BatchSpec.gamma_rule`); records
  # from before that option: the configured gamma.
  used = {str(g): n for g, n in sorted(collections.Counter(
      r.get('gamma', settings['gamma']) for r in records).items())}
  rates = spec_stats.rates(
      iterations=sum_('iterations'), drafted=sum_('drafted'),
      accepted=sum_('accepted'), beta_sum=sum_('beta_sum'),
      beta_count=sum_('beta_count'), tokens=tokens)
  if not sum_('drafted'):  # nothing verified: no alpha was measured
    rates.update(alpha=None, acceptance_rate=None)
  summary = {
      'examples': len(records),
      'batches': len({r['batch'] for r in records}),
      'timed_calls': len(batch_times),
      # Records of runs from before streaming say nothing: fixed.
      'batching': records[0].get('batching', 'fixed'),
      'gamma': int(next(iter(used))) if len(used) == 1 else None,
      'gamma_used': used,
      'gamma_label': gamma_label(used, choices),
      'baseline_s': base_s,
      'speculative_s': spec_s,
      'walltime_speedup': base_s / spec_s if spec_s else None,
      **rates,
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
      **timing_load(loads.values()),
  }
  if greedy:
    kinds = [(r.get('divergence') or {}).get('kind') for r in records
             if not r['identical']]
    summary['near_ties'] = kinds.count('near_tie')
    summary['mismatches'] = kinds.count('mismatch')
    # Rows from a run before diagnostics existed.
    summary['undiagnosed'] = kinds.count(None)
  # The settings, but gamma: the configured one is `configured_gamma`
  # (run.json's), the decoded one is the records'.
  summary.update(said)
  return summary


def timing_load(loads) -> Dict[str, Any]:
  """How busy other processes kept the machine while the job timed
  (`measure.OtherLoad`, each timed unit's `[CPU s, wall s]`; None: not
  known): `other_load_cores`, their CPU seconds over the wall seconds
  pooled (None where no unit knows), and `timing_warning`, a sentence
  where that is over `measure.BUSY_CORES` across at least a second."""
  known = [x for x in loads if x]
  wall = sum(w for _, w in known)
  if not known or wall <= 0:
    return {'other_load_cores': None, 'timing_warning': None}
  cores = sum(c for c, _ in known) / wall
  warning = None
  if cores > measure.BUSY_CORES and wall >= 1.0:
    warning = (f'timed beside other work: other processes kept {cores:.2f} '
               f'of {os.cpu_count()} cores busy on average while this job '
               'timed, so its times and speed-ups are not this machine\'s; '
               'decode again on a quiet machine (into a fresh '
               'EVAL_OUTPUT_DIR: a rerun reuses the records)')
  return {'other_load_cores': cores, 'timing_warning': warning}


MARKDOWN_COLUMNS = (
    'task', 'drafter', 'temperature', 'gamma_label', 'examples', 'alpha',
    'walltime_speedup', 'mean_accepted_length', 'target_calls_per_token',
    'differing_examples', 'near_ties', 'mismatches')


def markdown(summary, base_metrics, spec_metrics) -> str:
  """summary.md: the status, what was decoded and how, one table row of
  `MARKDOWN_COLUMNS` and both outputs' metrics (None: '-'), the times."""
  cells = []
  for c in MARKDOWN_COLUMNS:
    v = summary.get(c)
    cells.append(f'{v:.3f}' if isinstance(v, float) else
                 '-' if v is None else str(v))
  metric_names = sorted(base_metrics)
  header = ['gamma' if c == 'gamma_label' else c for c in MARKDOWN_COLUMNS
            ] + [f'baseline {m}' for m in metric_names] + [
                f'speculative {m}' for m in metric_names]
  cells += [f'{base_metrics[m]:.2f}' for m in metric_names]
  cells += [f'{spec_metrics.get(m, float("nan")):.2f}' for m in metric_names]
  warning = summary.get('timing_warning')
  return (f"**Status: {summary.get('status')}.**\n\n{_decoded(summary)}\n\n"
          '| ' + ' | '.join(header) + ' |\n|' + '---|' * len(header) +
          '\n| ' + ' | '.join(cells) + ' |\n' + _times(summary) +
          (f'\n**Warning: {warning}.**\n' if warning else ''))


def _decoded(summary) -> str:
  """What the job decoded, with what, and how, in a sentence or three."""
  get = summary.get
  # A checkpoint of None (random weights): the settings say 'None'.
  named = lambda k: None if get(k) in (None, 'None') else get(k)
  target = named('target_checkpoint') or 'random weights'
  if get('target_widen_to'):
    target += f" widened to {get('target_widen_to')}"
  drafter = get('drafter')
  if named('draft_checkpoint'):
    drafter = f"{drafter}, {get('draft_checkpoint')}"
  sampling = sampling_lib.describe({  # as run: an earlier rule's values too
      f: get(f) for f in FIELDS if get(f) is not None})
  return (f"{get('task')} ({get('split')} split): {get('examples')} "
          f"examples. Target {target}; drafter {drafter}. Gamma "
          f"{get('gamma_label', get('configured_gamma'))}; {sampling}; "
          f"batch {get('batch_size')}, {get('batching', 'fixed')}.")


def _times(summary) -> str:
  """The line of the two decoders' timed seconds and tokens/s."""
  get = summary.get
  if get('baseline_s') is None or get('speculative_s') is None:
    return ''
  ratio = lambda v: '-' if v is None else f'{v:.2f}x'
  rate = lambda v: '-' if v is None else f'{v:.1f}'
  return (f"\nTimed side by side: baseline {get('baseline_s'):.3f} s "
          f"({rate(get('baseline_tokens_per_s'))} tokens/s), speculative "
          f"{get('speculative_s'):.3f} s "
          f"({rate(get('speculative_tokens_per_s'))} tokens/s): "
          f"{ratio(get('walltime_speedup'))} walltime, "
          f"{ratio(get('throughput_speedup'))} tokens/s.\n")


def status(records, wanted: set, error: Optional[BaseException]) -> str:
  """'complete' only when every wanted example has its record."""
  missing = len(wanted - {r['index'] for r in records})
  if isinstance(error, KeyboardInterrupt):
    cause = ('SIGTERM' if isinstance(error, run_folder.Terminated) else
             'SIGINT / Ctrl-C')
    return (f'interrupted ({cause}) with {missing} of {len(wanted)} examples '
            'left; rerun the same command to resume')
  if error is not None:  # a refused input fails again until corrected
    again = ('correct it and rerun' if isinstance(error, checks.REFUSED)
             else 'rerun the same command')
    return (f'failed with {missing} of {len(wanted)} examples left: '
            f'{error!r}; {again} to resume')
  if missing:
    return f'incomplete: {missing} of {len(wanted)} examples left'
  return 'complete'


def start_line(out: pathlib.Path, wanted: int, reused: int,
               asked: Optional[int] = None) -> str:
  """The job's first console line: what it decodes, what it reuses, and
  where the split holds fewer than the `asked` examples (`num_examples`)."""
  short = ('' if asked is None or wanted >= asked else
           f' (the split holds {wanted} of the {asked} examples asked for)')
  if not reused:
    return (f'decoding {wanted} example{"s" * (wanted != 1)} into {out}'
            + short)
  left = wanted - reused
  return (f'{reused} of {wanted} examples found in {out} (records of an '
          'earlier run with these settings): reusing them, '
          + (f'decoding the other {left}' if left else 'nothing to decode')
          + '; delete the folder or pass a fresh EVAL_OUTPUT_DIR to decode '
          'them again' + short)


def write_started(out: pathlib.Path, wanted: int, reused: int) -> None:
  """summary.json and summary.md of a job that has begun decoding: `write`
  replaces them when it ends, however it ends in Python. Left as they are,
  they say that the job is running or ended without a summary (SIGKILL,
  out of memory, or aborted by jax.distributed when a peer died), and
  when and where it began, never an earlier run's figures."""
  started = datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds')
  where = f'{socket.gethostname()} (pid {os.getpid()})'
  status = (f'unfinished: started {started} on {where} to decode '
            f'{wanted - reused} of {wanted} examples; running, or ended '
            'without its summary (killed, out of memory, or aborted when '
            'a peer process died): examples.jsonl holds what finished; '
            'rerun the same command to resume')
  summary = {'status': status, 'started': started, 'host': where,
             'examples_wanted': wanted, 'reused_records': reused}
  run_folder.write_atomic(out / 'summary.json', json.dumps(summary, indent=1))
  run_folder.write_atomic(out / 'summary.md', f'**Status: {status}.**\n')


def end_line(out: pathlib.Path, summary: Dict[str, Any]) -> str:
  """The job's last console line: its status and headline figures."""
  figures = [f"{summary['examples']} examples"]
  if summary.get('walltime_speedup') is not None:
    figures.append(f"walltime speed-up {summary['walltime_speedup']:.2f}x")
  if summary.get('alpha') is not None:
    figures.append(f"alpha {summary['alpha']:.3f}")
  if summary.get('differing_examples') is not None:
    figures.append(f"{summary['differing_examples']} greedy outputs differ "
                   "from the baseline's")
  return (f"{out}: {summary['status']} ({', '.join(figures)}); "
          'summary.json, summary.md')


def _choice(path: pathlib.Path) -> Dict[str, Any]:
  """A gamma choice file; a damaged one as what is wrong with it (the
  summary of what finished is written all the same)."""
  try:
    return run_folder.read_choice(path)
  except run_folder.RunFolderError as e:
    return {'file': path.name, 'damaged': e.message}


def write(out: pathlib.Path, task, records, settings, wanted: set,
                   error: Optional[BaseException], reused: int = 0
                   ) -> Dict[str, Any]:
  """summary.json and summary.md of the finished records (and the error).

  The summary is of the `wanted` examples (the first `num_examples`);
  records of others in the folder (an earlier run asked for more) are
  kept for a later run and only counted (`other_records`). `reused`: how
  many of the wanted examples had records of an earlier run when this one
  started (summary.json's `reused_records`).
  """
  records.sort(key=lambda r: r['index'])
  kept = len(records)
  records = [r for r in records if r['index'] in wanted]
  # How gamma was chosen (`unit_loop.choose_gamma`), one entry per process.
  choices = [_choice(f) for f in sorted(out.glob('gamma_choice*.json'))]
  summary = summarize(records, settings, choices)
  base_m = spec_m = {}
  missing: Dict[str, str] = {}
  if records:
    targets = [r['target'] for r in records]
    base_m = data.task_metrics(task, targets,
                               [r['baseline'] for r in records], missing)
    spec_m = data.task_metrics(task, targets,
                               [r['speculative'] for r in records], missing)
  summary['baseline_metrics'] = base_m
  summary['speculative_metrics'] = spec_m
  # A metric whose package is missing here (rouge-score on a GPU image):
  # named, not fatal, so the summary of what decoded is written.
  summary['metrics_not_computed'] = missing
  summary['status'] = status(records, wanted, error)
  summary['reused_records'] = reused
  summary['other_records'] = kept - len(records)
  summary['gamma_choices'] = choices
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
