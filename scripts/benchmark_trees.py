"""Token trees: tokens per target call, alpha per depth and speed-up.

On the shipped target and a shipped drafter (`--drafter`, dec2 by default;
`heads`: the shipped self-drafting heads, `shipped:heads/<task>`), on the
first `--num_examples` test rows of each task, this script decodes with

- chains of gamma drafts (`--chains`: the ordinary speculative loop; the
  heads: their merged loop, kind 'heads');
- trees (kind 'tree', `drafters.tree`; the heads: kind 'heads_tree'):
  for every node budget of
  `--budgets`, the dynamic tree `shape.best` builds from the drafter's
  measured rank probabilities (`measure.rank_probs`: how often the target's
  greedy token is the drafter's rank-r candidate; the heads':
  `head_rank_probs`, at a head's first step) with depth <=
  `--max_depth`; the static tree of the same shape at `--static_budget`
  (0: none); `drafters.tree.DEFAULT_TREE`; the EAGLE-2 beams of
  `--trees`; and the tree `shape.choose` picks for the profile's device
  (`--profile`) from its measured cost(k) and c (`--choose_budget` 0:
  none);

at every temperature of `--temperatures` (at t > 0 only the best chain,
the default tree and the chosen tree), all rows in one fixed batch, and
records tokens per target call (output tokens / row-iterations), alpha per
depth (the share of row-iterations accepting a draft at depth d) and, at
t = 0, how many rows equal the baseline's output token for token. Tokens
per target call do not depend on the device; the speed-up does:

- PREDICTED on the profile (the H100 run at T5-XXL cost by default):
  `bench.hardware.predict` from the counters: tokens per call /
  (cost(width) + depth x c), width = the nodes + 1 (a chain: gamma + 1),
  depth drafter calls per target call (the heads: one head step per
  level, on all its nodes at once; c of a head step from the profile's
  bytes / launches model, `drafters.heads.head_step_c`); cost(k)
  beyond the profile's largest measured k is that k's cost, labelled
  'extrapolated';
- MEASURED on this machine at t = 0 (on a GPU with `--widen
  t5_1_1_xxl_cost --dtype bfloat16`: the target at T5-XXL cost, the
  profile's setting): compiled, batch 1 over the first
  `--time_rows` rows, medians of `--repeats` alternating runs of the
  baseline, the best chain, the default and the chosen tree (on a CPU a
  call on k tokens costs ~k times one: trees are for accelerators).

Every cell is written when measured (OUT.json, OUT.md); `--repredict
OUT.json` recomputes the predicted columns from the measured counters.

  python scripts/benchmark_trees.py --out results/trees
  python scripts/benchmark_trees.py --merge --drafter heads --budgets 64 \
    --static_budget 0 --choose_budget 0 --trees beam:8,4,12/64 \
    --temperatures 0 --time_rows 0 --out results/trees
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
from specdec_jax import layers
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import shipped
from specdec_jax import spec_stats
from specdec_jax import speculative
from specdec_jax import widening
from specdec_jax.bench import flags
from specdec_jax.bench import hardware
from specdec_jax.bench import report
from specdec_jax.drafters import heads
from specdec_jax.drafters import tree as tree_lib
from specdec_jax.drafters.heads import train as heads_train
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.sampling import SamplingConfig

# --drafter HEADS: the shipped self-drafting heads of each task.
HEADS = 'heads'


def _ints(text):
  return tuple(int(x) for x in text.split(',') if x)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--tasks', default='en_de,synopsis')
  p.add_argument('--num_examples', type=int, default=64)
  p.add_argument('--drafter', default='dec2',
                 help=f"a shipped drafter, or '{HEADS}': the shipped heads "
                 '(shipped:heads/<task>) on the target')
  p.add_argument('--chains', default='4,7', help='chain gammas')
  p.add_argument('--budgets', default='16,32,64,128',
                 help='node budgets of the dynamic best trees')
  p.add_argument('--max_depth', type=int, default=10)
  p.add_argument('--static_budget', type=int, default=64,
                 help='the node budget of the static tree (0: none)')
  p.add_argument('--choose_budget', type=int, default=64,
                 help="the node budget of the profile's chosen tree (0: "
                 'none)')
  p.add_argument('--trees', nargs='*',
                 default=['beam:3,2,10', 'beam:2,2,16', 'beam:4,1,16'],
                 help="more TREE specs (e.g. deeper / narrower beams, or "
                 "'beam:16,4,16/64': draft wide, verify the best 64)")
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--time_rows', type=int, default=16)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--dtype', default='float32',
                 help="the models' dtype: float32, or bfloat16 on a GPU")
  p.add_argument('--widen', default=None,
                 help="widen the target (function-preservingly) to a "
                 "widening.PRESETS cost, e.g. 't5_1_1_xxl_cost': same "
                 'outputs and counters, that cost per call (a GPU run)')
  p.add_argument('--out', default='results/trees')
  p.add_argument('--merge', action='store_true',
                 help='add to OUT.json: decode only the (task, t, drafting) '
                 'cells it lacks (the command is added to the header)')
  flags.add_prediction_flags(p)
  return p.parse_args(argv)


def chosen_tree(rank_probs, profile, drafter, budget, max_depth):
  """`shape.choose` on the profile's cost(k) (batch 1) and c."""
  c, _ = profile.c_of(drafter)
  shape, _ = shape_lib.choose(
      rank_probs, lambda k: profile.cost_at(k)[0], c, max_nodes=budget,
      max_depth=max_depth, dynamic=True)
  return shape


