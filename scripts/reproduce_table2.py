r"""Reproduces the paper's Table 2 (gamma / alpha / speed-up) on the mini models.

  python scripts/reproduce_table2.py --models_dir ~/models [--out_dir results]
  python scripts/reproduce_table2.py --setup paper --costs native \
    --checkpoints ende_xxl=gs://...,ende_small=gs://...,...   # TPU/GPU

For each task (en_de ~ the paper's EnDe, synopsis ~ CNN/DM), each target cost
(`--costs`: 'native' = the target as it is; 't5_1_1_base_cost' /
't5_1_1_large_cost' = the same target widened function-preservingly to the
shapes of T5 1.1 base / large, see widening.py), each drafter (mini
small/base/large T5s and unigram/bigram statistics) and temperature (0, 1):

1. alpha is measured on `--calib_examples` validation inputs
   (`measure.alpha`: the target decodes, both models score its outputs;
   widening does not change it, so it is measured once per task);
2. c = t_draft / t_target(1) and cost(k) = t_target(k) / t_target(1) for
   k = 1..max_gamma+1 are measured on this machine (`measure`, compiled
   loops, medians) for the target at that cost;
3. gamma = argmax of the paper's walltime improvement (Theorem 3.8 with the
   measured cost(gamma + 1) in place of 1; `bench.hardware.predict` on a
   profile of these costs);
4. the eval job (`python -m specdec_jax.eval --gin_file=mini/<task>.gin`, run
   in this process) decodes `--num_examples` test examples with the baseline
   and speculatively at that gamma, side by side, and gives the measured
   speed-up, the run's own alpha and BLEU/ROUGE;
5. predicted speed-up = Theorem 3.8 with the run's alpha, gamma, c and
   cost(gamma + 1) (`bench.hardware.predict` on the same profile).
Then a gamma sweep (1..max_gamma) per task at `--sweep_cost` with
`--sweep_drafter` at `--sweep_temperature` (0): measured vs predicted, one
plot. With `--setup paper` the same runs use real T5X checkpoints through
gin_configs/paper/ (tasks ende, cnndm; cost 'native').

Every predicted figure goes through `bench.hardware.predict`: "predicted"
on a profile of this run's measured costs (one per task and cost), and
"predicted <profile>" at T5-XXL target cost on a measured hardware profile
(`--profile`, the H100 run's by default; `reproduce.predict_at_xxl_cost`).
`--repredict results/table2_<setup>.json` recomputes every predicted column
of a results file from its measured values (nothing is re-measured) and
rewrites its .json and .md.

Writes results/table2_<setup>.{md,json} and
results/table2_<setup>_gamma_sweep.png; each eval run's files go under
--work_dir. The mini models come from
`scripts/train.py` with gin_configs/train/<task>_mini_<size>.gin (README).
The same loop runs on real T5X checkpoints through the paper/ gin files.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import sys

import jax
import numpy as np

from specdec_jax import data
from specdec_jax import eval as eval_lib
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import widening
from specdec_jax.bench import flags
from specdec_jax.bench import hardware
from specdec_jax.bench import report
from specdec_jax.experiments import reproduce
from specdec_jax.experiments.reproduce import PAPER_TABLE2
from specdec_jax.experiments.reproduce import PAPER_TABLE3
from specdec_jax.experiments.reproduce import eval_flags
from specdec_jax.experiments.reproduce import load_task_models
from specdec_jax.experiments.reproduce import shell_command
from specdec_jax.sampling import SamplingConfig

def run_eval(task, drafter, args, *, gamma, temperature, cost, num_examples,
             tag):
  out_dir = os.path.join(args.work_dir, task, cost, tag)
  bindings = dict(GAMMA=gamma, TEMPERATURE=float(temperature),
                  NUM_EXAMPLES=num_examples, EVAL_OUTPUT_DIR=out_dir)
  bindings['evaluate.timing_repeats'] = args.timing_repeats
  if args.batch_size != 1:  # the paper's batch 1 decodes fixed either way
    bindings.update(BATCH_SIZE=args.batch_size, BATCHING=args.batching)
  if cost != 'native':
    bindings['EvalSetup.target_widen_to'] = cost
  flags = eval_flags(args.setup_obj, task, drafter, **bindings)
  return eval_lib.main(flags), shell_command(flags)


def measure_costs(target, target_params, drafters, inputs, args, context):
  ks = range(1, args.max_gamma + 2)
  t = measure.cost_curve(target, target_params, inputs, ks,
                         repeats=args.repeats, context=context)
  t_draft = {
      name: measure.drafter_token_time(d, p, inputs, repeats=args.repeats,
                                       context=context)
      for name, (d, p) in drafters.items()}
  # Once per decode: encoder + cache set-up (target) and drafter.init.
  init = jax.jit(target.init_cache, static_argnums=2)
  max_len = args.max_gamma + 2 * context + 8
  t_init = measure.median_time(
      lambda: init(target_params, inputs, max_len), args.repeats)
  t_init_draft = {}
  for name, (d, p) in drafters.items():
    d_init = jax.jit(d.init, static_argnums=2)
    t_init_draft[name] = measure.median_time(
        lambda f=d_init, p=p: f(p, inputs, max_len), args.repeats)
  return {
      't_init_ms': t_init * 1e3,
      't_init_draft_ms': {k: v * 1e3 for k, v in t_init_draft.items()},
      't_target_ms': {k: v * 1e3 for k, v in t.items()},
      't_draft_ms': {k: v * 1e3 for k, v in t_draft.items()},
      'cost': {k - 1: t[k] / t[1] for k in t if k > 1},  # keyed by gamma
      'c': {k: v / t[1] for k, v in t_draft.items()},
  }


def _at(mapping, k):
  """mapping[k] whether keys are ints or (after JSON) strings."""
  return mapping[k] if k in mapping else mapping[str(k)]


fmt = report.fmt


def costs_profile(result, costs):
  """The profile of one of the run's cost measurements (t(k), c)."""
  return reproduce.run_profile(
      costs, name=f"{result.get('stem', 'table2')} costs: {costs['task']}, "
      f"{costs['target_cost']}", device=result['machine'],
      source=f"results/{result.get('stem', 'table2')}.json",
      command=result['command'], date=result['date'])


