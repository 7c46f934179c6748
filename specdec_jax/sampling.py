"""Standardized sampling: one adjusted distribution for greedy/temperature/top-k/top-p.

Leviathan et al. (arXiv 2211.17192, sec. 2.3) note that argmax, top-k, nucleus
and temperature sampling are all sampling from an adjusted distribution. The
same adjustment is applied to the target's p and the drafter's q, so both the
baseline and the speculative loop go through `adjusted_logits` below.

Semantics follow T5X's `temperature_sample`: logits are divided by the
temperature first; top-k keeps every logit >= the k-th largest (ties kept);
top-p keeps the smallest set of most likely tokens whose mass is >= p (ties at
the threshold kept). Temperature 0 is argmax (first index on ties).

Numerics: for any temperature t > 0 (1e-30 to 1e6 and beyond) and any
logits (+-1e30, -inf for masked tokens) the adjusted logits are
`(x - max x) / t`, computed in that order: every entry is <= 0, the row's
maxima are exactly 0, so the softmax is finite and sums to 1, and a tiny t is
the argmax limit. Dividing first (`softmax(x / t)`) is not safe: x / t
overflows, and under jit XLA may subtract a max it computed in another
fusion (an FMA of x * (1/t) - max), which leaves entries ~ +ulp(x / t) > 0
and exp overflows to inf/inf = NaN once x / t is ~1e10. Ties between
exactly equal maximal logits stay ties at every t > 0: the distribution is
uniform over them (the t -> 0 limit of the softmax), in the baseline and in
the speculative loop alike; only t = 0 (greedy) picks the first. A row
whose logits are all -inf allows no token; it is read as a tie of all
tokens (uniform), never NaN.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Dict, Mapping

import jax
import jax.numpy as jnp

from specdec_jax import checks

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to turn logits into a next-token distribution.

  Attributes:
    temperature: 0 for greedy (argmax); > 0 divides the logits.
    topk: keep the k most likely tokens; 0 disables.
    topp: keep the smallest most-likely set with mass >= topp; 1.0 disables.
      (T5X spells "disabled" as 0.0; here 0 is rejected as a mass.)
      Greedy decoding takes neither: its argmax is in every top set.
  """

  temperature: float = 0.0
  topk: int = 0
  topp: float = 1.0

  def __post_init__(self):
    for name in ('temperature', 'topp'):  # numpy's, jax's scalars: a float
      value = getattr(self, name)
      if type(value) is not bool and (
          isinstance(value, numbers.Real) or (
              isinstance(value, jax.Array) and value.shape == ()
              and not isinstance(value, jax.core.Tracer))):
        object.__setattr__(self, name, float(value))
    t, k, p = self.temperature, self.topk, self.topp
    checks.check_non_negative('temperature', t, ' (0 = greedy)')
    checks.check_int('topk', k, 0, ' (0 = off)')
    if not checks.is_number(p) or not 0.0 < p <= 1.0:
      raise checks.InputError(
          f'topp must be in (0, 1] (1.0 = off), got {p!r}.')
    if k and p < 1.0:
      raise checks.InputError(
          f'At most one of topk ({k}) and topp ({p}) may be set, as in T5X.'
      )
    if t == 0 and (k or p < 1.0):  # greedy's argmax is in every top set
      cut = f'topk {k}' if k else f'topp {p}'
      raise checks.InputError(
          f'{cut} has no effect when greedy (temperature 0): set a '
          f'temperature > 0 to sample, or leave {cut.split()[0]} off.')
    object.__setattr__(self, 'topk', int(k))  # a numpy int: a Python one

  def settings(self) -> Dict[str, Any]:
    """Its fields' values (JSON's types), as a run's settings hold them."""
    return dataclasses.asdict(self)

  def describe(self) -> str:
    """In words, as a run's summary says it (`describe`)."""
    return describe(self.settings())

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  def check_vocab(self, vocab_size: int) -> None:
    if self.topk > vocab_size:
      raise checks.InputError(
          f'topk={self.topk} is larger than the vocabulary ({vocab_size}).'
      )