def prefix_of(args) -> str:
  """What the drafting names of `--drafter heads` start with."""
  return f'{HEADS} ' if args.drafter == HEADS else ''


def configs(args, rank_probs, profile):
  """name -> (kind 'chain' or 'tree', chain gamma or tree shape)."""
  out = {}
  for g in _ints(args.chains):
    out[f'chain {g}'] = ('chain', g)
  for n in _ints(args.budgets):
    out[f'dynamic {n}'] = ('tree', shape_lib.best(rank_probs, n,
                                                  args.max_depth, True))
  if args.static_budget:
    static = shape_lib.best(rank_probs, args.static_budget, args.max_depth)
    out[f'static {args.static_budget}'] = ('tree', static)
  out['default'] = ('tree', shape_lib.parse(tree_lib.DEFAULT_TREE))
  for spec in args.trees:
    out[spec] = ('tree', shape_lib.parse(spec))
  if args.choose_budget:
    out[f'chosen {profile.name}'] = ('tree', chosen_tree(
        rank_probs, profile, args.drafter, args.choose_budget,
        args.max_depth))
  return {prefix_of(args) + name: value for name, value in out.items()}


def build(kind, value, base, greedy=True):
  """(drafter, depth, tokens per target call, nodes verified).

  base: the chain drafter, a `drafters.T5Drafter` (trees: kind 'tree') or
  a `heads.HeadDrafter` (trees: kind 'heads_tree').
  """
  if kind == 'chain':
    return base, value, value + 1, value
  if isinstance(base, heads.HeadDrafter):
    drafter = heads.HeadTreeDrafter(base.model, base.head, value)
  else:
    drafter = tree_lib.TreeDrafter(base, value)
  width = value.verified_width(greedy)
  return drafter, value.depth, width, width - 1


def head_rank_probs(drafter: heads.HeadDrafter, params, enc, tokens,
                    lengths):
  """`measure.rank_probs` of a head's first step: teacher-forced on
  `tokens`, from the target's state h_t and y_{t+1}, the rank of y_{t+2}
  in the head's logits, at every position up to and including EOS."""
  head = drafter.heads

  @jax.jit
  def ranks(params, enc, out):
    hidden, kv = heads_train.target_features(drafter.model, params['target'],
                                             enc, out)
    bias = layers.mask_to_bias((enc > 0)[:, None, None, :])
    _, logits = head.step(params['head'], params['target'], hidden[:, :-1],
                          out[:, :-1], kv, bias)
    mine = jnp.take_along_axis(logits, out[:, 1:, None], -1)
    return jnp.sum(logits > mine, axis=-1)

  return measure.rank_shares(ranks, params, enc, tokens, lengths, first=1)


