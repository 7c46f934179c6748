"""scripts/<name>.py run as a user runs it, for the tests of the commands.

A script is a thin command line over the library, which the tests test; a
test of the command itself runs it in a subprocess. The environment is the
test process's (the suite's XLA_FLAGS and jax compilation cache, set by
conftest.py) with the repository on PYTHONPATH.
"""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, check: bool = True
               ) -> subprocess.CompletedProcess:
  """`python scripts/<name>.py args...` in the repository root.

  Args:
    name: the script's file name without `.py`.
    *args: its command line.
    check: assert that it exits with 0 (its output tail is the message).

  Returns:
    The finished process, its stdout and stderr as text.
  """
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])))
  proc = subprocess.run(
      [sys.executable, str(ROOT / 'scripts' / f'{name}.py'), *args],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  if check:
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
  return proc
