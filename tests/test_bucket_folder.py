"""An eval run folder at a gs:// address (bucket_folder.py), on the suite's
local GCS (tests/fake_gcs.py).

The job writes a local copy and the bucket follows it write by write, so a
process that dies at any point, its disk with it, leaves a bucket that a
rerun resumes from to what an uninterrupted run writes (the crash points of
tests/test_run_folder.py, here with the process's copies stopped there).
"""

import os
import pathlib
import re
import tempfile
import time

import pytest

from specdec_jax import bucket_folder
from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import eval as eval_lib
from specdec_jax import run_folder
from test_eval import args
from test_run_folder import _state
from test_run_folder import Injected
from test_run_folder import SHORT


def _download(url: str, local: pathlib.Path) -> pathlib.Path:
  """The objects under `url`, copied into the folder `local`."""
  for name in checkpoints.list_files(url):
    path = local / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(checkpoints.read_bytes(f'{url}/{name}'))
  return local


def test_a_run_killed_after_any_write_resumes_from_its_bucket(
    tmp_path, gcs, monkeypatch, capsys):
  """The 'cache' drafter (its output cache committed with each unit's
  records), batches of 1, records waiting to be copied (sync_every_s):
  the job in a bucket writes what it writes in a folder. Killed right after
  each write of its first unit (no later copy; its local copy lost), then
  rerun: the bucket's records, summary counters and output cache (byte
  for byte) are an uninterrupted run's."""
  flags = dict(BATCH_SIZE='1', NUM_EXAMPLES='2', GAMMA='3',
               DRAFTER="'cache'", DRAFT_MODEL='None', **SHORT,
               **{'evaluate.sync_every_s': '1e9'})
  writes = []
  monkeypatch.setattr(run_folder, 'after_write', [writes.append])
  reference = tmp_path / 'reference'
  eval_lib.main(args(reference, **flags))
  expected = _state(reference)
  monkeypatch.setattr(run_folder, 'after_write', [])
  local_copies = tmp_path / 'tmp'
  local_copies.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(local_copies))
  whole = f'{gcs}/whole'
  capsys.readouterr()
  eval_lib.main(args(whole, **flags))
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == f'decoding 2 examples into {whole}', lines
  assert lines[-1].startswith(f'{whole}: complete (2 examples'), lines
  assert _state(_download(whole, tmp_path / 'whole')) == expected
  assert not list(local_copies.iterdir())  # the local copy removed
  # A rerun with other settings is refused, naming the bucket's address.
  with pytest.raises(run_folder.RunFolderError) as refused:
    eval_lib.main(args(whole, **dict(flags, GAMMA='2')))
  assert f'{whole} holds a run with other settings' in str(refused.value)
  assert 'specdec_run_' not in str(refused.value)

  dead = []  # the process killed: nothing more reaches the bucket
  sync = bucket_folder.BucketFolder.sync
  monkeypatch.setattr(bucket_folder.BucketFolder, 'sync', lambda self, force=(
      False): None if dead else sync(self, force))
  first_unit = range(writes.index('summary.md') + 1,
                     writes.index('output cache intent removed') + 1)
  assert [writes[at] for at in first_unit] == [
      'output cache staged', 'output_cache.pending.json', 'examples.jsonl',
      'output cache committed', 'output cache intent removed']
  for at in first_unit:
    count = [0]

    def kill(label, at=at, count=count):
      del label
      count[0] += 1
      if count[0] == at + 1:
        dead.append(at)
        raise Injected(f'after write {at}')

    url = f'{gcs}/after-{at}'
    monkeypatch.setattr(run_folder, 'after_write', [kill])
    with pytest.raises(Injected):
      eval_lib.main(args(url, **flags))
    monkeypatch.setattr(run_folder, 'after_write', [])
    dead.clear()
    summary = eval_lib.main(args(url, **flags))
    assert summary['status'] == 'complete'
    assert _state(_download(url, tmp_path / f'after-{at}')) == expected, (
        writes[at])


