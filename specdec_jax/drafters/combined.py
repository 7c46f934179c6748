"""A copying drafter where it has a draft, the draft model elsewhere.

`CombinedDrafter` (kind 'combined'): per row and position, the output
cache's (or prompt lookup's) copied token where it matches and the draft
model is unsure or the match is long, else the T5 drafter's sample; the
model is not called when every row copies. Exact in every sampling mode.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp

from specdec_jax import interfaces
from specdec_jax import sampling as sampling_lib
from specdec_jax import speculative
from specdec_jax.drafters import cache as cache_kind
from specdec_jax.drafters import registry
from specdec_jax.drafters import t5
from specdec_jax.drafters.lookup import LookupDrafter
from specdec_jax.drafters.lookup import lookup_next
from specdec_jax.drafters.lookup import one_hot_logits
from specdec_jax.drafters.t5 import T5Drafter

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class CombinedDrafter:
  """A copying drafter where it has a draft, a model drafter elsewhere.

  Per row and per draft position: where the `reference` (a `LookupDrafter`
  or `CacheDrafter`) matches the context (prefix ++ drafts so far) and
  either the model is unsure (its top token's probability, softmax of its
  raw logits, below `trust`) or the match is the longest the reference
  tries (`n_max` tokens), its copied token with one-hot q; elsewhere the
  `model` drafter's (a `T5Drafter`) sample and q, the model consuming
  whichever token was drafted. (trust = 1: copy wherever anything matches.)
  In an iteration where every row's first draft is such a sure copy (or the
  row has ended) the model is not called at all: the rows copy as far as
  the reference matches and stop there (q = 0 after), and the model's cache
  is caught up later (`T5Drafter.catch_up`). Where copying works the drafter
  costs ~0, elsewhere it costs the model's calls. Exact in every sampling
  mode: each draft carries the q it was drawn from, and the choice between
  the two is made before drawing. (The model's own `confidence` is not
  applied here.)

  params: `{'reference': ..., 'model': ...}`; state: `(reference state,
  model cache)`.
  """

  reference: LookupDrafter
  model: T5Drafter
  trust: float = 1.0

  def __post_init__(self):
    if not self.reference.adaptive:
      object.__setattr__(self, 'reference',
                         dataclasses.replace(self.reference, adaptive=True))
    check_vocab = self.reference.vocab_size != self.model.vocab_size
    if check_vocab:
      raise ValueError(f'CombinedDrafter: the reference drafts ids of '
                       f'{self.reference.vocab_size} tokens, the model of '
                       f'{self.model.vocab_size}.')

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def check_params(self, params) -> None:
    if not isinstance(params, Mapping) or set(params) != {'reference',
                                                          'model'}:
      raise ValueError("the combined drafter's params are {'reference': ..., "
                       f"'model': ...}}, got {type(params).__name__}"
                       f'{sorted(params) if isinstance(params, Mapping) else ""}.')
    self.reference.check_params(params['reference'])
    self.model.check_params(params['model'])

  def init(self, params, encoder_input_tokens, max_length: int):
    return (self.reference.init(params['reference'], encoder_input_tokens,
                                max_length),
            self.model.init(params['model'], encoder_input_tokens,
                            max_length))

  def prefill(self, params, state, sequences, lengths):
    return (state[0], self.model.prefill(params['model'], state[1],
                                         sequences, lengths))

  def with_store(self, params, store):
    """`params` after `store` changed (the reference's, when it is an
    `interfaces.StoreDrafter`: a `CacheDrafter`; a `LookupDrafter` reads no
    store)."""
    if isinstance(self.reference, interfaces.StoreDrafter):
      return dict(params, reference=self.reference.with_store(
          params['reference'], store))
    return params

  def with_target(self, params, target_params):
    """`params` with the target's, where the reference reads them (an
    `interfaces.TargetReader`: a `CacheDrafter`)."""
    return dict(params, reference=speculative.with_target(
        self.reference, params['reference'], target_params))

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    """The reference's one-hot logits where it matches, the model's
    elsewhere (per position, as `propose`)."""
    tokens, matched = self.reference.score_tokens(
        params['reference'], encoder_input_tokens, decoder_input_tokens)
    model = self.model.score(params['model'], encoder_input_tokens,
                             decoder_input_tokens)
    return jnp.where(matched[..., None],
                     one_hot_logits(tokens, self.vocab_size), model)

  def propose(self, params, state, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """Per position: the reference's draft where it matches, else the
    model's; the model is skipped when every row's first draft matches."""
    ref_state, cache = state
    ref, model = self.reference, self.model
    context = jnp.pad(sequences.astype(jnp.int32), ((0, 0), (0, gamma)))
    pos = jnp.arange(context.shape[1])[None]
    # With trust < 1 the model may overrule a copy unless its match is the
    # longest (n_max): only such rows may skip the model.
    sure_n = ref.n_min if self.trust >= 1 else ref.n_max
    _, first_n = lookup_next(ref_state, context, lengths, ref.n_max,
                             ref.n_min)
    last_token = jnp.take_along_axis(sequences, (lengths - 1)[:, None], 1)
    need = (first_n < sure_n) & (last_token[:, 0] != ref.eos_id)
    # Slots from lengths - 1 on may hold drafts that were not committed.
    cache = cache.rewind(jnp.minimum(cache.position, lengths - 1))
    rngs = jax.random.split(rng, gamma)

    def copy_only(cache):
      drafts, q, _ = ref.propose(params['reference'], ref_state, sequences,
                                 lengths, gamma, sampling, rng)
      return drafts, q, cache

    def mixed(cache):
      mp = params['model']
      logits, cache = model.catch_up_from_behind(mp, cache, sequences,
                                                  lengths, gamma + 1)

      def choose(i, context, logits):
        token_r, n = lookup_next(ref_state, context, lengths + i, ref.n_max,
                                 ref.n_min)
        unsure = jnp.max(jax.nn.softmax(logits.astype(jnp.float32)),
                         axis=-1) < self.trust
        hit = (n > 0) & (unsure | (n >= ref.n_max))
        token_r = jnp.where(n > 0, token_r, ref.eos_id)
        token_r, q_r = sampling_lib.draw(
            rngs[i], one_hot_logits(token_r, self.vocab_size), sampling)
        token_m, q_m = sampling_lib.draw(rngs[i], logits, sampling)
        token = jnp.where(hit, token_r, token_m)
        q = jnp.where(hit[:, None], q_r, q_m)
        context = jnp.where(pos == (lengths + i)[:, None], token[:, None],
                            context)
        return token, q, context

      def step(carry, i):
        context, logits, cache = carry
        token, q, context = choose(i, context, logits)
        next_logits, cache = model.model.extend(mp, token[:, None], cache)
        return (context, next_logits[:, 0], cache), (token, q)

      # As T5Drafter: gamma - 1 calls; x_gamma is not consumed (the next
      # catch-up feeds it if it was accepted).
      (ctx, logits, cache), (tokens, qs) = jax.lax.scan(
          step, (context, logits, cache), jnp.arange(gamma - 1))
      token, q, _ = choose(gamma - 1, ctx, logits)
      drafts = jnp.concatenate([tokens.T, token[:, None]], axis=1)
      return drafts, jnp.concatenate(
          [jnp.moveaxis(qs, 0, 1), q[:, None]], axis=1), cache

    drafts, q, cache = jax.lax.cond(jnp.any(need), mixed, copy_only, cache)
    return drafts, q, (ref_state, cache)



COMBINED_TRUST = 0.3
COMBINED_LONG_MATCH = 6


def build(source: registry.DraftSource):
  """The cache (or, without a target to embed with, lookup) over the draft
  model, by the rule above."""
  model, model_params = t5.build(source, 'combined')
  if source.target_model is None:
    reference, ref_params = LookupDrafter(source.vocab_size, adaptive=True), ()
  else:
    reference, ref_params = cache_kind.build(source)
  reference = dataclasses.replace(reference, n_max=COMBINED_LONG_MATCH)
  return (CombinedDrafter(reference, model, COMBINED_TRUST),
          {'reference': ref_params, 'model': model_params})


KIND = registry.DrafterKind(
    'combined', needs_model=True, build=build, uses_cache=True,
    description='the cache / lookup draft where one matches, the draft '
                'model elsewhere (per row, per iteration)')
