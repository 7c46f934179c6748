"""Prints where a test run spent its XLA compile time, slowest first.

  SPECDEC_TEST_COMPILE_PROFILE=/tmp/prof pytest
  python tests/compile_profile.py /tmp/prof [--tests 40]

Per file, per test and per program name (the jitted function's; `jit_add`
and the like are eager ops compiled one by one): compile seconds and number
of programs compiled (tests/conftest.py records them from jax's compile
events).
"""

import argparse
import collections
import json
import pathlib


def load(folder):
  tests = collections.Counter()
  counts = collections.Counter()
  programs = collections.defaultdict(lambda: [0.0, 0])
  for path in pathlib.Path(folder).glob('compile-*.json'):
    for test, entry in json.loads(path.read_text()).items():
      tests[test] += entry['seconds']
      counts[test] += entry['compiles']
      for name, (seconds, n) in entry.get('programs', {}).items():
        programs[name][0] += seconds
        programs[name][1] += n
  return tests, counts, programs


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('folder')
  parser.add_argument('--tests', type=int, default=40)
  parser.add_argument('--programs', type=int, default=30)
  args = parser.parse_args(argv)
  tests, counts, programs = load(args.folder)
  files, file_counts = collections.Counter(), collections.Counter()
  for test, seconds in tests.items():
    files[test.split('::')[0]] += seconds
    file_counts[test.split('::')[0]] += counts[test]
  print(f'compile seconds in all: {sum(tests.values()):.0f} '
        f'({sum(counts.values())} programs)\n')
  print(' seconds  programs  file')
  for name, seconds in files.most_common():
    print(f'{seconds:8.1f}  {file_counts[name]:8d}  {name}')
  print('\n seconds  programs  test')
  for name, seconds in tests.most_common(args.tests):
    print(f'{seconds:8.1f}  {counts[name]:8d}  {name}')
  print('\n seconds  compiles  program')
  for name, (seconds, n) in sorted(programs.items(),
                                   key=lambda item: -item[1][0]
                                   )[:args.programs]:
    print(f'{seconds:8.1f}  {n:8d}  {name}')


if __name__ == '__main__':
  main()
