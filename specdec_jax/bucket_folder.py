"""A run folder at a gs:// address: written in a local copy, copied to the
bucket as it changes.

The eval job writes its folder with file operations that an object store
lacks (files renamed into place, records appended, a run moved aside:
run_folder.py). At a gs:// EVAL_OUTPUT_DIR each process keeps the folder in
a local copy, a temporary folder: `BucketFolder.pull` copies the bucket's
objects into it before the run claims it, and after every write of the run
folder (`run_folder.after_write`) `sync` makes the bucket what the copy is,
the records first, then the files written, then the files removed. One
write of the folder is one change (a file written, renamed or removed, or
the files of a run moved aside), and an upload of GCS is atomic, so the
bucket passes through the states the folder passed through: a process that
dies leaves a bucket a rerun resumes from as it would from the folder (the
output cache committed with the records of its unit, `run_folder.
CacheCommit`).

Records are the one exception. Uploading a growing examples.jsonl whole
after every unit would cost bytes quadratic in the run's length, so a change
of the records files alone waits until `every_s` seconds have passed since
they were last copied; any other change copies them first (they were
written before it). A process killed loses at most those seconds of records
from the bucket, which a rerun decodes again; an ending job (complete,
failed or interrupted) copies everything, and a copy that fails leaves the
local folder in place, named in the error.

In a `jax.distributed` run every process syncs the files it writes; process
0 takes the others' records and choices from the bucket (`pull(others=
True)`) before it merges them.

One job writes a run folder at a time, as a local one's fcntl lock makes
sure (run_folder.hold): the job's main process holds a lease, the object
`run.lease` (`start(hold=True)`), which a thread of its own rewrites every
`LEASE_S` / 4 seconds, each write conditional on the generation it wrote
last (GCS's precondition: no other writer came between). A job that finds
a lease watches it: renewed, its holder is alive and the job is refused;
not renewed for `LEASE_S` (a job killed or preempted: nothing releases it),
it is taken over (no host's clock is compared with another's). A job whose
lease another took over, or that could not renew it for `LEASE_S` / 2 (so
before another may take it), stops copying, keeping what it wrote locally
and naming it; so do the job's other processes once the lease is not the
one their main process named by the job's word (`run_folder.claim_token`).

A training MODEL_DIR at a gs:// address is kept the same way
(training.py, through `kept_here`, as the method scripts' --out_dir):
synced when a save names its step and again once the checkpoint is whole,
so the bucket never holds a checkpoint cut short without the file that
names it. A spec's work folder at a gs:// address
(experiments/sweep.py) leaves each cell's folder to its eval job; the
spec reads a cell's records in a copy (`copied_here`) and writes its
results in a temporary folder copied up as they change (`written_here`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pathlib
import shutil
import socket
import tempfile
import threading
import time
import uuid
from typing import (Any, Callable, Dict, Iterator, List, NamedTuple, Optional,
                    Tuple, Union)

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import run_folder

# A folder a job writes, or a path in it: local, or a gs:// address.
Folder = Union[pathlib.Path, str]
# Files in a folder that is not the run's (an older run moved aside), which
# the job never reads: not copied down.
_NOT_PULLED = 'replaced-'
# The lease of the job writing a gs:// run folder (`_Lease`), and how long
# one not renewed is a live job's.
LEASE = 'run.lease'
LEASE_S = 120.0


def is_bucket(path, name: str = '') -> bool:
  """Whether `path` is a gs:// address (a folder kept here); another URL
  is refused (`checkpoints.is_gcs`), headed by `name`."""
  return checkpoints.is_gcs(path, name)


def join(folder: Folder, *names: str) -> Folder:
  """A path in `folder`: in a gs:// one, an address ('/'-joined: `pathlib`
  would make 'gs://b' 'gs:/b')."""
  if is_bucket(folder):
    return '/'.join((os.fspath(folder).rstrip('/'),) + names)
  return pathlib.Path(folder).expanduser().joinpath(*names)


def check_folder(name: str, path) -> None:
  """Raises InputError when `path`, a folder a job writes into, is neither
  local nor a gs:// address (kept here; `is_bucket`): `pathlib` would
  write 's3://b/x' to a local folder 's3:/b/x'; or when a file stands
  where the local folder would be (`checks.check_no_file_in_the_way`)."""
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
    raise checks.InputError(f'{name} must be a path, got {path!r}.')
  if not is_bucket(path, name):
    checks.check_no_file_in_the_way(name, os.fspath(path))


def place(path) -> str:
  """Where the folder `path` is, one text for one folder: a gs:// address
  without its trailing '/', a local path absolute ('~' expanded)."""
  if is_bucket(path):
    return os.fspath(path).rstrip('/')
  return os.path.abspath(os.path.expanduser(os.fspath(path)))


def _is_records(name: str) -> bool:
  """examples.jsonl or a process's examples.process-p-of-P.jsonl."""
  return '/' not in name and name.startswith('examples') and name.endswith(
      '.jsonl')


