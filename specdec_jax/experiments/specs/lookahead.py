"""PaSS: the target drafting for itself from learned look-ahead embeddings.

PaSS (kind 'pass') appends L trained look-ahead embeddings to the target's
input: one target call on 2 gamma + 1 tokens verifies the last drafts and
drafts the next gamma (the merged loop: no drafter call, gamma <= L). Each
cell is the eval job at batch 1, t = 0 and 1, with the model set's
embeddings (shipped: `shipped:lookahead/<task>`, L = 8, trained by
scripts/train_pass.py on the target's outputs of test rows 64:256: the rows
decoded here, the first, are held out; another model set:
`<models_dir>/lookahead/<task>`, a train_pass.py --out_dir) at gamma = L = 1
.. 8; the same embeddings in PaSS's tree layout (kind 'pass_tree': a group
of slots after each draft, (gamma + 1)^2 tokens a call, no recovery call
after a rejection) at gamma 1 .. 4; and prompt lookup (kind 'lookup', gamma
4, drafted by copying) for reference. The table shows per cell the tokens
per target call, alpha, the mean accepted length, the measured speed-up and
the speed-up these counters predict on a measured hardware profile.
"""

from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

LOOKAHEADS = tuple(range(1, 9))
TREE_LOOKAHEADS = (1, 2, 3, 4)  # 'pass_tree': (gamma + 1)^2 tokens a call
LOOKUP_GAMMA = 4
TEMPERATURES = (0.0, 1.0)


def cells(options, tasks):
  lookaheads, trees, temperatures = LOOKAHEADS, TREE_LOOKAHEADS, TEMPERATURES
  if options.shrink:
    lookaheads, trees, temperatures = (2,), (1,), (0.0,)
  out = []
  for task in tasks:
    for t in temperatures:
      weights = sweep.method_checkpoint(options, 'lookahead', task)
      out += [sweep.Cell(task, kind, dict(
          gamma=g, temperature=t, draft_checkpoint=weights),
                         {'drafting': f'{name} L={g}'})
              for kind, name, gammas in (('pass', 'pass', lookaheads),
                                         ('pass_tree', 'pass tree', trees))
              for g in gammas]
      if not options.shrink:
        out.append(sweep.Cell(task, 'lookup', dict(gamma=LOOKUP_GAMMA,
                                                   temperature=t),
                              {'drafting': f'lookup gamma={LOOKUP_GAMMA}'}))
  return out


def width(row):
  """Tokens of one target call: 2 gamma + 1 for PaSS, (gamma + 1)^2 in its
  tree layout, gamma + 1 else."""
  g = row['gamma']
  return {'pass': 2 * g + 1, 'pass_tree': (g + 1) ** 2}.get(row['kind'], g + 1)


def predict(row, profile):
  """PREDICTED on the profile from the counters: tokens per target call /
  cost(call width), c = 0 (PaSS drafts inside the verification call;
  lookup's copying is taken as free)."""
  table.predict_counters(row, profile, width=width(row), drafter_calls=0)


SPEC = sweep.Spec(
    name='lookahead',
    title='PaSS: look-ahead embeddings, tokens per target call and speed-ups',
    about=__doc__.split('\n\n', 1)[1] + (
        "\nTokens / call = 1 / the job's target_calls_per_token (for PaSS "
        'it counts the recovery calls after a rejection; the tree layout '
        'has none). Measured speed-up: '
        "tokens/s over the baseline's on this machine (on a CPU a call on k "
        'tokens costs about k times one). Predicted (counters) is PREDICTED '
        'through hardware.predict: tokens / call / cost(call width) '
        "on the profile's measured cost(k), c = 0; ‡: the width is beyond "
        "the profile's largest measured k, taken at that k's cost (the "
        "json's label says so)."),
    cells=cells,
    columns=(('task', 'task'), ('t', table.temperature),
             ('drafting', 'drafting'), ('gamma', 'gamma'),
             ('call width', width)) + table.COUNTER_COLUMNS,
    num_examples=16, timing_repeats=2,
    predict=predict,
)
