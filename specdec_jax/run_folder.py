"""The eval job's run folder: what it keeps between units, and how.

One run of `eval.evaluate` owns one folder (EVAL_OUTPUT_DIR):

  run.json         the run's identity (`identity`): every setting that can
                   change a record; a rerun resumes only when its identity
                   is the same (`claim`), else it is refused with the
                   changed settings named (or, asked to, the old run is
                   moved aside and a fresh one starts);
  examples.jsonl   one record per example, appended as units finish (and
                   examples.process-p-of-P.jsonl per process of a
                   multi-process run, merged by process 0: `merge`);
  run.lock         held (an fcntl lock) by the job writing the folder,
                   released when its process ends, however it ends: a
                   second job started on the folder meanwhile is refused
                   (`claim`) rather than decode every example again
                   beside it (a folder at a gs:// address is written in
                   each job's own local copy and held by a lease in the
                   bucket: bucket_folder.py);
  gamma_choice.json  the gamma chosen for the batch (`choice_file`);
  the output cache of the 'cache' / 'combined' drafters (its own file, or
                   output_cache.npz here), committed with the records of
                   the unit that grew it (`CacheCommit`).

Crash consistency: every write is whole or absent (`write_atomic`: a temp
file renamed; `append`: flushed and fsync'd, a cut-off last line dropped
on resume), and the state that outlives a unit changes only with that
unit's records: the output cache is staged beside its file before the
records are appended and put in place after, so a crash between any two
writes resumes to the records, counters and cache of an uninterrupted run
(tests/test_eval.py injects a failure after each write; `after_write` is
where).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import pathlib
import secrets
import signal
import socket
import threading
import time
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple)

import jax
from jax.experimental import multihost_utils
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import loading
from specdec_jax import output_cache
from specdec_jax import partitioning
from specdec_jax import shipped
from specdec_jax import tasks
from specdec_jax.drafters.tree import shape as tree_shape

RECORDS = 'examples.jsonl'
RUN = 'run.json'
LOCK = 'run.lock'
FORMAT = 'specdec_jax.eval_run/2'

# `EvalSetup` fields a rerun may change and still resume: everything else
# in the setup is part of the identity (a field added later is compared
# without anyone listing it).
FREE_FIELDS = {
    'num_examples': 'how many examples: a rerun may ask for more (only the '
                    'new ones are decoded) or fewer',
}

# `evaluate`'s parameters: part of the identity, or free to change.
EVALUATE_PARAMETERS = {
    'setup': 'identity (every field but FREE_FIELDS)',
    'partitioner': 'identity (the mesh and its rules)',
    'shard_drafter': 'identity (how the drafter is placed on the mesh)',
    'timing_repeats': 'free: timing only (how many timed decodes a median '
                      'takes)',
    'output_dir': 'free: the folder itself',
    'config_str': 'free: the gin text saved as config.gin (the settings it '
                  'makes are the identity)',
    'if_settings_differ': 'free: what a rerun does when the identity '
                          'differs',
    'cache': 'free: where the setup\'s models and examples come from (the '
             'same ones, loaded by an earlier job of the process)',
    'sync_every_s': 'free: how often new records are copied to a gs:// '
                    'output_dir',
    'dry_run': 'free: a dry run writes no run',
}

# What a rerun with another identity does (`claim`).
IF_SETTINGS_DIFFER = ('refuse', 'restart')


def check_if_settings_differ(value: str) -> None:
  """Raises InputError unless `value` is one of `IF_SETTINGS_DIFFER`."""
  if value not in IF_SETTINGS_DIFFER:
    raise checks.InputError(f'if_settings_differ must be one of '
                            f'{IF_SETTINGS_DIFFER}, got {value!r}.')


# What to do about a damaged file of the run folder: the advice every
# `RunFolderError` about one ends with.
RESTART = ('--gin.evaluate.if_settings_differ="\'restart\'" (the old run '
           'moved aside)')


class RunFolderError(ValueError):
  """The run folder cannot be resumed as it is: a run with other settings,
  records of other examples, or a damaged file.

  Attributes:
    message: one line that names the folder or file, what is wrong and
      what to do (also the exception's text, before anything a caller
      appends to it: gin's "In call to configurable ...").
  """

  def __init__(self, message: str):
    super().__init__(message)
    self.message = message


def damaged(path, problem: str, remedy: str) -> RunFolderError:
  """The one-line error about a damaged file of the run folder."""
  return RunFolderError(f'{path}: {problem}. {remedy}')


def _json_problem(path: pathlib.Path, what: str, kind: type = dict
                  ) -> Tuple[Any, Optional[str]]:
  """(the JSON value of a file the job reads back, None), or (None, what
  is wrong with it: empty, cut off, not JSON, or not a `kind`)."""
  try:
    text = pathlib.Path(path).read_text()
  except (OSError, UnicodeDecodeError) as e:
    return None, f'unreadable ({type(e).__name__}: {e})'
  if not text.strip():
    return None, f'empty, where {what} should be'
  try:
    value = json.loads(text)
  except ValueError as e:
    return None, (f'not JSON ({e}; cut off or overwritten?), where {what} '
                  'should be')
  if not isinstance(value, kind):
    return None, (f'holds a JSON {type(value).__name__}, not the '
                  f'{"object" if kind is dict else kind.__name__} of {what}')
  return value, None


def read_json(path: pathlib.Path, what: str, remedy: str,
              kind: type = dict) -> Any:
  """A JSON file the job reads back, or the one-line error naming it.

  Args:
    path: the file.
    what: what it should hold ('the run's identity', ...), for the error.
    remedy: what to do when it is damaged (a sentence).
    kind: the JSON type it must hold (dict: an object).

  Raises:
    RunFolderError: the file is empty, cut off, not JSON, or not a `kind`.
  """
  value, problem = _json_problem(path, what, kind)
  if problem:
    raise damaged(path, problem, remedy)
  return value


# -- Writes ---------------------------------------------------------------

# Called with a label after every write of the run folder (and of the
# output cache): a file written, renamed or removed, or an earlier run moved
# aside. A folder kept in a bucket is copied up here (bucket_folder.py);
# tests inject failures here to crash between any two writes.
after_write: List[Callable[[str], None]] = []


def _wrote(label: str) -> None:
  for hook in after_write:
    hook(label)


def write_atomic(path: pathlib.Path, text: str) -> None:
  """Writes a whole file or nothing, durably (`checkpoints.write_bytes`)."""
  checkpoints.write_bytes(str(path), text.encode())
  _wrote(pathlib.Path(path).name)


def append(sink, records: Sequence[Dict[str, Any]]) -> None:
  """Appends records durably: once this returns they survive a crash."""
  sink.write(''.join(json.dumps(r) + '\n' for r in records))
  sink.flush()
  os.fsync(sink.fileno())
  _wrote(pathlib.Path(sink.name).name)


# -- Identity -------------------------------------------------------------


def _jsonable(value: Any) -> Any:
  """A setting as JSON: dataclasses (a `T5Config`) as their fields,
  mappings sorted, tuples as lists, dtypes and other types by name."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {f.name: _jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)}
  if isinstance(value, Mapping):
    return {str(k): _jsonable(v) for k, v in sorted(value.items(),
                                                     key=lambda kv: str(kv[0]))}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, np.generic):
    return value.item()
  try:
    return np.dtype(value).name
  except TypeError:
    return repr(value)


def _checkpoint_content(checkpoint: Optional[str]) -> Optional[str]:
  """`checkpoints.manifest.fingerprint` of a checkpoint setting (None:
  random weights, or a path that does not exist: the loader says so)."""
  if checkpoint is None:
    return None
  path = str(checkpoint)
  if path.startswith(shipped.SCHEME):
    # The folder only: its files are checked once, when it loads.
    try:
      path = shipped.checkpoint_path(path[len(shipped.SCHEME):].strip('/'))
    except (KeyError, ValueError):
      return None
  return checkpoints.manifest.fingerprint(path)


def _mesh(partitioner, shard_drafter: bool) -> Optional[Dict[str, Any]]:
  if partitioner is None:
    return None
  return {'axes': {k: int(v) for k, v in partitioner.mesh.shape.items()},
          'rules': _jsonable(partitioner.rules),
          'shard_drafter': bool(shard_drafter)}


def data_content(setup: loading.EvalSetup, task) -> Dict[str, Any]:
  """The content of the files of `task` that decide a record's tokens
  (`tasks.source_files`), by label: its vocabulary, and the train split
  where the drafter is built from it or seeds its output cache from it.
  The examples decoded are checked one by one (`example_fingerprint`)."""
  kind = setup.draft.drafter_kind
  reads_train = kind.data_only or kind.uses_cache
  files = tasks.source_files(task, setup.data.data_dir,
                             ['train'] if reads_train else [])
  return {label: checkpoints.manifest.file_fingerprint(path)
          for label, path in sorted(files.items())}


def identity(setup: loading.EvalSetup, partitioner=None,
             shard_drafter: bool = False, task=None) -> Dict[str, Any]:
  """Every setting that can change a record of the run, as JSON.

  Every field of `setup` but `FREE_FIELDS`, by its flat name
  (`EvalSetup.flat`: a run from before the drafter and batching were
  grouped resumes); the content of
  both checkpoints (`checkpoints.manifest.fingerprint`: the manifest's
  checksums where one covers the folder, else the files' names and sizes
  and their small files' content); the mesh; the device the decodes are
  timed on (a record's times are a setting's too); with `task`, the
  content of its files that decide the tokens (`data_content`: the
  vocabulary, a train split a drafter reads). Which examples were decoded
  is checked per record (`example_fingerprint`).
  """
  settings = {name: _jsonable(value) for name, value in setup.flat().items()
              if name not in FREE_FIELDS}
  settings['target_checkpoint_content'] = _checkpoint_content(
      setup.target_checkpoint)
  settings['draft_checkpoint_content'] = _checkpoint_content(
      setup.draft.checkpoint)
  if task is not None:
    settings['data_content'] = data_content(setup, task)
  settings['mesh'] = _mesh(partitioner, shard_drafter)
  device = jax.devices()[0]
  settings['device'] = {'platform': device.platform,
                        'kind': device.device_kind}
  return settings


def example_fingerprint(ids, input_text: str, target_text: str) -> str:
  """A short id of an example as decoded (its input ids and texts)."""
  h = hashlib.sha256(np.asarray(ids, np.int64).tobytes())
  h.update(b'\0' + input_text.encode() + b'\0' + target_text.encode())
  return h.hexdigest()[:16]


def same_examples(examples: Sequence[Tuple[Any, ...]]) -> Dict[int, str]:
  """Index -> `example_fingerprint` of `examples` ((index, ids, input
  text, target text) each), what a run's records are checked against. In
  a `jax.distributed` run, raises `RunFolderError` on every process alike
  unless every process read the same ones (their digest, gathered with
  `partitioning.gather`, so none is left waiting): a host with another
  data_dir or dataset version would decode other examples under the same
  indices into the one run."""
  fingerprints = {i: example_fingerprint(*e) for i, *e in examples}
  if jax.process_count() == 1:
    return fingerprints
  digest = hashlib.sha256(' '.join(
      f'{i}:{f}' for i, f in sorted(fingerprints.items())).encode())
  digests = partitioning.gather(digest.hexdigest())
  differ = [p for p, d in enumerate(digests) if d != digests[0]]
  if differ:
    raise RunFolderError(
        f'process {differ[0]} of {len(digests)} read other examples than '
        f'process 0 ({len(differ)} process(es) differ): every process must '
        'read the same data (DataSpec.data_dir, $SPECDEC_DATA_DIR, the '
        'dataset version).')
  return fingerprints


def _changed_examples(records: Sequence[Dict[str, Any]],
                     examples: Mapping[int, str]) -> List[int]:
  """Indices whose record was decoded from another example than
  `examples` (index -> `example_fingerprint`) holds now."""
  return sorted(r['index'] for r in records
                if r['index'] in examples and
                r.get('example') != examples[r['index']])


def changes(previous: Mapping[str, Any], now: Mapping[str, Any],
             prefix: str = '') -> List[str]:
  """'name: old -> new' per differing setting; nested settings (a model's
  config) by their dotted name."""
  missing = '(not set)'
  lines = []
  for key in sorted(set(previous) | set(now)):
    old, new = previous.get(key, missing), now.get(key, missing)
    if isinstance(old, dict) and isinstance(new, dict):
      lines += changes(old, new, f'{prefix}{key}.')
    elif old != new:
      lines.append(f'{prefix}{key}: {json.dumps(old)} -> {json.dumps(new)}')
  return lines


def _move_aside(out: pathlib.Path) -> pathlib.Path:
  """Moves every file of an earlier run into out/replaced-<UTC time>/."""
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime(
      '%Y%m%dT%H%M%S.%fZ')
  aside = out / f'replaced-{stamp}'
  aside.mkdir()
  for path in out.iterdir():
    if path != aside and not path.name.startswith('replaced-') and (
        path.name != LOCK):  # held by this job
      path.rename(aside / path.name)
  _wrote('earlier run moved aside')
  return aside


# The run folders this process holds (`hold`): their open lock files.
_HELD: Dict[pathlib.Path, Any] = {}


def hold(out: pathlib.Path) -> None:
  """Takes the run folder `out` for this process until `release` (or its
  end): an fcntl lock on out/run.lock (kept by the kernel, not left behind
  by a job killed; NFS with its lock service locks it too), which names
  the job holding it. A disk that takes no locks (NFS without it) runs
  the job unlocked, with a warning.

  Raises:
    RunFolderError: another process holds it.
  """
  key = out.resolve()
  if key in _HELD:
    return
  out.mkdir(parents=True, exist_ok=True)
  lock = open(out / LOCK, 'a+')  # pylint: disable=consider-using-with
  try:
    fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EAGAIN, errno.EACCES):  # a disk without locks
      logging.warning('%s: not locked (%s); run one job in it at a time.',
                      out, e)
      lock.close()
      return
    lock.seek(0)
    holder = lock.read().strip() or 'another process'
    lock.close()
    raise RunFolderError(
        f'{out}: another job is writing this run folder now ({holder}; '
        f'{out / LOCK} is held). Wait for it to end (a rerun then resumes '
        'what it finished), or give another EVAL_OUTPUT_DIR.') from None
  started = datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds')
  lock.truncate(0)
  lock.write(f'started {started} on {socket.gethostname()} '
             f'(pid {os.getpid()})\n')
  lock.flush()
  _HELD[key] = lock


