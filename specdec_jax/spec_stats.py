"""Acceptance metrics of speculative decoding: counters and their rates.

Every loop that verifies drafts (`speculative.SpecLoop`, the merged loops,
the streaming loops) counts into one `SpecStats`; `rates` and `summarize`
turn summed counters into the paper's alpha and vLLM's acceptance rate and
mean acceptance length. One home for these formulas (as vLLM keeps
spec_decode/metrics.py apart from its rejection sampler): jobs, benchmarks
and tests read them here.

References: Leviathan et al. 2023, arXiv 2211.17192, sec. 3.1 (alpha).
"""

from __future__ import annotations

from typing import Dict

from flax import struct
import jax
import jax.numpy as jnp

from specdec_jax import checks

Array = jax.Array


@struct.dataclass
class SpecStats:
  """Counters of one speculative decode (all int32 / float32 arrays).

  Attributes:
    iterations: scalar, loop iterations = target calls (for the batch).
    row_iterations: `[batch]` iterations in which the row was still active.
    drafted: `[batch]` drafts verified (gamma per active iteration, fewer
      where an adaptive drafter stopped early).
    accepted: `[batch]` drafts accepted by the rejection test.
    accepted_at: `[gamma]` how often draft position i was accepted (summed
      over rows and iterations; divide by `row_iterations.sum()`).
    beta_sum: `[batch]` sum of beta = sum_x min(p, q) over verified positions.
    beta_count: `[batch]` number of verified positions.
  """

  iterations: Array
  row_iterations: Array
  drafted: Array
  accepted: Array
  accepted_at: Array
  beta_sum: Array
  beta_count: Array

  @classmethod
  def zeros(cls, rows: int, gamma: int) -> 'SpecStats':
    """All counters 0, for `rows` rows (or examples) and gamma positions."""
    z = jnp.zeros((rows,), jnp.int32)
    return cls(iterations=jnp.zeros((), jnp.int32), row_iterations=z,
               drafted=z, accepted=z,
               accepted_at=jnp.zeros((gamma,), jnp.int32),
               beta_sum=jnp.zeros((rows,), jnp.float32), beta_count=z)


@struct.dataclass
class SpecResult:
  """Tokens `[batch, max_decode_len]` (EOS kept, 0 after), lengths and stats."""

  tokens: Array
  lengths: Array
  stats: SpecStats


def rates(iterations, drafted, accepted, beta_sum, beta_count,
          tokens=None) -> Dict[str, float]:
  """The acceptance figures from summed counters (plain numbers).

  Names follow the paper (alpha) and vLLM's metrics (acceptance rate =
  accepted / drafted; mean acceptance length = 1 + accepted / iterations).
  The counters may be summed over rows, batches and examples (`SpecStats`
  per row, or per-example records) before the call: every rate is a ratio
  of sums.

  Args:
    iterations: row iterations: loop iterations counted once per row still
      active in them (`SpecStats.row_iterations` summed), i.e. target calls
      per row.
    drafted: drafts verified.
    accepted: drafts accepted.
    beta_sum: sum of beta = sum_x min(p, q) over verified positions.
    beta_count: verified positions.
    tokens: optional output tokens (EOS included) of the same rows.

  Returns:
    `{'acceptance_rate', 'mean_accepted_length', 'alpha'}` floats, and
    `'target_calls_per_token'` when `tokens` is given. The accepted counts
    are the verifier's: a draft accepted past its row's EOS or length
    limit counts, though it is not output; tokens output per call are 1 /
    target_calls_per_token.
  """
  iterations, drafted, accepted = (float(iterations), float(drafted),
                                   float(accepted))
  out = {
      'acceptance_rate': accepted / max(drafted, 1.0),
      'mean_accepted_length': 1.0 + accepted / max(iterations, 1.0),
      'alpha': float(beta_sum) / max(float(beta_count), 1.0),
  }
  if tokens is not None:
    out['target_calls_per_token'] = iterations / max(float(tokens), 1.0)
  return out


def summarize(stats: SpecStats) -> dict:
  """Python floats of one decode: `rates`, target calls, per position.

  Returns:
    {'target_calls', 'row_iterations', 'acceptance_rate',
     'mean_accepted_length', 'per_position_acceptance' (the share of row
     iterations accepting draft i), 'alpha'}.
  """
  checks.check_type('stats', stats, SpecStats,  # a result, most likely
                    "a SpecStats (a decode's `.stats`)")
  row_iters = float(jnp.sum(stats.row_iterations))
  r = rates(row_iters, jnp.sum(stats.drafted), jnp.sum(stats.accepted),
            jnp.sum(stats.beta_sum), jnp.sum(stats.beta_count))
  return {
      'target_calls': int(stats.iterations),
      'row_iterations': row_iters,
      'acceptance_rate': r['acceptance_rate'],
      'mean_accepted_length': r['mean_accepted_length'],
      'per_position_acceptance': [
          float(a) / max(row_iters, 1.0) for a in stats.accepted_at
      ],
      'alpha': r['alpha'],
  }
