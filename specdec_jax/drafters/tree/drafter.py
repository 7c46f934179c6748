"""A T5 drafter that drafts a token tree, level by level.

`TreeDrafter(T5Drafter, shape)`: per iteration one drafter call on the
root (the catch-up of `T5Drafter`) and one call per level 1..D-1 on that
level's nodes that get children (`TreeShape.fed`), each node seeing its
ancestors only (`network.TreeMask`); the children each node gets, and
which parents a dynamic shape expands, follow `grow.grow`'s rules (the
heads' trees follow the same ones). Its cache holds the called nodes,
`TreeShape.fed_width` slots past the root, not the whole tree.

The drafter keeps the nodes it was called on in its state; the next
`propose` finds the committed tokens' path among them and moves those
nodes' keys and values into the chain slots of its cache
(`DecoderCache.move_slots`), as the loop does for the target, so nothing
is fed twice (the last accepted node, when it got no children, and the
next token are the catch-up's two tokens).

It is a `interfaces.MergedDrafter`: `merged_loop` is the tree loop
(`loop.TreeLoop`, gamma = the depth used, at most the shape's); in the
ordinary loop it drafts a chain like its T5 drafter.

The kind 'tree' (`KIND`): a separate T5 drafter (DRAFT_MODEL /
DRAFT_CHECKPOINT, as 't5') drafting trees of the shape TREE
(`DraftSource.tree`, default `DEFAULT_TREE`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import registry
from specdec_jax.drafters import t5
from specdec_jax.drafters.t5 import T5Drafter
from specdec_jax.drafters.tree import grow as grow_lib
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.drafters.tree import verify as verify_lib
from specdec_jax.drafters.tree.loop import TreeLoop
from specdec_jax.drafters.tree.shape import TreeShape

Array = jax.Array


@struct.dataclass
class TreeState:
  """The drafter's cache and the nodes it was last called on (`grow.Fed`;
  base -1: none)."""

  cache: object
  tokens: Array  # [batch, F]
  valid: Array  # [batch, F]
  parent: Array  # [batch, F] index among the F nodes
  base: Array  # [batch] the root's slot


@dataclasses.dataclass(frozen=True)
class TreeDrafter:
  """Trees drafted by a `T5Drafter` (module docstring)."""

  base: T5Drafter
  shape: TreeShape

  drafts_from_score = True

  def __post_init__(self):
    """Refuses a base that is no `T5Drafter` (its tree calls go through
    the base's model) and a shape that is no `TreeShape` (a spec string is
    parsed by `shape.parse`, as the kind 'tree' does with TREE)."""
    checks.check_type('TreeDrafter base', self.base, T5Drafter,
                      'a T5Drafter, e.g. drafters.T5Drafter(draft_model)')
    checks.check_type('TreeDrafter shape', self.shape, TreeShape,
                      "a TreeShape, e.g. tree.shape.parse('beam:4,2,8')")
    self.shape.check_vocab(self.base.vocab_size)

  @property
  def vocab_size(self) -> int:
    return self.base.vocab_size

  def check_params(self, params) -> None:
    self.base.check_params(params)

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    return self.base.score(params, encoder_input_tokens,
                           decoder_input_tokens)

  def max_gamma(self, merged: bool) -> Optional[int]:
    return self.shape.depth if merged else None

  def merged_loop(self, target, gamma, sampling, eos_id, max_decode_len):
    drafter = dataclasses.replace(self, shape=self.shape.truncate(gamma))
    return TreeLoop(target=target, gamma=gamma, sampling=sampling,
                         eos_id=eos_id, max_decode_len=max_decode_len,
                         drafter=drafter)

  def _state(self, cache, width: int) -> TreeState:
    batch = cache.position.shape[0]
    return TreeState(cache=cache,
                     tokens=jnp.zeros((batch, width), jnp.int32),
                     valid=jnp.zeros((batch, width), bool),
                     parent=jnp.zeros((batch, width), jnp.int32),
                     base=jnp.full((batch,), -1, jnp.int32))

  def init(self, params, encoder_input_tokens, max_length: int):
    return self._state(
        self.base.init(params, encoder_input_tokens, max_length),
        self.shape.fed_width)

  def prefill(self, params, state: TreeState, sequences, lengths):
    cache = self.base.prefill(params, state.cache, sequences, lengths)
    return self._state(cache, state.tokens.shape[1])

  def committed_path(self, state: TreeState, sequences, lengths,
                     depth: int):
    """Where the committed tokens run through the fed nodes of the last
    tree: `(path [batch, max(depth - 1, 1)], m [batch])`, the fed index of
    the node that goes to chain slot base + 1 + i (the first m; after
    them the slot itself, which moves nothing) and how many were found.

    Every fed node at once (not a few ops per level, `first_path`):
    a node matches if the row committed past its depth (the last committed
    token is fed by the catch-up, never moved) and its token is the
    committed one there; the path takes each node's first matching child
    (`verify.first_path`).
    """
    width = state.tokens.shape[1]
    offsets = self.shape.truncate(depth).fed_offsets + (width,)
    level = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    index = jnp.arange(width, dtype=jnp.int32)
    at = state.base[:, None] + jnp.asarray(level, jnp.int32)[None]
    committed = jnp.take_along_axis(
        sequences, jnp.clip(at, 0, sequences.shape[1] - 1), 1)
    match = ((state.base >= 0)[:, None] & (index > 0) & state.valid &
             (at <= lengths[:, None] - 2) & (state.tokens == committed))
    on_path = verify_lib.first_path(match, state.parent, depth - 1)
    steps = max(depth - 1, 1)
    path = verify_lib.depth_path(  # none there: the slot itself
        on_path, level, steps, jnp.arange(1, steps + 1, dtype=jnp.int32))
    return path, jnp.sum(on_path, -1).astype(jnp.int32)

  def commit(self, state: TreeState, sequences, lengths, depth: int):
    """The cache with the committed path of the last tree moved into the
    chain slots (rows without a tree, or whose tokens left it, keep what
    they hold: the catch-up feeds the rest). Only the nodes that got
    children were fed to the drafter (`TreeShape.fed`; never the deepest
    level): the path is moved down to its last fed node, at most depth
    `depth` - 1, and the catch-up feeds the two tokens after it (the
    last accepted node and the next token)."""
    path, m = self.committed_path(state, sequences, lengths, depth)
    base = state.base
    has = base >= 0
    cache = state.cache
    start = jnp.maximum(base, 0)
    moved = cache.move_slots(start[:, None] + path, start + 1)
    position = jnp.where(has, start + 1 + m, cache.position)
    return moved.rewind(position)

  def propose(self, params, state: TreeState, sequences, lengths, gamma,
              sampling, rng):
    """A chain (the ordinary loop), after committing the last tree."""
    cache = self.commit(state, sequences, lengths, self.shape.depth)
    drafts, q, cache = self.base.propose(params, cache, sequences, lengths,
                                         gamma, sampling, rng)
    return drafts, q, self._state(cache, state.tokens.shape[1])

  def propose_tree(self, params, state: TreeState, sequences, lengths,
                   sampling: sampling_lib.SamplingConfig, rng):
    """Drafts a tree of its shape after each row's committed prefix.

    Returns:
      `(verify.Tree, state)`.
    """
    shape = self.shape
    cache = self.commit(state, sequences, lengths, shape.depth)
    logits, cache = self.base.catch_up(params, cache, sequences, lengths)
    base = lengths - 1
    root = sequences[jnp.arange(lengths.shape[0]), base]

    def expand(cache, tokens, parent, mask_of):
      del parent  # the tree mask says who sees whom
      return self.base.model.extend(params, tokens, cache,
                                    tree=mask_of(base))

    fed, tree, cache = grow_lib.grow(shape, sampling, root, logits, expand,
                                     cache, rng)
    # The drafter's state keeps the nodes it was called on (its cache
    # holds them); the target verifies the tree (under greedy, with
    # `shape.top`, its best nodes).
    state = TreeState(cache=cache, tokens=fed.tokens, valid=fed.valid,
                      parent=fed.parent, base=base)
    return tree, state


# EAGLE-2's shape: the root's 4 best tokens, then the 2 most probable paths
# of each level get 4 children each, 8 levels: 60 nodes, one target call on
# 61 tokens (on an accelerator about the cost of one; see
# results/retired/trees.md, by the retired benchmark_trees script; now
# `python -m specdec_jax.experiments run trees`).
DEFAULT_TREE = 'beam:4,2,8'


def build(source: registry.DraftSource):
  """A `TreeDrafter` over the 't5' kind's drafter, shape `source.tree`."""
  drafter, params = t5.build(source, kind='tree')
  shape = shape_lib.parse(source.tree or DEFAULT_TREE)
  return TreeDrafter(drafter, shape), params


KIND = registry.DrafterKind(
    'tree', needs_model=True, build=build, reads_tree=True,
    description='a separate T5 drafting a token tree (TREE: its shape), '
                'verified in one target call')
