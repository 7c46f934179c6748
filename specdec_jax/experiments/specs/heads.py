"""Self-drafting heads: a small trained head on the target's own states.

A draft head (kinds 'heads', 'heads_tree') drafts from the target's final
decoder state: in the merged loop one (gamma + 1)-token target call
verifies the drafts and gives the states the head drafts the next gamma
from, in gamma head steps; 'heads_tree' drafts a token tree (`TREE`,
`drafters.tree.DEFAULT_TREE`) verified in one target call. Each cell is the
eval job at batch 1, t = 0 and 1, with the model set's heads (shipped:
`shipped:heads/<task>`; another model set: `<models_dir>/heads/<task>`, a
scripts/train_heads.py --out_dir): heads at gamma = 1 .. 5, the default
tree, and the T5 drafter (dec2 for the shipped models, else small) at
gamma 4 in the ordinary loop for reference. The table shows per cell the
tokens per target call, alpha, the mean accepted length, the measured
speed-up and the speed-up these counters predict on a measured hardware
profile.
"""

from specdec_jax import network
from specdec_jax.bench import at_xxl_cost
from specdec_jax.bench import report
from specdec_jax.drafters import heads
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.drafters.tree.drafter import DEFAULT_TREE
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

GAMMAS = tuple(range(1, 6))
DRAFT_GAMMA = 4
TEMPERATURES = (0.0, 1.0)


def cells(options, tasks):
  gammas, tree, temperatures = GAMMAS, DEFAULT_TREE, TEMPERATURES
  if options.shrink:
    gammas, tree, temperatures = (2,), 'beam:2,1,2', (0.0,)
  t5 = sweep.model_set(options).t5_drafters()[0]  # dec2 on the shipped set
  out = []
  for task in tasks:
    head = dict(
        draft_checkpoint=sweep.method_checkpoint(options, 'heads', task))
    for t in temperatures:
      out += [sweep.Cell(task, 'heads', dict(head, gamma=g, temperature=t),
                         {'drafting': f'heads gamma={g}'}, ('head',))
              for g in gammas]
      out.append(sweep.Cell(
          task, 'heads_tree', dict(head, gamma=shape_lib.parse(tree).depth,
                                   tree=tree, temperature=t),
          {'drafting': f'heads tree {tree}'}, ('head',)))
      if not options.shrink:
        out.append(sweep.Cell(task, t5, dict(gamma=DRAFT_GAMMA, temperature=t),
                              {'drafting': f'{t5} gamma={DRAFT_GAMMA}'}))
  return out


def head(loaded, inputs):
  """The head's shape, the target's widths and the input length: what
  prices a head step on a profile (`heads.head_step_c`)."""
  return {'mlp_dim': loaded.drafter.head.mlp_dim,
          'cross_attention': loaded.drafter.head.cross_attention,
          'input_length': int(inputs.shape[1]),
          'target_config': report.config_dict(loaded.setup.target_config)}


# What prices a head step, named by what it depends on.
MEASUREMENTS = {'head': (head, ('target_config', 'target_checkpoint',
                                'task_feature_lengths', 'draft_checkpoint'))}


def shape_of(row):
  """The tree (or chain) a row decoded with; None where it decoded none
  (gamma 0: the job chose no speculation) or its 'choose:N' is not
  resolved (its choice file damaged)."""
  tree = row.get('tree') or f"chain:{row['gamma']}"
  if row['gamma'] == 0 or tree.startswith('choose:'):
    return None
  return shape_lib.parse(tree)


def width(row):
  """Tokens of one target call: the verified nodes + 1 (None where the
  row decoded no tree: `shape_of`)."""
  shape = shape_of(row)
  return None if shape is None else shape.verified_width(
      row['temperature'] == 0)


def head_step(row, profile):
  """A head step's bytes and launches on the profile (its c by the bytes /
  launches model, `heads.head_step_c`), from the row's `head` measurement."""
  h = dict(row['measured']['head'])
  cfg = h.pop('target_config')
  config = network.T5Config(**dict(cfg, mlp_activations=tuple(
      cfg['mlp_activations'])))
  step = heads.head_step_c(profile, config, heads.HeadConfig(
      h['mlp_dim'], h['cross_attention']), h['input_length'])
  return dict(step_bytes=step['step_bytes'], kernels=step['kernels'])


def predict(row, profile):
  """PREDICTED on the profile from the counters: tokens per target call /
  (cost(width) + depth x c); c of a head step from the profile's bytes /
  launches model, of the T5 drafter the profile's measured c."""
  shape = shape_of(row)
  if shape is None:
    row['predicted_counters'] = None
    return
  drafter = dict(drafter=at_xxl_cost.STAND_INS.get(row['drafter']))
  if profile is not None and 'head' in row['measured']:
    drafter = dict(drafter='heads', **head_step(row, profile))
  table.predict_counters(row, profile, width=width(row),
                         drafter_calls=shape.depth, **drafter)


SPEC = sweep.Spec(
    name='heads',
    title='Self-drafting heads: tokens per target call and speed-ups',
    about=__doc__.split('\n\n', 1)[1] + (
        "\nTokens / call = 1 / the job's target_calls_per_token (the first "
        'iteration, with no drafts yet, included). Measured speed-up: '
        "tokens/s over the baseline's on this machine (on a CPU a call on "
        'k tokens costs about k times one). Predicted (counters) is '
        'PREDICTED through hardware.predict: tokens / call / '
        "(cost(width) + depth x c) on the profile's measured cost(k), "
        'width = the verified nodes + 1, c in brackets: the T5 drafter\'s '
        "as the profile measured it; † a head step's from the profile's "
        'bytes / launches model (the head widened to the profile target\'s '
        'widths, its step bytes / the bandwidth + its launches x the launch '
        'time, over t(1)): the profile did not time a head; ‡: the width '
        "is beyond the profile's largest measured k, taken at that k's "
        "cost (the json's label says so)."),
    cells=cells,
    columns=(('task', 'task'), ('t', table.temperature),
             ('drafting', 'drafting'), ('depth', 'gamma'),
             ('call width', width)) + table.COUNTER_COLUMNS,
    num_examples=24, timing_repeats=2,
    predict=predict,
    measurements=MEASUREMENTS,
)
