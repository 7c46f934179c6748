"""scripts/<name>.py run as a user runs it, for the tests of the commands.

A script is a thin command line over the library, which the tests test; a
test of the command itself runs it in a subprocess. The environment is the
test process's (the suite's XLA_FLAGS and jax compilation cache, set by
conftest.py) with the repository on PYTHONPATH. A command refused before
any work may run in the test's process instead (`refusal`: the script's
`__main__`, ~3 s less than a fresh process and jax's import).
"""

import os
import pathlib
import runpy
import subprocess
import sys

import pytest

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


def refusal(name: str, *args: str, capsys, monkeypatch) -> str:
  """What `python scripts/<name>.py args...` says as it refuses them (its
  exit status 1 with `error: ...`, or 2 with argparse's usage), run as
  `__main__` in this process (the environment variables it sets at import
  are restored after the test)."""
  monkeypatch.setattr(sys, 'argv', [f'{name}.py', *args])
  monkeypatch.setenv('XLA_FLAGS', os.environ.get('XLA_FLAGS', ''))
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    runpy.run_path(str(ROOT / 'scripts' / f'{name}.py'), run_name='__main__')
  err = capsys.readouterr().err
  if isinstance(e.value.code, str):  # checks.run_main's one line
    return e.value.code
  assert e.value.code == 2, (e.value.code, err)
  return err
