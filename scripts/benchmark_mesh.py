r"""Compile time and collectives of the sharded decoders on a simulated mesh.

  python scripts/benchmark_mesh.py --out results/mesh_cpu

Runs on 8 simulated CPU devices (it sets XLA_FLAGS itself before jax
starts). Every program is compiled from abstract arguments
(`jax.ShapeDtypeStruct`s carrying the mesh's shardings), so the T5 1.1 XXL
target (bfloat16, 24 + 24 layers, 64 heads) compiles here without a byte of
its 11B parameters; nothing is run (the simulated devices share this
machine's cores, so their timings would mean nothing).

Per mesh (1 device, 2 x 4, 1 x 8; ('data', 'model')) and T5X's standard
rules, it records:
  - one target call (`extend` of gamma + 1 tokens on the cache, batch B):
    compile seconds, collectives by kind in the compiled HLO, the replica
    group sizes, and the bytes each all-reduce carries (its result shape);
  - the whole speculative loop (target sharded, T5 1.1 small drafter
    replicated: data-parallel rules) and the baseline loop: compile seconds
    and collectives (a while body's instruction counts once = once per
    iteration).
Then the on-paper cost of those all-reduces vs the call's memory and compute
time on 8 accelerators (assumed hardware figures in `HARDWARE`).

Writes OUT.json and OUT.md.
"""

import argparse
import json
import os
import platform
import re
import sys
import time

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import speculative

XXL = network.T5Config(
    vocab_size=32128, dtype=jnp.bfloat16, emb_dim=4096, num_heads=64,
    num_encoder_layers=24, num_decoder_layers=24, head_dim=64,
    mlp_dim=10240, mlp_activations=('gelu', 'linear'), dropout_rate=0.0)
SMALL = network.T5Config(
    vocab_size=32128, dtype=jnp.bfloat16, emb_dim=512, num_heads=6,
    num_encoder_layers=8, num_decoder_layers=8, head_dim=64, mlp_dim=1024,
    mlp_activations=('gelu', 'linear'), dropout_rate=0.0)
BATCH, INPUT_LEN, MAX_LEN, GAMMA = 8, 64, 64, 4

# Assumed accelerator figures for the on-paper section (per chip).
HARDWARE = {
    'H100 SXM x 8 (NVLink 4)': dict(
        hbm_bytes_s=3.35e12, flops_s=989e12, link_bytes_s=450e9,
        allreduce_latency_s=10e-6),
    'TPU v5e x 8 (ICI, 2x4)': dict(
        hbm_bytes_s=819e9, flops_s=197e12, link_bytes_s=100e9,
        allreduce_latency_s=10e-6),
}
_BYTES = {'f32': 4, 'bf16': 2, 'f16': 2, 's32': 4, 'u32': 4, 'pred': 1,
          's8': 1, 'u8': 1}
_SHAPE = re.compile(r'\b(f32|bf16|f16|s32|u32|pred|s8|u8)\[([\d,]*)\]')


def allreduce_bytes(hlo_text):
  """Bytes of each all-reduce's result (a tuple result: the sum)."""
  sizes = []
  for line in hlo_text.splitlines():
    head, sep, _ = line.partition(' all-reduce(')
    if not sep:
      head, sep, _ = line.partition(' all-reduce-start(')
    if not sep or '=' not in head:
      continue
    total = 0
    for dtype, dims in _SHAPE.findall(head.split('=', 1)[1]):
      n = 1
      for d in filter(None, dims.split(',')):
        n *= int(d)
      total += n * _BYTES[dtype]
    sizes.append(total)
  return sizes


def abstract(tree, shardings):
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, shardings)


