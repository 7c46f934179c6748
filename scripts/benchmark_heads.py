r"""Self-drafting heads on the shipped target: alpha per depth, speed-ups.

  python scripts/benchmark_heads.py --heads_dir shipped:heads \
    --tasks en_de,synopsis --temperatures 0,1 --out results/heads_shipped

Reads the heads scripts/train_heads.py wrote (<heads_dir>/<task>/, trained
on the target's outputs for the Debian train split; the default, the shipped
heads `shipped:heads/<task>`, through `shipped.resolve`) and decodes the first
--num_examples rows of the shipped test slice (held out) one at a time
(batch 1, float32) with:

- the baseline (`decoding.temperature_sample`);
- the heads' merged loop (`heads.HeadLoop`, `speculative_sample`'s default
  for the `HeadDrafter`) for gamma = 1..
  --max_gamma: one (gamma + 1)-token target call per iteration plus gamma
  head steps;
- dec2, the shipped distilled 2+2-layer drafter, in the ordinary loop
  (gamma --dec2_gamma), on the same rows.

Per row: alpha per head step k (draft k of the merged loop: the k-th token
after the committed one; teacher-forced on the target's own outputs of
--alpha_examples held-out rows), per-position acceptance and tokens per
target call of the decodes, measured CPU speed-up (wall-time ratio, greedy
outputs checked identical) and the PREDICTED H100 speed-up:

  tokens per target call / (cost(gamma + 1) + gamma * c)

with the H100 cost curve of ../shared/GPU.md and c of one drafting step at
T5-XXL cost: dec2's measured 0.028; the head's from a cost model (bytes it
reads at the XXL-cost widths, the head widened in proportion, at the H100's
3.35 TB/s, plus --launch_us per kernel, over GPU.md's 4.9 ms target step).
Both are PREDICTED, not measured. Writes <out>.md, <out>.json,
<out>_alpha.png.
"""

import argparse
import datetime
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import layers
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import shipped
from specdec_jax import speculative
from specdec_jax import widening
from specdec_jax.sampling import SamplingConfig
from specdec_jax.drafters import heads
from specdec_jax.drafters.heads import train as heads_train

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmark_pass import _identical  # pylint: disable=g-import-not-at-top,wrong-import-position
from benchmark_pass import h100_cost  # pylint: disable=g-import-not-at-top,wrong-import-position
from benchmark_pass import run_rows  # pylint: disable=g-import-not-at-top,wrong-import-position
from benchmark_pass import stats_of  # pylint: disable=g-import-not-at-top,wrong-import-position

DECODE_LEN = {'en_de': 64, 'synopsis': 32}
# ../shared/GPU.md (H100, T5-XXL cost, bf16, batch 1).
H100_STEP_S = 4.9e-3
H100_BANDWIDTH = 3.35e12
DEC2_C = 0.028
# Kernels of one head step (cross-attention query, two einsums + softmax,
# output, two concats, wi, gelu, wo, two adds, logits, softmax / draw).
HEAD_KERNELS = 14


