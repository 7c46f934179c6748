"""T5X-style flags and gin handling shared by the jobs (eval, train).

As `t5x/gin_utils.py`: `--gin_file` (repeatable), `--gin_bindings`
(repeatable), `--gin.NAME=VALUE` (shorthand for a binding) and
`--gin_search_paths` (comma-separated; the project's gin_configs/ and the
repository root are always searched).

Unlike T5X, a command-line binding that nothing in the resolved
configuration reads (e.g. `--gin.TEMPERATUR=0.7`, a macro no binding
references) is an error that lists the closest known names;
`--gin_allow_unused` makes it a warning.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import pathlib
import re
import tokenize
from typing import (Any, Callable, Dict, Iterator, Mapping, Optional,
                    Sequence, Set, Tuple)

from specdec_jax import checks

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
  parser = argparse.ArgumentParser(
      prog=prog, description=description,
      epilog=('--gin.NAME=VALUE binds one gin parameter or macro, as '
              "--gin_bindings='NAME = VALUE' does; a string value is quoted "
              'inside the shell\'s quotes: --gin.EVAL_OUTPUT_DIR="\'/tmp/run\'"'
              '. Later files and bindings override earlier ones.'))
  parser.add_argument('--gin_file', action='append', default=[],
                      help='a gin file (repeatable), from gin_configs/ '
                      '(shipped/en_de.gin), the repository root or a path')
  parser.add_argument('--gin_bindings', action='append', default=[],
                      help="a binding 'NAME = VALUE' (repeatable)")
  parser.add_argument('--gin_search_paths', default='',
                      help='comma-separated folders gin also looks in for '
                      'files and includes')
  parser.add_argument('--gin_allow_unused', action='store_true',
                      help='warn instead of failing on a --gin binding that '
                      'nothing uses')
  if add_arguments is not None:
    add_arguments(parser)
  return parser.parse_args(rewrite_gin_args(argv))


def add_search_paths(extra: Sequence[str] = ()) -> None:
  """Adds `extra`, gin_configs/ and the repository root to gin's paths."""
  import gin  # pylint: disable=g-import-not-at-top

  _tolerant_file_readers()
  for path in list(extra) + [str(GIN_DIR), str(GIN_DIR.parent)]:
    gin.add_config_file_search_path(path)


def _tolerant_file_readers() -> None:
  """gin's readers say 'not here' where a check raises.

  gin also looks an include up as a resource of a Python package named
  by the include's folder: `include 'runs/eval.gin'` asks for package
  `runs`, and where a folder of that name is importable (a `runs/` in the
  working directory, a namespace package) gin's check raises a TypeError
  from deep inside instead of moving on to the search paths. A check that
  raises is taken as 'no such file' here, so the search paths are tried.
  """
  import gin  # pylint: disable=g-import-not-at-top
  readers = gin.config._FILE_READERS  # pylint: disable=protected-access

  def tolerant(check):
    def exists(path):
      try:
        return check(path)
      except (TypeError, ValueError, ImportError):
        return False
    _TOLERANT.add(exists)
    return exists

  readers[:] = [(r, c if c in _TOLERANT else tolerant(c))
                for r, c in readers]


_TOLERANT = set()  # the checks `_tolerant_file_readers` made

Key = Tuple[str, str]  # gin's (scope, selector) of a binding


def _bound() -> Dict[Key, Dict[str, Any]]:
  import gin  # pylint: disable=g-import-not-at-top
  return {k: dict(v) for k, v in gin.config._CONFIG.items()}  # pylint: disable=protected-access


def _references(value) -> Iterator[Any]:
  """The gin references (`@x()`, `%MACRO`) inside a bound value."""
  import gin  # pylint: disable=g-import-not-at-top
  if isinstance(value, gin.config.ConfigurableReference):
    yield value
  elif isinstance(value, (list, tuple, set)):
    for v in value:
      yield from _references(v)
  elif isinstance(value, dict):
    for v in value.values():
      yield from _references(v)


def _reachable(config: Dict[Key, Dict[str, Any]]) -> Set[Key]:
  """Bindings a job can read: from every unscoped function or class binding
  (the entry points the files configure), through the references."""
  todo = [k for k in config if not k[0] and k[1] != 'gin.macro']
  seen = set(todo)
  while todo:
    for value in config.get(todo.pop(), {}).values():
      for ref in _references(value):
        scopes = list(ref.scopes)
        selector = ref.configurable.selector
        for n in range(len(scopes) + 1):
          key = ('/'.join(scopes[:n]), selector)
          if key in config and key not in seen:
            seen.add(key)
            todo.append(key)
  return seen


def _name(key: Key) -> str:
  scope, selector = key
  if selector == 'gin.macro':
    return scope
  return f'{scope}/{selector}' if scope else selector


