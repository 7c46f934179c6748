"""The box's executable store (tools/accelerator/aot.py): programs compiled
here for a device elsewhere, written, packed, fitted to what a device
command carries, checked and loaded.

A lent device's minutes go to timing only if what it loads is what was
built: a damaged, stale (other code, versions or device) or missing
executable must be named, never run, and a GPU build must compile for the
device it will run on (its recorded topology, its autotune results). On a
CPU the "device" is this machine; the stored run over this store is
tests/tools/test_stored.py.
"""

import argparse
import base64
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import compiled
from specdec_jax import decoding
from specdec_jax import models
from specdec_jax import program_cost
from specdec_jax import network
from tools.accelerator import aot
from tools.accelerator import stored

pytestmark = pytest.mark.usefixtures('fast_xz_packs')


def tiny_decode_program():
  """A tiny T5's greedy decode as a function of its dynamic arguments, its
  params and inputs."""
  model = network.T5Model(models.config(
      't5_1_1_tiny', vocab_size=64, num_encoder_layers=1,
      num_decoder_layers=1))
  params = model.init_params(jax.random.key(0))
  x = jnp.asarray(np.random.default_rng(0).integers(2, 64, (2, 6)),
                  jnp.int32)

  def base(params, x, rng):
    return decoding.temperature_sample(model, params, x, max_decode_len=5,
                                       eos_id=-1, rng=rng)
  return base, params, x


def compile_fresh(lowered):
  """`lowered.compile()` past jax's persistent cache (the suite's): an
  executable read from that cache serializes without its code, as a build
  never does (`stored build` turns the cache off)."""
  before = jax.config.jax_enable_compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  try:
    return lowered.compile()
  finally:
    jax.config.update('jax_enable_compilation_cache', before)


def test_executable_round_trip_on_cpu(tmp_path):
  """The path a GPU run takes with executables built elsewhere, on a CPU:
  compile, serialize, write, load with a new `Store` on the folder, run:
  the jitted program's tokens."""
  fn, params, x = tiny_decode_program()
  store = aot.Store(tmp_path, 'cpu')
  store.describe(jax.devices()[0])
  lowered = jax.jit(fn).lower(params, x, None)
  entry = store.save('base', compile_fresh(lowered), 1.0)
  store.write()
  assert entry['bytes'] > 0 and len(entry['sha256']) == 64
  manifest = json.loads((tmp_path / 'cpu' / aot.MANIFEST).read_text())
  assert manifest['versions']['jax'] == jax.__version__
  assert manifest['device_kind'] == jax.devices()[0].device_kind
  exe, why = aot.Store(tmp_path, 'cpu').load('base')
  assert why == ''
  np.testing.assert_array_equal(exe(params, x, None).tokens,
                                fn(params, x, None).tokens)


def test_packed_executables_load_and_a_corrupt_pack_is_named(tmp_path):
  """`Store.pack`: programs in one xz pack (their own files removed, the
  folder's bytes the pack's), loaded by a new `Store` on the folder and
  run; a damaged pack is named and its programs not loaded."""
  fn, params, x = tiny_decode_program()
  x = x[:1]  # a program no other test compiles (none cached in-process)
  store = aot.Store(tmp_path, 'cpu')
  store.describe(jax.devices()[0])
  lowered = jax.jit(fn).lower(params, x, None)
  compiled_ = compile_fresh(lowered)
  for i, name in enumerate(('a', 'b', 'c')):
    store.save(name, compiled_, priority=i)
  alone = store.total_bytes()
  store.pack()  # fewer than aot.PACK: nothing packed yet
  assert all('pack' not in e for e in store.manifest['programs'].values())
  store.pack(final=True)
  files = sorted(p.name for p in (tmp_path / 'cpu').iterdir())
  assert files == ['manifest.json', 'pack-0.xz']
  assert store.total_bytes() == (tmp_path / 'cpu' / 'pack-0.xz').stat(
      ).st_size < alone
  again = aot.Store(tmp_path, 'cpu')
  assert again.built('b')
  for name in ('a', 'c'):
    exe, why = again.load(name)
    assert why == ''
    np.testing.assert_array_equal(exe(params, x, None).tokens,
                                  fn(params, x, None).tokens)
  pack = tmp_path / 'cpu' / 'pack-0.xz'
  pack.write_bytes(pack.read_bytes()[:-20] + bytes(20))
  exe, why = aot.Store(tmp_path, 'cpu').load('b')
  assert exe is None and 'pack-0.xz is corrupt' in why


