"""The tree loop: one target call verifies a whole drafted tree.

`TreeLoop` is a `speculative.VerifyLoop` (so `scaffold`, `streaming` and
the statistics treat it like any loop): per iteration the drafter drafts a
tree (`TreeDrafter.propose_tree`), ONE target call on its `width` tokens
with the tree mask gives p at every node, `verify.verify_tree` walks it,
the accepted path and the next token are committed
(`speculative.commit_tokens`), and the path's keys / values move into the
target cache's chain slots. gamma is the tree's depth.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import sampling as sampling_lib
from specdec_jax import speculative
from specdec_jax.drafters.tree import verify as verify_lib
from specdec_jax.spec_stats import SpecStats


@dataclasses.dataclass(frozen=True)
class TreeLoop(speculative.VerifyLoop):
  """Speculative decoding with a token tree (module docstring).

  `accept_rejected` plants a bug for the tests' power checks only.
  """

  drafter: object = None
  accept_rejected: bool = False

  @property
  def shape(self):
    return self.drafter.shape

  @property
  def cache_length(self) -> int:
    return self.max_decode_len + self.shape.width

  def init_draft(self, draft_params, draft_inputs):
    return self.drafter.init(draft_params, draft_inputs, self.cache_length)

  def body_fn(self, target_params, draft_params, state):
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    lengths = state.lengths
    tree, draft_state = self.drafter.propose_tree(
        draft_params, state.draft_state, state.sequences, lengths,
        self.sampling, draft_rng)
    base = lengths - 1
    tokens, mask = tree.verified_call(base)
    logits, target_cache = self.target.extend(
        target_params, tokens, state.target_cache.rewind(base), tree=mask)
    p = sampling_lib.probabilities(logits, self.sampling)
    pruned = tokens.shape[1] < tree.tokens.shape[1]
    if pruned:  # back to tree indices (nodes not verified: never read)
      p = jnp.zeros(tree.q.shape, p.dtype).at[
          jnp.arange(p.shape[0])[:, None], tree.verified].set(p)
    n, path, next_token, accepted_at, beta_sum, beta_count = (
        verify_lib.verify_tree(verify_rng, tree, p, self.shape,
                               self.sampling, self.accept_rejected))
    active = ~state.ended
    sequences, new_lengths, ended = speculative.commit_tokens(
        verify_lib.path_tokens(tree, path), n, next_token, self.eos_id,
        self.max_decode_len, state.sequences, lengths, state.ended)
    # The path's nodes sit at their slot in the verified call.
    slot = jnp.take_along_axis(tree.slot_of(), path, 1) if pruned else path
    target_cache = target_cache.move_slots(base[:, None] + slot, base + 1)
    act = active.astype(jnp.int32)
    s = state.stats
    levels = jnp.sum(jnp.any(
        tree.valid[:, 1:, None] &
        (tree.depth[:, 1:, None] == jnp.arange(1, self.gamma + 1)), 1), 1)
    stats = SpecStats(
        iterations=s.iterations + 1,
        row_iterations=s.row_iterations + act,
        drafted=s.drafted + levels * act,
        accepted=s.accepted + n * act,
        accepted_at=s.accepted_at + jnp.sum(accepted_at * act[:, None], 0),
        beta_sum=s.beta_sum + beta_sum * act,
        beta_count=s.beta_count + beta_count * act)
    return speculative.SpecState(sequences, new_lengths, ended, target_cache,
                                 draft_state, rng, stats)
