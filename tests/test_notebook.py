"""Executes the notebooks under notebooks/ end to end with nbclient.

A cell that raises fails the test (nbclient's CellExecutionError). The
walkthrough asserts exactness itself; here we also check that those cells ran
and printed their confirmations, and that the plots were drawn.

The kernel is `python3`: ipykernel provides it for the interpreter running the
tests (jupyter_client runs a kernel spec's `python` as `sys.executable`).
"""

import functools
import json
import pathlib

import nbclient
import nbformat
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / 'notebooks'
WALKTHROUGH = NOTEBOOKS / 'speculative_decoding_walkthrough.ipynb'
ALL_NOTEBOOKS = sorted(NOTEBOOKS.glob('*.ipynb'))


@functools.lru_cache(maxsize=None)
def executed(path: pathlib.Path):
  """Runs every cell of the notebook at `path` (cwd = its folder), once."""
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
      nb, timeout=600, kernel_name='python3',
      # A cell's output that comes late on a loaded machine is an error,
      # not output missing from what the tests read.
      iopub_timeout=60, raise_on_iopub_timeout=True,
      resources={'metadata': {'path': str(path.parent)}})
  client.execute()
  return nb


def output_text(nb) -> str:
  """Everything the code cells printed or displayed as text."""
  parts = []
  for cell in nb.cells:
    for output in cell.get('outputs', []):
      if output.output_type == 'stream':
        parts.append(output.text)
      elif 'text/plain' in output.get('data', {}):
        parts.append(output.data['text/plain'])
  return '\n'.join(parts)


def test_walkthrough_exists():
  assert WALKTHROUGH in ALL_NOTEBOOKS


@pytest.mark.parametrize('path', ALL_NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  # nbformat 4.5 cell ids, in the file (`nbformat.read` adds missing ones
  # with a warning today; the nbformat versions to come refuse the file).
  raw = json.loads(path.read_text())
  assert all('id' in cell for cell in raw['cells']), f'{path.name}: cell ids'
  for cell in nb.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, (
          f'{path.name}: clear the outputs before committing')


@pytest.mark.parametrize('path', ALL_NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
  nb = executed(path)
  errors = [o for cell in nb.cells for o in cell.get('outputs', [])
            if o.output_type == 'error']
  assert not errors


def test_walkthrough_demonstrates_exactness_and_theory():
  nb = executed(WALKTHROUGH)
  text = output_text(nb)
  # Section 1: one verification step, then a decode with its statistics.
  assert 'total variation to p' in text
  assert 'mean_accepted_length' in text and 'acceptance_rate' in text
  # Section 2: both exactness checks ran to their confirmation.
  assert ('EXACT: greedy speculative output == baseline, token for token, '
          'for gamma in [1, 4, 7]') in text
  assert 'EXACT: sampled speculative outputs follow the target distribution' \
      in text
  # Section 3: Table 1 of the paper, then the measured CPU cost curve.
  assert '0.9     10    1.60 / 1.60           6.86 / 6.86' in text
  results = WALKTHROUGH.parents[1] / 'results'
  plots = 3
  if (results / 'costs.json').exists():
    assert 'optimal gamma, measured cost' in text
    plots += 1
  else:
    assert 'written by scripts/benchmark_costs.py' in text
  # Section 4 plots the table2 spec's committed results (every swept
  # cell, the chosen gamma marked), or says what writes them.
  if (results / 'table2' / 'shipped.json').exists():
    assert 'gamma  alpha  predicted  measured' in text
    assert '<- chosen' in text
    plots += 1
  else:
    assert ('shipped.json not found: it is written by `python -m '
            'specdec_jax.experiments run table2`') in text
  # Section 5: the shipped models on real text, exact.
  assert 'EXACT on real text: identical to the baseline' in text
  assert 'Dieses Paket ist Teil der KDE Frameworks 5.' in text  # reference
  images = [o for cell in nb.cells for o in cell.get('outputs', [])
            if 'image/png' in o.get('data', {})]
  assert len(images) == plots
