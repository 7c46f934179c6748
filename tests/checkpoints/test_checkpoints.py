"""T5X checkpoint loading and saving, HF T5 weight import (checkpoints/).

The fixtures are real T5X-written checkpoints (../shared/fixtures/t5x): a
legacy msgpack file with inline arrays, a legacy tensorstore checkpoint and an
early orbax one. Values are checked against a second reader (flax's msgpack
restore, gzip-decoded zarr chunks), never against the loader itself.
"""

import copy
import functools
import gzip
import json
import logging
import os
import pathlib
import re
import shutil

from flax import serialization
from flax import traverse_util
import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
import tensorstore as ts

from specdec_jax import checks
from specdec_jax import checkpoints
from specdec_jax import loading
from specdec_jax import network
from specdec_jax.checkpoints import __main__ as cli
from specdec_jax.checkpoints import t5x

from conftest import TINY_V10, TINY_V11  # pylint: disable=g-bad-import-order
import fake_gcs  # pylint: disable=g-bad-import-order

# The model in test_t5_tiny.checkpoint_0 (T5X's t5x/testdata).
FIXTURE_CFG = network.T5Config(
    vocab_size=32128, emb_dim=8, num_heads=4, head_dim=3, mlp_dim=16,
    num_encoder_layers=2, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
)


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep='/')


def _assert_trees_equal(got, want):
  got, want = _flat(got), _flat(want)
  assert sorted(got) == sorted(want)
  for k in want:
    assert np.asarray(got[k]).dtype == np.asarray(want[k]).dtype, k
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]),
                                  err_msg=k)


@functools.lru_cache(maxsize=None)
def _jit_logits(model):
  """One compiled teacher-forced forward per config (eager apply is slow)."""
  return jax.jit(model.logits)


def _logits(model, params, enc, dec):
  return np.asarray(_jit_logits(model)(params, enc, dec))


def _tokens(vocab, seed=0):
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, vocab, (2, 7))
  dec = rng.integers(2, vocab, (2, 5))
  dec[:, 0] = 0
  return enc, dec


class _CountTsOpen:
  """Counts tensorstore.open calls (each is one array the loader touches)."""

  def __init__(self, monkeypatch):
    import tensorstore as ts  # pylint: disable=g-import-not-at-top
    self.specs = []
    real = ts.open

    def counting_open(spec, *args, **kwargs):
      self.specs.append(spec)
      return real(spec, *args, **kwargs)

    monkeypatch.setattr(ts, 'open', counting_open)


# --- Legacy msgpack with inline arrays --------------------------------------


def test_legacy_inline_fixture_matches_flax_restore(fixtures_dir):
  """The T5X tiny T5 1.1 checkpoint loads into our tree, bit for bit.

  The reference is flax.serialization.msgpack_restore of the same file (what
  T5X itself uses), so a decoding slip (dtype, shape order, wrong subtree)
  shows up as a mismatch; the config check proves the tree is exactly
  T5Model's, and running it proves it is usable.
  """
  path = fixtures_dir / 'test_t5_tiny.checkpoint_0'
  params = checkpoints.load_t5x_params(path, config=FIXTURE_CFG)
  want = serialization.msgpack_restore(path.read_bytes())
  assert want['version'] == 3
  _assert_trees_equal(params, want['optimizer']['target'])
  enc, dec = _tokens(FIXTURE_CFG.vocab_size)
  logits = _logits(network.T5Model(FIXTURE_CFG), params, enc, dec)
  assert logits.shape == (2, 5, FIXTURE_CFG.vocab_size)
  assert np.isfinite(logits).all()
  assert logits.std() > 0


def test_legacy_inline_decodes_only_target_arrays(fixtures_dir, monkeypatch):
  """Optimizer state arrays are skipped, not decoded.

  The file holds Adafactor state (v_row, v_col, v per parameter) before the
  params; decoding it would double the memory of loading a large legacy
  checkpoint. Every decoded array is counted: only the target's may be.
  """
  decoded = []
  real = checkpoints.t5x._decode_ext  # pylint: disable=protected-access

  def counting(code, data):
    decoded.append(code)
    return real(code, data)

  monkeypatch.setattr(checkpoints.t5x, '_decode_ext', counting)
  params = checkpoints.load_t5x_params(
      fixtures_dir / 'test_t5_tiny.checkpoint_0')
  n_target = len(_flat(params))
  assert n_target == len(network.expected_shapes(FIXTURE_CFG))
  assert len(decoded) == n_target


# --- Legacy tensorstore ------------------------------------------------------


def _gunzip_chunk(path, dtype, shape):
  """Reads a zarr gzip chunk without tensorstore (the independent route)."""
  with open(path, 'rb') as f:
    raw = gzip.decompress(f.read())
  return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _ts_checkpoint_with_target(fixtures_dir, tmp_path, gcs_written=False):
  """tiny_t5/checkpoint_1 copied, its toy arrays promoted to the target.

  The fixture's target is empty (only optimizer state lives in tensorstore),
  so to read real T5X-written specs and chunks as params, the copy's msgpack
  file lists the same spec dicts (same relative paths) under
  optimizer/target as well. With gcs_written, the target specs take the form
  T5X writes on GCS (kvstore {'driver': 'gcs', 'bucket':
  't5x-dummy-bucket'}, relative 'path' beside it), which a local copy must
  still read from its own folder.
  """
  ckpt = tmp_path / 'model' / 'checkpoint_1'
  shutil.copytree(fixtures_dir / 'tiny_t5' / 'checkpoint_1', ckpt)
  for p in [ckpt, *ckpt.rglob('*')]:
    p.chmod(0o755 if p.is_dir() else 0o644)
  tree = msgpack.unpackb((ckpt / 'checkpoint').read_bytes(), raw=False)
  assert tree['optimizer']['target'] == {}
  target = copy.deepcopy(tree['optimizer']['state']['param_states'])
  if gcs_written:
    for spec in target.values():
      spec['path'] = spec.pop('kvstore')['path'].rstrip('/')
      spec['kvstore'] = {'bucket': 't5x-dummy-bucket', 'driver': 'gcs'}
  tree['optimizer']['target'] = target
  (ckpt / 'checkpoint').write_bytes(msgpack.packb(tree, use_bin_type=True))
  return ckpt