def _costs_of(result, row):
  """The costs entry a row (or sweep row) was predicted from."""
  found = [c for c in result['costs'] if (c['task'], c['target_cost']) == (
      row['task'], row['cost']) and ('c' not in row or abs(
          c['c'][row['drafter']] - row['c']) <= 1e-12 * max(row['c'], 1))]
  if not found:
    raise ValueError(f"no measured costs for {row['task']} {row['cost']} "
                     f"{row['drafter']}")
  return found[-1]


def _clamp(alpha):
  return min(max(float(alpha), 0.0), 1.0)


def predict_row(row, costs, run_profile, profile):
  """A row's predicted figures from its measured ones (`hardware.predict`).

  predicted: Theorem 3.8 with the run's alpha, gamma and the run profile's
  measured c and cost(gamma + 1); incl. encoder: the same per token plus
  the measured once-per-example encoder / cache set-up of both decoders at
  the run's mean output length (when the row has it); at XXL cost: on
  `profile` (`reproduce.predict_at_xxl_cost`).
  """
  alpha = _clamp(row['alpha'])
  p = hardware.predict(run_profile, alpha=alpha, gamma=row['gamma'],
                       drafter=row['drafter'],
                       batch=run_profile.batches()[0])
  old = row.get('predicted_speedup')
  row.update(predicted_speedup=p.speedup, predicted_label=p.label,
             cost_gamma_plus_1=p.cost,
             ratio=row['measured_speedup'] / p.speedup)
  n_tok = row.get('tokens_per_example')
  if n_tok is not None:
    # per token = t(1) / predicted speed-up; set-up paid once per example.
    t1, t_init = run_profile.t1_ms, costs['t_init_ms']
    row['predicted_with_encoder'] = (t_init + n_tok * t1) / (
        t_init + costs['t_init_draft_ms'][row['drafter']] +
        n_tok * t1 / p.speedup)
  elif old is None or abs(old - p.speedup) > 1e-9 * abs(p.speedup):
    row['predicted_with_encoder'] = None  # not derivable without n tokens
  row.pop('predicted_h100', None)
  row['predicted_at_xxl_cost'] = (
      reproduce.predict_at_xxl_cost(profile, alpha, row['drafter'])
      if profile is not None else None)
  return row


