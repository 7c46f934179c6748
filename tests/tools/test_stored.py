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
  plan = stored.parse_plan(['table3:shipped:shrink'],
                           work_dir=str(tmp_path / 'work'))
  store = aot.Store(tmp_path / 'store', 'cpu')
  import jax  # pylint: disable=g-import-not-at-top
  store.describe(jax.devices()[0])
  built = stored.build(plan, store, jax.devices()[0], log=lambda _: None)
  assert built['built'] == len(built['programs']) > 0
  # A second build finds every program in the store.
  again = stored.build(plan, store, jax.devices()[0], log=lambda _: None)
  assert again['built'] == 0 and again['kept'] == built['built']
  result = stored.run(plan, store, tmp_path / 'out')
  decodes = [e for e in result['program_log'] if e['function'] == '_call']
  assert decodes and all(e['source'] == 'loaded' for e in decodes), decodes
  assert {e['program'] for e in decodes} <= set(built['programs'])
  assert result['specs']['table3']['rows'] == 4
  # The same rows as the sweep compiling its own programs.
  reference = stored.parse_plan(['table3:shipped:shrink'],
                                work_dir=str(tmp_path / 'reference'))
  from specdec_jax.experiments import specs  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiments import sweep  # pylint: disable=g-import-not-at-top
  (name, options), = reference
  sweep.run(specs.get(name), options, out=str(tmp_path / 'reference_out'))
  ours, theirs = _outputs(tmp_path / 'work'), _outputs(tmp_path / 'reference')
  assert ours and ours == theirs
