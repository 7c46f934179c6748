"""Table 2: gamma, alpha and speed-up per task, drafter and temperature.

The paper picks gamma from alpha and c measured beforehand, then decodes at
that gamma. Here the eval job decodes every (task, T5 drafter, temperature)
at each gamma of a sweep, 1 .. `MAX_GAMMA`, and the rows of one such group
share two measurements: the target's t(1), cost(k) = t(k) / t(1) for k =
1 .. MAX_GAMMA + 1 and the drafter's c on this machine ('costs'), and a
calibration alpha ('calibration': `measure.alpha` on the examples that
follow the decoded ones, so the two never overlap). The chosen gamma
(marked) is the argmax of Theorem 3.8 with the calibration alpha on those
costs (`hardware.predict`); its row gives the measured speed-up at
that gamma, the others show how the speed-up moves around it (the plot:
measured and predicted speed-up over gamma). Each group has one more
cell, the paper's way (`batch_gamma=always`, gamma 'rule'): the job
measures t(k) and c itself at the first unit and alpha on the first 16
examples (decoded at gamma `RULE_WARMUP`, untimed) and decodes every unit
at the gamma Theorem 3.8
picks on them (`BatchSpec.gamma_rule`, `unit_loop.choose_gamma`), or
without speculation where even the best is predicted slower; alone
(`--where batch_gamma=always`), it is the table in one cell per row.
"""

import itertools
from typing import Any, Dict

import jax
import numpy as np

from specdec_jax import data
from specdec_jax import measure
from specdec_jax import paper as published
from specdec_jax import task_table
from specdec_jax import theory
from specdec_jax import hardware
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

MAX_GAMMA = 8
RULE_WARMUP = 4  # the rule cell's first-unit gamma (its alpha)
TEMPERATURES = (0.0, 1.0)
SHRUNK = dict(max_gamma=2, drafters=('small',), temperatures=(0.0,))


def cells(options, tasks):
  """Per group the gammas from the largest down: the group's first cell
  times c, so c is the drafter's per-token time at gamma MAX_GAMMA (its
  catch-up call spread over the draft), shared by the group."""
  names = sweep.model_set(options).t5_drafters()
  temperatures, top = TEMPERATURES, MAX_GAMMA
  if options.shrink:
    names = [n for n in names if n in SHRUNK['drafters']]
    temperatures, top = SHRUNK['temperatures'], SHRUNK['max_gamma']
  rule = lambda t: dict(gamma=min(RULE_WARMUP, top), temperature=t,
                       max_gamma=top, batch_gamma='always')
  return [sweep.Cell(task, drafter, changes, measure=('costs', 'calibration'))
          for task in tasks for drafter in names for t in temperatures
          for changes in [dict(gamma=g, temperature=t, max_gamma=top)
                          for g in range(top, 0, -1)] + [rule(t)]]


def calibration(loaded, inputs) -> Dict[str, Any]:
  """alpha on the `num_examples` examples after the decoded ones."""
  del inputs
  setup, spec = loaded.setup, loaded.setup.data
  n, lengths = spec.num_examples, spec.task_feature_lengths
  rows = [ids for _, ids, _, _ in data.task_examples(
      loaded.task, spec.split, lengths, 2 * n, spec.truncate_inputs)][n:]
  if not rows:
    raise ValueError(f'no {spec.split} examples after the first {n} to '
                     'measure the calibration alpha on')
  alpha = measure.alpha(
      loaded.target, loaded.target_params, loaded.drafter,
      loaded.draft_params, data.pad_rows(rows, lengths['inputs']),
      sampling=setup.sampling, max_decode_len=lengths['targets'],
      eos_id=spec.eos_id, rng=jax.random.key(setup.seed))
  return {'alpha': alpha['alpha'], 'positions': alpha['positions'],
          'examples': len(rows)}


CALIBRATION_FIELDS = sweep.EXAMPLE_FIELDS + (
    'drafter', 'draft_config', 'draft_checkpoint')


def predict(row, profile) -> None:
  """The chosen gamma and the row's speed-up at the calibration alpha."""
  del profile
  row.update(calibrated_speedup=None, chosen_gamma=None, chosen=False)
  own = table.run_profile(row)
  cal = (row.get('measured') or {}).get('calibration')
  if own is None or cal is None or not row['gamma']:
    return
  at = dict(alpha=theory.clamp_alpha(cal['alpha']), drafter=row['drafter'])
  row['calibrated_speedup'] = hardware.predict(
      own, gamma=row['gamma'], **at).speedup
  row['chosen_gamma'] = hardware.predict(
      own, max_gamma=row['max_gamma'], **at).gamma
  row['chosen'] = row['chosen_gamma'] == row['gamma']


