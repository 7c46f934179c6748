"""The standardized distributions stay finite and exact at any temperature.

At temperature 1e-10 speculative decoding emitted wrong
tokens (pad ids among them) while the baseline did not. Under jit,
`softmax(logits / t)` subtracted a max computed by another fusion (XLA
contracts `x * (1/t) - max` into an FMA), so once logits / t was ~1e10 the
shifted logits were ~+800, exp overflowed, p turned NaN, every draft was
rejected and the residual was sampled from NaN. `sampling.adjusted_logits`
now shifts by the row max *before* dividing, so these tests sweep
temperatures from 1e-30 to 1e6 over ordinary, huge (+-1e30) and masked
(-inf) logits, in every place a distribution is made: `probabilities`,
`sample`, `draw`, the baseline, the speculative loop (its `verify`
included) and `measure`'s beta.

Run alone: `python -m pytest -q tests/test_numerics.py` (about 25 s on 2
cores).
"""

import dataclasses
import functools

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import sampling
from specdec_jax import speculative
from specdec_jax.sampling import SamplingConfig
from specdec_jax import spec_stats

from conftest import TINY_V11
from test_speculative import EOS

TEMPERATURES = [1e-30, 1e-10, 1e-4, 1.0, 1e6]
TINY_T = [1e-30, 1e-10]  # where the distribution is the argmax limit
V = 16
BIG = 1e30


def logit_rows():
  """`{kind: [V] float32 logits}`: every kind a decoder may meet."""
  rng = np.random.default_rng(0)
  ordinary = 3 * rng.standard_normal(V)
  huge = np.full(V, -BIG)
  huge[[2, 5, 9]] = [BIG, BIG * (1 - 2**-20), 3.0]
  huge[[0, 7]] = -np.inf
  masked = ordinary.copy()
  masked[[1, 4, 11, 15]] = -np.inf
  masked[6] = 40.0
  ties = ordinary.copy()
  ties[[3, 12]] = 9.0  # two exactly equal maxima
  return {k: np.asarray(v, np.float32) for k, v in dict(
      ordinary=ordinary, huge=huge, masked=masked, ties=ties).items()}


ROWS = logit_rows()


def reference(logits, temperature):
  """The standardized distribution in float64, shifted before dividing."""
  x = np.asarray(logits, np.float64)
  m = x.max()
  z = np.where(x == m, 0.0, (x - m) / temperature)
  p = np.exp(z)
  return p / p.sum()


@functools.partial(jax.jit, static_argnums=0)
def _sampled(config, logits, rng):
  """probabilities, a token from `sample`, `draw`'s (token, q): one compile."""
  token, q = sampling.draw(rng, logits, config)
  return (sampling.probabilities(logits, config),
          sampling.sample(rng, logits, config), token, q)


@pytest.mark.parametrize('temperature', TEMPERATURES)
def test_probabilities_are_finite_and_exact(temperature):
  """p is finite, sums to 1 and equals the float64 law; tiny t is argmax.

  Ties between exactly equal maxima are the limit of softmax(x / t): uniform
  over the tied tokens (the 'ties' row), for every t > 0 (temperature 0,
  greedy, takes the first of them, as T5X).
  """
  kinds = list(ROWS)
  logits = jnp.asarray(np.stack([ROWS[k] for k in kinds]))
  probs, sampled, drawn, q = _sampled(SamplingConfig(temperature), logits,
                                      jax.random.key(0))
  probs, q = np.asarray(probs), np.asarray(q)
  assert np.isfinite(probs).all() and np.isfinite(q).all()
  np.testing.assert_array_equal(probs, q)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
  for row, kind in enumerate(kinds):
    want = reference(ROWS[kind], temperature)
    np.testing.assert_allclose(probs[row], want, atol=1e-6, err_msg=kind)
    assert probs[row][ROWS[kind] == -np.inf].max(initial=0.0) == 0.0
    assert probs[row, sampled[row]] > 0 and probs[row, drawn[row]] > 0
    if temperature in TINY_T:
      top = np.flatnonzero(ROWS[kind] == ROWS[kind].max())
      expected = np.zeros(V)
      expected[top] = 1.0 / len(top)
      np.testing.assert_array_equal(probs[row], expected.astype(np.float32))