def check_interval(every_s) -> None:
  """Raises InputError unless `every_s` (`evaluate.sync_every_s`) is a
  number of seconds >= 0."""
  if not checks.is_number(every_s) or not every_s >= 0:
    raise checks.InputError(
        f'sync_every_s must be a number of seconds >= 0, got {every_s!r}.')


def _stamp(path: pathlib.Path) -> Tuple[int, int, int]:
  """(size, mtime_ns, inode) of a local file: what tells a changed one (a
  file written whole is a new inode, whatever its size and time: a clock
  tick can outlast two writes)."""
  stat = path.stat()
  return stat.st_size, stat.st_mtime_ns, stat.st_ino


class BucketCopyError(RuntimeError):
  """The run folder could not be copied to or from its bucket."""


def _named(lease_id: str) -> str:
  """How a lease's holder names the lease (the job's processes look for
  it: `BucketFolder.start(lease_id=...)`)."""
  return f'lease {lease_id}'


def _holder_of(data: Optional[bytes]) -> str:
  """Who holds a lease, as its object says ('a job': one written by
  hand, or none)."""
  try:
    return str(json.loads(data)['holder'])
  except (ValueError, TypeError, KeyError):
    return 'a job'


class _Lease:
  """The lease of the job writing the run folder `url` (see the module
  docstring): `take`, then `check` before each copy, then `release`."""

  def __init__(self, url: str, lease_id: Optional[str] = None):
    self.url = url
    self.address = f'{url}/{LEASE}'
    self._holder = (f'{socket.gethostname()} (pid {os.getpid()}, '
                    f'{_named(lease_id or uuid.uuid4().hex[:8])})')
    self._generation = None
    self._renewed_at = 0.0  # when a write of it last held (monotonic)
    self._lost = None  # the job that took it over
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew, daemon=True,
                                    name=f'lease of {url}')

  def _text(self) -> bytes:
    return json.dumps({'holder': self._holder, 'renewed': time.time()}
                      ).encode()

  def take(self) -> None:
    """Takes the lease: at once where there is none, else after watching
    it LEASE_S without a renewal (no clock of another host is read).

    Raises:
      run_folder.RunFolderError: its holder renewed it meanwhile.
    """
    seen = None  # (the generation first read, when)
    while True:
      data, generation = checkpoints.read_versioned(self.address)
      if data is not None:
        holder = _holder_of(data)
        if seen is None:
          seen = (generation, time.monotonic())
          logging.warning(
              '%s: held by %s; watching its lease for up to %.0f s: '
              'renewed, this job stops; not renewed (a job that ended '
              'without letting go), this job takes the folder (or delete '
              '%s).', self.url, holder, LEASE_S, self.address)
        elif generation != seen[0]:
          raise run_folder.RunFolderError(
              f'{self.url}: another job is writing this run folder now '
              f'({holder}, which renewed its lease {self.address} within '
              f'{LEASE_S:.0f} s). Wait for it to end (a rerun then resumes '
              'what it finished), or give another EVAL_OUTPUT_DIR.')
        if time.monotonic() - seen[1] < LEASE_S:
          self._stop.wait(LEASE_S / 16)
          continue
      self._generation = checkpoints.write_if(self.address, self._text(),
                                              generation)
      if self._generation is not None:
        break
    self._renewed_at = time.monotonic()
    if data is not None:
      logging.warning('%s: took over the lease of %s, not renewed for '
                      '%.0f s.', self.url, holder, LEASE_S)
    self._thread.start()

  def _renew(self) -> None:
    while not self._stop.wait(LEASE_S / 4):
      try:
        if not self._renewed():
          return
      except Exception as e:  # pylint: disable=broad-except
        # tensorstore's errors, a timeout: `check` stops the job if the
        # lease stays unrenewed.
        logging.warning('%s: the lease was not renewed (%s: %s).',
                        self.url, type(e).__name__, e)

  def _renewed(self) -> bool:
    """Renews the lease once; False where it is another job's now."""
    generation = checkpoints.write_if(self.address, self._text(),
                                      self._generation)
    if generation is None:  # written since this job's last write
      self._lost = 'another job'
      data, current = checkpoints.read_versioned(self.address)
      if data is None or _holder_of(data) != self._holder:
        self._lost = _holder_of(data) if data else 'another job'
        return False
      # A write of this job's own that reported an error had held.
      self._lost, generation = None, current
    self._generation = generation
    self._renewed_at = time.monotonic()
    return True

  def check(self, local: pathlib.Path) -> None:
    """Raises BucketCopyError where another job took the lease over, or
    it went unrenewed for LEASE_S / 2 (so that another may take it in
    LEASE_S: this job stops first)."""
    if self._lost is not None:
      why = (f'another job ({self._lost}) took this run folder over (this '
             f'job had not renewed its lease for {LEASE_S:g} s)')
    elif time.monotonic() - self._renewed_at > LEASE_S / 2:
      why = (f'this job has not renewed its lease for {LEASE_S / 2:g} s (a'
             ' stalled process or network), and another job may take the '
             'folder over')
    else:
      return
    raise BucketCopyError(
        f'{self.url}: {why}: this job copies nothing more, and what it '
        f'wrote is kept at {local}.')

  def release(self) -> None:
    """Stops renewing and removes the lease (if still this job's)."""
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(timeout=LEASE_S / 4)  # a renewal in flight
    if self._generation is not None and self._lost is None:
      try:
        checkpoints.write_if(self.address, None, self._generation)
      except (OSError, ValueError) as e:  # it runs out by itself
        logging.warning('%s: the lease was not removed (%s: %s); another '
                        'job takes it after watching it for %.0f s.',
                        self.url, type(e).__name__, e, LEASE_S)


