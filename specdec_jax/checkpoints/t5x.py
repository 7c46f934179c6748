"""T5X checkpoints (params only): read every format, write T5X's orbax one.

`load_t5x_params` reads the parameter tree (T5X's `target`) of every format
T5X has written, never the optimizer state:

- Legacy T5X: a msgpack file `checkpoint_<step>/checkpoint` holding
  `{'version': 3, 'optimizer': {'target': params, 'state': ...}}`. A leaf is
  either inline (flax's msgpack ndarray encoding) or a tensorstore zarr spec
  dict (`{'driver': 'zarr', 'dtype', 'kvstore': {'driver': 'file' | 'gfile' |
  'gcs', 'path': <relative>}, 'metadata': {'shape', 'chunks', 'compressor'}}`;
  older writers put `path` beside `kvstore`). Paths are relative to the folder
  of the msgpack file, so checkpoints can be moved.
- Early orbax (T5X around 2022/23): the same msgpack file with
  `{'_optimizer': {'target', 'state'}, ...}` and `PLACEHOLDER://<name>` leaves
  naming zarr array folders beside the file.
- Orbax (current T5X, `OrbaxCheckpointManagerInterface`):
  `checkpoint_<step>/state/` is an orbax PyTree checkpoint (`_METADATA`, OCDBT
  `manifest.ocdbt` + `d/`) of the train state dict
  `{'target': params, 'state': {'step', 'param_states'?}, 'flax_mutables'?}`;
  only `target` is restored (orbax partial restore).

`save_t5x_params` writes the orbax layout with orbax's CheckpointManager, as
T5X does, so T5X and `load_t5x_params` read it back, and then a checksum
manifest (`manifest.MANIFEST` in `checkpoint_<step>/`: sha256 and size of
every file, sha256 of every array) that `load_t5x_params` checks by default:
orbax and tensorstore keep no checksums, so a flipped byte could otherwise
load as other weights. Checkpoints without one (T5X's own) load unverified,
with a log note, until `seal_checkpoint` writes one into them;
`verify_checkpoint` checks a checkpoint's files without loading it.
`all_steps`, `latest_checkpoint` and `step_of` are the one reading of
`checkpoint_<step>` folder names.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import network
from specdec_jax.checkpoints import _storage
from specdec_jax.checkpoints import manifest

PyTree = Any

_PLACEHOLDER = 'PLACEHOLDER://'
_CHECKPOINT_FILE = 'checkpoint'
_ORBAX_METADATA_FILE = '_METADATA'
_STATE_KEY = 'state'
_STEP_DIR = re.compile(r'^checkpoint_(\d+)$')
_NOTED_UNVERIFIED: Set[str] = set()  # Logged once per checkpoint.


class CheckpointError(checks.InputError):
  """A checkpoint exists but cannot be read (corrupt, truncated, incomplete)."""


class _NotT5X(ValueError):
  """A well-formed msgpack file that holds no T5X params tree."""


# ----------------------------------------------------------------------------
# Model dirs: `checkpoint_<step>` folders.
# ----------------------------------------------------------------------------


def step_of(path: str) -> Optional[int]:
  """The step of a `checkpoint_<step>` folder; None for any other name."""
  m = _STEP_DIR.match(os.path.basename(os.fspath(path).rstrip('/')))
  return int(m.group(1)) if m else None


def all_steps(directory: str) -> List[Tuple[int, str]]:
  """The `checkpoint_<step>` folders of a model dir, by increasing step.

  Args:
    directory: a T5X model dir, local or gs://.

  Returns:
    [(step, path of its folder), ...]; empty when `directory` holds none or
    is no folder.
  """
  directory = os.fspath(directory)
  found = ((step_of(name), name) for name in _storage.subdir_names(directory))
  return sorted((step, os.path.join(directory, name))
                for step, name in found if step is not None)


def latest_checkpoint(directory: str) -> Optional[str]:
  """The `checkpoint_<step>` folder with the highest step, or None.

  Args:
    directory: a T5X model dir holding `checkpoint_<step>` folders.

  Returns:
    The path of the latest step folder; None when there is none.
  """
  steps = all_steps(directory)
  return steps[-1][1] if steps else None


def _resolve(path: str) -> Tuple[str, str]:
  """Finds what `path` names: ('orbax', state_dir) or ('msgpack', file).

  Probes the files each layout must have (no folder listing unless `path`
  is a model dir), which keeps gs:// lookups cheap.
  """
  if _storage.isfile(os.path.join(path, _STATE_KEY, _ORBAX_METADATA_FILE)):
    return 'orbax', os.path.join(path, _STATE_KEY)
  if _storage.isfile(os.path.join(path, _ORBAX_METADATA_FILE)):
    return 'orbax', path
  ckpt_file = (path if _storage.isfile(path)
               else os.path.join(path, _CHECKPOINT_FILE))
  if _storage.isfile(ckpt_file):
    # A `checkpoint` file beside orbax metadata is orbax's aggregate file.
    ckpt_dir = os.path.dirname(ckpt_file)
    if _storage.isfile(os.path.join(ckpt_dir, _ORBAX_METADATA_FILE)):
      return 'orbax', ckpt_dir
    return 'msgpack', ckpt_file
  latest = latest_checkpoint(path)
  if latest is not None:  # A model dir: take its latest step.
    return _resolve(latest)
  if _storage.isdir(path):
    raise FileNotFoundError(
        f'{path} is a folder but holds no T5X checkpoint (no {_STATE_KEY}/'
        f'{_ORBAX_METADATA_FILE}, no {_CHECKPOINT_FILE} file, no '
        'checkpoint_<step> folders).')
  raise FileNotFoundError(f'No T5X checkpoint at {path}')


# ----------------------------------------------------------------------------
# msgpack (legacy T5X and early orbax).
# ----------------------------------------------------------------------------


def _decode_ext(code: int, data: bytes) -> Any:
  """flax.serialization's msgpack extension types -> numpy values."""
  import msgpack  # pylint: disable=g-import-not-at-top

  if code in (1, 3):  # ndarray, numpy scalar: packed (shape, dtype, bytes).
    shape, dtype_name, buffer = msgpack.unpackb(data, raw=True)
    name = dtype_name.decode()
    dtype = jnp.bfloat16 if name == 'bfloat16' else np.dtype(name)
    arr = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    return arr if code == 1 else arr[()]
  if code == 2:  # native complex
    real, imag = msgpack.unpackb(data)
    return complex(real, imag)
  raise ValueError(f'unknown msgpack extension type {code}')


