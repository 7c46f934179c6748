"""The profile spec, shrunk, end to end: a hardware profile measured here.

The spec is the older device run's first phase as a sweep spec: its cells
are measured (nothing decoded) and its finish writes the profile that
`hardware.load` reads and `hardware.predict` prices on. Timings are only
checked to be the ones the profile holds, never for their values.
"""

import json
import math
import types

import pytest

from specdec_jax import checkpoints
from specdec_jax import hardware
from specdec_jax import measure
from specdec_jax import theory
from specdec_jax.bench import flags
from specdec_jax.experiments import sweep
from specdec_jax.experiments.specs import profile


def test_profile_spec_writes_a_loadable_hardware_profile(tmp_path, gcs,
                                                        monkeypatch):
  """Into a gs:// work folder (the suite's local GCS): the shrunk results
  and the profile beside them are written there, and named there; the
  `--profile` flag reads the profile there."""
  out = f'{gcs}/work/profile/shipped/results'
  read = lambda suffix: checkpoints.read_bytes(out + suffix).decode()
  repeats, timed = [], measure.time_alternating
  monkeypatch.setattr(measure, 'time_alternating', lambda calls, n=1, **k: (
      repeats.append(n) or timed(calls, n, **k)))
  result = sweep.run(profile.SPEC, sweep.Options(
      shrink=True, work_dir=f'{gcs}/work'))
  rows = result['rows']
  # Every timed loop the spec's timing_repeats times (shrunk: once).
  assert repeats and set(repeats) == {1}, repeats
  assert result['failed'] == [] and [r['measurement'] for r in rows] == [
      't(k)', 'c', 'c', 'tree level']
  assert all('status' not in r and 'alpha' not in r for r in rows)  # no job
  # Nothing decoded, so how busy other processes kept the machine is the
  # cell's whole span's, said under the table's Machine line (not known
  # where /proc/stat is missing: no line).
  loads = [r.get('other_load_cores') for r in rows]
  if measure._cpu_seconds() is None:  # pylint: disable=protected-access
    assert loads == [None] * len(rows)
  else:
    assert all(x is not None and x >= 0 for x in loads), loads
    assert (f'Other processes while timing: {max(loads):.2f} cores busy'
            in read('.md'))
  target, lookup, small, tree = (r['measured'] for r in rows)
  assert result['hardware_profile'] == out + '.profile.json'
  # The profile as `--profile` reads it there; a copy here as `load` does.
  p = flags.profile_of(types.SimpleNamespace(profile=out + '.profile.json'))
  path = tmp_path / 'profile.json'
  path.write_text(read('.profile.json'))
  assert hardware.load(str(path)) == p
  t1 = target['target']['t_ms']['1']
  assert p.t1_ms == t1 > 0 and p.cost == {1: {1: 1.0, 2: p.cost[1][2],
                                              3: p.cost[1][3]}}
  assert math.isclose(p.cost[1][3], target['target']['t_ms']['3'] / t1)
  assert p.c == {1: {'lookup': lookup['drafter']['ms'] / t1,
                     'small': small['drafter']['ms'] / t1}}
  floor = target['target']['floor']
  assert p.floor_ms == floor['floor_ms'] == (
      1e3 * floor['step_bytes'] / p.bandwidth) and p.bandwidth > 0
  assert p.launch_ms == min(lookup['drafter']['ms'], small['drafter']['ms'])
  levels = json.loads(path.read_text())['tree_level_ms']
  assert levels == {'beam:2,2,3': tree['tree_level']['ms']} and (
      tree['tree_level']['levels'] == 2 and levels['beam:2,2,3'] > 0)
  # What predict reads of it: Theorem 3.8 on the measured cost(3) and c.
  pred = hardware.predict(p, alpha=0.5, gamma=2, drafter='small')
  assert math.isclose(pred.speedup, theory.walltime_improvement(
      0.5, 2, p.c[1]['small'], target_cost_ratio=p.cost[1][3]))
  md = read('.md')
  assert '| measured | drafter | tree | ms | / t(1) |' in md
  assert 'nothing decoded' in md and 'PREDICTED' not in md


def test_the_full_profile_times_the_paper_ks_every_drafter_and_two_trees():
  options = sweep.options_of(profile.SPEC, sweep.Options(models='xxl_cost'))
  cells = sweep.plan(profile.SPEC, options)
  assert [(c.labels['measurement'], c.drafter, dict(c.changes))
          for c in cells if c.labels['measurement'] != 'c'] == [
              ('t(k)', 'dec2', {'max_gamma': 64}),
              ('tree level', 'dec2', {'drafter': 'tree', 'gamma': 12,
                                      'tree': 'beam:8,4,12/64'}),
              ('tree level', 'dec2', {'drafter': 'tree', 'gamma': 8,
                                      'tree': 'beam:4,2,8'})]
  assert profile.KS == (1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33, 61, 65)
  assert {c.drafter for c in cells
          if c.labels['measurement'] == 'c'} >= {'dec2', 'small', 'lookup'}


def test_a_bad_profile_file_is_named(tmp_path, gcs):
  """`--profile` at a file that is missing, not JSON or not a profile:
  an error naming the file, local or gs://."""
  flag = lambda path: flags.profile_of(types.SimpleNamespace(profile=path))
  with pytest.raises(FileNotFoundError, match=f'No file at {gcs}/none.json'):
    flag(f'{gcs}/none.json')
  with pytest.raises(FileNotFoundError, match='no hardware profile'):
    flag(str(tmp_path / 'none.json'))
  for folder in (gcs, str(tmp_path)):
    checkpoints.write_bytes(f'{folder}/bad.json', b'{"name": ')
    with pytest.raises(ValueError, match=f'hardware profile {folder}/bad.json'
                       ' is not valid JSON'):
      flag(f'{folder}/bad.json')
    checkpoints.write_bytes(f'{folder}/other.json', b'{"rows": []}')
    with pytest.raises(ValueError, match=f'hardware profile {folder}/other'):
      flag(f'{folder}/other.json')