def compiled_facts(lowered):
  t0 = time.perf_counter()
  compiled = lowered.compile()
  seconds = time.perf_counter() - t0
  text = compiled.as_text()
  sizes = allreduce_bytes(text)
  return {'compile_seconds': round(seconds, 2),
          'collectives': partitioning.count_collectives(text),
          'per_iteration': partitioning.loop_collectives(text),
          'group_sizes': partitioning.collective_group_sizes(text),
          'allreduce_bytes_total': sum(sizes),
          'allreduce_bytes_distinct': sorted(set(sizes))}


def measure(num_partitions):
  """Facts of the three programs on one mesh (None: one device, no mesh)."""
  target = network.T5Model(XXL)
  small = network.T5Model(SMALL)
  params = jax.eval_shape(target.init_params, jax.random.key(0))
  draft_params = jax.eval_shape(small.init_params, jax.random.key(0))
  tokens = jax.ShapeDtypeStruct((BATCH, INPUT_LEN), jnp.int32)
  block = jax.ShapeDtypeStruct((BATCH, GAMMA + 1), jnp.int32)
  drafter_model = small
  if num_partitions is not None:
    part = partitioning.Partitioner(num_partitions=num_partitions)
    target = part.sharded_model(target)
    drafter_model = part.sharded_model(
        small, partitioning.data_parallel_rules())
    params = abstract(params, part.param_shardings(target))
    draft_params = abstract(draft_params, part.param_shardings(
        drafter_model))
    batch = partitioning.batch_sharding(part.mesh, part.rules)
    tokens = jax.ShapeDtypeStruct(tokens.shape, tokens.dtype, sharding=batch)
    block = jax.ShapeDtypeStruct(block.shape, block.dtype, sharding=batch)
  cache = jax.eval_shape(lambda p, t: target.init_cache(
      p, t, MAX_LEN + GAMMA + 1), params, tokens)
  if num_partitions is not None:
    cache = abstract(cache, target.cache_shardings(cache))
  out = {'target_call': compiled_facts(
      jax.jit(target.extend).lower(params, block, cache))}
  out['speculative_loop'] = compiled_facts(
      speculative.speculative_sample.lower(
          target, params, drafters.T5Drafter(drafter_model), draft_params,
          tokens, gamma=GAMMA, max_decode_len=MAX_LEN))
  out['baseline_loop'] = compiled_facts(decoding.temperature_sample.lower(
      target, params, tokens, max_decode_len=MAX_LEN))
  return out


def on_paper(config=XXL, chips=8, tokens=1):
  """Per-call time of the target's decoder on `chips` with tensor parallelism.

  Per decoder layer three all-reduces of `[tokens, emb]` activations
  (self-attention out, cross-attention out, MLP out), plus one for the
  vocab-sharded embedding lookup: a ring all-reduce moves 2 (n - 1) / n of
  the buffer per chip. Weight reads: the decoder's per-step kernels (the
  cross-attention keys/values are cached) and the logits, split over the
  chips. Predicted, not measured.
  """
  emb, layers = config.emb_dim, config.num_decoder_layers
  attn = config.num_heads * config.head_dim
  wbytes = 2  # bfloat16
  per_layer = (4 * emb * attn + 2 * emb * attn +  # self q,k,v,o; cross q,o
               len(config.mlp_activations) * emb * config.mlp_dim +
               config.mlp_dim * emb)
  decoder_params = layers * per_layer + emb * config.vocab_size
  n_allreduce = 3 * layers + 1 if chips > 1 else 0
  buffer = tokens * emb * wbytes
  ring = 2 * (chips - 1) / chips * buffer
  rows = {}
  for name, hw in HARDWARE.items():
    memory = decoder_params * wbytes / chips / hw['hbm_bytes_s']
    compute = 2 * decoder_params * tokens / chips / hw['flops_s']
    comm = n_allreduce * (hw['allreduce_latency_s'] +
                          ring / hw['link_bytes_s'])
    rows[name] = {
        'allreduces_per_call': n_allreduce,
        'bytes_per_allreduce': buffer,
        'ring_bytes_per_chip_per_call': round(n_allreduce * ring),
        'memory_ms': round(1e3 * memory, 3),
        'compute_ms': round(1e3 * compute, 4),
        'allreduce_ms': round(1e3 * comm, 3),
        'comm_share': round(comm / (max(memory, compute) + comm), 2),
        'assumed': hw,
    }
  return {'config': 'T5 1.1 XXL decoder, bfloat16', 'chips': chips,
          'tokens_per_call': tokens, 'decoder_params': decoder_params,
          'hardware': rows}


