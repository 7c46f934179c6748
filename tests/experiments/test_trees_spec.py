"""The trees spec: chains and token trees as eval job cells.

Shrunk, the spec decodes a chain, a dec2 tree and a heads tree end to end:
greedy rows equal the baseline, the counters are those of a tree, the
results file has the spec's columns and `repredict` gives it back; its
full plan is eval job setups whose cell folders fit a file name.
"""

import json
import pathlib
import shutil

from specdec_jax import hardware
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.experiments import __main__ as cli
from specdec_jax.experiments import reproduce
from specdec_jax.experiments import specs
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table
from specdec_jax.experiments.specs import trees

TREE_KINDS = ('tree', 'heads_tree')


def _headers(md):
  [line] = [x for x in md.splitlines() if x.startswith('| task |')]
  return [h.strip() for h in line.strip('|').split('|')]


def test_the_trees_spec_runs_shrunk_end_to_end(tmp_path):
  spec = specs.get('trees')
  result = sweep.run(spec, sweep.Options(shrink=True, work_dir=str(tmp_path)),
                     profile=None, out=str(tmp_path / 'out'))
  rows = result['rows']
  assert {r['kind'] for r in rows} == {'t5', 'tree', 'heads_tree'}
  for r in rows:
    assert r['status'] == 'complete' and r['examples'] == 2
    assert r['temperature'] == 0 and r['differing_examples'] == 0, r['cell']
    shape = shape_lib.parse(r.get('tree') or f"chain:{r['gamma']}")
    assert r['gamma_used'] == {str(shape.depth): 2}
    tokens = 1 / r['target_calls_per_token']
    # A call commits its accepted drafts and one more token: at least one,
    # at most the tree's depth + 1.
    assert 1 <= tokens <= shape.depth + 1, r['cell']
    assert r['predicted_counters'] is None
  [heads] = [r for r in rows if r['kind'] == 'heads_tree']
  assert heads['measured']['head']['input_length'] == 128

  md = (tmp_path / 'out.md').read_text()
  want = [h for h, _ in spec.columns if '{profile}' not in h]
  assert _headers(md) == want
  assert sum(x.startswith('| en_de |') for x in md.splitlines()) == len(rows)

  # repredict without a profile gives the written file back exactly.
  copy = tmp_path / 'copy' / 'out.json'
  copy.parent.mkdir()
  shutil.copy(tmp_path / 'out.json', copy)
  cli.main(['repredict', str(copy), '--profile', 'none'])
  drop = lambda d: {k: v for k, v in d.items()
                    if k not in ('out', 'predicted_by')}
  written = json.loads((tmp_path / 'out.json').read_text())
  assert drop(json.loads(copy.read_text())) == drop(written)
  lines = lambda text: [x for x in text.splitlines() if 'recomputed' not in x]
  assert lines(copy.with_suffix('.md').read_text()) == lines(md)

  # On a profile: predicted from the counters at the verified width.
  cli.main(['repredict', str(copy), '--profile', hardware.H100])
  got = json.loads(copy.read_text())
  for r in got['rows']:
    p = r['predicted_counters']
    shape = shape_lib.parse(r.get('tree') or f"chain:{r['gamma']}")
    assert p['width'] == shape.verified_width(True) and p['speedup'] > 0
    assert ('c bytes / launches model' in p['label']) == (
        r['kind'] == 'heads_tree')
  assert _headers(copy.with_suffix('.md').read_text())[-1] == (
      f'predicted (counters) on {hardware.H100}')


def test_every_cell_of_the_full_spec_is_an_eval_setup():
  spec = specs.get('trees')
  options = sweep.options_of(spec, sweep.Options())
  models = reproduce.make_setup('shipped')
  cells = sweep.plan(spec, options)
  assert len(cells) == 38
  for cell in cells:
    assert len(cell.name.encode()) <= 255, cell.name  # a folder's name
    setup = sweep.cell_setup(models, cell, options)
    assert setup.data.num_examples == spec.num_examples
    if setup.draft.chooses_tree:  # "chosen 64": the job's choice
      assert setup.draft.tree_budget == trees.CHOSEN
      assert setup.gamma == trees.CHOSEN_DEPTH
    elif setup.draft.kind in TREE_KINDS:
      assert setup.gamma == shape_lib.parse(setup.draft.tree).depth
    else:
      assert setup.draft.kind in ('t5', 'heads') and setup.draft.tree is None


def test_a_chosen_trees_row_is_the_tree_the_job_decoded_with():
  """A "chosen N" cell's row names the tree the job chose and decoded with
  (its configured 'choose:N' beside it), so its nodes and prediction are
  that tree's; a choice the record cannot resolve (its file damaged) leaves
  them empty rather than failing the results."""
  [cell] = [c for c in sweep.plan(specs.get('trees'), sweep.Options())
            if c.labels['drafting'] == f'chosen {trees.CHOSEN}'][:1]
  chosen = 'beam:4,2,3'  # 4 + 8 + 8 nodes, depth 3
  summary = {'gamma': 3, 'temperature': 0.0, 'target_calls_per_token': 0.4,
             'gamma_choices': [{'gamma': 3, 'tree': chosen}]}
  row = table.row_of(cell, summary, {})
  assert (row['tree'], row['configured_tree']) == (
      chosen, f'choose:{trees.CHOSEN}')
  assert (row['gamma'], row['configured_gamma']) == (3, trees.CHOSEN_DEPTH)
  assert trees._nodes(row) == 20
  trees.SPEC.predict(row, hardware.load(hardware.H100))
  assert row['predicted_counters']['width'] == 21

  # No speculation chosen (gamma 0): no tree, no prediction.
  none = dict(summary, gamma=0, target_calls_per_token=1.0, gamma_choices=[
      {'gamma': 0, 'tree': 'dynamic:0.0', 'why': 'no speculation: ...'}])
  row = table.row_of(cell, none, {})
  assert row['gamma'] == 0 and trees._nodes(row) == '-'
  trees.SPEC.predict(row, hardware.load(hardware.H100))
  assert row['predicted_counters'] is None

  damaged = dict(summary, gamma_choices=[{'file': 'gamma_choice.json',
                                          'damaged': 'not JSON'}])
  row = table.row_of(cell, damaged, {})
  assert row['tree'] == f'choose:{trees.CHOSEN}' and trees._nodes(row) == '-'
  trees.SPEC.predict(row, hardware.load(hardware.H100))
  assert row['predicted_counters'] is None


def test_the_estimated_trees_are_those_choose_picks_on_the_estimates():
  """Each task's "estimated 64" tree is `shape.choose`'s on the stored
  rank probabilities (64 test rows a task, those of the "dynamic N"
  rows) and the ESTIMATED H100 costs; on those costs it is predicted to
  beat the spec's best beam (beam:8,4,12/64) with fewer levels."""
  meta = json.loads((pathlib.Path(__file__).parents[2] / 'results' /
                     'retired' / 'trees.json').read_text())['meta']
  costs = trees.estimated_costs()
  for task, probs in meta['rank_probs'].items():
    probs = shape_lib.nonincreasing(probs)
    shape, rate = shape_lib.choose(probs, costs, max_nodes=trees.CHOSEN,
                                   max_depth=trees.CHOSEN_DEPTH)
    assert shape.spec == trees.ESTIMATED[task], task
    beam = shape_lib.parse('beam:8,4,12/64')
    assert shape.depth < beam.depth and rate > 1e3 * beam.expected_tokens(
        probs) / costs.iteration_ms(beam), task