def test_tensorstore_fixture_reads_no_optimizer_state(fixtures_dir,
                                                      monkeypatch):
  """The real tensorstore fixture has an empty target: zero arrays opened.

  All three of its arrays are optimizer state; a loader that opened them
  (T5X's load_t5x_checkpoint does) would show here as tensorstore opens.
  """
  opened = _CountTsOpen(monkeypatch)
  for path in (fixtures_dir / 'tiny_t5' / 'checkpoint_1',
               fixtures_dir / 'tiny_t5' / 'checkpoint_1' / 'checkpoint',
               fixtures_dir / 'tiny_t5'):
    assert checkpoints.load_t5x_params(path) == {}
  assert not opened.specs


@pytest.mark.parametrize('gcs_written', [False, True])
def test_tensorstore_leaves_equal_raw_chunks(gcs_written, fixtures_dir,
                                             tmp_path, monkeypatch):
  """T5X tensorstore leaves read back equal to their gunzipped chunk files.

  The chunks were written by T5X (gzip zarr, no .zarray beside them); the
  reference decodes them with gzip+numpy, so a wrong path resolution, dtype
  or chunk layout in the loader fails the comparison. Exactly the three
  target leaves may be opened, not their optimizer-state twins.
  """
  ckpt = _ts_checkpoint_with_target(fixtures_dir, tmp_path, gcs_written)
  opened = _CountTsOpen(monkeypatch)
  params = checkpoints.load_t5x_params(ckpt)
  assert len(opened.specs) == 3
  kernel = _gunzip_chunk(ckpt / 'state.param_states.kernel' / '0.0', '<f8',
                         (10, 5))
  bias = _gunzip_chunk(ckpt / 'state.param_states.bias' / '0', '<f4', (5,))
  step = _gunzip_chunk(ckpt / 'state.param_states.step' / '0', '<i4', ())
  assert np.abs(kernel).sum() > 0
  # float64 becomes float32 in jax's default (x64 off) mode.
  np.testing.assert_array_equal(params['kernel'], kernel.astype(np.float32))
  np.testing.assert_array_equal(params['bias'], bias)
  assert params['bias'].dtype == jnp.float32
  assert int(params['step']) == int(step)


def test_legacy_tensorstore_t5_with_zarray(np_v11, tmp_path):
  """A T5 written the way T5X's legacy Checkpointer writes loads exactly.

  Each param goes to a gzip zarr folder 'target.<dotted.name>' (with its
  .zarray, as tensorstore creates it) and the msgpack file keeps relative
  specs. The specs deliberately claim other chunks and compressor than the
  disk holds: T5X trusts the .zarray for those, and so must we.
  """
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  model, params = np_v11
  ckpt = tmp_path / 'checkpoint_3'
  ckpt.mkdir()
  specs = {}
  for name, value in _flat(params).items():
    rel = 'target.' + name.replace('/', '.')
    value = np.asarray(value)
    ts.open({'driver': 'zarr', 'dtype': 'float32',
             'kvstore': {'driver': 'file', 'path': str(ckpt / rel)},
             'metadata': {'compressor': {'id': 'gzip'}, 'shape': value.shape,
                          'chunks': value.shape}},
            create=True).result().write(value).result()
    specs[name] = {'driver': 'zarr', 'dtype': 'float32',
                   'kvstore': {'driver': 'file', 'path': rel},
                   'metadata': {'chunks': [1] * value.ndim,
                                'compressor': {'id': 'zstd'},
                                'shape': list(value.shape)}}
  tree = {'version': 3, 'optimizer': {
      'target': traverse_util.unflatten_dict(specs, sep='/'),
      'state': {'step': 3, 'param_states': {'x': 'never read'}}}}
  (ckpt / 'checkpoint').write_bytes(msgpack.packb(tree, use_bin_type=True))
  loaded = checkpoints.load_t5x_params(tmp_path, config=model.config)
  _assert_trees_equal(loaded, params)


def test_tensorstore_missing_chunk_names_parameter(fixtures_dir, tmp_path):
  """A deleted chunk file is an error naming the parameter, not zeros.

  Zarr reads a missing chunk as the fill value by default, which would load
  silently wrong weights from an incomplete copy.
  """
  ckpt = _ts_checkpoint_with_target(fixtures_dir, tmp_path)
  (ckpt / 'state.param_states.kernel' / '0.0').unlink()
  with pytest.raises(checkpoints.CheckpointError) as err:
    checkpoints.load_t5x_params(ckpt)
  msg = str(err.value)
  assert 'parameter kernel' in msg
  assert str(ckpt) in msg


# --- Early orbax (msgpack + PLACEHOLDER:// leaves) -------------------------


def test_early_orbax_fixture_loads_without_state(fixtures_dir):
  """T5X's early orbax checkpoint loads: target {} and no state touched.

  Its optimizer-state array folders lack zarr metadata, so merely opening
  one would raise: a successful load proves they were left alone.
  """
  assert checkpoints.load_t5x_params(fixtures_dir / 'tiny_orbax' / '1') == {}
  assert checkpoints.load_t5x_params(
      fixtures_dir / 'tiny_orbax' / '1' / 'checkpoint') == {}


