"""Batches: per-row spread, continuous batching, and the speed-up per batch.

At batch B a fixed-batch loop (`decoding.temperature_sample`,
`speculative.speculative_sample`) runs until its slowest row ends; the other
rows idle. This script measures, on the shipped models and test inputs, at
every batch of `--batches`, every temperature of `--temperatures` and gamma:

(a) the per-row spread: per batch of B, the mean and the max of the rows'
    iterations (speculative: target calls per row; baseline: output tokens)
    and the implied utilisation mean/max;
(b) tokens/s of the baseline and the speculative loop, fixed batches vs
    continuous batching (streaming.py: ended rows refilled inside the jitted
    loop), on the same N examples, compiled, medians of `--repeats`
    (`measure.time_alternating`); greedy outputs of all four are compared;
(c) speed-ups speculative / baseline (tokens/s over tokens/s: sampled
    outputs differ in length) for fixed and streamed batches next to a
    PREDICTED speed-up: tokens per row-iteration / (cost(gamma + 1) +
    gamma * c), with cost(k) = t_target(k) / t_target(1) and c = t_draft /
    t_target(1) measured at batch B (`measure.call_time`,
    `measure.drafter_token_time`). The prediction assumes every row busy in
    every iteration (no idle rows) and leaves out the encoder / cache set-up
    (which the measured times include, for both decoders). It is
    `bench.hardware.predict` on a profile of this run's costs at batch B;
    next to it the same tokens per row-iteration predicted at T5-XXL target
    cost on a measured hardware profile (`--profile`, the H100 run's by
    default, where it measured batch B);
(d) at the batches of `--compare_at`, how the streamed speculative loop
    copes with the slowest row setting the pace: gamma fixed (`--gamma`),
    per-row adaptive draft lengths (`drafters.T5Drafter` confidence
    `--confidence`, at the same gamma) and the gamma `bench.hardware.predict`
    chooses for the batch from this run's cost(k) curve measured at batch B
    (k = 1 .. `--max_gamma` + 1) and the alpha of the gamma run, all timed
    in the same alternation as (b).

Every cell is written as soon as it is measured (OUT.json, OUT.md), batch
`--batches`' first entry first: an interrupted run keeps its cells.
`--repredict OUT.json` recomputes the predicted columns of a results file
from its measured values (nothing is measured) and rewrites OUT.json and
OUT.md.

Needs jax, flax, numpy, orbax and the package only (runs on a GPU host too):

  python scripts/benchmark_batches.py --out results/batches
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import shipped
from specdec_jax import speculative
from specdec_jax import streaming
from specdec_jax import spec_stats
from specdec_jax.bench import flags
from specdec_jax.bench import hardware
from specdec_jax.bench import report
from specdec_jax.sampling import SamplingConfig


def _ints(text):
  return tuple(int(x) for x in text.split(',') if x)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--tasks', default='en_de,synopsis')
  p.add_argument('--num_examples', type=int, default=128)
  p.add_argument('--batches', default='8,1,4,16,32',
                 help='comma-separated batch sizes, measured in this order')
  p.add_argument('--temperatures', default='0,1',
                 help='comma-separated sampling temperatures (0 = greedy)')
  p.add_argument('--gamma', type=int, default=4)
  p.add_argument('--drafter', default='dec2')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--compare_at', default='8',
                 help='batches at which (d) compares fixed gamma, adaptive '
                 "draft lengths and the profile's gamma ('' = none)")
  p.add_argument('--confidence', type=float, default=0.4,
                 help='T5Drafter confidence of the adaptive rows of (d)')
  p.add_argument('--max_gamma', type=int, default=7,
                 help='largest gamma the profile may choose in (d)')
  p.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
  p.add_argument('--widen', default='native',
                 help="'native', or a widening preset for the target (e.g. "
                 "t5_1_1_xxl_cost: function-preserving, same outputs, the "
                 "cost of the bigger model)")
  p.add_argument('--eos_id', type=int, default=1)
  p.add_argument('--refill_sizes', default='',
                 help='comma-separated sub-batch sizes a stream refill '
                 'encodes in (default: powers of two up to the batch)')
  p.add_argument('--out', default='results/batches',
                 help='writes OUT.md and OUT.json')
  p.add_argument('--merge', action='store_true',
                 help="keep OUT.json's cells that this run does not measure "
                 '(same task, batch and temperature: replaced)')
  flags.add_prediction_flags(p, optional=True)
  args = p.parse_args(argv)
  if args.repredict:
    return args
  args.refill_sizes = _ints(args.refill_sizes) or None
  args.batches = _ints(args.batches)
  args.compare_at = _ints(args.compare_at)
  args.temperatures = tuple(float(t) for t in args.temperatures.split(','))
  bad = [b for b in args.batches if args.num_examples % b]
  if bad:
    p.error(f'--num_examples must be a multiple of every batch (fixed '
            f'batches); not of {bad}.')
  return args


def spread(costs: np.ndarray, batch: int) -> dict:
  """Per batch of `batch` rows: mean, max and mean / max of `costs`."""
  rows = costs.reshape(-1, batch)
  means, maxes = rows.mean(1), rows.max(1)
  return {
      'per_batch_mean': [float(x) for x in means],
      'per_batch_max': [int(x) for x in maxes],
      'per_batch_utilisation': [float(x) for x in means / maxes],
      'utilisation': float(means.sum() / maxes.sum()),
  }


def cost_curve(target, target_params, inputs, ks, context):
  """{k: cost(k) = t(k) / t(1)} at the batch of `inputs`, and t(1) s."""
  top = max(ks)
  t = {k: measure.call_time(target, target_params, inputs, k,
                            context=context, max_length=context + top + 8)
       for k in sorted(set(ks) | {1})}
  return {k: t[k] / t[1] for k in t}, t[1]


def run_cell(task, batch, temperature, args, target, target_params, dmodel,
             draft_params):
  """One (task, batch, temperature): every decoder timed side by side."""
  arrays = shipped.test_arrays(task)
  inputs = jnp.asarray(arrays['inputs'][:args.num_examples])
  max_len = int(arrays['targets'].shape[1])
  b, g = batch, args.gamma
  batches = [inputs[i:i + b] for i in range(0, len(inputs), b)]
  sampling = SamplingConfig(temperature=temperature)
  kw = dict(max_decode_len=max_len, eos_id=args.eos_id, sampling=sampling)
  key = jax.random.key(0)
  rngs = [jax.random.fold_in(key, i) for i in range(len(batches))]
  drafter = drafters.T5Drafter(dmodel)
  stream_kw = dict(batch_size=b, refill_sizes=args.refill_sizes, rng=key,
                   **kw)

  def spec_stream(dr, gamma):
    return lambda: streaming.speculative_stream(
        target, target_params, dr, draft_params, inputs, gamma=gamma,
        **stream_kw)

  calls = {
      'baseline_fixed': lambda: [decoding.temperature_sample(
          target, target_params, x, rng=r, **kw)
                                 for x, r in zip(batches, rngs)],
      'baseline_stream': lambda: streaming.sample_stream(
          target, target_params, inputs, **stream_kw),
      'speculative_fixed': lambda: [speculative.speculative_sample(
          target, target_params, drafter, draft_params, x, gamma=g, rng=r,
          **kw) for x, r in zip(batches, rngs)],
      'speculative_stream': spec_stream(drafter, g),
  }
  compare = b in args.compare_at
  context = max_len // 2
  first = {}

  def warm(name):
    start = time.perf_counter()
    first[name] = jax.block_until_ready(calls[name]())
    return time.perf_counter() - start

  compile_s = {name: warm(name) for name in list(calls)}
  ks = [1, g + 1]
  chosen = None
  if compare:  # (d): adaptive lengths, and the gamma the profile chooses
    ks += list(range(2, args.max_gamma + 2))

  def costs():
    curve, t1 = cost_curve(target, target_params, inputs[:b], ks, context)
    t_draft = measure.drafter_token_time(drafter, draft_params, inputs[:b],
                                         g, context=context, jit_setup=True)
    return curve, t1, t_draft

  measured = [costs()]
  if compare:
    curve, t1, t_draft = measured[0]
    alpha = spec_stats.summarize(first['speculative_stream'].stats)['alpha']
    profile = hardware.HardwareProfile.of_run(
        f'{task}, batch {b}, t = {temperature:g} (this run)', b, t1, curve,
        {args.drafter: t_draft / t1})
    chosen = hardware.predict(profile, alpha=min(max(alpha, 0.0), 1.0),
                              drafter=args.drafter, batch=b,
                              max_gamma=args.max_gamma)
    calls['speculative_stream_adaptive'] = spec_stream(
        drafters.T5Drafter(dmodel, confidence=args.confidence), g)
    calls['speculative_stream_profile_gamma'] = spec_stream(
        drafter, chosen.gamma)
    for name in ('speculative_stream_adaptive',
                 'speculative_stream_profile_gamma'):
      compile_s[name] = warm(name)
  for name, s in compile_s.items():
    print(f'{task} batch {b} t={temperature:g} {name}: first call (compile) '
          f'{s:.1f} s', flush=True)
  # Rounds of every decoder (alternating order) each followed by the cost
  # timings, so that load drift on a shared machine reaches the measured
  # speed-ups and the costs behind the prediction alike; medians.
  times = {name: [] for name in calls}
  for round_ in range(args.repeats):
    results, seconds = measure.time_alternating(calls, 1,
                                                reverse=round_ % 2 == 1)
    for name, sec in seconds.items():
      times[name].append(sec)
    measured.append(costs())
  seconds = {k: float(np.median(v)) for k, v in times.items()}
  t1 = float(np.median([m[1] for m in measured]))
  t_draft = float(np.median([m[2] for m in measured]))
  curve = {k: float(np.median([m[0][k] for m in measured])) for k in ks}
  c = t_draft / t1

  cat = lambda rs, f: np.concatenate([np.asarray(f(r)) for r in rs])
  fixed = lambda name, f: cat(results[name], f)
  out_tokens = {
      'baseline_fixed': fixed('baseline_fixed', lambda r: r.tokens),
      'speculative_fixed': fixed('speculative_fixed', lambda r: r.tokens)}
  lengths = {
      'baseline_fixed': fixed('baseline_fixed', lambda r: r.lengths),
      'speculative_fixed': fixed('speculative_fixed', lambda r: r.lengths)}
  for name in calls:
    if name.endswith('_fixed'):
      continue
    out_tokens[name] = np.asarray(results[name].tokens)
    lengths[name] = np.asarray(results[name].lengths)
  tokens = {k: int(v.sum()) for k, v in lengths.items()}
  identical = None
  if temperature == 0:
    identical = {k: int(np.all(v == out_tokens['baseline_fixed'],
                               axis=1).sum())
                 for k, v in out_tokens.items() if k != 'baseline_fixed'}

  spec_rows = fixed('speculative_fixed', lambda r: r.stats.row_iterations)
  stream_stats = results['speculative_stream'].stats
  stream_rows = np.asarray(stream_stats.row_iterations)
  iterations = {
      'baseline_fixed': int(sum(int(np.max(r.lengths))
                                for r in results['baseline_fixed'])),
      'baseline_stream': int(results['baseline_stream'].iterations),
      'speculative_fixed': int(sum(int(r.stats.iterations)
                                   for r in results['speculative_fixed'])),
      'speculative_stream': int(stream_stats.iterations),
  }
  utilisation = {
      'baseline_fixed': tokens['baseline_fixed'] / (
          iterations['baseline_fixed'] * b),
      'baseline_stream': tokens['baseline_stream'] / (
          iterations['baseline_stream'] * b),
      'speculative_fixed': spec_rows.sum() / (
          iterations['speculative_fixed'] * b),
      'speculative_stream': stream_rows.sum() / (
          iterations['speculative_stream'] * b),
  }
  tps = {k: tokens[k] / seconds[k] for k in seconds}
  speedup = lambda spec, base: tps[spec] / tps[base]
  row = {
      'task': task, 'examples': int(len(inputs)), 'batch': b, 'gamma': g,
      'temperature': float(temperature), 'max_decode_len': max_len,
      'output_tokens': tokens,
      'refill_sizes': list(streaming.bucket_sizes(b, args.refill_sizes)),
      'identical_to_baseline_fixed': identical,
      'seconds': seconds, 'first_call_seconds': compile_s,
      'tokens_per_s': tps,
      'loop_iterations': iterations,
      'row_utilisation': {k: float(v) for k, v in utilisation.items()},
      'spread_speculative_row_iterations': spread(spec_rows, b),
      'spread_baseline_output_tokens': spread(lengths['baseline_fixed'], b),
      'acceptance': spec_stats.summarize(stream_stats),
      't_target_1_ms': t1 * 1e3, 't_target_k_ms': t1 * curve[g + 1] * 1e3,
      'cost_gamma_plus_1': curve[g + 1], 'cost_curve': curve,
      't_draft_ms': t_draft * 1e3, 'c': c,
      # Of the streamed speculative run (its own tokens: sampled outputs
      # differ between runs).
      'tokens_per_row_iteration': tokens['speculative_stream'] / float(
          stream_rows.sum()),
      'measured_speedup_fixed': speedup('speculative_fixed',
                                        'baseline_fixed'),
      'measured_speedup_stream': speedup('speculative_stream',
                                         'baseline_stream'),
      'stream_gain_baseline': tps['baseline_stream'] / tps['baseline_fixed'],
      'stream_gain_speculative': tps['speculative_stream'] /
                                 tps['speculative_fixed'],
  }
  if compare:
    variants = {}
    for name, label, gamma in (
        ('speculative_stream', f'gamma {g}', g),
        ('speculative_stream_adaptive',
         f'gamma {g}, confidence {args.confidence:g}', g),
        ('speculative_stream_profile_gamma',
         f'gamma {chosen.gamma} (chosen by the profile)', chosen.gamma)):
      st = results[name].stats
      variants[name] = {
          'label': label, 'gamma': gamma,
          'tokens_per_s': tps[name],
          'measured_speedup_stream': speedup(name, 'baseline_stream'),
          'target_calls': int(st.iterations),
          'drafted_per_token': float(np.sum(st.drafted)) / tokens[name],
          'alpha': spec_stats.summarize(st)['alpha'],
      }
    row['draft_length_comparison'] = {
        'variants': variants,
        'profile_choice': chosen.to_json(),
        'alpha_used': alpha,
        'best': max(variants, key=lambda k: variants[k]['tokens_per_s']),
    }
  return row


def run_profile(row, meta):
  """The profile of this run's costs at the row's batch (t(1), cost(gamma
  + 1), c of its drafter), so its prediction goes through
  `bench.hardware.predict`."""
  b, k = row['batch'], row['gamma'] + 1
  return hardware.HardwareProfile(
      name=f"{pathlib.Path(meta.get('out', 'batches')).name} costs: "
      f"{row['task']}, batch {b}", device=meta['machine'],
      target=f"shipped {meta['target']}, {meta['dtype']}",
      t1_ms=row['t_target_1_ms'], floor_ms=None, bandwidth=None,
      launch_ms=None, cost={b: {1: 1.0, k: row['cost_gamma_plus_1']}},
      c={b: {meta['drafter']: row['c']}}, source=meta.get('out', ''),
      command=meta['command'], date=meta['date'])


def predict_row(row, meta, profile):
  """A row's predicted figures from its measured ones (`hardware.predict`).

  predicted: tokens per row-iteration / (cost(gamma + 1) + gamma c) on this
  run's costs; fixed with spread: that times the measured row utilisation
  of the speculative over the baseline fixed batches; at XXL cost: the same
  tokens per row-iteration on `profile` at the row's batch.
  """
  p = hardware.predict(run_profile(row, meta),
                       tokens_per_call=row['tokens_per_row_iteration'],
                       gamma=row['gamma'], drafter=meta['drafter'],
                       batch=row['batch'])
  row['predicted_speedup'] = p.speedup
  row['predicted_label'] = p.label
  # PREDICTED too: the same with each fixed-batch decoder's measured row
  # utilisation (mean/max) applied to its own cost.
  row['predicted_speedup_fixed_with_spread'] = p.speedup * (
      row['spread_speculative_row_iterations']['utilisation'] /
      row['spread_baseline_output_tokens']['utilisation'])
  row['measured_over_predicted_fixed'] = (
      row['measured_speedup_fixed'] / p.speedup)
  row['measured_over_predicted_stream'] = (
      row['measured_speedup_stream'] / p.speedup)
  row['predicted_at_xxl_cost'] = None
  row.pop('predicted_at_xxl_cost_note', None)
  if profile is None:
    return row
  if meta['drafter'] not in profile.drafters(1):
    row['predicted_at_xxl_cost_note'] = (
        f"profile {profile.name} did not time {meta['drafter']}")
  elif row['batch'] not in profile.batches():
    row['predicted_at_xxl_cost_note'] = (
        f"profile {profile.name} measured no cost curve at batch "
        f"{row['batch']} (batches {list(profile.batches())})")
  else:
    row['predicted_at_xxl_cost'] = hardware.predict(
        profile, tokens_per_call=row['tokens_per_row_iteration'],
        gamma=row['gamma'], drafter=meta['drafter'],
        batch=row['batch']).to_json()
  return row


def repredict(result, profile, command=None):
  """Every predicted figure of a results dict from its measured values."""
  for row in result['rows']:
    predict_row(row, result['meta'], profile)
  result['meta']['profile'] = None if profile is None else profile.name
  if command:
    result['meta']['predicted_by'] = command
  return result


def _key(row):
  return (row['task'], row.get('temperature', 0.0), row['batch'])


def write_markdown(path, rows, meta):
  f = lambda x: f'{x:.2f}'
  rows = sorted(rows, key=_key)
  profile_name = meta.get('profile')
  lines = [
      '# Batches: continuous batching and the speed-up per batch '
      f'({meta["backend"]})', '',
      f'Command: `{meta["command"]}`  ',
      f'Machine: {meta["machine"]}  ',
      f'Date: {meta["date"]}']
  if meta.get('predicted_by'):  # (the line a rerun of the command changes)
    lines += ['Predicted columns recomputed from the measured values by '
              f'`{meta["predicted_by"]}`.']
  lines += ['']
  if meta.get('note_md'):
    lines += [meta['note_md'], '']
  lines += [
      f'Shipped target ({meta["target"]}) and drafter `{meta["drafter"]}`, '
      f'{meta["dtype"]}, gamma {rows[0]["gamma"]}, the first '
      f'{rows[0]["examples"]} test examples of each task at every batch and '
      'temperature, EOS ends a row. "fixed" = the loops over batches of B '
      '(each runs until its slowest row ends); "stream" = streaming.py (an '
      'ended row is refilled with the next example inside the same jitted '
      'loop). Times: compiled, medians of '
      f'{meta["repeats"]} alternating runs of all decoders of a cell, '
      'encoder / cache set-up included; t_target, cost and c: medians of '
      'timings taken once before and after each of those runs. Speed-up = '
      'speculative tokens/s / '
      'baseline tokens/s (at t = 1 the outputs, and so their lengths, '
      'differ between runs). **Predicted** (not measured) = tokens per '
      'row-iteration of the streamed run / (cost(gamma+1) + gamma c), cost '
      'and c measured at batch B: every row busy, no set-up; predicted on '
      'profile "<this file> costs: <task>, batch B" (this run\'s costs in '
      'the table) through bench.hardware.predict.' + (
          f' "predicted {profile_name}" = the same tokens per row-iteration '
          f'predicted on profile {profile_name} (measured on another device, '
          'at T5-XXL target cost: specdec_jax/bench/profiles) through '
          'bench.hardware.predict, where it measured batch B.'
          if profile_name else ''), '',
      '## Speed-up speculative / baseline vs predicted', '',
      '| task | t | batch | alpha | tokens per row-iteration | '
      't_target(1) ms | cost(gamma+1) | c | predicted | measured fixed | '
      'measured stream | measured/predicted fixed | measured/predicted '
      'stream |' + (f' predicted {profile_name} |' if profile_name else ''),
      '|---|---|---|---|---|---|---|---|---|---|---|---|---|'
      + ('---|' if profile_name else '')]
  for r in rows:
    xxl = r.get('predicted_at_xxl_cost')
    xxl_cell = '-' if not xxl else f"{xxl['speedup']:.2f}"
    lines.append(
        f'| {r["task"]} | {r.get("temperature", 0.0):g} | {r["batch"]} | '
        f'{f(r["acceptance"]["alpha"])} | '
        f'{f(r["tokens_per_row_iteration"])} | {f(r["t_target_1_ms"])} | '
        f'{f(r["cost_gamma_plus_1"])} | {r["c"]:.3f} | '
        f'{f(r["predicted_speedup"])} | '
        f'{f(r["measured_speedup_fixed"])} | '
        f'**{f(r["measured_speedup_stream"])}** | '
        f'{f(r["measured_over_predicted_fixed"])} | '
        f'**{f(r["measured_over_predicted_stream"])}** |'
        + (f' {xxl_cell} |' if profile_name else ''))
  lines += ['', '## Tokens/s, fixed vs stream', '',
            '| task | t | batch | baseline fixed | baseline stream | '
            'speculative fixed | speculative stream | stream gain baseline / '
            'speculative | busy rows (speculative) fixed / stream | '
            'identical to the fixed baseline (greedy) |',
            '|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    tps, util = r['tokens_per_s'], r['row_utilisation']
    ident = r['identical_to_baseline_fixed']
    idn = '-' if not ident else ', '.join(
        f'{ident[k]}' for k in ('baseline_stream', 'speculative_fixed',
                                'speculative_stream')) + (
                                    f' /{r["examples"]}')
    lines.append(
        f'| {r["task"]} | {r.get("temperature", 0.0):g} | {r["batch"]} | '
        f'{tps["baseline_fixed"]:.0f} | {tps["baseline_stream"]:.0f} | '
        f'{tps["speculative_fixed"]:.0f} | '
        f'{tps["speculative_stream"]:.0f} | '
        f'{f(r["stream_gain_baseline"])}x / '
        f'{f(r["stream_gain_speculative"])}x | '
        f'{f(util["speculative_fixed"])} / '
        f'{f(util["speculative_stream"])} | {idn} |')
  compared = [r for r in rows if r.get('draft_length_comparison')]
  if compared:
    lines += [
        '', '## The slowest row sets the pace: gamma, adaptive lengths, '
        "the profile's gamma (streamed)", '',
        'All three timed in the same alternation as the table above; '
        "speed-up over the streamed baseline. The profile's gamma: "
        'bench.hardware.predict (Theorem 3.8) on this run\'s cost(k) curve '
        'measured at the batch and the alpha of the gamma run (a '
        'prediction choosing a setting; the speed-ups are measured).', '',
        '| task | t | batch | setting | tokens/s | measured speed-up | '
        'target calls | drafted per token | alpha |',
        '|---|---|---|---|---|---|---|---|---|']
    for r in compared:
      cmp_ = r['draft_length_comparison']
      for name, v in cmp_['variants'].items():
        best = ' (best)' if name == cmp_['best'] else ''
        lines.append(
            f'| {r["task"]} | {r.get("temperature", 0.0):g} | {r["batch"]} | '
            f'{v["label"]}{best} | {v["tokens_per_s"]:.0f} | '
            f'{f(v["measured_speedup_stream"])} | {v["target_calls"]} | '
            f'{f(v["drafted_per_token"])} | {f(v["alpha"])} |')
  lines += ['', '## Per-row spread of fixed batches', '',
            '| task | t | batch | speculative busy rows (sum mean / sum max '
            'row iterations) | baseline busy rows |', '|---|---|---|---|---|']
  for r in rows:
    lines.append(
        f'| {r["task"]} | {r.get("temperature", 0.0):g} | {r["batch"]} | '
        f'{f(r["spread_speculative_row_iterations"]["utilisation"])} | '
        f'{f(r["spread_baseline_output_tokens"]["utilisation"])} |')
  report.write_md(path, '\n'.join(lines) + '\n')


def main(argv=None):
  args = parse_args(argv)
  profile = flags.profile_of(args, optional=True)
  if args.repredict:
    path = pathlib.Path(args.repredict)
    result = report.read_json(path)
    result['meta'].setdefault('out', report.portable(str(path.with_suffix(''))))
    result = repredict(result, profile, report.portable(
        ' '.join(['python scripts/benchmark_batches.py'] + list(
            sys.argv[1:] if argv is None else argv))))
    report.write_json(path, result)
    write_markdown(path.with_suffix('.md'), result['rows'], result['meta'])
    return
  dtype = jnp.bfloat16 if args.dtype == 'bfloat16' else None
  target, target_params = shipped.load_model('target', dtype=dtype)
  target_name = 'target'
  if args.widen != 'native':
    from specdec_jax import widening  # pylint: disable=g-import-not-at-top
    target_params, cfg = widening.widen_to(target_params, target.config,
                                           args.widen)
    target = network.T5Model(cfg)
    target_name = f'target widened to {args.widen}'
  dmodel, draft_params = shipped.load_model(args.drafter, dtype=dtype)
  meta = dict(
      report.header('scripts/benchmark_batches.py', argv),
      target=target_name, drafter=args.drafter, dtype=args.dtype,
      repeats=args.repeats, out=report.portable(args.out),
      note='predicted_* figures are PREDICTED (bench.hardware.predict on '
      'the measured cost(gamma+1) and c at the batch), not measured.')
  kept = []
  if args.merge and pathlib.Path(args.out + '.json').exists():
    previous = report.read_json(args.out + '.json')
    cells = {(t, float(x), b) for t in args.tasks.split(',')
             for x in args.temperatures for b in args.batches}
    kept = [r for r in previous['rows'] if _key(r) not in cells]
    meta['command'] = previous['meta']['command'] + '` and `' + (
        meta['command'])
  rows = []
  for batch in args.batches:
    for temperature in args.temperatures:
      for task in args.tasks.split(','):
        start = time.perf_counter()
        rows.append(run_cell(task, batch, temperature, args, target,
                             target_params, dmodel, draft_params))
        r = rows[-1]
        result = repredict(
            {'meta': meta, 'rows': sorted(kept + rows, key=_key)}, profile)
        report.write_json(args.out + '.json', result)
        write_markdown(args.out + '.md', result['rows'], meta)
        print(f'{task} batch {batch} t={temperature:g} '
              f'({time.perf_counter() - start:.0f} s): speed-up fixed '
              f'{r["measured_speedup_fixed"]:.2f} stream '
              f'{r["measured_speedup_stream"]:.2f} predicted '
              f'{r["predicted_speedup"]:.2f} (measured/predicted stream '
              f'{r["measured_over_predicted_stream"]:.2f}); stream gain '
              f'baseline {r["stream_gain_baseline"]:.2f} speculative '
              f'{r["stream_gain_speculative"]:.2f}', flush=True)


if __name__ == '__main__':
  main()
