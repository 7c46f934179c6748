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

from specdec_jax import checks

STAGES = ('trace', 'lower', 'compile')
FORMAT = ('{test: {stage: [seconds, count], "programs": {name: {stage: '
          '[seconds, count]}}}}, as tests/conftest.py writes it')


def _stages_ok(stages) -> bool:
  """Whether `stages` is {stage: [seconds, count]} (of STAGES or none)."""
  return isinstance(stages, dict) and all(
      isinstance(v, list) and len(v) == 2 and checks.is_number(v[0])
      and checks.is_int(v[1]) for k, v in stages.items() if k in STAGES)


def _read(path):
  """A compile-*.json's entries; InputError naming it if not of FORMAT."""
  try:
    entries = json.loads(path.read_text())
  except ValueError:  # not JSON, or not text
    entries = None
  if not isinstance(entries, dict) or not all(
      _stages_ok(entry) and isinstance(entry.get('programs'), dict)
      and all(map(_stages_ok, entry['programs'].values()))
      for entry in entries.values()):
    raise checks.InputError(f'{path} is not a compile profile: {FORMAT}.')
  return entries


def load(folder):
  """({test: {stage: seconds, 'compiled': programs compiled}},
  {program name: the same})."""
  tests = collections.defaultdict(collections.Counter)
  programs = collections.defaultdict(collections.Counter)
  if not pathlib.Path(folder).is_dir():
    raise checks.InputError(f'{folder} is not a folder (of the compile-*.json '
                            'files of SPECDEC_TEST_COMPILE_PROFILE=<folder>).')
  paths = sorted(pathlib.Path(folder).glob('compile-*.json'))
  if not paths:
    raise checks.InputError(
        f'{folder} holds no compile-*.json: run the tests with '
        f'SPECDEC_TEST_COMPILE_PROFILE={folder} first.')
  for path in paths:
    for test, entry in _read(path).items():
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
  parser.add_argument('--tests', type=checks.count, default=40)
  parser.add_argument('--programs', type=checks.count, default=30)
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
  checks.run_main(main)  # a refused value or file: its line