def _early_orbax_with_target(tmp_path):
  """(checkpoint folder, its target): the fixture's layout (top-level
  '_optimizer', dotted names) with PLACEHOLDER://<name> target leaves."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  ckpt = tmp_path / '1'
  ckpt.mkdir()
  want = {'dense': {'kernel': np.arange(12, dtype=np.float32).reshape(3, 4)},
          'scale': np.array([0.5, -2.0], np.float32)}
  target = {}
  for key, value in _flat(want).items():
    name = '_optimizer.target.' + key.replace('/', '.')
    ts.open({'driver': 'zarr', 'kvstore': {'driver': 'file',
                                           'path': str(ckpt / name)}},
            create=True, dtype=ts.float32, shape=value.shape).result().write(
                value).result()
    target[key] = 'PLACEHOLDER://' + name
  tree = {'_optimizer': {'target': traverse_util.unflatten_dict(
      target, sep='/'), 'state': {'step': 'PLACEHOLDER://nowhere'}},
          'flax_mutables': None}
  (ckpt / 'checkpoint').write_bytes(msgpack.packb(tree, use_bin_type=True))
  return ckpt, want


def test_early_orbax_placeholder_leaves_resolve(tmp_path):
  """PLACEHOLDER://<name> target leaves read the zarr folder <name> beside;
  a wrong folder or key resolution fails to load."""
  ckpt, want = _early_orbax_with_target(tmp_path)
  _assert_trees_equal(checkpoints.load_t5x_params(ckpt), want)


# --- Orbax (current T5X) ------------------------------------------------------


# The read below restores with no shardings given, so orbax takes them from
# the checkpoint's own sharding file and warns that it does: what this read
# of the raw step wants.
@pytest.mark.filterwarnings('ignore:Sharding info not provided when restoring')
def test_orbax_round_trip_identical_params_and_logits(np_v11, tmp_path):
  """save_t5x_params -> load_t5x_params returns the same arrays and logits.

  Also pins T5X's layout: read back the way T5X's
  OrbaxCheckpointManagerInterface opens a model dir (orbax CheckpointManager,
  step prefix 'checkpoint', item 'state'), the step holds the PyTree
  {'target': params, 'state': {'step'}}, and there is no legacy
  'checkpoint' file in the step folder (T5X would then take the legacy
  path).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  model, params = np_v11
  step_dir = checkpoints.save_t5x_params(params, tmp_path, step=7)
  assert step_dir == str(tmp_path / 'checkpoint_7')
  assert not (tmp_path / 'checkpoint_7' / 'checkpoint').exists()
  manager = ocp.CheckpointManager(
      tmp_path, options=ocp.CheckpointManagerOptions(step_prefix='checkpoint'),
      item_handlers={'state': ocp.PyTreeCheckpointHandler(use_ocdbt=True)})
  assert manager.all_steps() == [7]
  raw = manager.restore(7, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore()))['state']
  manager.close()
  assert set(raw) == {'target', 'state'}
  assert int(raw['state']['step']) == 7
  _assert_trees_equal(raw['target'], params)

  for path in (step_dir, tmp_path, tmp_path / 'checkpoint_7' / 'state'):
    loaded = checkpoints.load_t5x_params(path, config=model.config)
    _assert_trees_equal(loaded, params)
  enc, dec = _tokens(model.vocab_size)
  np.testing.assert_array_equal(_logits(model, loaded, enc, dec),
                                _logits(model, params, enc, dec))
  with pytest.raises(FileExistsError):
    checkpoints.save_t5x_params(params, tmp_path, step=7)


