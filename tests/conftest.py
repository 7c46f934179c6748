"""Shared tiny models for the test suite (compiled once per session)."""

import contextlib
import functools
import gc
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax import loading
from specdec_jax import network
from specdec_jax import shipped
from specdec_jax import synthetic

import fake_gcs  # pylint: disable=g-bad-import-order

# gs:// addresses in tests: this process's GCS clients point at a local port
# before orbax first builds its tensorstore context (the `gcs` fixture).
fake_gcs.configure()

FIXTURES = (pathlib.Path(__file__).resolve().parents[1].parent / 'shared' /
            'fixtures' / 't5x')
if 'SPECDEC_FIXTURES' in os.environ:
  FIXTURES = pathlib.Path(os.environ['SPECDEC_FIXTURES'])

# T5 1.1 (gated-gelu, separate logits) and T5 1.0 (relu, tied logits), tiny.
TINY_V11 = network.T5Config(
    vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
    num_encoder_layers=2, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
)
TINY_V10 = TINY_V11.replace(mlp_activations=('relu',),
                            logits_via_embedding=True)


def numpy_params(config, seed: int, emb_scale: float):
  """numpy-random parameters in `T5Model(config)`'s tree, at no compile
  cost (T5X's initializers run eagerly: ~10 s a model on CPU).

  Norm scales are random (not T5X's ones) so that a wrong norm rescaling or a
  misplaced scale entry shows up in the logits; embeddings have standard
  deviation `emb_scale`, kernels 1 / sqrt(fan-in) (the query's over
  sqrt(head_dim) too: T5 folds it in).
  """
  shapes = network.T5Model(config).param_shapes()
  rng = np.random.default_rng(seed)

  def fill(path, x):
    name = jax.tree_util.keystr(path)
    if name.endswith("['scale']"):
      return rng.uniform(0.5, 1.5, x.shape).astype(np.float32)
    if name.endswith("['rel_embedding']"):
      return rng.normal(0, 0.5, x.shape).astype(np.float32)
    if name.endswith("['embedding']"):
      return rng.normal(0, emb_scale, x.shape).astype(np.float32)
    std = 1 / np.sqrt(x.shape[0])
    if "['query']" in name:  # T5 folds 1/sqrt(head_dim) into the query.
      std /= np.sqrt(config.head_dim)
    return rng.normal(0, std, x.shape).astype(np.float32)

  return jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.fixture(scope='session')
def gcs_server():
  """The URL of a GCS served on this machine for the session
  (`fake_gcs.serving`)."""
  with fake_gcs.serving() as url:
    yield url


@pytest.fixture
def gcs(gcs_server):  # pylint: disable=redefined-outer-name
  """'gs://<bucket>' of an empty bucket of its own on the session's GCS,
  for the tests of gs:// addresses."""
  return fake_gcs.new_bucket(gcs_server)


@pytest.fixture(scope='session')
def np_v11():
  """Tiny T5 1.1 (gated gelu, separate logits), numpy-random weights
  (`numpy_params`: no compile)."""
  return network.T5Model(TINY_V11), numpy_params(TINY_V11, 0, 1.0)


@pytest.fixture(scope='session')
def np_v10():
  """Tiny T5 1.0 (relu, tied logits; a small embedding so that the layers
  matter), numpy-random weights."""
  return network.T5Model(TINY_V10), numpy_params(TINY_V10, 1, 0.1)


# XLA's CPU backend set to compile fast: the suite's programs are tiny and
# run a few steps, so compiling is most of their cost. Three flags, each kept if
# the caller set it in XLA_FLAGS:
# - `--xla_backend_optimization_level=0`: no LLVM optimizations (the
#   optimized HLO is the same; only the machine code is less optimized): a
#   decode loop compiles in ~40% less time;
# - `--xla_cpu_use_fusion_emitters=false`: XLA's CPU fusions emitted by its
#   older LLVM IR emitters, not the MLIR fusion emitters: a decode loop then
#   compiles in about half the CPU time again (measured: t5, tree and
#   combined loops 8.4 -> 4.2 s together at level 0). XLA fuses a little
#   differently then (the t5 loop: 443 fusions, not 466), so float results
#   may differ in the last bits from a default build; every comparison in
#   the suite is between programs built alike (a speculative loop and its
#   baseline), or over integer tokens;
# - `--xla_cpu_parallel_codegen_split_count=1`: a program's LLVM module
#   compiled whole, not split into parts compiled on threads. On the
#   suite's two busy cores the threads buy no time, and each part repeats
#   work: a baseline, a t5 and a tree loop compile in ~24% less CPU
#   (medians of 5: 4.24 -> 3.24 s). The same machine code, cut otherwise.
# An XLA that does not know a flag aborts when its backend starts, and the
# last two are newer than some jaxlibs setup.py allows (and XLA is retiring
# those emitters): a subprocess tries them first, once per run, and the
# suite goes without one where it fails.
# Set here, before jax starts its backend, so xdist's workers and the scripts
# and notebook kernel the tests start inherit them. (The law tests compile
# theirs at level 1: test_speculative.py.)
_FAST_COMPILE = (('xla_backend_optimization_level', '0', False),
                 ('xla_cpu_use_fusion_emitters', 'false', True),
                 ('xla_cpu_parallel_codegen_split_count', '1', True))