def release(out: pathlib.Path) -> None:
  """Lets go of a run folder this process holds (`hold`)."""
  lock = _HELD.pop(out.resolve(), None)
  if lock is not None:
    lock.close()  # the lock goes with the file


def claim_token() -> Optional[str]:
  """In a `jax.distributed` run, a word of process 0's, the same on every
  process (`partitioning.agree`; every process must call it), that `claim`
  writes into the run folder on process 0 and the others read back; None
  in a run of one process."""
  if jax.process_count() == 1:
    return None
  return partitioning.agree(secrets.token_hex(8))


def claim(out: pathlib.Path, settings: Dict[str, Any], config_str: str,
          examples: Mapping[int, str], main_process: bool = True,
          num_examples: Optional[int] = None,
          if_settings_differ: str = 'refuse',
          token: Optional[str] = None,
          held: bool = True) -> List[Dict[str, Any]]:
  """Claims `out` for a run of `settings` (`identity`); returns the
  records of an earlier run with the same identity.

  `examples` (index -> `example_fingerprint`) are the examples this run
  decodes: a record of one of their indices must have been decoded from
  the same example (else the data changed under the same settings).

  Only the main process writes run.json and config.gin and repairs
  examples.jsonl; every process reads the records of all (examples.jsonl
  and the per-process files of an unmerged multi-process run, read-only).
  `token` (`claim_token`; None: not checked): the main process writes it
  into run.json; another process, after it, must read it there, or it
  does not see the main process's folder (each host's own disk) and
  would decode and write beside the run, not in it.

  The main process holds the folder (`hold`) where `held` (the job then
  `release`s it as it ends).

  Raises:
    RunFolderError: another job holds the folder (`hold`); another
      process reads no run.json of `token` (the
      folder is not shared); the folder holds a run with another
      identity (naming each changed setting, old -> new), records of
      other examples under the indices of `examples`, a damaged run.json,
      or a run written before run.json held the whole identity; unless
      `if_settings_differ` is 'restart': then the old run's files are
      moved into out/replaced-<time>/ and the run starts afresh, as they
      are where a run of other settings finished no example (a run that
      failed before its first, on a value it refused: the rerun that
      corrects it is not refused for that value).
  """
  check_if_settings_differ(if_settings_differ)
  run_file = out / RUN
  if token is not None and not main_process:
    _check_shared(run_file, token)
  if held and main_process:
    hold(out)
  out.mkdir(parents=True, exist_ok=True)
  now = json.loads(json.dumps(settings))
  if run_file.exists():
    previous, damage = _json_problem(run_file, 'the run\'s identity')
    if damage:
      problem = (f'{run_file}: {damage}, so the records in {out} cannot be '
                 'checked against these settings')
    elif previous.get('format') != FORMAT:
      problem = (f'{out} holds a run written before {RUN} recorded every '
                 'setting that shapes a record, so its records cannot be '
                 'checked against these settings')
    else:
      differ = changes(previous.get('identity', {}), now)
      problem = differ and (f'{out} holds a run with other settings ('
                            + '; '.join(differ) + ')')
      if problem and if_settings_differ != 'restart' and not _finished_any(
          out):  # nothing finished to keep apart
        if_settings_differ, problem = 'restart', problem + (
            ' and no finished example')
      changed = [] if problem else _changed_examples(
          all_records(out, own=None), examples)
      if changed:
        shown = ', '.join(map(str, changed[:10])) + (
            ', ...' if len(changed) > 10 else '')
        problem = (f'{out} holds records of other examples under the same '
                   f'indices ({len(changed)} of them: {shown}): the data '
                   'changed under the same settings (data_dir, '
                   '$SPECDEC_DATA_DIR or the dataset version)')
    if problem and if_settings_differ == 'restart' and main_process:
      aside = _move_aside(out)
      print(f'{problem}: its files moved to {aside}; starting afresh.',
            flush=True)
    elif problem:
      raise RunFolderError(
          f'{problem}. Use another EVAL_OUTPUT_DIR, delete it, or pass '
          '--gin.evaluate.if_settings_differ="\'restart\'" to move the old '
          'run aside and start afresh.')
  if not main_process:
    return all_records(out, own=None)
  write_atomic(run_file, json.dumps(
      {'format': FORMAT, 'identity': now, 'num_examples': num_examples,
       **({} if token is None else {'claim': token})}, indent=1))
  if config_str:
    write_atomic(out / 'config.gin', config_str)
  return all_records(out, own=out / RECORDS)