def test_orbax_reads_only_target_of_train_state(np_v11, tmp_path):
  """A T5X training checkpoint (with optimizer state) yields params only.

  T5X training writes {'target', 'state': {'step', 'param_states'}}; the
  loader must return the target subtree, not the state tree or a mix.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  _, params = np_v11
  slots = jax.tree.map(lambda x: jnp.full(x.shape, 3.0), params)
  tree = {'target': params,
          'state': {'step': jnp.asarray(5, jnp.int32),
                    'param_states': slots}}
  (tmp_path / 'checkpoint_5').mkdir()
  ocp.PyTreeCheckpointer().save(tmp_path / 'checkpoint_5' / 'state', tree)
  _assert_trees_equal(checkpoints.load_t5x_params(tmp_path), params)


def test_latest_checkpoint(tmp_path):
  """latest_checkpoint takes the numerically highest step, not the last name.

  all_steps is the one reading of `checkpoint_<step>` names (training prunes
  with it): folders only, orbax's temporary folders and other names skipped.
  """
  for name in ('checkpoint_9', 'checkpoint_10', 'checkpoint_2', 'other_99'):
    (tmp_path / name).mkdir()
  (tmp_path / 'checkpoint_100.tmp-123').mkdir()
  (tmp_path / 'checkpoint_200').touch()
  assert checkpoints.latest_checkpoint(tmp_path) == str(
      tmp_path / 'checkpoint_10')
  assert checkpoints.latest_checkpoint(tmp_path / 'checkpoint_2') is None
  assert checkpoints.all_steps(tmp_path) == [
      (s, str(tmp_path / f'checkpoint_{s}')) for s in (2, 9, 10)]
  assert checkpoints.all_steps(tmp_path / 'missing') == []
  assert checkpoints.step_of(str(tmp_path / 'checkpoint_10') + '/') == 10
  assert checkpoints.step_of(tmp_path / 'checkpoint_100.tmp-123') is None


def test_bfloat16_cast(np_v11, tmp_path):
  """dtype=bfloat16 gives bfloat16 leaves holding the rounded values."""
  model, params = np_v11
  checkpoints.save_t5x_params(params, tmp_path, step=1)
  loaded = checkpoints.load_t5x_params(tmp_path, config=model.config,
                                       dtype=jnp.bfloat16)
  _assert_trees_equal(
      loaded, jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params))
  # An int cast would decode 0s: refused before anything is read.
  with pytest.raises(checks.InputError, match='load_t5x_params: dtype must be '
                     "a float dtype .*got <class 'jax.numpy.int32'>"):
    checkpoints.load_t5x_params(tmp_path / 'nothing', dtype=jnp.int32)


def test_weights_that_are_not_finite_are_refused(tmp_path):
  """A diverged run's checkpoint (a NaN weight), or weights a cast
  overflows, are refused naming the arrays, not decoded into 0s."""
  tree = _tiny_tree()
  tree['encoder']['bias'] = tree['encoder']['bias'].at[3].set(jnp.nan)
  checkpoints.save_t5x_params(tree, tmp_path / 'nan', step=1)
  with pytest.raises(checkpoints.CheckpointError,
                     match=r'1 of 3 weight arrays hold NaN or infinite '
                     r'values \(encoder/bias\)'):
    checkpoints.load_t5x_params(tmp_path / 'nan')
  # Params that are themselves traced (a load under `jax.eval_shape`, as
  # tools/accelerator builds a setup) have no values to check.
  shapes = jax.eval_shape(lambda: checkpoints.load_t5x_params(
      tmp_path / 'nan'))
  assert shapes['encoder']['bias'].shape == (24,)
  flat = jax.eval_shape(lambda x: t5x.params_from_flat(
      {'a/b': x}, 'traced', None, None), jnp.full(3, jnp.nan))
  assert flat['a']['b'].shape == (3,)
  big = jax.tree.map(lambda x: x * 1e5, _tiny_tree())  # > float16's 65504
  checkpoints.save_t5x_params(big, tmp_path / 'big', step=1)
  loaded = checkpoints.load_t5x_params(tmp_path / 'big')  # finite as saved
  _assert_trees_equal(loaded, big)
  with pytest.raises(checkpoints.CheckpointError,
                     match='3 of 3 .* values once cast to float16'):
    checkpoints.load_t5x_params(tmp_path / 'big', dtype=jnp.float16)


# --- HF transformers -> T5X --------------------------------------------------


@pytest.mark.usefixtures('torch')
@pytest.mark.parametrize('which', ['np_v11', 'np_v10'])
def test_hf_safetensors_round_trip(which, request, tmp_path):
  """HF save_pretrained weights import to our params with the same logits.

  config_from_hf must rebuild the T5Config (gated-gelu vs relu, tied logits
  for T5 1.0) and load_hf_t5 must undo HF's transposes; for tied T5 1.0 HF
  may drop lm_head, which must then be the shared embedding.
  """
  # pylint: disable-next=g-import-not-at-top
  from specdec_jax.checkpoints import hf as hf_lib
  # pylint: disable-next=g-import-not-at-top
  from safetensors import numpy as st_numpy
  model, params = request.getfixturevalue(which)
  cfg = model.config
  hf_lib.to_hf_model(params, cfg).save_pretrained(tmp_path)
  state = st_numpy.load_file(tmp_path / 'model.safetensors')
  if cfg.logits_via_embedding:
    if 'lm_head.weight' in state:
      np.testing.assert_array_equal(state['lm_head.weight'],
                                    state['shared.weight'])
  else:
    np.testing.assert_array_equal(
        state['lm_head.weight'],
        np.asarray(params['decoder']['logits_dense']['kernel']).T)

  assert checkpoints.config_from_hf(tmp_path / 'config.json') == cfg.replace(
      dropout_rate=0.0)
  loaded = checkpoints.load_hf_t5(tmp_path, cfg)
  _assert_trees_equal(loaded, params)
  loaded = checkpoints.load_hf_t5(tmp_path)  # config.json beside the weights
  enc, dec = _tokens(model.vocab_size)
  np.testing.assert_array_equal(_logits(model, loaded, enc, dec),
                                _logits(model, params, enc, dec))


@pytest.mark.usefixtures('torch')
def test_hf_sharded_safetensors(np_v11, tmp_path, gcs):
  """Sharded HF weights (model.safetensors.index.json) are all read, from
  disk or gs://, and the job's loader takes a folder with a config.json
  there for HF weights."""
  # pylint: disable-next=g-import-not-at-top
  from specdec_jax.checkpoints import hf as hf_lib
  model, params = np_v11
  hf_lib.to_hf_model(params, model.config).save_pretrained(
      tmp_path, max_shard_size='40KB')
  index = json.loads((tmp_path / 'model.safetensors.index.json').read_text())
  assert len(set(index['weight_map'].values())) > 1
  address = fake_gcs.upload(tmp_path, f'{gcs}/hf')
  for folder in (str(tmp_path), address):
    _assert_trees_equal(checkpoints.load_hf_t5(folder, model.config), params)
    _assert_trees_equal(checkpoints.load_hf_t5(
        f'{folder}/model.safetensors.index.json'), params)  # config beside
    _assert_trees_equal(loading.load_model(model.config, folder)[1], params)


def test_hf_bfloat16_safetensors(np_v11, tmp_path, torch):
  """bfloat16 HF exports load (safetensors.numpy alone cannot read them).

  The values must be the bfloat16-rounded originals, bit for bit, whatever
  the requested dtype.
  """
  # pylint: disable-next=g-import-not-at-top
  from specdec_jax.checkpoints import hf as hf_lib
  model, params = np_v11
  hf_lib.to_hf_model(params, model.config).to(torch.bfloat16) \
      .save_pretrained(tmp_path)
  rounded = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
  _assert_trees_equal(
      checkpoints.load_hf_t5(tmp_path, model.config, dtype=jnp.bfloat16),
      rounded)
  _assert_trees_equal(checkpoints.load_hf_t5(tmp_path, model.config),
                      jax.tree.map(lambda x: x.astype(jnp.float32), rounded))


def test_config_from_hf_flan_t5_fields(tmp_path):
  """A Flan-T5-small style config.json maps field by field."""
  hf = {'vocab_size': 32128, 'd_model': 512, 'd_kv': 64, 'd_ff': 1024,
        'num_layers': 8, 'num_decoder_layers': 8, 'num_heads': 6,
        'feed_forward_proj': 'gated-gelu', 'tie_word_embeddings': False,
        'dropout_rate': 0.1}
  (tmp_path / 'config.json').write_text(json.dumps(hf))
  assert checkpoints.config_from_hf(tmp_path) == network.T5Config(
      vocab_size=32128, emb_dim=512, head_dim=64, mlp_dim=1024,
      num_encoder_layers=8, num_decoder_layers=8, num_heads=6,
      mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
      dropout_rate=0.1)
  hf.update(feed_forward_proj='gelu')
  (tmp_path / 'config.json').write_text(json.dumps(hf))
  with pytest.raises(ValueError, match='gelu'):
    checkpoints.config_from_hf(tmp_path)
  # What is no T5 config, or no T5 this network computes, named.
  config = tmp_path / 'config.json'
  for text, error, said in (
      (dict(hf, feed_forward_proj='gated-gelu', layer_norm_epsilon=0.5),
       ValueError, 'layer_norm_epsilon 0.5; T5X T5 uses 1e-6'),
      ({'model_type': 'bart', 'd_model': 16}, checkpoints.CheckpointError,
       "model_type 'bart', not an HF T5"),
      ({'vocab_size': 8}, checkpoints.CheckpointError,
       r"not an HF T5 config \(no \['d_model'"),
      ([1], checkpoints.CheckpointError, 'not an HF config'),
      ('{"vocab', checkpoints.CheckpointError, 'not JSON')):
    config.write_text(text if isinstance(text, str) else json.dumps(text))
    with pytest.raises(error, match=said):
      checkpoints.config_from_hf(tmp_path)


@pytest.mark.usefixtures('torch')
def test_hf_config_json_fixes_the_network_loaded(np_v11, tmp_path):
  """A T5Config given for another network than the folder's config.json
  (the same shapes: gated-relu for gated-gelu) is refused, where the
  weights loaded and decoded other tokens; so are weights the config does
  not read (an untied output layer under a tied config). The gated-relu
  network exports as HF's 'gated-relu'."""
  # pylint: disable-next=g-import-not-at-top
  from specdec_jax.checkpoints import hf as hf_lib
  # pylint: disable-next=g-import-not-at-top
  from safetensors import numpy as st_numpy
  model, params = np_v11
  hf_lib.to_hf_model(params, model.config).save_pretrained(tmp_path)
  # transformers < 4 kept a bias T5 never reads: not refused; nor is mT5.
  weights = tmp_path / 'model.safetensors'
  state = st_numpy.load_file(weights)
  st_numpy.save_file(dict(state, **{
      'decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.'
      'weight': np.zeros((32, 2), np.float32)}), weights)
  config = json.loads((tmp_path / 'config.json').read_text())
  (tmp_path / 'config.json').write_text(json.dumps(dict(config,
                                                        model_type='mt5')))
  _assert_trees_equal(checkpoints.load_hf_t5(tmp_path, model.config), params)
  relu = model.config.replace(mlp_activations=('relu', 'linear'))
  assert hf_lib.hf_config_kwargs(relu)['feed_forward_proj'] == 'gated-relu'
  with pytest.raises(checkpoints.CheckpointError, match=re.escape(
      "mlp_activations ('relu', 'linear') (config.json: ('gelu', "
      "'linear'))")):
    checkpoints.load_hf_t5(tmp_path, relu)
  (tmp_path / 'config.json').unlink()  # the config given is all there is
  with pytest.raises(checkpoints.CheckpointError, match=re.escape(
      "1 weights the T5Config does not read: ['lm_head.weight']")):
    checkpoints.load_hf_t5(
        tmp_path, model.config.replace(logits_via_embedding=True))