def test_records_wait_and_are_copied_before_any_later_write(gcs,
                                                             monkeypatch):
  """Records alone wait for `every_s`; the next other write copies them
  first. An earlier run moved aside: its files copied to their new names
  before the old ones are removed, and never copied down again. A copy
  that fails names the bucket and keeps the local copy."""
  url = f'{gcs}/run'
  ops = []
  put, delete = checkpoints.write_bytes, checkpoints.delete

  def recorded_put(path, data):
    if path.startswith('gs://'):
      ops.append(('put', path[len(url) + 1:]))
    put(path, data)

  monkeypatch.setattr(checkpoints, 'write_bytes', recorded_put)
  monkeypatch.setattr(checkpoints, 'delete', lambda path: (
      ops.append(('delete', path[len(url) + 1:])), delete(path)))
  folder = bucket_folder.BucketFolder(url, every_s=1e9)
  folder.start()
  try:
    run_folder.write_atomic(folder.local / 'run.json', '{}')
    with (folder.local / 'examples.jsonl').open('a') as sink:
      run_folder.append(sink, [{'index': 0}])
      run_folder.append(sink, [{'index': 1}])
    assert ops == [('put', 'run.json')]
    run_folder.write_atomic(folder.local / 'summary.json', '{}')
    assert ops[1:] == [('put', 'examples.jsonl'), ('put', 'summary.json')]
    del ops[:]
    aside = run_folder._move_aside(folder.local)  # pylint: disable=protected-access
    names = ['examples.jsonl', 'run.json', 'summary.json']
    assert sorted(ops[:3]) == [('put', f'{aside.name}/{n}') for n in names]
    assert sorted(ops[3:]) == [('delete', n) for n in names]
  finally:
    folder.close()
  assert not folder.local.exists()
  again = bucket_folder.BucketFolder(url)
  assert again.pull() == [] and checkpoints.list_files(url) == [
      f'{aside.name}/{n}' for n in names]

  def failing(path, data):
    if path.startswith('gs://'):
      raise OSError('no route to the bucket')
    put(path, data)

  monkeypatch.setattr(checkpoints, 'write_bytes', failing)
  again.start()
  with pytest.raises(bucket_folder.BucketCopyError) as failed:
    run_folder.write_atomic(again.local / 'run.json', '{}')
  assert url in str(failed.value) and str(again.local) in str(failed.value)
  again.close()
  assert (again.local / 'run.json').read_text() == '{}'


def test_a_file_written_again_in_one_clock_tick_is_copied(gcs):
  """A file written whole again at its size and time (two writes within
  one tick of the file system's clock) is a change: copied up."""
  url = f'{gcs}/run'
  folder = bucket_folder.BucketFolder(url)
  folder.start()
  path = folder.local / 'gamma_choice.json'
  run_folder.write_atomic(path, '{"gamma": 3}')
  assert checkpoints.read_bytes(f'{url}/gamma_choice.json') == b'{"gamma": 3}'
  at = path.stat().st_mtime_ns
  (folder.local / 'next').write_text('{"gamma": 4}')
  os.utime(folder.local / 'next', ns=(at, at))
  os.replace(folder.local / 'next', path)  # as `write_atomic` writes
  folder.sync(force=True)
  folder.close()
  assert checkpoints.read_bytes(f'{url}/gamma_choice.json') == b'{"gamma": 4}'


def test_a_folder_that_only_reads_copies_nothing_up(gcs):
  """The bucket folder of a process that writes none of the run (one mesh
  spanning the processes: process 0 writes it) copies nothing up, so a
  file it saved again (an output cache its load re-saved, unchanged
  but newer) never goes over what process 0 grew meanwhile."""
  url = f'{gcs}/run'
  checkpoints.write_bytes(f'{url}/output_cache.npz', b'grown by process 0')
  folder = bucket_folder.BucketFolder(url)
  folder.start()
  folder.reads_only()
  (folder.local / 'output_cache.npz').write_bytes(b'as it was')
  (folder.local / 'mine.txt').write_text('x')
  run_folder.after_write[0]('written')
  folder.close()
  assert checkpoints.list_files(url) == ['output_cache.npz']
  assert checkpoints.read_bytes(f'{url}/output_cache.npz') == (
      b'grown by process 0')


def test_files_written_at_a_local_path_are_checked_before_any_work(
    tmp_path):
  """A job's files named OUT + suffix: their folder is checked, not OUT
  (a file there from an earlier run is rewritten: a model's loss.png), and
  a folder where one of them goes is refused before any work is done."""
  (tmp_path / 'loss.png').write_bytes(b'an earlier run')
  with bucket_folder.written_here('model_dir', str(tmp_path / 'loss.png')
                                  ) as (here, _):
    assert here is None  # written there itself
  (tmp_path / 'results.md').mkdir()
  with pytest.raises(checks.InputError, match=(
      f"out '{tmp_path}/results': {tmp_path}/results.md is a folder")):
    with bucket_folder.written_here('out', str(tmp_path / 'results'),
                                    ('.json', '.md')):
      pytest.fail('the block ran')
  with pytest.raises(checks.InputError, match='cannot be a folder'):
    with bucket_folder.written_here('out', str(tmp_path / 'loss.png' / 'x')):
      pytest.fail('the block ran')


def _copy_until_refused(folder, url):
  """Writes and copies a file at a time until the folder refuses (within
  its lease's renewals); the address of the file it refused to copy."""
  with pytest.raises(bucket_folder.BucketCopyError) as refused:
    for i in range(200):
      (folder.local / f'b{i}.txt').write_text('b')
      last = f'{url}/b{i}.txt'
      folder.sync(force=True)
      time.sleep(0.02)
  assert not checkpoints.isfile(last)
  return str(refused.value)