def repredict(result, profile, command=None):
  """Every predicted figure of a results dict from its measured values."""
  for row in result['rows']:
    costs = _costs_of(result, row)
    predict_row(row, costs, costs_profile(result, costs), profile)
  for row in result.get('gamma_sweep', []):
    costs = _costs_of(result, row)  # (task, cost): the sweep's costs
    run_profile = costs_profile(result, costs)
    p = hardware.predict(run_profile,
                         alpha=_clamp(row['alpha']), gamma=row['gamma'],
                         drafter=row['drafter'],
                         batch=run_profile.batches()[0])
    row['predicted_speedup'] = p.speedup
  result['profile'] = None if profile is None else profile.name
  if command:
    result['predicted_by'] = command
  return result


def markdown(result) -> str:
  name = result.get('profile')
  profile = hardware.load(name) if name else None
  lines = [
      f"# Table 2 on the {result.get('stem', 'table2_mini')[7:]} models "
      '(speculative vs baseline, this CPU)', '',
      f"Command: `{result['command']}`  ", f"Machine: {result['machine']}  ",
      f"Date: {result['date']}", '']
  if result.get('predicted_by'):
    lines += [f"Predicted columns recomputed from the measured values by "
              f"`{result['predicted_by']}`.", '']
  lines += [
      f"Models: {result['models']}; unigram / bigram drafters from the "
      'train targets. "cost" = the target as it is ("native") or widened '
      'function-preservingly to the shapes of T5 1.1 base / large (identical '
      'outputs and alpha, the cost of the bigger model). '
      'Batch 1, float32. gamma chosen by the paper\'s rule from alpha and c '
      'measured beforehand (validation inputs) and the measured cost(gamma+1) '
      '= t_target(gamma+1)/t_target(1); measured on the first n test '
      'examples; measured = speculative '
      'tokens/s over baseline tokens/s (for greedy, where both outputs are '
      'identical, the walltime ratio). Predicted = predicted on profile '
      '"<this file> costs: <task>, <cost>" (this run\'s measured costs '
      'below) through bench.hardware.predict: Theorem 3.8 with the run\'s '
      'alpha, c and cost(gamma+1); "incl. encoder" adds the '
      'measured once-per-example encoder/cache set-up of both decoders '
      '(and the drafter\'s) at the run\'s mean output length. Paper: T5-XXL '
      'target, TPU (EnDe ~ en_de, CNNDM ~ synopsis).']
  if profile is not None:
    lines += ['', reproduce.xxl_cost_note(profile)]
  head = ('| task | cost | temp | drafter | n | gamma | alpha (calib) | '
          'alpha (run) | c | cost(gamma+1) | predicted | predicted incl. '
          'encoder | measured | measured / predicted | identical | baseline '
          'metric | speculative metric | paper gamma / alpha / speed-up |')
  ncol = 18
  if profile is not None:
    head += f' predicted {profile.name} (gamma) |'
    ncol += 1
  lines += ['', head, '|' + '---|' * ncol]
  for r in result['rows']:
    paper = r.get('paper')
    paper_s = ('-' if paper is None else
               ' / '.join('-' if v is None else f'{v}' for v in paper))
    line = (
        f"| {r['task']} | {r['cost']} | {r['temperature']:g} | {r['drafter']} "
        f"| {r['examples']} | {r['gamma']} | {fmt(r['alpha_calibration'])} | "
        f"{fmt(r['alpha'])} | {fmt(r['c'], '.3f')} | "
        f"{fmt(r['cost_gamma_plus_1'])} | {fmt(r['predicted_speedup'])} | "
        f"{fmt(r['predicted_with_encoder'])} | "
        f"**{fmt(r['measured_speedup'])}** | {fmt(r['ratio'])} | "
        f"{r['identical']} | {r['baseline_metric']} | "
        f"{r['speculative_metric']} | {paper_s} |")
    if profile is not None:
      line += f" {reproduce.xxl_cost_cell(r.get('predicted_at_xxl_cost'))} |"
    lines.append(line)
  lines += ['', '## Measured costs', '',
            '| task | cost | target params | set-up ms | t_target(1) ms | '
            'cost(k) for k = 2, 3, ... | c per drafter |',
            '|---|---|---|---|---|---|---|']
  for c in result['costs']:
    curve = ' '.join(f'{v:.2f}' for v in c['cost'].values())
    cs = ', '.join(f'{k} {v:.3f}' for k, v in c['c'].items())
    lines.append(f"| {c['task']} | {c['target_cost']} | "
                 f"{c['target_params'] / 1e6:.1f}M | {c['t_init_ms']:.1f} | "
                 f"{_at(c['t_target_ms'], 1):.2f} | {curve} | {cs} |")
  if result.get('gamma_sweep'):
    lines += ['', '## Gamma sweep', '',
              f"![gamma sweep]({result.get('stem', 'table2')}_gamma_sweep.png)",
              '', 'Predicted: on the profile of the run\'s costs at that '
              'task and cost, through bench.hardware.predict.', '',
              '| task | cost | drafter | temp | gamma | alpha | predicted '
              '| measured |', '|---|---|---|---|---|---|---|---|']
    for r in result['gamma_sweep']:
      lines.append(
          f"| {r['task']} | {r['cost']} | {r['drafter']} | "
          f"{r['temperature']:g} | {r['gamma']} | {fmt(r['alpha'])} | "
          f"{fmt(r['predicted_speedup'])} | {fmt(r['measured_speedup'])} |")
  return '\n'.join(lines) + '\n'


