"""The package's layering is code: import-linter's contracts hold.

`.importlinter` states the layers (contracts -> core -> drafters -> loading /
data -> jobs -> experiments), the order inside `specdec_jax.drafters` and
inside a method folder, that no package has an import cycle, and that the
package never imports the box beside it (tools/). This test
runs `lint-imports` on the tree, so the next upward import or cycle fails CI
instead of waiting for a review; and it plants an upward import and a cycle
in a copy of the package to show that the contracts do catch them.
"""

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINT = shutil.which('lint-imports') or os.path.join(
    os.path.dirname(sys.executable), 'lint-imports')


def lint(root: pathlib.Path) -> subprocess.CompletedProcess:
  """`lint-imports` on the package under `root` (its own .importlinter)."""
  env = dict(os.environ, PYTHONPATH=str(root))
  return subprocess.run([LINT, '--no-cache'], cwd=root, env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)


def copy_package(tmp_path: pathlib.Path) -> pathlib.Path:
  """The .py files of the package and of the box beside it (tools/), and
  the contracts, under tmp_path."""
  for root in ('specdec_jax', 'tools'):
    for path in (ROOT / root).rglob('*.py'):
      dest = tmp_path / path.relative_to(ROOT)
      dest.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy(path, dest)
  shutil.copy(ROOT / '.importlinter', tmp_path / '.importlinter')
  return tmp_path


def test_the_tree_keeps_every_contract():
  out = lint(ROOT)
  assert out.returncode == 0, out.stdout + out.stderr
  assert 'BROKEN' not in out.stdout and '0 broken' in out.stdout


@pytest.mark.parametrize('module,planted,contract', [
    # The baseline loop reaching up into the eval job.
    ('decoding.py', 'from specdec_jax import eval as _up',
     'Layers: contracts'),
    # The registry importing a method: registration by import again.
    ('drafters/registry.py', 'from specdec_jax.drafters import heads as _h',
     'Drafters: registry'),
    # A cycle inside one layer: spec_stats <-> speculative.
    ('spec_stats.py', 'from specdec_jax import speculative as _cycle',
     'No import cycles'),
    # The package reaching into the loan's box beside it.
    ('hardware.py', 'from tools.accelerator import aot as _box',
     'The package does not import the box'),
])
def test_a_planted_violation_is_caught(tmp_path, module, planted, contract):
  root = copy_package(tmp_path)
  target = root / 'specdec_jax' / module
  target.write_text(target.read_text() + f'\n{planted}  # planted\n')
  out = lint(root)
  assert out.returncode != 0, out.stdout
  broken = [line for line in out.stdout.splitlines()
            if line.rstrip().endswith('BROKEN')]
  assert any(line.startswith(contract) for line in broken), out.stdout


def private_uses(path: pathlib.Path):
  """`module._name` uses in a file, for modules imported from specdec_jax."""
  tree = ast.parse(path.read_text())
  modules = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith(
        'specdec_jax'):
      modules.update(a.asname or a.name for a in node.names)
  return sorted(
      f'{node.value.id}.{node.attr}' for node in ast.walk(tree)
      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
      and node.value.id in modules and node.attr.startswith('_'))


def test_streaming_and_the_jobs_use_public_names_only():
  """Continuous batching wraps the loops through their public scaffold
  (`speculative_sample.prepare`, `VerifyLoop`); no job reaches into a
  module's private names either."""
  files = ['streaming.py', 'eval.py', 'loading.py', 'demo.py']
  found = {f: private_uses(ROOT / 'specdec_jax' / f) for f in files}
  assert not any(found.values()), found
  planted = 'from specdec_jax import speculative\nx = speculative._run\n'
  probe = ROOT / 'tests' / '__planted_probe__.py'
  try:
    probe.write_text(planted)
    assert private_uses(probe) == ['speculative._run']
  finally:
    probe.unlink()


# Every function outside the timing primitives that reads a clock, and why
# it is no second timing loop: a figure of decoding speed comes from
# `measure.time_alternating` (decodes, the eval job's units) or
# `measure.loop_time` (a call repeated in a compiled loop) alone.
CLOCKS = {
    'specdec_jax/measure.py:time_alternating': 'the timing loop of decodes',
    'specdec_jax/measure.py:loop_time': 'the timing loop of calls',
    'specdec_jax/measure.py:_cpu_seconds': (
        'the wall span other processes\' CPU time is pooled over, not a '
        'timing'),
    'specdec_jax/bench/budget.py:__init__': 'a run\'s budget clock',
    'specdec_jax/bench/budget.py:elapsed': 'a run\'s budget clock',
    'specdec_jax/bench/budget.py:left': 'a run\'s budget clock',
    'specdec_jax/experiments/sweep.py:run': 'seconds per cell, the time log',
    'specdec_jax/compiled.py:compile_lowered': 'compile seconds',
    'specdec_jax/debian.py:build': 'seconds to build a dataset',
    'specdec_jax/training.py:_run_steps': 'training steps per second',
    'specdec_jax/training.py:start_clock': 'training wall time',
    'specdec_jax/training.py:method_steps': 'training wall time',
    'specdec_jax/training.py:write': 'training wall time',
    'specdec_jax/run_folder.py:_check_shared': (
        'how long a process looks for run.json on a shared disk'),
    'specdec_jax/demo.py:random_demo': (
        "the install check's console line on random weights (first call, "
        'compile included, and second): no figure in README or results'),
    'tools/accelerator/stored.py:build': 'compile seconds',
    'tools/accelerator/stored.py:run': 'seconds per spec, the time log',
    'tools/accelerator/stored.py:__call__': 'load / compile seconds',
    'tools/accelerator/stored.py:_checked': (
        'the store check: compile seconds; its timings are '
        'measure.time_alternating'),
    'specdec_jax/bucket_folder.py:*': 'when records were last copied to '
                                      'the bucket',
    'scripts/benchmark_mesh.py:compiled_facts': 'compile seconds',
    'scripts/ship_models.py:cmd_measure': 'seconds of an alpha measurement',
    'scripts/train_shipped_models.py:main': 'training wall time',
}


