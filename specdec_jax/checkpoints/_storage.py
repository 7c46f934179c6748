"""Paths of checkpoints: local, or gs:// through tensorstore's gcs kvstore."""

from __future__ import annotations

import contextlib
import os
import re
from typing import List, Optional, Set, Tuple

from specdec_jax import checks


def is_gcs(path, name: str = '') -> bool:
  """Whether `path` is a gs:// address (read and written through
  tensorstore), else a local path. Another URL (s3://, https://) is
  refused here, where every read and write of a path chooses its storage,
  not met later as a local folder 's3:' that is not there; `name` (the
  setting that gave the path) heads the message.

  Raises:
    InputError: `path` is a URL but not a gs:// one.
  """
  text = os.fspath(path)
  if text.startswith('gs://'):
    return True
  if checks.is_url(text):
    raise checks.InputError(
        f'{name + " " if name else ""}{text!r} is neither a local path nor a '
        'gs:// address: files are read and written here locally or in GCS '
        '(through tensorstore). Copy it to a local path or a gs:// bucket.')
  return False


def split_gcs(path: str) -> Tuple[str, str]:
  """(bucket, key) of a gs://bucket/key address."""
  m = re.fullmatch(r'gs://([^/]+)/?(.*)', path, re.DOTALL)
  if m is None:
    raise ValueError(f'Not a gs://bucket/path address: {path}')
  return m.group(1), m.group(2)


def _gcs_store(path: str):
  """(tensorstore gcs KvStore of the bucket, key) of a gs:// address."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  bucket, key = split_gcs(path)
  return ts.KvStore.open({'driver': 'gcs', 'bucket': bucket}).result(), key


# A listing answers in seconds where GCS can be reached; where it cannot
# (no network, no credentials) tensorstore retries for many minutes without
# a word. Every gs:// path is listed before it is read (a checkpoint, a run
# folder), so this is where a job says so.
LIST_TIMEOUT_S = 120.0


def _gcs_keys(path: str, exact: bool) -> list:
  """Object keys equal to (exact) or under (folder) a gs:// address."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  store, key = _gcs_store(path if exact else path.rstrip('/') + '/')
  end = key + ('\x00' if exact else '\x7f')
  return list(_answer(store.list(ts.KvStore.KeyRange(key, end)), path,
                      'listing'))


def _answer(future, path: str, what: str):
  """A tensorstore future's result, or InputError after LIST_TIMEOUT_S."""
  try:
    return future.result(timeout=LIST_TIMEOUT_S)
  except TimeoutError:
    future.cancel()
    raise checks.InputError(
        f'{path}: GCS gave no {what} in {LIST_TIMEOUT_S:g} s (tensorstore '
        'retries while it cannot reach GCS: no network, or no credentials, '
        'read from $GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth '
        f'application-default login`). Check with: gsutil ls {path}'
        ) from None


def isdir(path: str) -> bool:
  if is_gcs(path):
    return bool(_gcs_keys(path, exact=False))
  return os.path.isdir(path)


def isfile(path: str) -> bool:
  if is_gcs(path):  # Listing, not reading: `checkpoint` files can be large.
    return bool(_gcs_keys(path, exact=True))
  return os.path.isfile(path)


def subdir_names(directory: str) -> Set[str]:
  """Names of the folders directly in `directory`; empty if it is none.

  On GCS, which has no folders, the first path component of every object
  below `directory`.
  """
  if is_gcs(directory):
    prefix = split_gcs(directory.rstrip('/') + '/')[1]
    return {k.decode()[len(prefix):].split('/')[0]
            for k in _gcs_keys(directory, exact=False)}
  if os.path.isdir(directory):
    return {n for n in os.listdir(directory)
            if os.path.isdir(os.path.join(directory, n))}
  return set()


def read_bytes(path: str) -> bytes:
  if is_gcs(path):
    store, key = _gcs_store(path)
    result = store.read(key).result()
    if result.state == 'missing':
      raise FileNotFoundError(f'No file at {path}')
    return bytes(result.value)
  with open(path, 'rb') as f:
    return f.read()


def read_range(path: str, start: int, stop: int) -> bytes:
  """Bytes [start, stop) of a gs:// object.

  Raises:
    FileNotFoundError: there is no object at `path`.
    ValueError: the range is not within the object (tensorstore's
      OUT_OF_RANGE).
  """
  store, key = _gcs_store(path)
  result = store.read(key, byte_range=slice(start, stop)).result()
  if result.state == 'missing':
    raise FileNotFoundError(f'No file at {path}')
  return bytes(result.value)


def list_files(directory: str) -> List[str]:
  """'/'-separated paths, relative to `directory`, of every file under it."""
  if is_gcs(directory):
    prefix = split_gcs(directory.rstrip('/') + '/')[1]
    return sorted(k.decode()[len(prefix):]
                  for k in _gcs_keys(directory, exact=False))
  found = []
  for folder, _, names in os.walk(directory):
    found += [os.path.relpath(os.path.join(folder, n), directory)
              .replace(os.sep, '/') for n in names]
  return sorted(found)


def write_bytes(path: str, data: bytes) -> None:
  """Writes a file whole or not at all, durably (locally: a temp file,
  fsync'd, renamed over `path`)."""
  if is_gcs(path):
    store, key = _gcs_store(path)
    store.write(key, data).result()
    return
  tmp = f'{path}.tmp-{os.getpid()}'
  try:
    with open(tmp, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:  # a folder at `path`, a full disk: no temp left
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def read_versioned(path: str) -> Tuple[Optional[bytes], bytes]:
  """(the bytes of a gs:// object, or None where there is none; its
  generation), for `write_if`."""
  store, key = _gcs_store(path)
  result = _answer(store.read(key), path, 'answer')
  value = None if result.state == 'missing' else bytes(result.value)
  return value, result.stamp.generation


def write_if(path: str, data: Optional[bytes], generation: bytes
             ) -> Optional[bytes]:
  """Writes `data` to a gs:// object (None: deletes it) only if its
  generation is still `generation` (`read_versioned`'s, or an earlier
  `write_if`'s); returns the new generation, or None where the object
  had changed (GCS's precondition: no other writer came between)."""
  store, key = _gcs_store(path)
  stamp = _answer(store.write(key, data, if_equal=generation), path,
                  'answer')
  return stamp.generation or None  # empty: the condition failed


def delete(path: str) -> None:
  """Removes a file (a gs:// object); nothing where there is none."""
  if is_gcs(path):
    store, key = _gcs_store(path)
    store.write(key, None).result()
    return
  try:
    os.remove(path)
  except FileNotFoundError:
    pass