# Drafter step times measured on ONE H100 (README "Measured on one H100",
# results/nvidia-h100-80gb-hbm3/accelerator_shipped.md: c x t(1), t(1) =
# 5.13 ms at T5 1.1-XXL cost), and alpha of en_de / dec2 from the same run.
DRAFT_MS = {'dec2 (2-layer decoder)': 0.018 * 5.13,
            'T5 1.1 small cost': 0.086 * 5.13}
ALPHA = 0.74


def on_paper_speedups(hardware='H100 SXM x 8 (NVLink 4)'):
  """c, cost(gamma + 1) and Theorem 3.8's speed-up on 1 vs 8 chips.

  The target call's time is the on-paper model of `on_paper` (weights read
  + all-reduces; on one chip no all-reduce); the drafter is replicated, so
  its step time is the same on 1 and 8 chips. Predicted, not measured.
  """
  from specdec_jax import theory  # pylint: disable=g-import-not-at-top
  rows = []
  for chips in (1, 8):
    def t_target(k):
      r = on_paper(chips=chips, tokens=k)['hardware'][hardware]
      comm = r['allreduce_ms'] if chips > 1 else 0.0
      return max(r['memory_ms'], r['compute_ms']) + comm
    t1 = t_target(1)
    cost = {g: t_target(g + 1) / t1 for g in range(1, 17)}
    for name, ms in DRAFT_MS.items():
      c = ms / t1
      gamma, speedup = theory.optimal_gamma_and_speedup(ALPHA, c, cost, 16)
      rows.append({'chips': chips, 'drafter': name, 't_target_1_ms':
                   round(t1, 3), 't_draft_ms': round(ms, 3),
                   'c': round(c, 3), 'gamma': gamma,
                   'cost_gamma_plus_1': round(cost[gamma], 3),
                   'speedup': round(speedup, 2)})
  return {'hardware': hardware, 'alpha': ALPHA, 'rows': rows}


