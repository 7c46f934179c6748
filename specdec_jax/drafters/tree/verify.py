"""Exact verification of a token tree in one target call.

The target's distributions p at every tree node come from ONE call on the
tree's `width` tokens (`network.TreeMask`). The walk starts at the root;
at a node u, its children c_1..c_m (in slot order) are tried in turn:

  greedy: c_j is accepted iff it is the target's argmax at u (the first
    such child: a repeat of it is never reached);
  sampled: multi-step speculative sampling, by the rule the drafter drew
    the siblings with (`Tree.siblings`, static). With residual p' = p_u
    and proposal q' = q_u to start, c_j is accepted w.p.
    min(1, p'(c_j) / q'(c_j)); on a rejection
      'without' replacement (Sequoia; draws from q_u without replacement,
        e.g. Gumbel-top-k, the rule of every tree `grow.py` drafts):
        p' <- norm(max(p' - q', 0)), q' <- q' without c_j, renormalized;
      'with' replacement (SpecInfer; i.i.d. draws from q_u):
        p' <- norm(max(p' - q_u, 0)), q' = q_u throughout (a repeat of a
        rejected token then has p' = 0 there and is rejected again).
    A child whose token has q'(c_j) = 0 (q_u excludes it or, without
    replacement, it was tried already) is SKIPPED: neither accepted nor
    rejected, p' and q' unchanged.

An accepted child becomes u and the walk goes one level down; where no
child is accepted (or u has none) the next token is drawn from p' (greedy:
the argmax); a node under a child that was not accepted is never reached.

Why the law is the target's. One step of speculative sampling (accept
x ~ q' w.p. min(1, p'(x) / q'(x)), else draw from norm(max(p' - q', 0)))
outputs p' for ANY proposal q', provided x is drawn from q' (Algorithm 1).
At u the walk is a chain of such steps ending in a draw from the last
residual, so, by induction from the last sibling back, what leaves u has
law p_u when each sibling it does not skip is, given what was drafted
before it, a draw from its step's q': q_u ('with'), q_u without the
earlier siblings' tokens ('without'). A skipped sibling is one its rule
cannot draw there (q' = 0): the walk on the tree is then the walk on the
tree without it and its subtree, so it contributes nothing; rejecting it
instead would update p' for a draw that never happened (a repeat of the
first child, rejected twice, turns p = [.5, .3, .2], q = [.1, .2, .7]
into [.6, .2, .2]). An accepted child's subtree was drawn from its own q
given the tokens above it, so the same argument holds one level down. How
many siblings a node has may depend on what was drafted before them (the
levels above), never on their own draws: the shapes of `shape.py` (static
or dynamic) decide counts without seeing them. The rule must be the
drafter's: 'with' on siblings drawn without replacement is biased, while
'without' on i.i.d. siblings stays exact (a repeat of a tried token is
skipped, and a sibling that is not one is, given that, a draw from q'),
though 'with' accepted more of them on the tests' trees. tests/drafters/test_trees.py
checks the law of hand-built trees by chi-square under both rules
(repeated and q = 0 siblings, nodes under rejected parents, four sampling
configurations) and of drafted trees end to end, and that planted bugs
fail those tests.

References: Miao et al. 2024 (SpecInfer, multi-step speculative sampling,
arXiv 2305.09781), Chen et al. 2024 (Sequoia, sampling without
replacement, arXiv 2402.12374).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.drafters.tree.shape import TreeShape
from specdec_jax.network import TreeMask
from specdec_jax.sampling import SamplingConfig

Array = jax.Array

# How a node's children were drawn from its q (`Tree.siblings`).
WITHOUT = 'without'  # without replacement (Sequoia): `grow.py`'s trees
WITH = 'with'  # i.i.d., with replacement (SpecInfer)
SIBLING_RULES = (WITHOUT, WITH)


@struct.dataclass
class Tree:
  """A drafted token tree, tree index 0 = the root (`shape.TreeShape`).

  Attributes:
    tokens: `[batch, T]` int32, the root's and every node's token (a node
      that was not drafted holds 0, a valid id for the call).
    valid: `[batch, T]` bool, the node was drafted (the root: True).
    parent: `[batch, T]` int32 tree index of each node's parent (root: 0).
    depth: `[batch, T]` int32.
    q: `[batch, T, vocab]` float32, the drafter's standardized distribution
      each node's children were drawn from (0 for leaves); greedy trees
      keep `[batch, T, 0]` (the one-hot q is `top`).
    top: `[batch, T]` int32, the drafter's most likely token after each
      node (greedy trees; 0 for leaves and in sampled trees).
    verified: `[batch, M]` int32, the tree indices the target's call
      verifies, increasing (root first; parents before children): all T,
      or the best nodes of a `TreeShape.top` tree (the others invalid).
    levels: static, the tree's depth D (the rounds `visibility` takes).
    siblings: static, how each node's children were drawn from its q:
      `WITHOUT` or `WITH` replacement (the sampled walk's rule, module
      docstring); the drafter that fills the tree says which.

  Who sees whom is not stored: the target's call builds it once, among
  the verified nodes only, from `parent` (`verified_call`).
  """

  tokens: Array
  valid: Array
  parent: Array
  depth: Array
  q: Array
  top: Array
  verified: Array
  levels: int = struct.field(pytree_node=False)
  siblings: str = struct.field(pytree_node=False, default=WITHOUT)

  def mask(self, base: Array) -> TreeMask:
    """The `network.TreeMask` of every node, the root at slot `base`."""
    every = jnp.broadcast_to(
        jnp.arange(self.tokens.shape[1], dtype=jnp.int32), self.tokens.shape)
    return TreeMask(base=base, depth=self.depth,
                    visible=visibility(self.parent, every, self.levels))

  def verified_call(self, base: Array) -> Tuple[Array, TreeMask]:
    """(tokens [batch, M], mask) of the target's call on `verified`."""
    idx = self.verified
    if idx.shape[1] == self.tokens.shape[1]:  # every node: as drafted
      return self.tokens, self.mask(base)
    take = lambda x: jnp.take_along_axis(x, idx, axis=1)
    return take(self.tokens), TreeMask(
        base=base, depth=take(self.depth),
        visible=visibility(self.parent, idx, self.levels))

  def slot_of(self) -> Array:
    """`[batch, T]` each node's index in the verified call (0 if none)."""
    rows = jnp.arange(self.verified.shape[0])[:, None]
    m = self.verified.shape[1]
    return jnp.zeros_like(self.tokens).at[rows, self.verified].set(
        jnp.arange(m, dtype=jnp.int32)[None, :])