def _read_target_subtree(data: bytes) -> Tuple[Any, Dict[str, Any]]:
  """Unpacks only the params subtree of a T5X msgpack checkpoint.

  The stream is walked map by map; every value outside the params (the
  optimizer state, flax mutables, axes) is skipped without being unpacked,
  so neither its arrays nor its tensorstore specs are decoded.

  Args:
    data: the bytes of the msgpack file.

  Returns:
    (params subtree with msgpack ExtType leaves still encoded, header) where
    header records 'version' and the key the params were found under.
  """
  import msgpack  # pylint: disable=g-import-not-at-top

  unpacker = msgpack.Unpacker(
      raw=False, strict_map_key=False,
      max_buffer_size=max(len(data), 1),
  )
  unpacker.feed(data)
  header: Dict[str, Any] = {}
  target = None
  seen = []
  for _ in range(unpacker.read_map_header()):
    key = unpacker.unpack()
    seen.append(key)
    if key == 'version':
      header['version'] = unpacker.unpack()
    elif key in ('optimizer', '_optimizer'):
      for _ in range(unpacker.read_map_header()):
        sub = unpacker.unpack()
        if sub == 'target':
          target = unpacker.unpack()
          header['target_key'] = f'{key}/target'
        else:
          unpacker.skip()
    elif key == 'target':  # Version-0 flax optimizer checkpoints.
      target = unpacker.unpack()
      header['target_key'] = 'target'
    else:
      unpacker.skip()
  try:  # Anything after the top-level map means the file is not one tree.
    unpacker.unpack()
  except msgpack.OutOfData:
    pass
  else:
    raise ValueError('trailing bytes after the checkpoint tree')
  if target is None:
    raise _NotT5X('no optimizer/target (params) subtree; top-level keys: '
                  f'{sorted(map(str, seen))}')
  return target, header


def _is_ts_spec(x: Any) -> bool:
  return isinstance(x, dict) and {'driver', 'kvstore'} <= set(x) and (
      'metadata' in x or 'path' in x)


def _flatten(tree: Any, prefix: Tuple[str, ...] = ()) -> Dict[str, Any]:
  """'a/b/c' -> leaf; tensorstore specs and chunked arrays are leaves."""
  if isinstance(tree, dict) and not _is_ts_spec(tree) and (
      '__msgpack_chunked_array__' not in tree):
    out = {}
    for k, v in tree.items():
      out.update(_flatten(v, prefix + (str(k),)))
    return out
  return {'/'.join(prefix): tree}


def _absolute_kvstore(spec: Mapping[str, Any], ckpt_dir: str) -> dict:
  """Kvstore of a T5X spec leaf, resolved against the checkpoint folder."""
  kvstore = spec['kvstore']
  if isinstance(kvstore, str) or not isinstance(kvstore, Mapping):
    raise ValueError(f'unsupported kvstore {kvstore!r}')
  rel = kvstore.get('path', spec.get('path'))
  if rel is None:
    raise ValueError('tensorstore spec has no path')
  if kvstore.get('driver') not in ('file', 'gfile', 'gcs'):
    raise ValueError(f'unsupported kvstore driver {kvstore.get("driver")!r}')
  # Written anywhere, read from this folder.
  return _folder_kvstore(os.path.join(ckpt_dir, rel))