def head_step_cost(profile, target, drafter: heads.HeadDrafter,
                   input_length: int):
  """`(step_bytes, kernels)` of one head step on the profile's target
  widths (`heads.head_step_c`)."""
  c = heads.head_step_c(profile, target.config, drafter.head, input_length)
  return c['step_bytes'], c['kernels']


def predict_row(row, profile):
  pred = hardware.predict(
      profile, tokens_per_call=row['tokens_per_call'], width=row['width'],
      drafter_calls_per_call=row['depth'], drafter=row['drafter'],
      step_bytes=row.get('step_bytes'), kernels=row.get('kernels', 0))
  row['predicted'] = pred.speedup
  row['predicted_label'] = pred.label
  return row


def write_markdown(path, result):
  meta, rows = result['meta'], result['rows']
  lines = [
      f"# Token trees: tokens per target call, chain vs trees "
      f"({meta['backend']})", '',
      report.header_md(meta) + ''.join(
          f'Added by: `{c}`  \n' for c in meta.get('merged', [])),
      'Shipped target' + (f" widened to {meta['widen']}" if meta.get(
          'widen') else '') +
      f" and drafter `{meta['drafter']}`, {meta.get('dtype', 'float32')}, "
      "the first "
      f"{meta['num_examples']} test rows of each task, all rows in one "
      'fixed batch, EOS ends a row. tokens/call = output tokens / '
      'row-iterations (one target call per row-iteration; the bonus token '
      'included); alpha at depth d = the share of row-iterations that '
      'accept a draft at depth d. "dynamic N" = `shape.best` on the '
      'measured rank probabilities with N nodes, depth <= '
      f"{meta['max_depth']}, parents re-ranked at run time by the "
      "drafter's path probability (EAGLE-2); \"static N\" = the same "
      'construction, slots fixed; "default" = `drafters.tree.DEFAULT_TREE` '
      f"(`{meta['default_tree']}`); \"chosen <profile>\" = `shape.choose` on "
      "that profile's cost(k) and c. **Predicted** (not measured), computed "
      'through bench.hardware.predict from the counters: tokens/call / '
      '(cost(width) + depth x c) on the profile (measured on that device at T5-XXL '
      'target cost; its label says which inputs are not measured). '
      'Identical = rows equal to the baseline token for token (t = 0).' + (
          ' "heads ..." rows: the shipped self-drafting heads '
          '(`shipped:heads/<task>`) on the same target instead of a draft '
          "model, chains in their merged loop (kind 'heads'), trees in "
          "theirs (kind 'heads_tree'; \"heads dynamic N\" built from the "
          "head's rank probabilities at its first step); a drafter call is "
          "one head step per level, on all the level's nodes at once, c its "
          "bytes / launches model on the profile (as "
          'scripts/benchmark_heads.py).' if any(
              r['drafter'] == HEADS for r in rows) else ''), '']
  rank_probs = {meta['drafter']: meta['rank_probs'],
                **meta.get('rank_probs_of', {})}
  for drafter, per_task in rank_probs.items():
    for task, rp in per_task.items():
      lines.append(f'Rank probabilities of `{drafter}` on {task} '
                   '(target greedy outputs, teacher-forced): ' +
                   ', '.join(f'{x:.3f}' for x in rp) + '.  ')
  lines += ['', '## Tokens per target call and predicted speed-up', '']
  table = []
  for r in rows:
    alpha = ' '.join(f'{a:.2f}' for a in r['alpha_per_depth'])
    table.append([
        r['task'], r['t'], r['name'], r['nodes'], r['depth'],
        f"**{r['tokens_per_call']:.2f}**", alpha,
        report.fmt(r.get('predicted')),
        r.get('identical', '-'), r['predicted_label'] if r.get(
            'predicted') is not None else '-'])
  lines.append(report.table(
      ['task', 't', 'drafting', 'nodes', 'depth', 'tokens/call',
       'alpha per depth', 'predicted speed-up', 'identical', 'label'],
      table))
  timed = result.get('timed', [])
  if timed:
    lines += ['', f"## Measured on this machine ({meta['backend']}), t = 0, "
              f"batch 1, first {meta['time_rows']} rows", '']
    lines.append(report.table(
        ['task', 'decoder', 'seconds (median)', 'speed-up over baseline'],
        [[t['task'], t['name'], f"{t['seconds']:.2f}",
          f"{t['speedup']:.2f}"] for t in timed]))
  if result.get('shapes'):
    lines += ['', '## Shapes (TREE specs)', '']
    for name, spec in result['shapes'].items():
      lines.append(f'- {name}: `{spec}`')
  report.write_md(path, '\n'.join(lines) + '\n')


