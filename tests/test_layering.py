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
    ('hardware.py', 'from tools.accelerator import pool as _box',
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
