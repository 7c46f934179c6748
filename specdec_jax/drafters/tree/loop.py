"""The tree loop: one target call verifies a whole drafted tree.

`TreeLoop` is a `speculative.VerifyLoop` (so `scaffold`, `streaming` and
the statistics treat it like any loop): per iteration the drafter drafts a
tree (`TreeDrafter.propose_tree`), ONE target call on its `width` tokens
with the tree mask gives p at every node, `verify.verify_tree` walks it,
the accepted path and the next token are committed
(`speculative.commit_tokens`), and the path's keys / values move into the
target cache's chain slots (`TreeLoop.verify_commit`, which the heads'
tree loop shares), in the next call's writes of keys / values
(`DecoderCache.move_slots(later=True)`). gamma is the tree's depth.
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
class TreeLoop(speculative.DrafterLoop):
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
    """Slots of the target's cache: what a call writes, the verified
    width (not the drafted one: a `/N` shape verifies N + 1 of its nodes)
    from the last committed token, at most max_decode_len, and the room
    of the accepted path's move that the next call's writes make (its
    depth: `DecoderCache.with_pending`)."""
    return self.max_decode_len + self.shape.verified_width(
        self.sampling.greedy) + self.shape.depth

  def init_target_cache(self, target_params, inputs):
    """The target's cache, with room for a path's pending move."""
    return super().init_target_cache(target_params, inputs).with_pending(
        self.shape.depth)

  @property
  def draft_cache_length(self) -> int:
    """Slots of the drafter's cache: its level calls write the nodes that
    get children (`TreeShape.fed_width` with the root), its catch-up two
    tokens ending at the last committed one."""
    return self.max_decode_len + self.shape.fed_width

  def init_draft(self, draft_params, draft_inputs):
    return self.drafter.init(draft_params, draft_inputs,
                             self.draft_cache_length)

  def body_fn(self, target_params, draft_params, state):
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    tree, draft_state = self.drafter.propose_tree(
        draft_params, state.draft_state, state.sequences, state.lengths,
        self.sampling, draft_rng)
    sequences, lengths, ended, target_cache, stats, _ = self.verify_commit(
        target_params, state, tree, verify_rng)
    return speculative.SpecState(sequences, lengths, ended, target_cache,
                                 draft_state, rng, stats)

  def verify_commit(self, target_params, state: speculative.SpecState,
                    tree: verify_lib.Tree, rng, return_hidden: bool = False):
    """Verifies `tree` (its root the rows' last committed token) in one
    target call, commits the accepted path and the next token, and moves
    the path's keys / values into the target cache's chain slots.

    Args:
      target_params: the target's params.
      state: the loop state before the call.
      tree: the drafted tree (`verify.Tree`).
      rng: PRNG key of the verification.
      return_hidden: also return the target's final state at the last
        accepted node (`network.Decoder.extend`'s hidden).

    Returns:
      `(sequences, lengths, ended, target_cache, stats, hidden)`: hidden
      `[batch, embed]` the state at the last accepted node (the root if
      none was), whose distribution the next token was drawn from; None
      unless `return_hidden`.
    """
    lengths = state.lengths
    base = lengths - 1
    tokens, mask = tree.verified_call(base)
    cache = state.target_cache.rewind(base)
    if return_hidden:
      (logits, hidden), target_cache = self.target.extend(
          target_params, tokens, cache, tree=mask, return_hidden=True)
    else:
      logits, target_cache = self.target.extend(target_params, tokens,
                                                cache, tree=mask)
    if self.sampling.greedy:  # the argmax is all a greedy walk reads
      p = jnp.argmax(logits.astype(jnp.float32), -1).astype(jnp.int32)
    else:
      p = sampling_lib.probabilities(logits, self.sampling)
    pruned = tokens.shape[1] < tree.tokens.shape[1]
    if pruned:  # back to tree indices (nodes not verified: never read)
      p = jnp.zeros(tree.tokens.shape + p.shape[2:], p.dtype).at[
          jnp.arange(p.shape[0])[:, None], tree.verified].set(p)
    n, path, next_token, accepted_at, beta_sum, beta_count = (
        verify_lib.verify_tree(rng, tree, p, self.shape, self.sampling,
                               self.accept_rejected))
    active = ~state.ended
    sequences, new_lengths, ended = speculative.commit_tokens(
        verify_lib.path_tokens(tree, path), n, next_token, self.eos_id,
        self.max_decode_len, state.sequences, lengths, state.ended)
    # The path's nodes sit at their slot in the verified call; the next
    # call's writes move them (no kernel a layer of its own on a GPU).
    slot = jnp.take_along_axis(tree.slot_of(), path, 1) if pruned else path
    target_cache = target_cache.move_slots(base[:, None] + slot, base + 1,
                                           later=True)
    if return_hidden:  # the last accepted node's slot (the root's: 0)
      last = jnp.take_along_axis(slot, jnp.maximum(n - 1, 0)[:, None], 1)
      last = jnp.where(n[:, None] > 0, last, 0)
      hidden = jnp.take_along_axis(hidden, last[:, :, None], 1)[:, 0]
    else:
      hidden = None
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
    return sequences, new_lengths, ended, target_cache, stats, hidden
