"""Executables compiled here for a device elsewhere: write, check, load.

A device lease is short and compiling the T5 1.1-XXL-cost decode loops
takes most of it, so the programs are compiled ahead of time on a machine
without the device, for its compile-only twin (`devices`: the CUDA
plugin's or libtpu's compile-only devices, `specdec_jax.compiled`'s
targets), with the device image's jax, jaxlib and plugin versions, and
serialized (`jax.experimental.serialize_executable`) into a folder the
device command carries:

  <root>/<target>/manifest.json    format, versions, target, programs
  <root>/<target>/<program>.xla.zz  zlib(pickle(payload, in_tree, out_tree))
  <root>/<target>/pack-<n>.xz       xz of `PACK` programs' pickles, joined

A program is written alone (zlib) when compiled; `Store.pack` packs them,
`PACK` in priority order to one xz stream (like programs: about 40% of
their zlib bytes).

`Store.load` hands back the executable, or None and why, so that a
caller compiles that program on the device instead and says so. A program
is named by its fingerprint (`scaffold.fingerprint`), so a change that
alters it gives it a new name. `device_facts` (with the device's topology
as XLA serializes it) lets the next build compile for a twin of that very
device (`twin_devices`), for which the device's autotune results match.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import lzma
import os
import pathlib
import pickle
import re
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax.experimental import serialize_executable
from jax.experimental import topologies

from specdec_jax import checks
from specdec_jax import compiled
from specdec_jax import program_cost
from specdec_jax.bench import report

FORMAT = 2  # 2: programs named by their fingerprints ('sha256:...')
MANIFEST = 'manifest.json'
SUFFIX = '.xla.zz'
PACK = 32  # programs per xz pack, of a dictionary that spans them:
XZ_PRESET = 9  # a store of like programs 15% smaller than 8 at preset 6

# A compile-only GPU cannot autotune: its default GEMM tiles ran t(1) 2.5x
# slower on an H100. So a GPU build takes the device's own autotune results
# (`AUTOTUNE_FILE`, which a GPU run writes) with its twin, or leaves the
# GEMMs to cuBLAS (`UNTUNED_FLAGS`); a run checks the first target-call loop
# it loads (`stored.Provider`). The README tells the measurements.
AUTOTUNE_FILE = 'autotune.textproto'
UNTUNED_FLAGS = tuple(f'--{k}={str(v).lower()}'
                      for k, v in program_cost.UNTUNED_OPTIONS.items())


def build_flags(platform: str, autotune: Optional[pathlib.Path] = None
                ) -> List[str]:
  """The XLA flags of a build for `platform`: a GPU's autotune results
  `autotune` (a file a run on it wrote, `dump_flags`: a kernel they lack
  gets XLA's default), else `UNTUNED_FLAGS`; none for a CPU or TPU."""
  if platform != 'gpu':
    return []
  return [f'--xla_gpu_load_autotune_results_from={autotune}'] if (
      autotune is not None) else list(UNTUNED_FLAGS)


def dump_flags(path: pathlib.Path) -> List[str]:
  """The XLA flags with which a GPU run writes its programs' autotune
  results to `path` (all, after each compile); a CPU or TPU ignores them."""
  return [f'--xla_gpu_dump_autotune_results_to={path}']


def rewrite_autotune_results() -> None:
  """Compiles one small matmul on the default device, so that XLA writes
  the autotune results file (`dump_flags`) once more with no other compile
  beside it: XLA rewrites the file after each compile, and two compiles at
  once could leave it garbled."""
  x = jax.numpy.ones((16, 16), jax.numpy.float32)
  jax.jit(lambda a, b: a @ b + 1.0).lower(x, x).compile()


def autotune_device(text: str) -> Optional[str]:
  """The device XLA keyed the results of an autotune results file (text)
  by: the first `device: "..."`, or None when it holds no result."""
  m = re.search(r'device:\s*"([^"]*)"', text)
  return m.group(1) if m else None


def autotune_record(path: pathlib.Path, name: str) -> Dict[str, Any]:
  """What a store's manifest says of the autotune results file at `path`
  (read once): its `name`, sha256 and device (`autotune_device`)."""
  data = path.read_bytes()
  return dict(file=name, sha256=sha256(data),
              device=autotune_device(data.decode()))


def runtime_versions(platform: str) -> Dict[str, str]:
  """The versions an executable for `platform` must match: jax, jaxlib
  and that platform's plugin (a CPU executable needs no plugin)."""
  plugin = {'gpu': 'cuda', 'cuda': 'cuda', 'tpu': 'libtpu'}.get(platform)
  return {k: v for k, v in report.versions().items()
          if k in ('jax', 'jaxlib') or (plugin and plugin in k)}


def file_name(text: str) -> str:
  """`text` (a target's name, a program's fingerprint) as a file name."""
  return re.sub(r'[^A-Za-z0-9_.@=+-]', '_', text)


def target_of(device) -> str:
  """The store folder's target for `device`: its compile-only target's
  name (`specdec_jax.compiled.TARGETS`: what a build for it is named),
  'cpu', or its kind."""
  if device.platform == 'cpu':
    return 'cpu'
  for name, target in compiled.TARGETS.items():
    if target.chips == 1 and target.spec.name == device.device_kind:
      return name
  return device.device_kind


def device_facts(device: Any = None) -> Dict[str, Any]:
  """What jax exposes of `device` (default: the first): kind, platform,
  memory, compute capability, cores, the versions of this process, and
  for a GPU or TPU the topology of this process's devices of its platform
  as XLA serializes it (base64; `device_topology`).

  A GPU's facts hold what a `GpuTargetConfigProto` needs beyond the
  published figures (`compiled.CHIPS`), so a later build can match it.
  """
  device = device or jax.devices()[0]
  out = dict(platform=device.platform, device_kind=device.device_kind,
             versions=report.versions())
  for name in ('compute_capability', 'core_count', 'num_cores'):
    value = getattr(device, name, None)
    if value is not None:
      out[name] = value
  try:  # not every backend reports them
    out['memory_bytes'] = (device.memory_stats() or {}).get('bytes_limit')
    out['platform_version'] = device.client.platform_version
  except Exception:  # pylint: disable=broad-except
    pass
  if device.platform in ('gpu', 'tpu'):
    try:
      out['topology'] = base64.b64encode(topologies.get_attached_topology(
          device.platform).serialize()).decode('ascii')
    except Exception as e:  # pylint: disable=broad-except
      out['topology_error'] = repr(e)[:300]  # an older jax, or a backend
  return out


def device_topology(facts: Mapping[str, Any]) -> Optional[bytes]:
  """The serialized topology of the devices a run had (`device_facts`),
  which `twin_devices` builds the compile-only twins of; None when the
  run recorded none."""
  text = facts.get('topology')
  return base64.b64decode(text) if text else None


@functools.lru_cache(maxsize=None)
def twin_devices(target: Any, topology: bytes) -> Tuple[Any, ...]:
  """The compile-only twins of the devices a run had, from their topology
  as XLA serialized it (`device_topology`): XLA's own description of them,
  every field. `target`: the `compiled.Target` a build is for (`name`,
  `platform`, `devices`), which the topology must match.

  Raises:
    ValueError: this jax cannot read `topology`, or it is not `target`'s.
  """
  # As `compiled.devices`: no libtpu lock file, no CUDA driver check.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  try:
    jax.devices()  # starts the plugins, whose API reads the topology
    out = tuple(topologies.TopologyDescription.deserialize(topology).devices)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'target {target.name!r}: jax {jax.__version__} cannot '
                     f'read the recorded device topology ({e!r:.200})') from e
  platform = {'cuda': 'gpu'}.get(out[0].platform, out[0].platform) if (
      out) else None
  if platform != target.platform or len(out) != target.devices:
    raise ValueError(f'target {target.name!r} ({target.devices} '
                     f'{target.platform} devices): the recorded topology has '
                     f'{len(out)} {platform} devices')
  return out