def test_a_store_fits_a_limit_by_dropping_its_last_programs(tmp_path):
  """`Store.fit`: the programs of lowest priority go until the folder
  weighs at most the limit (what a device command carries beside the
  working tree: `stored build --limit_mib`); a pack that loses one is
  packed again with the rest, and they load and run; a limit below any
  program empties it."""
  fn, params, x = tiny_decode_program()
  x = x[:1, :4]  # a program no other test compiles (none cached in-process)
  compiled_ = compile_fresh(jax.jit(fn).lower(params, x, None))
  store = aot.Store(tmp_path, 'cpu')
  store.describe(jax.devices()[0])
  names = [f'p{i}' for i in range(aot.PACK + 2)]  # two packs
  for i, name in enumerate(names):
    store.save(name, compiled_, priority=i)
  store.pack()  # the first PACK packed, two alone
  assert len(store.manifest['packs']) == 1
  store.pack(final=True)
  full = store.total_bytes()
  assert store.fit(full) == [] and store.total_bytes() == full
  dropped = store.fit(full - 1)
  kept = names[:len(names) - len(dropped)]
  assert dropped == names[len(kept):] and kept
  assert store.total_bytes() <= full - 1
  again = aot.Store(tmp_path, 'cpu')
  assert sorted(again.manifest['programs']) == sorted(kept)
  assert sorted(p.name for p in (tmp_path / 'cpu').iterdir()) == sorted(
      ['manifest.json', *again.manifest['packs']])
  assert again.total_bytes() == sum(
      (tmp_path / 'cpu' / f).stat().st_size for f in again.manifest['packs'])
  exe, why = again.load(kept[-1])
  assert why == ''
  np.testing.assert_array_equal(exe(params, x, None).tokens,
                                fn(params, x, None).tokens)
  assert again.fit(0) == kept
  assert [p.name for p in (tmp_path / 'cpu').iterdir()] == ['manifest.json']
  # Priorities that no longer follow the packs (a build for another plan
  # gives each program its new place): the last by priority go first,
  # whichever pack holds them.
  for i, name in enumerate(names):
    again.save(name, compiled_, priority=i)
  again.pack(final=True)
  order = dict(zip(names, [100, *range(1, aot.PACK), 50, 51]))
  for name, priority in order.items():  # the first pack's first: last
    again.manifest['programs'][name]['priority'] = priority
  dropped = again.fit(int(0.6 * again.total_bytes()))
  assert dropped == sorted(order, key=order.get)[-len(dropped):]
  assert {names[0], names[-1]} <= set(dropped)


# XLA's autotune results in text form as a GPU run writes them (one entry
# of an H200's file): keyed by a hash of the device's description.
AUTOTUNE_TEXT = """entries {
  key {
    target {
      device: "ed0e56ab8b2a0ecb"
      hlo_fingerprint: "00d11511014891a342e4f037ddee131f"
    }
    environment {
      codegen_version: "fe9062d0fff82a66"
    }
  }
  value {
    optimal_config {
      backend: NATIVE_EMITTER
    }
  }
}
"""


def test_a_gpu_build_takes_the_devices_autotune_results(tmp_path):
  """Without the device's autotune results a GPU build leaves GEMMs to
  cuBLAS; with them it loads them and compiles for the device they were
  timed on (its twin, from the run's device facts: XLA keys them by the
  device); other flags make a build start afresh. The untuned flags are
  options XLA knows (a misspelt one is refused by name)."""
  untuned = program_cost.UNTUNED_OPTIONS
  assert aot.build_flags('gpu') == list(aot.UNTUNED_FLAGS) == [
      f'--{k}={str(v).lower()}' for k, v in untuned.items()]
  assert aot.build_flags('tpu') == aot.build_flags('cpu') == []
  lowered = jax.jit(lambda a: a @ a).lower(jnp.ones((4, 4)))
  lowered.compile(compiler_options=dict(program_cost.UNTUNED_OPTIONS))
  with pytest.raises(Exception, match='No such compile option'):
    lowered.compile(compiler_options={'xla_gpu_autotune_levle': 0})
  results = tmp_path / aot.AUTOTUNE_FILE
  results.write_text(AUTOTUNE_TEXT)
  assert aot.build_flags('gpu', results) == [
      f'--xla_gpu_load_autotune_results_from={results}']
  device = aot.autotune_device(AUTOTUNE_TEXT)
  assert device == 'ed0e56ab8b2a0ecb' and aot.autotune_device(
      'version: 3\n') is None
  assert aot.autotune_record(results, 'a.textproto') == dict(
      file='a.textproto', sha256=aot.sha256(AUTOTUNE_TEXT.encode()),
      device=device)
  with pytest.raises(checks.InputError, match='needs --device_facts'):
    stored.build_device('gpu:h200', results, None)
  # A store of the format before programs were named by their fingerprints
  # is refused, not read as empty (every program compiled on the device).
  (tmp_path / 'old' / 'cpu').mkdir(parents=True)
  (tmp_path / 'old' / 'cpu' / aot.MANIFEST).write_text(json.dumps(
      {'format': 1, 'target': 'cpu', 'programs': {'sha256_ab': {}}}))
  with pytest.raises(checks.InputError, match='a store of another format'):
    aot.Store(tmp_path / 'old', 'cpu')
  # A store built otherwise is dropped by the next build's describe.
  store = aot.Store(tmp_path, 'cpu')
  cpu = jax.devices()[0]
  store.describe(cpu)
  store.dir.mkdir(parents=True)
  (store.dir / 'p.xla.zz').write_bytes(b'x')
  store.manifest['programs']['p'] = dict(file='p.xla.zz')
  store.describe(cpu)
  assert store.built('p')
  store.describe(cpu, xla_flags=aot.build_flags('gpu'))
  assert not store.built('p') and not (store.dir / 'p.xla.zz').exists()