def _normalized(x: Array) -> Array:
  total = jnp.sum(x, axis=-1, keepdims=True)
  return jnp.where(total > 0, x / jnp.where(total > 0, total, 1.0), 0.0)


def _walked(n: Array, path: Array, next_token: Array, beta_sum: Array,
            beta_count: Array):
  """`verify_tree`'s return value from a walk's figures (both walks')."""
  accepted_at = jnp.arange(path.shape[1])[None, :] < n[:, None]
  return (n, path, next_token.astype(jnp.int32), accepted_at, beta_sum,
          beta_count)


class _Walk(NamedTuple):
  """Where each row's walk is, and what it has counted, level by level:
  the sampled walk's state (the greedy walk runs on the whole tree at
  once, `_walk_greedy`)."""

  u: Array  # [batch] the current node
  walking: Array  # [batch] the walk reached u by accepting it (root: all)
  n: Array  # [batch] accepted nodes
  path: Array  # [batch, D] their tree indices (0 after the n-th)
  beta_sum: Array  # [batch]
  beta_count: Array  # [batch]

  @classmethod
  def start(cls, batch: int, depth: int) -> '_Walk':
    zeros = jnp.zeros((batch,), jnp.int32)
    return cls(zeros, jnp.ones((batch,), bool), zeros,
               jnp.zeros((batch, depth), jnp.int32),
               jnp.zeros((batch,), jnp.float32), zeros)

  def children(self, tree: Tree, slots: Array) -> Tuple[Array, Array]:
    """`([batch, size] u's drafted children among slots, [batch] a walking
    row's u has any)`."""
    children = ((tree.parent[:, slots] == self.u[:, None]) &
                tree.valid[:, slots])
    return children, jnp.any(children, axis=1) & self.walking

  def step(self, level: int, has: Array, beta: Array, found: Array,
           chosen: Array) -> '_Walk':
    """Counts beta at the rows whose u `has` children, and moves the rows
    that `found` a child to it (`chosen`); the others stop."""
    return _Walk(
        u=jnp.where(found, chosen, self.u), walking=found,
        n=self.n + found.astype(jnp.int32),
        path=self.path.at[:, level - 1].set(jnp.where(found, chosen, 0)),
        beta_sum=self.beta_sum + jnp.where(has, beta, 0.0),
        beta_count=self.beta_count + has.astype(jnp.int32))

  def result(self, next_token: Array):
    """`verify_tree`'s return value."""
    return _walked(self.n, self.path, next_token, self.beta_sum,
                   self.beta_count)


