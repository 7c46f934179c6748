"""The hf spec, shrunk, end to end: ours vs HF transformers on one example.

Our figures must be the eval job's own (recomputed here from the cell's
records), HF's must be decodes of the examples the cell decoded: in
float32 (shrunk) HF's greedy rows are our baseline's, length for length;
a row that is not ours must be counted as differing.
"""

import json
import sys

import pytest

from specdec_jax.experiments import reproduce
from specdec_jax.experiments import sweep
from specdec_jax.experiments.specs import hf


pytestmark = pytest.mark.usefixtures('torch')


def test_hf_spec_times_hf_on_the_examples_the_cell_decoded(tmp_path):
  out = tmp_path / 'out'
  result = sweep.run(hf.SPEC, sweep.Options(
      shrink=True, work_dir=str(tmp_path)), out=str(out))
  [row] = result['rows']
  assert (row['task'], row['drafter'], row['gamma'], row['batch_size'],
          row['temperature'], row['activation_dtype']) == (
              'en_de', 'dec2', 2, 1, 0.0, 'float32')
  folder = tmp_path / 'hf' / 'shipped' / 'cells' / row['cell']
  records = [json.loads(x) for x in
             (folder / 'examples.jsonl').read_text().splitlines()]
  assert row['status'] == 'complete' and len(records) == row['examples'] == 1
  # Ours: the job's decode (batch 1: a record is a timed unit).
  base = (sum(r['baseline_length'] for r in records) /
          sum(r['baseline_batch_s'] for r in records))
  spec = (sum(r['speculative_length'] for r in records) /
          sum(r['speculative_batch_s'] for r in records))
  assert row['baseline_tokens_per_s'] == pytest.approx(base)
  assert row['speculative_tokens_per_s'] == pytest.approx(spec)
  h = row['measured']['hf']
  assert (h['examples'], h['repeats'], h['gamma'], h['dtype']) == (
      1, 1, 2, 'float32')
  for m in hf.METHODS:
    # float32: HF's greedy rows are our baseline's.
    assert h[m]['lengths'] == [r['baseline_length'] for r in records], m
    assert h[m]['differing'] == 0 and isinstance(h[m]['differing'], int)
    assert h[m]['tokens'] == sum(h[m]['lengths']) and h[m]['s'] > 0
    assert h[m]['tokens_per_s'] == pytest.approx(h[m]['tokens'] / h[m]['s'])
  gen, assisted = (h[m]['tokens_per_s'] for m in hf.METHODS)
  assert row['baseline_vs_generate'] == pytest.approx(base / gen)
  assert row['speculative_vs_assisted'] == pytest.approx(spec / assisted)
  assert row['ours_gain'] == pytest.approx(spec / base)
  assert row['hf_gain'] == pytest.approx(assisted / gen)
  md = out.with_suffix('.md').read_text()
  assert ('| baseline vs generate | ours speculative tok/s | HF assisted '
          'tok/s | speculative vs assisted |') in md
  assert json.loads(out.with_suffix('.json').read_text())['rows'] == [row]


class _Vocabulary:
  def decode(self, ids):
    return ' '.join(map(str, ids))


def test_an_hf_row_differs_by_its_text_or_its_length():
  """`compare` is what counts HF's differing rows: a row is ours only
  with our baseline's text and length (the end token counted)."""
  ours = {'baseline': '5 6', 'baseline_length': 3}
  row = [5, 6, 1, 0, 0]
  assert hf.compare(row, ours, _Vocabulary(), 1) == (3, False)
  assert hf.compare([5, 7, 1, 0, 0], ours, _Vocabulary(), 1) == (3, True)
  assert hf.compare(row, dict(ours, baseline_length=2), _Vocabulary(), 1) == (
      3, True)
  assert hf.compare([5, 6, 2, 3, 4], ours, _Vocabulary(), 1)[0] == 5  # no end


def test_without_torch_the_measurement_names_the_packages(monkeypatch):
  monkeypatch.setitem(sys.modules, 'torch', None)
  with pytest.raises(ImportError, match='torch and transformers'):
    hf._torch()  # pylint: disable=protected-access


def test_the_full_plan_is_one_cell_a_task_as_trained():
  for models in ('shipped', 'xxl_cost'):
    options = sweep.options_of(hf.SPEC, sweep.Options(models=models))
    cells = sweep.plan(hf.SPEC, options)
    assert [c.task for c in cells] == ['en_de', 'synopsis']
    for cell in cells:
      setup = sweep.cell_setup(reproduce.make_setup(models), cell, options)
      assert (setup.draft.kind, cell.drafter, setup.gamma, setup.batch.size,
              setup.sampling.temperature, setup.activation_dtype,
              setup.data.num_examples) == ('t5', 'dec2', hf.GAMMA, 1, 0.0,
                                      'bfloat16', 16)
      assert setup.target_widen_to is None and setup.draft.widen_to is None
      assert cell.measure == ('hf',)
