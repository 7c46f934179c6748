"""Argument checks shared by every layer: one wording for each rule.

An integer argument is a Python or numpy int, never a bool (`True` is an
int to Python, but passing it for a count is a mistake); the error names
the argument, the rule and the value given.
"""

import numpy as np


def is_int(value) -> bool:
  """A Python or numpy integer, not a bool."""
  return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_int(name: str, value, minimum: int = 1, note: str = '') -> None:
  """Raises ValueError unless `value` is an int (`is_int`) >= `minimum`.

  The message: "<name> must be an int >= <minimum><note>, got <value!r>."
  (`note`, e.g. " (0 = off)", says what a special value means).
  """
  if not is_int(value) or value < minimum:
    raise ValueError(
        f'{name} must be an int >= {minimum}{note}, got {value!r}.')
