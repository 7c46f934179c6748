"""Every check on a simulated 8-device CPU mesh, in one process; JSON out.

Run by tests/test_partitioning.py in a subprocess (the 8 simulated devices
need XLA_FLAGS before jax starts, which the rest of the suite must not see),
as a module from the repository root (so `specdec_jax` is the tree's):

  python -m tests.mesh_checks OUT.json [FIXTURES_DIR]

(XLA_FLAGS defaults to 8 devices and XLA's CPU optimizations off, for
compile time; the test sets the same).

It compiles few programs (batch 4, 10 output tokens): the single-device
references, then per mesh (2 x 4 and 1 x 8) the baseline and the speculative
loop (greedy; sampled on 2 x 4) and one target call, and the widening on
2 x 4, and records what the test asserts on: tokens, shard shapes,
collectives, error messages.
"""

import json
import os
import sys
import time

os.environ.setdefault('XLA_FLAGS',
                      '--xla_force_host_platform_device_count=8 '
                      '--xla_backend_optimization_level=0 '
                      '--xla_llvm_disable_expensive_passes=true')

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import msgpack
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import speculative
from specdec_jax import streaming
from specdec_jax import synthetic
from specdec_jax import widening
from specdec_jax.checkpoints import t5x
from specdec_jax.sampling import SamplingConfig

# Heads, joined heads x head_dim, mlp and vocab divisible by 8 and 4.
CONFIG = network.T5Config(
    vocab_size=128, emb_dim=32, num_heads=8, head_dim=4, mlp_dim=64,
    num_encoder_layers=1, num_decoder_layers=1,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False)
MAX_LEN = 10
GAMMA = 3
EOS = 1
SAMPLED = SamplingConfig(temperature=1.0)


def _tokens(x):
  return np.asarray(x).tolist()


def _summary(result):
  out = {'tokens': _tokens(result.tokens)}
  if hasattr(result, 'stats'):
    out['drafted'] = int(np.sum(result.stats.drafted))
    out['accepted'] = int(np.sum(result.stats.accepted))
  return out


def _speculative(target, params, drafter, draft_params, inputs, sampling,
                 rng):
  return _summary(speculative.speculative_sample(
      target, params, drafter, draft_params, inputs, gamma=GAMMA,
      max_decode_len=MAX_LEN, eos_id=EOS, sampling=sampling, rng=rng))


def _decode(target, params, drafter, draft_params, inputs, sampling, rng,
            facts=None):
  """Baseline and speculative outputs; with `facts`, the loops' HLO facts.

  With `facts` both loops are compiled ahead of time (`lower_*`) and those
  executables run, so their HLO text costs no second compilation.
  """
  kw = dict(max_decode_len=MAX_LEN, eos_id=EOS, sampling=sampling, rng=rng)
  if facts is None:
    base = _summary(decoding.temperature_sample(target, params, inputs,
                                                **kw))
    spec = _speculative(target, params, drafter, draft_params, inputs,
                        sampling, rng)
  else:
    compiled = decoding.temperature_sample.lower(
        target, params, inputs, **kw).compile()
    facts['baseline_loop'] = _hlo_facts(compiled.as_text())
    base = _summary(compiled(params, inputs, rng, jnp.int32(MAX_LEN)))
    compiled = speculative.speculative_sample.lower(
        target, params, drafter, draft_params, inputs, gamma=GAMMA,
        **kw).compile()
    facts['loop'] = _hlo_facts(compiled.as_text())
    spec = _summary(compiled(params, draft_params, inputs, inputs, rng))
  return {'baseline': base, 'speculative': spec}


def _self_drafting(model, params, target, s_params, part, inputs, key):
  """Kinds that draft with the target itself, greedy on 2 x 4 (their loops
  call the sharded target with look-ahead slots, in PaSS's tree layout, for
  final states and on a tree), and the baseline streaming 8 examples
  through 4 slots (refills of the default sizes, 2 and 4 rows: multiples of
  'data'), against one device's baseline."""
  out = {}
  t0 = time.perf_counter()
  for kind in ('pass', 'pass_tree', 'heads_tree'):
    source = drafters.DraftSource(
        vocab_size=CONFIG.vocab_size, target_model=target,
        target_params=s_params, output_length=MAX_LEN, tree='beam:2,2,3')
    drafter, draft_params = drafters.get_kind(kind).build(source)
    try:  # a failure is this kind's test's, not every mesh test's
      out[kind] = _speculative(target, s_params, drafter, draft_params,
                               part.shard_batch(inputs), SamplingConfig(),
                               key)
    except Exception as e:  # pylint: disable=broad-except
      out[kind] = {'error': f'{type(e).__name__}: {e}'}
  eight = np.concatenate([inputs, inputs[::-1] % 50 + 2])
  kw = dict(batch_size=4, max_decode_len=MAX_LEN, eos_id=EOS)
  out['stream'] = {
      'single_baseline': _tokens(decoding.temperature_sample(
          model, params, eight, max_decode_len=MAX_LEN, eos_id=EOS).tokens),
      'baseline': _tokens(streaming.sample_stream(
          target, s_params, part.shard_batch(eight), **kw).tokens),
      'refill_sizes': list(streaming.bucket_sizes(
          4, multiple=partitioning.batch_multiple(target)))}
  out['seconds'] = time.perf_counter() - t0
  return out


