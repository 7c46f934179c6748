r"""Baseline vs speculative evaluation job, launched like a T5X job.

  python -m specdec_jax.eval \
    --gin_file=gin_configs/paper/ende_t0_small.gin \
    --gin.TARGET_CHECKPOINT="'/ckpts/t5_1_1_xxl_ende/checkpoint_1000000'" \
    --gin.DRAFT_CHECKPOINT="'/ckpts/t5_1_1_small_ende/checkpoint_1000000'" \
    --gin.EVAL_OUTPUT_DIR="'/tmp/ende_t0_small'"

The gin files configure one `loading.EvalSetup` (target, drafter, task,
decoding: what to evaluate) and this job's `evaluate` (where results go, how
to time); `--dry_run` prints the setup. Flags follow T5X (gin_utils.py):
`--gin_file` (repeatable), `--gin_bindings` (repeatable),
`--gin.NAME=VALUE` (shorthand for a binding), `--gin_search_paths`
(comma-separated; the project's gin_configs/ is always searched).

For every batch the same inputs are decoded by the baseline and by
speculative decoding, both compiled, timed side by side (the order alternates
between batches). At batch > 1 both decode with continuous batching by
default (`EvalSetup.batching = 'stream'`: `streaming.sample_stream` and
`streaming.speculative_stream`, an ended row refilled with the next example
inside the loop) over chunks of `EvalSetup.stream_chunk` batches' worth of
examples: the chunk is then the unit decoded, timed, written and resumed
(below, read "chunk" for "batch"); `BATCHING = 'fixed'` decodes fixed
batches. At batch > 1 gamma is chosen for the batch by default
(`EvalSetup.batch_gamma = 'profile'`, `choose_gamma`): the first unit's
warm-up at GAMMA gives alpha, the target's cost(k) at this batch and the
drafter's c are timed on this machine, and the gamma maximizing Theorem 3.8
with the measured cost(gamma + 1) decodes every unit. Outputs in
EVAL_OUTPUT_DIR:
  examples.jsonl   one record per example, appended as batches finish;
  summary.json     walltime speedup, alpha, mean accepted length, target calls
                   per token, metrics of both outputs, differing examples
                   (greedy) split into rounding near-ties and real mismatches
                   (diagnostics.py);
  summary.md       the same as one markdown table row (with its header);
  config.gin       the operative gin config;
  run.json         the run's identity: every setting that can change a
                   record (`run_folder.identity`: every EvalSetup field but
                   num_examples, the checkpoints' content, the mesh, the
                   device); a rerun resumes only with the same identity and
                   the same examples under the recorded indices, else it is
                   refused naming what changed (`evaluate.if_settings_differ
                   = 'restart'` moves the old run aside instead);
  gamma_choice.json  the gamma chosen for the batch and the measured profile
                   behind it (batch_gamma 'profile'; a resumed run reuses it);
  output_cache.npz the output cache of the 'cache' / 'combined' drafters
                   when OUTPUT_CACHE is None (committed with each unit's
                   records, as a cache file of its own is).
The job's first console line says what it decodes and, when the folder holds
records of an earlier run, how many it reuses (summary.json: reused_records).
Nothing finished is lost and nothing is counted twice: each batch's records
are flushed and fsync'd once decoded; a rerun with the same settings
resumes, dropping a last line cut off by a crash (that example is decoded
again) and any second record of an index; summary files are replaced
atomically; the output cache changes only with the records of the unit
that grew it (`run_folder.CacheCommit`), so a crash between any two writes
resumes to the records and cache of an uninterrupted run. Ctrl-C (SIGINT) or SIGTERM ends the job with status
'interrupted', an exception with 'failed' (both say how many examples are
left; the exception is re-raised); 'complete' means every requested
example has its record. A greedy row that differs from the baseline
is diagnosed (`diagnostics.diagnose`: teacher-forced float32 logits at the
first difference): a numerical near-tie is counted and reported, a real
mismatch marks the summary failed and the job raises `MismatchError` (exit
status 1) after writing everything.

On a device mesh (gin_configs/mesh/partitioner.gin: `evaluate.partitioner`)
the target is restored straight into T5X-style shardings and both decoders
run sharded (partitioning.py). Across processes (`--coordinator_address`,
`--num_processes`, `--process_id`, or the JAX_* env, or `--multiprocess`;
`jax.distributed`), each process decodes every P-th batch (chunk) into its
own examples.process-p-of-P.jsonl and process 0 merges them into
examples.jsonl (each index once) and writes the summary.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import pathlib
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from specdec_jax import checks
from specdec_jax import data
from specdec_jax import gin_utils
from specdec_jax import interfaces
from specdec_jax import loading
from specdec_jax import run_folder
from specdec_jax.loading import EvalSetup

# The job's flags and gin handling live in gin_utils (shared with training).
GIN_DIR = gin_utils.GIN_DIR
RECORDS = run_folder.RECORDS


class MismatchError(RuntimeError):
  """Greedy speculative outputs differ from the baseline beyond rounding."""


def _units(setup: EvalSetup, all_inputs: np.ndarray
           ) -> Iterator[Tuple[int, int, int, np.ndarray]]:
  """The timed decode calls: `(unit, start, rows used, inputs)`.

  Fixed batches: unit b is batch b (`data.batches`, a short last one
  filled). Streamed (`setup.streamed`): unit c is chunk c, the examples
  [c K B, (c + 1) K B) with K = `setup.stream_chunk` and B the batch, a
  short last chunk filled (repeating its first row) to a multiple of B.
  """
  b = setup.batch_size
  if not setup.streamed:
    for start, n, inputs in data.batches(all_inputs, b):
      yield start // b, start, n, inputs
    return
  size = setup.stream_chunk * b
  for start in range(0, len(all_inputs), size):
    rows = all_inputs[start:start + size]
    n = len(rows)
    filled = -(-n // b) * b
    inputs = np.concatenate([rows, np.repeat(rows[:1], filled - n, 0)])
    yield start // size, start, n, inputs


def choose_gamma(loaded: loading.Loaded, inputs, first) -> Dict[str, Any]:
  """gamma for the setup's batch from a profile measured now, on this
  machine (`EvalSetup.batch_gamma` 'profile').

  Args:
    loaded: the built setup.
    inputs: a unit's inputs (its first `batch_size` rows are timed).
    first: the speculative decode of that unit at `setup.gamma` (its alpha).

  Returns:
    {'gamma', 'rule', 'configured_gamma', 'alpha', 'prediction' (the
    `bench.hardware.Prediction` of the chosen gamma), 'profile'} (JSON).
  """
  from specdec_jax import measure  # pylint: disable=g-import-not-at-top
  from specdec_jax import spec_stats  # pylint: disable=g-import-not-at-top
  from specdec_jax.bench import hardware  # pylint: disable=g-import-not-at-top

  setup = loaded.setup
  b, top = setup.batch_size, setup.max_gamma
  rows = inputs[:b]
  # A call at half the output length: the mean context of a decode.
  context = max(setup.task_feature_lengths['targets'] // 2, 1)
  seconds = measure.cost_curve(loaded.target, loaded.target_params, rows,
                               range(1, top + 2), context=context,
                               jit_setup=True)
  t_draft = measure.drafter_token_time(
      loaded.drafter, loaded.draft_params, rows, setup.gamma,
      context=context, jit_setup=True)
  t1 = seconds[1]
  profile = hardware.HardwareProfile.of_run(
      f'this run, batch {b}', b, t1,
      {k: t / t1 for k, t in seconds.items()}, {setup.drafter: t_draft / t1},
      device=measure.machine())
  alpha = spec_stats.summarize(first.stats)['alpha']
  chosen = hardware.predict(profile, alpha=min(max(alpha, 0.0), 1.0),
                            drafter=setup.drafter, batch=b, max_gamma=top)
  return {'gamma': int(chosen.gamma), 'rule': 'profile',
          'configured_gamma': setup.gamma, 'alpha': alpha,
          'prediction': chosen.to_json(), 'profile': profile.to_json()}


def _decode_batches(loaded: loading.Loaded, examples: Sequence[Any],
                    done: set, timing_repeats: int, share=(0, 1),
                    partitioner=None, choice_file=None, commit=None
                    ) -> Iterator[List[Dict[str, Any]]]:
  """Decodes every unfinished unit both ways; yields each unit's records.

  A unit is a batch, or streamed (`EvalSetup.streamed`) a chunk of
  `stream_chunk` batches' worth of examples decoded by the streaming loops
  (`streaming.sample_stream` / `speculative_stream`: `batch_size` slots,
  an ended row refilled inside the loop). Rows already in `done` (a unit
  cut short by a crash) are decoded with their unit but not recorded again.
  With `share` (index, count) only units u with u % count == index are
  decoded (a process's share); with a `partitioner` each unit's inputs are
  placed on its mesh (batch over 'data'; a stream's refills then encode a
  full slot batch, which the mesh divides).

  The two decoders run on the same inputs and rng, compiled (each new
  input / drafter shape is decoded once untimed), timed alternately
  (`measure.time_alternating`, the first one alternating between units).
  An output cache (kinds 'cache', 'combined') learns the finished outputs
  after each unit: streamed, the examples of a chunk draft from the outputs
  of earlier chunks (fixed: of earlier batches). With `commit` (a
  `run_folder.CacheCommit`) the grown cache is staged before the unit's
  records are yielded; the caller appends them, then finishes the commit.

  With `setup.profile_gamma` the first unit decoded sets gamma for the
  rest (`choose_gamma`, after its untimed warm-up at `setup.gamma`),
  kept in `choice_file` (read back when the run resumes); every record
  says the gamma it was decoded with.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax import diagnostics  # pylint: disable=g-import-not-at-top
  from specdec_jax import measure  # pylint: disable=g-import-not-at-top
  from specdec_jax import partitioning  # pylint: disable=g-import-not-at-top
  from specdec_jax import speculative  # pylint: disable=g-import-not-at-top
  from specdec_jax import streaming  # pylint: disable=g-import-not-at-top

  setup, target, target_params = (loaded.setup, loaded.target,
                                  loaded.target_params)
  sampling = setup.sampling
  lengths = setup.task_feature_lengths
  all_inputs = data.pad_rows([ids for _, ids, _, _ in examples],
                             lengths['inputs'])
  mode = 'stream' if setup.streamed else 'fixed'
  refill_sizes = None if partitioner is None else (setup.batch_size,)
  warmed = set()  # (input shape, drafter param shapes, gamma) compiled
  draft_params = loaded.draft_params
  gamma, choice = setup.gamma, None
  if setup.profile_gamma:
    if speculative.decodes_merged(loaded.drafter):
      choice = {'gamma': gamma, 'rule': 'config', 'configured_gamma': gamma,
                'why': f'drafter {setup.drafter!r} drafts in its merged loop '
                       '(its drafting rides on the target call; the chain '
                       'formula does not price it): gamma as configured'}
      if choice_file is not None:
        run_folder.write_atomic(choice_file, json.dumps(choice, indent=1))
    elif choice_file is not None and choice_file.exists():
      choice = json.loads(choice_file.read_text())
      print(f"gamma {choice['gamma']} for batch {setup.batch_size}, chosen "
            f'by the profile of the run being resumed ({choice_file})',
            flush=True)
    if choice is not None:
      gamma = choice['gamma']
  for u, start, n, inputs in tqdm(list(_units(setup, all_inputs)),
                                  desc='eval', unit='chunk' if
                                  setup.streamed else 'batch'):
    batch = examples[start:start + n]
    if u % share[1] != share[0] or all(i in done for i, *_ in batch):
      continue
    if partitioner is not None:
      inputs = partitioner.shard_batch(inputs)
    rng = jax.random.fold_in(jax.random.key(setup.seed), u)
    common = dict(max_decode_len=lengths['targets'], sampling=sampling,
                  eos_id=setup.eos_id, rng=rng)

    def calls_at(g, inputs=inputs, common=common, draft_params=draft_params):
      if setup.streamed:
        stream = dict(batch_size=setup.batch_size, refill_sizes=refill_sizes)
        return {
            'baseline': lambda: streaming.sample_stream(
                target, target_params, inputs, **stream, **common),
            'speculative': lambda: streaming.speculative_stream(
                target, target_params, loaded.drafter, draft_params, inputs,
                gamma=g, **stream, **common),
        }
      return {
          'baseline': lambda: decoding.temperature_sample(
              target, target_params, inputs,
              block_size=g + 1 if setup.same_shape_baseline else 1,
              **common),
          'speculative': lambda: speculative.speculative_sample(
              target, target_params, loaded.drafter, draft_params, inputs,
              gamma=g, **common),
      }

    calls = calls_at(gamma)
    shapes = (np.shape(inputs), str(jax.tree_util.tree_map(np.shape,
                                                           draft_params)))
    if (shapes, gamma) not in warmed:  # compile both outside the timings
      first, _ = measure.time_alternating(calls)
      warmed.add((shapes, gamma))
      if setup.profile_gamma and choice is None:
        choice = choose_gamma(loaded, inputs, first['speculative'])
        if choice_file is not None:
          run_folder.write_atomic(choice_file, json.dumps(choice, indent=1))
        pred = choice['prediction']
        print(f"gamma {choice['gamma']} for batch {setup.batch_size} "
              f"(configured {setup.gamma}): chosen by the profile measured "
              f"now, alpha {choice['alpha']:.2f}, cost(gamma + 1) "
              f"{pred['cost']:.2f}, c {pred['c']:.3f}, predicted speed-up "
              f"{pred['speedup']:.2f}x", flush=True)
        if choice['gamma'] != gamma:
          gamma = choice['gamma']
          calls = calls_at(gamma)
          # Compile what gamma changes outside the timings: the speculative
          # decode (and a same-shape baseline, whose block is gamma + 1).
          measure.time_alternating({
              name: call for name, call in calls.items()
              if name == 'speculative' or setup.same_shape_baseline})
          warmed.add((shapes, gamma))
    res, times = measure.time_alternating(calls, timing_repeats,
                                          reverse=u % 2 == 1)
    base, spec = res['baseline'], res['speculative']
    st = spec.stats
    divergences = {}
    if sampling.greedy:  # why a greedy row differs: rounding or a bug
      divergences = {d.row: d.to_dict() for d in diagnostics.diagnose(
          partitioning.unwrap(target), target_params, inputs[:n],
          np.asarray(base.tokens)[:n], np.asarray(spec.tokens)[:n])}
    text = lambda out, row, length: data.decode_text(
        loaded.vocabulary, out.tokens[row], length, setup.eos_id)
    records = []
    for row, (i, ids, in_text, tgt_text) in enumerate(batch):
      if i in done:
        continue
      b_len, s_len = int(base.lengths[row]), int(spec.lengths[row])
      record = dict(
          index=i, batch=i // setup.batch_size,
          example=run_folder.example_fingerprint(ids, in_text, tgt_text),
          input=in_text,
          target=tgt_text, baseline=text(base, row, b_len),
          speculative=text(spec, row, s_len),
          baseline_length=b_len, speculative_length=s_len,
          identical=bool(np.array_equal(base.tokens[row], spec.tokens[row])),
          iterations=int(st.row_iterations[row]),
          drafted=int(st.drafted[row]), accepted=int(st.accepted[row]),
          beta_sum=float(st.beta_sum[row]),
          beta_count=int(st.beta_count[row]),
          batching=mode, gamma=gamma,
          baseline_batch_s=times['baseline'],
          speculative_batch_s=times['speculative'],
          divergence=divergences.get(row))
      if setup.streamed:
        record['chunk'] = u
      records.append(record)
    if loaded.store is not None and records:
      # The output cache learns every output of the unit (all its rows: a
      # unit decoded again after a crash starts from the cache as it was
      # before the unit); the next unit drafts from it. A grown capacity
      # is a new compiled shape: warmed up again outside the timings.
      loaded.store.add_requests(
          target, target_params, inputs[:n],
          [np.asarray(spec.tokens[row])[:int(spec.lengths[row])]
           for row in range(n)])
      if commit is not None:
        commit.stage(loaded.store, [i for i, *_ in batch])
      if not isinstance(loaded.drafter, interfaces.StoreDrafter):
        raise TypeError(f'{type(loaded.drafter).__name__} reads an output '
                        'cache but is no interfaces.StoreDrafter (it has '
                        'no with_store).')
      draft_params = loaded.drafter.with_store(draft_params, loaded.store)
    yield records


def _summary(records, settings) -> Dict[str, Any]:
  """Totals of the records: times, speed-ups, alpha, rates, differences."""
  from specdec_jax import spec_stats  # pylint: disable=g-import-not-at-top

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
      # examples per gamma decoded with (`EvalSetup.batch_gamma`); records
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


def _markdown(summary, base_metrics, spec_metrics) -> str:
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


def _status(records, wanted: set, error: Optional[BaseException]) -> str:
  """'complete' only when every wanted example has its record."""
  missing = len(wanted - {r['index'] for r in records})
  if isinstance(error, KeyboardInterrupt):
    cause = 'SIGTERM' if isinstance(error, run_folder.Terminated) else 'SIGINT / Ctrl-C'
    return (f'interrupted ({cause}) with {missing} of {len(wanted)} examples '
            'left; rerun the same command to resume')
  if error is not None:
    return (f'failed with {missing} of {len(wanted)} examples left: '
            f'{error!r}; rerun the same command to resume')
  if missing:
    return f'incomplete: {missing} of {len(wanted)} examples left'
  return 'complete'


def _start_line(out: pathlib.Path, wanted: int, reused: int) -> str:
  """The job's first console line: what it decodes, what it reuses."""
  if not reused:
    return f'decoding {wanted} example{"s" * (wanted != 1)} into {out}'
  left = wanted - reused
  return (f'{reused} of {wanted} examples found in {out} (records of an '
          'earlier run with these settings): reusing them, '
          + (f'decoding the other {left}' if left else 'nothing to decode')
          + '; delete the folder or pass a fresh EVAL_OUTPUT_DIR to decode '
          'them again')


def _write_summary(out: pathlib.Path, task, records, settings, wanted: set,
                   error: Optional[BaseException], reused: int = 0
                   ) -> Dict[str, Any]:
  """summary.json and summary.md of the finished records (and the error).

  `reused`: how many of the wanted examples had records of an earlier run
  when this one started (summary.json's `reused_records`).
  """
  records.sort(key=lambda r: r['index'])
  summary = _summary(records, settings)
  base_m = spec_m = {}
  if records:
    targets = [r['target'] for r in records]
    base_m = data.task_metrics(task, targets,
                               [r['baseline'] for r in records])
    spec_m = data.task_metrics(task, targets,
                               [r['speculative'] for r in records])
  summary['baseline_metrics'] = base_m
  summary['speculative_metrics'] = spec_m
  summary['status'] = _status(records, wanted, error)
  summary['reused_records'] = reused
  # How gamma was chosen (`choose_gamma`), one entry per process.
  summary['gamma_choices'] = [json.loads(f.read_text()) for f in
                              sorted(out.glob('gamma_choice*.json'))]
  if summary['status'] == 'complete' and summary.get('mismatches'):
    summary['status'] = (
        f"failed: {summary['mismatches']} of "
        f"{summary['differing_examples']} differing greedy rows differ "
        'beyond rounding (real mismatches; see "divergence" in '
        'examples.jsonl)')
  run_folder.write_atomic(out / 'summary.json', json.dumps(summary, indent=1))
  run_folder.write_atomic(out / 'summary.md', _markdown(summary, base_m, spec_m))
  return summary


def evaluate(setup: EvalSetup, output_dir: str, *, timing_repeats: int = 1,
             config_str: str = '', partitioner=None,
             shard_drafter: bool = False,
             barrier_timeout_s: float = 24 * 3600,
             if_settings_differ: str = 'refuse') -> Dict[str, Any]:
  """Runs baseline and speculative decoding of a setup; writes the results.

  Across processes (`jax.distributed`, see `main`): process p of P decodes
  the batches b with b % P == p (batch b's rng is the single-process run's)
  into its own examples.process-p-of-P.jsonl; once all are done, process 0
  merges them into examples.jsonl (each index once) and writes the summary.
  A rerun, with any number of processes, resumes from every record file.

  Args:
    setup: what to decode (target, drafter, task, sampling, gamma, ...).
    output_dir: where results go; a rerun with the same settings resumes
      (`run_folder.identity`: every setting that shapes a record).
    timing_repeats: each batch is decoded this many times by each method
      (alternating) and the median time is reported.
    config_str: the gin config to save as config.gin.
    partitioner: None (one device) or a `partitioning.Partitioner`
      (gin_configs/mesh/*.gin): the target sharded over its mesh by its
      rules, each batch over 'data' (batch_size must be a multiple of it).
    shard_drafter: with a partitioner, shard a model drafter by the same
      rules (default: replicated on every device, batch over 'data').
    barrier_timeout_s: how long processes wait for each other (start and
      end of the job).
    if_settings_differ: when output_dir holds a run with other settings (or
      records of other examples under the same indices): 'refuse' (a
      ValueError naming each changed setting) or 'restart' (the old run's
      files are moved into output_dir/replaced-<time>/, then a fresh run).

  Returns:
    The summary dict (also written to summary.json); on a process other
    than 0, `{'process_index', 'examples'}` of its own share.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import drafters  # pylint: disable=g-import-not-at-top

  checks.check_int('timing_repeats', timing_repeats)
  task = loading.load_task(setup)
  examples = list(data.task_examples(task, setup.split,
                                     setup.task_feature_lengths,
                                     setup.num_examples,
                                     setup.truncate_inputs))
  index, count = jax.process_index(), jax.process_count()
  wanted = {i for i, *_ in examples}
  out = pathlib.Path(output_dir)
  if index != 0:
    run_folder.barrier('claimed', barrier_timeout_s)  # Process 0 claims.
  records = run_folder.claim(
      out, run_folder.identity(setup, partitioner, shard_drafter),
      config_str, {i: run_folder.example_fingerprint(*e)
                   for i, *e in examples},
      main_process=index == 0, num_examples=setup.num_examples,
      if_settings_differ=if_settings_differ)
  if index == 0:
    run_folder.barrier('claimed', barrier_timeout_s)
  run_folder.barrier('read', barrier_timeout_s)  # Nobody appends before.
  done = {r['index'] for r in records}
  reused = len(done & wanted)
  if index == 0:
    print(_start_line(out, len(wanted), reused), flush=True)
  own = run_folder.process_file(out, index, count)
  if count > 1:
    run_folder.read_records(own)  # Repairs a cut-off last line of our own.
  commit = None
  if drafters.get_kind(setup.drafter).uses_cache:
    # The output cache outlives each unit: it is committed with the
    # unit's records (`run_folder.CacheCommit`); without a file of its
    # own it is kept here, so a resumed run drafts from the same cache.
    suffix = '' if count == 1 else f'.process-{index:05d}-of-{count:05d}'
    path = setup.output_cache or str(out / f'output_cache{suffix}.npz')
    commit = run_folder.CacheCommit(out, path, suffix)
    commit.recover(done)
    setup = setup.replace(output_cache=path)
  error = None
  try:
    with run_folder.sigterm_interrupts():
      shardings = None
      if partitioner is not None:  # Restore the target straight into them.
        from specdec_jax import network  # pylint: disable=g-import-not-at-top
        shardings = partitioner.param_shardings(
            network.T5Model(setup.loaded_config))
      loaded = loading.build(setup, task=task, target_shardings=shardings)
      if partitioner is not None:
        loaded = shard_loaded(loaded, partitioner, shard_drafter)
      with own.open('a') as sink:
        for batch in _decode_batches(loaded, examples, done, timing_repeats,
                                     (index, count), partitioner,
                                     run_folder.choice_file(out, index, count),
                                     commit):
          run_folder.append(sink, batch)
          if commit is not None:
            commit.finish()
          records.extend(batch)
          run_folder.check_interrupted()
      run_folder.barrier('done', barrier_timeout_s)
      if index == 0 and (count > 1 or any(out.glob(
          'examples.process-*.jsonl'))):
        records = run_folder.merge(out)
  except BaseException as e:  # keep what finished, say why, re-raise
    error = e
    raise
  finally:
    if index == 0:
      summary = _write_summary(out, task, records, setup.settings(), wanted,
                               error, reused)
  if index != 0:
    return {'process_index': index, 'examples': len(records) - len(done)}
  if summary.get('mismatches'):
    raise MismatchError(summary['status'])
  return summary


def shard_loaded(loaded: loading.Loaded, partitioner, shard_drafter: bool
                 ) -> loading.Loaded:
  """`loaded` with its target (and model drafter) on the partitioner's mesh.

  The target is wrapped (`partitioning.ShardedModel`) and its params placed
  by the rules; a `drafters.T5Drafter`'s model is wrapped with the same
  rules (`shard_drafter`) or data-parallel ones (replicated weights); any
  other drafter's params are replicated (those of the kinds that draft with
  the target hold the target's own params: replicated too).
  """
  import dataclasses  # pylint: disable=g-import-not-at-top
  from specdec_jax import drafters  # pylint: disable=g-import-not-at-top
  from specdec_jax import partitioning  # pylint: disable=g-import-not-at-top

  target = partitioner.sharded_model(loaded.target)
  target_params = partitioner.shard_params(loaded.target_params, target)
  drafter, draft_params = loaded.drafter, loaded.draft_params
  if isinstance(drafter, drafters.T5Drafter):
    rules = None if shard_drafter else partitioning.data_parallel_rules()
    drafter = dataclasses.replace(
        drafter, model=partitioner.sharded_model(drafter.model, rules))
    draft_params = partitioner.shard_params(draft_params, drafter.model)
  else:
    draft_params = partitioner.replicate(draft_params)
  return dataclasses.replace(loaded, target=target,
                             target_params=target_params, drafter=drafter,
                             draft_params=draft_params)


# ---------------------------------------------------------------------------
# Entry point: flags and gin, T5X style.
# ---------------------------------------------------------------------------

def _add_flags(parser) -> None:
  parser.add_argument('--dry_run', action='store_true',
                      help='print the setup and exit')
  env = os.environ.get
  parser.add_argument(
      '--coordinator_address', default=env('JAX_COORDINATOR_ADDRESS'),
      help='host:port of process 0 for a multi-process run '
      '(jax.distributed; env JAX_COORDINATOR_ADDRESS)')
  parser.add_argument(
      '--num_processes', type=int, default=env('JAX_NUM_PROCESSES'),
      help='processes of the run (env JAX_NUM_PROCESSES)')
  parser.add_argument(
      '--process_id', type=int, default=env('JAX_PROCESS_ID'),
      help='this process, 0 .. num_processes - 1 (env JAX_PROCESS_ID)')
  parser.add_argument(
      '--multiprocess', action='store_true',
      help='jax.distributed.initialize() with cluster auto-detection '
      '(SLURM, Open MPI, TPU pods, ...) when the flags above are unset')


def parse_flags(argv: Sequence[str]):
  return gin_utils.parse_flags(
      argv, 'python -m specdec_jax.eval', __doc__.splitlines()[0],
      _add_flags)


def initialize_distributed(args) -> bool:
  """`jax.distributed.initialize` from the flags / env; False if not asked.

  Must run before jax touches a device. Each process then decodes its share
  of the batches on its own devices (`evaluate`).
  """
  named = (args.coordinator_address, args.num_processes, args.process_id)
  if not args.multiprocess and all(v is None for v in named):
    return False
  import jax  # pylint: disable=g-import-not-at-top
  kwargs = {}
  if args.coordinator_address is not None:
    kwargs['coordinator_address'] = args.coordinator_address
  if args.num_processes is not None:
    kwargs['num_processes'] = int(args.num_processes)
  if args.process_id is not None:
    kwargs['process_id'] = int(args.process_id)
  jax.distributed.initialize(**kwargs)
  logging.info('process %d of %d', jax.process_index(), jax.process_count())
  return True


def configured(argv: Sequence[str]):
  """Parses T5X-style flags and gin files.

  Returns:
    (flags, the configured `EvalSetup`, the configured `evaluate`).
  """
  import gin  # pylint: disable=g-import-not-at-top
  # The module gin files import (`from specdec_jax import eval`); under
  # `python -m` this file is __main__, a different module object.
  from specdec_jax import eval as eval_lib  # pylint: disable=g-import-not-at-top

  args = parse_flags(argv)
  if not args.dry_run:
    initialize_distributed(args)
  setup = loading.setup_from_flags(args)
  return args, setup, gin.get_configurable(eval_lib.evaluate)


def main(argv: Optional[Sequence[str]] = None):
  """Parses T5X-style flags and gin files, then runs `evaluate`.

  Returns:
    The summary, or with --dry_run the `EvalSetup`.
  """
  import gin  # pylint: disable=g-import-not-at-top

  args, setup, run = configured(sys.argv[1:] if argv is None else argv)
  if args.dry_run:
    print(setup.describe())
    return setup
  return run(setup=setup, config_str=gin.config_str())


if __name__ == '__main__':
  main()
