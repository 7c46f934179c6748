"""T5X-style flags and gin handling shared by the jobs (eval, train).

As `t5x/gin_utils.py`: `--gin_file` (repeatable), `--gin_bindings`
(repeatable), `--gin.NAME=VALUE` (shorthand for a binding) and
`--gin_search_paths` (comma-separated; the project's gin_configs/ and the
repository root are always searched).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
from typing import Callable, Optional, Sequence

GIN_DIR = pathlib.Path(__file__).resolve().parent.parent / 'gin_configs'


def rewrite_gin_args(argv: Sequence[str]) -> list:
  """`--gin.NAME=VALUE` -> `--gin_bindings=NAME = VALUE` (as T5X does)."""
  out = []
  for arg in argv:
    if arg.startswith('--gin.'):
      if '=' not in arg:
        raise ValueError(
            f"Gin bindings must look like '--gin.NAME=VALUE', got {arg!r}.")
      name, value = arg[len('--gin.'):].split('=', 1)
      arg = f'--gin_bindings={name} = {value}'
    out.append(arg)
  return out


def parse_flags(argv: Sequence[str], prog: str, description: str = '',
                add_arguments: Optional[Callable[[argparse.ArgumentParser],
                                                 None]] = None
                ) -> argparse.Namespace:
  """The gin flags of a job, plus the job's own (`add_arguments(parser)`)."""
  parser = argparse.ArgumentParser(prog=prog, description=description)
  parser.add_argument('--gin_file', action='append', default=[])
  parser.add_argument('--gin_bindings', action='append', default=[])
  parser.add_argument('--gin_search_paths', default='')
  if add_arguments is not None:
    add_arguments(parser)
  return parser.parse_args(rewrite_gin_args(argv))


def add_search_paths(extra: Sequence[str] = ()) -> None:
  """Adds `extra`, gin_configs/ and the repository root to gin's paths."""
  import gin  # pylint: disable=g-import-not-at-top

  for path in list(extra) + [str(GIN_DIR), str(GIN_DIR.parent)]:
    gin.add_config_file_search_path(path)


def parse(gin_files: Sequence[str], bindings: Sequence[str] = (),
          search_paths: Sequence[str] = ()) -> None:
  """Clears gin and parses the files and bindings (quietly, as T5X does).

  gin logs an ERROR for every search-path miss before it finds an include;
  only its exceptions matter, and they name the file and the binding.
  """
  import gin  # pylint: disable=g-import-not-at-top

  gin.clear_config(clear_constants=True)
  add_search_paths(search_paths)
  root = logging.getLogger()
  level = root.level
  root.setLevel(logging.CRITICAL)
  try:
    gin.parse_config_files_and_bindings(list(gin_files), list(bindings))
  finally:
    root.setLevel(level)


def configure(args, fn, example_gin_file: str):
  """Parses `args.gin_file`/`gin_bindings` (T5X style); returns fn with them.

  Args:
    args: flags from `parse_flags` (or anything with gin_file, gin_bindings,
      gin_search_paths).
    fn: the function or class the gin files configure (dynamic
      registration).
    example_gin_file: named in the error when no --gin_file is given.

  Returns:
    `gin.get_configurable(fn)`.
  """
  import gin  # pylint: disable=g-import-not-at-top

  if not args.gin_file:
    raise SystemExit('error: at least one --gin_file is required, e.g. '
                     f'--gin_file={example_gin_file}')
  try:
    parse(args.gin_file, args.gin_bindings,
          [p for p in args.gin_search_paths.split(',') if p])
    return gin.get_configurable(fn)
  except Exception as e:  # gin's messages name the file and the binding
    raise SystemExit(f'gin configuration error: {e}') from None