def _finished_any(out: pathlib.Path) -> bool:
  """Whether `out` holds a record (a damaged records file counts: it may)."""
  try:
    return bool(all_records(out, own=None))
  except RunFolderError:
    return True


# How long another process looks for the run.json process 0 just wrote
# before it refuses the folder: a shared disk that caches what it lists
# (NFS, gcsfuse) may show it late.
SHARED_WAIT_S = 5.0


def _check_shared(run_file: pathlib.Path, token: str) -> None:
  """Raises `RunFolderError` unless `run_file` is the one the main process
  just wrote (its claim `token`), looked for up to `SHARED_WAIT_S`."""
  deadline = time.monotonic() + SHARED_WAIT_S
  while True:
    try:
      seen = json.loads(run_file.read_text()).get('claim')
    except (OSError, ValueError, AttributeError):
      seen = None
    if seen == token:
      return
    if time.monotonic() >= deadline:
      break
    time.sleep(0.5)
  raise RunFolderError(
      f'{run_file.parent}: process {jax.process_index()} of '
      f'{jax.process_count()} does not see the run folder process 0 '
      f'claimed there ({RUN} ' + (
          'missing' if not run_file.exists() else "another run's") +
      '): each host wrote its own disk. Every process of a '
      'jax.distributed run must write into one folder: give '
      'EVAL_OUTPUT_DIR a path all hosts share or a gs:// bucket.')


