"""Argument checks shared by every layer: one wording for each rule.

An integer argument is a Python or numpy int, never a bool (`True` is an
int to Python, but passing it for a count is a mistake); the error names
the argument, the rule and the value given. A folder a job writes into is
a local one (`check_local_folder`). A command's flags: `count`, `counts`
and `positive` as their argparse types (the parser's error names the
flag), `one_line` for what the command refuses before it starts
(`error: ...`, not a traceback) and `root_logger_at` for its quiet
stretches. Every refusal here is an `InputError`; `REFUSED`, an
`InputError` or a path that is not what it names (not there, a folder for
a file, a file in a folder's way, not writable), is what a command says in
one line wherever its job finds it (`one_line(*REFUSED)`; a caller that
goes on after a job fails: `failure`).
"""

import argparse
import contextlib
import logging
import math
import os
import pathlib
import signal
import sys
import traceback
from typing import Mapping, Tuple

import numpy as np


class InputError(ValueError):
  """A value given to a job that it cannot use: a count below its least,
  an unknown task, an input longer than the model takes, a drafter of
  another vocabulary. The message names the value and what to give; a
  command ends with it in one line (`one_line`), unlike a `ValueError`
  from a fault of the code, whose traceback is kept."""


# What a command ends in one line wherever its job finds it (the job's
# summary, if it made one, written first): a value it cannot use, or a path
# it was given that is not what it names (a checkpoint or the data not
# there, a folder given for a file, a file in the way of a folder, a
# folder it may not write). Any other exception is a fault of the code and
# keeps its traceback.
REFUSED = (InputError, FileNotFoundError, IsADirectoryError,
           NotADirectoryError, FileExistsError, PermissionError)


def failure(e: BaseException) -> str:
  """A failed job's error in one line, for a caller that goes on (a
  sweep's other cells); a fault of the code (not `REFUSED`) has its
  traceback printed first, to be found where it is."""
  if not isinstance(e, REFUSED):
    traceback.print_exception(e)
  return f'{type(e).__name__}: {e}'


def is_int(value) -> bool:
  """A Python or numpy integer, not a bool."""
  return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def is_number(value) -> bool:
  """A Python int or float, not a bool (True is no temperature)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value, minimum: int = 1, note: str = '') -> None:
  """Raises InputError unless `value` is an int (`is_int`) >= `minimum`.

  The message: "<name> must be an int >= <minimum><note>, got <value!r>."
  (`note`, e.g. " (0 = off)", says what a special value means).
  """
  if not is_int(value) or value < minimum:
    raise InputError(
        f'{name} must be an int >= {minimum}{note}, got {value!r}.')


def said(value) -> str:
  """A value as a refusal says it: a class by name, a string, number or
  None as written ('no', 8), anything else by its type ('a dict', 'a
  T5Model': a model's repr is its whole config)."""
  if isinstance(value, type):
    return f'the class {value.__name__}'
  if value is None or isinstance(value, (str, int, float)):
    return repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + '...'
  return f'a {type(value).__name__}'


def check_type(name: str, value, kind, what: str) -> None:
  """Raises InputError unless `value` is an instance (not a class) of
  `kind` (a type, a runtime-checkable protocol or a tuple of them), said
  as `what`: "<name> must be <what>, got <said(value)>." (a dict where a
  setup's group goes, 'no' for a bool, arguments given in another
  order)."""
  if isinstance(value, type) or not isinstance(value, kind):
    raise InputError(f'{name} must be {what}, got {said(value)}.')


def check_eos_id(eos_id, vocab_size: int) -> None:
  """Raises InputError unless `eos_id` is an int in [0, vocab_size), or -1
  (no EOS: rows run to their full length)."""
  if not is_int(eos_id) or not -1 <= eos_id < vocab_size:
    raise InputError(
        f'eos_id must be an int in [0, vocab_size={vocab_size}) (or -1: no '
        f'EOS), got {eos_id!r}.')


def check_ints(minimum: int = 1, **values) -> None:
  """`check_int` of each value, named by its keyword."""
  for name, value in values.items():
    check_int(name, value, minimum)


def count(text: str, minimum: int = 1) -> int:
  """A flag's count: an int >= minimum (as the flag's `type`, argparse's
  error naming the flag otherwise)."""
  try:
    value = int(text)
  except ValueError:
    value = minimum - 1
  if value < minimum:
    raise argparse.ArgumentTypeError(
        f'an int >= {minimum} expected, got {text!r}')
  return value


def natural(text: str) -> int:
  """A flag's int >= 0 (a seed, an index; as the flag's `type`)."""
  return count(text, 0)


def _finite(text: str, zero_allowed: bool) -> float:
  """A flag's finite number > 0 (or >= 0), else argparse's error."""
  try:
    value = float(text)
  except ValueError:
    value = float('nan')
  too_small = value < 0 if zero_allowed else value <= 0
  if not math.isfinite(value) or too_small:
    raise argparse.ArgumentTypeError(
        f"a finite number {'>=' if zero_allowed else '>'} 0 expected, got "
        f'{text!r}')
  return value


def positive(text: str) -> float:
  """A flag's number > 0, e.g. a learning rate (as the flag's `type`)."""
  return _finite(text, zero_allowed=False)


def non_negative(text: str) -> float:
  """A flag's finite number >= 0, e.g. a weight decay or a noise scale."""
  return _finite(text, zero_allowed=True)


def is_url(path) -> bool:
  """Whether `path` is a URL (gs://, s3://, ...), not a local path: the
  one test of it, wherever a path meets local file operations."""
  return '://' in os.fspath(path)