def parse_flags(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--tasks', default='en_de,synopsis')
  p.add_argument('--heads_dir', default='shipped:heads')
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--max_gamma', type=int, default=5)
  p.add_argument('--dec2_gamma', type=int, default=4)
  p.add_argument('--num_examples', type=int, default=24)
  p.add_argument('--alpha_examples', type=int, default=64)
  p.add_argument('--repeats', type=int, default=2)
  p.add_argument('--launch_us', type=float, default=4.0)
  p.add_argument('--out', default='results/heads_shipped')
  p.add_argument('--c_sizes', default='native,t5_1_1_base_cost',
                 help='widths at which to MEASURE c of a head step on this '
                 'machine (random weights; empty: skip)')
  return p.parse_args(argv)


def predicted_head_c(config, head: heads.HeadConfig, input_length,
                     launch_us: float) -> float:
  """c of one head step at T5-XXL cost on the H100 (a cost model)."""
  wide = widening.preset_config(config, 't5_1_1_xxl_cost')
  scale = wide.emb_dim / config.emb_dim
  wide_head = heads.HeadConfig(int(head.mlp_dim * scale),
                               head.cross_attention)
  nbytes = heads.head_step_bytes(wide, wide_head, weight_bytes=2)
  if head.cross_attention:  # the last layer's cross K/V, bf16
    nbytes += 2 * input_length * wide.num_heads * wide.head_dim * 2
  seconds = nbytes / H100_BANDWIDTH + HEAD_KERNELS * launch_us * 1e-6
  return seconds / H100_STEP_S


@functools.partial(jax.jit, static_argnums=(0,))
def _repeated_head_steps(head, head_params, target_params, state, token,
                         cache, n_steps):
  """n_steps chained head steps (one draft each), greedy."""
  kv = (cache.cross_key[-1], cache.cross_value[-1])
  bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])

  def body(_, carry):
    s, tok = carry
    s, logits = head.step(head_params, target_params, s, tok, kv, bias)
    return s, jnp.argmax(logits, -1).astype(jnp.int32)

  return jax.lax.fori_loop(0, n_steps, body, (state, token))


def measure_c(config, head_cfg, inputs, size, repeats=5):
  """c of a head step MEASURED here: t(head step) / t(1-token target
  call) at `size` widths (random weights), beside its bytes ratio."""
  if size != 'native':
    scale = widening.preset_config(config, size).emb_dim / config.emb_dim
    config = widening.preset_config(config, size)
    head_cfg = heads.HeadConfig(int(head_cfg.mlp_dim * scale),
                                head_cfg.cross_attention)
  model = network.T5Model(config)
  params = model.init_params(jax.random.key(0))
  head = heads.Head(config, head_cfg)
  hp = heads.init_head(config, head_cfg)
  enc = jnp.asarray(inputs[:1])
  t_target = measure.call_time(model, params, enc, 1, repeats=repeats)
  cache = measure.context_cache(model, params, enc, 32, 48)
  state = jnp.zeros((1, 1, config.emb_dim), config.compute_dtype)
  token = jnp.full((1, 1), 7, jnp.int32)
  t_head = measure.loop_time(
      lambda n: _repeated_head_steps(head, hp, params, state, token, cache,
                                     n), 20, repeats)
  head_bytes = heads.head_step_bytes(config, head_cfg, 4)
  target_bytes = measure.step_bytes(model, params, 1, 32, enc.shape[1])
  return dict(size=size, t_target_ms=round(t_target * 1e3, 3),
              t_head_ms=round(t_head * 1e3, 3),
              c_measured=round(t_head / t_target, 4),
              bytes_ratio=round(head_bytes / target_bytes, 4))


