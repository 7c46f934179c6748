"""Closed-form analysis of speculative decoding (Leviathan et al., Section 3).

Formulas from "Fast Inference from Transformers via Speculative Decoding"
(Leviathan, Kalman & Matias 2023, arXiv 2211.17192), used to predict speed-ups
from a measured acceptance rate and cost ratio, and to pick the number of
drafts gamma. Notation follows the paper:

  alpha: expected acceptance rate E[beta], beta = sum_x min(p(x), q(x)).
  gamma: number of draft tokens per iteration.
  c:     time(one drafter step) / time(one 1-token target step).
  c_hat: arithmetic operations per token of the drafter / of the target.

The paper assumes a target call on gamma + 1 tokens costs the same as a
1-token call (true on TPU at batch 1). Here that cost is a parameter,
`target_cost_ratio`, so the same formulas work with a cost curve measured on
hardware where it does not hold (e.g. CPU). With `target_cost_ratio=1` every
function reproduces the paper exactly.

Everything is pure numpy/Python: scalar arguments give Python floats/ints.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Mapping, Optional, Tuple, Union

import numpy as np

from specdec_jax import checks

CostRatio = Union[float, Callable[[int], float], Mapping[int, float]]

# Improvements within this relative distance of the best count as ties.
_TIE_RTOL = 1e-12


def _check_alpha(alpha) -> float:
  """Returns alpha as a float, or raises ValueError if not in [0, 1].

  Args:
    alpha: expected acceptance rate.

  Returns:
    alpha as a Python float.

  References:
    arXiv 2211.17192, Section 3.1, Definition 3.2 (alpha = E[beta] lies in
    [0, 1]).
  """
  if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
    raise checks.InputError(
        f'alpha must be a real number in [0, 1], got {alpha!r}')
  alpha = float(alpha)
  if not 0.0 <= alpha <= 1.0:  # also rejects NaN
    raise checks.InputError(f'alpha must be in [0, 1], got {alpha}')
  return alpha


def clamp_alpha(alpha) -> float:
  """A measured alpha (a ratio of float sums, or a mean of betas) clipped
  into [0, 1], where rounding may have put it just outside: what the
  functions here, which refuse any other alpha, are given."""
  return min(max(float(alpha), 0.0), 1.0)


def _check_positive_int(value, name: str) -> int:
  """Returns value as an int, or raises ValueError if not an integer >= 1.

  Args:
    value: the number to check (Python or numpy integer; bools rejected).
    name: argument name for the error message.

  Returns:
    value as a Python int.

  References:
    arXiv 2211.17192, Section 2.3, Algorithm 1 (gamma is a positive
    integer).
  """
  checks.check_int(name, value)
  return int(value)


def _check_nonnegative(value, name: str) -> float:
  """Returns value as a float, or raises ValueError if not finite and >= 0.

  Args:
    value: the number to check.
    name: argument name for the error message.

  Returns:
    value as a Python float.

  References:
    arXiv 2211.17192, Section 3.3, Definition 3.7 (c) and Section 3.4,
    Definition 3.10 (c_hat).
  """
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise checks.InputError(
        f'{name} must be a real number >= 0, got {value!r}')
  value = float(value)
  if not (math.isfinite(value) and value >= 0.0):
    raise checks.InputError(f'{name} must be finite and >= 0, got {value}')
  return value


def _cost_ratio_at(target_cost_ratio: CostRatio, gamma: int) -> float:
  """Resolves the target cost ratio for one gamma.

  Args:
    target_cost_ratio: a number, a callable gamma -> ratio, or a mapping
      {gamma: ratio}.
    gamma: number of drafts (the target call scores gamma + 1 tokens).

  Returns:
    The ratio as a Python float.

  Raises:
    ValueError: if the ratio is missing, non-finite or not > 0.

  References:
    arXiv 2211.17192, Section 3.3, Theorem 3.8 (whose proof takes this
    ratio to be 1).
  """
  if isinstance(target_cost_ratio, Mapping):
    if gamma not in target_cost_ratio:
      raise checks.InputError(
          f'target_cost_ratio has no entry for gamma={gamma}; '
          f'known gammas: {sorted(target_cost_ratio)}')
    ratio = target_cost_ratio[gamma]
  elif callable(target_cost_ratio):
    ratio = target_cost_ratio(gamma)
  else:
    ratio = target_cost_ratio
  if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real):
    raise checks.InputError(
        f'target_cost_ratio must give a real number, got {ratio!r} '
        f'for gamma={gamma}')
  ratio = float(ratio)
  if not (math.isfinite(ratio) and ratio > 0.0):
    raise checks.InputError(
        f'target_cost_ratio must be finite and > 0, got {ratio} '
        f'for gamma={gamma}')
  return ratio


def expected_tokens_per_iteration(alpha, gamma) -> float:
  """Expected tokens produced by one speculative iteration (one target call).

  E = (1 - alpha^(gamma+1)) / (1 - alpha) = sum_{k=0}^{gamma} alpha^k, under
  the paper's assumption that acceptances are i.i.d. with rate alpha. The
  limits are exact: alpha = 1 gives gamma + 1 and alpha = 0 gives 1. The
  numerator is computed with expm1/log so alpha close to 1 does not cancel.

  Args:
    alpha: expected acceptance rate, in [0, 1].
    gamma: number of drafts, an integer >= 1.

  Returns:
    The expected number of tokens per iteration, a float in [1, gamma + 1].

  Raises:
    ValueError: if alpha is outside [0, 1] or gamma is not an integer >= 1.

  References:
    arXiv 2211.17192, Section 3.1, Equation (1) (expected number of tokens
    generated by one run of Algorithm 1).
  """
  alpha = _check_alpha(alpha)
  gamma = _check_positive_int(gamma, 'gamma')
  if alpha == 1.0:
    return float(gamma + 1)
  if alpha == 0.0:
    return 1.0
  return -math.expm1((gamma + 1) * math.log(alpha)) / (1.0 - alpha)


def walltime_improvement(alpha, gamma, c,
                         target_cost_ratio: CostRatio = 1.0) -> float:
  """Expected walltime improvement factor over plain decoding.

  improvement = E[tokens/iter] / (gamma * c + target_cost_ratio), where one
  iteration costs gamma drafter steps (each c target steps) plus one target
  call on gamma + 1 tokens, which costs target_cost_ratio 1-token target
  steps. With target_cost_ratio = 1 this is Theorem 3.8:
  (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + 1)).

  Args:
    alpha: expected acceptance rate, in [0, 1].
    gamma: number of drafts, an integer >= 1.
    c: time(one drafter step) / time(one 1-token target step), >= 0.
    target_cost_ratio: time(one target call on gamma + 1 tokens) /
      time(one 1-token target call). A number, a callable gamma -> ratio
      (e.g. a measured cost curve) or a mapping {gamma: ratio}. Must be > 0.

  Returns:
    The expected speed-up factor (> 1 means faster than plain decoding).

  Raises:
    ValueError: on alpha outside [0, 1], gamma not an integer >= 1, c < 0,
      or a missing / non-positive target_cost_ratio.

  References:
    arXiv 2211.17192, Section 3.3, Theorem 3.8 (walltime improvement).
  """
  tokens = expected_tokens_per_iteration(alpha, gamma)
  c = _check_nonnegative(c, 'c')
  gamma = int(gamma)
  ratio = _cost_ratio_at(target_cost_ratio, gamma)
  return tokens / (gamma * c + ratio)


def optimal_gamma_and_speedup(alpha, c,
                              target_cost_ratio: CostRatio = 1.0,
                              max_gamma=32) -> Tuple[int, float]:
  """The gamma maximising the walltime improvement, and that improvement.

  Searches the integers 1..max_gamma and returns the smallest gamma whose
  improvement is within a relative 1e-12 of the maximum, so ties (and gains
  below floating-point rounding, e.g. alpha^gamma < 1e-16 at c = 0) go to the
  smaller gamma. If target_cost_ratio is a mapping, only the gammas it has
  entries for (within 1..max_gamma) are considered, so a cost curve measured
  at a few gammas can be passed as is.

  Args:
    alpha: expected acceptance rate, in [0, 1].
    c: time(one drafter step) / time(one 1-token target step), >= 0.
    target_cost_ratio: as in `walltime_improvement`.
    max_gamma: largest gamma considered, an integer >= 1.

  Returns:
    (gamma, speedup): the best gamma (int) and its improvement (float).

  Raises:
    ValueError: on invalid arguments, or a mapping target_cost_ratio with no
      key in 1..max_gamma.

  References:
    arXiv 2211.17192, Section 3.5 (choosing gamma: the integer maximising
    Theorem 3.8's improvement, found numerically).
  """
  _check_alpha(alpha)
  _check_nonnegative(c, 'c')
  max_gamma = _check_positive_int(max_gamma, 'max_gamma')
  if isinstance(target_cost_ratio, Mapping):
    gammas = sorted(g for g in target_cost_ratio
                    if isinstance(g, numbers.Integral)
                    and not isinstance(g, bool) and 1 <= g <= max_gamma)
    if not gammas:
      raise checks.InputError(
          f'target_cost_ratio has no gamma in [1, {max_gamma}]; '
          f'known gammas: {sorted(target_cost_ratio)}')
  else:
    gammas = range(1, max_gamma + 1)
  values = [walltime_improvement(alpha, gamma, c, target_cost_ratio)
            for gamma in gammas]
  threshold = max(values) * (1.0 - _TIE_RTOL)
  for gamma, value in zip(gammas, values):
    if value >= threshold:  # the smallest gamma within the tie tolerance
      return int(gamma), value
  raise AssertionError('unreachable')  # max(values) passes the threshold


def optimal_gamma(alpha, c, target_cost_ratio: CostRatio = 1.0,
                  max_gamma=32) -> int:
  """The integer gamma in [1, max_gamma] maximising the walltime improvement.

  Args:
    alpha: expected acceptance rate, in [0, 1].
    c: time(one drafter step) / time(one 1-token target step), >= 0.
    target_cost_ratio: as in `walltime_improvement`.
    max_gamma: largest gamma considered, an integer >= 1.

  Returns:
    The best gamma (ties, up to a relative 1e-12, go to the smaller
    one).

  Raises:
    ValueError: on invalid arguments (see `optimal_gamma_and_speedup`).

  References:
    arXiv 2211.17192, Section 3.5 (choosing gamma) and Theorem 3.8.
  """
  return optimal_gamma_and_speedup(alpha, c, target_cost_ratio, max_gamma)[0]


def operations_factor(alpha, gamma, c_hat) -> float:
  """Expected factor by which arithmetic operations grow.

  (1 - alpha)(gamma * c_hat + gamma + 1) / (1 - alpha^(gamma+1)), i.e. the
  operations of one iteration (gamma drafter steps, gamma + 1 target tokens)
  divided by the expected tokens it yields. The alpha = 1 limit,
  (gamma * c_hat + gamma + 1) / (gamma + 1), is exact.

  Args:
    alpha: expected acceptance rate, in [0, 1].
    gamma: number of drafts, an integer >= 1.
    c_hat: drafter operations per token / target operations per token, >= 0.

  Returns:
    The expected increase in arithmetic operations (>= 1 when c_hat >= 0).

  Raises:
    ValueError: on alpha outside [0, 1], gamma not an integer >= 1 or
      c_hat < 0.

  References:
    arXiv 2211.17192, Section 3.4, Theorem 3.11 (arithmetic operations)
    and Table 1.
  """
  tokens = expected_tokens_per_iteration(alpha, gamma)
  c_hat = _check_nonnegative(c_hat, 'c_hat')
  gamma = int(gamma)
  return (gamma * c_hat + gamma + 1) / tokens


def corollary_bound(alpha, c) -> Optional[float]:
  """The guaranteed improvement (1 + alpha) / (1 + c) when alpha > c.

  Corollary 3.9 states that if alpha > c, some gamma (gamma = 1 suffices)
  improves walltime by at least (1 + alpha) / (1 + c) > 1. When alpha <= c
  the corollary guarantees nothing and this returns None (not an error:
  such a drafter is simply not known to help).

  Args:
    alpha: expected acceptance rate, in [0, 1].
    c: time(one drafter step) / time(one 1-token target step), >= 0.

  Returns:
    (1 + alpha) / (1 + c) if alpha > c, else None.

  Raises:
    ValueError: on alpha outside [0, 1] or c < 0.

  References:
    arXiv 2211.17192, Section 3.3, Corollary 3.9.
  """
  alpha = _check_alpha(alpha)
  c = _check_nonnegative(c, 'c')
  if alpha > c:
    return (1.0 + alpha) / (1.0 + c)
  return None


def alpha_from_distributions(p, q) -> np.ndarray:
  """Per-prefix acceptance probability beta = sum_x min(p(x), q(x)).

  Args:
    p: target probabilities, [..., vocab] (rows sum to 1).
    q: draft probabilities, broadcastable to p's shape.

  Returns:
    beta as a float64 numpy array of the leading (broadcast) shape; a 0-d
    array for 1-D inputs.

  Raises:
    ValueError: if p or q has negative or non-finite entries, a row whose
      sum is not 1 (to 1e-3: float32 and bfloat16 softmaxes pass), or a
      0-d shape, or if the shapes do not broadcast.

  References:
    arXiv 2211.17192, Section 3.1, Definition 3.1 (beta) and Section 3.2,
    Lemma 3.4 / Corollary 3.5 (beta = 1 - D_LK(p, q) =
    sum_x min(p(x), q(x))).
  """
  try:
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    np.broadcast_shapes(p.shape, q.shape)
  except (TypeError, ValueError) as e:  # strings; another vocabulary's q
    raise checks.InputError(
        f'p and q must be probability arrays that broadcast: {e}') from None
  if p.ndim == 0 or q.ndim == 0:
    raise checks.InputError('p and q need a vocabulary axis (ndim >= 1)')
  for name, x in (('p', p), ('q', q)):
    if not np.all(np.isfinite(x)) or np.any(x < 0):
      raise checks.InputError(
          f'{name} must be finite, non-negative probabilities')
    off = np.ravel(x.sum(axis=-1) - 1)
    if np.any(np.abs(off) > 1e-3):
      worst = 1 + off[np.argmax(np.abs(off))]
      raise checks.InputError(
          f'{name} must be distributions (rows summing to 1); a row sums '
          f'to {worst:g}')
  return np.asarray(np.minimum(p, q).sum(axis=-1))


def estimate_alpha(betas) -> float:
  """Estimates alpha = E[beta] as the mean of per-prefix betas.

  Args:
    betas: per-prefix acceptance probabilities (any shape), e.g. from
      `alpha_from_distributions` along target-decoded sequences.

  Returns:
    The mean, a Python float.

  Raises:
    ValueError: if betas is empty or contains NaN.

  References:
    arXiv 2211.17192, Section 3.1, Definition 3.2 (alpha = E[beta]),
    Section 3.2, Corollary 3.6, and Section 4 (alpha measured over target
    samples, Table 3).
  """
  try:
    betas = np.asarray(betas, dtype=np.float64)
  except (TypeError, ValueError) as e:  # strings, ragged lists
    raise checks.InputError(f'betas must be numbers: {e}') from None
  if betas.size == 0:
    raise checks.InputError('betas is empty')
  if np.any(np.isnan(betas)):
    raise checks.InputError('betas contains NaN')
  if np.any((betas < 0) | (betas > 1)):
    raise checks.InputError(
        'betas are acceptance probabilities, in [0, 1]; got '
        f'{betas.min():g} .. {betas.max():g}')
  return float(betas.mean())


def max_speedup(alpha) -> float:
  """Upper bound on the improvement, 1 / (1 - alpha) (c -> 0, gamma -> inf).

  Args:
    alpha: expected acceptance rate, in [0, 1].

  Returns:
    1 / (1 - alpha); math.inf for alpha == 1.

  Raises:
    ValueError: if alpha is outside [0, 1].

  References:
    arXiv 2211.17192, Section 3.1, Equation (1) (E -> 1/(1 - alpha) as
    gamma -> inf) with Section 3.3, Theorem 3.8 at c = 0.
  """
  alpha = _check_alpha(alpha)
  if alpha == 1.0:
    return math.inf
  return 1.0 / (1.0 - alpha)
