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

from typing import Any, Callable, Dict, Optional, Tuple

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
  levels = _Levels(root, shape)
  fed_depth = jnp.asarray(np.concatenate(
      [np.full((len(f),), d, np.int32) for d, f in
       enumerate(((0,),) + shape.fed)]))
  level_logits = logits[:, None]  # [batch, n, vocab] after the called nodes
  row_of = {0: 0}  # row of `level_logits` of a position in the order
  order = None  # the last level's parent order (None: slot order)
  rngs = None if sampling.greedy else jax.random.split(rng, shape.depth)
  for d in range(1, shape.depth + 1):
    cand, cand_logp, cand_ok = levels.draw(level_logits, sampling,
                                           shape.max_children, rngs, d)
    call_row = levels.add(shape, d, row_of, order, cand, cand_logp, cand_ok)
    if d == shape.depth:
      break
    order, level_tokens, prev = levels.feed(shape, d, call_row)
    level_logits, carry = expand(carry, level_tokens, prev,
                                 _mask_of(fed_depth, levels.fed_visible))
    row_of = {p: i for i, p in enumerate(shape.fed[d - 1])}
  fed, verified = levels.assemble(shape, sampling, logits.shape[-1])
  return fed, verified, carry


class _Levels:
  """The tree `grow` has drafted so far, one array per level of each field
  (concatenated once, by `assemble`), and who sees whom among the nodes
  the drafter was called on. Python bookkeeping of traced arrays inside
  one trace of `grow` (no pytree).

  Attributes:
    tokens, valid, parents, scores: each level's `[batch, n]` tokens,
      drafted, parent (tree index) and path score (log probability).
    called, dists: each call's nodes (tree index) and their q / top.
    fed_parents: each call's nodes' parent (index into the last call's).
    fed_visible: `[batch, F, F]` bool, the called nodes' visibility.
  """

  def __init__(self, root: Array, shape: TreeShape):
    batch, width = root.shape[0], shape.fed_width
    self.tokens, self.valid = [root[:, None]], [jnp.ones((batch, 1), bool)]
    self.parents, self.scores = [jnp.zeros((batch, 1), jnp.int32)], [
        jnp.zeros((batch, 1), jnp.float32)]
    self.called, self.dists = [jnp.zeros((batch, 1), jnp.int32)], []
    self.fed_parents = [jnp.zeros((batch, 1), jnp.int32)]
    self.fed_visible = jnp.broadcast_to(jnp.eye(width, dtype=bool),
                                        (batch, width, width))

  def draw(self, logits: Array, sampling: sampling_lib.SamplingConfig,
           k: int, rngs: Optional[Array], d: int
           ) -> Tuple[Array, Array, Optional[Array]]:
    """Each called node's `k` candidate children for level `d`; records
    the nodes' q (sampled) or top (greedy) in `dists`.

    Args:
      logits: `[batch, n, vocab]` the drafter's logits after the nodes.
      sampling: greedy (the top-k of the logits) or sampled (a draw of k
        without replacement from q, Gumbel-top-k with key `rngs[d - 1]`).
      k: candidates per node.
      rngs: `[depth]` PRNG keys (None under greedy).
      d: the level drawn, 1 to depth.

    Returns:
      `(cand, cand_logp, cand_ok)`: `[batch, n, k]` the candidates (best
      first), their log probability, and whether q gives them mass (None
      under greedy: every candidate may be drafted).
    """
    if sampling.greedy:  # q is the one-hot of `top` (kept alone)
      x = logits.astype(jnp.float32)
      # [batch, n, k] best first (lower index first on ties, as argmax).
      values, cand = jax.lax.top_k(x, k)
      self.dists.append(cand[..., 0])
      # log_softmax at the candidates: (x - max) - log sum exp(x - max).
      cand_logp = (values - values[..., :1]) - jnp.log(
          jnp.sum(jnp.exp(x - values[..., :1]), -1, keepdims=True))
      return cand, cand_logp, None
    adjusted = sampling_lib.adjusted_logits(logits, sampling)
    q = jax.nn.softmax(adjusted, axis=-1)
    self.dists.append(q)
    logp = jnp.log(q)
    keys = logp + jax.random.gumbel(rngs[d - 1], logp.shape)
    _, cand = jax.lax.top_k(keys, k)
    cand_ok = jnp.take_along_axis(q, cand, -1) > 0
    cand_logp = jnp.take_along_axis(logp, cand, -1)
    return cand, cand_logp, cand_ok

  def add(self, shape: TreeShape, d: int, row_of: Dict[int, int],
          order: Optional[Array], cand: Array, cand_logp: Array,
          cand_ok: Optional[Array]) -> np.ndarray:
    """Adds level `d`: slot i takes candidate `rank` of the parent `pick`
    (`shape.levels[d - 1][i]`, the parent's position in the last level's
    `order`), drafted if its parent is and q gives it mass.

    Args:
      shape: the tree's shape.
      d: the level, 1 to depth.
      row_of: `{position in order: row of the last call}`.
      order: `[batch, >= max(pick) + 1]` the last level's parent order
        (None: slot order).
      cand, cand_logp, cand_ok: `draw`'s, for the last call's nodes.

    Returns:
      `[n_d]` each slot's parent's row in the last call.
    """
    pick, rank = (np.array(x) for x in zip(*shape.levels[d - 1]))
    call_row = np.array([row_of[p] for p in pick])
    # Each slot's parent, a slot of level d - 1 (static: `pick` itself).
    under = _taker(pick, order)
    ok = under(self.valid[-1])
    if cand_ok is not None:
      ok = ok & cand_ok[:, call_row, rank]
    self.tokens.append(jnp.where(ok, cand[:, call_row, rank], 0))
    self.valid.append(ok)
    self.parents.append(shape.offsets[d - 1] + under(jnp.broadcast_to(
        jnp.arange(self.valid[-2].shape[1], dtype=jnp.int32),
        self.valid[-2].shape)))
    self.scores.append(under(self.scores[-1]) + cand_logp[:, call_row, rank])
    return call_row

  def feed(self, shape: TreeShape, d: int, call_row: np.ndarray
           ) -> Tuple[Optional[Array], Array, Array]:
    """Records the nodes of level `d` that get children (`shape.fed`; a
    dynamic shape's most probable first, drafted before not drafted) as
    the next call's: their tree index, parent and visibility.

    Args:
      shape: the tree's shape.
      d: the level, 1 to depth - 1, just `add`ed.
      call_row: `add`'s.

    Returns:
      `(order, tokens, parent)`: the level's parent order `[batch,
      max(fed) + 1]` (None: slot order), the called nodes' tokens
      `[batch, n]` and each one's parent's row in the last call
      `[batch, n]`.
    """
    batch, feeds = self.tokens[0].shape[0], shape.fed[d - 1]
    if shape.dynamic:  # most probable first, drafted before not drafted
      # The first max(feeds) + 1 of a stable descending sort.
      _, order = jax.lax.top_k(
          jnp.where(self.valid[-1], self.scores[-1], -jnp.inf), max(feeds) + 1)
      order = order.astype(jnp.int32)
    else:
      order = None
    # The called nodes: their slot in level d, their parent's row in the
    # last call.
    chosen = _taker(np.array(feeds), order)
    slot = jnp.broadcast_to(jnp.arange(len(call_row), dtype=jnp.int32),
                            (batch, len(call_row)))
    self.called.append(shape.offsets[d] + chosen(slot))
    prev = chosen(jnp.broadcast_to(jnp.asarray(call_row, jnp.int32),
                                   (batch, len(call_row))))
    self.fed_parents.append(shape.fed_offsets[d - 1] + prev)
    at = slice(shape.fed_offsets[d], shape.fed_offsets[d] + len(feeds))
    # The called nodes' rows: their parent's, and themselves (one slice
    # of rows written, the gather fused into it).
    self.fed_visible = self.fed_visible.at[:, at].set(
        jnp.take_along_axis(self.fed_visible, self.fed_parents[-1][..., None],
                            1) |
        jnp.asarray(np.eye(shape.fed_width, dtype=bool)[at])[None])
    return order, chosen(self.tokens[-1]), prev

  def assemble(self, shape: TreeShape, sampling: sampling_lib.SamplingConfig,
               vocab: int) -> Tuple[Fed, verify_lib.Tree]:
    """`grow`'s `(fed, verified)`: the levels concatenated, each called
    node's q / top at its index."""
    cat = lambda xs: jnp.concatenate(xs, axis=1)
    batch = self.tokens[0].shape[0]
    tree = verify_lib.empty(batch, shape, vocab, sampling.greedy,
                            siblings=verify_lib.WITHOUT)
    tree = tree.replace(tokens=cat(self.tokens), valid=cat(self.valid),
                        parent=cat(self.parents))
    rows = jnp.arange(batch)[:, None]
    at = cat(self.called)  # [batch, F]
    if sampling.greedy:
      tree = tree.replace(top=tree.top.at[rows, at].set(cat(self.dists)))
    else:
      tree = tree.replace(q=tree.q.at[rows, at].set(cat(self.dists)))
    fed = Fed(tokens=jnp.take_along_axis(tree.tokens, at, 1),
              valid=jnp.take_along_axis(tree.valid, at, 1),
              parent=cat(self.fed_parents))
    m = shape.verified_width(sampling.greedy)
    verified = (best_nodes(tree, cat(self.scores), m) if m < shape.width else
                tree)
    return fed, verified


def _mask_of(depth: Array, visible: Array) -> MaskOf:
  """`base -> network.TreeMask` of the called nodes: `depth` `[F]` each
  one's depth, `visible` `[batch, F, F]` who sees whom."""
  batch, width = visible.shape[:2]
  return lambda base: TreeMask(base=base, depth=jnp.broadcast_to(
      depth, (batch, width)), visible=visible)


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