# -- Records --------------------------------------------------------------


def process_file(out: pathlib.Path, index: int, count: int) -> pathlib.Path:
  """The records file of process `index` of `count` (examples.jsonl: 1)."""
  if count == 1:
    return out / RECORDS
  return out / f'examples.process-{index:05d}-of-{count:05d}.jsonl'


def choice_file(out: pathlib.Path, index: int, count: int) -> pathlib.Path:
  """Where process `index` of `count` keeps its gamma choice."""
  if count == 1:
    return out / 'gamma_choice.json'
  return out / f'gamma_choice.process-{index:05d}-of-{count:05d}.json'


def write_choice(path: Optional[pathlib.Path], choice: Dict[str, Any]
                 ) -> None:
  """Keeps a gamma (or tree) choice in `path` (`choice_file`; None: not
  kept), whole or not at all (`read_choice` reads it back)."""
  if path is not None:
    write_atomic(path, json.dumps(choice, indent=1))


def read_choice(path: pathlib.Path) -> Dict[str, Any]:
  """A gamma choice written by `unit_loop.choose_gamma` (`choice_file`).

  Raises:
    RunFolderError: the file is damaged (naming it and what to do).
  """
  remedy = ('Delete it (gamma is chosen again from a profile measured '
            'anew; each record keeps the gamma it was decoded with), or '
            f'pass {RESTART}.')
  choice = read_json(path, 'a gamma choice', remedy)
  gamma = choice.get('gamma')
  if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 0:
    raise damaged(path, f'a gamma choice whose gamma is {gamma!r}, not an '
                  'integer >= 0', remedy)
  if not isinstance(choice.get('rule'), str):
    raise damaged(path, 'a gamma choice without its rule', remedy)
  if 'tree' in choice:  # a tree chosen (`unit_loop.choose_tree`)
    try:
      tree_shape.parse(choice['tree'])
    except ValueError as e:
      raise damaged(path, f'a tree choice whose tree is no tree ({e})',
                    remedy) from e
  return choice


