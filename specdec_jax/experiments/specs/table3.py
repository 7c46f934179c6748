"""Table 3: alpha per drafter and temperature, next to the paper's.

Each cell is the eval job at one (task, drafter, temperature) with gamma
fixed; alpha is the job's: beta = sum_x min(p(x), q(x)) averaged over
every position the target verified (spec_stats: the accepted drafts and
the first rejected one; not a bonus token's, after a fully accepted
draft), on prefixes of the target's own outputs (greedy at t = 0, sampled
at t = 1). Drafters: the model set's T5 drafters and the model-free kinds
that need no trained weights of their own (n-grams and prompt lookup), the
model-free ones first as in the paper. The n-grams are counted
from the task's train targets: the shipped model set's test slices have
none, so there they are offered only with `--data_dir` (the full Debian
data). Not offered: the self-drafting kinds (pass, heads, heads_tree: their
trained checkpoints are no part of a model set's setup, untrained they
draft noise) and the output cache (its alpha depends on what it has seen).
"""

from specdec_jax import paper as published
from specdec_jax import drafters as drafters_lib
from specdec_jax import task_table
from specdec_jax.experiments import reproduce
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

GAMMA = 4
TEMPERATURES = (0.0, 1.0)
SHRUNK_DRAFTERS = ('small', 'lookup')


def drafters(options):
  """The model-free kinds this model set can build, then its T5s."""
  has_train = (task_table.files_of(options.models) != 'shipped'
               or options.data_dir is not None)
  free = [k for k in reproduce.model_free_drafters()
          if not drafters_lib.KINDS[k].needs_target and (
              has_train or not drafters_lib.KINDS[k].data_only)]
  names = free + list(sweep.model_set(options).t5_drafters())
  if options.shrink:
    names = [n for n in names if n in SHRUNK_DRAFTERS]
  return names


def cells(options, tasks):
  return [sweep.Cell(task, drafter, dict(gamma=GAMMA, temperature=t))
          for task in tasks for drafter in drafters(options)
          for t in TEMPERATURES]


def paper_alpha(row):
  """The paper's alpha of the row's drafter at its temperature, or None."""
  ref = published.TABLE3[task_table.get(row['task']).paper]
  return (ref[row['drafter']][int(row['temperature'])]
          if row['drafter'] in ref else None)


SPEC = sweep.Spec(
    name='table3',
    title='Table 3: alpha per drafter',
    about=__doc__.split('\n\n', 1)[1] + (
        f'\nAll cells decode at gamma {GAMMA}, batch 1. Paper: T5-XXL target '
        '(EnDe ~ en_de, CNNDM ~ synopsis), alpha over 10K tokens; a '
        'drafter the paper did not run shows -. The measured speed-up is '
        "the job's (speculative over baseline tokens/s) at that gamma on "
        'this machine. The last column is the speed-up at t = 0 with the '
        "row's alpha at T5-XXL target cost."),
    cells=cells,
    columns=(
        ('task', 'task'), ('drafter', 'drafter'),
        ('t', table.temperature),
        ('alpha', 'alpha'),
        ('paper alpha', lambda r: '-' if paper_alpha(r) is None else
         f'{paper_alpha(r):.2f}'),
        ('output tokens', lambda r: f"{r['speculative_tokens']:.0f}"),
        ('measured speed-up', 'throughput_speedup'),
        ('identical (greedy)', table.identical),
        ('predicted {profile}, t=0 (gamma)',
         lambda r: table.on_profile(r) if r['temperature'] == 0 else '-')),
    num_examples=64,
    timing_repeats=1,
)