# --- Errors ---------------------------------------------------------------


def test_missing_path_names_it(tmp_path):
  """A wrong path is FileNotFoundError naming the path, for every entry."""
  missing = tmp_path / 'nope' / 'checkpoint_3'
  with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
    checkpoints.load_t5x_params(missing)
  (tmp_path / 'empty').mkdir()
  with pytest.raises(FileNotFoundError, match='empty'):
    checkpoints.load_t5x_params(tmp_path / 'empty')
  with pytest.raises(FileNotFoundError, match='nope'):
    checkpoints.load_hf_t5(tmp_path / 'nope', TINY_V11)


@pytest.mark.parametrize('corruption', ['truncated', 'garbage'])
def test_corrupt_msgpack_names_path(corruption, fixtures_dir, tmp_path):
  """A truncated or garbage checkpoint file is a CheckpointError with its path.

  Never a raw msgpack exception: users loading a half-copied checkpoint
  must be told which file is broken.
  """
  data = (fixtures_dir / 'test_t5_tiny.checkpoint_0').read_bytes()
  bad = tmp_path / 'broken.checkpoint_0'
  bad.write_bytes(data[:len(data) // 2] if corruption == 'truncated'
                  else b'\x93\x01not a checkpoint' + data[:100])
  with pytest.raises(checkpoints.CheckpointError, match=re.escape(str(bad))):
    checkpoints.load_t5x_params(bad)
  assert issubclass(checkpoints.CheckpointError, ValueError)


def test_config_mismatch_names_parameter_and_shapes(fixtures_dir):
  """Loading the fixture with a wrong config names each bad parameter.

  emb_dim=16 vs the checkpoint's 8 must report the parameter path with both
  shapes; an extra decoder layer in the config must report what is missing.
  """
  path = fixtures_dir / 'test_t5_tiny.checkpoint_0'
  with pytest.raises(checks.InputError) as err:
    checkpoints.load_t5x_params(path, config=FIXTURE_CFG.replace(emb_dim=16))
  msg = str(err.value)
  # What each side's shapes say of its architecture (the fixture's README:
  # vocab 32128, emb 8, 4 heads x head_dim 3, mlp 16, 2 + 2 layers).
  assert re.match(
      f'{re.escape(str(path))}: [0-9]+ parameters differ from the '
      'T5Config; its shapes say vocab_size 32128, emb_dim 8, 2 [+] 2 '
      'layers, mlp_dim 16, heads x head_dim 12, the config.s vocab_size '
      '32128, emb_dim 16, 2 [+] 2 layers, mlp_dim 16, heads x head_dim '
      '12:\n', msg), msg
  lines = msg.splitlines()
  assert len(lines) == 1 + 8 + 1 and lines[-1].startswith('  ... and ')
  assert ('decoder/layers_0/encoder_decoder_attention/key/kernel: (8, 12) '
          'vs config (16, 12)') in msg
  with pytest.raises(checks.InputError,
                     match='decoder/layers_2/.*: missing .config'):
    checkpoints.load_t5x_params(
        path, config=FIXTURE_CFG.replace(num_decoder_layers=3))


def test_v10_params_check_against_v11_config(np_v10):
  """check_params catches an unexpected logits_dense / wi split by name."""
  _, params = np_v10
  with pytest.raises(ValueError, match='logits_dense/kernel: missing'):
    network.check_params(params, TINY_V11)
  network.check_params(params, TINY_V10)


# --- Integrity: the checksum manifest of the checkpoints we write ------------


def _tiny_tree():
  """A small params tree of three dtypes (the flip test loads it 30 times)."""
  rng = np.random.default_rng(3)
  return {'encoder': {'kernel': jnp.asarray(rng.standard_normal((16, 24)),
                                            jnp.float32),
                      'bias': jnp.asarray(rng.standard_normal(24),
                                          jnp.float32)},
          'decoder': {'kernel': jnp.asarray(rng.standard_normal((24, 8)),
                                            jnp.bfloat16)}}


def _files(folder, skip=()):
  return sorted(str(p) for p in folder.rglob('*')
                if p.is_file() and p.name not in skip)


def test_no_flipped_byte_loads_different_weights(tmp_path):
  """One flipped byte in a checkpoint must never give other weights.

  Orbax / tensorstore keep no checksums: before the manifest, 30 seeded
  flips anywhere in a saved checkpoint loaded different weights without an
  error several times. Every flip must now be a CheckpointError naming the
  flipped file (or, were it harmless, load the very same weights).
  """
  params = _tiny_tree()
  step_dir = checkpoints.save_t5x_params(params, tmp_path, step=1)
  files = _files(tmp_path / 'checkpoint_1', skip=('MANIFEST.json',))
  sizes = np.array([len(open(f, 'rb').read()) for f in files])
  rng = np.random.default_rng(0)
  silent, unnamed, named_arrays = [], [], 0
  for _ in range(30):
    path = files[rng.choice(len(files), p=sizes / sizes.sum())]
    with open(path, 'rb') as f:
      data = f.read()
    pos = int(rng.integers(len(data)))
    flipped = bytearray(data)
    flipped[pos] ^= int(rng.integers(1, 256))
    with open(path, 'wb') as f:
      f.write(flipped)
    try:
      loaded = checkpoints.load_t5x_params(step_dir)
    except checkpoints.CheckpointError as e:
      if path not in str(e):
        unnamed.append((path, pos, str(e)[:200]))
      named_arrays += bool(re.search(r'arrays that differ: \w+/', str(e)))
    else:
      try:
        _assert_trees_equal(loaded, params)
      except AssertionError:
        silent.append((path, pos))
    finally:
      with open(path, 'wb') as f:
        f.write(data)
  assert not silent, f'{len(silent)} of 30 flips loaded other weights: {silent}'
  assert not unnamed, f'errors not naming the file: {unnamed}'
  assert named_arrays  # flips that loaded other weights name the array
  _assert_trees_equal(checkpoints.load_t5x_params(step_dir), params)


def _largest_data_file(step_dir):
  return max(_files(step_dir / 'state' / 'ocdbt.process_0'),
             key=lambda f: len(open(f, 'rb').read()))


@pytest.mark.parametrize('damage', ['truncated', 'deleted'])
def test_truncated_or_deleted_file_is_named(damage, tmp_path):
  """A half-copied or incomplete checkpoint names the file it lacks."""
  step_dir = pathlib.Path(
      checkpoints.save_t5x_params(_tiny_tree(), tmp_path, step=1))
  path = _largest_data_file(step_dir)
  if damage == 'truncated':
    with open(path, 'r+b') as f:
      f.truncate(10)
    what = 'truncated or changed: ' + re.escape(path) + ' has 10 bytes'
  else:
    os.remove(path)
    what = 'missing: ' + re.escape(path)
  # The arrays stored in that file are named: each array is read on its
  # own, and one that does not read is named with what it raised.
  with pytest.raises(checkpoints.CheckpointError, match=what +
                     r'.*arrays that differ: .*\w+/\w+ \(unreadable: \w+'):
    checkpoints.load_t5x_params(step_dir)


@pytest.mark.parametrize('damage', ['truncated', 'deleted'])
def test_a_checkpoint_without_manifest_cut_short_names_its_file(damage,
                                                               tmp_path):
  """T5X's own checkpoints have no manifest: one cut short (a data file
  missing or shorter than its b-tree reads) is named, file and arrays,
  from the OCDBT b-tree alone, before orbax reads an array (whose failed
  restore named only a chunk key, 'Truncated Zstd-compressed stream')."""
  step_dir = pathlib.Path(
      checkpoints.save_t5x_params(_tiny_tree(), tmp_path, step=1))
  (step_dir / 'MANIFEST.json').unlink()
  path = _largest_data_file(step_dir)
  if damage == 'truncated':
    with open(path, 'r+b') as f:
      f.truncate(10)
    what = re.escape(path) + r': under \d+ bytes'
  else:
    os.remove(path)
    what = re.escape(path) + ': missing'
  for verify in (True, False):
    with pytest.raises(checkpoints.CheckpointError,
                       match='incomplete checkpoint .*' + what +
                       r' \(holds (decoder|encoder)/\w+'):
      checkpoints.load_t5x_params(step_dir, verify=verify)


def test_the_check_of_a_cut_short_copy_walks_every_btree_level(tmp_path):
  """`_check_ocdbt`'s walk of the b-tree finds every key's file under
  interior nodes too (a tree of 5 levels: nodes of at most 200 bytes),
  each key named as its array."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  from specdec_jax.checkpoints import t5x  # pylint: disable=g-import-not-at-top
  spec = {'driver': 'ocdbt', 'base': f'file://{tmp_path}/',
          'config': {'max_decoded_node_bytes': 200,
                     'max_inline_value_bytes': 16}}
  store = ts.KvStore.open(spec).result()
  with ts.Transaction() as txn:
    for i in range(40):
      store.with_transaction(txn)[f'target.layer_{i}.wo/0'] = bytes(100)
  base = ts.KvStore.open(f'file://{tmp_path}/').result()
  assert ts.ocdbt.dump(base).result()['versions'][-1]['root_height'] > 1
  ends, held = t5x._ocdbt_reads(base, str(tmp_path))
  assert set().union(*held.values()) == {f'layer_{i}/wo' for i in range(40)}
  assert all(ends[f] <= os.path.getsize(tmp_path / f) for f in ends)


def test_a_sealed_t5x_checkpoint_is_checked_from_then_on(fixtures_dir,
                                                          tmp_path, capsys):
  """T5X writes no checksums: `seal` records a checkpoint's files, and from
  then on `verify` and every load name a changed or missing one. A sealed
  checkpoint is not sealed again, nor one cut short."""
  ckpt = _ts_checkpoint_with_target(fixtures_dir, tmp_path)  # T5X's chunks
  want = checkpoints.load_t5x_params(ckpt)
  assert cli.main(['verify', str(ckpt)]) == 1
  assert 'no checksum manifest' in capsys.readouterr().err
  assert cli.main(['seal', str(tmp_path / 'model')]) == 0  # its latest step
  assert (ckpt / 'MANIFEST.json').is_file()
  assert cli.main(['verify', str(ckpt)]) == 0
  assert re.search(r'checkpoint_1: 4 files \(0\.000 GB\) match .*MANIFEST',
                   capsys.readouterr().out)
  _assert_trees_equal(checkpoints.load_t5x_params(ckpt), want)
  assert cli.main(['seal', str(ckpt)]) == 1
  assert 'sealed already' in capsys.readouterr().err
  # A bare file's folder may hold anything: not sealed with it.
  shutil.copy(fixtures_dir / 'test_t5_tiny.checkpoint_0', tmp_path)
  assert cli.main(['seal', str(tmp_path / 'test_t5_tiny.checkpoint_0')]) == 1
  assert 'not in a checkpoint folder of its own' in capsys.readouterr().err
  assert not (tmp_path / 'MANIFEST.json').exists()
  chunk = ckpt / 'state.param_states.kernel' / '0.0'
  data = bytearray(chunk.read_bytes())
  data[len(data) // 2] ^= 1
  chunk.write_bytes(data)
  assert cli.main(['verify', str(ckpt)]) == 1
  assert f'corrupt: {chunk} (sha256 differs' in capsys.readouterr().err
  with pytest.raises(checkpoints.CheckpointError, match=re.escape(
      f'corrupt: {chunk}')):
    checkpoints.load_t5x_params(ckpt)
  # An orbax checkpoint without its manifest, cut short: refused.
  step_dir = pathlib.Path(
      checkpoints.save_t5x_params(_tiny_tree(), tmp_path / 'orbax', step=1))
  (step_dir / 'MANIFEST.json').unlink()
  os.remove(_largest_data_file(step_dir))
  assert cli.main(['seal', str(step_dir)]) == 1
  assert 'incomplete checkpoint' in capsys.readouterr().err
  assert not (step_dir / 'MANIFEST.json').exists()


def test_verify_false_skips_the_check_and_a_bad_manifest_is_named(tmp_path):
  """verify=False reads without the manifest (huge checkpoints, or a check
  of one's own); a damaged manifest is an error, never a silent skip."""
  params = _tiny_tree()
  step_dir = pathlib.Path(
      checkpoints.save_t5x_params(params, tmp_path, step=1))
  marker = step_dir / 'commit_success.txt'  # changes no array
  marker.write_text('edited')
  with pytest.raises(checkpoints.CheckpointError,
                     match=re.escape(str(marker)) +
                     '.*every array still reads back as saved'):
    checkpoints.load_t5x_params(step_dir)
  _assert_trees_equal(checkpoints.load_t5x_params(step_dir, verify=False),
                      params)
  (step_dir / 'MANIFEST.json').write_text('{"format": "specdec_jax.chec')
  with pytest.raises(checkpoints.CheckpointError, match='MANIFEST.json'):
    checkpoints.load_t5x_params(step_dir)


def test_checkpoint_without_manifest_loads_with_a_note(fixtures_dir,
                                                       tmp_path, caplog):
  """T5X's own checkpoints have no manifest: they load, and the log says
  once per path that nothing was verified."""
  path = tmp_path / 'test_t5_tiny.checkpoint_0'  # a path not loaded before
  shutil.copy(fixtures_dir / 'test_t5_tiny.checkpoint_0', path)
  with caplog.at_level(logging.INFO):
    for _ in range(2):
      checkpoints.load_t5x_params(path, config=FIXTURE_CFG)
    checkpoints.load_t5x_params(path, verify=False)
  notes = [r.getMessage() for r in caplog.records
           if 'not verified' in r.getMessage()]
  assert len(notes) == 1 and str(path) in notes[0], notes


# --- gs:// addresses, on a local GCS (tests/fake_gcs.py) ---------------------


@pytest.mark.filterwarnings('ignore:Sharding info not provided when restoring')
def test_every_t5x_format_loads_from_gcs_as_from_disk(gcs, fixtures_dir,
                                                      np_v11, tmp_path):
  """T5X keeps its checkpoints on GCS: each format loads from a gs://
  address as its copy on disk does, a model dir taking its latest step.

  The legacy tensorstore one has the specs T5X writes on GCS (a gcs
  kvstore of another bucket, paths relative to the checkpoint), read from
  where the checkpoint now is.
  """
  inline = fixtures_dir / 'test_t5_tiny.checkpoint_0'
  fake_gcs.upload(inline, f'{gcs}/inline/checkpoint_0/checkpoint')
  ts_ckpt = _ts_checkpoint_with_target(fixtures_dir, tmp_path / 'ts', True)
  fake_gcs.upload(ts_ckpt.parent, f'{gcs}/ts')
  early, _ = _early_orbax_with_target(tmp_path)
  fake_gcs.upload(early, f'{gcs}/early/1')
  _, params = np_v11
  for step in (1, 2):  # the model dir's latest is step 2
    checkpoints.save_t5x_params(jax.tree.map(lambda x, s=step: x * s, params),
                                tmp_path / 'orbax', step)
  fake_gcs.upload(tmp_path / 'orbax', f'{gcs}/orbax')
  for local, address, config in (
      (inline, f'{gcs}/inline', FIXTURE_CFG),
      (ts_ckpt, f'{gcs}/ts/checkpoint_1', None),
      (early, f'{gcs}/early/1', None),
      (tmp_path / 'orbax' / 'checkpoint_2', f'{gcs}/orbax', TINY_V11)):
    want = checkpoints.load_t5x_params(local, config)
    assert _flat(want)
    _assert_trees_equal(checkpoints.load_t5x_params(address, config), want)
  _assert_trees_equal(checkpoints.load_t5x_params(f'{gcs}/orbax', TINY_V11),
                      jax.tree.map(lambda x: x * 2, params))


def test_a_checkpoint_saved_to_gcs_loads_checked_and_sharded(gcs, np_v11):
  """save_t5x_params writes to gs:// (orbax, then the manifest), and the
  checkpoint loads back checked against it, whole or into shardings."""
  model, params = np_v11
  step_dir = checkpoints.save_t5x_params(params, f'{gcs}/model', 4)
  assert step_dir == f'{gcs}/model/checkpoint_4'
  assert checkpoints.isfile(f'{step_dir}/MANIFEST.json')
  with pytest.raises(FileExistsError, match='checkpoint_4'):
    checkpoints.save_t5x_params(params, f'{gcs}/model', 4)
  _assert_trees_equal(checkpoints.load_t5x_params(step_dir, TINY_V11), params)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  sharded = checkpoints.load_t5x_params(
      step_dir, TINY_V11, shardings=jax.tree.map(lambda _: device,
                                                 model.param_shapes()))
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(sharded))
  _assert_trees_equal(sharded, params)


def test_the_local_gcs_takes_a_second_ocdbt_commit_as_gcs_does(gcs):
  """An orbax save may commit its OCDBT manifest twice: the second write is
  conditional on the generation read back. The local GCS reads back the
  generation written (its bytes alone read as generation 0, and the save
  failed now and then, 'Malformed StorageGeneration')."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  store, key = fake_gcs.object_store(f'{gcs}/db/')
  spec = {'driver': 'ocdbt', 'base': {'driver': 'gcs', 'path': key,
                                      'bucket': gcs[len('gs://'):]}}
  for name in ('a', 'b'):  # a database opened anew reads the manifest
    ts.KvStore.open(spec).result().write(name, name.encode()).result()
  db = ts.KvStore.open(spec).result()
  assert [db.read(n).result().value for n in ('a', 'b')] == [b'a', b'b']
  written = store.write(f'{key}x', b'x').result().generation
  assert store.read(f'{key}x').result().stamp.generation == written


def test_damage_on_gcs_is_named(gcs, tmp_path, monkeypatch):
  """A changed, shorter or longer object fails the manifest, naming its
  gs:// address (objects hashed in ranges, here of 500 bytes); one
  missing from a checkpoint without a manifest is named from the b-tree."""
  from specdec_jax.checkpoints import manifest  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(manifest, '_GCS_BLOCK', 500)
  step_dir = pathlib.Path(
      checkpoints.save_t5x_params(_tiny_tree(), tmp_path, step=1))
  address = fake_gcs.upload(tmp_path, f'{gcs}/model') + '/checkpoint_1'
  whole, read_bytes = [], manifest._storage.read_bytes
  monkeypatch.setattr(manifest._storage, 'read_bytes',
                      lambda p: whole.append(p) or read_bytes(p))
  assert checkpoints.verify_checkpoint(address)['files'] == len(
      _files(step_dir, skip=('MANIFEST.json',)))
  assert not [p for p in whole if '/d/' in p]  # intact: read in ranges
  rel = pathlib.Path(_largest_data_file(step_dir)).relative_to(tmp_path)
  store, key = fake_gcs.object_store(f'{gcs}/model/{rel.as_posix()}')
  data = bytes(store.read(key).result().value)
  assert len(data) > 1000  # several ranges
  flipped = bytearray(data)
  flipped[len(data) // 2] ^= 1
  named = re.escape(f'{gcs}/{key}')
  for damaged, what in (
      (bytes(flipped), f'corrupt: {named} \\(sha256 differs'),
      (data[:-5], f'truncated or changed: {named} has {len(data) - 5} '),
      (data + b'x', f'truncated or changed: {named} has {len(data) + 1} ')):
    store.write(key, damaged).result()
    with pytest.raises(checkpoints.CheckpointError, match=what):
      checkpoints.load_t5x_params(address)
  store.delete_range(store.KeyRange(key, key + '\x00')).result()
  manifest = f'model/{rel.parts[0]}/MANIFEST.json'
  store.delete_range(store.KeyRange(manifest, manifest + '\x00')).result()
  with pytest.raises(checkpoints.CheckpointError,
                     match=f'incomplete checkpoint .*{named}: missing'):
    checkpoints.load_t5x_params(address)


def test_a_gcs_that_gives_no_listing_in_time_is_said(gcs, monkeypatch):
  """Where GCS cannot be reached, tensorstore retries for many minutes
  without a word; a listing (every gs:// path is listed before it is read)
  that takes longer than `_storage.LIST_TIMEOUT_S` is an InputError naming
  the address and the usual causes. (Here GCS never answers: each listing
  is a tensorstore future nothing resolves, as where GCS cannot be reached;
  a short limit on the local GCS's listings was a race its answer could win
  on a loaded machine.)"""
  storage = checkpoints._storage  # pylint: disable=protected-access
  opened = storage._gcs_store  # pylint: disable=protected-access
  waits, promises = [], []

  class Unanswering:
    """The bucket's store, whose listings never answer."""

    def list(self, key_range):
      waits.append(key_range)
      promise, future = ts.Promise.new()
      promises.append(promise)  # kept: a dropped one would end the wait
      return future

  monkeypatch.setattr(storage, '_gcs_store', lambda path: (
      Unanswering(), opened(path)[1]))
  monkeypatch.setattr(storage, 'LIST_TIMEOUT_S', 0.05)
  with pytest.raises(checks.InputError, match=(
      f'{gcs}/ckpt\\S*: GCS gave no listing in 0.05 s .* no network, or no '
      f'credentials.*gsutil ls {gcs}/ckpt')):
    checkpoints.load_t5x_params(f'{gcs}/ckpt')
  # Said at the first listing: a run's fingerprint of the folder (its
  # manifest looked for) does not take it for a damaged manifest and list
  # again (twice the wait).
  waits.clear()
  with pytest.raises(checks.InputError, match='GCS gave no listing'):
    checkpoints.manifest.fingerprint(f'{gcs}/ckpt')
  assert len(waits) == 1


def test_a_write_that_fails_leaves_no_temp_file(tmp_path):
  """A file written over a folder (an OUTPUT_CACHE naming one) fails as
  the folder is in the way, and leaves no '<path>.tmp-<pid>' beside it."""
  (tmp_path / 'a_folder').mkdir()
  with pytest.raises(IsADirectoryError):
    checkpoints.write_bytes(str(tmp_path / 'a_folder'), b'x')
  assert sorted(p.name for p in tmp_path.iterdir()) == ['a_folder']
