"""The numerics spec, shrunk, end to end: the four cells decode as asked.

Each cell must reach the eval job with its activation dtype and its
baseline's shapes (the job's own summary says which it ran), and every
greedy row that differs must be diagnosed: a near tie, never a mismatch.
"""

import json

from specdec_jax.experiments import sweep
from specdec_jax.experiments.specs import numerics


def test_numerics_spec_runs_both_dtypes_with_both_baselines(tmp_path):
  out = tmp_path / 'out'
  result = sweep.run(numerics.SPEC, sweep.Options(
      shrink=True, work_dir=str(tmp_path)), out=str(out))
  rows = result['rows']
  assert [(r['activation_dtype'], r['same_shape_baseline']) for r in rows] == [
      ('float32', False), ('float32', True), ('bfloat16', False),
      ('bfloat16', True)]
  cells = tmp_path / 'numerics' / 'shipped' / 'cells'
  for r in rows:
    ran = json.loads((cells / r['cell'] / 'summary.json').read_text())
    assert ran['activation_dtype'] == r['activation_dtype']
    assert ran.get('same_shape_baseline', False) == r['same_shape_baseline']
    assert r['status'] == 'complete' and r['gamma_used'] == {'2': 2}
    assert r['mismatches'] == 0
    assert r['near_ties'] == r['differing_examples']  # each one diagnosed
  # float32: every decode gives the same greedy tokens.
  assert {r['baseline_tokens'] for r in rows[:2]} == {
      r['speculative_tokens'] for r in rows[:2]}
  md = out.with_suffix('.md').read_text()
  assert '| activations | baseline | identical (greedy) | near ties |' in md
  assert '| float32 | 3 tokens a call | 2/2 |' in md


def test_the_full_numerics_plan_is_two_dtypes_by_two_baselines():
  options = sweep.options_of(numerics.SPEC, sweep.Options(models='paper'))
  cells = [c for c in sweep.plan(numerics.SPEC, options)
           if c.task == 'en_de']
  assert [(c.drafter, c.changes['gamma'], c.changes['activation_dtype'],
           c.changes['same_shape_baseline']) for c in cells] == [
               ('small', 4, 'float32', False), ('small', 4, 'float32', True),
               ('small', 4, 'bfloat16', False),
               ('small', 4, 'bfloat16', True)]