def _hlo_facts(text):
  return {'collectives': partitioning.count_collectives(text),
          'per_iteration': partitioning.loop_collectives(text),
          'list': partitioning.list_collectives(text),
          'host_transfers': sum(text.count(op) for op in (
              ' outfeed(', ' infeed(', ' send(', ' recv(', 'callback'))}


def _error(fn):
  try:
    fn()
  except ValueError as e:
    return str(e)
  return None


def main(out_path, fixtures=None):
  assert jax.device_count() == 8, jax.devices()
  out = {'devices': jax.device_count()}
  model = network.T5Model(CONFIG)
  params = model.init_params(jax.random.key(1))
  draft_params = synthetic.perturbed(params, 0.2, jax.random.key(0))
  rng = np.random.default_rng(3)
  inputs = rng.integers(2, CONFIG.vocab_size, (4, 7)).astype(np.int32)
  inputs[1, 4:] = 0
  inputs[3, 2:] = 0
  key = jax.random.key(7)

  # Single-device references (arrays on device 0, no mesh).
  t0 = time.perf_counter()
  drafter = drafters.T5Drafter(model)
  ref = {'greedy': _decode(model, params, drafter, draft_params, inputs,
                           SamplingConfig(), key),
         'sampled': _speculative(model, params, drafter, draft_params,
                                 inputs, SAMPLED, key)}
  out['single'] = ref
  out['single_seconds'] = time.perf_counter() - t0

  out['meshes'] = {}
  for num_partitions, draft_rules in (
      (4, None), (8, partitioning.data_parallel_rules())):
    part = partitioning.Partitioner(num_partitions=num_partitions)
    name = f'{part.data_size}x{part.model_size}'
    target = part.sharded_model(model)
    drafter = drafters.T5Drafter(part.sharded_model(model, draft_rules))
    s_params = part.shard_params(params, target)
    s_draft = part.shard_params(draft_params, drafter.model)
    s_inputs = part.shard_batch(inputs)
    res = {'params_shards': partitioning.shard_shapes(s_params),
           'draft_shards': partitioning.shard_shapes(s_draft),
           'inputs_shards': [list(s.data.shape) for s in
                             s_inputs.addressable_shards]}
    t0 = time.perf_counter()
    res['greedy'] = _decode(target, s_params, drafter, s_draft, s_inputs,
                            SamplingConfig(), key, facts=res)

    if name == '2x4':
      res['sampled'] = _speculative(target, s_params, drafter, s_draft,
                                    s_inputs, SAMPLED, key)
      # The cache after one target call (gamma + 1 tokens), as in the loop.
      cache = jax.jit(target.init_cache, static_argnums=2)(
          s_params, s_inputs, MAX_LEN + GAMMA + 1)
      block = part.shard_batch(np.ones((4, GAMMA + 1), np.int32))
      logits, cache = jax.jit(target.extend)(s_params, block, cache)
      res['logits_spec'] = str(logits.sharding.spec)
      for kind in ('self', 'cross'):
        x = getattr(cache, f'{kind}_key')[0]
        res[f'{kind}_cache_spec'] = str(x.sharding.spec)
        res[f'{kind}_cache_shards'] = [list(s.data.shape) for s in
                                       x.addressable_shards]
    res['decode_seconds'] = time.perf_counter() - t0
    out['meshes'][name] = res
    if name == '2x4':
      out['self_drafting'] = _self_drafting(model, params, target, s_params,
                                            part, inputs, key)

  # Bad meshes: each must be a ValueError naming the axis, before compiling.
  part8 = partitioning.Partitioner(num_partitions=8)
  part4 = partitioning.Partitioner(num_partitions=4)
  out['errors'] = {
      'too_many_partitions': _error(
          lambda: partitioning.Partitioner(num_partitions=16)),
      'not_dividing_devices': _error(
          lambda: partitioning.Partitioner(num_partitions=3)),
      'heads': _error(lambda: part8.shard_params(
          None, network.T5Model(CONFIG.replace(num_heads=4)))),
      'vocab': _error(lambda: part8.shard_params(
          None, network.T5Model(CONFIG.replace(vocab_size=100)))),
      'mlp': _error(lambda: part8.shard_params(
          None, network.T5Model(CONFIG.replace(mlp_dim=36)))),
      'batch': _error(lambda: decoding.temperature_sample.lower(
          part4.sharded_model(model), params,
          jax.ShapeDtypeStruct((3, 7), jnp.int32), max_decode_len=MAX_LEN)),
      'eval_batch': _eval_batch_error(part4),
  }

  # A widened target written straight into its shardings (an XXL-cost
  # target on a mesh: no device holds it whole).
  big = widening.widened_config(CONFIG, dict(emb_dim=64, num_heads=16,
                                             mlp_dim=128))
  out['widening'] = _restore_report(
      'widened', widening.widen(params, CONFIG, big, noise=0.1),
      widening.widen(params, CONFIG, big, noise=0.1, shardings=(
          part4.param_shardings(network.T5Model(big)))))
  out['shared_drafter'] = _shared_drafter(part4)
  if fixtures:
    out['checkpoint'] = _checkpoint_checks(fixtures, part4)
  with open(out_path, 'w') as f:
    json.dump(out, f)