def decode(target, tp, drafter, dp, gamma, enc, length, sampling, seed):
  return speculative.speculative_sample(
      target, tp, drafter, dp, enc, gamma=gamma, max_decode_len=length,
      sampling=sampling, eos_id=1, rng=jax.random.key(seed))


def run_task(task, args, target, tp, chain_drafter, dp, profile, result,
             save):
  arrays = shipped.test_arrays(task)
  enc = jnp.asarray(arrays['inputs'][:args.num_examples])
  length = arrays['targets'].shape[1]
  base = decoding.temperature_sample(target, tp, enc, max_decode_len=length,
                                     eos_id=1)
  tokens, lengths = np.asarray(base.tokens), np.asarray(base.lengths)
  cost = {}
  if isinstance(chain_drafter, heads.HeadDrafter):
    rp = head_rank_probs(chain_drafter, dp, enc, tokens, lengths)
    cost['step_bytes'], cost['kernels'] = head_step_cost(
        profile, target, chain_drafter, enc.shape[1])
  else:
    rp = measure.rank_probs(chain_drafter, dp, enc, tokens, lengths)
  rp = [float(x) for x in np.sort(rp)[::-1]]  # best() needs non-increasing
  meta = result['meta']
  if args.drafter == meta['drafter']:
    meta['rank_probs'][task] = rp
  else:  # --merge with another drafter
    meta.setdefault('rank_probs_of', {}).setdefault(args.drafter, {})[
        task] = rp
  table = configs(args, rp, profile)
  prefix = prefix_of(args)
  best_chain = None
  for t in (float(x) for x in args.temperatures.split(',')):
    sampling = SamplingConfig(temperature=t)
    for name, (kind, value) in table.items():
      if t > 0 and not (name == best_chain or name == prefix + 'default' or
                        name.startswith(prefix + 'chosen')):
        continue
      if any((r['task'], r['t'], r['name']) == (task, t, name)
             for r in result['rows']):
        continue  # --merge: measured before
      drafter, depth, width, nodes = build(kind, value, chain_drafter,
                                           sampling.greedy)
      start = time.time()
      out = decode(target, tp, drafter, dp, depth, enc, length, sampling,
                   args.seed)
      s = spec_stats.summarize(out.stats)
      out_lengths = np.asarray(out.lengths)
      row = dict(task=task, t=t, name=name, nodes=nodes, depth=depth,
                 width=width, drafter=args.drafter,
                 spec=value.spec if kind == 'tree' else f'chain:{value}',
                 tokens_per_call=float(out_lengths.sum() /
                                       s['row_iterations']),
                 alpha_per_depth=s['per_position_acceptance'],
                 seconds_with_compile=time.time() - start, **cost)
      if t == 0:
        row['identical'] = int(np.all(
            (np.asarray(out.tokens) == tokens), axis=1).sum())
      result['rows'].append(predict_row(row, profile))
      result['shapes'][name + f' ({task})'] = row['spec']
      print(f"{task} t={t} {name}: {row['tokens_per_call']:.2f} tokens/call"
            f", predicted {row['predicted']:.2f}x", flush=True)
      save()
    if t == 0:
      chains = [r for r in result['rows'] if r['task'] == task and
                r['t'] == 0 and r['name'].startswith(prefix + 'chain')]
      best_chain = max(chains, key=lambda r: r['predicted'])['name']
  if args.time_rows and not any(r['task'] == task
                                for r in result['timed']):
    time_task(task, args, target, tp, chain_drafter, dp, table, best_chain,
              arrays, length, result)
    save()


