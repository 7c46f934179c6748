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

A level costs the drafter one call (`expand`), and on an accelerator at
batch 1 that call is bound by its kernel launches, so a level does no
more than it must: the call is on the level's nodes that get children
(`TreeShape.fed`: 4 of beam:16,4,16's 64), a greedy level draws its
children by a top-k of the raw logits and normalizes only those k values
(`log_softmax` at the candidates, exactly: the row's logsumexp, no
`[n, vocab]` log-probabilities written), and who sees whom grows by the
new nodes' rows of the called nodes' `[F, F]` mask, never a `[T, T]`
matrix of every drafted node (the target's call builds its own once,
`verify.visibility`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters.tree import verify as verify_lib
from specdec_jax.drafters.tree.shape import TreeShape
from specdec_jax.network import TreeMask

Array = jax.Array


@struct.dataclass
class Fed:
  """The nodes a drafter was called on, in call order (`TreeShape.fed`):
  index 0 the root, then each level's fed nodes; index i sits at cache
  slot base + i of a drafter that writes its calls in turn.

  Attributes:
    tokens: `[batch, F]` int32.
    valid: `[batch, F]` bool, the node was drafted.
    parent: `[batch, F]` int32 index of each node's parent (root: 0).
  """

  tokens: Array
  valid: Array
  parent: Array


# (carry, tokens [batch, n], parent [batch, n], mask_of) -> (logits, carry);
# mask_of(base [batch]) is the called nodes' `network.TreeMask`.
MaskOf = Callable[[Array], TreeMask]
Expand = Callable[[Any, Array, Array, MaskOf], Tuple[Array, Any]]


def grow(shape: TreeShape, sampling: sampling_lib.SamplingConfig,
         root: Array, logits: Array, expand: Expand, carry: Any,
         rng: Array) -> Tuple[Fed, verify_lib.Tree, Any]:
  """Drafts a tree of `shape` under `root`, level by level.

  Args:
    shape: the tree's shape (static).
    sampling: greedy or sampled (q is the standardized distribution).
    root: `[batch]` int32 the root's token (the row's last committed one).
    logits: `[batch, vocab]` the drafter's logits after the root.
    expand: `(carry, tokens, parent, mask_of) -> (logits, carry)`, called
      for each level d < D once its nodes are drawn, on the level's nodes
      that get children (`TreeShape.fed`, in the level's parent order):
      `tokens` `[batch, n]` their tokens, `parent` `[batch, n]` each one's
      parent as an index into the previous call's nodes (level 1: the
      root, index 0), `mask_of(base)` the `network.TreeMask` of the
      called nodes so far, these included, the root at cache slot `base`
      (`Fed`'s layout); returns the drafter's logits after each of them
      `[batch, n, vocab]`.
    carry: what `expand` threads (a cache, the nodes' states).
    rng: PRNG key of the sampled draws.

  Returns:
    `(fed, verified, carry)`: the nodes `expand` was called on (`Fed`;
    a drafter's cache holds them), the tree the target verifies (every
    drafted node, or a greedy shape's `top` best), and `expand`'s last
    carry.
  """
  batch = root.shape[0]
  offsets, fed_offsets = shape.offsets, shape.fed_offsets
  k, width = shape.max_children, shape.fed_width
  # Level by level, each level's own arrays (concatenated once at the
  # end): tokens, drafted, parent (tree index) and path score.
  tokens, valid = [root[:, None]], [jnp.ones((batch, 1), bool)]
  parents, scores = [jnp.zeros((batch, 1), jnp.int32)], [
      jnp.zeros((batch, 1), jnp.float32)]
  # The called nodes (tree index) and their q / top, level by level.
  called, dists = [jnp.zeros((batch, 1), jnp.int32)], []
  fed_parents = [jnp.zeros((batch, 1), jnp.int32)]
  fed_visible = jnp.broadcast_to(jnp.eye(width, dtype=bool),
                                 (batch, width, width))
  fed_depth = jnp.asarray(np.concatenate(
      [np.full((len(f),), d, np.int32) for d, f in
       enumerate(((0,),) + shape.fed)]))
  level_logits = logits[:, None]  # [batch, n, vocab] after the called nodes
  row_of = {0: 0}  # row of `level_logits` of a position in the order
  order = None  # the last level's parent order (None: slot order)
  rngs = None if sampling.greedy else jax.random.split(rng, shape.depth)
  for d in range(1, shape.depth + 1):
    if sampling.greedy:  # q is the one-hot of `top` (kept alone)
      x = level_logits.astype(jnp.float32)
      # [batch, n, k] best first (lower index first on ties, as argmax).
      values, cand = jax.lax.top_k(x, k)
      dists.append(cand[..., 0])
      # log_softmax at the candidates: (x - max) - log sum exp(x - max).
      cand_logp = (values - values[..., :1]) - jnp.log(
          jnp.sum(jnp.exp(x - values[..., :1]), -1, keepdims=True))
      cand_ok = None
    else:
      adjusted = sampling_lib.adjusted_logits(level_logits, sampling)
      q = jax.nn.softmax(adjusted, axis=-1)
      dists.append(q)
      logp = jnp.log(q)
      keys = logp + jax.random.gumbel(rngs[d - 1], logp.shape)
      _, cand = jax.lax.top_k(keys, k)
      cand_ok = jnp.take_along_axis(q, cand, -1) > 0
      cand_logp = jnp.take_along_axis(logp, cand, -1)
    pick, rank = (np.array(x) for x in zip(*shape.levels[d - 1]))
    call_row = np.array([row_of[p] for p in pick])
    # Each slot's parent, a slot of level d - 1 (static: `pick` itself).
    under = _taker(pick, order)
    ok = under(valid[-1])
    if cand_ok is not None:
      ok = ok & cand_ok[:, call_row, rank]
    tokens.append(jnp.where(ok, cand[:, call_row, rank], 0))
    valid.append(ok)
    parents.append(offsets[d - 1] + under(jnp.broadcast_to(
        jnp.arange(valid[-2].shape[1], dtype=jnp.int32), valid[-2].shape)))
    scores.append(under(scores[-1]) + cand_logp[:, call_row, rank])
    if d == shape.depth:
      break
    feeds = shape.fed[d - 1]
    if shape.dynamic:  # most probable first, drafted before not drafted
      # The first max(feeds) + 1 of a stable descending sort.
      _, order = jax.lax.top_k(jnp.where(ok, scores[-1], -jnp.inf),
                               max(feeds) + 1)
      order = order.astype(jnp.int32)
    else:
      order = None
    # The called nodes: their slot in level d, their parent's row in the
    # last call.
    chosen = _taker(np.array(feeds), order)
    slot = jnp.broadcast_to(jnp.arange(len(pick), dtype=jnp.int32),
                            (batch, len(pick)))
    called.append(offsets[d] + chosen(slot))
    prev = chosen(jnp.broadcast_to(jnp.asarray(call_row, jnp.int32),
                                   (batch, len(pick))))
    fed_parents.append(fed_offsets[d - 1] + prev)
    at = np.arange(fed_offsets[d], fed_offsets[d] + len(feeds))
    # The called nodes' rows: their parent's, and themselves.
    fed_visible = fed_visible.at[:, at].set(
        jnp.take_along_axis(fed_visible, fed_parents[-1][..., None], 1) |
        jnp.asarray(np.eye(width, dtype=bool)[at])[None])
    level_tokens = chosen(tokens[-1])

    def mask_of(base, visible=fed_visible):
      return TreeMask(base=base, depth=jnp.broadcast_to(
          fed_depth, (batch, width)), visible=visible)

    level_logits, carry = expand(carry, level_tokens,
                                 prev, mask_of)
    row_of = {p: i for i, p in enumerate(feeds)}
  # Assembled once: the tree, each called node's q / top at its index.
  cat = lambda xs: jnp.concatenate(xs, axis=1)
  tree = verify_lib.empty(batch, shape, logits.shape[-1], sampling.greedy,
                          siblings=verify_lib.WITHOUT)
  tree = tree.replace(tokens=cat(tokens), valid=cat(valid),
                      parent=cat(parents))
  rows = jnp.arange(batch)[:, None]
  at = cat(called)  # [batch, F]
  if sampling.greedy:
    tree = tree.replace(top=tree.top.at[rows, at].set(cat(dists)))
  else:
    tree = tree.replace(q=tree.q.at[rows, at].set(cat(dists)))
  fed = Fed(tokens=jnp.take_along_axis(tree.tokens, at, 1),
            valid=jnp.take_along_axis(tree.valid, at, 1),
            parent=cat(fed_parents))
  m = shape.verified_width(sampling.greedy)
  verified = (best_nodes(tree, cat(scores), m) if m < shape.width else
              tree)
  return fed, verified, carry


def _taker(index: np.ndarray, order: Optional[Array]):
  """`x [batch, n] -> [batch, len(index)]`: x at the `index`-th positions
  of a level's `order` (`[batch, >= max(index) + 1]` slots; None: slot
  order, a static slice or gather)."""
  if order is None:
    return lambda x: x[:, index]
  at = order[:, index]
  return lambda x: jnp.take_along_axis(x, at, 1)


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
