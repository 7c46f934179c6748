"""tests/fuzz_exactness.py, the random-point exactness run: its cases pass
on the code as it is and fail on a planted bug; its mesh cases run. ~2.5 min
on 2 cores (marked slow): the default run checks the same properties at
chosen points."""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import fuzz_exactness
from specdec_jax import speculative


@pytest.mark.slow
def test_random_cases_pass_and_a_planted_bug_fails(tmp_path, monkeypatch):
  ok = tmp_path / 'ok'
  assert fuzz_exactness.main(['--greedy', '4', '--law', '2', '--out',
                              str(ok)]) == 0
  summary = json.loads(ok.with_suffix('.json').read_text())
  assert summary['cases'] == 6 and summary['failed'] == []
  assert len(ok.with_suffix('.jsonl').read_text().splitlines()) == 6
  # The token after a rejected draft one off the verifier's: greedy rows
  # differ from the baseline's, and sampled ones leave the target's law.
  real = speculative.verify

  def off_by_one_after_a_rejection(rng, drafts, q, p, sampling):
    n, accepted, token, beta = real(rng, drafts, q, p, sampling)
    token = jnp.where(n < drafts.shape[1], (token + 1) % p.shape[-1], token)
    return n, accepted, token, beta

  monkeypatch.setattr(speculative, 'verify', off_by_one_after_a_rejection)
  jax.clear_caches()  # no program traced before the patch
  bug = tmp_path / 'bug'
  assert fuzz_exactness.main(['--greedy', '4', '--law', '2', '--kinds',
                              't5,bigram', '--out', str(bug)]) == 1
  failed = json.loads(bug.with_suffix('.json').read_text())['failed']
  assert {c['mode'] for c in failed} == {'greedy', 'law'}, failed
  assert all(c['kind'] in ('t5', 'bigram') for c in failed)
  assert bug.with_suffix('.md').read_text().count('Failed: ') == len(failed)


@pytest.mark.slow
def test_mesh_cases_run_as_a_program(tmp_path):
  """Mesh cases (greedy and law) need XLA's 8 simulated devices before jax starts: the
  script asks for them when run as a program (this process keeps one)."""
  out = tmp_path / 'mesh'
  proc = subprocess.run(
      [sys.executable, str(pathlib.Path(fuzz_exactness.__file__)),
       '--greedy', '0', '--law', '0', '--mesh', '3', '--mesh_law', '1',
       '--kinds',
       'pass,heads_tree,t5', '--out', str(out)], capture_output=True,
      text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads(out.with_suffix('.json').read_text())
  assert summary['statuses'] == {'ok': 4}
  assert sum(summary['meshes'].values()) == 3 and summary['mesh_laws'] == 1
  with pytest.raises(SystemExit):  # imported after jax started: refused
    fuzz_exactness.main(['--mesh', '1', '--greedy', '0', '--law', '0',
                         '--out', str(tmp_path / 'refused')])