def _folder_kvstore(folder: str) -> dict:
  """The tensorstore kvstore of a local or gs:// folder."""
  folder = folder.rstrip('/') + '/'
  if _storage.is_gcs(folder):
    bucket, prefix = _storage.split_gcs(folder)
    return {'driver': 'gcs', 'bucket': bucket, 'path': prefix}
  return {'driver': 'file', 'path': folder}


def _zarr_spec(kvstore: dict, metadata: Optional[dict], dtype: Any) -> dict:
  spec: Dict[str, Any] = {'driver': 'zarr', 'kvstore': kvstore,
                          # A missing chunk is an error, not zeros.
                          'fill_missing_data_reads': False}
  if dtype is not None:
    spec['dtype'] = dtype
  if metadata:
    spec['metadata'] = metadata
  return spec


def _leaf_kvstore(leaf: Any, ckpt_dir: str) -> dict:
  """Absolute kvstore of a spec leaf or of a PLACEHOLDER://<name> leaf."""
  if isinstance(leaf, str):  # Early orbax: a zarr folder named beside.
    leaf = {'kvstore': {'driver': 'file', 'path': leaf[len(_PLACEHOLDER):]}}
  return _absolute_kvstore(leaf, ckpt_dir)


def _open_args(leaf: Any, kvstore: dict,
               has_zarray: bool) -> Tuple[dict, dict]:
  """(spec, ts.open kwargs) of one T5X tensorstore leaf.

  T5X writes a `.zarray` beside the chunks and, on read, trusts it over the
  spec's chunks/compressor (only the shape must agree). Some copies lack the
  `.zarray` (T5X's own test data does); the spec then stands in for it.
  """
  if isinstance(leaf, str):  # Early orbax: everything is in the .zarray.
    return _zarr_spec(kvstore, None, None), {'open': True}
  meta = dict(leaf.get('metadata') or {})
  dtype = leaf.get('dtype')
  if dtype is None and 'dtype' in meta:
    dtype = np.dtype(meta['dtype']).name
  if has_zarray:
    minimal = {'shape': meta['shape']} if 'shape' in meta else None
    return _zarr_spec(kvstore, minimal, dtype), {'open': True}
  if not {'shape', 'chunks', 'compressor'} <= set(meta):
    raise ValueError(f'no .zarray under {kvstore["path"]} and the spec lacks '
                     'the zarr metadata to stand in for it')
  return (_zarr_spec(kvstore, meta, dtype),
          {'open': True, 'assume_metadata': True})


def _read_ts_leaves(leaves: Dict[str, Any], ckpt_dir: str,
                    path: str, shardings: Optional[Dict[str, Any]] = None,
                    dtype: Any = None) -> Dict[str, Any]:
  """Reads tensorstore leaves {name: spec dict | placeholder} concurrently.

  Each phase (open kvstore, probe .zarray, open array, read) has all leaves
  in flight at once, which matters on GCS; any failure names the parameter.
  With `shardings` ({name: jax Sharding}), each device's slice is read on
  its own into a jax array of that sharding (`_place`): the whole array is
  never read.
  """
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  def phase(calls, what):
    """Starts every call, then waits for each; errors name the parameter."""
    def fail(name, e):
      return CheckpointError(
          f'{path}: cannot {what} parameter {name}: {_ts_message(e)}')

    started = {}
    for name, call in calls.items():
      try:
        started[name] = call()
      except Exception as e:  # pylint: disable=broad-except
        raise fail(name, e) from None
    done = {}
    for name, value in started.items():
      try:
        done[name] = value.result() if isinstance(value, ts.Future) else value
      except Exception as e:  # pylint: disable=broad-except
        raise fail(name, e) from None
    return done

  kv = phase({n: lambda l=l: _leaf_kvstore(l, ckpt_dir)
              for n, l in leaves.items()}, 'locate')
  stores = phase({n: lambda n=n: ts.KvStore.open(kv[n]) for n in leaves},
                 'open the folder of')
  probes = phase({n: lambda n=n: stores[n].read('.zarray') for n in leaves},
                 'read the .zarray of')

  def open_array(n):
    spec, kwargs = _open_args(leaves[n], kv[n],
                              probes[n].state != 'missing')
    return ts.open(spec, **kwargs)

  arrays = phase({n: lambda n=n: open_array(n) for n in leaves}, 'open')
  if shardings is not None:
    return phase({n: lambda n=n: _place(
        arrays[n], shardings[n], dtype,
        read=lambda a, idx: a[idx].read().result()) for n in leaves},
                 'read (a missing or corrupt chunk?)')
  values = phase({n: lambda n=n: arrays[n].read() for n in leaves},
                 'read (a missing or corrupt chunk?)')
  return {n: np.asarray(v) for n, v in values.items()}


