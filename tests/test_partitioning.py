"""The decoders on a device mesh give the single-device outputs, sharded.

Eight simulated CPU devices need XLA_FLAGS before jax starts, so every mesh
check runs in ONE subprocess (tests/mesh_checks.py, ~30 s of CPU: it
compiles 10 small programs) and the tests below assert on its JSON. The rest
of the suite keeps its single device.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import eval as eval_lib
from specdec_jax import loading
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax.experiments import reproduce

ROOT = pathlib.Path(__file__).resolve().parents[1]
# 8 devices (XLA's optimization level 0 comes with the suite's XLA_FLAGS,
# tests/conftest.py; the single-device references run under the same flags).
FLAGS = ('--xla_force_host_platform_device_count=8 '
         '--xla_llvm_disable_expensive_passes=true')


@pytest.fixture(scope='module')
def mesh(tmp_path_factory, fixtures_dir):
  out = tmp_path_factory.mktemp('mesh') / 'mesh.json'
  env = dict(os.environ)
  env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') + ' ' + FLAGS).strip()
  env['JAX_PLATFORMS'] = 'cpu'
  proc = subprocess.run(
      [sys.executable, '-m', 'tests.mesh_checks', str(out),
       str(fixtures_dir)], env=env, cwd=ROOT, capture_output=True,
      text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(out.read_text())


MESHES = ('2x4', '1x8')


@pytest.mark.parametrize('name', MESHES)
def test_greedy_outputs_equal_single_device(mesh, name):
  """Sharding must not change a token: baseline and speculative, float32.

  The drafter is sharded by the same rules on 2x4 and replicated (data
  parallel only) on 1x8; it accepts some drafts and rejects others, so both
  branches of the rejection step ran.
  """
  single, got = mesh['single']['greedy'], mesh['meshes'][name]['greedy']
  assert got['baseline']['tokens'] == single['baseline']['tokens']
  assert got['speculative']['tokens'] == single['speculative']['tokens']
  assert got['speculative']['tokens'] == single['baseline']['tokens']
  spec = got['speculative']
  assert 0 < spec['accepted'] < spec['drafted']
  assert spec['accepted'] == single['speculative']['accepted']


def test_sampled_outputs_equal_single_device_with_same_rng(mesh):
  """Temperature 1, a fixed key: the sharded loop draws the same tokens.

  Stronger than a distribution test where it holds: jax's random bits do
  not depend on the sharding, so only float rounding of the sharded matmuls
  could move a draw, and it does not here.
  """
  single = mesh['single']['sampled']
  got = mesh['meshes']['2x4']['sampled']
  assert got == single
  assert 0 < got['accepted'] < got['drafted']


@pytest.mark.parametrize('kind', ['pass', 'pass_tree', 'heads_tree'])
def test_self_drafting_kinds_on_a_sharded_target(mesh, kind):
  """The target's own loops (look-ahead slots; final states on a tree) take
  the sharded target and give its single-device greedy tokens."""
  got = mesh['self_drafting'][kind]
  assert 'error' not in got, got
  assert got['tokens'] == mesh['single']['greedy']['baseline']['tokens']
  assert got['drafted'] > 0


def test_a_stream_refills_in_sub_batches_the_mesh_divides(mesh):
  """4 slots over 'data' = 2: the default refills encode 2 or 4 rows (one
  row would not divide), and the stream gives one device's tokens."""
  stream = mesh['self_drafting']['stream']
  assert stream['refill_sizes'] == [2, 4]
  assert stream['baseline'] == stream['single_baseline']