def verify_tree(rng: Array, tree: Tree, p: Array, shape: TreeShape,
                sampling: SamplingConfig, accept_rejected: bool = False,
                wrong_update: bool = False):
  """Walks every row's tree (see the module docstring).

  Args:
    rng: PRNG key.
    tree: the drafted tree.
    p: `[batch, T, vocab]` the target's standardized distributions after
      each tree node; greedy: `[batch, T]` int32, the target's argmax
      after each node (all a greedy walk reads: the drafter's are
      `tree.top`).
    shape: the tree's shape (static).
    sampling: greedy or sampled.
    accept_rejected: a planted bug for the tests' power checks (a rejected
      sibling's subtree stays reachable); never set it otherwise.
    wrong_update: a planted bug for the tests' power checks (sampled): the
      walk before the sibling rules, whatever `tree.siblings` says: the
      without-replacement update, and a sibling with q' = 0 rejected
      instead of skipped (p' updated for a draw that never happened, e.g.
      a repeat of a rejected sibling). Never set it otherwise.

  Returns:
    `(n [batch] accepted nodes, path [batch, D] tree indices of the
    accepted nodes (the first n valid; 0 after), next_token [batch],
    accepted_at [batch, D] bool, beta_sum [batch], beta_count [batch])`;
    beta = sum_x min(p_u, q_u) at each node the walk verified children of
    (greedy: whether the two argmaxes agree, the same number).
  """
  if tree.siblings not in SIBLING_RULES:
    raise ValueError(f'Tree.siblings must be one of {SIBLING_RULES}, got '
                     f'{tree.siblings!r}.')
  if sampling.greedy:
    return _walk_greedy(rng, tree, p, shape, accept_rejected)
  # Whether a rejected token leaves the proposal; a sibling with q' = 0 is
  # skipped (the planted bug: rejected, as before the sibling rules).
  removes = tree.siblings == WITHOUT or wrong_update
  skips = not wrong_update
  batch, width, _ = p.shape
  accept_rng, token_rng = jax.random.split(rng)
  r = jax.random.uniform(accept_rng, (batch, width))
  rows = jnp.arange(batch)
  walk = _Walk.start(batch, shape.depth)
  residual = p[:, 0]
  offsets = shape.offsets
  for d, size in enumerate(shape.sizes, 1):
    slots = jnp.arange(offsets[d], offsets[d] + size)
    u, walking = walk.u, walk.walking
    p_u, q_u = p[rows, u], tree.q[rows, u]
    _, has = walk.children(tree, slots)

    def sibling(carry, s):
      res, prop, chosen = carry
      x = tree.tokens[:, s]
      try_it = (tree.parent[:, s] == u) & tree.valid[:, s] & walking & (
          chosen < 0)
      px, qx = res[rows, x], prop[rows, x]
      # q'(x) = 0: the rule cannot draw x here, the sibling is skipped.
      drawable = qx > 0
      ok = (r[:, s] * qx < px) & drawable
      accept = try_it & ok
      reject = try_it & ~ok
      if skips:
        reject = reject & drawable
      new_res = _normalized(jnp.maximum(res - prop, 0.0))
      # Mass 0 means res == prop: x was then accepted w.p. 1, so this is
      # never used; keep res (never log(0) everywhere).
      new_res = jnp.where(jnp.sum(new_res, -1, keepdims=True) > 0,
                          new_res, res)
      res = jnp.where(reject[:, None], new_res, res)
      if removes:  # without replacement: q' loses x
        new_prop = _normalized(prop.at[rows, x].set(0.0))
        prop = jnp.where(reject[:, None], new_prop, prop)
      chosen = jnp.where(accept, s, chosen)
      if accept_rejected:  # planted bug: a rejected sibling is taken
        chosen = jnp.where(reject & (r[:, s] < 0.5), s, chosen)
      return (res, prop, chosen), None

    (res, _, chosen), _ = jax.lax.scan(
        sibling, (p_u, q_u, jnp.full((batch,), -1, jnp.int32)), slots)
    found = walking & (chosen >= 0)
    # Where the walk stops here, the next token comes from this residual.
    residual = jnp.where((walking & ~found)[:, None], res, residual)
    walk = walk.step(d, has, jnp.sum(jnp.minimum(p_u, q_u), -1), found,
                     chosen)
  residual = jnp.where(walk.walking[:, None], p[rows, walk.u], residual)
  return walk.result(jax.random.categorical(token_rng, jnp.log(residual)))