def _place(array: Any, sharding: Any, dtype: Any,
           read: Callable[[Any, Tuple[slice, ...]], Any] = (
               lambda a, idx: a[idx])) -> jax.Array:
  """A jax array of `sharding` whose shards are `read(array, index)`.

  Each device's slice is read (and cast to `dtype`) and put on that device
  alone: the whole array never sits on one device.
  """
  def shard(index):
    value = np.asarray(read(array, index))
    return value if dtype is None else value.astype(dtype)

  return jax.make_array_from_callback(tuple(array.shape), sharding, shard)


def _check_sharded(names, shardings: Dict[str, Any], source: str) -> None:
  """ValueError unless every stored parameter has a sharding."""
  missing = sorted(set(names) - set(shardings))
  if missing:
    raise ValueError(
        f'{source}: no sharding given for {len(missing)} stored parameters '
        f'(e.g. {", ".join(missing[:4])}): `shardings` must cover the '
        "checkpoint's tree (partitioning.param_shardings of its model).")


def _load_msgpack(path: str, shardings: Optional[Dict[str, Any]] = None,
                  dtype: Any = None) -> Dict[str, Any]:
  """Flat {'a/b': array} params of a legacy / early-orbax msgpack file.

  With `shardings` ({name: Sharding}): jax arrays of those shardings, read
  shard by shard (`_place`), cast to `dtype`.
  """
  import msgpack  # pylint: disable=g-import-not-at-top

  data = _storage.read_bytes(path)
  try:
    target, _ = _read_target_subtree(data)
  except _NotT5X as e:
    raise CheckpointError(f'{path}: not a T5X checkpoint: {e}') from None
  except (ValueError, msgpack.UnpackException, TypeError) as e:
    # OutOfData (truncated), FormatError, StackError, ExtraData, ...
    raise CheckpointError(
        f'{path}: not a readable T5X msgpack checkpoint (corrupt or '
        f'truncated; {len(data)} bytes): {type(e).__name__}: {e}'
    ) from None
  result: Dict[str, Any] = {}
  stored = {}  # Leaves whose arrays live in tensorstore.
  for name, leaf in (_flatten(target) if target else {}).items():
    try:
      if isinstance(leaf, msgpack.ExtType):
        result[name] = _decode_ext(leaf.code, leaf.data)
      elif isinstance(leaf, dict) and '__msgpack_chunked_array__' in leaf:
        chunks, shape = leaf['chunks'], leaf['shape']
        parts = [chunks[str(i)] for i in range(len(chunks))]
        parts = [_decode_ext(p.code, p.data) if isinstance(p, msgpack.ExtType)
                 else p for p in parts]
        result[name] = np.concatenate(parts).reshape(
            [shape[str(i)] for i in range(len(shape))])
      elif _is_ts_spec(leaf) or (isinstance(leaf, str) and
                                 leaf.startswith(_PLACEHOLDER)):
        stored[name] = leaf
      elif isinstance(leaf, dict) and not leaf:
        continue  # An empty subtree.
      else:
        result[name] = np.asarray(leaf)
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(
          f'{path}: cannot decode parameter {name}: {type(e).__name__}: {e}'
      ) from None
  if shardings is not None:
    _check_sharded(list(result) + list(stored), shardings, path)
    result = {n: _place(v, shardings[n], dtype) for n, v in result.items()}
  if stored:
    result.update(_read_ts_leaves(stored, os.path.dirname(path), path,
                                  shardings, dtype))
  return result


def _ts_message(e: Exception) -> str:
  text = str(e).splitlines()[0] if str(e) else ''
  return f'{type(e).__name__}: {text}'


# ----------------------------------------------------------------------------
# Orbax.
# ----------------------------------------------------------------------------


def _orbax_name(key: str) -> str:
  """The parameter an orbax OCDBT key belongs to: 'target.a.b/0.0' ->
  'a/b' (any other key: its array, 'state.step')."""
  array = key.split('/')[0]
  return (array[len('target.'):].replace('.', '/')
          if array.startswith('target.') else array)


# An OCDBT b-tree's reference to bytes of a file: 'btreenode:<prefix>:<path>:
# <offset>:<length>' (a node) or 'value:...' (a value not inline).
_OCDBT_REF = re.compile(r'^(?:btreenode|value):([^:]*):(.+):(\d+):(\d+)$')


def _cut_short(state_dir: str, problem: str) -> CheckpointError:
  return CheckpointError(f'{state_dir}: incomplete checkpoint (a copy cut '
                         f'short?): {problem}')