@pytest.mark.parametrize('name,data,model', [('2x4', 2, 4), ('1x8', 1, 8)])
def test_params_and_batch_are_sharded(mesh, name, data, model):
  """Each device holds 1/model of heads / mlp / vocab, a whole 'embed'."""
  res = mesh['meshes'][name]
  shards = res['params_shards']
  assert len(shards['encoder/layers_0/mlp/wi_0/kernel']) == 8
  assert set(map(tuple, shards['encoder/layers_0/mlp/wi_0/kernel'])) == {
      (32, 64 // model)}
  assert set(map(tuple, shards['decoder/layers_0/mlp/wo/kernel'])) == {
      (64 // model, 32)}
  assert set(map(tuple, shards['decoder/layers_0/self_attention/query/'
                               'kernel'])) == {(32, 32 // model)}
  assert set(map(tuple, shards['token_embedder/embedding'])) == {
      (128 // model, 32)}
  assert set(map(tuple, shards['decoder/logits_dense/kernel'])) == {
      (32, 128 // model)}
  assert set(map(tuple, shards['encoder/relpos_bias/rel_embedding'])) == {
      (8 // model, 32)}
  assert set(map(tuple, shards['encoder/encoder_norm/scale'])) == {(32,)}
  assert {tuple(s) for s in res['inputs_shards']} == {(4 // data, 7)}
  if name == '1x8':  # The drafter replicated (data-parallel rules).
    assert set(map(tuple, res['draft_shards'][
        'decoder/layers_0/mlp/wi_0/kernel'])) == {(32, 64)}


def test_caches_and_logits_follow_the_rules(mesh):
  """Both caches: batch over 'data', heads over 'model'; logits: vocab."""
  res = mesh['meshes']['2x4']
  assert res['self_cache_spec'] == "P('data', None, 'model')"
  assert res['cross_cache_spec'] == "P('data', None, 'model')"
  # [batch 4 / 2, max_len 14, heads 8 / 4, head_dim 4]; input length 7.
  assert {tuple(s) for s in res['self_cache_shards']} == {(2, 14, 2, 4)}
  assert {tuple(s) for s in res['cross_cache_shards']} == {(2, 7, 2, 4)}
  assert res['logits_spec'] == "P('data', None, 'model')"


@pytest.mark.parametrize('name,data,model', [('2x4', 2, 4), ('1x8', 1, 8)])
@pytest.mark.parametrize('program', ['loop', 'baseline_loop'])
def test_compiled_loops_have_model_axis_collectives(mesh, name, data, model,
                                                    program):
  """Tensor parallelism's all-reduces over 'model'; over 'data' only counters.

  The attention-out and MLP-out partial sums are all-reduced over the
  'model' axis (groups of `model` devices). Rows are independent, so over
  'data' there may only be the loop's bookkeeping: the all-rows-ended test
  (pred[]) and the per-position acceptance counter (s32[gamma]). Nothing
  leaves the device inside the loop.
  """
  facts = mesh['meshes'][name][program]
  assert facts['host_transfers'] == 0
  assert facts['collectives']['all-reduce'] > 0
  for c in facts['list']:
    if c['group_size'] != model:
      assert data > 1 and c['group_size'] == data, c
      assert c['kind'] == 'all-reduce', c
      assert c['result'] in ('pred[]', 's32[3]{0}', 's32[3]'), c


def test_one_loop_iteration_is_one_target_calls_collectives(mesh):
  """1x8, replicated drafter: per iteration exactly one sharded target call.

  One decoder layer: 3 all-reduces (self-attention out, cross-attention
  out, MLP out) + 1 for the vocab-sharded embedding lookup, and the 2
  all-gathers of the per-shard (value, index) maxima over the vocab-sharded
  logits. The replicated drafter adds none; the baseline's step is the same.
  """
  for program in ('loop', 'baseline_loop'):
    per = mesh['meshes']['1x8'][program]['per_iteration']
    assert per['all-reduce'] == 3 * 1 + 1, (program, per)
    assert per['all-gather'] == 2, (program, per)


@pytest.mark.parametrize('case,words', [
    ('too_many_partitions', ("'model'", '16', '8 devices')),
    ('not_dividing_devices', ("'model'", '3', '8 devices')),
    ('heads', ("'model'", "'heads'", 'size 4', 'size 8')),
    ('vocab', ("'model'", "'vocab'", 'size 100')),
    ('mlp', ("'model'", "'mlp'", 'size 36')),
    ('batch', ("'data'", "'batch'", 'size 3', 'size 2')),
    ('eval_batch', ('BATCH_SIZE 3', 'into the 2 parts', 'multiple of 2',
                    '(folder made: False)')),
])
def test_bad_mesh_is_a_clear_value_error(mesh, case, words):
  """A mesh that cannot fit says which axis and which sizes, not XLA."""
  message = mesh['errors'][case]
  assert message is not None, f'{case}: no ValueError'
  for word in words:
    assert word in message, (word, message)


@pytest.mark.parametrize('kind', ['legacy', 'orbax'])
def test_checkpoints_restore_straight_into_shardings(mesh, kind):
  """T5X's own legacy fixture and our orbax checkpoint, restored sharded.

  Every device holds only its slice (shard shapes), the values equal an
  unsharded load, and the specs follow T5X's rules.
  """
  res = mesh['checkpoint']
  assert res[f'{kind}_equal']
  shards, specs = res[f'{kind}_shards'], res[f'{kind}_specs']
  if kind == 'legacy':  # vocab 32128, emb 8, 4 heads x 3, mlp 16; 2x4.
    assert set(map(tuple, shards['token_embedder/embedding'])) == {
        (32128 // 4, 8)}
    assert set(map(tuple, shards['decoder/layers_1/mlp/wi_1/kernel'])) == {
        (8, 4)}
    assert set(map(tuple, shards['encoder/layers_0/attention/out/'
                                 'kernel'])) == {(3, 8)}
  else:  # The mesh test config: vocab 128, emb 32, 8 x 4, mlp 64.
    assert set(map(tuple, shards['token_embedder/embedding'])) == {(32, 32)}
    assert set(map(tuple, shards['decoder/layers_0/mlp/wo/kernel'])) == {
        (16, 32)}
  assert specs['decoder/logits_dense/kernel'] == "P(None, 'model')"
  assert specs['encoder/encoder_norm/scale'] == 'P(None,)'
  assert all(len(v) == 8 for v in shards.values())


def test_a_widened_target_is_written_straight_into_its_shardings(mesh):
  """An XXL-cost target on a mesh: the widening program writes each
  device's slices (with noise in the dead weights: every value placed),
  equal to the whole widened tree; emb 64, 16 heads x 4, mlp 128, vocab
  128 on 2 x 4."""
  res = mesh['widening']
  assert res['widened_equal']
  shards = res['widened_shards']
  assert set(map(tuple, shards['token_embedder/embedding'])) == {(32, 64)}
  assert set(map(tuple, shards['decoder/layers_0/mlp/wo/kernel'])) == {
      (32, 64)}
  assert set(map(tuple, shards['encoder/layers_0/attention/query/'
                                'kernel'])) == {(64, 16)}
  assert res['widened_specs']['decoder/logits_dense/kernel'] == (
      "P(None, 'model')")


def test_tensorstore_leaves_read_shard_by_shard(mesh):
  """Legacy T5X zarr leaves: each device reads its rows, cast on the way."""
  res = mesh['checkpoint']['tensorstore']
  assert res['equal']
  assert res['kernel_dtype'] == 'float32'  # stored float64
  # kernel [10, 5] split over 'data' (2 on a 2 x 4 mesh), bias replicated.
  assert {tuple(s) for s in res['shards']['kernel']} == {(5, 5)}
  assert {tuple(s) for s in res['shards']['bias']} == {(5,)}
  assert len(res['shards']['kernel']) == 8


def test_a_drafter_holding_the_targets_params_shares_its_placed_arrays(v11):
  """The merged kinds that draft with the target (PaSS, heads, trees)
  hold the target's own params: on the job's mesh they are the
  target's placed arrays, not a copy replicated on every device (an XXL
  target does not fit twice). In-process, on this one device's mesh."""
  model, params = v11
  part = partitioning.Partitioner(num_partitions=1)
  keys = jnp.ones((4, model.config.emb_dim))
  heads = reproduce.eval_setup(reproduce.make_setup('shipped'), 'en_de',
                               'dec2', gamma=2).replace(drafter='heads')
  loaded = loading.Loaded(setup=heads, task=None, target=model,
                          target_params=params, drafter=object(),
                          draft_params={'embedder': params, 'keys': keys})
  placed = eval_lib.shard_loaded(loaded, part, shard_drafter=False)
  target = jax.tree.leaves(placed.target_params)
  embedder = jax.tree.leaves(placed.draft_params['embedder'])
  assert len(embedder) == len(target) > 0
  assert all(a is b for a, b in zip(embedder, target))
  assert placed.draft_params['keys'].sharding == NamedSharding(part.mesh, P())


def test_a_tree_drafters_model_is_shared_by_jobs_asked_to_shard_it(mesh):
  """`shard_drafter` shards a T5 drafter's model; a tree drafter's stays
  replicated (`eval.shard_loaded`), and is loaded so (2 x 4 mesh): jobs on
  one mesh hold it once, not a copy each."""
  res = mesh['shared_drafter']
  assert res['shared'] == res['leaves'] > 0 and res['replicated'], res


@pytest.mark.parametrize('kind', ['t5', 'tree', 't5_sharded'])
def test_jobs_on_one_mesh_share_the_models_placed_arrays(kind):
  """A sweep's jobs on one mesh (setups that differ in their drafting,
  one `loading.LoadCache`) decode with the same placed arrays, target and
  draft model (replicated, or sharded by the target's rules), not a copy
  per job (on an accelerator: the drafter once per
  device, not once per cell). In-process, on this one device's mesh."""
  part = partitioning.Partitioner(num_partitions=1)
  cache = loading.LoadCache()
  setup = reproduce.eval_setup(reproduce.make_setup('shipped'), 'en_de',
                               'dec2', gamma=2)
  if kind == 'tree':
    setup = setup.replace(drafter='tree', tree='beam:2,2,3')
  first, second = (eval_lib.load(s, partitioner=part, cache=cache,
                                 shard_drafter=kind == 't5_sharded')
                   for s in (setup, setup.replace(gamma=1)))
  for name in ('target_params', 'draft_params'):
    mine, theirs = (jax.tree.leaves(getattr(x, name)) for x in (first,
                                                                 second))
    assert len(mine) == len(theirs) > 0
    assert all(a is b for a, b in zip(mine, theirs)), name
  assert cache.loads['target'] == 1


def test_the_global_mesh_is_every_processs_devices():
  """`global_mesh=True` builds the mesh of `jax.devices()` (T5X's), not of
  this process's own; a mesh within one process spans none, so its
  decisions are this process's own (`agree` returns the value itself,
  not a copy) and its outputs are read as they are (`to_host`). Passing
  devices too is an error. (Two processes: tests/test_multihost.py.)"""
  part = partitioning.Partitioner(global_mesh=True)
  assert list(part.mesh.devices.flat) == jax.devices()
  assert not part.spans_processes
  value = {'gamma': 3, 1: (2, 3)}
  assert part.agree(value) is value and partitioning.agree(value) is value
  host = partitioning.to_host({'tokens': jnp.arange(6).reshape(2, 3)})
  assert isinstance(host['tokens'], np.ndarray)
  np.testing.assert_array_equal(host['tokens'], np.arange(6).reshape(2, 3))
  with pytest.raises(ValueError, match='devices or global_mesh'):
    partitioning.Partitioner(global_mesh=True, devices=jax.devices())


def test_a_submesh_of_no_ints_is_named():
  """A submesh is sizes: '22' is no (2, 2), nor (2.5,) a size (before: a
  model axis of 4 and of 2, silently)."""
  for submesh in ('22', (2.5,), (0, 1), (True, 1)):
    with pytest.raises(checks.InputError,
                       match='model_parallel_submesh must be ints >= 1'):
      partitioning.make_mesh(None, submesh)


def test_devices_that_are_no_distinct_jax_devices_are_named():
  """Device names or ids, one device twice or none (before: a mesh of
  strings that failed at the first sharding, a mesh of one device twice,
  "more partitions than the 0 devices") are refused when the mesh is
  made."""
  device = jax.devices()[0]
  assert partitioning.make_mesh(devices=[device]).devices.size == 1
  for devices in (['cpu:0'], [device, device], [], [0]):
    with pytest.raises(checks.InputError,
                       match='devices must be distinct jax devices'):
      partitioning.Partitioner(devices=devices)


def test_params_of_another_config_are_refused_before_they_are_placed():
  """(before: placed as they were on one device; jax's IndivisibleError
  on a mesh that split a dimension they lack)."""
  config = network.T5Config(vocab_size=16, emb_dim=8, num_heads=2,
                            head_dim=4, mlp_dim=16, num_encoder_layers=1,
                            num_decoder_layers=1)
  model = network.T5Model(config)
  other = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), network.T5Model(
      config.replace(mlp_dim=12)).param_shapes())
  with pytest.raises(checks.InputError, match=(
      r'^params: .* parameters differ from the T5Config.*mlp_dim 12')):
    partitioning.Partitioner().shard_params(other, model)


def test_axis_rules_that_are_no_pairs_of_axes_are_named():
  """A rule is (logical axis, mesh axis or None): a string or a dict of
  rules (before: split into characters, silently) and a mesh axis the
  mesh lacks (before: jax's "Resource axis ... not found" at the first
  sharding) are refused when the partitioner is made."""
  partitioning.Partitioner(logical_axis_rules=[('batch', 'data'),
                                               ('embed', None)])
  for rules in ('batch:data', {'batch': 'data'}, [('batch', 'dat')],
                [('batch', 'data', 'model')]):
    with pytest.raises(checks.InputError, match=(
        r"logical_axis_rules must be \(logical axis, mesh axis of "
        r"\('data', 'model'\) or None\) pairs")):
      partitioning.Partitioner(logical_axis_rules=rules)
