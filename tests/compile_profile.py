"""Prints where a test run spent its XLA compile time, slowest first.

  SPECDEC_TEST_COMPILE_PROFILE=/tmp/prof pytest
  python tests/compile_profile.py /tmp/prof [--tests 40]

Per file and per test: compile seconds and number of programs compiled
(tests/conftest.py records them from jax's compile events).
"""

import argparse
import collections
import json
import pathlib


def load(folder):
  tests = collections.Counter()
  counts = collections.Counter()
  for path in pathlib.Path(folder).glob('compile-*.json'):
    for test, entry in json.loads(path.read_text()).items():
      tests[test] += entry['seconds']
      counts[test] += entry['compiles']
  return tests, counts


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('folder')
  parser.add_argument('--tests', type=int, default=40)
  args = parser.parse_args(argv)
  tests, counts = load(args.folder)
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


if __name__ == '__main__':
  main()