def _check_ocdbt(state_dir: str) -> None:
  """Raises a CheckpointError naming every file an OCDBT checkpoint's latest
  version reads that is missing or shorter than it reads (a copy cut short)
  and the arrays whose bytes it holds, before orbax reads any array.

  Reads the b-tree's nodes and one byte at the end of each file, never the
  arrays' bytes (a changed byte is for the checksum manifest to find). An
  orbax checkpoint without OCDBT (no `manifest.ocdbt`) has none to check.
  """
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  if not _storage.isfile(os.path.join(state_dir, 'manifest.ocdbt')):
    return
  base = ts.KvStore.open(_folder_kvstore(state_dir)).result()
  ends, held = _ocdbt_reads(base, state_dir)
  problems = []
  for file, end in sorted(ends.items()):
    try:
      state = base.read(file, byte_range=slice(end - 1, end)).result().state
    except Exception:  # pylint: disable=broad-except
      state = 'short'  # an end past the file's: OUT_OF_RANGE
    if state != 'value':
      names = sorted(held.get(file, ()))
      problems.append(
          f'{os.path.join(state_dir, file)}: '
          + ('missing' if state == 'missing' else f'under {end} bytes')
          + (f' (holds {", ".join(names[:4])}'
             + (f' and {len(names) - 4} more' if len(names) > 4 else '') + ')'
             if names else ''))
  if problems:
    raise _cut_short(state_dir, '; '.join(problems))