def _functions(*roots: str):
  """('path:function', its node) of every function under `roots`."""
  for root in roots:
    for path in sorted((ROOT / root).rglob('*.py')):
      for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          yield f'{path.relative_to(ROOT)}:{node.name}', node


def _clock_readers():
  """'path:function' of every function that reads a clock."""
  return {name for name, node in _functions('specdec_jax', 'tools', 'scripts')
          if any(isinstance(sub, ast.Attribute) and (
              sub.attr in ('perf_counter', 'monotonic', 'process_time') or (
                  sub.attr == 'time' and isinstance(sub.value, ast.Name) and
                  sub.value.id == 'time')) for sub in ast.walk(node))}


def test_one_timing_loop_behind_every_figure():
  """A function that reads a clock is a timing primitive or says why it
  is none (`CLOCKS`): a new timing loop beside the eval job's fails
  here."""
  readers = _clock_readers()
  allowed = lambda name: name in CLOCKS or (
      name.split(':')[0] + ':*') in CLOCKS
  assert sorted(n for n in readers if not allowed(n)) == []
  # The primitives are found (the scan works), and no entry is stale.
  assert {'specdec_jax/measure.py:time_alternating',
          'specdec_jax/measure.py:loop_time'} <= readers
  stale = [n for n in CLOCKS if not n.endswith(':*') and n not in readers]
  assert stale == []


# The sizes the structure keeps (lines, blank and comment lines included):
# one engine's parts stay small enough to read whole.
SIZE_LIMITS = {'specdec_jax/experiments': 2600, 'tools/accelerator': 1200,
               'specdec_jax/compiled.py': 700}
FUNCTION_LIMITS = {'*': 100, 'specdec_jax/unit_loop.py:decode_units': 90}


def _lines(path: pathlib.Path) -> int:
  files = sorted(path.rglob('*.py')) if path.is_dir() else [path]
  return sum(len(f.read_text().splitlines()) for f in files)


def test_the_engine_stays_within_its_sizes():
  """The experiments layer, the budgeted-run box and `compiled` within
  their line budgets; no function of the package over 100 lines, and the
  eval job's timing loop (`decode_units`) within 90."""
  sizes = {name: _lines(ROOT / name) for name in SIZE_LIMITS}
  assert {name: n for name, n in sizes.items() if n > SIZE_LIMITS[name]} == {}
  lengths = {}
  for name, node in _functions('specdec_jax'):
    lengths[name] = max(lengths.get(name, 0),
                        node.end_lineno - node.lineno + 1)
  assert 'specdec_jax/unit_loop.py:decode_units' in lengths  # the scan works
  over = {name: n for name, n in lengths.items()
          if n > FUNCTION_LIMITS.get(name, FUNCTION_LIMITS['*'])}
  assert over == {}


# The modules that check what a job is given and what the decoders are
# called with: each refusal there is a `checks.InputError`.
INPUT_CHECKERS = ('checks', 'sampling', 'loading', 'task_table', 'data',
                  'decoding', 'speculative', 'widening', 'shipped',
                  'bucket_folder', 'theory', 'spec_stats', 'models',
                  'distill', 'output_cache', 'diagnostics', 'partitioning',
                  'eval')


def _raises(module: str):
  """{'ValueError': [line, ...], 'InputError': [...]} of `module`'s
  `raise X(...)` statements (`X` a name or an attribute: checks.X)."""
  found = {}
  tree = ast.parse((ROOT / 'specdec_jax' / f'{module}.py').read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
      func = node.exc.func
      name = func.id if isinstance(func, ast.Name) else getattr(
          func, 'attr', '')
      found.setdefault(name, []).append(node.lineno)
  return found


def test_a_refusal_of_input_is_an_input_error():
  """Where a job's input and the decoders' arguments are checked, no plain
  ValueError is raised: a refusal is a `checks.InputError`, which every
  command says in one line (`checks.REFUSED`), where a ValueError would be
  taken for a fault of the code and end in a traceback."""
  raises = {module: _raises(module) for module in INPUT_CHECKERS}
  assert {m: r['ValueError'] for m, r in raises.items()
          if 'ValueError' in r} == {}
  assert len(raises['loading']['InputError']) >= 10  # the scan finds them
