"""The batches spec, shrunk to tiny rows, end to end."""

import json

from specdec_jax import theory
from specdec_jax.experiments import sweep
from specdec_jax.experiments.specs import batches


def test_batches_spec_runs_fixed_and_streamed_batches(tmp_path):
  out = tmp_path / 'out'
  result = sweep.run(batches.SPEC, sweep.Options(
      shrink=True, work_dir=str(tmp_path)), out=str(out))
  rows = result['rows']
  assert [(r['batch_size'], r['batching']) for r in rows] == [
      (2, 'fixed'), (2, 'stream')]
  fixed, stream = rows
  for r in rows:
    assert r['status'] == 'complete' and r['differing_examples'] == 0
    assert r['gamma_used'] == {'2': 2}
    # Theorem 3.8 on the cell's own cost(3) and c, at its alpha.
    costs = r['measured']['costs']
    assert costs['batch'] == 2 and sorted(costs['cost']) == ['1', '2', '3']
    assert r['predicted_speedup'] == theory.walltime_improvement(
        min(max(r['alpha'], 0.0), 1.0), 2, costs['c'],
        target_cost_ratio=costs['cost']['3'])
  # Greedy: both batchings decode the same outputs.
  assert fixed['speculative_tokens'] == stream['speculative_tokens'] == (
      fixed['baseline_tokens'])
  md = out.with_suffix('.md').read_text()
  assert '| measured speed-up | predicted |' in md
  assert json.loads(out.with_suffix('.json').read_text())['rows'] == rows


def test_the_full_batches_plan_compares_draft_lengths_at_batch_8():
  options = sweep.options_of(batches.SPEC, sweep.Options())
  at_8 = [c for c in sweep.plan(batches.SPEC, options)
          if c.changes['batch_size'] == 8 and c.task == 'en_de'
          and c.changes['temperature'] == 0]
  assert [(c.changes['batching'], c.changes['batch_gamma'],
           c.changes.get('draft_confidence', 0)) for c in at_8] == [
               ('fixed', 'config', 0), ('stream', 'config', 0),
               ('stream', 'config', batches.CONFIDENCE),
               ('stream', 'profile', 0)]