def _ocdbt_reads(base, state_dir: str
                 ) -> Tuple[Dict[str, int], Dict[str, Set[str]]]:
  """({file: the bytes it must hold}, {file: the arrays whose bytes it
  holds}) of the latest version of the OCDBT database `base` (a tensorstore
  KvStore of `state_dir`), from its b-tree's nodes alone; a node that does
  not read is a CheckpointError naming its file."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  ends: Dict[str, int] = {}
  held: Dict[str, Set[str]] = {}

  def note(ref: str, key: Optional[bytes]) -> str:
    found = _OCDBT_REF.match(ref)
    if found is None:  # a reference of another form: not checked
      return ref
    prefix, path, offset, length = found.groups()
    file = prefix + path
    ends[file] = max(ends.get(file, 0), int(offset) + int(length))
    if key is not None:
      held.setdefault(file, set()).add(
          _orbax_name(key.decode(errors='replace')))
    return file

  try:
    versions = ts.ocdbt.dump(base).result().get('versions') or []
  except Exception as e:  # pylint: disable=broad-except
    raise _cut_short(state_dir, 'unreadable OCDBT manifest: '
                     f'{_ts_message(e)}') from None
  # The latest version's tree (older ones sit in version-tree nodes).
  nodes = [(versions[-1]['root']['location'], b'')] if versions else []
  while nodes:
    location, prefix = nodes.pop()
    file = note(location, None)
    try:
      node = ts.ocdbt.dump(base, location).result()
    except Exception as e:  # pylint: disable=broad-except
      raise _cut_short(state_dir, f'{os.path.join(state_dir, file)}: '
                       f'unreadable b-tree node ({_ts_message(e)})') from None
    for entry in node['entries']:
      if 'location' in entry:  # a child node: its keys follow its prefix
        nodes.append((entry['location'],
                      prefix + entry.get('subtree_common_prefix', b'')))
      elif 'indirect_value' in entry:
        note(entry['indirect_value'], prefix + entry['key'])
  return ends, held


def _load_orbax(state_dir: str, shardings: Optional[Dict[str, Any]] = None,
                dtype: Any = None) -> Dict[str, Any]:
  """Flat params of an orbax PyTree checkpoint (only its 'target' subtree).

  With `shardings` ({name: Sharding}), orbax restores each parameter
  straight into that sharding (each device's slice read from tensorstore
  on its own), cast to `dtype`; else numpy arrays.
  """
  from etils import epath  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  handler = ocp.PyTreeCheckpointHandler()
  directory = epath.Path(state_dir)
  try:
    meta = handler.metadata(directory)
    tree = getattr(meta, 'tree', meta)
  except Exception as e:  # pylint: disable=broad-except
    raise CheckpointError(
        f'{state_dir}: unreadable orbax metadata: {type(e).__name__}: {e}'
    ) from None
  if 'target' not in tree:
    raise CheckpointError(
        f'{state_dir}: orbax checkpoint has no "target" (params) subtree; '
        f'top-level keys: {sorted(tree)}')
  _check_ocdbt(state_dir)
  item = {'target': tree['target']}
  if shardings is None:
    restore_args = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
  else:
    flat_item = traverse_util.flatten_dict(item['target'], sep='/')
    _check_sharded(flat_item, shardings, state_dir)
    restore_args = {'target': traverse_util.unflatten_dict({
        n: ocp.ArrayRestoreArgs(sharding=shardings[n], dtype=dtype)
        for n in flat_item}, sep='/')}
  # Restore `target` only (older orbax: transforms={} does the same).
  fields = {f.name for f in dataclasses.fields(ocp.args.PyTreeRestore)}
  subset = ({'partial_restore': True} if 'partial_restore' in fields
            else {'transforms': {}})
  try:
    restored = ocp.Checkpointer(handler).restore(
        directory, args=ocp.args.PyTreeRestore(
            item=item, restore_args=restore_args, **subset))
  except Exception as e:  # pylint: disable=broad-except
    raise CheckpointError(
        f'{state_dir}: cannot restore orbax params: {_ts_message(e)}'
    ) from None
  flat = traverse_util.flatten_dict(restored['target'], sep='/')
  if shardings is not None:
    return flat
  return {k: np.asarray(v) for k, v in flat.items()}


def _read_orbax_each(state_dir: str) -> Dict[str, Any]:
  """Each `target` array of an orbax OCDBT checkpoint, read on its own.

  Names the damaged arrays of a checkpoint that failed its manifest check.
  Every array is read with tensorstore and waited for before the next, so
  no read outlives a failure: orbax's restore of a damaged checkpoint stops
  its event loop with tensorstore reads of it still in flight.

  Returns:
    {'a/b': numpy array, or the exception that reading it raised}.
  """
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  ocdbt = {'driver': 'ocdbt', 'base': _folder_kvstore(state_dir)}
  drivers = {'/.zarray': 'zarr', '/zarr.json': 'zarr3'}
  out: Dict[str, Any] = {}
  for key in ts.KvStore.open(ocdbt).result().list().result():
    key = key.decode()
    found = [(key[:-len(end)], d) for end, d in drivers.items()
             if key.endswith(end) and key.startswith('target.')]
    for array, driver in found:
      name = _orbax_name(array)
      try:
        out[name] = ts.open(
            {'driver': driver, 'kvstore': dict(ocdbt, path=array + '/'),
             'fill_missing_data_reads': False}).result().read().result()
      except Exception as e:  # pylint: disable=broad-except
        out[name] = e
  return out


# ----------------------------------------------------------------------------
# Integrity: the checksum manifest.
# ----------------------------------------------------------------------------


def _checkpoint_folder(kind: str, location: str) -> str:
  """The folder whose manifest covers a resolved checkpoint."""
  location = location.rstrip('/')
  if kind == 'orbax' and os.path.basename(location) == _STATE_KEY:
    return os.path.dirname(location)  # checkpoint_<step>/state
  return location if kind == 'orbax' else os.path.dirname(location)


def _verify(kind: str, location: str) -> Optional[manifest.Manifest]:
  """Checks a checkpoint's files against its manifest, if it has one.

  Args:
    kind, location: `_resolve`'s reading of the checkpoint.

  Returns:
    The manifest it matches (None: it has none, noted in the log once).

  Raises:
    CheckpointError: naming every missing, resized or changed file and the
      arrays that no longer read back as saved.
  """
  folder = _checkpoint_folder(kind, location)
  try:
    found = manifest.find(folder)
  except ValueError as e:
    raise CheckpointError(f'{folder}: unreadable checksum manifest: {e} '
                          '(verify=False loads without it)') from None
  if found is None:
    if location not in _NOTED_UNVERIFIED:
      _NOTED_UNVERIFIED.add(location)
      logging.warning('%s: no checksum manifest (%s), so its files are not '
                      'verified; a T5X-written checkpoint has none (python '
                      '-m specdec_jax.checkpoints seal writes one).',
                      location, manifest.MANIFEST)
    return None
  problems = manifest.check_files(found.root, found.files, found.prefix)
  if not problems:
    return found
  arrays = ''
  if found.arrays:  # named from each array read on its own
    read = (_read_orbax_each if kind == 'orbax' else _load_msgpack)
    try:
      bad = manifest.differing_arrays(found.arrays, read(location))
    except Exception as e:  # pylint: disable=broad-except
      arrays = f'; its arrays do not load ({type(e).__name__})'
    else:
      arrays = (f'; arrays that differ: {", ".join(bad)}' if bad else
                '; every array still reads back as saved')
  raise CheckpointError(
      f'{folder}: checkpoint does not match {found.path} (verify=False '
      'skips the check): ' + '; '.join(problems) + arrays)


def seal_checkpoint(path: str) -> str:
  """Writes a checksum manifest into a checkpoint that has none (T5X's own),
  so that every later load, and `verify_checkpoint`, checks its files.

  The manifest records the folder's files as they are now: sha256 and size
  of each (reading every byte once, a file at a time), no array entries
  (the damaged files name the arrays: one folder per array in T5X's
  tensorstore formats, the b-tree's map in orbax's). An orbax checkpoint
  cut short is refused (`_check_ocdbt`), not sealed.

  Args:
    path: what `load_t5x_params` takes (a model dir: its latest step).

  Returns:
    The manifest's path (`<checkpoint folder>/MANIFEST.json`).

  Raises:
    FileExistsError: the checkpoint has a manifest already.
    CheckpointError: an orbax checkpoint that is cut short, or a msgpack
      file not named `checkpoint` (T5X's name), whose folder may hold
      anything.
  """
  kind, location = _resolve(os.fspath(path))
  folder = _checkpoint_folder(kind, location)
  if kind == 'msgpack' and os.path.basename(location) != _CHECKPOINT_FILE:
    raise CheckpointError(
        f'{location}: a manifest covers the whole folder it is in, and this '
        f'file is not in a checkpoint folder of its own (T5X names the file '
        f'{_CHECKPOINT_FILE!r}, in checkpoint_<step>/): move it into one, '
        'then seal that.')
  own = os.path.join(folder, manifest.MANIFEST)
  if _storage.isfile(own):
    raise FileExistsError(f'{own} exists: the checkpoint is sealed already '
                          '(verify it, or remove the file to seal it anew).')
  if kind == 'orbax':
    _check_ocdbt(location)
  return manifest.write(folder, {})


def verify_checkpoint(path: str) -> Dict[str, Any]:
  """Checks a checkpoint's files against its manifest, loading nothing.

  Args:
    path: what `load_t5x_params` takes.

  Returns:
    {'checkpoint': its folder, 'manifest': the manifest's path, 'files',
    'bytes': what it covers}.

  Raises:
    CheckpointError: it has no manifest, or a file is missing, resized or
      changed, or not listed (`load_t5x_params`'s message).
  """
  kind, location = _resolve(os.fspath(path))
  folder = _checkpoint_folder(kind, location)
  found = _verify(kind, location)
  if found is None:
    raise CheckpointError(
        f'{folder}: no checksum manifest ({manifest.MANIFEST}) to verify '
        'against (T5X writes none): seal it once its files are known good '
        '(python -m specdec_jax.checkpoints seal).')
  covered = found.covered()
  return {'checkpoint': folder, 'manifest': found.path,
          'files': len(covered),
          'bytes': sum(e['bytes'] for e in covered.values())}


# ----------------------------------------------------------------------------
# Public API.
# ----------------------------------------------------------------------------


def params_from_flat(flat: Dict[str, Any], source: str,
                     config: Optional[network.T5Config], dtype: Any) -> PyTree:
  """{'a/b': array} -> params tree, checked against `config`, cast to dtype.

  Args:
    flat: the parameters by '/'-joined T5X path.
    source: where they come from (named in network.check_params' message).
    config: if given, the tree must match it (network.check_params).
    dtype: cast every parameter to it; None keeps the dtypes.

  Returns:
    The params tree: nested dicts of jax arrays.

  Raises:
    CheckpointError: a weight is NaN or infinite (after the cast): a
      training run that diverged writes such a checkpoint, and decoding
      it would give tokens that mean nothing (a NaN row's argmax is 0).
  """
  params = traverse_util.unflatten_dict(flat, sep='/') if flat else {}
  if config is not None:
    network.check_params(params, config, source)
  with np.errstate(over='ignore'):  # an overflow is named just below
    params = jax.tree.map(lambda x: jnp.asarray(x, dtype=dtype), params)
  _check_finite(params, source, dtype)
  return params


@jax.jit
def _finite(leaves):
  """One flag per array: whether every element is finite (one program
  per tree; a sharded array is reduced where it lies)."""
  return jnp.stack([jnp.isfinite(x).all() for x in leaves])


def _check_finite(params: PyTree, source: str, dtype: Any) -> None:
  """CheckpointError naming the arrays of `params` with a NaN or an inf."""
  named = traverse_util.flatten_dict(params, sep='/')
  if not named:
    return
  try:  # read now, also where a build is traced (`jax.eval_shape`)
    with jax.ensure_compile_time_eval():
      flags = _finite(list(named.values()))
      # Replicated: this process's copy reads on any mesh.
      finite = np.asarray(flags.addressable_data(0))
  except jax.errors.ConcretizationTypeError:
    return  # the params themselves traced: no values to check
  bad = [name for name, ok in zip(named, finite) if not ok]
  if bad:
    cast = '' if dtype is None else f' once cast to {jnp.dtype(dtype).name}'
    raise CheckpointError(
        f'{source}: {len(bad)} of {len(named)} weight arrays hold NaN or '
        f'infinite values{cast} ({", ".join(bad[:3])}'
        f'{", ..." if len(bad) > 3 else ""}). A training run that diverged '
        'writes such a checkpoint; decoding it would give meaningless '
        'tokens.')


def load_t5x_params(path: str, config: Optional[network.T5Config] = None,
                    dtype: Any = None, verify: bool = True,
                    shardings: Optional[PyTree] = None) -> PyTree:
  """The params (T5X's `target`) of a T5X checkpoint, any format.

  A checkpoint written by `save_t5x_params` is first checked against its
  checksum manifest (every file's sha256 and size), and one inside a folder
  whose shipped-form manifest lists it (the shipped models) against that.
  One without (T5X's own) loads unverified, with a log note once per path.

  Args:
    path: a `checkpoint_<step>` folder, the `checkpoint` file inside it, a
      legacy single-file checkpoint, an orbax `state` folder, or a model dir
      (its latest `checkpoint_<step>` is read). Local or gs://.
    config: if given, the tree must match `T5Model(config)` exactly (names
      and shapes), else ValueError.
    dtype: cast every parameter to this dtype after loading (e.g.
      jnp.bfloat16); None keeps the stored dtypes.
    verify: check the files against the manifest (reads every byte once
      more: False skips it for very large checkpoints, or after a check of
      one's own).
    shardings: None (arrays on the default device), or a params-shaped
      tree of `jax.sharding.Sharding`s (`partitioning.param_shardings` /
      `Partitioner.param_shardings(model)`): each parameter is restored
      straight into its sharding, every device reading only its own slice
      (orbax's sharded restore; tensorstore reads per shard for legacy
      checkpoints; inline msgpack arrays are decoded on the host, then
      sliced per device). The full model never sits on one device.

  Returns:
    The params tree: nested dicts of jax arrays, T5X's names.

  Raises:
    FileNotFoundError: nothing at `path`.
    CheckpointError: (a ValueError) the checkpoint is corrupt, truncated, or a
      tensorstore array or chunk is missing; names the path and parameter.
      An OCDBT checkpoint (orbax's) cut short, with or without a manifest,
      names each missing or short file and its arrays before any array is
      read (from its b-tree alone).
      With a manifest: a file differs from it; names every such file and the
      arrays that no longer read back as saved.
    ValueError: the tree does not match `config`.
  """
  if dtype is not None:
    network.check_float_dtype('load_t5x_params: dtype', dtype)
  path = os.fspath(path)
  kind, location = _resolve(path)
  load = _load_orbax if kind == 'orbax' else _load_msgpack
  if verify:
    _verify(kind, location)
  if shardings is None:
    return params_from_flat(load(location), location, config, dtype)
  flat_shardings = traverse_util.flatten_dict(shardings, sep='/')
  if config is not None:  # Before reading: the tree must fit the config.
    want = network.expected_shapes(config)
    if set(want) != set(flat_shardings):
      raise ValueError(
          f'{location}: shardings do not cover the T5Config\'s parameters '
          f'(missing: {sorted(set(want) - set(flat_shardings))[:4]}, '
          f'extra: {sorted(set(flat_shardings) - set(want))[:4]}).')
  return params_from_flat(load(location, flat_shardings, dtype), location,
                          config, None)


def save_t5x_params(params: PyTree, directory: str, step: int,
                    extra_files: Optional[Mapping[str, bytes]] = None) -> str:
  """Writes `params` as a T5X orbax checkpoint `<directory>/checkpoint_<step>`.

  The layout is what T5X's `OrbaxCheckpointManagerInterface` writes:
  orbax's CheckpointManager with step prefix 'checkpoint' and one item,
  `state`, an OCDBT PyTree checkpoint of T5X's `InferenceState.state_dict()`:
  `{'target': params, 'state': {'step': int32}}`.

  Then `extra_files`, and last the checksum manifest `MANIFEST.json` over
  every file of the folder and every array of `params` (which T5X ignores
  and `load_t5x_params` checks); a save cut short before it leaves a
  checkpoint that loads unverified.

  Args:
    params: a T5X params tree.
    directory: the model dir (created if needed).
    step: the step number of the folder.
    extra_files: {name: bytes} written into the folder (e.g. the optimizer
      state) before the manifest, so it covers them too.

  Returns:
    The path of the new `checkpoint_<step>` folder.

  Raises:
    FileExistsError: that step already exists (T5X never overwrites one).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  if network.is_fused(params):
    raise ValueError(
        'params are in the fused decoding layout (network.for_decoding); '
        'save network.unfuse_params(params, config) instead: checkpoints '
        "keep T5X's parameter tree.")

  directory = os.fspath(directory)
  if not _storage.is_gcs(directory):
    directory = os.path.abspath(directory)
  step_dir = os.path.join(directory, f'checkpoint_{int(step)}')
  if _storage.isdir(step_dir):
    raise FileExistsError(f'Checkpoint already exists: {step_dir}')
  target = jax.tree.map(jnp.asarray, params)
  state = {'target': target, 'state': {'step': jnp.asarray(step, jnp.int32)}}
  options = ocp.CheckpointManagerOptions(
      step_prefix='checkpoint', create=True,
      enable_async_checkpointing=False)
  manager = ocp.CheckpointManager(
      directory, options=options,
      item_handlers={_STATE_KEY: ocp.PyTreeCheckpointHandler(use_ocdbt=True)})
  try:
    manager.save(int(step), args=ocp.args.Composite(
        **{_STATE_KEY: ocp.args.PyTreeSave(state)}), force=True)
    manager.wait_until_finished()
  finally:
    manager.close()
  for name, data in (extra_files or {}).items():
    _storage.write_bytes(os.path.join(step_dir, name), data)
  manifest.write(step_dir, manifest.array_entries(
      traverse_util.flatten_dict(jax.device_get(target), sep='/')))
  return step_dir
