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
Then, on paper (PREDICTED, not measured; `bench.tensor_parallel`), tensor
parallelism over 8 chips of a measured hardware profile (`--profile`, the
H100 run's by default: its measured t(k) of a T5 1.1-XXL-cost target, c of
its drafters and the alpha its run measured): the target call's measured
time split over the chips plus its all-reduces at an interconnect bandwidth
and latency that no profile measured (`--link_gb_s`,
`--allreduce_latency_us`: assumptions, labelled as such), and the speed-up
on 1 vs 8 chips through `hardware.predict`.

Writes OUT.json and OUT.md. `--repredict OUT.json` recomputes the on-paper
sections of a results file (the measured compile facts are kept) and
rewrites OUT.json and OUT.md.
"""

import argparse
import json
import math
import os
import pathlib
import platform
import re
import sys
import time

DEVICES = 8  # the simulated CPU devices
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           f' --xla_force_host_platform_device_count={DEVICES}')

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import compiled
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import speculative
from specdec_jax.bench import flags
from specdec_jax import hardware
from specdec_jax import models
from specdec_jax.bench import report
from specdec_jax.bench import tensor_parallel

XXL = models.CONFIGS['t5_1_1_xxl'].replace(vocab_size=models.VOCAB_SIZE,
                                           dtype=jnp.bfloat16)
SMALL = models.CONFIGS['t5_1_1_small'].replace(vocab_size=models.VOCAB_SIZE,
                                               dtype=jnp.bfloat16)
BATCH, INPUT_LEN, MAX_LEN, GAMMA = 8, 64, 64, 4

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
  params = target.param_shapes()
  draft_params = small.param_shapes()
  tokens = jax.ShapeDtypeStruct((BATCH, INPUT_LEN), jnp.int32)
  block = jax.ShapeDtypeStruct((BATCH, GAMMA + 1), jnp.int32)
  drafter_model = small
  if num_partitions is not None:
    part = partitioning.Partitioner(num_partitions=num_partitions)
    target = part.sharded_model(target)
    drafter_model = part.sharded_model(
        small, partitioning.data_parallel_rules())
    params = compiled.abstract(params, part.param_shardings(target))
    draft_params = compiled.abstract(draft_params, part.param_shardings(
        drafter_model))
    batch = partitioning.batch_sharding(part.mesh, part.rules)
    tokens = jax.ShapeDtypeStruct(tokens.shape, tokens.dtype, sharding=batch)
    block = jax.ShapeDtypeStruct(block.shape, block.dtype, sharding=batch)
  cache = jax.eval_shape(lambda p, t: target.init_cache(
      p, t, MAX_LEN + GAMMA + 1), params, tokens)
  if num_partitions is not None:
    cache = compiled.abstract(cache, target.cache_shardings(cache))
  out = {'target_call': compiled_facts(
      jax.jit(target.extend).lower(params, block, cache))}
  out['speculative_loop'] = compiled_facts(
      speculative.speculative_sample.lower(
          target, params, drafters.T5Drafter(drafter_model), draft_params,
          tokens, gamma=GAMMA, max_decode_len=MAX_LEN))
  out['baseline_loop'] = compiled_facts(decoding.temperature_sample.lower(
      target, params, tokens, max_decode_len=MAX_LEN))
  return out


def predict_on_paper(result, profile, link_gb_s, latency_us, alpha=None,
                     command=None):
  """The on-paper sections of a results dict (`tensor_parallel.on_paper`,
  `on_paper_speedups`), from the profile and the stated assumptions."""
  link, latency = link_gb_s * 1e9, latency_us * 1e-6
  result['profile'] = profile.name
  result['assumed'] = {
      'link_gb_s': link_gb_s, 'allreduce_latency_us': latency_us,
      'note': 'ASSUMED, not measured: no profile measures an interconnect '
              '(--link_gb_s, --allreduce_latency_us)'}
  result['on_paper'] = {
      str(k): tensor_parallel.on_paper(profile, link, latency, tokens=k)
      for k in (1, GAMMA + 1)}
  result['on_paper_speedups'] = tensor_parallel.on_paper_speedups(
      profile, link, latency, alpha)
  result['on_paper_dropped'] = (
      'compute time (no profile measures FLOP/s; a batch-1 call is bound by '
      'reading its weights, which the measured t(k) includes) and the TPU '
      'v5e row (no TPU profile)')
  if command:
    result['predicted_by'] = command
  return result


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
  ]
  if result.get('predicted_by'):
    lines += [f"On-paper sections recomputed by `{result['predicted_by']}` "
              '(the compile facts above are as measured).', '']
  if 'profile' not in result:  # a file from before the profiles
    return '\n'.join(lines) + '\n'
  assumed = result['assumed']
  lines += [
      '## On paper (predicted, not measured): one target call on '
      f'{tensor_parallel.CHIPS} chips, batch 1',
      '',
      f"Predicted on profile {result['profile']} (specdec_jax/"
      'profiles) through hardware.predict: the profile\'s measured '
      't(k) of its target on one chip, split evenly over the chips (the call '
      'reads the weights, which the chips split), plus ring all-reduces of '
      f"[tokens, {XXL.emb_dim}] bfloat16 activations at "
      f"**{assumed['link_gb_s']:g} GB/s per link and "
      f"{assumed['allreduce_latency_us']:g} us per all-reduce: ASSUMED**, "
      'not measured (no profile measures an interconnect; '
      '`--link_gb_s`, `--allreduce_latency_us`). Dropped: '
      f"{result['on_paper_dropped']}.",
      '',
      '| chips, tokens per call | t(k) on one chip ms (profile) | weights ms '
      'per chip | all-reduces | bytes each | all-reduce ms (assumed link) | '
      'comm share |',
      '|---|---:|---:|---:|---:|---:|---:|',
  ]
  for tokens, r in result['on_paper'].items():
    how = '' if r['t_one_chip_how'] == hardware.MEASURED else (
        f" ({r['t_one_chip_how']})")
    lines.append(
        f"| {r['chips']}, {tokens} | {r['t_one_chip_ms']}{how} | "
        f"{r['weights_ms_per_chip']} | {r['allreduces_per_call']} | "
        f"{r['bytes_per_allreduce']} | {r['allreduce_ms']} | "
        f"{r['comm_share']} |")
  sp = result['on_paper_speedups']
  lines += [
      '',
      '## On paper (predicted): c, cost(gamma + 1) and speed-up, '
      f'{tensor_parallel.CHIPS} chips vs one',
      '',
      f"Predicted on profile {sp['profile']} (one chip) and on its "
      f'{tensor_parallel.CHIPS}-chip tensor-parallel form above (the target '
      'call = weights per chip + assumed all-reduces; the drafter '
      'replicated, so its step time, measured on one chip, is unchanged) '
      'through hardware.predict: Theorem 3.8 with that cost curve and '
      'the best gamma within the '
      f"profile's measured k; alpha: {sp['alpha']}.",
      '',
      '| chips | drafter | alpha | t_target(1) ms | t_draft ms | c | gamma | '
      'cost(gamma+1) | speed-up |',
      '|---:|---|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for r in sp['rows']:
    lines.append(
        f"| {r['chips']} | {r['drafter']} | {r['alpha']:.2f} | "
        f"{r['t_target_1_ms']} | {r['t_draft_ms']} | {r['c']} | "
        f"{r['gamma']} | {r['cost_gamma_plus_1']} | {r['speedup']} |")
  return '\n'.join(lines) + '\n'


def meshes(text):
  """--meshes: comma-separated num_partitions, each 0 (one device, no
  mesh) or a divisor of `DEVICES` (as the flag's `type`)."""
  try:
    values = [int(x) for x in text.split(',')]
  except ValueError:
    values = []
  if not values or any(n < 0 or n and DEVICES % n for n in values):
    raise argparse.ArgumentTypeError(
        f'comma-separated num_partitions expected, each 0 (one device) or a '
        f'divisor of {DEVICES}, got {text!r}')
  return values


def mesh_name(n):
  return 'one device' if n == 0 else f'{DEVICES // n}x{n}'


def number_in(low, high):
  """A flag's finite number in [low, high] (as the flag's `type`)."""
  def parse(text):
    try:
      value = float(text)
    except ValueError:
      value = float('nan')
    if not (low <= value <= high and math.isfinite(value)):
      raise argparse.ArgumentTypeError(
          f'a finite number in [{low:g}, {high:g}] expected, got {text!r}')
    return value
  return parse


# The keys of a results file of this script (`--repredict` reads them).
RESULT_KEYS = ('command', 'jax', 'machine', 'meshes')


def repredict(path, profile, args, command):
  """Recomputes the on-paper sections of the results file `path`; both
  files are made before either is written."""
  result = report.read_json(path)
  missing = [k for k in RESULT_KEYS if k not in result] if isinstance(
      result, dict) else list(RESULT_KEYS)
  if missing:
    raise checks.InputError(
        f'--repredict {os.fspath(path)!r} is not a results file of '
        f'scripts/benchmark_mesh.py: it has no {missing}.')
  result = predict_on_paper(result, profile, args.link_gb_s,
                            args.allreduce_latency_us, args.alpha, command)
  md = markdown(result)
  report.write_json(path, result)
  report.write_md(path.with_suffix('.md'), md)
  print(md)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', type=checks.local_path,
                      default='results/mesh_cpu')
  parser.add_argument('--meshes', type=meshes, default='0,4,8',
                      help='num_partitions per mesh (divisors of '
                      f'{DEVICES}); 0: one device, no mesh')
  flags.add_prediction_flags(parser)
  parser.add_argument('--link_gb_s', type=checks.positive, default=450.0,
                      help='ASSUMED interconnect bandwidth per chip, GB/s, '
                      'of the on-paper all-reduces (default: the NVLink 4 '
                      'figure of an H100 SXM, per direction; not measured)')
  parser.add_argument('--allreduce_latency_us',
                      type=number_in(0, float('inf')), default=10.0,
                      help='ASSUMED fixed latency of one all-reduce, us (not '
                      'measured)')
  parser.add_argument('--alpha', type=number_in(0, 1), default=None,
                      help="default: each drafter's alpha in the profile's "
                      'run (en_de, t = 0)')
  args = parser.parse_args(argv)
  argv = sys.argv[1:] if argv is None else list(argv)
  profile = flags.profile_of(args)
  if args.repredict:
    repredict(pathlib.Path(args.repredict), profile, args, report.portable(
        ' '.join(['python scripts/benchmark_mesh.py'] + argv)))
    return
  checks.check_no_file_in_the_way('--out', os.path.dirname(
      os.path.abspath(args.out)))
  assert jax.device_count() == DEVICES, jax.devices()
  result = {
      'command': report.portable(' '.join(
          ['python scripts/benchmark_mesh.py'] + argv)),
      'jax': jax.__version__,
      'machine': f'{platform.machine()}, {os.cpu_count()} CPUs',
      'meshes': {},
  }
  predict_on_paper(result, profile, args.link_gb_s,
                   args.allreduce_latency_us, args.alpha)
  for n in args.meshes:
    name = mesh_name(n)
    print('mesh', name, flush=True)
    result['meshes'][name] = measure(None if n == 0 else n)
    print(json.dumps(result['meshes'][name]), flush=True)
    # Written after each mesh: a run stopped later keeps the finished ones.
    report.write_json(args.out + '.json', result)
    report.write_md(args.out + '.md', markdown(result))
  print(markdown(result))


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