class BucketFolder:
  """A run folder at `url`, kept in the local folder `local`.

  Attributes:
    url: the gs:// address.
    local: the local copy the job reads and writes.
    every_s: the longest records alone wait before they are copied.
  """

  def __init__(self, url: str, every_s: float = 60.0):
    check_interval(every_s)
    self.url = url.rstrip('/')
    self.every_s = every_s
    self.local = pathlib.Path(tempfile.mkdtemp(prefix='specdec_run_'))
    # What the bucket holds, as far as this process knows: `_stamp` of the
    # local file it was copied from or to.
    self._copied: Dict[str, Tuple[int, int, int]] = {}
    self._ours = set()  # the names this process copied up
    self._records_at = time.monotonic()
    self._failed = False
    self._reads_only = False
    self._lease: Optional[_Lease] = None
    self._watched: Optional[str] = None  # the job's lease, another's

  def __repr__(self) -> str:
    return f'BucketFolder({self.url!r}, local={str(self.local)!r})'

  # -- Copies -------------------------------------------------------------

  def _address(self, name: str) -> str:
    return f'{self.url}/{name}'

  def _scan(self) -> Dict[str, Tuple[int, int, int]]:
    """`_stamp` of each file of the local copy, by its name relative to
    it (a file being written, '<name>.tmp-<pid>', left out)."""
    found = {}
    for folder, _, names in os.walk(self.local):
      for name in names:
        if '.tmp-' not in name:
          path = pathlib.Path(folder) / name
          found[path.relative_to(self.local).as_posix()] = _stamp(path)
    return found

  def pull(self, others: bool = False) -> List[str]:
    """Copies the bucket's objects into the local copy; returns their
    names. `others`: only those this process has not copied up itself
    (another process's records, choice or output cache), over its older
    copies of them."""
    try:
      names = [n for n in checkpoints.list_files(self.url)
               if not n.startswith(_NOT_PULLED) and n != LEASE]
      if others:
        names = [n for n in names if n not in self._ours]
      for name in names:
        path = self.local / name
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoints.write_bytes(str(path), checkpoints.read_bytes(
            self._address(name)))
        self._copied[name] = _stamp(path)
    except (OSError, ValueError) as e:  # tensorstore's errors: ValueError
      raise BucketCopyError(f'could not copy the run folder {self.url} to '
                            f'this machine: {type(e).__name__}: {e}') from e
    return names

  def sync(self, force: bool = False) -> None:
    """Makes the bucket what the local copy is: changed records files,
    then the other files written (oldest first), then the files removed.
    Without `force`, a change of records files alone waits for
    `every_s`. Nothing after `reads_only`."""
    if self._failed or self._reads_only:
      return
    now = self._scan()
    changed = [n for n in now if self._copied.get(n) != now[n]]
    removed = [n for n in self._copied if n not in now]
    records = [n for n in changed if _is_records(n)]
    if not changed and not removed:
      return
    if (not force and not removed and len(records) == len(changed) and
        time.monotonic() - self._records_at < self.every_s):
      return
    others = sorted((n for n in changed if not _is_records(n)),
                    key=lambda n: now[n][1])
    try:
      if self._lease is not None:
        self._lease.check(self.local)
      elif self._watched is not None:
        self._check_watched()
    except BucketCopyError:
      self._failed = True  # no copy from now on
      raise
    try:
      for name in records + others:
        checkpoints.write_bytes(self._address(name),
                                (self.local / name).read_bytes())
        self._copied[name] = now[name]
        self._ours.add(name)
      for name in removed:
        checkpoints.delete(self._address(name))
        del self._copied[name]
    except (OSError, ValueError) as e:  # tensorstore's errors: ValueError
      self._failed = True
      raise BucketCopyError(
          f'could not copy the run folder to {self.url} ({type(e).__name__}'
          f': {e}); what the job wrote is kept at {self.local}: copy it '
          'there (e.g. gsutil -m rsync -r) and rerun to resume') from e
    if records:
      self._records_at = time.monotonic()

  def _check_watched(self) -> None:
    """BucketCopyError unless the job's lease is still its own."""
    data = checkpoints.read_versioned(self._address(LEASE))[0]
    if data is None or not _holder_of(data).endswith(
        f'{_named(self._watched)})'):
      raise BucketCopyError(
          f"{self.url}: this job's lease ({_named(self._watched)}, held by "
          f'its main process) is gone or {_holder_of(data)}\'s now: this '
          f'process copies nothing more, and what it wrote is kept at '
          f'{self.local}.')

  def reads_only(self) -> None:
    """From now on copies nothing up: the folder of a process that writes
    none of it (one mesh spanning the processes: process 0 writes), whose
    copy of a file another process grows must never go over it (an output
    cache its load saved again unchanged, say)."""
    self._reads_only = True

  # -- The job's hooks ----------------------------------------------------

  def _after_write(self, label: str) -> None:
    del label
    self.sync()

  def start(self, hold: bool = False, lease_id: Optional[str] = None
            ) -> None:
    """Takes the folder's lease where `hold` (the job's main process),
    copies the bucket down, then syncs after every write of the run
    folder (first among `run_folder.after_write`). `lease_id`: the job's
    word for its lease (`run_folder.claim_token`, the same in every
    process): its main process names the lease by it, and each other
    process copies only while the lease is so named (after a takeover,
    a process of the job that lost it copies nothing more).

    Raises:
      run_folder.RunFolderError: another job holds the folder.
      BucketCopyError: it could not be read.
    """
    try:
      if hold:
        self._lease = _Lease(self.url, lease_id)
        self._lease.take()
      else:
        self._watched = lease_id
      self.pull()
    except BaseException as e:
      if self._lease is not None:
        self._lease.release()
      shutil.rmtree(self.local, ignore_errors=True)
      if isinstance(e, (OSError, ValueError)) and not isinstance(
          e, run_folder.RunFolderError):  # tensorstore's, on the lease
        raise BucketCopyError(f'could not take the lease of {self.url}: '
                              f'{type(e).__name__}: {e}') from e
      raise
    run_folder.after_write.insert(0, self._after_write)

  def close(self) -> None:
    """Copies everything up, stops syncing and removes the local copy
    (kept, and named in the error, when a copy failed)."""
    try:
      self.sync(force=True)
    finally:
      if self._after_write in run_folder.after_write:
        run_folder.after_write.remove(self._after_write)
      if self._lease is not None:
        self._lease.release()
    if self._failed:
      logging.warning('the run folder %s is kept at %s: it was not copied '
                      'to the bucket whole.', self.url, self.local)
    else:
      shutil.rmtree(self.local, ignore_errors=True)

  def shown(self, text: str) -> str:
    """`text` (an error, a line) with the local copy's path said as the
    bucket's address."""
    return text.replace(str(self.local), self.url)