def _walk_greedy(rng: Array, tree: Tree, target_top: Array,
                 shape: TreeShape, accept_rejected: bool):
  """`verify_tree` under greedy, on argmaxes only: a child is accepted iff
  it is the target's argmax at its parent (`target_top` `[batch, T]`) and
  its parent was; the next token is the target's argmax where the walk
  stops.

  Every node at once, not level by level: a node is a candidate if it was
  drafted and its token is the target's argmax at its parent; the walk
  takes each node's first candidate child (`first_path`; a repeat of it,
  later in slot order, is never reached). Whole-tree ops instead of a
  walk of a few ops per level: on an accelerator at batch 1 each op is a
  kernel launch.
  """
  batch, width = target_top.shape
  rows = jnp.arange(batch)[:, None]
  index = jnp.arange(width, dtype=jnp.int32)
  level = np.repeat(np.arange(shape.depth + 1), (1,) + shape.sizes)
  parent = tree.parent
  drafted = tree.valid & (index > 0)
  cand = drafted & (tree.tokens == jnp.take_along_axis(target_top, parent, 1))
  if accept_rejected:  # planted bug: a rejected sibling is taken
    r = jax.random.uniform(jax.random.split(rng)[0], (batch, width))
    cand = cand | (drafted & (r < 0.5))
  accepted = first_path(cand, parent, shape.depth)
  path = depth_path(accepted, level, shape.depth)
  n = jnp.sum(accepted, -1).astype(jnp.int32)
  last = jnp.where(n > 0, jnp.take_along_axis(
      path, jnp.maximum(n - 1, 0)[:, None], 1)[:, 0], 0)
  # beta at each node the walk verified children of: the root and the
  # accepted nodes that have drafted children.
  has = jnp.zeros((batch, width), bool).at[rows, parent].max(drafted)
  counted = has & (accepted | (index == 0))
  agree = counted & (tree.top == target_top)
  return _walked(n, path, target_top[rows[:, 0], last],
                 jnp.sum(agree, -1).astype(jnp.float32),
                 jnp.sum(counted, -1).astype(jnp.int32))


def first_path(cand: Array, parent: Array, depth: int) -> Array:
  """`[batch, T]` bool: the nodes on the path that takes, from the root,
  each node's first candidate child (slot order), while there is one.

  A node is on it iff it is the first candidate among its siblings and so
  is each of its ancestors but the root: one scatter-min (each node's
  first candidate child) and ceil(log2(depth)) rounds of pointer doubling
  (after r rounds a node has checked its 2^r nearest ancestors-or-self),
  not a walk of a few ops per level.

  Args:
    cand: `[batch, T]` bool, the candidates (the root is never one).
    parent: `[batch, T]` int32 index of each node's parent (the root's:
      itself, 0); parents before their children.
    depth: the deepest node's depth.
  """
  batch, width = cand.shape
  rows = jnp.arange(batch)[:, None]
  index = jnp.arange(width, dtype=jnp.int32)
  first = jnp.full((batch, width), width, jnp.int32).at[rows, parent].min(
      jnp.where(cand, index, width))
  on, up = (cand & (jnp.take_along_axis(first, parent, 1) == index)) | (
      index == 0), parent
  for _ in range(int(np.ceil(np.log2(max(depth, 1))))):
    on = on & jnp.take_along_axis(on, up, 1)
    up = jnp.take_along_axis(up, up, 1)
  return on & (index > 0)