def unused_bindings(before: Dict[Key, Dict[str, Any]]) -> Dict[str, str]:
  """Bindings added since `before` that no entry point reaches.

  Returns:
    {binding name: hint naming the closest known names}, empty when every
    new binding is read.
  """
  now = _bound()
  reachable = _reachable(now)
  known = sorted({_name(k) for k in reachable})
  unused = {}
  for key, params in now.items():
    changed = [p for p, v in params.items()
               if p not in before.get(key, {}) or before[key][p] is not v]
    if changed and key not in reachable:
      name = _name(key)
      close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
      unused[name] = ('did you mean ' + ' or '.join(close) + '?' if close
                      else 'nothing in the configuration reads it')
  return unused


def parse(gin_files: Sequence[str], bindings: Sequence[str] = (),
          search_paths: Sequence[str] = (), allow_unused: bool = True
          ) -> None:
  """Clears gin and parses the files and bindings (quietly, as T5X does).

  gin logs an ERROR for every search-path miss before it finds an include;
  only its exceptions matter, and they name the file and the binding.
  Unless `allow_unused`, a binding nothing reads is a ValueError (with
  it, a logged warning).
  """
  import gin  # pylint: disable=g-import-not-at-top

  gin.clear_config(clear_constants=True)
  add_search_paths(search_paths)
  with checks.root_logger_at(logging.CRITICAL):
    for file in gin_files:  # one by one: gin's tokenizer names no file
      try:
        gin.parse_config_files_and_bindings([file], [], finalize_config=False)
      except tokenize.TokenError as e:  # ('EOF in multi-line statement', ..)
        raise ValueError(f'{e.args[0]} (a bracket or quote left open?) in '
                         f'{file} or a file it includes') from None
    before = _bound()
    gin.parse_config_files_and_bindings([], list(bindings))
  unused = unused_bindings(before)
  if unused:
    message = ('gin bindings that nothing in the configuration reads (a '
               'typo?): ' + '; '.join(f'{n} ({hint})'
                                      for n, hint in unused.items()))
    if not allow_unused:
      raise ValueError(message + '. --gin_allow_unused runs anyway.')
    logging.warning(message)


def configure(args, fn, example_gin_file: str,
              moved: Optional[Mapping[str, str]] = None):
  """Parses `args.gin_file`/`gin_bindings` (T5X style); returns fn with them.

  Args:
    args: flags from `parse_flags` (or anything with gin_file, gin_bindings,
      gin_search_paths).
    fn: the function or class the gin files configure (dynamic
      registration).
    example_gin_file: named in the error when no --gin_file is given.
    moved: {'EvalSetup.data_dir': 'loading.DataSpec.data_dir', ...}:
      parameters now bound elsewhere, said beside gin's error for a
      binding of the old name (a gin file written before they moved).

  Returns:
    `gin.get_configurable(fn)`.
  """
  import gin  # pylint: disable=g-import-not-at-top

  if not args.gin_file:
    raise SystemExit('error: at least one --gin_file is required, e.g. '
                     f'--gin_file={example_gin_file}')
  try:
    parse(args.gin_file, args.gin_bindings,
          [p for p in args.gin_search_paths.split(',') if p],
          allow_unused=args.gin_allow_unused)
    return gin.get_configurable(fn)
  except Exception as e:  # gin's messages name the file and the binding
    raise SystemExit(
        f'error: gin configuration: {said(e, moved or {})}') from None


def said(error: Exception, moved: Mapping[str, str]) -> str:
  """gin's error as the command says it. gin names the line of a value
  it cannot parse by its number alone: here with its text, and for a
  --gin. binding how a string is written (an unquoted path is the usual
  cause); a parameter that has moved (`configure`'s `moved`), where it is
  bound now."""
  if not (isinstance(error, SyntaxError) and error.text):
    text = str(error)
    macro = re.match(r"No bindings specified for '(\w+)/gin.macro'", text)
    if macro:  # gin prints the whole configuration after it
      return (f'%{macro[1]} is a macro no gin file or binding defines (a '
              'typo?)')
    found = re.search(r"Configurable '(?:.*\.)?(\w+)' doesn't have a "
                      r"parameter named '(\w+)'", text)
    now = found and moved.get(f'{found[1]}.{found[2]}')
    return text + (f'\n  It is now bound as {now}.' if now else '')
  line = error.text.strip()
  if error.filename:
    return f'{error.msg} ({error.filename}, line {error.lineno}: {line})'
  name, _, value = line.partition('=')
  name, value = name.strip(), value.strip()
  # A bare word or path where gin reads a literal: a string unquoted.
  unquoted = value[:1] not in '\'"' and (
      error.msg == 'Unable to parse value.' or (
          error.msg.startswith('malformed node or string') and re.fullmatch(
              r'[A-Za-z_./~][\w./~:-]*', value) is not None))
  msg = 'Unable to parse value.' if unquoted else error.msg
  hint = f' (a string is quoted: --gin.{name}="\'{value}\'")' * unquoted
  return f'{msg} In the binding {line!r}{hint}'