def main(argv=None):
  args = parse_flags(argv)
  model, params = shipped.load_model('target')
  dec2, dec2_params = shipped.load_model('dec2')
  t5 = drafters.T5Drafter(dec2)
  temps = [float(t) for t in args.temperatures.split(',')]
  report = {'command': 'python scripts/benchmark_heads.py ' + ' '.join(
      f'--{k}={v}' for k, v in vars(args).items()),
            'machine': measure.machine(),
            'date': datetime.date.today().isoformat(), 'rows': [],
            'alpha': {}, 'heads': {}}
  for task in args.tasks.split(','):
    where = f'{args.heads_dir}/{task}'
    path = (shipped.resolve(where) if where.startswith(shipped.SCHEME) else
            checkpoints.latest_checkpoint(where))
    if path is None:
      sys.exit(f'No head checkpoint under {args.heads_dir}/{task} '
               '(scripts/train_heads.py --out_dir writes one).')
    hp, head_cfg = heads.load_head(path, model.config)
    head = heads.Head(model.config, head_cfg)
    drafter = heads.HeadDrafter(model, head_cfg)
    dparams = heads.head_params(params, hp)
    inputs = shipped.test_arrays(task)['inputs']
    c_head = predicted_head_c(model.config, head_cfg, inputs.shape[1],
                              args.launch_us)
    report['heads'][task] = dict(
        checkpoint=os.path.relpath(path), config=vars(head_cfg),
        parameters=int(sum(np.size(x) for x in jax.tree.leaves(hp))),
        predicted_h100_c=round(c_head, 4))
    decode_len = DECODE_LEN[task]
    for temp in temps:
      sampling = SamplingConfig(temperature=temp)
      sums = np.zeros(args.max_gamma)
      counts = np.zeros(args.max_gamma)
      for s in range(0, args.alpha_examples, 16):
        enc = jnp.asarray(inputs[s:s + 16])
        outs = decoding.temperature_sample(
            model, params, enc, max_decode_len=decode_len, sampling=sampling,
            rng=jax.random.key(s)).tokens
        a, c = heads_train.depth_alpha(model, params, head, hp, enc, outs,
                                       args.max_gamma, sampling)
        sums, counts = sums + a, counts + c
      alpha = (sums / np.maximum(counts, 1)).tolist()
      report['alpha'][f'{task}/t{temp:g}'] = alpha
      print(task, temp, 'alpha per head depth', np.round(alpha, 3),
            flush=True)

      rows = inputs[:args.num_examples]
      rng_of = lambda i: jax.random.key(1000 + i)
      base, t_base = run_rows(
          lambda x, i: decoding.temperature_sample(
              model, params, x, max_decode_len=decode_len, sampling=sampling,
              rng=rng_of(i)), rows, args.repeats)
      base_tokens = sum(int(r.lengths.sum()) for r in base)

      def add(name, gamma, res, seconds, c, **extra):
        st = stats_of(res)
        cost = h100_cost(gamma + 1) + gamma * c
        report['rows'].append(dict(
            task=task, temperature=temp, drafter=name, gamma=gamma, **st,
            measured_cpu=(t_base / base_tokens) / (seconds / st['tokens']),
            identical=_identical(base, res) if temp == 0 else None,
            c=round(c, 4), predicted_h100=st['tokens_per_call'] / cost,
            **extra))
        print(report['rows'][-1], flush=True)

      res, t = run_rows(
          lambda x, i: speculative.speculative_sample(
              model, params, t5, dec2_params, x, gamma=args.dec2_gamma,
              max_decode_len=decode_len, sampling=sampling, rng=rng_of(i)),
          rows, args.repeats)
      add('dec2 (ordinary loop)', args.dec2_gamma, res, t, DEC2_C)
      for gamma in range(1, args.max_gamma + 1):
        res, t = run_rows(
            lambda x, i, g=gamma: speculative.speculative_sample(
                model, params, drafter, dparams, x, gamma=g,
                max_decode_len=decode_len, sampling=sampling, rng=rng_of(i),
                merged=True),
            rows, args.repeats)
        add('heads (merged loop)', gamma, res, t, c_head,
            alpha_heads=float(np.mean(alpha[:gamma])))
  report['c_measured'] = []
  for size in filter(None, args.c_sizes.split(',')):
    report['c_measured'].append(measure_c(
        model.config, head_cfg, shipped.test_arrays('en_de')['inputs'], size,
        args.repeats + 3))
    print(report['c_measured'][-1], flush=True)
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  with open(args.out + '.json', 'w') as f:
    json.dump(report, f, indent=1)
  plot(report, args.out + '_alpha.png')
  write_md(report, args.out + '.md')


def _best(report, task, temp, prefix):
  rows = [r for r in report['rows'] if r['task'] == task and
          r['temperature'] == temp and r['drafter'].startswith(prefix)]
  return max(rows, key=lambda r: r['predicted_h100']) if rows else None


def _verdict(report) -> str:
  out = []
  for task in sorted({r['task'] for r in report['rows']}):
    best = _best(report, task, 0.0, 'heads')
    if best:
      out.append(f"{task} {best['predicted_h100']:.2f}x (gamma "
                 f"{best['gamma']})")
  return ('Best PREDICTED H100 speed-up of the self-drafting heads at t = 0: '
          + '; '.join(out) + '. Goal: >= 1.3x on both tasks.')