def local_path(text: str) -> str:
  """A flag's local file or folder (as the flag's `type`): where a command
  writes results with local file operations, refused as a URL (gs://,
  s3://, ...) before it runs, not after (`pathlib` would write 'gs://b/x'
  to a local folder 'gs:/b/x'); '~' expanded (a quoted '~/x' reaches the
  command as is)."""
  if is_url(text):
    raise argparse.ArgumentTypeError(
        f'a local path expected (its files are written here), got {text!r}')
  return os.path.expanduser(text)


def counts(text: str) -> Tuple[int, ...]:
  """A flag's comma-separated counts, e.g. '1,8,32' (none: ''), each an
  int >= 1; else argparse's error naming the flag (an `argparse.
  ArgumentTypeError`, as a flag's `type`)."""
  try:
    return tuple(count(x) for x in text.split(',') if x.strip())
  except argparse.ArgumentTypeError:
    raise argparse.ArgumentTypeError(
        f'comma-separated ints >= 1 expected, got {text!r}') from None


def check_feature_lengths(lengths) -> None:
  """Raises InputError unless TASK_FEATURE_LENGTHS `lengths` names both
  'inputs' and 'targets', each an int >= 1 (the eval job's and training's
  alike; other features are the task's own)."""
  if not isinstance(lengths, Mapping) or not {'inputs', 'targets'} <= set(
      lengths):
    raise InputError('TASK_FEATURE_LENGTHS needs "inputs" and "targets", '
                     f'got {lengths!r}.')
  for name in ('inputs', 'targets'):
    check_int(f'TASK_FEATURE_LENGTHS["{name}"]', lengths[name])


def check_positive(name: str, value, unit: str = '') -> None:
  """Raises InputError unless `value` is a real number > 0 (not a bool; inf
  allowed): "<name> must be a number [of <unit>] > 0, got ..."."""
  if isinstance(value, bool) or not isinstance(
      value, (int, float, np.integer, np.floating)) or not value > 0:
    of = f' of {unit}' if unit else ''
    raise InputError(f'{name} must be a number{of} > 0, got {value!r}.')


def check_non_negative(name: str, value, note: str = '') -> None:
  """Raises InputError unless `value` is a finite number >= 0 (`is_number`;
  not NaN or inf): "<name> must be a finite number >= 0<note>, got ..."."""
  if not is_number(value) or not 0 <= value < math.inf:
    raise InputError(
        f'{name} must be a finite number >= 0{note}, got {value!r}.')


def check_local_folder(name: str, path) -> None:
  """Raises InputError when `path`, a folder a job writes into, is a URL
  (gs://, s3://, ...) rather than a local folder, or a file stands where
  it would be (`check_no_file_in_the_way`).

  The jobs' folders are written with local file operations (files renamed
  into place, logs appended, folders moved aside), which object stores do
  not have; `pathlib` would silently turn 'gs://b/x' into a local folder
  'gs:/b/x'. Checkpoints and data are read from gs:// all the same.
  """
  text = os.fspath(path)
  if not is_url(text):
    check_no_file_in_the_way(name, text)
    return
  raise InputError(
      f'{name} {text!r} is not a local folder: a job writes its folder '
      'with file operations (atomic renames, appends) that object stores '
      'lack. Give a local folder (across hosts: one every host mounts, '
      'e.g. NFS) and copy it to the bucket afterwards; checkpoints are '
      'read from gs:// as they are.')


def check_no_file_in_the_way(name: str, path) -> None:
  """Raises InputError where the local folder `path` (`name`) cannot be
  made or written: it, or the nearest of its parents that exists, is a
  file, or a folder this process may not write."""
  folder = pathlib.Path(os.path.expanduser(os.fspath(path))).absolute()
  for place in (folder, *folder.parents):
    if place.exists():
      if not place.is_dir():
        raise InputError(f'{name} {os.fspath(path)!r} cannot be a folder: '
                         f'{place} is a file.')
      if not os.access(place, os.W_OK | os.X_OK):
        raise InputError(f'{name} {os.fspath(path)!r} cannot be written: '
                         f'{place} is not writable here.')
      return


@contextlib.contextmanager
def one_line(*errors, said: str = ''):
  """A command's errors of the types `errors` (bad input, found before
  any work) end it with one line, "error: <said><the error>" (exit
  status 1), not a traceback; `said`, e.g. the file read, also names the
  error's type."""
  try:
    yield
  except errors as e:
    kind = f'{type(e).__name__}: ' if said else ''
    raise SystemExit(f'error: {said}{kind}{e}') from None


@contextlib.contextmanager
def root_logger_at(level: int):
  """The root logger at `level` inside (a command's quiet stretch: gin's
  search-path misses, untrained drafters' warnings), its level before
  restored after, so that an in-process caller keeps its own."""
  root = logging.getLogger()
  before = root.level
  root.setLevel(level)
  try:
    yield
  finally:
    root.setLevel(before)


# The exit statuses of a command that SIGINT or SIGTERM stopped (128 + the
# signal's number, as a shell reports a process it killed).
SIGNAL_EXITS = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def run_main(main, *args, **kwargs):
  """A command's entry (`if __name__ == '__main__': checks.run_main(main)`):
  `main(*args, **kwargs)`, whatever it refuses (`REFUSED`) said in one line
  (`one_line`). One that a signal stopped (SystemExit of `SIGNAL_EXITS`,
  once what finished is written and said) leaves at once (`os._exit`): an
  XLA compile still running on another thread would crash the
  interpreter's exit (a segfault, exit status 139)."""
  try:
    with one_line(*REFUSED):
      return main(*args, **kwargs)
  except SystemExit as e:
    if e.code in SIGNAL_EXITS:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(e.code)  # pylint: disable=protected-access
    raise