@pytest.mark.parametrize('config', [
    SamplingConfig(1e-10, topk=3), SamplingConfig(1e-10, topp=0.9),
    SamplingConfig(1e6, topk=3), SamplingConfig(1e6, topp=0.5),
])
def test_topk_topp_stay_finite_at_extreme_temperatures(config):
  """Top-k keeps the k largest, top-p its smallest set, at any t: finite."""
  logits = jnp.asarray(np.stack(list(ROWS.values())))
  probs = np.asarray(_sampled(config, logits, jax.random.key(1))[0])
  assert np.isfinite(probs).all()
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
  for row, x in enumerate(ROWS.values()):
    kept = probs[row] > 0
    if config.topk:
      assert kept.sum() <= config.topk
      assert x[kept].min() >= np.sort(x)[-config.topk]
    if config.temperature == 1e-10:
      assert x[kept].min() == x.max()  # one-hot, or uniform over ties


def test_all_masked_row_is_uniform_not_nan():
  """A row with every logit -inf (no token allowed) is a tie of all tokens."""
  logits = jnp.full((1, V), -jnp.inf)
  for t in TINY_T + [1.0]:
    probs = np.asarray(_sampled(SamplingConfig(t), logits,
                                jax.random.key(2))[0])
    np.testing.assert_allclose(probs, np.full((1, V), 1.0 / V), rtol=1e-6)


# ---------------------------------------------------------------------------
# Every decoder, on a stub whose logits are +-1e30 and -inf.
# ---------------------------------------------------------------------------


@struct.dataclass
class StubCache:
  """Per-row position (rewindable) and offset (from the inputs)."""

  position: jax.Array
  offset: jax.Array

  def rewind(self, position):
    return StubCache(position, self.offset)


@dataclasses.dataclass(frozen=True)
class TableModel:
  """Next-token logits `params[(token + input[:, 0]) % V]`: rows differ.

  params is a `[V, V]` table of huge-magnitude logits with -inf entries and
  a gap of >= 9.5e23 between the best and the second best: p is one-hot for
  every temperature swept, so every decoder must give the argmax path.
  """

  vocab_size: int = V

  def check_params(self, params):
    del params  # a stub's params are whatever its test gives

  def init_cache(self, params, encoder_input_tokens, max_length):
    del params, max_length
    batch = encoder_input_tokens.shape[0]
    return StubCache(jnp.zeros((batch,), jnp.int32),
                     encoder_input_tokens[:, 0])

  def extend(self, params, tokens, cache):
    logits = params[(tokens + cache.offset[:, None]) % self.vocab_size]
    return logits, StubCache(cache.position + tokens.shape[1], cache.offset)

  def logits(self, params, encoder_input_tokens, decoder_input_tokens,
             decoder_target_tokens=None):
    del decoder_target_tokens
    return params[(decoder_input_tokens + encoder_input_tokens[:, :1]) % V]


def huge_table(seed):
  """`[V, V]` logits: -1e30 and -inf around one 1e30 and a near-1e30."""
  rng = np.random.default_rng(seed)
  table = np.full((V, V), -BIG, np.float32)
  table[rng.random((V, V)) < 0.3] = -np.inf
  for a in range(V):
    best, second = rng.choice(np.arange(2, V), 2, replace=False)
    table[a, best] = BIG
    table[a, second] = BIG * (1 - 2**-20)
  table[3, 1] = 2 * BIG  # EOS after token 3 (+ offset): rows end apart
  return table


def argmax_path(table, offsets, steps, eos=1):
  out = np.zeros((len(offsets), steps), np.int32)
  for b, off in enumerate(offsets):
    tok = 0
    for t in range(steps):
      tok = int(np.argmax(table[(tok + off) % V]))
      out[b, t] = tok
      if tok == eos:
        break
  return out


# 1e-10 runs on T5s below, 1.0 in every other test file: a compile each.
@pytest.mark.parametrize('temperature', [1e-30, 1e-4, 1e6])
def test_every_decoder_follows_the_argmax_of_huge_logits(temperature):
  """Baseline and speculative (a disagreeing drafter: rejections, residuals
  and bonus tokens) equal the argmax path token for token; beta finite.

  Before the fix, logits / t overflowed (1e30 / 1e-10 = inf; inf - inf =
  NaN) or lost the max to the FMA: NaN p, pad tokens.
  """
  target, drafter = TableModel(), drafters.T5Drafter(TableModel())
  draft_table = huge_table(0)
  draft_table[::2] = huge_table(1)[::2]  # agrees on odd rows only
  tparams, dparams = jnp.asarray(huge_table(0)), jnp.asarray(draft_table)
  enc = jnp.asarray([[0, 5], [3, 2], [7, 1], [12, 9]], jnp.int32)
  want = argmax_path(huge_table(0), np.asarray(enc[:, 0]), 8)
  config = SamplingConfig(temperature)
  base = decoding.temperature_sample(
      target, tparams, enc, max_decode_len=8, sampling=config,
      rng=jax.random.key(3))
  spec = speculative.speculative_sample(
      target, tparams, drafter, dparams, enc, gamma=3, max_decode_len=8,
      sampling=config, rng=jax.random.key(4))
  np.testing.assert_array_equal(base.tokens, want)
  np.testing.assert_array_equal(spec.tokens, want)
  assert 0 < spec_stats.summarize(spec.stats)['acceptance_rate'] < 1
  betas = measure.betas_on_outputs(target, tparams, drafter, dparams, enc,
                                   base.tokens, base.lengths, sampling=config)
  assert np.isfinite(betas).all() and ((betas >= 0) & (betas <= 1 + 1e-6)).all()


