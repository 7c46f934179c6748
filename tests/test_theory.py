"""The closed-form analysis matches Leviathan et al. (arXiv 2211.17192).

Brute-force references here are written independently of `theory` (plain
geometric sums, numpy argmax) so a shared mistake cannot pass unnoticed.
"""

import math

import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import theory

# Table 1 of arXiv 2211.17192 (c = c_hat = 0): (alpha, gamma, ops, speed).
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


def brute_tokens(alpha, gamma):
  """E[tokens/iter] as the plain sum 1 + alpha + ... + alpha^gamma."""
  return sum(alpha**k for k in range(gamma + 1))


def brute_optimum(alpha, c, cost, max_gamma):
  """(gamma, speedup) maximising E / (gamma * c + cost(gamma)).

  The smallest gamma within a relative 1e-12 of the maximum, theory's
  documented tie rule (at c = 0 gains below rounding must not pick larger
  gammas at random).
  """
  gammas = np.arange(1, max_gamma + 1)
  speeds = np.array([brute_tokens(alpha, g) / (g * c + cost(g))
                     for g in gammas])
  best = int(np.flatnonzero(speeds >= speeds.max() * (1 - 1e-12))[0])
  return int(gammas[best]), float(speeds[best])


@pytest.mark.parametrize('alpha,gamma,ops,speed', TABLE_1)
def test_table_1(alpha, gamma, ops, speed):
  """Reproduces the paper's Table 1 to its 2-decimal rounding.

  Why: it is the paper's only table of the closed forms, so it pins both the
  walltime formula (Theorem 3.8) and the operations formula (Theorem 3.11).
  With c = 0 the speed column is exactly E[tokens/iter] (E / (0 + 1)).
  """
  tokens = theory.expected_tokens_per_iteration(alpha, gamma)
  got_speed = theory.walltime_improvement(alpha, gamma, 0.0)
  got_ops = theory.operations_factor(alpha, gamma, 0.0)
  assert got_speed == tokens
  assert got_speed == pytest.approx(speed, abs=0.006)
  assert got_ops == pytest.approx(ops, abs=0.006)
  assert got_ops == pytest.approx((gamma + 1) / tokens, rel=1e-12)


def test_bigram_example_from_section_3_6():
  """A bigram draft (alpha ~ 0.2, c ~ 0) gives about 1.25X at gamma = 3.

  Why: a second worked number from the paper's text, away from Table 1.
  """
  assert theory.walltime_improvement(0.2, 3, 0.0) == pytest.approx(
      1.25, abs=0.005)


@pytest.mark.parametrize('gamma', [1, 2, 3, 7, 10, 32])
def test_alpha_limits(gamma):
  """alpha = 1 gives gamma + 1 tokens and alpha = 0 gives 1, exactly.

  Why: the closed form is 0/0 at alpha = 1; the limit must be handled, and
  values just below 1 must approach it smoothly (no cancellation).
  """
  assert theory.expected_tokens_per_iteration(1.0, gamma) == gamma + 1
  assert theory.expected_tokens_per_iteration(1, gamma) == gamma + 1
  assert theory.expected_tokens_per_iteration(0.0, gamma) == 1.0
  near = theory.expected_tokens_per_iteration(1 - 1e-12, gamma)
  assert near == pytest.approx(gamma + 1, rel=1e-9)
  assert theory.operations_factor(1.0, gamma, 0.5) == pytest.approx(
      (gamma * 0.5 + gamma + 1) / (gamma + 1), rel=1e-15)
  assert theory.operations_factor(0.0, gamma, 0.5) == pytest.approx(
      gamma * 0.5 + gamma + 1, rel=1e-15)
  assert theory.walltime_improvement(1.0, gamma, 0.0) == gamma + 1


