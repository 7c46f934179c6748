"""Batches: the per-row spread of fixed batches, and continuous batching.

At batch B a fixed-batch loop (`decoding.temperature_sample`,
`speculative.speculative_sample`) runs until its slowest row ends; the other
rows idle. This script measures, on the shipped models and test inputs,
greedy, at batch B and gamma:

(a) the per-row spread: per batch of B, the mean and the max of the rows'
    iterations (speculative: target calls per row; baseline: output tokens)
    and the implied utilisation mean/max;
(b) tokens/s of the baseline and the speculative loop, fixed batches vs
    continuous batching (streaming.py: ended rows refilled inside the jitted
    loop), on the same N examples, compiled, medians of `--repeats`
    (`measure.time_alternating`); the greedy outputs of all four are compared;
(c) speed-ups speculative / baseline for fixed and streamed batches next to a
    PREDICTED speed-up: tokens per row-iteration (averaged over the run's rows)
    / (cost(gamma + 1) + gamma * c), with cost(k) = t_target(k) / t_target(1)
    and c = t_draft / t_target(1) measured at batch B (`measure.call_time`,
    `measure.drafter_token_time`). The prediction assumes every row busy in
    every iteration (no idle rows) and leaves out the encoder / cache set-up
    (which the measured times include, for both decoders). It is
    `bench.hardware.predict` on a profile of this run's costs at batch B;
    next to it the same tokens per row-iteration predicted at T5-XXL target
    cost on a measured hardware profile (`--profile`, the H100 run's by
    default; its measured c of the drafter and cost(gamma + 1) at batch B,
    interpolated between its measured k where it says so).

`--repredict OUT.json` recomputes the predicted columns of a results file
from its measured values (nothing is measured) and rewrites OUT.json and
OUT.md.

Needs jax, flax, numpy, orbax and the package only (runs on a GPU host too):

  python scripts/benchmark_batches.py --out results/batches_cpu
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


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--tasks', default='synopsis,en_de')
  p.add_argument('--num_examples', type=int, default=64)
  p.add_argument('--batch', type=int, default=8)
  p.add_argument('--gamma', type=int, default=4)
  p.add_argument('--drafter', default='dec2')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
  p.add_argument('--widen', default='native',
                 help="'native', or a widening preset for the target (e.g. "
                 "t5_1_1_xxl_cost: function-preserving, same outputs, the "
                 "cost of the bigger model)")
  p.add_argument('--eos_id', type=int, default=1)
  p.add_argument('--refill_sizes', default='',
                 help='comma-separated sub-batch sizes a stream refill '
                 'encodes in (default: powers of two up to --batch; '
                 "'8' at batch 8: always the full slot batch)")
  p.add_argument('--out', default='results/batches_cpu',
                 help='writes OUT.md and OUT.json')
  flags.add_prediction_flags(p, optional=True)
  args = p.parse_args(argv)
  if args.repredict:
    return args
  args.refill_sizes = (tuple(int(x) for x in args.refill_sizes.split(','))
                       if args.refill_sizes else None)
  if args.num_examples % args.batch:
    p.error('--num_examples must be a multiple of --batch (fixed batches).')
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


def run_task(task, args, target, target_params, drafter, draft_params):
  arrays = shipped.test_arrays(task)
  inputs = jnp.asarray(arrays['inputs'][:args.num_examples])
  max_len = int(arrays['targets'].shape[1])
  b, g, eos = args.batch, args.gamma, args.eos_id
  batches = [inputs[i:i + b] for i in range(0, len(inputs), b)]
  kw = dict(max_decode_len=max_len, eos_id=eos)

  calls = {
      'baseline_fixed': lambda: [decoding.temperature_sample(
          target, target_params, x, **kw) for x in batches],
      'baseline_stream': lambda: streaming.sample_stream(
          target, target_params, inputs, batch_size=b,
          refill_sizes=args.refill_sizes, **kw),
      'speculative_fixed': lambda: [speculative.speculative_sample(
          target, target_params, drafter, draft_params, x, gamma=g, **kw)
                                    for x in batches],
      'speculative_stream': lambda: streaming.speculative_stream(
          target, target_params, drafter, draft_params, inputs,
          batch_size=b, gamma=g, refill_sizes=args.refill_sizes, **kw),
  }
  compile_s = {}
  for name, fn in calls.items():
    start = time.perf_counter()
    jax.block_until_ready(fn())
    compile_s[name] = time.perf_counter() - start
    print(f'{task} {name}: first call (compile) {compile_s[name]:.1f} s',
          flush=True)
  results, seconds = measure.time_alternating(calls, args.repeats)

  cat = lambda rs, f: np.concatenate([np.asarray(f(r)) for r in rs])
  base_tokens = cat(results['baseline_fixed'], lambda r: r.tokens)
  base_lengths = cat(results['baseline_fixed'], lambda r: r.lengths)
  outputs = {
      'baseline_stream': np.asarray(results['baseline_stream'].tokens),
      'speculative_fixed': cat(results['speculative_fixed'],
                               lambda r: r.tokens),
      'speculative_stream': np.asarray(results['speculative_stream'].tokens),
  }
  identical = {k: int(np.all(v == base_tokens, axis=1).sum())
               for k, v in outputs.items()}
  tokens = int(base_lengths.sum())

  spec_rows = cat(results['speculative_fixed'],
                  lambda r: r.stats.row_iterations)
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
      'baseline_fixed': tokens / (iterations['baseline_fixed'] * b),
      'baseline_stream': tokens / (iterations['baseline_stream'] * b),
      'speculative_fixed': spec_rows.sum() / (
          iterations['speculative_fixed'] * b),
      'speculative_stream': stream_rows.sum() / (
          iterations['speculative_stream'] * b),
  }

  # Costs at batch b, at a context of half the output length.
  context = max_len // 2
  t1 = measure.call_time(target, target_params, inputs[:b], 1,
                         context=context, max_length=context + g + 9)
  tk = measure.call_time(target, target_params, inputs[:b], g + 1,
                         context=context, max_length=context + g + 9)
  t_draft = measure.drafter_token_time(drafter, draft_params, inputs[:b], g,
                                       context=context, jit_setup=True)
  cost, c = tk / t1, t_draft / t1
  tokens_per_row_iteration = tokens / float(spec_rows.sum())
  speedup_fixed = seconds['baseline_fixed'] / seconds['speculative_fixed']
  speedup_stream = seconds['baseline_stream'] / seconds['speculative_stream']
  spec_spread = spread(spec_rows, b)
  base_spread = spread(base_lengths, b)
  return {
      'task': task, 'examples': int(len(inputs)), 'batch': b, 'gamma': g,
      'max_decode_len': max_len, 'output_tokens': tokens,
      'refill_sizes': list(streaming.bucket_sizes(b, args.refill_sizes)),
      'identical_to_baseline_fixed': identical,
      'seconds': seconds, 'first_call_seconds': compile_s,
      'tokens_per_s': {k: tokens / v for k, v in seconds.items()},
      'loop_iterations': iterations,
      'row_utilisation': {k: float(v) for k, v in utilisation.items()},
      'spread_speculative_row_iterations': spec_spread,
      'spread_baseline_output_tokens': base_spread,
      'acceptance': spec_stats.summarize(stream_stats),
      't_target_1_ms': t1 * 1e3, 't_target_k_ms': tk * 1e3,
      'cost_gamma_plus_1': cost, 't_draft_ms': t_draft * 1e3, 'c': c,
      'tokens_per_row_iteration': tokens_per_row_iteration,
      'measured_speedup_fixed': speedup_fixed,
      'measured_speedup_stream': speedup_stream,
      'stream_gain_baseline': seconds['baseline_fixed'] /
                              seconds['baseline_stream'],
      'stream_gain_speculative': seconds['speculative_fixed'] /
                                 seconds['speculative_stream'],
  }


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


def write_markdown(path, rows, meta):
  f = lambda x: f'{x:.2f}'
  profile_name = meta.get('profile')
  lines = [
      '# Batches: per-row spread and continuous batching '
      f'({meta["backend"]})', '',
      f'Command: `{meta["command"]}`  ',
      f'Machine: {meta["machine"]}  ',
      f'Date: {meta["date"]}', '']
  if meta.get('predicted_by'):
    lines += ['Predicted columns recomputed from the measured values by '
              f'`{meta["predicted_by"]}`.', '']
  lines += [
      f'Shipped target ({meta["target"]}) and drafter `{meta["drafter"]}`, '
      f'{meta["dtype"]}, greedy, batch {rows[0]["batch"]}, gamma '
      f'{rows[0]["gamma"]}, the first {rows[0]["examples"]} test examples '
      'of each task, EOS ends a row. "fixed" = the existing loops over '
      'batches of B (each runs until its slowest row ends); "stream" = '
      'streaming.py (an ended row is refilled with the next example inside '
      'the same jitted loop). Times: compiled, medians of '
      f'{meta["repeats"]} alternating runs, encoder / cache set-up '
      'included. **Predicted** (not measured) = tokens per row-iteration / '
      '(cost(gamma+1) + gamma c), cost and c measured at batch B: every row '
      'busy, no set-up; predicted on profile "<this file> costs: <task>, '
      'batch B" (this run\'s costs in the table) through '
      'bench.hardware.predict.' + (
          f' "predicted {profile_name}" = the same tokens per row-iteration '
          f'predicted on profile {profile_name} (measured on another device, at '
          'T5-XXL target cost: specdec_jax/bench/profiles) through '
          'bench.hardware.predict, with its c of the drafter and its '
          'cost(gamma+1) at batch B (how each was obtained in brackets '
          'where not measured).' if profile_name else ''), '',
      '## (a) Per-row spread of fixed batches', '',
      '| task | decoder | per-batch mean / max row iterations | utilisation '
      '(sum mean / sum max) |', '|---|---|---|---|']
  for r in rows:
    for name, s in (('speculative', r['spread_speculative_row_iterations']),
                    ('baseline', r['spread_baseline_output_tokens'])):
      pairs = ', '.join(f'{m:.1f}/{x}' for m, x in zip(s['per_batch_mean'],
                                                      s['per_batch_max']))
      lines.append(f'| {r["task"]} | {name} | {pairs} | '
                   f'{f(s["utilisation"])} |')
  lines += ['', '## (b) Tokens/s, fixed vs stream', '',
            '| task | decoder | fixed tok/s | stream tok/s | stream gain | '
            'loop iterations fixed / stream | row utilisation fixed / stream '
            '| identical outputs |', '|---|---|---|---|---|---|---|---|']
  for r in rows:
    for d in ('baseline', 'speculative'):
      fx, st = f'{d}_fixed', f'{d}_stream'
      ident = r['identical_to_baseline_fixed']
      idn = (f'{ident[st]}/{r["examples"]}' if d == 'baseline' else
             f'{ident[fx]}, {ident[st]} /{r["examples"]}')
      lines.append(
          f'| {r["task"]} | {d} | {r["tokens_per_s"][fx]:.0f} | '
          f'{r["tokens_per_s"][st]:.0f} | {f(r[f"stream_gain_{d}"])}x | '
          f'{r["loop_iterations"][fx]} / {r["loop_iterations"][st]} | '
          f'{f(r["row_utilisation"][fx])} / {f(r["row_utilisation"][st])} | '
          f'{idn} |')
  lines += ['', '## (c) Speed-up speculative / baseline vs predicted', '',
            '| task | alpha | tokens per row-iteration | t_target(1) ms | '
            'cost(gamma+1) | c | predicted | predicted fixed with spread | '
            'measured fixed | measured stream | measured/predicted fixed | '
            'measured/predicted stream |'
            + (f' predicted {profile_name} |' if profile_name else ''),
            '|---|---|---|---|---|---|---|---|---|---|---|---|'
            + ('---|' if profile_name else '')]
  for r in rows:
    xxl = r.get('predicted_at_xxl_cost')
    notes = [] if not xxl else [
        f"cost({xxl['width']}) {xxl['cost_how']}"] * (
            xxl['cost_how'] != hardware.MEASURED) + [
                f"c {xxl['c_how']}"] * (xxl['c_how'] != hardware.MEASURED)
    xxl_cell = (f"- ({r['predicted_at_xxl_cost_note']})"
                if r.get('predicted_at_xxl_cost_note') else '-') if not xxl \
        else f"{xxl['speedup']:.2f}" + (f" ({'; '.join(notes)})"
                                         if notes else '')
    lines.append(
        f'| {r["task"]} | {f(r["acceptance"]["alpha"])} | '
        f'{f(r["tokens_per_row_iteration"])} | {f(r["t_target_1_ms"])} | '
        f'{f(r["cost_gamma_plus_1"])} | {r["c"]:.3f} | '
        f'{f(r["predicted_speedup"])} | '
        f'{f(r["predicted_speedup_fixed_with_spread"])} | '
        f'**{f(r["measured_speedup_fixed"])}** | '
        f'**{f(r["measured_speedup_stream"])}** | '
        f'{f(r["measured_over_predicted_fixed"])} | '
        f'{f(r["measured_over_predicted_stream"])} |'
        + (f' {xxl_cell} |' if profile_name else ''))
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
  drafter = drafters.T5Drafter(dmodel)
  rows = [run_task(t, args, target, target_params, drafter, draft_params)
          for t in args.tasks.split(',')]
  meta = dict(
      report.header('scripts/benchmark_batches.py', argv),
      target=target_name, drafter=args.drafter, dtype=args.dtype,
      repeats=args.repeats, out=report.portable(args.out),
      note='predicted_* figures are PREDICTED (bench.hardware.predict on '
      'the measured cost(gamma+1) and c at the batch), not measured.')
  result = repredict({'meta': meta, 'rows': rows}, profile)
  report.write_json(args.out + '.json', result)
  write_markdown(args.out + '.md', rows, meta)
  for r in rows:
    print(f'{r["task"]}: speed-up fixed {r["measured_speedup_fixed"]:.2f} '
          f'stream {r["measured_speedup_stream"]:.2f} predicted '
          f'{r["predicted_speedup"]:.2f}; stream gain baseline '
          f'{r["stream_gain_baseline"]:.2f} speculative '
          f'{r["stream_gain_speculative"]:.2f}', flush=True)


if __name__ == '__main__':
  main()
