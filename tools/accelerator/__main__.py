"""`python -m tools.accelerator [flags]`: the accelerator run (`run.main`
on `spec.SPEC`); `--help` lists its flags."""

import sys

from tools.accelerator import run
from tools.accelerator import spec

if __name__ == '__main__':
  sys.exit(run.main(spec.SPEC, sys.argv[1:]))