def _eval_batch_error(part):
  """The eval job's refusal of a batch its mesh cannot split (None: no
  error), and whether it came before the run folder was made."""
  import tempfile  # pylint: disable=g-import-not-at-top
  from specdec_jax import eval as eval_lib
  from specdec_jax.experiments import reproduce
  setup = reproduce.eval_setup(reproduce.make_setup('shipped'), 'en_de',
                               'dec2', gamma=2, batch_size=3)
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, 'run')
    message = _error(lambda: eval_lib.evaluate(setup, out, partitioner=part))
    return message and f'{message} (folder made: {os.path.exists(out)})'


def _shared_drafter(part):
  """Two jobs of a tree drafter on the mesh with `shard_drafter` (one
  `LoadCache`): the leaves of their draft params that are the same arrays
  (a tree's draft model is replicated, shard_drafter or not), of all."""
  from specdec_jax import eval as eval_lib
  from specdec_jax import loading
  from specdec_jax.experiments import reproduce
  setup = reproduce.eval_setup(reproduce.make_setup('shipped'), 'en_de',
                               'dec2', gamma=2, drafter='tree',
                               tree='beam:2,2,3')
  cache = loading.LoadCache()
  first, second = (jax.tree.leaves(eval_lib.load(
      s, partitioner=part, cache=cache, shard_drafter=True).draft_params)
                   for s in (setup, setup.replace(gamma=1)))
  return {'shared': sum(a is b for a, b in zip(first, second)),
          'leaves': len(first),
          'replicated': all(a.sharding.is_fully_replicated for a in first)}


def _checkpoint_checks(fixtures, part):
  """T5X's own fixture and one of ours restored straight into shardings."""
  import tempfile  # pylint: disable=g-import-not-at-top
  res = {}
  legacy = os.path.join(fixtures, 'test_t5_tiny.checkpoint_0')
  config = network.T5Config(
      vocab_size=32128, emb_dim=8, num_heads=4, head_dim=3, mlp_dim=16,
      num_encoder_layers=2, num_decoder_layers=2,
      mlp_activations=('gelu', 'linear'))
  whole = checkpoints.load_t5x_params(legacy, config)
  shardings = part.param_shardings(network.T5Model(config))
  sharded = checkpoints.load_t5x_params(legacy, config, shardings=shardings)
  res.update(_restore_report('legacy', whole, sharded))
  model = network.T5Model(CONFIG)
  params = model.init_params(jax.random.key(4))
  with tempfile.TemporaryDirectory() as tmp:
    path = checkpoints.save_t5x_params(params, tmp, 3)
    sharded = checkpoints.load_t5x_params(
        path, CONFIG, shardings=part.param_shardings(model))
    res.update(_restore_report('orbax', params, sharded))
  res['tensorstore'] = _tensorstore_checks(fixtures, part)
  return res


def _restore_report(name, whole, sharded):
  """Shard shapes, specs and value equality of a sharded restore."""
  return {
      f'{name}_shards': partitioning.shard_shapes(sharded),
      f'{name}_equal': bool(all(jax.tree.leaves(jax.tree.map(
          lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), whole,
          sharded)))),
      f'{name}_specs': {k: str(v.sharding.spec) for k, v in
                        _flat(sharded).items()},
  }


def _tensorstore_checks(fixtures, part):
  """Legacy tensorstore zarr leaves read shard by shard (`_read_ts_leaves`).

  The fixture's zarr leaves are optimizer state (its params are inline), so
  its private reader is called on them directly.
  """
  folder = os.path.abspath(os.path.join(fixtures, 'tiny_t5', 'checkpoint_1'))
  with open(os.path.join(folder, 'checkpoint'), 'rb') as f:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(f.read())
    tree = next(unpacker)
  states = tree['optimizer']['state']['param_states']
  leaves = {k: states[k] for k in ('kernel', 'bias')}
  read = t5x._read_ts_leaves  # pylint: disable=protected-access
  whole = read(leaves, folder, folder)
  shardings = {'kernel': NamedSharding(part.mesh, P('data', None)),
               'bias': NamedSharding(part.mesh, P())}
  sharded = read(leaves, folder, folder, shardings, np.float32)
  return {
      'equal': bool(all(np.array_equal(whole[k].astype(np.float32),
                                       np.asarray(sharded[k]))
                        for k in leaves)),
      'kernel_dtype': str(sharded['kernel'].dtype),
      'shards': {k: [list(s.data.shape) for s in v.addressable_shards]
                 for k, v in sharded.items()},
  }


def _flat(tree):
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  return traverse_util.flatten_dict(tree, sep='/')


if __name__ == '__main__':
  main(*sys.argv[1:])
