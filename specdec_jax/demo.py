"""The main job: exact speculative decoding of real text with the shipped models.

  python -m specdec_jax.demo [--tasks en_de,synopsis] [--num_examples 16]
                             [--output_dir /tmp/specdec_jax_main] [--resume]
                             [--random]

Runs the gin eval job (gin_configs/shipped/<task>.gin: the multi-task mini
target and its distilled drafter shipped in specdec_jax/assets/mini, on the
shipped Debian test slices; no network, no data build) for each task: the
same inputs are decoded by the jitted baseline and by speculative decoding,
timed side by side. Prints a few source / reference / output lines, BLEU or
ROUGE, alpha, the mean accepted length, target calls per token, whether the
greedy outputs are identical and three speed lines: measured here, PREDICTED
on the measured H100 profile from this run's counters
(`hardware.predict`), and what our H100 run measured for the same
drafter. Each run decodes into a fresh OUTPUT_DIR/run_<time>/<task> and
leaves the eval job's files there (examples.jsonl, summary.json, summary.md,
config.gin); `--resume` continues the latest run. `--random` runs the old installation check instead: a
random tiny T5 and a noisy copy of it as the drafter.
"""

import argparse
import json
import os
import shlex
import time

import jax
import numpy as np

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import eval as eval_lib
from specdec_jax import gin_utils
from specdec_jax import network
from specdec_jax import spec_stats
from specdec_jax import speculative
from specdec_jax import task_table
from specdec_jax.sampling import SamplingConfig
from specdec_jax import hardware

PROG = 'python -m specdec_jax.demo'
DEMO_CONFIG = network.T5Config(
    vocab_size=512, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=128,
    num_encoder_layers=2, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
)

# short task name -> its gin file on the shipped models (the task table's)
TASK_GIN = {name: entry.gin_file('shipped')
            for name, entry in task_table.TASKS.items()}


def run_dir(output_dir: str, resume: bool) -> str:
  """A fresh `<output_dir>/run_<time>` folder, or with `resume` the latest.

  Each run decodes into its own folder, so a second run decodes again
  instead of finding the first run's records; `--resume` continues the
  latest run (the eval job then says how many records it reused).
  """
  runs = sorted(d for d in os.listdir(output_dir) if d.startswith('run_')
                ) if os.path.isdir(output_dir) else []
  if resume and runs:
    return os.path.join(output_dir, runs[-1])
  stamp = time.strftime('run_%Y%m%d_%H%M%S')
  path, n = os.path.join(output_dir, stamp), 1
  while os.path.exists(path):
    path, n = os.path.join(output_dir, f'{stamp}_{n}'), n + 1
  return path


def main_job(tasks=task_table.names(), num_examples=16,
             output_dir='/tmp/specdec_jax_main', show=3, extra_gin=(),
             resume=False):
  """Runs the shipped-model eval job per task and prints what it found.

  Returns:
    {task: the eval job's summary dict}.
  """
  for task in tasks:  # before a run folder is made
    if task not in TASK_GIN:
      raise SystemExit(f'error: unknown task {task!r}; known: '
                       + ', '.join(TASK_GIN))
  with checks.one_line(checks.InputError):  # before gin adds its line
    checks.check_local_folder('--output_dir', output_dir)
  summaries = {}
  output_dir = run_dir(output_dir, resume)
  print(('resuming the latest run in ' if resume and os.path.isdir(output_dir)
         else 'decoding into a fresh folder ') + output_dir +
        ('' if resume else ' (--resume continues the latest run instead)'),
        flush=True)
  for task in tasks:
    out_dir = os.path.join(output_dir, task)
    argv = [f'--gin_file={TASK_GIN[task]}',
            f'--gin.NUM_EXAMPLES={num_examples}',
            f'--gin.EVAL_OUTPUT_DIR=\'{out_dir}\''] + list(extra_gin)
    print(f'\n=== {task}: python -m specdec_jax.eval '
          + ' '.join(map(shlex.quote, argv)), flush=True)
    summary = eval_lib.cli(argv)
    with open(os.path.join(out_dir, 'examples.jsonl')) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    for row in rows[:show]:
      print(f"  source:      {row['input'][:160]}")
      print(f"  reference:   {row['target'][:160]}")
      print(f"  speculative: {row['speculative'][:160]}"
            + ('  (identical to baseline)' if row['identical'] else
               '  (DIFFERS from baseline)'))
    metrics = ', '.join(f'{k} {v:.1f}' for k, v in
                        summary['speculative_metrics'].items())
    print(f"  quality: {metrics} (baseline: " + ', '.join(
        f'{k} {v:.1f}' for k, v in summary['baseline_metrics'].items()) + ')')
    alpha, calls = summary['alpha'], summary['target_calls_per_token']
    # Tokens output per call; the mean accepted length also counts drafts
    # accepted past a row's end (spec_stats.rates).
    print(f"  alpha {'-' if alpha is None else f'{alpha:.3f}'}, "
          f"{f'{1 / calls:.2f}' if calls else '-'} tokens per target call "
          f"(gamma {summary['gamma_label']}; mean accepted length "
          f"{summary['mean_accepted_length']:.2f}), target calls per token "
          f"{calls:.3f}")
    for line in speed_lines(task, summary):
      print('  ' + line)
    print(f"  greedy outputs identical: {summary['examples'] - summary['differing_examples']} of "
          f"{summary['examples']} (near-ties {summary.get('near_ties')}, "
          f"mismatches {summary.get('mismatches')})")
    summaries[task] = summary
  return summaries