def test_one_job_at_a_time_writes_a_run_folder_in_a_bucket(gcs, monkeypatch,
                                                            caplog):
  """A job finding the lease renewed is refused; one finding it not
  renewed (its holder killed: no release) takes it over; a job whose
  lease was taken over stops copying and keeps its copy, named."""
  monkeypatch.setattr(bucket_folder, 'LEASE_S', 1.0)
  url = f'{gcs}/run'
  lease = f'{url}/{bucket_folder.LEASE}'
  first = bucket_folder.BucketFolder(url)
  first.start(hold=True)
  assert checkpoints.read_versioned(lease)[0] is not None
  second = bucket_folder.BucketFolder(url)
  with pytest.raises(run_folder.RunFolderError, match=(
      'another job is writing this run folder now .*renewed its lease')):
    second.start(hold=True)
  assert not second.local.exists()
  reader = bucket_folder.BucketFolder(url)  # another process of the job
  reader.start()
  reader.close()
  first.close()
  assert checkpoints.read_versioned(lease)[0] is None  # let go

  # A holder killed: its lease stays, never renewed, and is taken over.
  checkpoints.write_bytes(lease, b'{"holder": "h (pid 1)", "renewed": 1e12}')
  third = bucket_folder.BucketFolder(url)
  third.start(hold=True)  # its clock is not read: watched, then taken
  assert 'took over the lease of h (pid 1)' in caplog.text
  (third.local / 'a.txt').write_text('a')
  third.sync(force=True)
  assert checkpoints.read_bytes(f'{url}/a.txt') == b'a'
  # Another job takes it over (third stalled): third's next copy stops.
  checkpoints.write_bytes(lease, b'{"holder": "h (pid 2)", "renewed": 0}')
  said = _copy_until_refused(third, url)
  assert re.search(r'another job \(h \(pid 2\)\) took this run folder '
                   f'over .*kept at {third.local}', said), said
  third.close()
  assert third.local.exists()  # kept, as the error says
  assert checkpoints.read_versioned(lease)[0] == (
      b'{"holder": "h (pid 2)", "renewed": 0}')  # not removed: not its


def test_a_job_that_cannot_renew_its_lease_stops_before_it_runs_out(
    gcs, monkeypatch):
  """A renewal whose answer was an error though GCS wrote it is found to
  be this job's own (the job goes on); renewals failing for LEASE_S / 2
  (GCS out of reach) stop the job's copies before another job could take
  the folder."""
  monkeypatch.setattr(bucket_folder, 'LEASE_S', 1.0)
  url = f'{gcs}/run'
  job = bucket_folder.BucketFolder(url)
  job.start(hold=True)
  write_if, calls = checkpoints.write_if, []

  def held_but_said_failed(*args):
    write_if(*args)
    calls.append(args)
    raise OSError('connection reset')

  monkeypatch.setattr(checkpoints, 'write_if', held_but_said_failed)
  while not calls:
    time.sleep(0.02)

  def counted(*args):
    calls.append(args)
    return write_if(*args)

  monkeypatch.setattr(checkpoints, 'write_if', counted)
  while len(calls) < 3:  # the next fails its precondition, one more holds
    time.sleep(0.02)
  (job.local / 'a.txt').write_text('a')
  job.sync(force=True)  # still this job's
  assert checkpoints.read_bytes(f'{url}/a.txt') == b'a'

  def unreachable(*args):
    raise OSError('no route to GCS')

  monkeypatch.setattr(checkpoints, 'write_if', unreachable)
  said = _copy_until_refused(job, url)
  assert 'this job has not renewed its lease for 0.5 s' in said, said
  monkeypatch.setattr(checkpoints, 'write_if', write_if)
  job.close()


def test_the_jobs_other_processes_copy_only_while_its_lease_is_its_own(
    gcs, monkeypatch):
  """A `jax.distributed` job: its main process holds the lease named by
  the job's word (`claim_token`), the others copy their files only while
  the lease is so named (before, they went on after another job took the
  folder over)."""
  monkeypatch.setattr(bucket_folder, 'LEASE_S', 1.0)
  url = f'{gcs}/run'
  main = bucket_folder.BucketFolder(url)
  main.start(hold=True, lease_id='t0k3n')
  other = bucket_folder.BucketFolder(url)
  other.start(lease_id='t0k3n')
  (other.local / 'a.txt').write_text('a')
  other.sync(force=True)
  assert checkpoints.read_bytes(f'{url}/a.txt') == b'a'
  checkpoints.write_bytes(f'{url}/{bucket_folder.LEASE}',
                          b'{"holder": "h (pid 9, lease x)", "renewed": 0}')
  (other.local / 'b.txt').write_text('b')
  with pytest.raises(bucket_folder.BucketCopyError, match=(
      r"this job's lease \(lease t0k3n, held by its main process\) is gone "
      r"or h \(pid 9, lease x\)'s now: this process copies nothing more")):
    other.sync(force=True)
  assert not checkpoints.isfile(f'{url}/b.txt')
  other.close()
  main.close()