def check_compiles(device) -> None:
  """Compiles a tiny program for `device`: raises what the compiler says
  if it cannot compile for it at all (e.g. a twin this jax misreads)."""
  x = jax.ShapeDtypeStruct((8,), jnp.float32,
                           sharding=jax.sharding.SingleDeviceSharding(device))
  jax.jit(lambda a: a + 1.0).lower(x).compile()


def sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


class Store:
  """A folder (`dir`: `<root>/<target>`) of serialized executables for one
  target, with a `manifest`: {'format', 'target', 'device_kind', 'platform',
  'versions', 'target_config', 'xla_flags', 'autotune', 'packs': {file:
  bytes}, 'programs': {name: {file, sha256, bytes, compile_s, priority;
  packed: pack, offset, length, raw_sha256}}}."""

  def __init__(self, root: pathlib.Path, target: str):
    self.dir = pathlib.Path(root) / file_name(target)
    path = self.dir / MANIFEST
    self.manifest: Dict[str, Any] = (
        report.read_json(path) if path.is_file() else
        dict(format=FORMAT, target=target, programs={}, packs={}))
    if self.manifest['format'] != FORMAT:  # its programs named otherwise
      raise checks.InputError(f'{path}: a store of another format: build it')
    self._unpacked: Dict[str, bytes] = {}  # pack file -> its bytes

  def describe(self, device: Any, target_config: Optional[str] = None,
               xla_flags: Sequence[str] = (),
               autotune: Optional[Mapping[str, Any]] = None,
               **extra) -> None:
    """Records the target (its compile-only device and config), these
    versions and how XLA was told to build (`build_flags`, and the
    autotune results file's name, sha256 and device). Programs built for
    another device kind or config, with other versions, flags or autotune
    results are dropped (their files too): they could not load or would
    not be the same programs, and a build builds them again."""
    header = dict(device_kind=device.device_kind, platform=device.platform,
                  versions=runtime_versions(device.platform),
                  target_config=target_config, xla_flags=list(xla_flags),
                  autotune=None if autotune is None else dict(autotune))
    if any(self.manifest.get(k) != v for k, v in header.items()):
      for entry in self.manifest['programs'].values():
        (self.dir / entry['file']).unlink(missing_ok=True)
      for file in self.manifest['packs']:
        (self.dir / file).unlink(missing_ok=True)
      self.manifest.update(programs={}, packs={})
      self._unpacked.clear()
    self.manifest.update(header, **extra)

  def save(self, name: str, compiled, compile_s: float = 0.0,
           priority: int = 0) -> Dict[str, Any]:
    """Serializes `compiled` as program `name`; returns its entry
    (`compile_s`: the seconds of its lowering and compile)."""
    payload, in_tree, out_tree = serialize_executable.serialize(compiled)
    data = zlib.compress(pickle.dumps((payload, in_tree, out_tree)), 6)
    self.dir.mkdir(parents=True, exist_ok=True)
    file = file_name(name) + SUFFIX
    (self.dir / file).write_bytes(data)
    entry = self.manifest['programs'][name] = dict(
        file=file, sha256=sha256(data), bytes=len(data),
        serialized_bytes=len(payload), compile_s=round(compile_s, 2),
        priority=priority)
    return entry

  def write(self) -> None:
    self.dir.mkdir(parents=True, exist_ok=True)
    (self.dir / MANIFEST).write_text(
        json.dumps(self.manifest, indent=1, sort_keys=True))

  def total_bytes(self) -> int:
    """The bytes of the folder's files: packs and unpacked programs."""
    return sum(self.manifest['packs'].values()) + sum(
        e['bytes'] for e in self.manifest['programs'].values()
        if 'pack' not in e)

  def built(self, name: str) -> bool:
    """Whether program `name` is in the folder (packed or alone)."""
    entry = self.manifest['programs'].get(name)
    return entry is not None and (self.dir / entry.get(
        'pack', entry['file'])).is_file()

  def _raw(self, name: str) -> bytes:
    """Program `name`'s pickle, from its own file or its pack."""
    entry = self.manifest['programs'][name]
    if 'pack' not in entry:
      return zlib.decompress((self.dir / entry['file']).read_bytes())
    if entry['pack'] not in self._unpacked:
      self._unpacked[entry['pack']] = lzma.decompress(
          (self.dir / entry['pack']).read_bytes())
    return self._unpacked[entry['pack']][
        entry['offset']:entry['offset'] + entry['length']]

  def pack(self, final: bool = False) -> None:
    """Packs the unpacked programs, `PACK` at a time in priority order (their
    own files removed); `final`: all, the packed ones again (so packs
    follow priority), the last pack however few."""
    programs, packs = self.manifest['programs'], self.manifest['packs']
    todo = sorted((e['priority'], n) for n, e in programs.items()
                  if final or 'pack' not in e)
    old = set(packs) if final else set()
    while len(todo) >= PACK or (final and todo):
      names, todo = [n for _, n in todo[:PACK]], todo[PACK:]
      raws = [self._raw(n) for n in names]
      alone = [programs[n]['file'] for n in names if 'pack' not in programs[n]]
      number = len(packs)
      while f'pack-{number}.xz' in packs:
        number += 1
      self._write_pack(f'pack-{number}.xz', names, raws)
      for file in alone:
        (self.dir / file).unlink()
    for file in old - {e.get('pack') for e in programs.values()}:
      (self.dir / file).unlink()
      del packs[file]
      self._unpacked.pop(file, None)
    self.write()

  def _write_pack(self, file: str, names: Sequence[str],
                  raws: Sequence[bytes]) -> None:
    """Writes pack `file` (the xz of `raws` joined) of programs `names` and
    records where each one is in it."""
    data = lzma.compress(b''.join(raws), preset=XZ_PRESET)
    (self.dir / file).write_bytes(data)
    self.manifest['packs'][file] = len(data)
    offset = 0
    for n, raw in zip(names, raws):
      self.manifest['programs'][n].update(
          pack=file, offset=offset, length=len(raw), raw_sha256=sha256(raw))
      offset += len(raw)
    self.write()

  def fit(self, limit: int) -> List[str]:
    """Drops the programs of lowest priority (the highest number) until the
    folder weighs at most `limit` bytes, returned in priority order: a round
    drops as many as their shares of their packs' bytes say the excess
    needs, then packs each pack that lost one again, once."""
    programs, packs = self.manifest['programs'], self.manifest['packs']
    if any('pack' not in e for e in programs.values()):
      self.pack(final=True)
    dropped = []
    while packs and self.total_bytes() > limit:
      over, touched = self.total_bytes() - limit, set()
      raw = {f: sum(e['length'] for e in programs.values() if e['pack'] == f)
             for f in packs}
      for name in sorted(programs, key=lambda n: (programs[n]['priority'], n),
                         reverse=True):
        if over <= 0:
          break
        entry = programs.pop(name)
        over -= packs[entry['pack']] * entry['length'] / raw[entry['pack']]
        touched.add(entry['pack'])
        dropped.insert(0, name)
      for file in sorted(touched):
        rest = sorted((n for n, e in programs.items() if e['pack'] == file),
                      key=lambda n: programs[n]['offset'])
        raws = [self._raw(n) for n in rest]
        (self.dir / file).unlink()
        del packs[file]
        self._unpacked.pop(file, None)
        if rest:
          self._write_pack(file, rest, raws)
    self.write()
    return dropped

  def check(self, name: str, device: Any) -> Tuple[Optional[bytes], str]:
    """(the program's pickle, '') if program `name` may load on `device`,
    else (None, why not)."""
    entry = self.manifest['programs'].get(name)
    if entry is None:
      return None, 'not built'
    file = entry.get('pack', entry['file'])
    path = self.dir / file
    if not path.is_file():
      return None, f'missing file {file}'
    if 'pack' in entry:
      try:
        raw = self._raw(name)
      except lzma.LZMAError as e:
        return None, f'checksum mismatch ({file} is corrupt: {e})'
      if sha256(raw) != entry['raw_sha256']:
        return None, f'checksum mismatch ({file} is corrupt)'
    else:
      data = path.read_bytes()
      if sha256(data) != entry['sha256']:
        return None, f'checksum mismatch ({file} is corrupt)'
      raw = zlib.decompress(data)
    built, here = self.manifest.get('versions', {}), runtime_versions(
        device.platform)
    if built != here:
      return None, f'versions differ: built with {built}, running {here}'
    if self.manifest.get('device_kind') != device.device_kind:
      return None, (f'built for {self.manifest.get("device_kind")!r}, '
                    f'running on {device.device_kind!r}')
    return raw, ''

  def load(self, name: str, device: Any = None) -> Tuple[Any, str]:
    """(executable, '') for program `name` (its fingerprint) on `device`
    (default: the first), or (None, why it cannot load)."""
    device = device or jax.devices()[0]
    data, why = self.check(name, device)
    if data is None:
      return None, why
    try:
      payload, in_tree, out_tree = pickle.loads(data)
      return serialize_executable.deserialize_and_load(
          payload, in_tree, out_tree, execution_devices=[device]), ''
    except Exception as e:  # pylint: disable=broad-except
      return None, f'the runtime refused it: {e!r}'[:500]