@contextlib.contextmanager
def copied_here(url: str) -> Iterator[pathlib.Path]:
  """The files of the gs:// folder `url`, copied into a temporary local
  folder for the block to read; removed after it."""
  folder = BucketFolder(url)
  try:
    folder.pull()
    yield folder.local
  finally:
    shutil.rmtree(folder.local, ignore_errors=True)


class Here(NamedTuple):
  """A job's folder as the job writes it (`kept_here`)."""
  path: str  # where the job writes it: the folder, or a local copy of it
  sync: Callable[[], None]  # copies what changed to the folder (a copy's)
  shown: Callable[[str], str]  # a path of `path` said as the folder's


@contextlib.contextmanager
def kept_here(name: str, path: str, pull: bool = True) -> Iterator[Here]:
  """A folder a job writes, `path` (checked as the folder `name`:
  `check_folder`), as it writes it.

  A local `path`: itself ('~' expanded), a sync that does nothing. A
  gs:// address: a local copy (`BucketFolder`: the bucket's objects copied
  down first where `pull`, and then synced after every write of a run
  folder), which `sync` copies up, as does the block's end (with an error
  too) before the copy goes; without `pull` the folder's other objects are
  left as they are.
  """
  check_folder(name, path)
  if not is_bucket(path):
    yield Here(os.path.expanduser(path), lambda: None, lambda text: text)
    return
  folder = BucketFolder(path, every_s=0.0)
  if pull:
    folder.start()
  try:
    yield Here(str(folder.local), functools.partial(folder.sync, force=True),
               lambda text: text and folder.shown(text))
  finally:
    folder.close()