def all_records(out: pathlib.Path, own: Optional[pathlib.Path]
                ) -> List[Dict[str, Any]]:
  """Records of examples.jsonl and every per-process file, deduplicated.

  Only `own` (this process's file) is repaired; the others are read as they
  are. The first record of an index counts.
  """
  records, seen = [], set()
  for path in [out / RECORDS] + sorted(out.glob('examples.process-*.jsonl')):
    for r in read_records(path, repair=path == own):
      if r['index'] not in seen:
        seen.add(r['index'])
        records.append(r)
  return records


def merge(out: pathlib.Path) -> List[Dict[str, Any]]:
  """Process 0, once every process is done: one examples.jsonl.

  Writes the union of examples.jsonl and the per-process files (each index
  once) atomically, then deletes the per-process files; a crash in between
  leaves both, and the next run's reading dedupes them again.
  """
  records = sorted(all_records(out, own=None), key=lambda r: r['index'])
  write_atomic(out / RECORDS,
               ''.join(json.dumps(r) + '\n' for r in records))
  for path in out.glob('examples.process-*.jsonl'):
    path.unlink()
  _wrote('per-process records removed')
  return records


# The fields every record has (`unit_loop.decode_units` writes them; the
# summary reads them): a line without them is not a record of this job.
RECORD_FIELDS = frozenset({
    'index', 'batch', 'example', 'input', 'target', 'baseline',
    'speculative', 'baseline_length', 'speculative_length', 'identical',
    'iterations', 'drafted', 'accepted', 'beta_sum', 'beta_count',
    'baseline_batch_s', 'speculative_batch_s'})


