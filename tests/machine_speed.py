"""How fast this machine compiles now: the suite's unit of CPU time.

  python tests/machine_speed.py [--runs 3]

Prints the CPU seconds XLA takes, with the suite's XLA flags
(tests/conftest.py), to compile four fixed decode loops of the suite's tiny
T5 1.1 (the chain at gamma 3, 4 and 5 with a one-layer T5 drafter, and the
baseline): the median of `--runs` fresh processes. A suite run's time is the
machine's as much as its own (docs/testing.md: machines of one kind differ
by ~1.8x, and one machine by ~20% within an hour), so its CPU seconds
divided by this figure, measured just before or after it, compare runs
made at other times or on other machines.
"""

import argparse
import pathlib
import statistics
import subprocess
import sys

from specdec_jax import checks

_ONE_RUN = """
import sys, time
sys.path.insert(0, {tests!r})
import conftest  # the suite's XLA flags, set before jax starts its backend
import numpy as np
from specdec_jax import decoding, network, speculative
from specdec_jax.drafters.t5 import T5Drafter
model = network.T5Model(conftest.TINY_V11)
params = conftest.numpy_params(conftest.TINY_V11, 0, 1.0)
small = network.T5Model(conftest.TINY_V11.replace(num_decoder_layers=1))
small_params = conftest.numpy_params(small.config, 1, 1.0)
enc = np.ones((4, 12), np.int32)
lowered = [speculative.speculative_sample.lower(
    model, params, T5Drafter(small), small_params, enc, gamma=gamma,
    max_decode_len=24) for gamma in (3, 4, 5)]
lowered.append(decoding.temperature_sample.lower(model, params, enc,
                                                 max_decode_len=24))
start = time.process_time()
for program in lowered:
  program.compile()
print(time.process_time() - start)
"""


def compile_seconds() -> float:
  """One fresh process's CPU seconds compiling the four loops."""
  tests = str(pathlib.Path(__file__).resolve().parent)
  out = subprocess.run([sys.executable, '-c', _ONE_RUN.format(tests=tests)],
                       capture_output=True, text=True, check=True)
  return float(out.stdout.split()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--runs', type=checks.count, default=3)
  args = parser.parse_args(argv)
  runs = [compile_seconds() for _ in range(args.runs)]
  print(f'{statistics.median(runs):.2f} s of CPU to compile the four loops '
        f'(median of {args.runs}: {", ".join(f"{r:.2f}" for r in runs)})')


if __name__ == '__main__':
  checks.run_main(main)  # a refused value: its line
