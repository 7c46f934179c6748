r"""Baseline vs speculative evaluation job, launched like a T5X job.

  python -m specdec_jax.eval \
    --gin_file=gin_configs/paper/ende_t0_small.gin \
    --gin.TARGET_CHECKPOINT="'/ckpts/t5_1_1_xxl_ende/checkpoint_1000000'" \
    --gin.DRAFT_CHECKPOINT="'/ckpts/t5_1_1_small_ende/checkpoint_1000000'" \
    --gin.EVAL_OUTPUT_DIR="'/tmp/ende_t0_small'"

The gin files configure one `loading.EvalSetup` (target, drafter, task,
decoding: what to evaluate) and this job's `evaluate` (where results go, how
to time); `--dry_run` prints the setup and checks what the job checks
before its first example (`preflight`). Flags follow T5X (gin_utils.py):
`--gin_file` (repeatable), `--gin_bindings` (repeatable),
`--gin.NAME=VALUE` (shorthand for a binding), `--gin_search_paths`
(comma-separated; the project's gin_configs/ is always searched).

For every batch the same inputs are decoded by the baseline and by
speculative decoding, both compiled, timed side by side (the order alternates
between batches). At batch > 1 both decode with continuous batching by
default (`BatchSpec.mode = 'stream'`: `streaming.sample_stream` and
`streaming.speculative_stream`, an ended row refilled with the next example
inside the loop) over chunks of `BatchSpec.chunk` batches' worth of
examples: the chunk is then the unit decoded, timed, written and resumed
(below, read "chunk" for "batch"); `BATCHING = 'fixed'` decodes fixed
batches. At batch > 1 gamma is chosen for the batch by default
(`BatchSpec.gamma_rule = 'profile'`, `unit_loop.choose_gamma`): untimed decodes
of the first 16 examples at GAMMA give alpha, the target's cost(k) at this
batch and the drafter's c are timed on this machine, and the gamma maximizing
Theorem 3.8 with the measured cost(gamma + 1) decodes every unit. Outputs in
EVAL_OUTPUT_DIR (a local folder, or a gs:// address: kept in a local copy
that the bucket follows write by write, bucket_folder.py):
  examples.jsonl   one record per example, appended as batches finish;
  summary.json     walltime speedup, alpha, mean accepted length, target calls
                   per token, metrics of both outputs, differing examples
                   (greedy) split into rounding near-ties and real mismatches
                   (diagnostics.py);
  summary.md       the status, what was decoded with what, the figures as
                   one markdown table row, the two decoders' times;
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
records of an earlier run, how many it reuses (summary.json: reused_records);
its last, the status and headline figures of its summary (every process of
a `jax.distributed` run returns and says the job's summary, process 0's).
Nothing finished is lost and nothing is counted twice: each batch's records are
flushed and fsync'd once decoded; a rerun with the same settings resumes,
dropping a last line cut off by a crash (that example is decoded again) and any
second record of an index; summary files are replaced atomically; the output
cache changes only with the records of the unit that grew it
(`run_folder.CacheCommit`), so a crash between any two writes resumes to the
records and cache of an uninterrupted run. Ctrl-C (SIGINT) or SIGTERM ends the
job with status 'interrupted', an exception with 'failed' (both say how many
examples are left; the exception is re-raised); 'complete' means every
requested example has its record. A job killed (SIGKILL, out of memory) or
aborted (jax.distributed, a peer lost) leaves the summary it wrote when it
began: 'unfinished: started <when> on <host> (pid <pid>) ...'. A greedy row
that differs from the baseline is diagnosed (`diagnostics.diagnose`:
teacher-forced float32 logits at the first difference): a numerical near-tie is
counted and reported, a real mismatch marks the summary failed and the job
raises `MismatchError` (exit status 1) after writing everything.

On a device mesh (gin_configs/mesh/partitioner.gin: `evaluate.partitioner`)
the target is restored straight into T5X-style shardings and both decoders
run sharded (partitioning.py). Across processes (`--coordinator_address`,
`--num_processes`, `--process_id`, or the JAX_* env, or `--multiprocess`;
`jax.distributed`), each process decodes every P-th batch (chunk) into its
own examples.process-p-of-P.jsonl and process 0 merges them into
examples.jsonl (each index once) and writes the summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import sys
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax

from specdec_jax import bucket_folder
from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import drafters
from specdec_jax import gin_utils
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import output_cache
from specdec_jax import partitioning
from specdec_jax import run_folder
from specdec_jax import summary as summary_lib
from specdec_jax import tasks
from specdec_jax import unit_loop
from specdec_jax.loading import EvalSetup

# The job's flags and gin handling live in gin_utils (shared with training).
GIN_DIR = gin_utils.GIN_DIR
RECORDS = run_folder.RECORDS


class MismatchError(RuntimeError):
  """Greedy speculative outputs differ from the baseline beyond rounding."""


def evaluate(setup: EvalSetup, output_dir: str, *, timing_repeats: int = 1,
             config_str: str = '', partitioner=None,
             shard_drafter: bool = False,
             if_settings_differ: str = 'refuse',
             cache: Optional[loading.LoadCache] = None,
             sync_every_s: float = 60.0,
             dry_run: bool = False) -> Dict[str, Any]:
  """Runs baseline and speculative decoding of a setup; writes the results.

  Across processes (`jax.distributed`, see `main`): process p of P decodes
  the batches b with b % P == p (batch b's rng is the single-process run's)
  into its own examples.process-p-of-P.jsonl; once all are done, process 0
  merges them into examples.jsonl (each index once) and writes the summary.
  A rerun, with any number of processes, resumes from every record file.
  On one mesh spanning the processes (`Partitioner(global_mesh=True)`)
  every process decodes every batch in the same calls, and process 0
  writes the run as a single process would (the others write nothing).

  Args:
    setup: what to decode (target, drafter, task, sampling, gamma, ...).
    output_dir: where results go, a local folder or a gs:// address (kept
      in a local copy, copied to the bucket as it changes:
      bucket_folder.py); a rerun with the same settings resumes
      (`run_folder.identity`: every setting that shapes a record).
    timing_repeats: each batch is decoded this many times by each method
      (alternating) and the median time is reported.
    config_str: the gin config to save as config.gin.
    partitioner: None (one device) or a `partitioning.Partitioner`
      (gin_configs/mesh/*.gin): the target sharded over its mesh by its
      rules, each batch over 'data' (batch_size must be a multiple of it).
    shard_drafter: with a partitioner, shard a model drafter by the same
      rules (default: replicated on every device, batch over 'data').
    if_settings_differ: when output_dir holds a run with other settings (or
      records of other examples under the same indices): 'refuse' (a
      ValueError naming each changed setting) or 'restart' (the old run's
      files are moved into output_dir/replaced-<time>/, then a fresh run).
    cache: a `loading.LoadCache` (a sweep's, kept across its cells): the
      models and examples it holds are not loaded again.
    sync_every_s: at a gs:// output_dir, the longest new records wait
      before they are copied to the bucket (any other write is copied at
      once; the job's end copies everything).
    dry_run: only check what the job checks before it reads an example
      (`preflight`: the folder, the mesh, the checkpoints, the task), and
      write and decode nothing (the mesh: this process's, as the job's).

  Returns:
    The summary dict (also written to summary.json by process 0; every
    process of a `jax.distributed` run returns it); with `dry_run`,
    {'status': 'checked', 'checked': what was, a line each}.
  """
  if dry_run:  # the folder reached too (a job's pull reaches it first)
    checked = preflight([(setup, output_dir, config_str)], partitioner)[1]
    return {'status': 'checked',
            'checked': [_folder_checked(output_dir)] + checked}
  return evaluate_together(
      [(setup, output_dir, config_str)], timing_repeats=timing_repeats,
      partitioner=partitioner, shard_drafter=shard_drafter,
      if_settings_differ=if_settings_differ, cache=cache,
      sync_every_s=sync_every_s)[0]


class _Run:
  """One setup's run folder in a job: claimed, its records appended as
  units finish, its summary written (`evaluate_together`).

  `count` record files (one per process; one on a mesh spanning the
  processes, process 0's: the others decode alike and write nothing, so
  they read process 0's output cache and gamma choice, not their own).
  """

  def __init__(self, setup: EvalSetup, output_dir: str, config_str: str,
               task, fingerprints, partitioner, shard_drafter,
               if_settings_differ: str, sync_every_s: float = 60.0,
               claim_token: Optional[str] = None):
    self.setup, self.task, self.shown = setup, task, output_dir
    self.bucket = None  # a gs:// output_dir, kept in a local copy
    if bucket_folder.is_bucket(output_dir):
      self.bucket = bucket_folder.BucketFolder(output_dir, sync_every_s)
      self.bucket.start(hold=jax.process_index() == 0,  # one job writes
                        lease_id=claim_token)
    self.out = (pathlib.Path(output_dir).expanduser() if self.bucket is None
                else self.bucket.local)
    try:
      self._claim(setup, fingerprints, partitioner, shard_drafter,
                  config_str, if_settings_differ, claim_token)
    except BaseException as e:
      run_folder.release(self.out)
      if self.bucket is not None:
        self.bucket.close()
        if isinstance(e, run_folder.RunFolderError):
          raise run_folder.RunFolderError(self.bucket.shown(e.message)
                                          ) from None
      raise
    if self.bucket is not None and not self.writes:
      self.bucket.reads_only()  # process 0 writes the folder
    self.own = None  # its record file (None: it writes none)

  def _claim(self, setup, fingerprints, partitioner, shard_drafter,
             config_str, if_settings_differ, claim_token) -> None:
    self.index = jax.process_index()
    self.count = _sharing_processes(partitioner)
    self.writes = self.index == 0 or self.count > 1  # a share of its own
    self.wanted = set(fingerprints)
    self.records = run_folder.claim(
        self.out, run_folder.identity(setup, partitioner, shard_drafter,
                                      self.task), config_str, fingerprints,
        main_process=self.index == 0, num_examples=setup.data.num_examples,
        if_settings_differ=if_settings_differ,
        # A bucket is one folder for all (each process a local copy of it).
        token=None if self.bucket is not None else claim_token,
        held=self.bucket is None)

  def open(self) -> unit_loop.Lane:
    """Says what it decodes; readies its record file and output cache;
    its lane, to be given its loaded setup."""
    done = {r['index'] for r in self.records}
    self.reused = len(done & self.wanted)
    if self.index == 0:
      print(summary_lib.start_line(self.shown, len(self.wanted),
                                   self.reused, self.setup.data.num_examples),
            flush=True)
    if self.bucket is not None and not self.writes:
      self.bucket.pull(others=True)  # process 0's output cache, recovered
    if self.writes:
      self.own = run_folder.process_file(self.out, self.index, self.count)
    if self.count > 1:
      run_folder.read_records(self.own)  # Repairs a cut-off last line.
    commit = None
    if self.setup.draft.drafter_kind.uses_cache:
      # The output cache outlives each unit: it is committed with the
      # unit's records (`run_folder.CacheCommit`); without a file of its
      # own it is kept here, so a resumed run drafts from the same cache.
      suffix = ('' if self.count == 1 else
                f'.process-{self.index:05d}-of-{self.count:05d}')
      path = self.setup.draft.output_cache or str(
          self.out / f'output_cache{suffix}.npz')
      if self.writes:
        commit = run_folder.CacheCommit(self.out, path, suffix)
        commit.recover(done)
      self.setup = self.setup.replace(output_cache=path)
    return unit_loop.Lane(None, done, run_folder.choice_file(
        self.out, self.index, self.count) if self.writes else None, commit)

  @property
  def share(self) -> Tuple[int, int]:
    """The units this process decodes (`unit_loop.decode_units`): its
    own share of them, or all where one mesh spans the processes."""
    return (self.index, self.count) if self.count > 1 else (0, 1)

  def loading_setup(self) -> EvalSetup:
    """Its setup as this process loads it: where it writes nothing, an
    output cache file process 0 has not saved yet is seeded here alike
    but not saved (process 0 saves it)."""
    path = self.setup.draft.output_cache
    if self.writes or path is None or checkpoints.isfile(path):
      return self.setup
    return self.setup.replace(output_cache=None)

  def begin(self) -> None:
    """On process 0: the summary of a job under way (`finish` replaces
    it; a job killed or aborted leaves it)."""
    if self.index == 0:
      summary_lib.write_started(self.out, len(self.wanted), self.reused)

  def sink(self, files: contextlib.ExitStack):
    """Its record file, open to append (None where it writes none)."""
    return None if self.own is None else files.enter_context(
        self.own.open('a'))

  def append(self, sink, batch, lane: unit_loop.Lane) -> None:
    """A unit's records, written (and its output cache committed)."""
    if sink is not None:
      run_folder.append(sink, batch)
    if lane.commit is not None:
      lane.commit.finish()
    self.records.extend(batch)

  def sync(self) -> None:
    """At a gs:// output_dir: the bucket made what its local copy is
    (before the others' records are merged)."""
    if self.bucket is not None:
      self.bucket.sync(force=True)

  def close(self) -> None:
    """Lets go of the folder (`run_folder.hold`); at a gs:// output_dir:
    the bucket made what its local copy is, the local copy removed."""
    run_folder.release(self.out)
    if self.bucket is not None:
      self.bucket.close()

  def finish(self, error) -> Dict[str, Any]:
    """Merges the processes' records (once all are done) and, on process
    0, writes the summary of what finished (the others: their share); a
    gs:// output_dir copied up whole."""
    try:
      return self._finish(error)
    finally:
      self.close()

  def _finish(self, error) -> Dict[str, Any]:
    if error is None and self.index == 0:
      if self.count > 1 and self.bucket is not None:
        self.bucket.pull(others=True)  # the others' records and choices
      if self.count > 1 or any(self.out.glob('examples.process-*.jsonl')):
        self.records = run_folder.merge(self.out)
    if self.index != 0:
      return {'process_index': self.index,
              'examples': len(self.records) - self.reused}
    summary = summary_lib.write(self.out, self.task, self.records,
                                self.setup.settings(), self.wanted, error,
                                self.reused)
    if summary.get('timing_warning'):  # said where the run is watched
      print(f"warning: {summary['timing_warning']}", file=sys.stderr)
    return summary


def _say(runs, summaries) -> None:
  """Prints each run's last line (`summary.end_line`)."""
  for (_, out, _), summary in zip(runs, summaries):
    print(summary_lib.end_line(out, summary), flush=True)


def _sharing_processes(partitioner) -> int:
  """How many processes decode shares of their own: every process of a
  `jax.distributed` run, but 1 where one mesh spans them (each decodes
  every batch)."""
  if partitioner is not None and partitioner.spans_processes:
    return 1
  return jax.process_count()


def _check_output_cache(setup: EvalSetup, partitioner) -> None:
  """Refuses an OUTPUT_CACHE file where processes decode shares of their
  own: each grows a cache of its share, which one file cannot hold (each
  would commit over the others'). Every process refuses alike, from what
  they all know, before any of them waits on another."""
  count = _sharing_processes(partitioner)
  if count > 1 and setup.draft.output_cache is not None:
    raise checks.InputError(
        f'OUTPUT_CACHE {setup.draft.output_cache!r} with {count} '
        'processes decoding shares of their own: each grows its own '
        'cache, which one file cannot hold. Leave OUTPUT_CACHE None (each '
        'process keeps output_cache.process-<p>-of-<P>.npz in '
        'EVAL_OUTPUT_DIR), or run one mesh spanning the processes.')


def _check_mesh_batch(setup: EvalSetup, partitioner) -> None:
  """Refuses a BATCH_SIZE the mesh cannot split (every batch is split
  over the mesh axes the target's 'batch' maps to: its 'data' axis), said
  before the run folder is claimed, not when the decoder is traced."""
  if partitioner is None:
    return
  parts = partitioning.batch_multiple(partitioner.sharded_model(
      network.T5Model(setup.decoding_config)))
  if setup.batch.size % parts:
    raise checks.InputError(
        f'BATCH_SIZE {setup.batch.size} does not divide into the {parts} '
        "parts the mesh splits every batch into (its 'data' axis: the "
        'devices over NUM_PARTITIONS): choose a multiple of '
        f'{parts}.')


def preflight(runs: Sequence[Tuple[EvalSetup, str, str]], partitioner
              ) -> Tuple[Any, List[str]]:
  """What a job checks before it reads an example (`evaluate_together`,
  and all of `--dry_run`): each run's folder, output cache and batch on
  the mesh, one baseline (`_check_runs`), the checkpoints there
  (`loading.check_checkpoints`), the task and its vocabulary against the
  target (`loading.load_task`). Returns (the task, what was checked, a
  line each)."""
  _check_runs(runs, partitioner)
  checked = []
  if partitioner is not None:
    checked.append(f'mesh {dict(partitioner.mesh.shape)} of '
                   f'{partitioner.mesh.devices.size} devices')
  for setup, _, _ in runs:
    checked += loading.check_checkpoints(setup)
  setup = runs[0][0]
  task = loading.load_task(setup)
  checked.append(
      f'task {setup.data.mixture_or_task_name} ({setup.data.split}): a '
      f'vocabulary of {tasks.vocab_size(task)} tokens, TARGET_MODEL '
      f'{setup.target_config.vocab_size}')
  return task, checked


def _folder_checked(out: str) -> str:
  """What a dry run says of its folder: a gs:// one listed (GCS reached),
  a local one writable (`_check_runs`)."""
  if bucket_folder.is_bucket(out):
    names = checkpoints.list_files(out)
    return f'output_dir {out} (reached: {len(names)} files there)'
  exists = os.path.isdir(os.path.expanduser(out))
  return f'output_dir {out} ({"there" if exists else "to be made"}, writable)'


def _check_runs(runs: Sequence[Tuple[EvalSetup, str, str]],
                partitioner) -> None:
  """Each run's folder (one per run: two runs in one folder, or in a
  folder of another's, would mix their records), output cache and batch
  on the mesh, and that the setups share one baseline (else an InputError
  naming what differs)."""
  if not runs:
    raise checks.InputError('runs must hold at least one (setup, '
                            'output_dir, config_str).')
  places = []
  for run in runs:
    if not isinstance(run, (tuple, list)) or len(run) != 3:
      raise checks.InputError('runs must be (setup, output_dir, config_str) '
                              f'triples, got {checks.said(run)} in them.')
    setup, out, config_str = run
    checks.check_type('setup', setup, EvalSetup, 'an EvalSetup')
    checks.check_type('config_str', config_str, str, "gin's text (or '')")
    bucket_folder.check_folder('output_dir', out)
    _check_output_cache(setup, partitioner)
    _check_mesh_batch(setup, partitioner)
    place = bucket_folder.place(out)
    for other, where in places:
      if place == other or place.startswith(other + '/') or (
          other.startswith(place + '/')):
        raise checks.InputError(
            f'output_dir {out!r} is {where!r} or in it (or holds it): each '
            "run writes a folder of its own, or their records would mix.")
    places.append((place, out))
  ours = runs[0][0].baseline_fields()
  for other, out, _ in runs[1:]:
    theirs = other.baseline_fields()
    if theirs != ours:
      raise checks.InputError(
          f'{out}: its setup does not share the baseline of {runs[0][1]} ('
          + ', '.join(f'{k}: {ours.get(k)!r} vs {theirs.get(k)!r}'
                      for k in sorted(set(ours) | set(theirs))
                      if ours.get(k) != theirs.get(k)) + ').')


def evaluate_together(runs: Sequence[Tuple[EvalSetup, str, str]], *,
                      timing_repeats: int = 1, partitioner=None,
                      shard_drafter: bool = False,
                      if_settings_differ: str = 'refuse',
                      cache: Optional[loading.LoadCache] = None,
                      sync_every_s: float = 60.0
                      ) -> List[Dict[str, Any]]:
  """`evaluate` for setups that share a baseline: each unit's baseline
  decoded once, timed alternately with every setup's speculative decode
  (`unit_loop.Lane`: N drafters cost N + 1 decodes a unit).

  Args:
    runs: (setup, output_dir, config_str) per setup; every setup has the
      same `EvalSetup.baseline_fields` (they differ in their drafting).
      Several runs share the target's arrays (a `loading.LoadCache`), on
      one device or the partitioner's mesh.
    timing_repeats, partitioner, shard_drafter, if_settings_differ, cache,
      sync_every_s: as `evaluate`'s, for every run.

  Returns:
    The summaries (`evaluate`'s), one per run.

  Raises:
    ValueError: the setups do not share a baseline.
  """
  checks.check_int('timing_repeats', timing_repeats)
  bucket_folder.check_interval(sync_every_s)
  run_folder.check_if_settings_differ(if_settings_differ)
  checks.check_type('partitioner', partitioner, (partitioning.Partitioner,
                                                 type(None)),
                    'a partitioning.Partitioner or None')
  checks.check_type('cache', cache, (loading.LoadCache, type(None)),
                    'a loading.LoadCache or None')
  task = preflight(runs, partitioner)[0]
  setup = runs[0][0]
  if len(runs) > 1:
    cache = loading.LoadCache() if cache is None else cache  # one target
  examples = loading.read_examples(setup, task, setup.data.num_examples, cache)
  fingerprints = run_folder.same_examples(examples)  # every process's
  # Process 0 claims, then the others read (its error is theirs too),
  # each checking that it reads the folder process 0 claimed.
  token = run_folder.claim_token()
  folders = []
  try:
    run_folder.process_0_first(lambda: folders.extend(_Run(
        *run, task, fingerprints, partitioner, shard_drafter,
        if_settings_differ, sync_every_s, token) for run in runs))
    run_folder.barrier('read')  # Nobody appends before.
    # Where process 0 alone writes (one mesh spanning the processes), its
    # output cache is recovered before the others read it.
    lanes = run_folder.process_0_first(
        lambda: [folder.open() for folder in folders])
  except BaseException:
    for folder in folders:  # a bucket's local copies
      folder.close()
    raise
  # The job's other processes on this machine: their CPU is not other work
  # beside the timings (`measure.OtherLoad`).
  peers = run_folder.job_processes_here()
  error = None
  try:
    with run_folder.sigterm_interrupts(), measure.job_processes(peers), \
        contextlib.ExitStack() as files:
      for folder in folders:
        folder.begin()

      def load_all():
        for folder, lane in zip(folders, lanes):
          lane.loaded = load(folder.loading_setup(), task, partitioner,
                             shard_drafter, cache)
      run_folder.every_process(load_all)  # one failing: said to all
      sinks = [folder.sink(files) for folder in folders]
      for unit in unit_loop.decode_units(lanes, examples, timing_repeats,
                                         folders[0].share, partitioner):
        for folder, lane, sink, batch in zip(folders, lanes, sinks, unit):
          folder.append(sink, batch, lane)
        run_folder.check_interrupted()
      for folder in folders:
        folder.sync()
      run_folder.barrier('done')
  except BaseException as e:  # keep what finished, say why, re-raise
    error = e
    raise
  finally:
    summaries = [folder.finish(error) for folder in folders]
    if isinstance(error, KeyboardInterrupt) and jax.process_index() == 0:
      _say(runs, summaries)  # where each stands
  # Every process returns (and acts on) the job's summaries, process 0's.
  summaries = partitioning.agree(summaries)
  _say(runs, summaries)
  for summary in summaries:
    if summary.get('mismatches'):
      raise MismatchError(summary['status'])
  return summaries


def load(setup: EvalSetup, task=None, partitioner=None,
         shard_drafter: bool = False,
         cache: Optional[loading.LoadCache] = None) -> loading.Loaded:
  """The setup built as the job builds it: on the partitioner's mesh, if
  any (`evaluate`'s arguments; `task`: None loads it)."""
  shardings = draft_shardings = None
  if partitioner is not None:  # The models are placed straight into them.
    shardings = partitioner.param_shardings(
        network.T5Model(setup.decoding_config))
    if setup.draft.drafter_kind.needs_model:  # placed as `shard_loaded` does
      draft_shardings = partitioner.param_shardings(
          network.T5Model(setup.draft.decoding_config),
          _draft_rules(shard_drafter and _sharded_drafter(setup)))
  loaded = loading.build(setup, task=task, target_shardings=shardings,
                         cache=cache, draft_shardings=draft_shardings)
  if partitioner is not None:
    loaded = shard_loaded(loaded, partitioner, shard_drafter)
  return loaded


def _sharded_drafter(setup: EvalSetup) -> bool:
  """Whether the setup's draft model is placed by the partitioner's rules
  (a `drafters.T5Drafter`, the 't5' kind); any other drafter's own params
  are replicated on every device (`shard_loaded`)."""
  return setup.draft.drafter_kind is drafters.KINDS['t5']


def _draft_rules(shard_drafter: bool):
  """A draft model's rules: the target's (None: the partitioner's) or
  data-parallel ones (its weights replicated on every device)."""
  return None if shard_drafter else partitioning.data_parallel_rules()


def shard_loaded(loaded: loading.Loaded, partitioner, shard_drafter: bool
                 ) -> loading.Loaded:
  """`loaded` with its target (and model drafter) on the partitioner's mesh.

  The target is wrapped (`partitioning.ShardedModel`) and its params placed
  by the rules; a `drafters.T5Drafter`'s model is wrapped with the same
  rules (`shard_drafter`) or data-parallel ones (replicated weights); any
  other drafter's params are replicated, but the target's own params that
  the merged kinds hold (PaSS, heads, trees): those are the target's
  sharded arrays (`Partitioner.replicate_sharing`), not a copy of the
  target on every device (the output cache's kinds hold none: the loop
  hands them the target's, `interfaces.TargetReader`).
  """
  target = partitioner.sharded_model(loaded.target)
  target_params = partitioner.shard_params(loaded.target_params, target)
  drafter, draft_params = loaded.drafter, loaded.draft_params
  if _sharded_drafter(loaded.setup):
    drafter = dataclasses.replace(drafter, model=partitioner.sharded_model(
        drafter.model, _draft_rules(shard_drafter)))
    draft_params = partitioner.shard_params(draft_params, drafter.model)
  else:
    draft_params = partitioner.replicate_sharing(
        draft_params, loaded.target_params, target_params)
  return dataclasses.replace(loaded, target=target,
                             target_params=target_params, drafter=drafter,
                             draft_params=draft_params)


# ---------------------------------------------------------------------------
# Entry point: flags and gin, T5X style.
# ---------------------------------------------------------------------------

def _add_flags(parser) -> None:
  parser.add_argument('--dry_run', action='store_true',
                      help='print the setup, check the output folder, '
                      'checkpoints and task as the job would, and exit')
  add_process_flags(parser)


def add_process_flags(parser) -> None:
  """A multi-process run's flags (`initialize_distributed` reads them)."""
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
  of the batches on its own devices, or (`Partitioner(global_mesh=True)`)
  every batch on one mesh over all (`evaluate`).
  """
  named = (args.coordinator_address, args.num_processes, args.process_id)
  if not args.multiprocess and all(v is None for v in named):
    return False
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
  initialize_distributed(args)  # a dry run checks the job's own mesh
  setup = loading.setup_from_flags(args)
  return args, setup, gin.get_configurable(eval_lib.evaluate)


def main(argv: Optional[Sequence[str]] = None):
  """Parses T5X-style flags and gin files, then runs `evaluate`.

  Returns:
    The summary, or with --dry_run the `EvalSetup`.
  """
  return _run(*configured(sys.argv[1:] if argv is None else argv))


def _run(args, setup: loading.EvalSetup, run):
  """`main`'s second half: the configured job run (or described)."""
  import gin  # pylint: disable=g-import-not-at-top

  if args.dry_run:  # and what the job checks before its first example
    print(setup.describe())
    for line in run(setup=setup, config_str=gin.config_str(),
                    dry_run=True)['checked']:
      print(f'checked: {line}')
    return setup
  return run(setup=setup, config_str=gin.config_str())


def cli(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """`main` as the command line runs it: a flag, gin binding or setup
  value the job refuses before it starts (`configured`: gamma < 1, a
  negative temperature, lengths, an unknown kind, ...) or as it runs (an
  `InputError`: an unknown task, an input longer than the model takes, a
  gamma above what the drafter drafts), a file it cannot find or a
  damaged checkpoint, a run folder that cannot be resumed as it
  is (other settings, other examples, a damaged file) or a damaged output
  cache ends the job with its one-line error (exit status 1), not a
  traceback; what finished is written first (the summary says why it
  stopped). Ctrl-C or SIGTERM ends it with the status lines of its runs
  (interrupted, what is left) and the signal's exit status (130 / 143),
  not a traceback. Everything else propagates (`exits_at_once`)."""
  with exits_at_once(), run_folder.stops_in_one_line(lambda _: None):
    try:
      with checks.one_line(ValueError):  # the job's configuration
        job = configured(sys.argv[1:] if argv is None else argv)
      with checks.one_line(*checks.REFUSED):  # found as it runs
        return _run(*job)
    except (run_folder.RunFolderError, output_cache.OutputCacheError) as e:
      raise SystemExit(f'error: {e.message}') from None


@contextlib.contextmanager
def exits_at_once():
  """A command across processes (`jax.distributed`) that fails ends this
  process at once, its error printed (exit status 1): not at exit, where
  jax.distributed's shutdown barrier would wait for a peer that died
  (until its heartbeat times out, then aborting). What the job finished is
  written before (its records are flushed per unit, its summary in a
  `finally`). In one process, or a SystemExit (an error every process
  says alike), the exception propagates. (A collective that waits on a
  dead peer instead of failing is ended by jax's heartbeat: an abort.)"""
  try:
    yield
  except Exception:  # pylint: disable=broad-except
    if jax.process_count() == 1:
      raise
    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access


if __name__ == '__main__':
  checks.run_main(cli)