@pytest.mark.parametrize('alpha', [0.05, 0.3, 0.5, 0.7, 0.9, 0.99])
@pytest.mark.parametrize('gamma', [1, 4, 13])
def test_tokens_match_geometric_sum(alpha, gamma):
  """The closed form equals the geometric sum it abbreviates.

  Why: the implementation uses expm1/log for accuracy; this checks it is
  still the same quantity, and that it returns a Python float.
  """
  got = theory.expected_tokens_per_iteration(alpha, gamma)
  assert type(got) is float
  assert got == pytest.approx(brute_tokens(alpha, gamma), rel=1e-12)
  assert got == pytest.approx((1 - alpha**(gamma + 1)) / (1 - alpha),
                              rel=1e-12)


def test_tokens_monte_carlo():
  """Simulated i.i.d. acceptances give E[tokens/iter] within 4 SE.

  Why: checks the formula against what Algorithm 1 actually does (accept
  drafts until the first rejection, then add one target token), not
  against another closed form.
  """
  alpha, gamma, n = 0.7, 4, 200_000
  rng = np.random.default_rng(0)
  accepted = rng.random((n, gamma)) < alpha
  n_accepted = np.where(accepted.all(axis=1), gamma,
                        np.argmin(accepted, axis=1))
  tokens = n_accepted + 1
  se = tokens.std(ddof=1) / math.sqrt(n)
  expected = theory.expected_tokens_per_iteration(alpha, gamma)
  assert abs(tokens.mean() - expected) < 4 * se


@pytest.mark.parametrize('c', [0.0, 0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0])
def test_optimal_gamma_matches_brute_force(c):
  """optimal_gamma is the argmax of Theorem 3.8 over 1..max_gamma.

  Why: picking gamma is the practical use of the theory (Section 3.5); the
  search must find the true integer optimum, ties going to the smaller one.
  """
  for alpha in np.linspace(0.05, 0.95, 19):
    alpha = float(alpha)
    want_gamma, want_speed = brute_optimum(alpha, c, lambda g: 1.0, 32)
    got_gamma, got_speed = theory.optimal_gamma_and_speedup(alpha, c)
    assert (got_gamma, alpha, c) == (want_gamma, alpha, c)
    assert type(got_gamma) is int
    assert got_speed == pytest.approx(want_speed, rel=1e-12)
    assert theory.optimal_gamma(alpha, c) == got_gamma
  # max_gamma caps the search.
  assert theory.optimal_gamma(0.9, 0.0, max_gamma=5) == 5
  # At c = 0 the improvement grows with gamma, but for small alpha the gain
  # drops below rounding; the tie rule stops there rather than at 32.
  assert theory.optimal_gamma(0.9, 0.0) == 32
  assert theory.optimal_gamma(0.1, 0.0) < 32


def test_optimal_gamma_ties_and_extremes():
  """Ties go to the smaller gamma; alpha = 0 or c large gives 1.

  Why: alpha = 1, c = 1 makes every gamma give exactly 1.0; the documented
  tie rule must decide. alpha = 1, c < 1 improves without bound in gamma.
  """
  assert theory.optimal_gamma_and_speedup(1.0, 1.0) == (1, 1.0)
  assert theory.optimal_gamma(1.0, 0.5, max_gamma=20) == 20
  assert theory.optimal_gamma(0.0, 0.1) == 1
  assert theory.optimal_gamma(0.5, 5.0) == 1


@pytest.mark.parametrize('alpha', [0.1, 0.3, 0.5, 0.62, 0.75, 0.9, 1.0])
@pytest.mark.parametrize('c', [0.0, 0.02, 0.11, 0.3, 0.6])
def test_corollary_3_9(alpha, c):
  """If alpha > c the optimum beats (1 + alpha) / (1 + c) > 1.

  Why: Corollary 3.9 is the paper's guarantee that a drafter helps; below
  the threshold corollary_bound documents None (no guarantee).
  """
  bound = theory.corollary_bound(alpha, c)
  if alpha > c:
    assert bound == pytest.approx((1 + alpha) / (1 + c))
    assert bound > 1
    _, speed = theory.optimal_gamma_and_speedup(alpha, c)
    assert speed >= bound - 1e-12
    # gamma = 1 attains the bound exactly.
    assert theory.walltime_improvement(alpha, 1, c) == pytest.approx(bound)
  else:
    assert bound is None