def _record_problem(record: Any) -> Optional[str]:
  """Why a parsed line is not a record of this job (None: it is one)."""
  if not isinstance(record, dict):
    return f'a JSON {type(record).__name__}, not a record object'
  missing = sorted(RECORD_FIELDS - set(record))
  if missing:
    return 'a record without ' + ', '.join(missing)
  if not isinstance(record['index'], int) or isinstance(record['index'],
                                                        bool):
    return f'a record whose index is {record["index"]!r}, not an integer'
  return None


def read_records(path: pathlib.Path, repair: bool = True
                 ) -> List[Dict[str, Any]]:
  """The records of examples.jsonl, repaired for resuming.

  With `repair=False` the file is only read (a cut-off last line is skipped
  in memory): another process may own it.

  A last line cut off by a crash mid-write is dropped (its example is
  decoded again); a record whose index is already there is dropped (the
  first one counts). If anything was dropped the file is rewritten, so the
  next append starts on a clean line. Anything else is damage, not a torn
  write: a line before the last that is not JSON, any line that is JSON but
  not a record (`RECORD_FIELDS`), a file that is not text.

  Raises:
    RunFolderError: naming the file, the line and what to do.
  """
  if not path.exists():
    return []
  remedy = ('Delete that line (its example is decoded again) or the file, '
            f'or pass {RESTART}.')
  try:
    lines = path.read_text().split('\n')
  except (OSError, UnicodeDecodeError) as e:
    raise damaged(path, f'not a text file of records ({type(e).__name__})',
                  f'Delete it, or pass {RESTART}.') from None
  records, seen, repaired = [], set(), False
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError:
      if any(l.strip() for l in lines[number:]):
        raise damaged(f'{path}, line {number}', 'not a JSON record (and not '
                      'the last line, so not a write cut off by a crash)',
                      remedy) from None
      if repair:
        logging.warning('%s: dropped a cut-off last line (%d characters); '
                        'its example is decoded again.', path, len(line))
      repaired = True
      continue
    problem = _record_problem(record)
    if problem:
      raise damaged(f'{path}, line {number}', problem, remedy)
    if record['index'] in seen:
      repaired = True
      continue
    seen.add(record['index'])
    records.append(record)
  if repair and (repaired or (lines[-1] and records)):
    write_atomic(path, ''.join(json.dumps(r) + '\n' for r in records))
  return records


# -- The output cache, committed with the records -------------------------


