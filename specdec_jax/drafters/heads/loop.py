"""The self-drafting heads' merged loops: drafting rides on the verification
call (see `specdec_jax.drafters.heads`): `HeadLoop` drafts chains,
`HeadTreeLoop` token trees (`specdec_jax.drafters.tree`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import sampling as sampling_lib
from specdec_jax import speculative
from specdec_jax.drafters.heads.model import Head
from specdec_jax.drafters.tree import verify as verify_lib
from specdec_jax.drafters.tree.loop import TreeLoop


def _head_laid_out(head: Head, draft_params):
  """The kind's params with the head rounded once to the weights' dtype
  (`Head.decoding_params`), before the loop."""
  return {**draft_params, 'head': head.decoding_params(draft_params['head'])}


@dataclasses.dataclass(frozen=True)
class HeadLoop(speculative.MergedLoop):
  """One (gamma + 1)-token target call per iteration returns logits and
  final states; after the verification the head drafts the next gamma
  tokens from the state at the last accepted position. draft_params are the
  'heads' kind's (`head_params`): only the head is read from them."""

  head: Head

  def with_target(self, draft_params, target_params):
    return _head_laid_out(self.head, super().with_target(draft_params,
                                                         target_params))

  def body_fn(self, target_params, draft_params,
              state: speculative.SpecState) -> speculative.SpecState:
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    lengths = state.lengths
    pending = state.draft_state
    last = jnp.take_along_axis(state.sequences, (lengths - 1)[:, None], 1)
    block = jnp.concatenate([last, pending.drafts], axis=1)
    cache = state.target_cache.rewind(lengths - 1)
    (logits, hidden), cache = self.target.extend(target_params, block, cache,
                                                 return_hidden=True)
    p = sampling_lib.probabilities(logits, self.sampling)
    # Rows without drafts (q = 0) accept none: their token is from p_1.
    sequences, new_lengths, ended, stats, n = speculative.accept_and_commit(
        verify_rng, pending.drafts, pending.q, p, self.sampling, self.eos_id,
        self.max_decode_len, sequences=state.sequences, lengths=lengths,
        ended=state.ended, stats=state.stats)
    # h_n gave the committed token y (accepted-draft bonus or residual).
    h_n = jnp.take_along_axis(hidden, n[:, None, None], 1)[:, 0]
    y = jnp.take_along_axis(sequences, (new_lengths - 1)[:, None], 1)[:, 0]
    drafts, q = self.head.draft(draft_params['head'], target_params, h_n, y,
                                cache, self.gamma, self.sampling, draft_rng)
    return speculative.SpecState(sequences, new_lengths, ended, cache,
                                 speculative.Pending(drafts, q), rng, stats)


@dataclasses.dataclass(frozen=True)
class HeadTreeLoop(TreeLoop):
  """The heads drafting token trees (kind 'heads_tree'): one target call
  per iteration on the pending tree with the tree mask returns logits AND
  final states (`TreeLoop.verify_commit`); after the walk the head drafts
  the next tree (`Head.draft_tree`) from the state at the last accepted
  node (the root if none) and the committed token, its root.

  `drafter` is the kind's `HeadTreeDrafter` (its `heads` and `shape`);
  draft_params are its params (only the head is read from them). Rows
  start with a tree of the root alone: the first call yields the token
  after BOS and the state the first tree is drafted from.
  """

  def init_draft(self, draft_params, draft_inputs):
    del draft_params
    batch = draft_inputs.shape[0]
    tree = verify_lib.empty(batch, self.shape, self.target.vocab_size,
                            self.sampling.greedy)
    m = self.shape.verified_width(self.sampling.greedy)
    return tree.replace(verified=tree.verified[:, :m])

  def with_target(self, draft_params, target_params):
    return _head_laid_out(self.drafter.heads, super().with_target(
        draft_params, target_params))

  def body_fn(self, target_params, draft_params,
              state: speculative.SpecState) -> speculative.SpecState:
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    sequences, lengths, ended, cache, stats, h = self.verify_commit(
        target_params, state, state.draft_state, verify_rng,
        return_hidden=True)
    # h gave the committed token y, the next tree's root.
    y = jnp.take_along_axis(sequences, (lengths - 1)[:, None], 1)[:, 0]
    tree = self.drafter.heads.draft_tree(
        draft_params['head'], target_params, h, y, cache, self.shape,
        self.sampling, draft_rng)
    return speculative.SpecState(sequences, lengths, ended, cache, tree, rng,
                                 stats)