def paper(row):
  """The paper's (gamma, alpha, speed-up) of the row, or None."""
  return published.TABLE2[task_table.get(row['task']).paper, int(
      row['temperature'])].get(row['drafter'])


def _rule(row) -> bool:
  """Whether a row is its group's rule row (gamma chosen by the job)."""
  return row.get('batch_gamma') == 'always'


def plot(result, path) -> None:
  """Measured and predicted speed-up over gamma: a panel per (task,
  drafter) and temperature, the chosen gamma dotted."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  rows_of = lambda r: (r['task'], r['drafter'])
  pairs = list(dict.fromkeys(rows_of(r) for r in result['rows']))
  temps = sorted({r['temperature'] for r in result['rows']})
  fig, axes = plt.subplots(len(pairs), len(temps), squeeze=False, figsize=(
      4.5 * len(temps), 3.4 * len(pairs)))
  for (i, pair), (j, t) in itertools.product(enumerate(pairs),
                                             enumerate(temps)):
    ax = axes[i][j]
    here = [r for r in result['rows']
            if rows_of(r) == pair and r['temperature'] == t]
    rows = sorted((r for r in here if not _rule(r)), key=lambda r: r['gamma'])
    for r in filter(_rule, here):
      ax.plot([r['gamma']], [r['throughput_speedup']], 'k*', ms=10,
              label="the rule's row (gamma chosen by the job)")
    g = [r['gamma'] for r in rows]
    for field, style, label in (
        ('throughput_speedup', 'o-', 'measured'),
        ('predicted_speedup', 's--', "predicted (the run's alpha)"),
        ('calibrated_speedup', 'x:', 'predicted (calibration alpha)')):
      ax.plot(g, [np.nan if r[field] is None else r[field] for r in rows],
              style, label=label)
    for r in (r for r in rows if r['chosen']):
      ax.axvline(r['gamma'], color='gray', ls=':', lw=0.8)
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set(xticks=g, xlabel='gamma', ylabel='speed-up over baseline')
    ax.set_title(f'{pair[0]}, drafter {pair[1]}, t={t:g}', fontsize=9)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _cost(row):
  costs = (row.get('measured') or {}).get('costs')
  return '-' if costs is None else f"{costs['cost'][str(row['gamma'] + 1)]:.2f}"


SPEC = sweep.Spec(
    name='table2',
    title='Table 2: gamma, alpha and speed-up',
    about=__doc__.split('\n\n', 1)[1] + (
        '\nBatch 1. Measured speed-up = speculative over baseline tokens/s '
        "(the job's throughput_speedup; for greedy, where both outputs are "
        'identical, the walltime ratio). Predicted = Theorem 3.8 on the '
        "group's measured c and cost(gamma + 1) with the run's alpha, or "
        'with the calibration alpha (the column the gamma is chosen on). '
        'Paper: T5-XXL target, TPU-v4 (EnDe ~ en_de, CNNDM ~ synopsis), '
        'shown on every row of the drafter it names. The target is taken '
        'as it is: no widened-target cost (the last column predicts at '
        'T5-XXL cost instead).'),
    cells=cells,
    columns=(
        ('task', 'task'), ('t', table.temperature),
        ('drafter', 'drafter'), ('gamma', 'gamma'),
        ('chosen', lambda r: 'rule: chosen by the job' if _rule(r) else
         '**<- chosen**' if r['chosen'] else ''),
        ('alpha (calibration)', 'measured.calibration.alpha'),
        ('alpha (run)', 'alpha'), ('c', 'measured.costs.c'),
        ('cost(gamma+1)', _cost),
        ('predicted (calibration alpha)', 'calibrated_speedup'),
        ('predicted (run alpha)', 'predicted_speedup'),
        ('measured speed-up', 'throughput_speedup'),
        ('measured / predicted', 'measured_over_predicted'),
        ('identical (greedy)', table.identical),
        ('paper gamma / alpha / speed-up',
         lambda r: '-' if paper(r) is None else
         '{} / {:.2f} / {}x'.format(*paper(r))),
        ('predicted {profile}', table.on_profile)),
    num_examples=16,
    timing_repeats=3,
    predict=predict,
    plot=plot,
    measurements={'calibration': (calibration, CALIBRATION_FIELDS)},
)