def test_cost_curve_shifts_optimum_down():
  """A target cost growing with gamma lowers the optimal gamma.

  Why: on CPU the gamma+1-token target call is not free (the paper's TPU
  assumption fails); a callable or dict cost curve must enter the search.
  Values: alpha = 0.8, c = 0.05, cost 1 -> gamma 8 (3.09X); cost
  1 + 0.1 * gamma -> gamma 5 (2.11X), both found by brute force below.
  """
  alpha, c = 0.8, 0.05

  def curve(g):
    return 1.0 + 0.1 * g

  flat = theory.optimal_gamma(alpha, c)
  assert (flat, flat) == (brute_optimum(alpha, c, lambda g: 1.0, 32)[0], 8)
  want_gamma, want_speed = brute_optimum(alpha, c, curve, 32)
  assert want_gamma == 5
  got_gamma, got_speed = theory.optimal_gamma_and_speedup(alpha, c, curve)
  assert got_gamma == want_gamma < flat
  assert got_speed == pytest.approx(want_speed, rel=1e-12)

  table = {g: curve(g) for g in range(1, 33)}
  assert theory.optimal_gamma_and_speedup(alpha, c, table) == pytest.approx(
      (want_gamma, want_speed), rel=1e-12)
  assert theory.walltime_improvement(alpha, 3, c, table) == pytest.approx(
      brute_tokens(alpha, 3) / (3 * c + 1.3), rel=1e-12)
  assert theory.walltime_improvement(alpha, 3, c, 1.3) == pytest.approx(
      theory.walltime_improvement(alpha, 3, c, curve), rel=1e-15)


def test_cost_dict_restricts_search():
  """A dict cost curve is searched only at the gammas it holds.

  Why: measured curves cover a few gammas; the documented behaviour is to
  search those rather than fail on the first gap.
  """
  table = {1: 1.0, 2: 1.05, 4: 1.2, 99: 1.0}
  got_gamma, got_speed = theory.optimal_gamma_and_speedup(0.9, 0.0, table)
  assert got_gamma == 4  # 99 is beyond max_gamma = 32
  assert got_speed == pytest.approx(brute_tokens(0.9, 4) / 1.2)
  with pytest.raises(ValueError, match='no gamma in'):
    theory.optimal_gamma(0.9, 0.0, {40: 1.0})
  with pytest.raises(ValueError, match='no entry for gamma=3'):
    theory.walltime_improvement(0.9, 3, 0.0, table)


def test_max_speedup():
  """1 / (1 - alpha) bounds the improvement and is its c -> 0 limit.

  Why: it is the ceiling quoted for a free drafter; inf at alpha = 1.
  """
  assert theory.max_speedup(0.8) == pytest.approx(5.0)
  assert theory.max_speedup(0.0) == 1.0
  assert theory.max_speedup(1.0) == math.inf
  for gamma in (1, 5, 50):
    assert theory.walltime_improvement(0.8, gamma, 0.0) < 5.0
  assert theory.walltime_improvement(0.8, 200, 0.0) == pytest.approx(5.0)