def _drafter_name(summary) -> str:
  """The profile's name of the job's drafter: a shipped model or a kind."""
  checkpoint = summary.get('draft_checkpoint') or ''
  if summary['drafter'] == 't5' and checkpoint.startswith('shipped:'):
    return checkpoint[len('shipped:'):]
  return summary['drafter']


def speed_lines(task: str, summary, profile_name: str = hardware.H100):
  """Three speed lines: measured here, predicted on the measured profile
  from this run's counters, and what the profile's own run measured.

  The prediction is `hardware.predict` on tokens per target call
  (1 / target calls per token) with the drafter's measured c: what the same
  acceptance gives with a T5 1.1-XXL-cost target on that device.
  """
  lines = [f"measured here ({jax.default_backend()}, these models): "
           f"{summary['walltime_speedup']:.2f}x (baseline "
           f"{summary['baseline_s']:.2f} s, speculative "
           f"{summary['speculative_s']:.2f} s)"]
  profile = hardware.load(profile_name)
  name, gamma = _drafter_name(summary), summary['gamma']
  if not gamma:  # gamma 0 or several: no one speculative decode to price
    return lines + [f"predicted on {profile.name}: none (gamma "
                    f"{summary['gamma_label']})"]
  try:
    p = hardware.predict(
        profile, tokens_per_call=1.0 / summary['target_calls_per_token'],
        gamma=gamma, drafter=name, batch=summary['batch_size'])
    lines.append(f'predicted on {profile.name} at T5 1.1-XXL target cost: '
                 f'{p.speedup:.2f}x ({p.label}: this run\'s tokens per target '
                 f'call / (cost({p.width}) + {gamma} x c {p.c:.3f}); '
                 'hardware.predict)')
  except KeyError as e:
    lines.append(f'predicted on {profile.name}: none ({e.args[0]})')
  run = hardware.measured_run(profile)
  rows = [r for r in (run or {}).get('table2', [])
          if r['task'] == task and r['drafter'] == name and
          r['temperature'] == summary['temperature'] and r['batch'] == 1]
  if rows:
    r = rows[0]
    lines.append(f"measured on {profile.device}: {r['measured']:.2f}x "
                 f"({name}, gamma {r['gamma']}, alpha {r['alpha']:.2f}, "
                 f"{r['rows']} examples; {profile.source})")
  else:
    lines.append(f'measured on {profile.device}: no {name} row at '
                 f"t = {summary['temperature']:g} in "
                 f"{profile.source if run else 'this installation'}")
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog=PROG, description=__doc__.splitlines()[0], epilog=(
          "Gin bindings and files go to each task's eval job (e.g. "
          '--gin.GAMMA=7 --gin.TEMPERATURE=0.7; python -m specdec_jax.eval '
          '--help), and with --random the other flags to that check '
          '(--batch, --max_decode_len, --gamma, --draft_noise, --temperature, '
          '--seed).'))
  parser.add_argument('--tasks', default=','.join(task_table.names()),
                      help='comma-separated shipped tasks (default: all)')
  parser.add_argument('--num_examples', type=checks.count, default=16,
                      help='examples of each task decoded')
  parser.add_argument('--output_dir', type=checks.local_path,
                      default='/tmp/specdec_jax_main',
                      help='each run decodes into a fresh run_<time> folder '
                      'here')
  parser.add_argument('--resume', action='store_true',
                      help='continue the latest run folder instead')
  parser.add_argument('--random', action='store_true',
                      help='the random-weights installation check instead')
  args, rest = parser.parse_known_args(argv)
  if args.random:
    given = [f'--{f}' for f in ('tasks', 'num_examples', 'output_dir',
                                'resume')
             if getattr(args, f) != parser.get_default(f)]
    if given:
      parser.error(f'{", ".join(given)}: flags of the main job, not of '
                   '--random')
    return random_demo(rest)
  # The rest go to each task's eval job: gin's flags (an unknown one is
  # this parser's error), but no binding of the folder or the examples,
  # which this job's own flags set and read.
  passed = gin_utils.parse_flags(rest, PROG)
  for binding in passed.gin_bindings:
    if binding.split('=', 1)[0].strip() in (
        'EVAL_OUTPUT_DIR', 'NUM_EXAMPLES', 'evaluate.output_dir',
        'DataSpec.num_examples'):
      parser.error(f'{binding!r}: the main job sets the folder and the '
                   'examples itself (--output_dir, --num_examples)')
  return main_job(args.tasks.split(','), args.num_examples, args.output_dir,
                  extra_gin=rest, resume=args.resume)