def depth_path(on: Array, level: np.ndarray, depth: int,
               fill: Optional[Array] = None) -> Array:
  """`[batch, depth]` int32: the node of a path (`on` `[batch, T]`, the
  root not on it, as `first_path` gives) at each depth 1..`depth`; where
  the path is shorter 0, or `fill` (`[depth]`); `level` `[T]` (static)
  each node's depth."""
  at = on[:, None, :] & jnp.asarray(
      level[None, :] == np.arange(1, depth + 1)[:, None])[None]
  index = jnp.arange(on.shape[1], dtype=jnp.int32)
  path = jnp.sum(jnp.where(at, index, 0), -1).astype(jnp.int32)
  return path if fill is None else jnp.where(jnp.any(at, -1), path,
                                             fill[None])


def path_tokens(tree: Tree, path: Array) -> Array:
  """`[batch, D]` tokens of the accepted path's nodes."""
  return jnp.take_along_axis(tree.tokens, path, axis=1)


def visibility(parent: Array, nodes: Array, depth: int) -> Array:
  """`[batch, M, M]` ancestor-or-self among `nodes`: [b, i, j] is True iff
  node j is node i or one of its ancestors.

  Once per target call, on the M nodes it verifies (an ancestor-closed
  set), never per level on all T drafted nodes: `depth` rounds of one
  `[batch, M]` parent gather and an `[batch, M, M]` compare, which XLA
  fuses.

  Args:
    parent: `[batch, T]` int32 tree index of each node's parent (the
      root's: itself, 0).
    nodes: `[batch, M]` int32 tree indices.
    depth: the tree's depth (rounds up to the root).
  """
  up = nodes
  seen = up[:, :, None] == nodes[:, None, :]
  for _ in range(depth):
    up = jnp.take_along_axis(parent, up, axis=1)  # [batch, M]
    seen = seen | (up[:, :, None] == nodes[:, None, :])
  return seen


def ancestors(parent: Array, depth: int) -> Array:
  """`[batch, T, T]` ancestor-or-self of a parent array `[batch, T]`
  (root's parent itself): `visibility` on every node."""
  every = jnp.broadcast_to(jnp.arange(parent.shape[1], dtype=jnp.int32),
                           parent.shape)
  return visibility(parent, every, depth)


def empty(batch: int, shape: TreeShape, vocab: int, greedy: bool = False,
          siblings: str = WITHOUT) -> Tree:
  """A tree of zeros (invalid nodes), to fill level by level; a greedy
  tree keeps no q (`Tree.top`); `siblings` is `Tree.siblings`."""
  width = shape.width
  depth = jnp.concatenate([jnp.full((n,), d, jnp.int32) for d, n in
                           enumerate((1,) + shape.sizes)])
  return Tree(
      tokens=jnp.zeros((batch, width), jnp.int32),
      valid=jnp.zeros((batch, width), bool).at[:, 0].set(True),
      parent=jnp.zeros((batch, width), jnp.int32),
      depth=jnp.broadcast_to(depth, (batch, width)),
      q=jnp.zeros((batch, width, 0 if greedy else vocab), jnp.float32),
      top=jnp.zeros((batch, width), jnp.int32),
      verified=jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32),
                                (batch, width)),
      siblings=siblings, levels=shape.depth)


def children_of(shape: TreeShape, d: int) -> Tuple[Array, Array]:
  """(parent index into level d - 1's order, rank) of level d's slots."""
  level = shape.levels[d - 1]
  return (jnp.array([p for p, _ in level], jnp.int32),
          jnp.array([r for _, r in level], jnp.int32))
