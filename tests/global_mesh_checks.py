"""One mesh spanning processes: one process of a jax.distributed run.

Run by tests/test_multihost.py as two processes (4 simulated CPU devices
each, XLA's gloo collectives between them):

  python -m tests.global_mesh_checks OUT.json COORDINATOR PROCESS_ID \
      FIXTURES_DIR ORBAX_CHECKPOINT

The mesh holds all 8 devices of both processes (`Partitioner(
global_mesh=True)`): 1 x 8 (the 'model' axis across the processes) and 4 x 2
(the 'data' axis across them). On each, the parameters and inputs are
placed by `Partitioner.shard_params` / `shard_batch` (every process holds
the whole arrays and places its own shards), and the greedy baseline and
T5-drafted speculative decodes run as one program over both processes;
their tokens are gathered (`partitioning.to_host`) and written with this
process's single-device reference; the near-tie diagnosis of a planted
divergence reads the sharded target as one device's. And
`partitioning.agree`: each process
offers its own value and both take process 0's; each finds the other on
this machine (`run_folder.job_processes_here`). And checkpoints
restored straight into the mesh's shardings, each process reading its own
shards: T5X's legacy fixture on the 2 x 4 mesh (its 4 heads), and an orbax
checkpoint of ours (ORBAX_CHECKPOINT: the reference model's params, saved
by the caller) on the 1 x 8 one, whose 'model' shards lie on both.
"""

import json
import os
import sys

os.environ.setdefault('XLA_FLAGS',
                      '--xla_force_host_platform_device_count=4')

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import decoding
from specdec_jax import diagnostics
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import run_folder
from specdec_jax import speculative
from specdec_jax import synthetic
from tests.mesh_checks import CONFIG  # its model, lengths and inputs
from tests.mesh_checks import EOS
from tests.mesh_checks import GAMMA
from tests.mesh_checks import MAX_LEN
from tests.mesh_checks import _tokens


def main(out_path, coordinator, process_id, fixtures, orbax_path):
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator, num_processes=2,
                             process_id=int(process_id))
  model = network.T5Model(CONFIG)
  params = model.init_params(jax.random.key(1))
  draft_params = synthetic.perturbed(params, 0.2, jax.random.key(0))
  inputs = np.random.default_rng(3).integers(2, 128, (4, 7)).astype(np.int32)
  inputs[1, 4:] = 0
  local = jax.local_devices()[0]
  with jax.default_device(local):
    single = decoding.temperature_sample(
        model, jax.device_put(params, local), inputs,
        max_decode_len=MAX_LEN, eos_id=EOS).tokens
  out = {'devices': jax.device_count(), 'local': jax.local_device_count(),
         'single': _tokens(single), 'meshes': {}}
  # A planted divergence (row 0's third token replaced) for the near-tie
  # diagnosis, which reads the target's logits there on the host.
  planted = np.asarray(single).copy()
  planted[0, 2] = (planted[0, 2] + 1) % CONFIG.vocab_size
  diagnosed = lambda p: [(d.row, d.position, d.kind, d.culprit, d.top2_gap)
                         for d in diagnostics.diagnose(
                             model, p, inputs, np.asarray(single), planted)]
  with jax.default_device(local):
    out['diagnosis'] = diagnosed(jax.device_put(params, local))
  for num_partitions in (8, 2):
    part = partitioning.Partitioner(num_partitions=num_partitions,
                                    global_mesh=True)
    target = part.sharded_model(model)
    drafter = drafters.T5Drafter(target)
    s_params = part.shard_params(params, target)
    s_inputs = part.shard_batch(inputs)
    base = decoding.temperature_sample(target, s_params, s_inputs,
                                       max_decode_len=MAX_LEN, eos_id=EOS)
    spec = speculative.speculative_sample(
        target, s_params, drafter, part.shard_params(draft_params, target),
        s_inputs, gamma=GAMMA, max_decode_len=MAX_LEN, eos_id=EOS)
    gather = lambda x: partitioning.to_host(x).tolist()
    out['meshes'][f'{part.data_size}x{part.model_size}'] = {
        'processes': sorted({d.process_index for d in part.mesh.devices.flat}),
        'model_axis_processes': sorted(
            {d.process_index for d in part.mesh.devices[0]}),
        'baseline': gather(base.tokens), 'speculative': gather(spec.tokens),
        'drafted': int(np.sum(gather(spec.stats.drafted))),
        'accepted': int(np.sum(gather(spec.stats.accepted))),
        'diagnosis': diagnosed(s_params)}
  out['restored'] = _restored(fixtures, orbax_path, params)
  offered = {'process': jax.process_index(), 1: (2, 3)}
  out['agreed'] = repr(partitioning.agree(offered))
  out['pid'], out['peers'] = os.getpid(), run_folder.job_processes_here()
  with open(out_path, 'w') as f:
    json.dump(out, f)
  jax.distributed.shutdown()


def _restored(fixtures, orbax_path, params):
  """{name: [every parameter equal to the whole load, the distinct slices
  of a 'model'-split weight this process holds, all its slices]}."""
  legacy = os.path.join(fixtures, 'test_t5_tiny.checkpoint_0')
  config = network.T5Config(  # the fixture's (tests/mesh_checks.py)
      vocab_size=32128, emb_dim=8, num_heads=4, head_dim=3, mlp_dim=16,
      num_encoder_layers=2, num_decoder_layers=2,
      mlp_activations=('gelu', 'linear'))
  res = {}
  for name, path, cfg, whole, parts in (
      ('legacy', legacy, config, checkpoints.load_t5x_params(legacy, config),
       4),
      ('orbax', orbax_path, CONFIG, params, 8)):
    part = partitioning.Partitioner(num_partitions=parts, global_mesh=True)
    sharded = checkpoints.load_t5x_params(
        path, cfg, shardings=part.param_shardings(network.T5Model(cfg)))
    equal = jax.tree.map(lambda a, b: bool(np.array_equal(
        np.asarray(a), partitioning.to_host(b))), whole, sharded)
    kernel = sharded['decoder']['layers_0']['self_attention']['query'][
        'kernel']
    slices = lambda shards: len({str(s) for s in shards})
    res[name] = [all(jax.tree.leaves(equal)),
                 slices(s.index for s in kernel.addressable_shards),
                 slices(kernel.sharding.devices_indices_map(
                     kernel.shape).values())]
  return res


if __name__ == '__main__':
  main(*sys.argv[1:])
