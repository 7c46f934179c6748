"""Decode rows both ways and compare: the measured half of every benchmark.

`decode_rows` runs a compiled decode on each batch of rows (compiling once,
untimed, then medians of alternating repeats, `measure.time_alternating`);
`counters` sums a speculative decode's `SpecStats` over its results and
derives every rate through `spec_stats.rates` (so a batch's figures are
ratios of sums over rows, as the eval job's); `compare` gives the measured
speed-up (tokens per second, speculative over baseline) and how many greedy
rows are identical. The predicted half is `hardware.predict`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import measure
from specdec_jax import spec_stats


@dataclasses.dataclass
class Decoded:
  """What `decode_rows` returns: each batch's result and the seconds."""
  results: List[Any]
  seconds: float

  @property
  def tokens(self) -> int:
    return sum(int(np.asarray(r.lengths).sum()) for r in self.results)

  @property
  def tokens_per_s(self) -> float:
    return self.tokens / max(self.seconds, 1e-12)


def decode_rows(fn: Callable[[jax.Array, int], Any], inputs: np.ndarray,
                repeats: int, batch: int = 1) -> Decoded:
  """Decodes `inputs` in batches of `batch` rows with `fn(x, i)`.

  `fn` gets the batch's encoder tokens and its index (for its rng); the
  first call compiles and is not timed; each batch is timed as the median
  of `repeats` runs.
  """
  results, seconds = [], 0.0
  for n, start in enumerate(range(0, len(inputs), batch)):
    x = jnp.asarray(inputs[start:start + batch])
    call = lambda x=x, n=n: fn(x, n)
    if n == 0:
      jax.block_until_ready(call())  # compile
    res, t = measure.time_alternating({'x': call}, repeats)
    results.append(res['x'])
    seconds += t['x']
  return Decoded(results, seconds)


def counters(results: Sequence[Any]) -> Dict[str, Any]:
  """The summed counters of speculative results and their rates.

  Returns:
    tokens, target_calls (loop iterations), row_iterations (target calls
    per row, summed), tokens_per_call (tokens / row iterations: the mean
    accepted length per row), drafted, accepted, the `spec_stats.rates`
    (acceptance_rate, mean_accepted_length, alpha, target_calls_per_token)
    and per_position_acceptance (accepted at position i / row iterations).
  """
  s = lambda f: sum(float(np.asarray(f(r)).sum()) for r in results)
  tokens = s(lambda r: r.lengths)
  row_iters = s(lambda r: r.stats.row_iterations)
  at = np.sum([np.asarray(r.stats.accepted_at, np.float64)
               for r in results], 0)
  rates = spec_stats.rates(
      row_iters, s(lambda r: r.stats.drafted), s(lambda r: r.stats.accepted),
      s(lambda r: r.stats.beta_sum), s(lambda r: r.stats.beta_count),
      tokens=tokens)
  return dict(
      tokens=int(tokens), target_calls=int(s(lambda r: r.stats.iterations)),
      row_iterations=int(row_iters),
      tokens_per_call=tokens / max(row_iters, 1.0),
      drafted=int(s(lambda r: r.stats.drafted)),
      accepted=int(s(lambda r: r.stats.accepted)), **rates,
      per_position_acceptance=(at / max(row_iters, 1.0)).round(4).tolist())


def rows_of(results: Sequence[Any]) -> List[np.ndarray]:
  """Every row's tokens up to its length, in order."""
  out = []
  for r in results:
    tokens, lengths = np.asarray(r.tokens), np.asarray(r.lengths)
    out += [tokens[i, :lengths[i]] for i in range(tokens.shape[0])]
  return out


def identical(base: Sequence[Any], spec: Sequence[Any]) -> Tuple[int, int]:
  """(rows whose tokens are identical, rows)."""
  a, b = rows_of(base), rows_of(spec)
  if len(a) != len(b):
    raise ValueError(f'{len(a)} baseline rows vs {len(b)} speculative rows')
  return sum(np.array_equal(x, y) for x, y in zip(a, b)), len(a)


def compare(base: Decoded, spec: Decoded, greedy: bool) -> Dict[str, Any]:
  """Measured speed-up (tokens / s ratio), counters, identical rows.

  `identical` is None for sampled decodes (their rows differ by design;
  their law is tested in the suite).
  """
  same = identical(base.results, spec.results) if greedy else None
  return dict(
      baseline_s=base.seconds, speculative_s=spec.seconds,
      baseline_tokens=base.tokens, **counters(spec.results),
      measured=spec.tokens_per_s / max(base.tokens_per_s, 1e-12),
      identical=None if same is None else same[0],
      rows=len(rows_of(base.results)))
