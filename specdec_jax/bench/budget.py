"""A wall-clock budget: `Clock`.

A run within a budget of minutes (`sweep.run`'s `--max_minutes`: start no
cell after it) keeps a `Clock`: wall time since the start, the time left,
what was skipped for it, and the time log every results file keeps
(`log`): one entry per step, with its `kind` and `units` (programs
compiled, decode calls, ...) so that a later run can be projected from it.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional


class Clock:
  """Wall time since the start, the budget and a printed time log."""

  def __init__(self, max_minutes: float):
    self.start = time.perf_counter()
    self.deadline = self.start + 60.0 * max_minutes
    self.log: List[Dict[str, Any]] = []
    self.skipped: List[Dict[str, Any]] = []

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def left(self) -> float:
    return self.deadline - time.perf_counter()

  def fits(self, seconds: float, what: Optional[str] = None) -> bool:
    """Whether `seconds` fit the time left; if not, `what` is skipped."""
    if self.left() > seconds:
      return True
    if what is not None:
      self.skipped.append(dict(what=what, needed_s=round(seconds, 1),
                               left_s=round(self.left(), 1)))
      print(f'skipped (time budget): {what}', flush=True)
    return False

  def note(self, what: str, seconds: float, kind: str = 'other',
           units: float = 1, **extra) -> None:
    """Logs a step: `kind` and `units` are what a projection scales."""
    self.log.append(dict(at_s=round(self.elapsed(), 2), what=what,
                         seconds=round(seconds, 3), kind=kind, units=units,
                         **extra))
    print(f'[{self.elapsed():7.1f} s] {what}: {seconds:.2f} s', flush=True)
