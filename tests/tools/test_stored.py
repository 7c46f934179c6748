"""The box's stored programs: a plan of specs built ahead of time into an
executable store, then run on it.

On the CPU the "device" is this machine: the build compiles every decode
program of every cell of the plan from shape structs (the weights never
loaded as arrays: `abstract_loaded`), the run takes each program the job
asks for from the store by its fingerprint. What the device run needs of
it: no decode program compiled during the run, and the same rows as the
sweep compiling its own.
"""

import json
import tarfile

from tools.accelerator import aot
from tools.accelerator import stored


def _outputs(folder):
  """Every cell's records: (cell, index) -> (baseline, speculative)."""
  out = {}
  for path in sorted(folder.glob('table3/shipped/cells/*/examples.jsonl')):
    for line in path.read_text().splitlines():
      r = json.loads(line)
      out[(path.parent.name, r['index'])] = (r['baseline'], r['speculative'])
  return out


def test_a_plan_runs_on_the_programs_built_for_it(tmp_path):
  """Every program the run asks for, the profile's timing loops and the
  decodes alike, comes from the store (none compiled on the "device");
  the decodes give the rows of the sweep compiling its own."""
  plan = stored.parse_plan(['profile:shipped:shrink', 'table3:shipped:shrink'],
                           work_dir=str(tmp_path / 'work'))
  store = aot.Store(tmp_path / 'store', 'cpu')
  import jax  # pylint: disable=g-import-not-at-top
  store.describe(jax.devices()[0])
  built = stored.build(plan, store, jax.devices()[0], log=lambda _: None)
  assert built['built'] == len(built['programs']) > 0
  assert all(store.built(aot.program_name([f])) for f in built['programs'])
  result = stored.run(plan, store, tmp_path / 'out')
  log = result['program_log']
  assert all(e['source'] == 'loaded' for e in log), [
      (e['function'], e['why']) for e in log if e['source'] != 'loaded']
  assert {e['program'] for e in log} <= set(built['programs'])
  functions = {e['function'] for e in log}
  assert {'_call', '_repeated_calls', '_repeated_proposals',
          '_repeated_levels'} <= functions, functions
  assert result['specs']['table3']['rows'] == 4
  assert result['specs']['profile']['rows'] >= 3
  # Two files back, whatever the plan: the results packed, the run's log.
  out = tmp_path / 'out'
  assert sorted(p.name for p in out.iterdir()) == ['results.tar.xz',
                                                   'stored_run.json']
  with tarfile.open(out / 'results.tar.xz') as tar:
    names = tar.getnames()
  assert {'profile_shipped.json', 'table3_shipped.md'} <= set(names), names
  # The same rows as the sweep compiling its own programs.
  reference = stored.parse_plan(['table3:shipped:shrink'],
                                work_dir=str(tmp_path / 'reference'))[:1]
  from specdec_jax.experiments import specs  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiments import sweep  # pylint: disable=g-import-not-at-top
  (name, options), = reference
  sweep.run(specs.get(name), options, out=str(tmp_path / 'reference_out'))
  ours, theirs = _outputs(tmp_path / 'work'), _outputs(tmp_path / 'reference')
  assert ours and ours == theirs
