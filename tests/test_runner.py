"""The suite's own runner settings (pytest.ini) hold up when a worker dies.

A segfault in native code (jax's CPU executable serialisation did this once
in a full run) kills an xdist worker. With the file scheduler the suite uses,
xdist then waits forever if the death comes during the last file: CI would
sit out its whole time limit. pytest.ini's addopts must end such a run at
once, naming the test that was running.

And the XLA flags tests/conftest.py sets for compile speed: one an XLA does
not know would abort every process at its backend's start, so conftest
checks that its jaxlib starts with a flag before it sets it.
"""

import configparser
import os
import pathlib
import shlex
import subprocess
import sys
import time

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Two quick files, then one whose middle test kills its worker: the last
# file runs when no other work is left to hand out.
FILES = {
    'test_a.py': 'def test_a1():\n  pass\n\n\ndef test_a2():\n  pass\n',
    'test_b.py': 'def test_b1():\n  pass\n',
    'test_c.py': (
        'import os\nimport signal\n\n\ndef test_c0():\n  pass\n\n\n'
        'def test_c1():\n  os.kill(os.getpid(), signal.SIGSEGV)\n\n\n'
        'def test_c2():\n  pass\n'),
}


def addopts():
  parser = configparser.ConfigParser()
  parser.read(ROOT / 'pytest.ini')
  # The suite's scheduling options; the marker filter needs no 'slow' here.
  return [a for a in shlex.split(parser['pytest']['addopts'])
          if a not in ('-m', 'not slow')]


def test_a_dead_worker_ends_the_run_naming_its_test(tmp_path):
  for name, text in FILES.items():
    (tmp_path / name).write_text(text)
  (tmp_path / 'pytest.ini').write_text(
      '[pytest]\naddopts = ' + shlex.join(addopts()) + '\n')
  start = time.monotonic()
  proc = subprocess.run(
      [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider',
       '-p', 'no:randomly'], cwd=tmp_path, capture_output=True, text=True,
      timeout=240)
  seconds = time.monotonic() - start
  assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert "crashed while running 'test_c.py::test_c1'" in proc.stdout
  assert seconds < 120


def test_compile_flags_are_set_only_where_xla_knows_them():
  """Each of conftest's flags is in XLA_FLAGS exactly when this jaxlib's
  backend starts with it (the probe can say no: an unknown flag)."""
  import conftest  # pylint: disable=g-import-not-at-top
  accepts = conftest._xla_accepts  # pylint: disable=protected-access
  assert not accepts('--xla_no_such_flag=true')
  flags = os.environ['XLA_FLAGS']
  jax.devices()  # this process's backend started with `flags`: known ones
  for flag, value, probed in conftest._FAST_COMPILE:  # pylint: disable=protected-access
    if f'--{flag}=' not in flags:  # left out: only where XLA refuses it
      assert probed and not accepts(f'--{flag}={value}'), (flag, flags)