def _xla_accepts(flags: str) -> bool:
  """Whether this jaxlib's CPU backend starts with XLA_FLAGS = flags."""
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS='cpu')
  try:
    return subprocess.run(
        [sys.executable, '-c', 'import jax; jax.devices()'], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        timeout=300, check=False).returncode == 0
  except subprocess.TimeoutExpired:
    return False


def _with_fast_compile(flags: str) -> str:
  """`flags` and each of `_FAST_COMPILE`'s that it lacks and XLA knows
  (the probed ones tried together first: one subprocess where XLA knows
  them all)."""
  missing = [f'--{f}={v}' for f, v, _ in _FAST_COMPILE if f not in flags]
  probed = [f'--{f}={v}' for f, v, p in _FAST_COMPILE if p and f not in flags]
  if probed and not _xla_accepts(' '.join([flags] + probed)):
    missing = [m for m in missing
               if m not in probed or _xla_accepts(f'{flags} {m}')]
  return ' '.join([flags] + missing).strip()


os.environ['XLA_FLAGS'] = _with_fast_compile(os.environ.get('XLA_FLAGS', ''))


# jax's persistent compilation cache: not used unless the caller sets
# JAX_COMPILATION_CACHE_DIR (jax reads it, and JAX_PERSISTENT_CACHE_MIN_*,
# from the environment; xdist's workers and the scripts the tests start
# inherit them). A folder that outlives a run makes the next run load the
# programs it compiled (tests/test_speculative.py alone: 65 -> 42 s). A cold
# run gains nothing from one: its processes compile different programs (of
# ~3,500 compiles, 430 were found in the cache, the worker's eager ops, and
# saved no measurable time), and writing every program costs about 7% of the
# suite's CPU (median of three, cache on vs off, alternated).


def _atomic_cache_writes():
  """jax's cache files appear whole (written aside, then renamed).

  Without a size limit jax writes an entry in place, so the other worker
  could read half a file: jax would warn and compile again. (A size limit
  would lock instead, but then every write scans the whole folder.)
  """
  try:
    from jax._src import lru_cache  # pylint: disable=g-import-not-at-top
    original, suffix = lru_cache.LRUCache.put, lru_cache._CACHE_SUFFIX  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    return  # another jax: its own writes

  def put(self, key, value):
    folder = os.fspath(self.path)
    if getattr(self, 'eviction_enabled', True) or '://' in folder:
      return original(self, key, value)
    path = pathlib.Path(folder) / f'{key}{suffix}'
    if path.exists():
      return
    tmp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
    tmp.write_bytes(value)
    os.replace(tmp, path)

  lru_cache.LRUCache.put = put


if os.environ.get('JAX_COMPILATION_CACHE_DIR'):
  _atomic_cache_writes()


# SPECDEC_TEST_COMPILE_PROFILE=<folder>: each process of the run writes
# <folder>/compile-<pid>.json: per test, and per program name within it, the
# seconds and count of jax's three stages of a jitted program (its compile
# events): tracing to a jaxpr, lowering to StableHLO, XLA compiling (with
# a persistent cache, a program found there counts as compiled, in the
# seconds its loading took).
# They are most of the suite's time on CPU: this says which tests pay them.
# `python tests/compile_profile.py <folder>` prints the table.
_PROFILE_DIR = os.environ.get('SPECDEC_TEST_COMPILE_PROFILE')
_PROFILE = {}
_CURRENT = ['(collection)']
_STAGES = {'/jax/core/compile/jaxpr_trace_duration': 'trace',
           '/jax/core/compile/jaxpr_to_mlir_module_duration': 'lower',
           '/jax/core/compile/backend_compile_duration': 'compile'}