@dataclasses.dataclass(frozen=True)
class CacheCommit:
  """Two-phase commit of an output cache file with a unit's records.

  Per unit: `stage` writes the grown cache beside its file
  (<file>.pending) and then an intent (out/output_cache.pending.json: the
  file and the unit's indices); the records are appended (the commit
  point); `finish` renames the staged cache over the file (at a gs://
  address: uploads it there and deletes the staged one, `_move`) and
  deletes the intent. `recover`, before the cache is loaded on resume,
  rolls a staged cache forward where every index of its unit has a
  record (the crash came after the commit point) and discards it
  otherwise (the unit is decoded again from the cache as it was, as an
  uninterrupted run decoded it).
  """
  out: pathlib.Path
  cache_path: str
  process: str = ''  # '' alone; '.process-p-of-P' in a multi-process run

  @property
  def staged(self) -> str:
    return self.cache_path + '.pending'

  @property
  def intent(self) -> pathlib.Path:
    return self.out / f'output_cache{self.process}.pending.json'

  def stage(self, store, indices: Sequence[int]) -> None:
    store.save(self.staged)
    _wrote('output cache staged')
    write_atomic(self.intent, json.dumps(
        {'cache': self.cache_path, 'staged': self.staged,
         'indices': [int(i) for i in indices]}))

  def finish(self) -> None:
    _move(self.staged, self.cache_path)
    _wrote('output cache committed')
    self.intent.unlink()
    _wrote('output cache intent removed')

  @staticmethod
  def _remedy(other) -> str:
    """What to do when a file of a commit cut short is damaged: delete it
    and `other`, the commit's other file."""
    return (f'Delete it and {other} (the cache then misses the outputs of '
            f'the unit it was committing), or pass {RESTART}.')

  def recover(self, recorded: set) -> Optional[str]:
    """Completes or undoes a commit cut short; says which (None: none)."""
    if not self.intent.exists():
      if checkpoints.isfile(self.staged):  # no intent: never committed
        checkpoints.delete(self.staged)
        _wrote('output cache discarded')
        return 'discarded'
      return None
    remedy = self._remedy(self.staged)
    intent = read_json(self.intent, 'the intent of an output cache commit',
                       remedy)
    indices = intent.get('indices')
    if not isinstance(indices, list) or not all(
        isinstance(i, int) for i in indices):
      raise damaged(self.intent, 'an output cache commit without the '
                    'indices of its unit', remedy)
    if set(indices) <= recorded:
      if checkpoints.isfile(self.staged):
        try:  # Only a whole cache replaces the committed one.
          output_cache.OutputCache.load(self.staged)
        except output_cache.OutputCacheError as e:
          raise damaged(self.staged, 'a staged output cache that '
                        + e.problem, self._remedy(self.intent)) from None
        _move(self.staged, self.cache_path)
        _wrote('output cache committed')
      done = 'rolled forward'
    else:
      if checkpoints.isfile(self.staged):
        checkpoints.delete(self.staged)
        _wrote('output cache discarded')
      done = 'discarded'
    self.intent.unlink()
    _wrote('output cache intent removed')
    return done


def _move(source: str, dest: str) -> None:
  """Puts the file `source` in place of `dest`, whole: a rename where both
  are local; at gs:// addresses (an object store renames nothing) an
  upload of `dest`, atomic, then `source` deleted (a crash between the
  two leaves the staged cache, which `CacheCommit.recover` moves again)."""
  if not checkpoints.is_gcs(dest):
    os.replace(source, dest)
    return
  checkpoints.write_bytes(dest, checkpoints.read_bytes(source))
  checkpoints.delete(source)


# -- Signals and barriers -------------------------------------------------


def barrier(name: str) -> None:
  """All processes of a `jax.distributed` run wait here (no-op alone).

  `multihost_utils.sync_global_devices`, as T5X syncs its hosts: a tiny
  collective over every device. A process that dies before it does not
  leave the others waiting for ever: jax.distributed's coordination service
  misses its heartbeats and ends the run.
  """
  if jax.process_count() == 1:
    return
  multihost_utils.sync_global_devices(f'specdec_eval_{name}')


def _said(error: Exception) -> str:
  """An error as one process says it to the others."""
  if isinstance(error, (RunFolderError, output_cache.OutputCacheError)):
    return error.message
  return f'{type(error).__name__}: {error}'