def random_demo(argv=None):
  """A random tiny T5 and a noisy copy as drafter: tokens, stats, timings."""
  parser = argparse.ArgumentParser(description=random_demo.__doc__)
  parser.add_argument('--batch', type=checks.count, default=3)
  parser.add_argument('--max_decode_len', type=checks.count, default=16)
  parser.add_argument('--gamma', type=checks.count, default=4)
  parser.add_argument('--draft_noise', type=checks.non_negative, default=0.1)
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--seed', type=checks.natural, default=0)
  args = parser.parse_args(argv)
  with checks.one_line(checks.InputError):  # a negative temperature
    sampling = SamplingConfig(temperature=args.temperature)

  model = network.T5Model(DEMO_CONFIG)
  params = model.init_params(jax.random.key(args.seed))
  rng = np.random.default_rng(args.seed)
  inputs = rng.integers(2, DEMO_CONFIG.vocab_size, (args.batch, 12))
  for b in range(args.batch):  # rows of different lengths, 0-padded
    inputs[b, 12 - 3 * (b % 4):] = 0
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(args.seed + 1), len(leaves))
  draft_params = jax.tree_util.tree_unflatten(tree, [
      x + args.draft_noise * x.std() * jax.random.normal(k, x.shape)
      for x, k in zip(leaves, keys)])
  decode = lambda: decoding.temperature_sample(
      model, params, inputs, max_decode_len=args.max_decode_len,
      sampling=sampling, rng=jax.random.key(args.seed))
  spec_decode = lambda: speculative.speculative_sample(
      model, params, drafters.T5Drafter(model), draft_params, inputs,
      gamma=args.gamma, max_decode_len=args.max_decode_len,
      sampling=sampling, rng=jax.random.key(args.seed))

  timings = {}
  for name, fn in (('baseline', decode), ('speculative', spec_decode)):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    timings[name] = (first, time.perf_counter() - start, out)
  result, spec = timings['baseline'][2], timings['speculative'][2]

  n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
  print(f'model: random T5 1.1-shaped, {n_params:,} parameters, '
        f'backend {jax.default_backend()}')
  print(f'sampling: {sampling}')
  for b in range(args.batch):
    print(f'input  {b} ({int((inputs[b] > 0).sum())} tokens): '
          f'{inputs[b][inputs[b] > 0].tolist()}')
    n = int(result.lengths[b])
    print(f'output {b} ({n} tokens): {np.asarray(result.tokens[b, :n]).tolist()}')
  same = bool(np.array_equal(result.tokens, spec.tokens))
  print(f'speculative (gamma={args.gamma}) output identical to baseline: '
        f'{same}' + ('' if sampling.greedy else ' (sampling: equal in '
                     'distribution, not per draw)'))
  for key, value in spec_stats.summarize(spec.stats).items():
    print(f'  {key}: {np.round(value, 3).tolist()}')
  for name, (first, run, _) in timings.items():
    print(f'{name}: first call (compile + run) {first:.2f} s; '
          f'compiled call {run * 1e3:.1f} ms')
  return result, spec


if __name__ == '__main__':
  checks.run_main(main)