if _PROFILE_DIR:

  def _on_stage(event, seconds, fun_name='?', **kwargs):
    del kwargs
    stage = _STAGES.get(event)
    if stage is None:
      return
    # The trace event names the function, the other two `jit(<name>)`.
    name = f'jit({fun_name})' if stage == 'trace' else str(fun_name)
    test = _PROFILE.setdefault(_CURRENT[0], {'programs': {}})
    program = test['programs'].setdefault(name, {})
    for entry in (test.setdefault(stage, [0.0, 0]),
                  program.setdefault(stage, [0.0, 0])):
      entry[0] += seconds
      entry[1] += 1

  jax.monitoring.register_event_duration_secs_listener(_on_stage)


# Python's cyclic garbage collector: a collection once per test file, and
# what survives it frozen (`gc.freeze`: never walked again), instead of
# whenever allocations pile up. A test process comes to hold jax's caches
# of every program it has traced and compiled (3.5M objects, ~7 GB at the
# end of a worker), and tracing makes and drops objects by the million:
# with the default thresholds (700, 10, 10) each full collection walks that
# whole heap again. Seconds collecting over a full run, per worker (timed
# with `gc.callbacks`): 55 + 41 with the defaults, 59 + 53 with a full
# collection per file and nothing frozen, 9 + 10 with the frozen objects
# unfrozen and walked again at each file; the workers' peak memory the same
# (7.4 and 6.4 GB before, 6.8 and 7.1 GB after). Nothing is unfrozen: the
# collection walks what the file just ended made (its module fixtures are
# torn down by then), ~0.01 s, not the ~580,000 frozen objects, ~0.4 s a
# file. A frozen object that dies is still freed when its last reference
# goes; only garbage in cycles among frozen objects is kept, which over a
# full run came to 6,731 and 695 objects in the two workers, holding no
# memory mapping (a collection of everything at the end freed none) and
# 3.4 and 3.7 GB peak memory: each worker's gaps between files went from
# ~22 to ~6.6 s (2026-11-30). The young generations are collected 14x less
# often. jax's caches are cleared there too: every program a process keeps
# holds memory mappings, of which Linux allows a process 65,530 (the figures
# beside `programs.CROWDED_SHARE`, the sweep's rule). With jax 0.12.0.1
# a worker that had kept 16 files' programs segfaulted in XLA's compile of
# the next stream loop; dropping them at each file keeps the count to one
# file's. A program two files both compile is compiled again, at no
# measurable cost (docs/testing.md).
gc.set_threshold(10_000, 50, 1_000)
_FILE = [None]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  _CURRENT[0] = item.nodeid
  if item.path != _FILE[0]:
    _FILE[0] = item.path
    jax.clear_caches()
    gc.collect()
    gc.freeze()
  yield


def pytest_configure(config):
  """A profiled run starts its folder afresh: the files an earlier run
  left there would be summed with this one's (xdist's controller, or the
  one process of `-n0`, clears them before any worker starts)."""
  if _PROFILE_DIR and not hasattr(config, 'workerinput'):
    for path in pathlib.Path(_PROFILE_DIR).glob('compile-*.json'):
      path.unlink()


def pytest_sessionfinish(session):
  del session
  if _PROFILE_DIR and _PROFILE:
    folder = pathlib.Path(_PROFILE_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f'compile-{os.getpid()}.json').write_text(json.dumps(
        _PROFILE, indent=0))


# Named weights loaded once per test process. The eval job's tests and the
# specs' shrunk runs load the same models over and over: with no checkpoint
# (T5X's initializers at a seed), a 'synthetic:' one, or the package's own
# 'shipped:' ones. In test_eval.py, test_run_folder.py, test_diagnostics.py
# and test_output_cache.py, 134 inits of 8 distinct (config, seed) pairs
# took 27 s of their 177 s of CPU (the initializers and a forward pass run
# op by op); in tests/experiments/, tests/tools/ and four more files, 55
# loads of 5 shipped models took 15 s. Such weights are a function of the
# config and the checkpoint's name alone, so `loading.load_model` keeps
# them in a `loading.LoadCache` (as a sweep keeps its models: handed out in
# fresh containers, the arrays shared; no program donates them), with room
# for more than a test process loads (~20). Weights read from a path, or
# from a copy of the shipped folder (SPECDEC_ASSETS), load every time: a
# test may rewrite them. Nor is a load made while jax traces (the stored
# run's build loads its setups inside `jax.eval_shape`): its params are that
# trace's tracers, which a later test would decode with.
_KEPT = loading.LoadCache(max_models=64)
_load_model = loading.load_model