@contextlib.contextmanager
def written_here(name: str, path: str, suffixes: Tuple[str, ...] = ('',)
                 ) -> Iterator[Tuple[Optional[str], Callable[[], None]]]:
  """Yields (where to write the files named `path` + each of `suffixes`
  here, a sync): for a local `path` None (there itself) and a sync that
  does nothing; for a gs:// address, its name in a copy of its folder that
  `kept_here` keeps, not copied down (the folder's other objects are left
  as they are). Refused before any work: a local folder that cannot be
  made or written, or a folder where one of the files goes."""
  if not is_bucket(path, name):
    check_folder(name, os.path.dirname(os.path.expanduser(path)) or '.')
    for file in (f'{os.path.expanduser(path)}{s}' for s in suffixes):
      if os.path.isdir(file):
        raise checks.InputError(f'{name} {path!r}: {file} is a folder, '
                                'where a file is to be written.')
    yield None, lambda: None
    return
  parent, base = path.rstrip('/').rsplit('/', 1)
  with kept_here(name, parent, pull=False) as here:
    yield os.path.join(here.path, base), here.sync


def write_file(path: Folder, data: bytes) -> None:
  """Writes a file whole or not at all, at a local path (its folder made)
  or a gs:// address (`checkpoints.write_bytes`)."""
  if not is_bucket(path):
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  checkpoints.write_bytes(os.fspath(path), data)


def all_records(folder: Folder) -> List[Dict[str, Any]]:
  """Every process's records of a run folder, local or gs:// (read in a
  copy), each index once (`run_folder.all_records`)."""
  if not is_bucket(folder):
    return run_folder.all_records(pathlib.Path(folder), own=None)
  with copied_here(os.fspath(folder)) as local:
    return run_folder.all_records(local, own=None)
