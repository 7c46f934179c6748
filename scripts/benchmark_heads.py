r"""Self-drafting heads: alpha per depth and speed-ups, on any target.

  python scripts/benchmark_heads.py --heads_dir shipped:heads \
    --tasks en_de,synopsis --temperatures 0,1 --out results/heads_shipped
  python scripts/benchmark_heads.py --target ~/t5/checkpoint_1000 \
    --target_config t5_1_1_small --arrays ~/arrays --tasks my_task \
    --draft ~/t5_dec2/checkpoint_500 \
    --draft_config 't5_1_1_small,num_decoder_layers=2' \
    --heads_dir /tmp/heads --out /tmp/heads_mine

--target / --draft are `shipped:<name>` or T5X checkpoints with
--target_config / --draft_config (`bench.models.config` specs); a
checkpoint target needs --arrays: rows from <arrays>/<task>/test.npz (the
`specdec_jax.arrays` format), else the shipped test slices. Heads are
<heads_dir>/<task> (scripts/train_heads.py --out_dir). The first
--num_examples rows are decoded one at a time with the baseline, the
heads' merged loop for gamma = 1..--max_gamma (one (gamma + 1)-token target
call plus gamma head steps per iteration) and --draft in the ordinary loop
(gamma --draft_gamma).

Columns: alpha per head step (teacher-forced on the target's own outputs),
the decodes' counters (`bench.rows.counters`), measured CPU speed-up
(greedy rows checked identical), and "predicted <profile>":
`bench.hardware.predict` on --profile from the counters, tokens per target
call / (cost(gamma + 1) + gamma c). c of --draft is the profile's measured
c of --draft_as; c of a head step is the profile's bytes / launches model
(`profile.c_of('heads', step_bytes=, kernels=)`: the head widened to the
profile target's widths, `heads.head_step_bytes` plus its cross K/V, and
`heads.HEAD_KERNELS` launches: `heads.head_step_c`). `--repredict OUT.json`
recomputes that column from a results file (nothing measured) and rewrites
its .json, .md, _alpha.png.
"""

import argparse
import functools
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import layers
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import shipped
from specdec_jax import speculative
from specdec_jax import widening
from specdec_jax.bench import flags
from specdec_jax.bench import hardware
from specdec_jax.bench import models
from specdec_jax.bench import report
from specdec_jax.bench import rows as bench_rows
from specdec_jax.drafters import heads
from specdec_jax.drafters.heads import train as heads_train
from specdec_jax.sampling import SamplingConfig

SCRIPT = 'scripts/benchmark_heads.py'