def every_process(step: Callable[[], Any]) -> Any:
  """`step()` on every process of a `jax.distributed` run, then each
  one's word on it (`partitioning.gather`): a process whose step failed
  raises its error, the others a `RunFolderError` naming the first that
  failed and why, so none goes on to wait for it in a later collective;
  alone, `step()`."""
  if jax.process_count() == 1:
    return step()
  made, error = None, None
  try:
    made = step()
  except Exception as e:  # pylint: disable=broad-except
    error = e
  words = partitioning.gather(None if error is None else _said(error))
  if error is not None:
    raise error
  failed = [(p, word) for p, word in enumerate(words) if word is not None]
  if failed:
    raise RunFolderError(f'process {failed[0][0]} of {len(words)} failed: '
                         f'{failed[0][1]}')
  return made


def process_0_first(make: Callable[[], Any]) -> Any:
  """`make()` on process 0 of a `jax.distributed` run, then on the
  others (they read what process 0 writes: the claimed run, a recovered
  output cache). Any error of `make()` on process 0 (a `RunFolderError`,
  an `output_cache.OutputCacheError`, a bucket it cannot copy, ...) is
  said to every process (`partitioning.agree`) and raised there as a
  `RunFolderError` of the same message, and one on another process is
  said to all (`every_process`), so none is left waiting for it; alone,
  `make()`."""
  if jax.process_count() == 1:
    return make()
  if jax.process_index() == 0:
    try:
      made = make()
    except Exception as e:  # pylint: disable=broad-except
      partitioning.agree(_said(e))
      raise
    partitioning.agree(None)
    return every_process(lambda: made)  # the others' word on theirs
  problem = partitioning.agree(None)
  if problem is not None:
    raise RunFolderError(problem)
  return every_process(make)


@functools.lru_cache(maxsize=None)
def job_processes_here() -> Tuple[int, ...]:
  """The pids of the other processes of this `jax.distributed` run on
  this machine (every process must make the first call: a gather of each
  one's host name digest and pid; later calls return it); () in a run of
  one process."""
  if jax.process_count() == 1:
    return ()
  host = int.from_bytes(hashlib.sha256(socket.gethostname().encode()
                                       ).digest()[:4], 'little') >> 1
  table = np.asarray(multihost_utils.process_allgather(
      np.array([host, os.getpid()], np.int32)))
  return tuple(int(pid) for h, pid in table.reshape(-1, 2)
               if h == host and pid != os.getpid())


class Terminated(KeyboardInterrupt):
  """SIGTERM arrived during the job (SIGINT raises KeyboardInterrupt)."""


# The signal that asked the job to stop (0: none), for `check_interrupted`.
_INTERRUPTED = [0]


@contextlib.contextmanager
def sigterm_interrupts():
  """SIGTERM ends the job as Ctrl-C does: finished work written, status
  'interrupted'. (Only the main thread may set signal handlers.)

  Both signals are also remembered: Python raises KeyboardInterrupt at
  whatever bytecode runs next, and where that is a `__del__` or a callback
  the exception is printed and dropped ("Exception ignored in ..."), so a
  Ctrl-C could be lost; `check_interrupted` raises it again at the next
  batch boundary.
  """
  _INTERRUPTED[0] = 0
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    del frame
    _INTERRUPTED[0] = signum
    if signum == signal.SIGTERM:
      raise Terminated('SIGTERM')
    raise KeyboardInterrupt

  previous = {sig: signal.signal(sig, handler)
              for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


def exit_stopped(signal_name: str, line: Optional[str]) -> None:
  """Ends a command that the signal `signal_name` ('SIGINT', 'SIGTERM')
  stopped once what finished was written: prints `line` (where the run
  stands; None: said already), then exits with the status of a process
  that signal killed (128 + its number), not a traceback."""
  if line is not None:
    print(line, flush=True)
  raise SystemExit(128 + signal.Signals[signal_name])


@contextlib.contextmanager
def stops_in_one_line(line: Callable[[str], Optional[str]]):
  """A command that Ctrl-C or SIGTERM (`sigterm_interrupts`) stops ends
  with `line(signal name)` and the signal's exit status (`exit_stopped`)."""
  try:
    with sigterm_interrupts():
      yield
  except KeyboardInterrupt as e:
    name = 'SIGTERM' if isinstance(e, Terminated) else 'SIGINT'
    exit_stopped(name, line(name))


def check_interrupted() -> None:
  """Raises the interrupt of a signal whose exception was swallowed."""
  if _INTERRUPTED[0] == signal.SIGTERM:
    raise Terminated('SIGTERM')
  if _INTERRUPTED[0]:
    raise KeyboardInterrupt
