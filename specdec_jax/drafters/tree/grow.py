"""Growing a token tree level by level: the drafting rules, in one place.

Every tree drafter grows its tree here (`grow`): the T5 drafter
(`drafter.TreeDrafter`: a drafter call on each level's nodes with the
tree mask) and the self-drafting heads (`drafters.heads`, kind
'heads_tree': a head step on each node's parent state). They differ only
in how a level's nodes become their logits (the `expand` callback); the
rules are these:

  - a node's children are its `shape.max_children` best tokens (greedy:
    the top of its logits; sampled: a draw without replacement from q by
    the Gumbel-top-k trick: the trees carry `Tree.siblings =
    verify.WITHOUT`, the rule they are verified by); level d's slots take
    them as the shape says; a candidate q gives no mass (fewer than
    `max_children` tokens left) is not drafted;
  - the parents of a dynamic shape's level are ranked by their path's
    cumulative log probability (greedy: under the drafter's softmax;
    sampled: under q), most probable first;
  - under greedy, a shape with `top` has only its root and best nodes
    verified (`best_nodes`: EAGLE-2's re-ranking).
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

import jax
import jax.numpy as jnp

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters.tree import verify as verify_lib
from specdec_jax.drafters.tree.shape import TreeShape

Array = jax.Array

# (carry, tokens [batch, n], parent [batch, n], tree) -> (logits, carry).
Expand = Callable[[Any, Array, Array, verify_lib.Tree], Tuple[Array, Any]]


def grow(shape: TreeShape, sampling: sampling_lib.SamplingConfig,
         root: Array, logits: Array, expand: Expand, carry: Any,
         rng: Array) -> Tuple[verify_lib.Tree, verify_lib.Tree, Any]:
  """Drafts a tree of `shape` under `root`, level by level.

  Args:
    shape: the tree's shape (static).
    sampling: greedy or sampled (q is the standardized distribution).
    root: `[batch]` int32 the root's token (the row's last committed one).
    logits: `[batch, vocab]` the drafter's logits after the root.
    expand: `(carry, tokens, parent, tree) -> (logits, carry)`, called for
      each level d < D once its nodes are drawn: `tokens` `[batch, n_d]`
      the level's tokens, `parent` `[batch, n_d]` each node's parent as an
      index into level d - 1's slots, `tree` the tree so far; returns the
      drafter's logits after each of the level's nodes `[batch, n_d,
      vocab]`.
    carry: what `expand` threads (a cache, the nodes' states).
    rng: PRNG key of the sampled draws.

  Returns:
    `(drafted, verified, carry)`: the tree with every drafted node, the
    same tree with only the nodes the target verifies (`drafted` itself
    unless a greedy shape has `top`), and `expand`'s last carry.
  """
  batch = root.shape[0]
  rows = jnp.arange(batch)
  # Gumbel-top-k draws each node's children without replacement.
  tree = verify_lib.empty(batch, shape, logits.shape[-1], sampling.greedy,
                          siblings=verify_lib.WITHOUT)
  tree = tree.replace(tokens=tree.tokens.at[:, 0].set(root))
  score = jnp.zeros((batch, shape.width), jnp.float32)
  offsets, k = shape.offsets, shape.max_children
  level_logits = logits[:, None]  # [batch, n_{d-1}, vocab]
  rngs = jax.random.split(rng, shape.depth)
  for d in range(1, shape.depth + 1):
    lo, n_prev = offsets[d - 1], level_logits.shape[1]
    prev = jnp.arange(lo, lo + n_prev)
    if sampling.greedy:  # q is the one-hot of `top` (kept alone)
      top = jnp.argmax(level_logits.astype(jnp.float32), -1)
      tree = tree.replace(top=tree.top.at[:, prev].set(top.astype(jnp.int32)))
      keys = level_logits
      logp = jax.nn.log_softmax(level_logits.astype(jnp.float32), -1)
    else:
      adjusted = sampling_lib.adjusted_logits(level_logits, sampling)
      q = jax.nn.softmax(adjusted, axis=-1)
      tree = tree.replace(q=tree.q.at[:, prev].set(q))
      logp = jnp.log(q)
      keys = logp + jax.random.gumbel(rngs[d - 1], logp.shape)
    # [batch, n_prev, k] candidates, best first.
    _, cand = jax.lax.top_k(keys, k)
    cand_ok = (jnp.ones(cand.shape, bool) if sampling.greedy else
               jnp.take_along_axis(q, cand, -1) > 0)
    cand_logp = jnp.take_along_axis(logp, cand, -1)
    prev_score = score[:, prev]
    prev_valid = tree.valid[:, prev]
    if shape.dynamic:
      order = jnp.argsort(jnp.where(prev_valid, -prev_score, jnp.inf),
                          axis=1, stable=True)
    else:
      order = jnp.broadcast_to(jnp.arange(n_prev), (batch, n_prev))
    pick, rank = verify_lib.children_of(shape, d)
    local = order[:, pick]  # [batch, n_d] parent within level d-1
    parent = lo + local
    cand_at = cand[rows[:, None], local, rank[None, :]]
    ok = (cand_ok[rows[:, None], local, rank[None, :]] &
          jnp.take_along_axis(tree.valid, parent, 1))
    slots = jnp.arange(offsets[d], offsets[d] + shape.sizes[d - 1])
    tree = tree.replace(
        tokens=tree.tokens.at[:, slots].set(jnp.where(ok, cand_at, 0)),
        valid=tree.valid.at[:, slots].set(ok),
        parent=tree.parent.at[:, slots].set(parent))
    score = score.at[:, slots].set(
        jnp.take_along_axis(score, parent, 1) +
        cand_logp[rows[:, None], local, rank[None, :]])
    visible = tree.visible.at[:, slots].set(
        jnp.take_along_axis(tree.visible, parent[..., None], 1) |
        jax.nn.one_hot(slots, shape.width, dtype=bool)[None])
    tree = tree.replace(visible=visible)
    if d < shape.depth:
      level_logits, carry = expand(carry, tree.tokens[:, slots], local, tree)
  m = shape.verified_width(sampling.greedy)
  verified = best_nodes(tree, score, m) if m < shape.width else tree
  return tree, verified, carry


def best_nodes(tree: verify_lib.Tree, score, m: int) -> verify_lib.Tree:
  """The tree with only its root and the m - 1 valid nodes of highest
  path score verified (the rest invalid), per row.

  A child's score (its path's log probability) is at most its parent's;
  a small depth penalty breaks ties toward the parent, so the chosen set
  is ancestor-closed. Indices stay increasing (level order).
  """
  width = tree.tokens.shape[1]
  key = jnp.where(tree.valid, score - 1e-4 * tree.depth, -jnp.inf)
  key = key.at[:, 0].set(jnp.inf)
  _, chosen = jax.lax.top_k(key, m)
  chosen = jnp.sort(chosen, axis=1).astype(jnp.int32)
  rows = jnp.arange(tree.tokens.shape[0])[:, None]
  keep = jnp.zeros((tree.tokens.shape[0], width), bool).at[
      rows, chosen].set(True)
  return tree.replace(valid=tree.valid & keep, verified=chosen)
