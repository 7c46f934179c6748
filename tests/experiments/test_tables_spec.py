"""The Table 2 and Table 3 specs, shrunk to tiny rows, end to end (Table 2
on the shipped models and on them widened to the paper's costs)."""

import json

import pytest

from specdec_jax import paper as published
from specdec_jax import theory
from specdec_jax import hardware
from specdec_jax.bench import at_xxl_cost
from specdec_jax.bench import report
from specdec_jax.experiments import __main__ as cli
from specdec_jax.experiments import reproduce
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table
from specdec_jax.experiments.specs import table2
from specdec_jax.experiments.specs import table3


def _column(spec, header):
  [column] = [c for h, c in spec.columns if h == header]
  return column


def _run(spec, tmp_path):
  out = tmp_path / 'out'
  profile = hardware.load(hardware.H100) or None
  result = sweep.run(spec, sweep.Options(shrink=True, work_dir=str(tmp_path)),
                     profile=profile, out=str(out))
  return result, out, profile


def _check_repredict(spec, out, profile):
  """Repredicting the written json reproduces its rows and its md."""
  written = report.read_json(out.with_suffix('.json'))
  again = table.repredict(spec, report.read_json(out.with_suffix('.json')),
                          profile)
  assert again['rows'] == written['rows']
  assert table.markdown(spec, again) == out.with_suffix('.md').read_text()


def test_cells_offer_ngrams_only_with_train_data():
  names = lambda **kw: [(c.drafter, c.changes['temperature'])
                        for c in table3.cells(sweep.Options(**kw), ('en_de',))]
  shipped = names()
  assert {d for d, _ in shipped} == {'lookup', 'dec2', 'small'}
  assert shipped[:2] == [('lookup', 0.0), ('lookup', 1.0)]
  with_data = {d for d, _ in names(data_dir='/data')}
  assert with_data == {'unigram', 'bigram', 'lookup', 'dec2', 'small'}
  assert {d for d, _ in names(models='mini')} == {
      'unigram', 'bigram', 'lookup', 'small', 'base', 'large'}
  # Table 2: every gamma of the sweep per (task, T5 drafter, temperature).
  # And one cell per group at the gamma the job's rule picks.
  cells = table2.cells(sweep.Options(), ('en_de', 'synopsis'))
  assert len(cells) == 2 * 2 * 2 * (table2.MAX_GAMMA + 1)
  assert [c.changes['gamma'] for c in cells[:table2.MAX_GAMMA]] == list(
      range(table2.MAX_GAMMA, 0, -1))
  assert [c.changes.get('batch_gamma') for c in cells].count('always') == 8
  assert all(c.measure == ('costs', 'calibration') for c in cells)


def test_table3_spec_alpha_next_to_the_paper(tmp_path):
  result, out, profile = _run(table3.SPEC, tmp_path)
  rows = result['rows']
  assert [(r['drafter'], r['temperature']) for r in rows] == [
      ('lookup', 0.0), ('lookup', 1.0), ('small', 0.0), ('small', 1.0)]
  paper = _column(table3.SPEC, 'paper alpha')
  on_profile = _column(table3.SPEC, 'predicted {profile}, t=0 (gamma)')
  for r in rows:
    assert r['status'] == 'complete' and r['gamma_used'] == {'4': 2}
    assert 0 <= r['alpha'] <= 1
    # Greedy speculative outputs are the baseline's; sampled ones are not
    # compared.
    assert r['differing_examples'] == (0 if r['temperature'] == 0 else None)
    ref = published.TABLE3['EnDe'].get(r['drafter'])
    assert table.cell(r, paper) == (
        '-' if ref is None else f"{ref[int(r['temperature'])]:.2f}")
    if r['temperature'] == 1:
      assert table.cell(r, on_profile) == '-'
  # The drafters of a temperature share one baseline decode (the sweep's
  # groups): the same baseline figure in both rows, cells listed in order.
  for t in (0.0, 1.0):
    lookup, t5 = [r for r in rows if r['temperature'] == t]
    assert lookup['baseline_tokens_per_s'] == t5['baseline_tokens_per_s']
  small = rows[2]
  assert table.cell(small, paper) == '0.75'
  if profile is not None:
    assert small['predicted_on_profile'] == at_xxl_cost.predict(
        profile, small['alpha'], 'small')
    assert table.cell(small, on_profile) == at_xxl_cost.cell(
        small['predicted_on_profile'])
  _check_repredict(table3.SPEC, out, profile)


@pytest.fixture(scope='module')
def table2_run(tmp_path_factory):
  """Table 2 shrunk on the shipped models: (result, out, profile, work)."""
  work = tmp_path_factory.mktemp('table2')
  return _run(table2.SPEC, work) + (work,)