def markdown(result):
  lines = [
      '# Sharded decoders on a simulated 8-device CPU mesh',
      '',
      f"Command: `{result['command']}`  ",
      f"jax {result['jax']}, {result['machine']}; compiled from abstract "
      'arguments, not run. Target: T5 1.1 XXL (bfloat16, 24 + 24 layers, '
      '64 heads x 64, mlp 10240, vocab 32128), sharded by T5X\'s standard '
      'rules; drafter: T5 1.1 small, replicated (data-parallel rules). '
      f"Batch {BATCH}, input {INPUT_LEN}, max_decode_len {MAX_LEN}, "
      f"gamma {GAMMA} (a target call: {GAMMA + 1} tokens per row).",
      '',
      '## Measured: compile time and collectives per program',
      '',
      '| mesh (data x model) | program | compile s | all-reduce | '
      'all-gather | other | per loop iteration (all-reduce / all-gather) | '
      'group sizes | bytes per all-reduce |',
      '|---|---|---:|---:|---:|---:|---|---|---|',
  ]
  for mesh, programs in result['meshes'].items():
    for prog, f in programs.items():
      c = f['collectives']
      p = f['per_iteration']
      it = (f"{p['all-reduce']} / {p['all-gather']}" if prog != 'target_call'
            else '-')
      other = sum(v for k, v in c.items() if k not in ('all-reduce',
                                                       'all-gather'))
      lines.append(
          f"| {mesh} | {prog} | {f['compile_seconds']} | {c['all-reduce']} "
          f"| {c['all-gather']} | {other} | {it} | {f['group_sizes']} | "
          f"{f['allreduce_bytes_distinct']} |")
  lines += [
      '',
      'Static counts in the compiled HLO: the whole program (encoder once, '
      'loop body once) and, per loop iteration, the while body alone '
      '(target call + drafter + bookkeeping); the target-call row is one '
      '`extend` of gamma + 1 tokens alone: 3 all-reduces per decoder layer '
      '(self-attention out, cross-attention out, MLP out) + 1 for the '
      'vocab-sharded embedding lookup = 73. Over \'data\' (group size 2 '
      'on 2x4) only the loop\'s bookkeeping: the all-rows-ended test and '
      'the acceptance counters. The CPU backend computes the bfloat16 '
      'matmuls in float32, so its all-reduces carry float32 partial sums '
      '(rows x tokens x 4096 x 4 B). Compile seconds are on this shared '
      '2-core CPU (noisy).',
      '',
      '## On paper (predicted, not measured): one target call, T5 1.1 XXL '
      'decoder on 8 chips, batch 1',
      '',
      '| hardware (assumed figures) | all-reduces | bytes each | memory ms '
      '| compute ms | all-reduce ms | comm share |',
      '|---|---:|---:|---:|---:|---:|---:|',
  ]
  for tokens, paper in result['on_paper'].items():
    for hw, r in paper['hardware'].items():
      lines.append(
          f"| {hw}, {tokens} token(s) per call | {r['allreduces_per_call']} "
          f"| {r['bytes_per_allreduce']} | {r['memory_ms']} | "
          f"{r['compute_ms']} | {r['allreduce_ms']} | {r['comm_share']} |")
  sp = result['on_paper_speedups']
  lines += [
      '',
      f"## On paper (predicted): c, cost(gamma + 1) and speed-up, "
      f"{sp['hardware']} vs one chip, alpha {sp['alpha']}",
      '',
      'Target call = weights read + all-reduces (above); drafter replicated '
      '(step time measured on one H100, unchanged on 8); gamma from '
      "Theorem 3.8 with that cost curve (theory.optimal_gamma_and_speedup).",
      '',
      '| chips | drafter | t_target(1) ms | t_draft ms | c | gamma | '
      'cost(gamma+1) | speed-up |',
      '|---:|---|---:|---:|---:|---:|---:|---:|',
  ]
  for r in sp['rows']:
    lines.append(
        f"| {r['chips']} | {r['drafter']} | {r['t_target_1_ms']} | "
        f"{r['t_draft_ms']} | {r['c']} | {r['gamma']} | "
        f"{r['cost_gamma_plus_1']} | {r['speedup']} |")
  return '\n'.join(lines) + '\n'


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='results/mesh_cpu')
  parser.add_argument('--meshes', default='0,4,8',
                      help="num_partitions per mesh; 0: one device, no mesh")
  args = parser.parse_args(argv)
  assert jax.device_count() == 8, jax.devices()
  result = {
      'command': 'python scripts/benchmark_mesh.py ' + ' '.join(
          sys.argv[1:] if argv is None else argv),
      'jax': jax.__version__,
      'machine': f'{platform.machine()}, {os.cpu_count()} CPUs',
      'meshes': {},
      'on_paper': {str(k): on_paper(tokens=k) for k in (1, GAMMA + 1)},
      'on_paper_speedups': on_paper_speedups(),
  }
  for n in (int(x) for x in args.meshes.split(',')):
    name = 'one device' if n == 0 else f'{8 // n}x{n}'
    print('mesh', name, flush=True)
    result['meshes'][name] = measure(None if n == 0 else n)
    print(json.dumps(result['meshes'][name]), flush=True)
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  with open(args.out + '.json', 'w') as f:
    json.dump(result, f, indent=1)
  with open(args.out + '.md', 'w') as f:
    f.write(markdown(result))
  print(markdown(result))


if __name__ == '__main__':
  main()
