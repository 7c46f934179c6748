"""PaSS's merged draft+verify loop: the look-ahead slots ride on the
verification call (see `specdec_jax.drafters.lookahead`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import sampling as sampling_lib
from specdec_jax import speculative
from specdec_jax.drafters.lookahead.model import embeddings
from specdec_jax.drafters.lookahead.model import tree_extend


@dataclasses.dataclass(frozen=True)
class LookaheadLoop(speculative.MergedLoop):
  """PaSS's merged draft+verify loop (see the package docstring).

  One target call per iteration on [last, x_1..x_g, slot_1..slot_L]
  (`tree`: one slot group after each real token); draft_params are the
  'pass' kind's (`pass_params`): only their first gamma look-ahead
  embeddings are read (slot j sees slots 1..j only, so the others would
  change nothing but the call's width).
  """

  num_lookahead: int
  tree: bool = False

  @property
  def width(self) -> int:
    if self.tree:  # g + 1 real tokens, g + 1 groups of g slots
      return (self.gamma + 1) * (self.gamma + 1)
    return self.gamma + 1 + self.num_lookahead

  def body_fn(self, target_params, draft_params,
              state: speculative.SpecState) -> speculative.SpecState:
    g, big_l = self.gamma, self.num_lookahead
    lookahead = embeddings(draft_params['lookahead'])[:big_l]
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    lengths = state.lengths
    drafts, q = state.draft_state.drafts, state.draft_state.q
    has = jnp.any(q[:, 0] > 0, axis=-1)  # [batch] rows with drafts
    # One call: [last, x_1..x_g, slots] (drafted) or [last, slots, pad].
    last = jnp.take_along_axis(state.sequences, (lengths - 1)[:, None], 1)
    tokens = jnp.where(has[:, None], drafts, 0)
    block = jnp.concatenate(
        [last, tokens, jnp.zeros((last.shape[0], big_l), jnp.int32)], axis=1)
    cache = state.target_cache.rewind(lengths - 1)
    if self.tree:
      logits, target_cache = tree_extend(
          self.target, target_params, jnp.concatenate([last, tokens], 1),
          cache, lookahead)
    else:
      slot0 = jnp.where(has, g + 1, 1)
      logits, target_cache = self.target.extend(
          target_params, block, cache, lookahead, slot0)
    p = sampling_lib.probabilities(logits[:, :g + 1], self.sampling)
    # Rows without drafts have q = 0 (undrafted: `speculative.verify`), so
    # n = 0 and their token comes from p_1, the target's after `last`.
    sequences, new_lengths, ended, stats, n = speculative.accept_and_commit(
        verify_rng, drafts, q, p, self.sampling, self.eos_id,
        self.max_decode_len, state.sequences, lengths, state.ended,
        state.stats)
    # Next drafts from the slots: aligned when the row had no drafts or
    # accepted all of them (slot j then predicts the j-th token after t).
    if self.tree:  # group n, after the last accepted draft
      pick = (g + 1 + n * g)[:, None] + jnp.arange(g)
      aligned = jnp.ones_like(has)
    else:
      pick = slot0[:, None] + jnp.arange(g)
      aligned = ~has | (n == g)
    chosen = jnp.take_along_axis(logits, pick[..., None], axis=1)
    b, _, v = chosen.shape
    next_drafts, next_q = sampling_lib.draw(
        draft_rng, chosen.reshape(b * g, v), self.sampling)
    next_q = jnp.where(aligned[:, None, None], next_q.reshape(b, g, v), 0.0)
    pending = speculative.Pending(next_drafts.reshape(b, g), next_q)
    return speculative.SpecState(sequences, new_lengths, ended, target_cache,
                                 pending, rng, stats)