def parse_flags(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  flags.add_model_flags(p, target='shipped:target', draft='shipped:dec2')
  p.add_argument('--draft_as', default='dec2',
                 help="the profile's drafter whose measured c is --draft's")
  p.add_argument('--tasks', default='en_de,synopsis')
  p.add_argument('--heads_dir', default='shipped:heads')
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--max_gamma', type=int, default=5)
  p.add_argument('--draft_gamma', type=int, default=4)
  p.add_argument('--num_examples', type=int, default=24)
  p.add_argument('--alpha_examples', type=int, default=64)
  p.add_argument('--repeats', type=int, default=2)
  p.add_argument('--out', default='results/heads_shipped')
  p.add_argument('--c_sizes', default='native,t5_1_1_base_cost',
                 help='widths at which to MEASURE c of a head step here '
                 '(random weights; empty: skip)')
  flags.add_prediction_flags(p)
  args = p.parse_args(argv)
  if not args.repredict:
    flags.check_model_flags(p, args, 'target', 'draft')
  return args






def predict_row(row, result, profile):
  for old in ('predicted_h100', 'c'):
    row.pop(old, None)
  kw = (dict(drafter='heads', step_bytes=result['heads'][row['task']][
      'predicted_c']['step_bytes'], kernels=heads.HEAD_KERNELS)
        if row['drafter'].startswith('heads') else
        dict(drafter=result.get('draft_as', 'dec2')))
  row['predicted'] = hardware.predict(
      profile, tokens_per_call=row['tokens_per_call'], gamma=row['gamma'],
      **kw).to_json()
  return row


def repredict(result, profile, command=None):
  cfg = result.get('target_config')
  config = (network.T5Config(**dict(cfg, mlp_activations=tuple(
      cfg['mlp_activations']))) if cfg else shipped.config('target'))
  for task, h in result['heads'].items():
    h.pop('predicted_h100_c', None)
    length = h.get('input_length') or shipped.test_arrays(task)[
        'inputs'].shape[1]
    h['predicted_c'] = heads.head_step_c(
        profile, config, heads.HeadConfig(**h['config']), length)
  for row in result['rows']:
    predict_row(row, result, profile)
  result['profile'] = profile.name
  if command:
    result['predicted_by'] = command
  return result


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
  head, hp = heads.Head(config, head_cfg), heads.init_head(config, head_cfg)
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


def measure_task(args, model, params, t5, draft_params, task, result, profile):
  path = flags.checkpoint_of(f'{args.heads_dir}/{task}')
  hp, head_cfg = heads.load_head(path, model.config)
  head = heads.Head(model.config, head_cfg)
  drafter = heads.HeadDrafter(model, head_cfg)
  dparams = heads.head_params(params, hp)
  data = flags.task_arrays(args.arrays, task, model.vocab_size)
  inputs, decode_len = data['inputs'], data['targets'].shape[1]
  rel = os.path.relpath(path)
  result['heads'][task] = dict(
      checkpoint=rel if not rel.startswith('..') else report.portable(path),
      config=vars(head_cfg), input_length=int(inputs.shape[1]),
      parameters=int(sum(np.size(x) for x in jax.tree.leaves(hp))),
      predicted_c=heads.head_step_c(profile, model.config, head_cfg,
                                    inputs.shape[1]))
  rng_of = lambda i: jax.random.key(1000 + i)
  for temp in [float(t) for t in args.temperatures.split(',')]:
    sampling = SamplingConfig(temperature=temp)
    sums, counts = np.zeros(args.max_gamma), np.zeros(args.max_gamma)
    for s in range(0, min(args.alpha_examples, len(inputs)), 16):
      enc = jnp.asarray(inputs[s:s + 16])
      outs = decoding.temperature_sample(
          model, params, enc, max_decode_len=decode_len, sampling=sampling,
          rng=jax.random.key(s)).tokens
      a, c = heads_train.depth_alpha(model, params, head, hp, enc, outs,
                                     args.max_gamma, sampling)
      sums, counts = sums + a, counts + c
    alpha = (sums / np.maximum(counts, 1)).tolist()
    result['alpha'][f'{task}/t{temp:g}'] = alpha
    print(task, temp, 'alpha per head depth', np.round(alpha, 3), flush=True)
    decode = lambda fn: bench_rows.decode_rows(
        fn, inputs[:args.num_examples], args.repeats)
    spec = lambda d, dp, g, **kw: decode(
        lambda x, i: speculative.speculative_sample(
            model, params, d, dp, x, gamma=g, max_decode_len=decode_len,
            sampling=sampling, rng=rng_of(i), **kw))
    base = decode(lambda x, i: decoding.temperature_sample(
        model, params, x, max_decode_len=decode_len, sampling=sampling,
        rng=rng_of(i)))
    runs = [(f'{args.draft_as} (ordinary loop)', args.draft_gamma,
             spec(t5, draft_params, args.draft_gamma))]
    runs += [('heads (merged loop)', g, spec(drafter, dparams, g, merged=True))
             for g in range(1, args.max_gamma + 1)]
    for name, gamma, res in runs:
      c = bench_rows.compare(base, res, greedy=temp == 0)
      row = dict(task=task, temperature=temp, drafter=name, gamma=gamma, **c)
      row['measured_cpu'] = row.pop('measured')
      row['identical'] = (f"{c['identical']}/{c['rows']}" if temp == 0
                          else None)
      if name.startswith('heads'):
        row['alpha_heads'] = float(np.mean(alpha[:gamma]))
      result['rows'].append(predict_row(row, result, profile))
      print({k: v for k, v in row.items() if k != 'predicted'}, flush=True)
  return head_cfg, inputs


def main(argv=None):
  args = parse_flags(argv)
  profile = flags.profile_of(args)
  if args.repredict:
    path = pathlib.Path(args.repredict)
    command = report.portable(' '.join(
        ['python', SCRIPT] + list(sys.argv[1:] if argv is None else argv)))
    return write(repredict(report.read_json(path), profile, command),
                 str(path.with_suffix('')))
  model, params = models.load(args.target, args.target_config)
  draft, draft_params = models.load(args.draft, args.draft_config)
  t5 = drafters.T5Drafter(draft)
  result = dict(report.header(SCRIPT, argv),
                target=report.portable(args.target),
                target_config=report.config_dict(model.config),
                draft=report.portable(args.draft), draft_as=args.draft_as,
                arrays=args.arrays and report.portable(args.arrays),
                profile=profile.name, rows=[], alpha={}, heads={},
                c_measured=[])
  measured = [measure_task(args, model, params, t5, draft_params, task,
                           result, profile)
              for task in args.tasks.split(',')]
  for size in filter(None, args.c_sizes.split(',')):
    result['c_measured'].append(measure_c(model.config, *measured[0], size,
                                          args.repeats + 3))
    print(result['c_measured'][-1], flush=True)
  return write(result, args.out)


def write(result, out):
  report.write_json(out + '.json', result)
  plot(result, out + '_alpha.png')
  report.write_md(out + '.md', markdown(result))
  return result


def plot(result, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for key, alpha in result['alpha'].items():
    axes[0].plot(range(1, len(alpha) + 1), alpha, marker='o', label=key)
    task, temp = key.split('/t')
    rows = [r for r in result['rows'] if r['task'] == task and
            r['temperature'] == float(temp) and
            r['drafter'].startswith('heads')]
    axes[1].plot([r['gamma'] for r in rows],
                 [r['predicted']['speedup'] for r in rows], marker='o',
                 label=key)
  axes[0].set(xlabel='head step k (draft k of the merged loop)',
              ylabel='alpha (teacher-forced)', title='alpha per head step')
  axes[1].axhline(1.3, color='gray', ls='--', lw=0.8, label='goal 1.3x')
  axes[1].set(xlabel='gamma', ylabel='speed-up',
              title=f"PREDICTED on {result['profile']} (merged loop)")
  for ax in axes:
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
  report.save_plot(fig, path)


def markdown(result) -> str:
  profile = hardware.load(result['profile'])
  name = profile.name
  lines = [f"# Self-drafting heads on {result.get('target', 'shipped:target')}"
           ' (merged loop)', '', report.header_md(result)]
  if result.get('predicted_by'):
    lines += ['Predicted column recomputed from the measured values by '
              f"`{result['predicted_by']}`.", '']
  for task, h in result['heads'].items():
    pc = h['predicted_c']
    lines.append(f"- {task}: head {h['config']}, {h['parameters']:,} "
                 f"parameters, `{h['checkpoint']}`; c of a head step on "
                 f"{name}: {pc['c']:.4f} ({pc['c_how']}: {pc['step_bytes']:,}"
                 f" bytes at {pc['at']}, {pc['kernels']} launches)")
  lines += ['', 'alpha per head step k = 1.. (draft k of the merged loop; '
            'teacher-forced on the target\'s own outputs of held-out rows):',
            '']
  lines += [f'- {k}: ' + ', '.join(f'{a:.3f}' for a in v)
            for k, v in result['alpha'].items()]
  cells = [[r['task'], f"{r['temperature']:g}", r['drafter'], r['gamma'],
            ' '.join(f'{a:.2f}' for a in r['per_position_acceptance']),
            f"{r['tokens_per_call']:.3f}", f"{r['measured_cpu']:.2f}x",
            r['identical'] or 'n/a',
            f"{r['predicted']['c']:.4f}" + (
                '' if r['predicted']['c_how'].startswith(hardware.MEASURED)
                else ' †'), f"**{r['predicted']['speedup']:.2f}x**"]
           for r in result['rows']]
  lines += ['', report.table(
      ['task', 'temp', 'drafter', 'gamma', 'per-position acceptance',
       'tokens per target call', 'measured CPU speed-up', 'identical',
       f'c on {name}', f'predicted {name}'], cells)]
  if result.get('c_measured'):
    lines += ['', 'c of a head step MEASURED on this machine (random '
              'weights at each width, head widened in proportion; 1-token '
              'target call after 32 cached tokens), beside the ratio of the '
              'bytes each reads (float32):', '', report.table(
                  ['widths', 't target(1) ms', 't head step ms', 'c measured',
                   'bytes ratio'],
                  [[r['size'], r['t_target_ms'], r['t_head_ms'],
                    r['c_measured'], r['bytes_ratio']]
                   for r in result['c_measured']])]
  best = []
  for task in sorted({r['task'] for r in result['rows']}):
    rows = [r for r in result['rows'] if r['task'] == task and
            r['temperature'] == 0 and r['drafter'].startswith('heads')]
    if rows:
      b = max(rows, key=lambda r: r['predicted']['speedup'])
      best.append(f"{task} {b['predicted']['speedup']:.2f}x (gamma "
                  f"{b['gamma']})")
  lines += ['', f'Best predicted {name} speed-up of the self-drafting heads '
            'at t = 0: ' + '; '.join(best) + '. Goal: >= 1.3x on both tasks.',
            '', f'"predicted {name}" is PREDICTED, not measured: predicted '
            f'on profile {name} (specdec_jax/bench/profiles, read from '
            f'{profile.source}; target {profile.target}) through '
            "bench.hardware.predict from this run's counters: tokens per "
            'target call / (cost(gamma + 1) + gamma c), with the profile\'s '
            f"measured cost(k); c of {result.get('draft_as', 'dec2')} the "
            "profile's measured c; † c of a head step from the profile's "
            'bytes / launches model (step bytes / its bandwidth + launches x '
            'its launch time, over its t(1)): the profile did not time a '
            'head. Tokens per target call include the first iteration (no '
            'drafts yet). Measured CPU speed-ups are below 1 where a '
            '(gamma + 1)-token target call costs more than a 1-token call '
            'on this CPU (results/costs.md).']
  return '\n'.join(lines)


if __name__ == '__main__':
  main()