def test_a_run_records_its_devices_topology(monkeypatch):
  """A run on a GPU or TPU records its devices' topology as XLA serializes
  it (what a build compiles the device's twin from), and why not when it
  cannot; a CPU run records none."""
  gpu = argparse.Namespace(platform='gpu', device_kind='NVIDIA H100',
                           client=None, memory_stats=dict)
  served = []

  class Topology:
    def serialize(self):
      served.append(1)
      return b'\x08\x01topology'

  monkeypatch.setattr(aot.topologies, 'get_attached_topology',
                      lambda platform: Topology() if platform == 'gpu' else
                      None)
  facts = aot.device_facts(gpu)
  assert served and aot.device_topology(facts) == b'\x08\x01topology'
  assert facts['topology'] == base64.b64encode(b'\x08\x01topology').decode()
  assert 'topology' not in aot.device_facts(jax.devices('cpu')[0])
  monkeypatch.setattr(aot.topologies, 'get_attached_topology',
                      lambda platform: 1 / 0)
  failed = aot.device_facts(gpu)
  assert aot.device_topology(failed) is None
  assert 'ZeroDivisionError' in failed['topology_error']


def test_a_recorded_topology_must_be_the_targets(monkeypatch):
  """The twins of a run's devices are only those of the build's target:
  a topology this jax cannot read, or of another platform or size, is a
  named error."""
  twins = aot.twin_devices.__wrapped__  # uncached: the class is patched
  gpu = argparse.Namespace(platform='cuda')

  class Description:
    devices = (gpu,)

    @staticmethod
    def deserialize(data):
      if data != b'one gpu':
        raise RuntimeError('unreadable')
      return Description

  monkeypatch.setattr(aot.topologies, 'TopologyDescription', Description)
  assert twins(compiled.get_target('gpu:h100'), b'one gpu') == (gpu,)
  with pytest.raises(ValueError, match="'gpu:h100x8' .*has 1 gpu devices"):
    twins(compiled.get_target('gpu:h100x8'), b'one gpu')
  with pytest.raises(ValueError, match="'tpu:v5e:1x1' .*has 1 gpu devices"):
    twins(compiled.get_target('tpu:v5e:1x1'), b'one gpu')
  with pytest.raises(ValueError, match='cannot read the recorded device'):
    twins(compiled.get_target('gpu:h100'), b'odd')


@pytest.mark.parametrize('damage, why', [
    ('corrupt', 'checksum mismatch'), ('versions', 'versions differ'),
    ('device', 'built for'),
    ('missing', 'missing file')])
def test_an_unloadable_executable_is_named(tmp_path, damage, why):
  """A corrupt, version-mismatched, other-device or missing
  executable is not loaded, and `load` says why (the stored run then
  compiles that program on the device and logs it); a build into a folder
  of stale programs starts afresh."""
  fn, params, x = tiny_decode_program()
  store = aot.Store(tmp_path, 'cpu')
  store.describe(jax.devices()[0])
  lowered = jax.jit(fn).lower(params, x, None)
  path = tmp_path / 'cpu' / store.save('base',
                                       compile_fresh(lowered))['file']
  if damage == 'corrupt':
    path.write_bytes(path.read_bytes()[:-10] + b'0123456789')
  elif damage == 'versions':
    store.manifest['versions']['jaxlib'] = '0.0.1'
  elif damage == 'device':
    store.manifest['device_kind'] = 'NVIDIA H100 80GB HBM3'
  else:
    path.unlink()
  store.write()
  again = aot.Store(tmp_path, 'cpu')
  exe, said = again.load('base')
  assert exe is None and why in said
  if damage in ('versions', 'device'):
    # A build into this folder now starts afresh: the stale program (and
    # its file) is dropped, so it is built again, not skipped as built.
    assert again.built('base')
    again.describe(jax.devices()[0])
    assert not again.built('base') and not path.exists()