def plot_sweep(sweep, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  groups = sorted({(r['task'], r['cost'], r['drafter']) for r in sweep})
  fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8),
                           squeeze=False)
  for ax, key in zip(axes[0], groups):
    rows = sorted((r for r in sweep if (r['task'], r['cost'], r['drafter'])
                   == key), key=lambda r: r['gamma'])
    g = [r['gamma'] for r in rows]
    ax.plot(g, [r['measured_speedup'] for r in rows], 'o-', label='measured')
    ax.plot(g, [r['predicted_speedup'] for r in rows], 's--',
            label='predicted (Thm 3.8, measured alpha, c, cost)')
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set_xlabel('gamma')
    ax.set_ylabel('speed-up over baseline')
    ax.set_title(f'{key[0]}, target {key[1]}, drafter {key[2]}, '
                 f"t={rows[0]['temperature']:g}", fontsize=9)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  reproduce.add_setup_flags(parser)
  parser.add_argument('--out_dir', default='results')
  parser.add_argument('--work_dir', default='/tmp/specdec_table2')
  parser.add_argument('--costs', default='native,t5_1_1_base_cost',
                      help="'native' (the target as it is) and/or widening "
                      'presets')
  parser.add_argument('--drafters', default=None,
                      help='default: every drafter of the setup')
  parser.add_argument('--temperatures', default='0,1')
  parser.add_argument('--num_examples', type=int, default=16)
  parser.add_argument('--calib_examples', type=int, default=32)
  parser.add_argument('--calib_split', default='validation',
                      help="split of the calibration inputs; 'test' (with "
                      '--setup shipped and no --data_dir: the shipped data '
                      'hold only test slices) takes the test rows after '
                      'the --num_examples that are evaluated, so the two '
                      'never overlap')
  parser.add_argument('--max_gamma', type=int, default=10)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--timing_repeats', type=int, default=1)
  parser.add_argument('--batch_size', type=int, default=1,
                      help='examples decoded at once (the paper: 1)')
  parser.add_argument('--batching', default='stream',
                      choices=['stream', 'fixed'],
                      help='at --batch_size > 1: continuous batching '
                      '(streaming.py) or fixed batches (EvalSetup.batching)')
  parser.add_argument('--sweep_cost', default='t5_1_1_base_cost')
  parser.add_argument('--sweep_temperature', type=float, default=0.0)
  parser.add_argument('--sweep_drafter', default='small')
  parser.add_argument('--sweep_examples', type=int, default=8)
  parser.add_argument('--no_sweep', action='store_true')
  parser.add_argument('--append', action='store_true',
                      help='keep the rows already in out_dir/table2_mini.json')
  parser.add_argument('--extra_rows', default='',
                      help='more rows: task:cost:drafter:temp, comma-separated'
                      " (e.g. 'en_de:t5_1_1_large_cost:small:0')")
  flags.add_prediction_flags(parser, optional=True)
  args = parser.parse_args(argv)
  profile = flags.profile_of(args, optional=True)
  if args.repredict:
    path = pathlib.Path(args.repredict)
    result = repredict(report.read_json(path), profile, report.portable(
        ' '.join(['python scripts/reproduce_table2.py'] + list(
            sys.argv[1:] if argv is None else argv))))
    report.write_json(path, result)
    report.write_md(path.with_suffix('.md'), markdown(result))
    print(markdown(result))
    return
  setup = args.setup_obj = reproduce.setup_from_flags(args)
  temps = [float(t) for t in args.temperatures.split(',')]
  drafter_names = (args.drafters.split(',') if args.drafters else
                   list(setup.drafters))
  plan = [(t, c, d, temp) for t in args.tasks.split(',')
          for c in args.costs.split(',') for d in drafter_names
          for temp in temps]
  for extra in filter(None, args.extra_rows.split(',')):
    t, c, d, temp = extra.split(':')
    plan.append((t, c, d, float(temp)))
  for t, c, d, _ in plan:
    if t not in setup.tasks or d not in setup.drafters or (
        c != 'native' and c not in widening.PRESETS):
      raise SystemExit(f'unknown task / cost / drafter: {t} {c} {d}')

  result = dict(
      **report.header('scripts/reproduce_table2.py', argv),
      num_examples=args.num_examples, max_gamma=args.max_gamma,
      calib_examples=args.calib_examples, models=setup.describe, rows=[],
      costs=[], gamma_sweep=[],
      stem=f'table2_{reproduce.results_name(setup)}',
      profile=None if profile is None else profile.name)
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  stem = f'table2_{reproduce.results_name(setup)}'
  if args.append and (out / f'{stem}.json').exists():
    # Another run's rows (e.g. one task per run) stay, this run's follow.
    previous = report.read_json(out / f'{stem}.json')
    result['command'] = previous['command'] + '` and `' + result['command']
    for key in ('rows', 'costs', 'gamma_sweep'):
      result[key] = previous[key] + result[key]

  def save():
    report.write_json(out / f'{stem}.json', result)
    report.write_md(out / f'{stem}.md', markdown(result))

  for task in dict.fromkeys(t for t, *_ in plan):
    task_plan = [p for p in plan if p[0] == task]
    names = sorted({d for _, _, d, _ in task_plan} |
                   ({args.sweep_drafter} if not args.no_sweep else set()))
    models = load_task_models(setup, task, names)
    target_config, lengths = models.target_config, models.lengths
    target, target_params = models.target, models.target_params
    drafters = models.drafters
    skip = args.num_examples if args.calib_split == 'test' else 0
    calib = data.task_inputs(models.task, lengths,
                             skip + args.calib_examples,
                             args.calib_split)[skip:]
    alphas = {}
    for name in names:
      for temp in temps:
        a = measure.alpha(target, target_params, *drafters[name], calib,
                          sampling=SamplingConfig(temp),
                          max_decode_len=lengths['targets'],
                          rng=jax.random.key(7))
        alphas[name, temp] = a['alpha']
        print(f'{task} {name} t={temp:g}: alpha = {a["alpha"]:.3f} over '
              f'{a["positions"]} positions', flush=True)
    context = lengths['targets'] // 2
    for cost in dict.fromkeys([c for _, c, _, _ in task_plan] +
                              ([] if args.no_sweep else [args.sweep_cost])):
      if cost == 'native':
        tm, tp = target, target_params
      else:
        tp, cfg = widening.widen_to(target_params, target_config, cost)
        tm = network.T5Model(cfg)
      # At the eval's batch: gamma is chosen from cost(k) there.
      rows_b = np.resize(np.asarray(calib), (args.batch_size,) +
                         np.shape(calib)[1:])
      costs = measure_costs(tm, tp, drafters, rows_b, args, context)
      costs.update(task=task, target_cost=cost,
                   target_params=widening.param_count(tp))
      if args.batch_size != 1:
        costs['batch'] = args.batch_size
      result['costs'].append(costs)
      run_profile = costs_profile(result, costs)
      print(json.dumps(costs), flush=True)
      del tp, tm
      gc.collect()
      rows = [(d, temp) for t, c, d, temp in task_plan if c == cost]
      for drafter, temp in rows:
        alpha_cal = alphas[drafter, temp]
        c = costs['c'][drafter]
        # The gamma of the costs at the run's batch (its cost(k) there).
        gamma = hardware.predict(run_profile, alpha=_clamp(alpha_cal),
                                 drafter=drafter, max_gamma=args.max_gamma,
                                 batch=run_profile.batches()[0]).gamma
        summary, command = run_eval(
            task, drafter, args, gamma=gamma, temperature=temp, cost=cost,
            num_examples=args.num_examples, tag=f'{drafter}_t{temp:g}')
        metric = sorted(summary['baseline_metrics'])[0] if summary[
            'baseline_metrics'] else None
        paper_task = setup.tasks[task]['paper']
        paper = PAPER_TABLE2[paper_task, int(temp)].get(drafter)
        if paper is None and drafter in PAPER_TABLE3[paper_task]:
          # n-grams: Table 3's alpha only
          paper = (None, PAPER_TABLE3[paper_task][drafter][int(temp)], None)
        row = dict(
            task=task, cost=cost, drafter=drafter, temperature=temp,
            gamma=gamma, alpha_calibration=alpha_cal, alpha=summary['alpha'],
            c=c, measured_speedup=summary['throughput_speedup'],
            tokens_per_example=summary['baseline_tokens'] / summary[
                'examples'],
            identical=(f"{summary['examples'] - summary['differing_examples']}"
                       f"/{summary['examples']}" if temp == 0 else 'n/a'),
            baseline_metric=(f"{metric} {summary['baseline_metrics'][metric]:.1f}"
                             if metric else '-'),
            speculative_metric=(
                f"{metric} {summary['speculative_metrics'][metric]:.1f}"
                if metric else '-'),
            mean_accepted_length=summary['mean_accepted_length'],
            baseline_s=summary['baseline_s'],
            speculative_s=summary['speculative_s'],
            examples=summary['examples'], paper=paper, command=command)
        result['rows'].append(predict_row(row, costs, run_profile, profile))
        print(json.dumps(result['rows'][-1]), flush=True)
        save()
      if not args.no_sweep and cost == args.sweep_cost:
        for gamma in range(1, args.max_gamma + 1):
          summary, command = run_eval(
              task, args.sweep_drafter, args, gamma=gamma,
              temperature=args.sweep_temperature,
              cost=cost, num_examples=args.sweep_examples,
              tag=f'sweep_{args.sweep_drafter}_t{args.sweep_temperature:g}'
              f'_g{gamma}')
          result['gamma_sweep'].append(dict(
              task=task, cost=cost, drafter=args.sweep_drafter,
              temperature=args.sweep_temperature, gamma=gamma,
              alpha=summary['alpha'],
              predicted_speedup=hardware.predict(
                  run_profile, alpha=_clamp(summary['alpha']), gamma=gamma,
                  drafter=args.sweep_drafter,
                  batch=run_profile.batches()[0]).speedup,
              measured_speedup=summary['throughput_speedup'],
              command=command))
          print(json.dumps(result['gamma_sweep'][-1]), flush=True)
          save()
  save()
  if result['gamma_sweep']:
    plot_sweep(result['gamma_sweep'], out / f'{stem}_gamma_sweep.png')
  print(markdown(result))


if __name__ == '__main__':
  main()