def _load_named_weights_once(config, checkpoint, seed=0, what='model',
                             shardings=None, cache=None):
  """`loading.load_model`, once per config and name for named weights."""
  name = str(checkpoint)
  named = (checkpoint is None or name.startswith(synthetic.SCHEME) or (
      name.startswith(shipped.SCHEME) and  # the package's, not a copy's
      shipped.asset_dir() == shipped.ASSETS_DIR))
  # With shardings the package keeps nothing. Under a jax trace any new
  # array is a tracer: a load there is not kept.
  if named and cache is None and not isinstance(jnp.zeros(()),
                                                jax.core.Tracer):
    cache = _KEPT
  return _load_model(config, checkpoint, seed, what, shardings, cache)


loading.load_model = _load_named_weights_once

# The examples of the test data (tests/testdata: files no test writes), read
# once per process into the same cache, as a sweep keeps a split for its
# cells: the same four files read them 101 times through seqio's pipeline,
# 13 s of CPU. A split of any other folder is read every time.
_TEST_DATA = pathlib.Path(__file__).resolve().parent / 'testdata'
_read_examples = loading.read_examples


def _read_test_data_once(setup, task, num_examples, cache=None):
  """`loading.read_examples`, once per split and length for tests/testdata."""
  if cache is None and setup.data.data_dir is not None and pathlib.Path(
      setup.data.data_dir).resolve().is_relative_to(_TEST_DATA):
    cache = _KEPT
  return _read_examples(setup, task, num_examples, cache)


loading.read_examples = _read_test_data_once


@contextlib.contextmanager
def loads_every_time():
  """Within the block, `loading.load_model` and `loading.read_examples` load
  as the package does: for a test that counts or spies on loads."""
  kept = loading.load_model, loading.read_examples
  loading.load_model, loading.read_examples = _load_model, _read_examples
  try:
    yield
  finally:
    loading.load_model, loading.read_examples = kept


@pytest.fixture(scope='session')
def fixtures_dir():
  if not FIXTURES.is_dir():
    raise FileNotFoundError(
        f'T5X fixtures not found at {FIXTURES}; the suite expects the '
        'shared/ folder beside the repository or SPECDEC_FIXTURES set.'
    )
  return FIXTURES


def _compile_only(target: str):
  """A partitioner over one compile-only device of `target` (its backend's
  plugin installed: the CUDA plugin, libtpu), or the test skipped with
  what to install."""
  from specdec_jax import compiled  # pylint: disable=g-import-not-at-top
  try:
    return compiled.partitioner(compiled.get_target(target))
  except compiled.BackendMissing as e:
    pytest.skip(str(e))


@pytest.fixture(scope='session')
def h100():
  """A compile-only H100's partitioner (skipped without the CUDA plugin)."""
  return _compile_only('gpu:h100')


@pytest.fixture(scope='session')
def tpu_v5e():
  """A compile-only TPU v5e chip's partitioner (skipped without libtpu)."""
  return _compile_only('tpu:v5e:1x1')


@pytest.fixture(scope='session')
def torch():
  """torch, with transformers, for the tests that run HF's model: imported
  here, not at collection, which every xdist worker does for every file
  (~1.2 s). Both are in the test extra, which CI installs."""
  reason = 'HF transformers\' T5 is the referee: pip install -e ".[test]"'
  pytest.importorskip('transformers', reason=reason)
  return pytest.importorskip('torch', reason=reason)


@pytest.fixture
def fast_xz_packs(monkeypatch):
  """The box's stores packed at xz preset 0, not `aot.XZ_PRESET` (9): what
  a test checks of a pack (its programs load and run, its bytes count
  toward a limit) does not depend on the preset, and at 9 xz took ~6 s of
  tests/tools/test_aot.py's and test_stored.py's ~55."""
  from tools.accelerator import aot  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(aot, 'XZ_PRESET', 0)


