r"""Reproduces the paper's Table 3 (alpha per drafter) on the mini models.

  python scripts/reproduce_table3.py --models_dir ~/models [--out_dir results]

For each task (en_de ~ the paper's EnDe, synopsis ~ CNN/DM) the trained
mini-XXL target decodes `--num_examples` test inputs at temperature 0 and 1;
each drafter (unigram, bigram, mini small / base / large) then scores every
prefix of those outputs, and alpha = E[sum_x min(p(x), q(x))] is pooled over
all output tokens (EOS included), as the paper's "alpha over 10K tokens"
(`measure.alpha`). A standard error over examples is given with each value.
The last column is PREDICTED: each t=0 alpha's speed-up at T5-XXL target cost
on a measured hardware profile (`--profile`, the H100 run's by default)
through `bench.hardware.predict` (`reproduce.predict_at_xxl_cost`);
`--repredict results/table3_<setup>.json` recomputes it from a results file
(nothing is measured) and rewrites its .json and .md.
Writes results/table3_<setup>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import numpy as np
from tqdm import tqdm

from specdec_jax import data
from specdec_jax import decoding
from specdec_jax import drafters as drafters_lib
from specdec_jax import measure
from specdec_jax.bench import flags
from specdec_jax.bench import hardware
from specdec_jax.bench import report
from specdec_jax.experiments import reproduce
from specdec_jax.experiments.reproduce import PAPER_TABLE3
from specdec_jax.experiments.reproduce import load_task_models
from specdec_jax.sampling import SamplingConfig

def task_alphas(models, inputs, temperature, batch_size, seed=0):
  """{drafter: (alpha, standard error, tokens)} for one task and temperature.

  The target's outputs are decoded once per batch, so all drafters are
  scored on the same tokens.
  """
  per_example = {name: [] for name in models.drafters}
  sampling = SamplingConfig(temperature)
  for start, n, batch in tqdm(list(data.batches(inputs, batch_size)),
                              desc='alpha', unit='batch', leave=False):
    out = decoding.temperature_sample(
        models.target, models.target_params, batch,
        max_decode_len=models.lengths['targets'], sampling=sampling,
        rng=jax.random.fold_in(jax.random.key(seed), start))
    lengths = np.asarray(out.lengths).copy()
    lengths[n:] = 0  # padding rows count no positions
    offsets = np.cumsum(np.concatenate([[0], lengths[:n]]))
    for name, (drafter, params) in models.drafters.items():
      betas = measure.betas_on_outputs(
          models.target, models.target_params, drafter, params, batch,
          out.tokens, lengths, sampling=sampling)
      for i in range(n):
        per_example[name].append(betas[offsets[i]:offsets[i + 1]])
  result = {}
  for name, rows in per_example.items():
    betas = np.concatenate(rows)
    # Ratio estimator's standard error (examples are the independent units).
    sums = np.array([r.sum() for r in rows])
    counts = np.array([len(r) for r in rows], np.float64)
    a = sums.sum() / counts.sum()
    resid = sums - a * counts
    se = float(np.sqrt(np.sum(resid ** 2)) / counts.sum())
    result[name] = (float(betas.mean()), se, int(betas.size))
  return result


def greedy_quality(models, inputs, targets, batch_size):
  """BLEU / ROUGE of greedy outputs of the target and each T5 drafter."""
  vocab = models.task.output_features['targets'].vocabulary
  t5 = {'target (mini-XXL)': (models.target, models.target_params)}
  for name, (drafter, params) in models.drafters.items():
    if isinstance(drafter, drafters_lib.T5Drafter):
      t5[f'drafter {name}'] = (drafter.model, params)
  quality = {}
  for label, (model, params) in t5.items():
    texts = []
    for _, n, batch in data.batches(inputs, batch_size):
      out = decoding.temperature_sample(
          model, params, batch, max_decode_len=models.lengths['targets'])
      texts += [data.decode_text(vocab, np.asarray(out.tokens[i]),
                                 int(out.lengths[i])) for i in range(n)]
    quality[label] = data.task_metrics(models.task, targets, texts)
  return quality


def repredict(result, profile, command=None):
  """The predicted column of a results dict, from its t=0 alphas."""
  result['profile'] = None if profile is None else profile.name
  result['predicted_at_xxl_cost'] = {
      task: {name: (None if profile is None else
                    reproduce.predict_at_xxl_cost(profile, v[0], name))
             for name, v in by_temp['0'].items()}
      for task, by_temp in result['alpha'].items()}
  if command:
    result['predicted_by'] = command
  return result


def markdown(result) -> str:
  name = result.get('profile')
  profile = hardware.load(name) if name else None
  lines = [
      f"# Table 3 on the {result.get('setup', 'mini')} models: alpha per "
      'drafter', '',
      f"Command: `{result['command']}`  ", f"Machine: {result['machine']}  ",
      f"Date: {result['date']}", '']
  if result.get('predicted_by'):
    lines += ['Predicted column recomputed from the measured alphas by '
              f"`{result['predicted_by']}`.", '']
  lines += [
      'alpha = E[sum_x min(p(x), q(x))] over every output token (EOS '
      f"included) of the target ({result['models']}) decoding the first "
      f"{result['num_examples']} test inputs (greedy for t=0, sampled for "
      't=1); the drafter scores the same prefixes. +- one standard error '
      '(examples as units). Paper: T5-XXL target (EnDe ~ en_de, CNNDM ~ '
      'synopsis).']
  if profile is not None:
    lines += ['', 'The last column is the speed-up at t=0 with the row\'s '
              't=0 alpha. ' + reproduce.xxl_cost_note(profile)]
  head = '| task | drafter | ours t=0 | ours t=1 | paper t=0 | paper t=1 |'
  if profile is not None:
    head += f' predicted {profile.name} speed-up, t=0 (gamma) |'
  lines += ['', head, '|---|---|---|---|---|---|' + (
      '---|' if profile is not None else '')]
  predicted = result.get('predicted_at_xxl_cost') or {}
  for task, by_temp in result['alpha'].items():
    paper = PAPER_TABLE3[result['paper_task'][task]]
    for name in by_temp['0']:
      cells = []
      for t in ('0', '1'):
        a, se, n = by_temp[t][name]
        cells.append(f'{a:.3f} +- {se:.3f} ({n} tok)')
      ref = ([f'{v:.2f}' for v in paper[name]] if name in paper else
             ['-', '-'])
      line = (f'| {task} | {name} | {cells[0]} | {cells[1]} | '
              f'{ref[0]} | {ref[1]} |')
      if profile is not None:
        line += (' ' + reproduce.xxl_cost_cell(
            predicted.get(task, {}).get(name)) + ' |')
      lines.append(line)
  if result.get('quality'):
    lines += ['', '## Greedy output quality on the same inputs', '',
              'The target should be the best model; the drafters trade '
              'quality for speed (speculative outputs equal the target\'s, '
              'whatever the drafter).', '',
              '| task | model | metrics |', '|---|---|---|']
    for task, by_model in result['quality'].items():
      for label, metrics in by_model.items():
        ms = ', '.join(f'{k} {v:.2f}' for k, v in sorted(metrics.items()))
        lines.append(f'| {task} | {label} | {ms} |')
  return '\n'.join(lines) + '\n'


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  reproduce.add_setup_flags(parser)
  parser.add_argument('--out_dir', default='results')
  parser.add_argument('--drafters', default=None,
                      help='default: every drafter of the setup')
  parser.add_argument('--num_examples', type=int, default=256)
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--split', default='test')
  flags.add_prediction_flags(parser, optional=True)
  args = parser.parse_args(argv)
  profile = flags.profile_of(args, optional=True)
  if args.repredict:
    path = pathlib.Path(args.repredict)
    result = repredict(report.read_json(path), profile, report.portable(
        ' '.join(['python scripts/reproduce_table3.py'] + list(
            sys.argv[1:] if argv is None else argv))))
    report.write_json(path, result)
    report.write_md(path.with_suffix('.md'), markdown(result))
    print(markdown(result))
    return
  setup = reproduce.setup_from_flags(args)
  model_free = reproduce.model_free_drafters()  # n-grams first, as the paper
  names = (args.drafters.split(',') if args.drafters else
           [n for n in setup.drafters if n in model_free] +
           [n for n in setup.drafters if n not in model_free])
  for name in names:
    if name not in setup.drafters:
      raise SystemExit(f'unknown drafter {name!r}; expected '
                       f'{setup.drafters}')
  result = dict(
      **report.header('scripts/reproduce_table3.py', argv),
      num_examples=args.num_examples, split=args.split,
      setup=reproduce.results_name(setup),
      models=setup.describe, paper_task={t: v['paper']
                                         for t, v in setup.tasks.items()},
      alpha={})
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  for task in args.tasks.split(','):
    models = load_task_models(setup, task, names)
    inputs, targets = data.task_inputs(models.task, models.lengths,
                                  args.num_examples, args.split,
                                  with_targets=True)
    result.setdefault('quality', {})[task] = greedy_quality(
        models, inputs, targets, args.batch_size)
    print(json.dumps(result['quality'][task]), flush=True)
    result['alpha'][task] = {
        f'{t:g}': task_alphas(models, inputs, t, args.batch_size)
        for t in (0.0, 1.0)}
    print(json.dumps(result['alpha'][task]), flush=True)
    name = reproduce.results_name(setup)
    repredict(result, profile)
    report.write_json(out / f'table3_{name}.json', result)
    report.write_md(out / f'table3_{name}.md', markdown(result))
  print(markdown(result))


if __name__ == '__main__':
  main()
