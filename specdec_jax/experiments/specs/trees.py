"""Token trees: tokens per target call of chains and of token trees.

A chain of gamma drafts yields at most about 1 / (1 - alpha) tokens per
target call; a token tree (`drafters.tree`) verifies many drafts in one
target call, on an accelerator at about the cost of one token. Each cell
is the eval job at batch 1 with the shipped dec2 drafter: chains (kind
't5'); trees (kind 'tree', depth = gamma): "default" (DEFAULT_TREE),
EAGLE-2 beams ('beam:K,B,D': the root's K best tokens, then the B most
probable paths of each level get K children, D levels; '/N': verify the
N most probable nodes, greedy only), "dynamic N", the tree of N nodes
`shape.best` built from dec2's rank probabilities (`measure.rank_probs`,
64 test rows per task; fixed shapes here), "estimated 64": the tree
`shape.choose` picks from those and the ESTIMATED costs of the decode
loops compiled for a compile-only H100 (`ESTIMATED_H100`; a fixed shape
here), "chosen N": the tree the job
chooses on this machine ('choose:N': the most tokens per second predicted
from the call costs it measures, among the static tree Sequoia's way
picks from the rank probabilities and the beams that fill a level, each
decoded on the first examples and weighed cut to every depth; the row
shows the tree it decoded with), and the shipped heads
(`shipped:heads/<task>`): kinds 'heads' and 'heads_tree'. At t = 1 only
the best chain and the default tree.
"""

import numpy as np

from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.drafters.tree.drafter import DEFAULT_TREE
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table
from specdec_jax.experiments.specs import heads as heads_spec

CHAINS = (4, 7)
BEST_CHAIN = 7  # the chain also decoded at t = 1
# The last two fill a level's drafter call: it costs the same for up to 8
# (16) nodes as for 4, the rows a GPU runs it on (`network.padded_rows`),
# so 8 levels of 8 (16) draft what 12 of 4 did.
BEAMS = ('beam:3,2,10', 'beam:2,2,16', 'beam:4,1,16', 'beam:8,4,12/64',
         'beam:16,4,16/64', 'beam:8,8,8/64', 'beam:8,16,8/64')
# "dynamic N" per task: `shape.best(rank_probs, N, 10, dynamic=True)`.
DYNAMIC = {
    'dynamic 16': dict.fromkeys(('en_de', 'synopsis'), (
        'dynamic:0.0,0.1,0.2;0.0,0.1,1.0;0.0,0.1,1.0,2.0;0.0;0.0;0.0;0.0;0.0;'
        '0.0')),
    'dynamic 32': {
        'en_de': 'dynamic:0.0,0.1,0.2,0.3;0.0,0.1,1.0,0.2,2.0,0.3,3.0;0.0,'
                 '0.1,1.0,2.0,0.2;0.0,0.1,1.0,2.0,3.0;0.0,0.1,1.0,2.0,3.0,'
                 '4.0;0.0;0.0;0.0;0.0;0.0',
        'synopsis': 'dynamic:0.0,0.1,0.2,0.3;0.0,0.1,1.0,0.2,2.0;0.0,0.1,'
                    '1.0,2.0,0.2,3.0,4.0;0.0,0.1,1.0,2.0,3.0;0.0,0.1,1.0,'
                    '2.0,3.0,4.0;0.0;0.0;0.0;0.0;0.0'},
}
# "estimated 64" per task: `shape.choose(rank_probs, ESTIMATED_H100, 64,
# 12)` (the same rank probabilities), the tree with the most tokens per
# second on the ESTIMATED costs of the decode loops compiled for a
# compile-only H100 at T5 1.1-XXL cost (`python -m specdec_jax.compiled
# --target=gpu:h100 --iterations=reference`,
# results/compiled/iterations_h100.md, "The accepted path moved in the
# next call's writes"): the target's call at k tokens (the baseline's,
# the chain's, the trees' at 61 and 65), a level's drafter call and its
# selection (43 + 6 kernels), and the rest of a tree iteration.
ESTIMATED_H100 = dict(target_ms={1: 4.77, 7: 4.81, 61: 5.14, 65: 5.20},
                      level_ms=0.124, fixed_ms=0.142)
