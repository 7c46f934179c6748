"""Checksum manifests: sha256 and size of every file of a folder.

Orbax, tensorstore and T5X keep no checksums: a flipped byte in a data file
can load as other weights without an error. A manifest, `MANIFEST.json` in
the folder it covers, records what was written so a reader can tell.

Two forms, one per writer, read by `read`:

- A checkpoint's (`checkpoints.save_t5x_params`, in `checkpoint_<step>/`):
  `{'format': FORMAT, 'files': {rel path: {'sha256', 'bytes'}},
  'arrays': {'a/b/kernel': {'sha256', 'dtype', 'shape'}}}`. The array
  entries hash the values as saved (C-order bytes), so a damaged file can be
  traced to the arrays that no longer read back the same.
- The shipped assets' (`shipped.write_manifest`): the `files` mapping alone,
  at the top of a folder of several checkpoints and data files.

`find` looks for the manifest of a checkpoint folder: its own, else a
shipped-form one in one of the two folders above it (local paths) that lists
files under it. `check_files` names every missing, resized or changed file,
and every file under the covered folder that the manifest does not list.
Paths are local or gs://.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from specdec_jax import checks
from specdec_jax.checkpoints import _storage

MANIFEST = 'MANIFEST.json'
FORMAT = 'specdec_jax.checkpoint_manifest/1'
_ENCLOSING_LEVELS = 2  # <root>/<model>/checkpoint_<step>, as shipped


@dataclasses.dataclass(frozen=True)
class Manifest:
  """A parsed manifest and the part of it that covers one folder.

  Attributes:
    path: the MANIFEST.json.
    root: the folder its relative paths start from.
    files: {rel path: {'sha256', 'bytes'}}, all of the manifest's files.
    arrays: {'a/b': {'sha256', 'dtype', 'shape'}}; empty in the shipped form.
    prefix: the covered folder's rel path + '/' ('' for the whole root).
  """
  path: str
  root: str
  files: Mapping[str, Mapping[str, Any]]
  arrays: Mapping[str, Mapping[str, Any]]
  prefix: str = ''

  def covered(self) -> Dict[str, Mapping[str, Any]]:
    return {rel: e for rel, e in self.files.items()
            if rel.startswith(self.prefix)}


def _size_and_sha256(path: str, want_bytes: Optional[int] = None):
  """(size, sha256 hex) of a file; None if missing; no hash if resized.

  A gs:// object of the size `want_bytes` is read in ranges of
  `_GCS_BLOCK` bytes (one of another size, or of no size given, whole).
  """
  if _storage.is_gcs(path):
    try:
      if want_bytes is not None:
        got = _gcs_sha256(path, want_bytes)
        if got is not None:
          return want_bytes, got
      data = _storage.read_bytes(path)
    except FileNotFoundError:
      return None
    return len(data), hashlib.sha256(data).hexdigest()
  if not os.path.isfile(path):
    return None
  size = os.path.getsize(path)
  if want_bytes is not None and size != want_bytes:
    return size, None
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return size, digest.hexdigest()


_GCS_BLOCK = 64 << 20


def _gcs_sha256(path: str, size: int) -> Optional[str]:
  """sha256 hex of a gs:// object read in `_GCS_BLOCK` ranges, if it holds
  exactly `size` bytes; else None (tensorstore's Python API tells no
  object's size: a range past the end fails, one byte past `size` must).

  Raises:
    FileNotFoundError: there is no object at `path`.
  """
  digest = hashlib.sha256()
  try:
    for start in range(0, size, _GCS_BLOCK):
      digest.update(_storage.read_range(path, start,
                                        min(start + _GCS_BLOCK, size)))
  except ValueError:  # shorter than `size`
    return None
  try:
    _storage.read_range(path, size, size + 1)
  except ValueError:  # nothing past `size`: the whole object was read
    return digest.hexdigest()
  return None  # longer than `size`


def file_entries(root: str) -> Dict[str, Dict[str, Any]]:
  """`{rel path: {'sha256', 'bytes'}}` of every file under `root`.

  The manifest at the top of `root` is left out (not those of subfolders).
  """
  entries = {}
  for rel in _storage.list_files(root):
    if rel != MANIFEST:
      size, sha = _size_and_sha256(os.path.join(root, rel))
      entries[rel] = {'sha256': sha, 'bytes': size}
  return entries


def _array_sha256(value: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()


def array_entries(flat: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
  """`{name: {'sha256', 'dtype', 'shape'}}` of host arrays by '/'-name."""
  out = {}
  for name, value in sorted(flat.items()):
    value = np.asarray(value)
    out[name] = {'sha256': _array_sha256(value), 'dtype': value.dtype.name,
                 'shape': list(value.shape)}
  return out


def write_json(path: str, obj: Any) -> str:
  """Writes `obj` as indented JSON (locally through a renamed temp file)."""
  _storage.write_bytes(path, (json.dumps(obj, indent=1) + '\n').encode())
  return path


def write(root: str, arrays: Mapping[str, Any]) -> str:
  """Writes `root/MANIFEST.json` (checkpoint form) over root's files now.

  Args:
    root: the checkpoint folder, complete (written last, the manifest is
      absent from a checkpoint whose writing was cut short).
    arrays: `array_entries` of the saved values.

  Returns:
    The manifest's path.
  """
  return write_json(os.path.join(root, MANIFEST),
                    {'format': FORMAT, 'files': file_entries(root),
                     'arrays': dict(arrays)})


def _is_file_entries(x: Any) -> bool:
  return isinstance(x, dict) and all(
      isinstance(e, dict) and isinstance(e.get('sha256'), str) and
      isinstance(e.get('bytes'), int) for e in x.values())


def read(path: str) -> Manifest:
  """Parses a manifest of either form.

  Raises:
    FileNotFoundError: there is none at `path`.
    ValueError: it is no JSON manifest of either form (damaged or foreign).
  """
  data = _storage.read_bytes(path)
  try:
    obj = json.loads(data)
  except ValueError as e:
    raise ValueError(f'{path} is not JSON ({e})') from None
  arrays: Dict[str, Any] = {}
  if isinstance(obj, dict) and obj.get('format') == FORMAT:
    obj, arrays = obj.get('files'), obj.get('arrays')
    if not isinstance(arrays, dict):
      raise ValueError(f'{path} has no "arrays" mapping')
  if not _is_file_entries(obj):
    raise ValueError(f'{path} is no {FORMAT} manifest nor a {{path: '
                     '{sha256, bytes}} one')
  return Manifest(path=path, root=os.path.dirname(path), files=obj,
                  arrays=arrays)


def find(folder: str) -> Optional[Manifest]:
  """The manifest covering a checkpoint folder, or None.

  Its own `folder/MANIFEST.json` first; else (local folders only) a
  shipped-form one up to two folders above that lists files under `folder`.
  An unreadable one of those is not taken for one (it may be another tool's).

  Raises:
    ValueError: `folder/MANIFEST.json` exists but cannot be parsed.
  """
  folder = os.fspath(folder).rstrip('/')
  own = os.path.join(folder, MANIFEST)
  if _storage.isfile(own):
    return read(own)
  if _storage.is_gcs(folder):
    return None
  root = os.path.abspath(folder)
  for _ in range(_ENCLOSING_LEVELS):
    root = os.path.dirname(root)
    path = os.path.join(root, MANIFEST)
    if not os.path.isfile(path):
      continue
    try:
      found = read(path)
    except ValueError:
      continue
    prefix = os.path.relpath(folder, root).replace(os.sep, '/') + '/'
    found = dataclasses.replace(found, prefix=prefix)
    if found.covered():
      return found
  return None


def check_files(root: str, files: Mapping[str, Mapping[str, Any]],
                prefix: str = '', complete: bool = True) -> List[str]:
  """Checks the files of a manifest under `prefix` against the disk, both
  ways: every listed file is there as recorded, and every file there is
  listed (a file the manifest does not cover would be read unverified).

  Args:
    root: the folder the manifest's paths start from.
    files: the manifest's `{rel path: {'sha256', 'bytes'}}`.
    prefix: only paths starting with it ('' or a folder's rel path + '/').
    complete: also name the files under `root/prefix` that `files` does
      not list (False: `files` is a chosen few of the manifest's).

  Returns:
    One line per bad file, e.g. 'missing: <path>', 'truncated or changed:
    <path> has 10 bytes, the manifest says 12', 'corrupt: <path> (sha256
    differs from MANIFEST.json)', 'not listed in MANIFEST.json: <path>';
    empty when every file is as recorded and every file is listed.
  """
  problems = []
  for rel, entry in files.items():
    if not rel.startswith(prefix):
      continue
    path = os.path.join(root, rel)
    got = _size_and_sha256(path, entry['bytes'])
    if got is None:
      problems.append(f'missing: {path}')
    elif got[0] != entry['bytes']:
      problems.append(f'truncated or changed: {path} has {got[0]} bytes, '
                      f'the manifest says {entry["bytes"]}')
    elif got[1] != entry['sha256']:
      problems.append(f'corrupt: {path} (sha256 differs from {MANIFEST})')
  for rel in unlisted(root, files, prefix) if complete else ():
    problems.append(f'not listed in {MANIFEST}: {os.path.join(root, rel)}')
  return problems


def unlisted(root: str, files: Mapping[str, Mapping[str, Any]],
             prefix: str = '') -> List[str]:
  """Relative paths of the files under `root/prefix` that `files` lacks
  (the manifest at the top of `root` itself aside)."""
  folder = os.path.join(root, prefix) if prefix else root
  if not _storage.is_gcs(folder) and not os.path.isdir(folder):
    return []
  on_disk = [prefix + rel for rel in _storage.list_files(folder)]
  return [rel for rel in on_disk if rel != MANIFEST and rel not in files]


def differing_arrays(arrays: Mapping[str, Mapping[str, Any]],
                     flat: Mapping[str, Any]) -> List[str]:
  """Names of the recorded arrays that `flat` lacks or holds otherwise (a
  value of `flat` may be the exception its read raised: it is named)."""
  bad = []
  for name, entry in arrays.items():
    value = flat.get(name)
    if value is None:
      bad.append(f'{name} (missing)')
      continue
    if isinstance(value, Exception):
      bad.append(f'{name} (unreadable: {type(value).__name__})')
      continue
    value = np.asarray(value)
    if (value.dtype.name != entry['dtype'] or
        list(value.shape) != list(entry['shape']) or
        _array_sha256(value) != entry['sha256']):
      bad.append(name)
  bad += [f'{name} (not saved)' for name in sorted(set(flat) - set(arrays))]
  return bad


# Files up to this size are hashed whole by `fingerprint` when no manifest
# covers the folder (a checkpoint's metadata; its tensor chunks are named
# and sized only).
FINGERPRINT_WHOLE_BYTES = 1 << 20


def file_fingerprint(path: str) -> Optional[str]:
  """'sha256:<hex>' of one file's whole content (local or gs://); None
  when there is no such file."""
  found = _size_and_sha256(os.fspath(path))
  return None if found is None else f'sha256:{found[1][:32]}'


def fingerprint(folder: str) -> Optional[str]:
  """A cheap content id of a checkpoint folder, for telling runs apart.

  Where a manifest covers the folder (`find`), the sha256 of its entries
  for the folder: the content of every file, already recorded (and checked
  when the checkpoint loads). Otherwise the sha256 of every file's
  relative path and size and of the whole content of the files up to
  `FINGERPRINT_WHOLE_BYTES` (metadata; gs:// folders: paths, and the
  content of those small files is not read), so a changed tensor of the
  same size in a folder without a manifest goes unseen. None when there is
  no such folder.
  """
  folder = os.fspath(folder).rstrip('/')
  try:
    found = find(folder)
  except checks.InputError:  # a listing GCS did not give: said at once
    raise
  except ValueError:  # a damaged manifest: the folder fingerprinted whole
    found = None
  if found is not None:
    covered = json.dumps(
        sorted((rel[len(found.prefix):], e['sha256'], e['bytes'])
               for rel, e in found.covered().items()))
    return 'manifest:' + hashlib.sha256(covered.encode()).hexdigest()[:32]
  if _storage.is_gcs(folder):
    names = _storage.list_files(folder)
    if not names:
      return None
    listed = json.dumps(names).encode()
    return 'listing:' + hashlib.sha256(listed).hexdigest()[:32]
  if not os.path.isdir(folder):
    return None
  digest = hashlib.sha256()
  for rel in _storage.list_files(folder):
    path = os.path.join(folder, rel)
    size = os.path.getsize(path)
    digest.update(f'{rel}\0{size}\0'.encode())
    if size <= FINGERPRINT_WHOLE_BYTES:
      digest.update(_size_and_sha256(path)[1].encode())
  return 'files:' + digest.hexdigest()[:32]
