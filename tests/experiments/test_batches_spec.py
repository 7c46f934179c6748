"""The batches spec, shrunk to tiny rows, end to end."""

import json

from specdec_jax.experiments import sweep
from specdec_jax.experiments.specs import batches


def test_batches_spec_runs_fixed_stream_and_the_profile_choice(tmp_path):
  out = tmp_path / 'out'
  result = sweep.run(batches.SPEC, sweep.Options(
      shrink=True, work_dir=str(tmp_path)), out=str(out))
  rows = result['rows']
  assert [(r['batch_size'], r['batching'], r['batch_gamma']) for r in rows
          ] == [(2, 'fixed', 'config'), (2, 'stream', 'config'),
                (2, 'stream', 'profile')]
  for r in rows:
    assert r['status'] == 'complete' and r['differing_examples'] == 0
  fixed, stream, chosen = rows
  assert fixed['gamma_used'] == stream['gamma_used'] == {'2': 2}
  # The job's own choice, as the job wrote it: the gamma it decoded with.
  [choice] = chosen['gamma_choices']
  assert chosen['gamma_used'] == {str(choice['gamma']): 2}
  assert fixed['predicted_speedup'] > 0 and chosen['predicted_speedup'] is (
      None if choice['gamma'] == 0 else chosen['predicted_speedup'])
  md = out.with_suffix('.md').read_text()
  assert '| measured speed-up | predicted |' in md
  assert json.loads(out.with_suffix('.json').read_text())['rows'] == rows