ESTIMATED = {
    'en_de': ('dynamic:0.0,0.1,0.2,0.3,0.4,0.5;'
              '0.0,0.1,1.0,0.2,2.0,0.3,3.0,0.4,4.0,1.1;'
              '0.0,0.1,1.0,2.0,0.2,3.0,4.0,0.3,5.0,6.0,0.4,7.0,8.0;'
              '0.0,0.1,1.0,2.0,3.0,0.2,4.0,5.0,6.0,7.0,0.3,8.0,9.0;'
              '0.0,0.1,1.0,2.0,3.0,4.0,0.2,5.0,6.0,7.0,8.0;'
              '0.0,0.1,1.0,2.0,3.0,4.0,5.0'),
    'synopsis': ('dynamic:0.0,0.1,0.2,0.3,0.4,0.5,0.6;'
                 '0.0,0.1,1.0,0.2,2.0,0.3,3.0,0.4,4.0,1.1;'
                 '0.0,0.1,1.0,2.0,0.2,3.0,4.0,0.3,5.0,6.0;'
                 '0.0,0.1,1.0,2.0,3.0,4.0,5.0,6.0,0.2;'
                 '0.0,0.1,1.0,2.0,3.0,4.0,5.0,6.0,7.0;'
                 '0.0,0.1,1.0,2.0,3.0,4.0,5.0;'
                 '0.0,0.1,1.0,2.0,3.0,4.0,5.0,6.0'),
}
HEADS = ('chain:4', DEFAULT_TREE, 'beam:8,4,12/64')
CHOSEN = 64  # "chosen N": 'choose:N', of at most `CHOSEN_DEPTH` levels:
# 8, where dec2's levels stop paying for themselves (beam:8,16,D/64 at D =
# 6 / 8 / 10 / 12: 4.10 / 4.46 / 4.52 / 4.58 tokens a call on en_de), and
# the depth of the `BEAMS` that fill a level (a choice weighs them).
CHOSEN_DEPTH = 8


def estimated_costs() -> shape_lib.TreeCosts:
  """`ESTIMATED_H100` as `shape.TreeCosts` (the target's call
  interpolated between the k it was counted at, held beyond)."""
  ks = sorted(ESTIMATED_H100['target_ms'])
  ms = [ESTIMATED_H100['target_ms'][k] for k in ks]
  return shape_lib.TreeCosts(
      target_ms=lambda k: float(np.interp(k, ks, ms)),
      level_ms=ESTIMATED_H100['level_ms'], fixed_ms=ESTIMATED_H100['fixed_ms'])


def cell(options, t5, task, spec, t=0.0, head=False, name=None):
  """A chain ('chain:G') or tree (`shape.parse` spec) of `t5` or heads."""
  chain, chosen = spec.startswith('chain:'), spec.startswith('choose:')
  name = name or ('default' if spec == DEFAULT_TREE else
                  spec.replace(':', ' ') if chain else spec)
  depth = CHOSEN_DEPTH if chosen else shape_lib.parse(spec).depth
  changes = dict(gamma=depth, temperature=t,
                 **({} if chain else {'tree': spec}))
  if head:
    changes['draft_checkpoint'] = sweep.method_checkpoint(options, 'heads',
                                                          task)
    return sweep.Cell(task, 'heads' if chain else 'heads_tree', changes,
                      {'drafting': 'heads ' + name}, ('head',))
  if not chain:
    changes['drafter'] = 'tree'
  return sweep.Cell(task, t5, changes, {'drafting': name})


def cells(options, tasks):
  t5 = sweep.model_set(options).t5_drafters()[0]  # dec2 on the shipped set
  at = lambda *args, **kwargs: cell(options, t5, *args, **kwargs)
  if options.shrink:
    return [at(tasks[0], 'chain:2'), at(tasks[0], 'beam:2,2,2/4'),
            at(tasks[0], 'beam:2,1,2', head=True)]
  out = []
  for task in tasks:
    out += [at(task, f'chain:{g}') for g in CHAINS]
    out += [at(task, s) for s in (DEFAULT_TREE,) + BEAMS]
    out += [at(task, s[task], name=n) for n, s in DYNAMIC.items()]
    out.append(at(task, ESTIMATED[task], name=f'estimated {CHOSEN}'))
    out.append(at(task, f'choose:{CHOSEN}', name=f'chosen {CHOSEN}'))
    out += [at(task, s, head=True) for s in HEADS]  # fail without heads
    out += [at(task, f'chain:{BEST_CHAIN}', 1.0), at(task, DEFAULT_TREE, 1.0)]
  return out


def _nodes(row):
  width = heads_spec.width(row)
  return '-' if width is None else width - 1


SPEC = sweep.Spec(
    name='trees',
    title='Token trees: tokens per target call, chains vs trees',
    about=__doc__.split('\n\n', 1)[1] + (
        '\nTokens / call = 1 / the job\'s target_calls_per_token (the bonus '
        'token included). Measured speed-up: tokens/s over the baseline\'s '
        'on this machine (on a CPU a call on k tokens costs about k times '
        'one: trees are for accelerators). Predicted (counters) = PREDICTED '
        'through hardware.predict: tokens / call / (cost(width) + '
        'depth x c) on the profile, width = the verified nodes + 1, depth '
        "drafter calls per target call (the heads: one head step per level, "
        "c the profile's bytes / launches model); the json's label says "
        'which inputs are not measured.'),
    cells=cells,
    columns=(('task', 'task'), ('t', table.temperature),
             ('drafting', 'drafting'),
             ('nodes', _nodes),
             ('depth', 'gamma')) + table.COUNTER_COLUMNS,
    num_examples=32, timing_repeats=3,
    predict=heads_spec.predict,
    measurements=heads_spec.MEASUREMENTS,
)
