"""The draft_free, lookahead and heads specs, shrunk, end to end.

Each spec decodes its shrunk cells with the eval job: greedy rows equal the
baseline, the counters are possible ones, the results file has the spec's
columns, and on a profile each row's predicted figure is the one its
counters give (tokens per target call / (cost(width) + drafter calls x c)).
Their full plans are eval job setups of the kinds they name.
"""

import collections

import pytest

from specdec_jax import shipped
from specdec_jax import hardware
from specdec_jax.drafters import heads as heads_lib
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.experiments import reproduce
from specdec_jax.experiments import specs
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table


def _headers(md):
  [line] = [x for x in md.splitlines() if x.startswith('| task |')]
  return [h.strip() for h in line.strip('|').split('|')]


def _run(name, tmp_path):
  """Runs a spec shrunk (no profile); checks what every row must hold and
  the table's columns; returns (spec, rows, rows repredicted on the H100
  profile, that profile)."""
  spec = specs.get(name)
  out = tmp_path / 'out'
  result = sweep.run(spec, sweep.Options(shrink=True, work_dir=str(tmp_path)),
                     profile=None, out=str(out))
  rows = result['rows']
  for r in rows:
    assert r['status'] == 'complete' and r['examples'] == 2, r['cell']
    assert r['temperature'] == 0 and r['differing_examples'] == 0, r['cell']
    depth = shape_lib.parse(r.get('tree') or f"chain:{r['gamma']}").depth
    assert r['gamma_used'] == {str(depth): 2}
    tokens = 1 / r['target_calls_per_token']
    # A target call commits its accepted drafts and one more token.
    assert 1 <= tokens <= depth + 1, r['cell']
    assert r['predicted_counters'] is None
  md = out.with_suffix('.md').read_text()
  assert _headers(md) == [h for h, _ in spec.columns if '{profile}' not in h]
  assert sum(x.startswith('| en_de |') for x in md.splitlines()) == len(rows)

  profile = hardware.load(hardware.H100)
  table.write(spec, table.repredict(spec, result, profile), tmp_path / 'h100')
  md = (tmp_path / 'h100.md').read_text()
  assert _headers(md)[-1] == f'predicted (counters) on {hardware.H100}'
  return spec, rows, result['rows'], profile


def _check_prediction(row, profile, width, calls, c):
  p = row['predicted_counters']
  assert p['width'] == width and p['c'] == pytest.approx(c), row['cell']
  cost, _ = profile.cost_at(width)
  assert p['speedup'] == pytest.approx(
      1 / row['target_calls_per_token'] / (cost + calls * c))


def test_draft_free_spec_counts_the_draft_model_in_the_jobs_decodes(
    tmp_path):
  _, rows, predicted, profile = _run('draft_free', tmp_path)
  assert [(r['kind'], r['drafting']) for r in rows] == [
      ('lookup', 'lookup'), ('combined', 'combined')]
  lookup, combined = predicted
  assert lookup['measured'] == {}  # copying: no draft model, c = 0
  _check_prediction(lookup, profile, lookup['gamma'] + 1, 0, 0.0)
  counted = combined['measured']['draft_calls']
  # The replay is the job's decode: the same target calls.
  assert counted['target_calls'] == round(
      combined['target_calls_per_token'] * combined['speculative_tokens'])
  assert 0 < counted['draft_model_calls']
  _check_prediction(combined, profile, combined['gamma'] + 1,
                    counted['draft_model_calls'] / counted['target_calls'],
                    profile.c_of('dec2')[0])


def test_lookahead_spec_predicts_pass_at_its_call_width(tmp_path):
  _, rows, predicted, profile = _run('lookahead', tmp_path)
  assert [(r['kind'], r['gamma'], r['draft_checkpoint']) for r in rows] == [
      ('pass', 2, 'shipped:lookahead/en_de'),
      ('pass_tree', 1, 'shipped:lookahead/en_de')]
  # One call, no drafter call: 2 gamma + 1 tokens, (gamma + 1)^2 in the
  # tree layout (a group of gamma slots after last and each draft): 5 and
  # 4 here (each by the other's rule: 9 and 3).
  for r in predicted:
    g = r['gamma']
    _check_prediction(r, profile, (g + 1) ** 2 if r['kind'] == 'pass_tree'
                      else 2 * g + 1, 0, 0.0)


def test_heads_spec_prices_head_steps_by_the_bytes_model(tmp_path):
  _, rows, predicted, profile = _run('heads', tmp_path)
  assert [r['kind'] for r in rows] == ['heads', 'heads_tree']
  config = shipped.config('target')
  _, head = heads_lib.load_head(shipped.resolve('shipped:heads/en_de'),
                                config)
  for r in predicted:
    m = r['measured']['head']
    assert (m['mlp_dim'], m['cross_attention'], m['input_length']) == (
        head.mlp_dim, head.cross_attention, 128)
    c = heads_lib.head_step_c(profile, config, head, 128)['c']
    shape = shape_lib.parse(r.get('tree') or f"chain:{r['gamma']}")
    assert 'bytes / launches' in r['predicted_counters']['c_how']
    _check_prediction(r, profile, shape.verified_width(True), shape.depth, c)
  assert predicted[1]['predicted_counters']['width'] == shape_lib.parse(
      'beam:2,1,2').verified_width(True) > predicted[0]['gamma'] + 1


def test_the_full_plans_are_eval_setups_of_their_kinds():
  models = reproduce.make_setup('shipped')
  want = {
      'draft_free': {('t5', 'shipped:dec2', 0.0): 4, ('lookup', None, 0.0): 4,
                     ('cache', None, 0.0): 4,
                     ('combined', 'shipped:dec2', 0.0): 4,
                     ('t5', 'shipped:dec2', 0.5): 4},
      'lookahead': {('pass', 'shipped:lookahead/en_de', 0.0): 16,
                    ('pass', 'shipped:lookahead/synopsis', 0.0): 16,
                    ('pass_tree', 'shipped:lookahead/en_de', 0.0): 8,
                    ('pass_tree', 'shipped:lookahead/synopsis', 0.0): 8,
                    ('lookup', None, 0.0): 4},
      'heads': {('heads', 'shipped:heads/en_de', 0.0): 10,
                ('heads', 'shipped:heads/synopsis', 0.0): 10,
                ('heads_tree', 'shipped:heads/en_de', 0.0): 2,
                ('heads_tree', 'shipped:heads/synopsis', 0.0): 2,
                ('t5', 'shipped:dec2', 0.0): 4},
  }
  for name, kinds in want.items():
    spec = specs.get(name)
    options = sweep.options_of(spec, sweep.Options())
    got = collections.Counter()
    for cell in sweep.plan(spec, options):
      assert len(cell.name.encode()) <= 255, cell.name
      setup = sweep.cell_setup(models, cell, options)
      assert setup.batch.size == 1 and setup.draft.output_cache is None
      assert setup.data.num_examples == spec.num_examples
      if setup.draft.kind in ('pass', 'heads'):
        assert setup.draft.tree is None and setup.gamma <= 8
      got[setup.draft.kind, setup.draft.checkpoint, setup.draft.confidence] += 1
    assert dict(got) == kinds, name