def test_alpha_from_distributions():
  """beta = sum(min(p, q)) is the acceptance probability of speculative
  sampling, per row, and estimate_alpha averages it.

  Why: alpha is measured this way from model outputs (Section 3.2); the
  sum must run over the vocabulary axis only, and it must equal the
  probability that x ~ q passes the accept test min(1, p(x) / q(x)).
  """
  rng = np.random.default_rng(1)
  p = rng.dirichlet(np.ones(11), size=(3, 5))
  q = rng.dirichlet(np.ones(11), size=(3, 5))
  beta = theory.alpha_from_distributions(p, q)
  assert isinstance(beta, np.ndarray) and beta.shape == (3, 5)
  accept = (q * np.minimum(1.0, p / q)).sum(-1)
  np.testing.assert_allclose(beta, accept, rtol=1e-12)
  np.testing.assert_allclose(beta, 1 - 0.5 * np.abs(p - q).sum(-1),
                             rtol=1e-12)
  assert theory.alpha_from_distributions(p[0, 0], p[0, 0]) == pytest.approx(
      1.0)
  assert theory.alpha_from_distributions([0.5, 0.5, 0], [0, 0, 1]) == 0.0
  alpha = theory.estimate_alpha(beta)
  assert type(alpha) is float and alpha == pytest.approx(beta.mean())
  with pytest.raises(ValueError):
    theory.estimate_alpha([])
  with pytest.raises(ValueError, match=r'in \[0, 1\]; got 1\.5 \.\. 2'):
    theory.estimate_alpha([1.5, 2.0])  # no alpha; it was their mean
  with pytest.raises(ValueError):
    theory.alpha_from_distributions([-0.1, 1.1], [0.5, 0.5])
  with pytest.raises(ValueError, match='q must be finite'):  # it was NaN
    theory.alpha_from_distributions([0.5, 0.5], [0.5, np.nan])
  with pytest.raises(ValueError, match='p must be distributions .*sums to 20'):
    theory.alpha_from_distributions([10, 10], [0.5, 0.5])  # it was 1.0
  # Another vocabulary's q, or words: named (before: numpy's "operands
  # could not be broadcast", "could not convert string to float").
  with pytest.raises(checks.InputError, match=(
      'p and q must be probability arrays that broadcast: .*mismatch')):
    theory.alpha_from_distributions(np.ones((2, 3)) / 3, np.ones((2, 4)) / 4)
  with pytest.raises(checks.InputError, match='betas must be numbers'):
    theory.estimate_alpha('abc')


@pytest.mark.parametrize('call', [
    lambda: theory.expected_tokens_per_iteration(1.5, 3),
    lambda: theory.expected_tokens_per_iteration(-0.1, 3),
    lambda: theory.expected_tokens_per_iteration(float('nan'), 3),
    lambda: theory.expected_tokens_per_iteration(0.5, 0),
    lambda: theory.expected_tokens_per_iteration(0.5, -2),
    lambda: theory.expected_tokens_per_iteration(0.5, 2.5),
    lambda: theory.expected_tokens_per_iteration(0.5, True),
    lambda: theory.walltime_improvement(0.5, 3, -0.1),
    lambda: theory.walltime_improvement(0.5, 3, float('inf')),
    lambda: theory.walltime_improvement(1.5, 3, 0.1),
    lambda: theory.walltime_improvement(0.5, 0, 0.1),
    lambda: theory.walltime_improvement(0.5, 3, 0.1, 0.0),
    lambda: theory.walltime_improvement(0.5, 3, 0.1, lambda g: -1.0),
    lambda: theory.optimal_gamma(1.5, 0.1),
    lambda: theory.optimal_gamma(0.5, -0.1),
    lambda: theory.optimal_gamma(0.5, 0.1, max_gamma=0),
    lambda: theory.operations_factor(0.5, 3, -1.0),
    lambda: theory.operations_factor(1.5, 3, 0.0),
    lambda: theory.corollary_bound(1.5, 0.1),
    lambda: theory.corollary_bound(0.5, -0.1),
    lambda: theory.max_speedup(1.5),
])
def test_bad_inputs_raise(call):
  """Out-of-domain arguments raise ValueError instead of a wrong number.

  Why: alpha > 1 or c < 0 would silently give plausible-looking speed-ups.
  """
  with pytest.raises(ValueError):
    call()


def test_scalar_types():
  """numpy scalars are accepted; results are plain Python numbers.

  Why: alpha and gamma often come out of numpy arrays in analysis code.
  """
  got = theory.walltime_improvement(np.float32(0.75), np.int64(7),
                                    np.float64(0.02))
  assert type(got) is float
  assert got == pytest.approx(brute_tokens(0.75, 7) / (7 * 0.02 + 1),
                              rel=1e-6)
  assert type(theory.optimal_gamma(np.float64(0.75), 0.02)) is int