@pytest.fixture(scope='session')
def xxl_tree_setup():
  """A `compiled.Setup` of the decode loops the GPU checks compile: a T5
  1.1-XXL-width target (vocabulary 8064) and a dec2-shaped drafter, batch
  1, 64 input and 128 output tokens."""
  from specdec_jax import compiled  # pylint: disable=g-import-not-at-top
  from specdec_jax import models  # pylint: disable=g-import-not-at-top
  return compiled.Setup(
      target=models.config('t5_1_1_xxl', vocab_size=8064),
      draft=models.config('t5_1_1_small', vocab_size=8064, emb_dim=256,
                          num_heads=4, num_encoder_layers=2,
                          num_decoder_layers=2, mlp_dim=640),
      batch=1, input_length=64, max_decode_len=128)


@pytest.fixture(scope='session')
def v11():
  model = network.T5Model(TINY_V11)
  return model, model.init_params(jax.random.key(1))


@pytest.fixture(scope='session')
def v10():
  """T5 1.0 weights with a smaller embedding scale.

  With tied logits and N(0, 1) embeddings a random tiny model just repeats its
  last input token (the residual stream is that token's embedding); scaling the
  table by 0.1 lets the layers matter, so greedy outputs vary.
  """
  model = network.T5Model(TINY_V10)
  params = model.init_params(jax.random.key(2))
  emb = params['token_embedder']['embedding']
  params['token_embedder']['embedding'] = emb * 0.1
  return model, params


# Ragged greedy rows of the tiny v1.1 model: EOS is a token these random
# weights do emit, so rows end at different times.
RAGGED_MAX_LEN = 24
RAGGED_EOS = 68


@pytest.fixture(scope='session')
def ragged_greedy(v11):
  """(encoder inputs [4, 12] with padded rows, the baseline's greedy output)."""
  model, params = v11
  rng = np.random.default_rng(3)
  enc = rng.integers(2, model.vocab_size, (4, 12))
  enc[1, 8:] = 0
  enc[2, 5:] = 0
  enc[3, 2:] = 0
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=RAGGED_MAX_LEN,
                                     eos_id=RAGGED_EOS)
  return enc, base


@functools.partial(jax.jit, static_argnums=0)
def teacher_forced_logits(model, params, encoder_input_tokens,
                          decoder_input_tokens):
  """`model.logits(...)` compiled once per model and shapes.

  Op by op (eagerly), a forward pass is a hundred or more small compiles
  (0.1-0.5 s each on CPU); tests that need reference logits call this.
  """
  return model.logits(params, encoder_input_tokens, decoder_input_tokens)


@functools.partial(jax.jit, static_argnums=(0, 3))
def init_cache(model, params, encoder_input_tokens, max_length):
  """`model.init_cache(...)` compiled once per model, shapes and length
  (op by op: the encoder and the cross K/V, dozens of small compiles)."""
  return model.init_cache(params, encoder_input_tokens, max_length)


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=('return_hidden', 'rows'))
def extend(model, params, tokens, cache, **kwargs):
  """`model.extend(...)` compiled once per model, shapes and static
  options (op by op, a call is a hundred or more small compiles), as the
  decode loops run it."""
  return model.extend(params, tokens, cache, **kwargs)


# The slowest files first (seconds summed per file, measured): with
# `--dist loadfile` each xdist worker takes the next file when it is done, so
# a long file started last would leave the other worker idle at the end.
# Files not listed (new ones: their cost is unknown) go first, then these;
# the order of the tests within a file is kept.
_SLOWEST_FILES = (
    'test_drafters.py', 'test_trees.py', 'test_eval.py', 'test_speculative.py',
    'test_diagnostics.py', 'test_methods_spec.py',
    'test_tables_spec.py', 'test_heads.py', 'test_notebook.py',
    'test_batches_spec.py', 'test_run_folder.py', 'test_lookahead.py',
    'test_output_cache.py', 'test_fused.py', 'test_shipped.py',
    'test_partitioning.py', 'test_training.py', 'test_widening.py',
    'test_measure.py', 'test_gin_configs.py', 'test_distill.py',
    'test_method_scripts.py', 'test_sweep.py', 'test_streaming.py',
    'test_decoding.py', 'test_trees_spec.py', 'test_numerics.py',
    'test_network.py', 'test_checkpoints.py', 'test_lookup.py',
    'test_cache.py', 'test_tasks.py', 'test_compile_only.py',
    'test_hf_reference.py', 'test_runner.py', 'test_bench.py',
    'test_results_scripts.py', 'test_reproduce.py', 'test_layering.py',
    'test_validation.py', 'test_theory.py', 'test_docs.py',
)


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(_SLOWEST_FILES)}
  items.sort(key=lambda item: rank.get(item.path.name, -1))