def plot(report, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for key, alpha in report['alpha'].items():
    axes[0].plot(range(1, len(alpha) + 1), alpha, marker='o', label=key)
  axes[0].set(xlabel='head step k (draft k of the merged loop)',
              ylabel='alpha (teacher-forced)', title='alpha per head step')
  for key in report['alpha']:
    task, temp = key.split('/t')
    rows = [r for r in report['rows'] if r['task'] == task and
            r['temperature'] == float(temp) and
            r['drafter'].startswith('heads')]
    axes[1].plot([r['gamma'] for r in rows],
                 [r['predicted_h100'] for r in rows], marker='o', label=key)
  axes[1].axhline(1.3, color='gray', ls='--', lw=0.8, label='goal 1.3x')
  axes[1].set(xlabel='gamma', ylabel='speed-up',
              title='PREDICTED H100 speed-up (merged loop)')
  for ax in axes:
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def write_md(report, path):
  lines = ['# Self-drafting heads on the shipped target (merged loop)', '',
           f"Command: `{report['command']}`  ",
           f"Machine: {report['machine']}  ", f"Date: {report['date']}", '']
  for task, h in report['heads'].items():
    lines.append(f"- {task}: head {h['config']}, {h['parameters']:,} "
                 f"parameters, `{h['checkpoint']}`; PREDICTED H100 c of a "
                 f"head step {h['predicted_h100_c']}")
  lines += ['', 'alpha per head step k = 1.. (draft k of the merged loop, '
            'the k-th token after the committed one; teacher-forced on the '
            'target\'s own outputs of held-out rows):', '']
  for key, alpha in report['alpha'].items():
    lines.append(f'- {key}: ' + ', '.join(f'{a:.3f}' for a in alpha))
  lines += ['', '| task | temp | drafter | gamma | per-position acceptance '
            '| tokens per target call | measured CPU speed-up | identical | '
            'c (PREDICTED H100) | PREDICTED H100 speed-up |',
            '|---|---|---|---|---|---|---|---|---|---|']
  for r in report['rows']:
    lines.append(
        f"| {r['task']} | {r['temperature']:g} | {r['drafter']} | "
        f"{r['gamma']} | "
        + ' '.join(f'{a:.2f}' for a in r['per_position_acceptance']) +
        f" | {r['tokens_per_call']:.3f} | {r['measured_cpu']:.2f}x | "
        f"{r['identical'] or 'n/a'} | {r['c']} | "
        f"**{r['predicted_h100']:.2f}x** |")
  if report.get('c_measured'):
    lines += ['', 'c of a head step MEASURED on this machine (random '
              'weights at each width, head widened in proportion; 1-token '
              'target call after 32 cached tokens, 64 input tokens), beside '
              'the ratio of the bytes each reads (float32):', '',
              '| widths | t target(1) ms | t head step ms | c measured | '
              'bytes ratio |', '|---|---|---|---|---|']
    for r in report['c_measured']:
      lines.append(f"| {r['size']} | {r['t_target_ms']} | {r['t_head_ms']} "
                   f"| {r['c_measured']} | {r['bytes_ratio']} |")
  lines += ['', _verdict(report), '', NOTES]
  with open(path, 'w') as f:
    f.write('\n'.join(lines) + '\n')


NOTES = """Notes. Target: the shipped mini target (emb 256, 4+4 layers),
float32, batch 1, held-out rows of the shipped test slices (the heads were
trained on the target's greedy outputs for the first rows of the Debian
train split, scripts/train_heads.py). Tokens per target call include the
first iteration (no drafts yet). PREDICTED H100 = tokens per target call /
(cost(gamma + 1) + gamma c): cost from ../shared/GPU.md's measured curve;
c of dec2 = GPU.md's measured 0.028 for a 2-decoder-layer drafter; c of a
head step from the cost model in this script's docstring (bytes at XXL
widths over HBM bandwidth plus kernel launches), not measured. Measured CPU
speed-ups are below 1 where a (gamma + 1)-token target call costs more than
a 1-token call on this CPU (results/costs.md)."""


if __name__ == '__main__':
  main()