# ---------------------------------------------------------------------------
# The reported bug: tiny random T5s at temperature 1e-10.
# ---------------------------------------------------------------------------


def test_tiny_temperature_speculative_equals_baseline_and_greedy(v11):
  """t = 1e-10 is the argmax limit: speculative (a different random T5
  drafter, batch 4) == baseline == greedy, token for token.

  This is the issue's report: before the fix the speculative tokens were
  wrong (0 = pad among them), the baseline right.
  """
  model, params = v11
  enc = np.random.default_rng(3).integers(2, model.vocab_size, (4, 12))
  enc[1, 8:] = 0
  enc[3, 2:] = 0
  small = network.T5Model(TINY_V11.replace(
      emb_dim=16, num_heads=2, mlp_dim=32, num_encoder_layers=1,
      num_decoder_layers=1))
  drafter = drafters.T5Drafter(small)
  dparams = small.init_params(jax.random.key(9))
  config = SamplingConfig(temperature=1e-10)
  greedy = decoding.temperature_sample(model, params, enc, max_decode_len=16,
                                       eos_id=EOS)
  base = decoding.temperature_sample(
      model, params, enc, max_decode_len=16, sampling=config, eos_id=EOS,
      rng=jax.random.key(5))
  spec = speculative.speculative_sample(
      model, params, drafter, dparams, enc, gamma=3, max_decode_len=16,
      sampling=config, eos_id=EOS, rng=jax.random.key(6))
  assert len(set(np.asarray(greedy.lengths).tolist())) >= 2
  np.testing.assert_array_equal(base.tokens, greedy.tokens)
  np.testing.assert_array_equal(spec.tokens, greedy.tokens)
  np.testing.assert_array_equal(spec.lengths, greedy.lengths)
  alpha = spec_stats.summarize(spec.stats)['alpha']
  assert np.isfinite(alpha) and 0 <= alpha < 0.5


# ---------------------------------------------------------------------------
# verify(): the residual never becomes 0/0.
# ---------------------------------------------------------------------------


def _verify(drafts, q, p, config):
  return jax.jit(speculative.verify, static_argnums=4)(
      jax.random.key(7), jnp.asarray(drafts), jnp.asarray(q, jnp.float32),
      jnp.asarray(p, jnp.float32), config)


@pytest.mark.parametrize('config', [SamplingConfig(), SamplingConfig(1.0)])
def test_verify_residual_is_finite_when_p_equals_q(config):
  """p == q: the residual max(p - q, 0) is 0 everywhere.

  In exact arithmetic it is never sampled (r q(x) < p(x) always holds); a
  draft with q(x) = p(x) = 0, rejected, forces the path: it must give a
  token of p, not 0/0 or a pad id.
  """
  p = np.array([[[0.0, 0.25, 0.75, 0.0], [0.0, 0.5, 0.5, 0.0]]] * 64)
  q = p[:, :1]
  n, accepted, token, beta = _verify(np.full((64, 1), 3), q, p, config)
  assert not np.asarray(accepted).any() and not np.asarray(n).any()
  assert set(np.asarray(token).tolist()) <= {1, 2}
  np.testing.assert_allclose(beta, 1.0)
  # p == q at the draft: always accepted, the bonus comes from p_2.
  n, _, token, _ = _verify(np.full((64, 1), 2), q, p, config)
  assert np.asarray(n).all() and set(np.asarray(token).tolist()) <= {1, 2}


def test_verify_q_mass_where_p_has_none():
  """q puts its mass where p has none: always rejected, residual = p."""
  p = np.array([[[0.0, 0.5, 0.5, 0.0], [0.25] * 4]] * 256)
  q = np.array([[[1.0, 0.0, 0.0, 0.0]]] * 256)
  n, _, token, beta = _verify(np.zeros((256, 1), np.int32), q, p,
                              SamplingConfig(1.0))
  token = np.asarray(token)
  assert not np.asarray(n).any() and np.isfinite(beta).all()
  assert set(token.tolist()) == {1, 2}
