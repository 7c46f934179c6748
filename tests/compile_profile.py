"""Prints where a test run spent its time tracing, lowering and compiling.

  SPECDEC_TEST_COMPILE_PROFILE=/tmp/prof pytest
  python tests/compile_profile.py /tmp/prof [--tests 40]

Per file, per test and per program name (the jitted function's; `jit_add`
and the like are eager ops compiled one by one), slowest first: seconds of
jax's three stages of a jitted program (tracing, lowering, XLA compiling)
and the number of programs XLA compiled (tests/conftest.py records them
from jax's compile events; with a persistent cache, a program found there
counts as compiled, in the seconds its loading took).
"""

import argparse
import collections
import json
import pathlib

STAGES = ('trace', 'lower', 'compile')


def load(folder):
  """({test: {stage: seconds, 'compiled': programs compiled}},
  {program name: the same})."""
  tests = collections.defaultdict(collections.Counter)
  programs = collections.defaultdict(collections.Counter)
  for path in pathlib.Path(folder).glob('compile-*.json'):
    for test, entry in json.loads(path.read_text()).items():
      for row, stages in [(tests[test], entry)] + [
          (programs[name], by_stage)
          for name, by_stage in entry['programs'].items()]:
        for stage in STAGES:
          seconds, n = stages.get(stage, (0.0, 0))
          row[stage] += seconds
          if stage == 'compile':
            row['compiled'] += n
  return tests, programs


def _table(title, rows, limit=None):
  print(f'\n  trace   lower compile  total compiled  {title}')
  ranked = sorted(rows.items(), key=lambda kv: -sum(kv[1][s] for s in STAGES))
  for name, row in ranked[:limit]:
    print(''.join(f'{row[s]:7.1f} ' for s in STAGES) +
          f'{sum(row[s] for s in STAGES):6.1f} {row["compiled"]:8d}  {name}')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('folder')
  parser.add_argument('--tests', type=int, default=40)
  parser.add_argument('--programs', type=int, default=30)
  args = parser.parse_args(argv)
  tests, programs = load(args.folder)
  files = collections.defaultdict(collections.Counter)
  for test, row in tests.items():
    files[test.split('::')[0]].update(row)
  total = sum(tests.values(), collections.Counter())
  print('seconds in all: ' + ', '.join(f'{s} {total[s]:.0f}' for s in STAGES)
        + f' ({total["compiled"]} programs compiled)')
  _table('file', files)
  _table('test', tests, args.tests)
  _table('program', programs, args.programs)


if __name__ == '__main__':
  main()