def describe(settings: Mapping[str, Any]) -> str:
  """A sampling's settings (`SamplingConfig.settings`, or a run's, an
  earlier version's too: a field left out is its default) in words:
  'greedy', 'temperature 0.7, top-k 40'."""
  t, k, p = (settings.get(f.name, f.default)
             for f in dataclasses.fields(SamplingConfig))
  words = 'greedy' if t == 0 else f'temperature {t:g}'
  return words + f', top-k {k}' * bool(k) + f', top-p {p:g}' * (p < 1.0)


# Its fields: what a setup's flat view (`loading.GROUPED`), a run's
# settings and a measurement's dependencies (the experiments' sweep) name
# of the sampling. A new rule is a field here, its check, `describe` and
# `adjusted_logits`.
FIELDS = tuple(f.name for f in dataclasses.fields(SamplingConfig))


def adjusted_logits(logits: Array, config: SamplingConfig) -> Array:
  """Log-weights of the standardized distribution; excluded tokens are -inf.

  Args:
    logits: `[..., vocab]` raw logits.
    config: the sampling mode.

  Returns:
    `[..., vocab]` float32 logits whose softmax is the distribution sampled
    from; for greedy a one-hot on the argmax (0 there, -inf elsewhere).
  """
  logits = logits.astype(jnp.float32)
  if config.greedy:
    best = jnp.argmax(logits, axis=-1)[..., None]
    iota = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.where(iota == best, 0.0, -jnp.inf)
  logits = _scaled(logits, config.temperature)
  if config.topk:
    kth = jax.lax.top_k(logits, config.topk)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  if config.topp < 1.0:
    probs = jax.nn.softmax(logits, axis=-1)
    sorted_probs = jnp.flip(jnp.sort(probs, axis=-1), axis=-1)
    cum = jnp.cumsum(sorted_probs, axis=-1)
    # Index of the token whose inclusion first reaches mass >= topp.
    cut = jnp.sum(cum < config.topp, axis=-1, keepdims=True)
    cut = jnp.minimum(cut, logits.shape[-1] - 1)
    threshold = jnp.take_along_axis(sorted_probs, cut, axis=-1)
    logits = jnp.where(probs >= threshold, logits, -jnp.inf)
  return logits


def _scaled(logits: Array, temperature: float) -> Array:
  """`(logits - row max) / temperature`: <= 0, exactly 0 at the maxima.

  The shift comes first, so nothing overflows: x - max is finite or -inf
  (it rounds to -inf only below -3.4e38, where exp(d / t) is 0 for any
  t < 3e36 anyway) and d / t <= 0 for any t > 0, also when t underflows to
  0 in float32 (then d / t is -inf, the argmax limit). Entries equal to the
  max are set to 0 rather than computed, which keeps a max of +inf or -inf
  (an all -inf row) from making inf - inf = NaN.
  """
  # [..., vocab] -> [..., 1]
  top = jnp.max(logits, axis=-1, keepdims=True)
  at_top = logits == top
  shifted = jnp.where(at_top, 0.0, logits - top)
  return jnp.where(at_top, 0.0, shifted / jnp.float32(temperature))


def probabilities(logits: Array, config: SamplingConfig) -> Array:
  """`[..., vocab]` probabilities of the standardized distribution."""
  return jax.nn.softmax(adjusted_logits(logits, config), axis=-1)


def sample(rng: Array, logits: Array, config: SamplingConfig) -> Array:
  """One token per row `[...]` int32 from the standardized distribution."""
  if config.greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  return jax.random.categorical(
      rng, adjusted_logits(logits, config), axis=-1
  ).astype(jnp.int32)


def draw(rng: Array, logits: Array, config: SamplingConfig):
  """Samples from the standardized distribution and returns it too.

  `sample`'s twin for drafters, which must hand the distribution q they drew
  from to the verification.

  Args:
    rng: PRNG key.
    logits: `[batch, vocab]`.
    config: the sampling mode applied to both p and q.

  Returns:
    `(tokens [batch] int32, probs [batch, vocab] float32)`.
  """
  adjusted = adjusted_logits(logits, config)
  if config.greedy:
    token = jnp.argmax(adjusted, axis=-1).astype(jnp.int32)
  else:
    token = jax.random.categorical(rng, adjusted, axis=-1).astype(jnp.int32)
  return token, jax.nn.softmax(adjusted, axis=-1)