def time_task(task, args, target, tp, chain_drafter, dp, table, best_chain,
              arrays, length, result):
  """Batch 1, the first rows, compiled, medians of alternating repeats."""
  rows = [jnp.asarray(arrays['inputs'][i:i + 1])
          for i in range(args.time_rows)]
  greedy = SamplingConfig()
  calls = {'baseline': lambda: [decoding.temperature_sample(
      target, tp, r, max_decode_len=length, eos_id=1).tokens for r in rows]}
  prefix = prefix_of(args)
  for name in [best_chain, prefix + 'default'] + [
      n for n in table if n.startswith(prefix + 'chosen')]:
    drafter, depth, _, _ = build(*table[name], chain_drafter)
    calls[name] = (lambda d=drafter, g=depth: [decode(
        target, tp, d, dp, g, r, length, greedy, 0).tokens for r in rows])
  for call in calls.values():
    jax.block_until_ready(call())  # compile
  _, seconds = measure.time_alternating(calls, args.repeats)
  for name, sec in seconds.items():
    result['timed'].append(dict(task=task, name=name, seconds=sec,
                                speedup=seconds['baseline'] / sec))


def main(argv=None):
  args = parse_args(argv)
  profile = flags.profile_of(args)
  if args.repredict:
    path = pathlib.Path(args.repredict)
    result = report.read_json(path)
    result['rows'] = [predict_row(r, profile) for r in result['rows']]
    report.write_json(path, result)
    write_markdown(path.with_suffix('.md'), result)
    return
  target, tp = shipped.load_model('target', dtype=args.dtype)
  if args.widen:
    tp, config = widening.widen_to(tp, target.config, args.widen)
    target = network.T5Model(config)
  if args.drafter == HEADS:
    if args.widen:
      raise SystemExit('--drafter heads: the shipped heads fit the shipped '
                       'target only (no --widen).')
    chain_drafter = dp = None  # per task, below
  else:
    dmodel, dp = shipped.load_model(args.drafter, dtype=args.dtype)
    chain_drafter = drafters.T5Drafter(dmodel)
  result = dict(
      meta=dict(report.header('scripts/benchmark_trees.py', argv),
                drafter=args.drafter, num_examples=args.num_examples,
                dtype=args.dtype, widen=args.widen,
                max_depth=args.max_depth, time_rows=args.time_rows,
                default_tree=tree_lib.DEFAULT_TREE, profile=profile.name,
                rank_probs={}),
      rows=[], timed=[], shapes={})

  if args.merge and pathlib.Path(args.out + '.json').exists():
    previous = report.read_json(args.out + '.json')
    previous['meta'].setdefault('merged', []).append(
        result['meta']['command'])
    result = previous

  def save():
    report.write_json(args.out + '.json', result)
    write_markdown(args.out + '.md', result)

  for task in args.tasks.split(','):
    if args.drafter == HEADS:
      chain_drafter, dp = drafters.get_kind(HEADS).build(
          drafters.DraftSource(
              vocab_size=target.vocab_size, target_model=target,
              target_params=tp,
              draft_checkpoint=f'{shipped.SCHEME}{HEADS}/{task}'))
    run_task(task, args, target, tp, chain_drafter, dp, profile, result,
             save)
  print(f'wrote {args.out}.json / .md', file=sys.stderr)


if __name__ == '__main__':
  main()