def test_table2_spec_chooses_gamma_by_theorem_3_8(table2_run):
  result, out, profile, tmp_path = table2_run
  *rows, rule = result['rows']
  assert [(r['drafter'], r['temperature'], r['gamma']) for r in rows] == [
      ('small', 0.0, 2), ('small', 0.0, 1)]
  # The rule's row: decoded at the argmax of Theorem 3.8 on the costs and
  # alpha the job measured (0: no speculation where even the best is
  # predicted slower), recomputed here from what the choice recorded.
  [choice] = rule['gamma_choices']
  got = choice['profile']
  cost, [c] = got['cost']['1'], got['c']['1'].values()
  at = {g: theory.walltime_improvement(
      theory.clamp_alpha(choice['alpha']), g, c,
      target_cost_ratio=cost[str(g + 1)]) for g in (1, 2)}
  best = max(at, key=at.get)
  assert rule['gamma'] == (best if at[best] >= 1 else 0)
  assert rule['configured_gamma'] == 2 and rule['batch_gamma'] == 'always'
  assert rule['gamma_used'] == {str(rule['gamma']): 2}
  assert rule['status'] == 'complete' and rule['differing_examples'] == 0
  # One group: one costs and one calibration measurement, shared.
  measured = rows[0]['measured']
  assert set(measured) == {'costs', 'calibration'}
  assert all(r['measured'] == measured for r in rows)
  files = sorted(p.name.split('-')[0] for p in (
      tmp_path / 'table2' / 'shipped' / 'measurements').iterdir())
  assert files == ['calibration', 'costs']
  alpha, costs = measured['calibration']['alpha'], measured['costs']
  paper = _column(table2.SPEC, 'paper gamma / alpha / speed-up')
  for r in rows:
    assert r['status'] == 'complete' and r['differing_examples'] == 0
    assert r['gamma_used'] == {str(r['gamma']): 2}
    # Theorem 3.8 with the calibration alpha, c and cost(gamma + 1).
    assert r['calibrated_speedup'] == pytest.approx(
        theory.walltime_improvement(
            alpha, r['gamma'], costs['c'],
            target_cost_ratio=costs['cost'][str(r['gamma'] + 1)]), rel=1e-9)
    assert table.cell(r, paper) == '7 / 0.75 / 3.4x'
    assert published.TABLE2['EnDe', 0]['small'] == (7, .75, 3.4)
  # The chosen gamma: the argmax of the prediction over the swept gammas.
  [chosen] = [r for r in rows if r['chosen']]
  assert chosen['calibrated_speedup'] == max(
      r['calibrated_speedup'] for r in rows)
  assert {r['chosen_gamma'] for r in rows} == {chosen['gamma']}
  assert '**<- chosen**' in out.with_suffix('.md').read_text()
  assert out.with_suffix('.png').stat().st_size > 0
  assert json.loads(out.with_suffix('.json').read_text())['rows'] == (
      rows + [rule])
  _check_repredict(table2.SPEC, out, profile)


def test_table2_runs_on_the_shipped_models_at_xxl_cost(table2_run, tmp_path):
  """`run table2 --models xxl_cost --shrink` plans and decodes on the CPU
  (the GPU owner's headline command, shrunk): its drafter is widened
  function-preservingly when it loads, so the row's alpha and outputs are
  the shipped run's, while the job's identity names the widening."""
  shipped = table2_run[0]['rows'][0]
  options = sweep.Options(models='xxl_cost', shrink=True)
  cells = sweep.plan(table2.SPEC, sweep.options_of(table2.SPEC, options))
  assert [c.name for c in cells] == [r['cell'] for r in table2_run[0]['rows']]
  out = tmp_path / 'out'
  result = cli.main(['run', 'table2', '--models', 'xxl_cost', '--shrink',
                     '--only', shipped['cell'], '--work_dir', str(tmp_path),
                     '--out', str(out)])
  [row] = result['rows']
  assert row['status'] == 'complete' and row['differing_examples'] == 0
  assert row['speculative_tokens'] == shipped['speculative_tokens']
  assert row['alpha'] == pytest.approx(shipped['alpha'], abs=1e-6)
  assert row['measured']['calibration']['alpha'] == pytest.approx(
      shipped['measured']['calibration']['alpha'], abs=1e-6)
  run = json.loads((tmp_path / 'table2' / 'xxl_cost' / 'cells' /
                    row['cell'] / 'run.json').read_text())
  assert run['identity']['draft_widen_to'] == (
      reproduce.XXL_COST_SHRUNK['small'])
  _check_repredict(table2.SPEC, out, hardware.load(hardware.H100))
