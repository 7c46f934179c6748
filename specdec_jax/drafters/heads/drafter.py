"""Self-drafting heads as a drafter: the target and its head.

`HeadDrafter` (kind 'heads') is an `interfaces.MergedDrafter`: its merged
loop (`loop.HeadLoop`, what `speculative.speculative_sample` runs by
default) makes one (gamma + 1)-token target call per iteration; with
`merged=False` it runs in the ordinary loop as an `interfaces.Drafter`,
paying a target call of its own per `propose`.

`HeadTreeDrafter` (kind 'heads_tree') is the same drafter drafting token
trees of the shape TREE (`DraftSource.tree`, default
`drafters.tree.DEFAULT_TREE`) in its merged loop (`loop.HeadTreeLoop`:
one target call on the tree per iteration, the head stepped on every
node); in the ordinary loop it drafts chains like `HeadDrafter`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

import jax
import jax.numpy as jnp

from specdec_jax import sampling as sampling_lib
from specdec_jax import shipped
from specdec_jax.drafters import registry
from specdec_jax.drafters.heads.loop import HeadLoop
from specdec_jax.drafters.heads.loop import HeadTreeLoop
from specdec_jax.drafters.heads.model import KEY
from specdec_jax.drafters.heads.model import Head
from specdec_jax.drafters.heads.model import HeadConfig
from specdec_jax.drafters.heads.model import check_head
from specdec_jax.drafters.heads.model import init_head
from specdec_jax.drafters.heads.model import load_head
from specdec_jax.drafters.t5 import SelfDrafting
from specdec_jax.drafters.t5 import check_target_source
from specdec_jax.drafters.tree import DEFAULT_TREE
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.drafters.tree.shape import TreeShape
from specdec_jax.sampling import SamplingConfig

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class HeadDrafter(SelfDrafting):
  """The target and its draft head (kind 'heads').

  params: `{'target': target params, 'head': head params}` (`head_params`).
  In the ordinary loop draft 1 is drawn from the target's own next-token
  distribution (its `propose` runs the target on the committed tokens its
  cache copy lacks), drafts 2.. from the head. The merged loop
  (`merged_loop`, the default of `speculative.speculative_sample`) drafts
  all gamma from the head on the verification call's states.

  q_i for i >= 2 comes from the head, not from `score` after the prefix and
  drafts 1..i-1 (`drafts_from_score` False): still exact.
  """

  head: HeadConfig

  @property
  def heads(self) -> Head:
    return Head(self.model.config, self.head)

  def max_gamma(self, merged: bool) -> Optional[int]:
    """No limit: the head drafts as many steps as asked."""
    del merged
    return None

  def merged_loop(self, target, gamma: int, sampling: SamplingConfig,
                  eos_id: int, max_decode_len: int) -> HeadLoop:
    """One (gamma + 1)-token target call and gamma head steps per
    iteration; the target must be a `network.T5Model` (or a
    `partitioning.ShardedModel` of one): the loop reads its final states."""
    self.check_target(target, 'merged loop')
    return HeadLoop(target=target, gamma=gamma, sampling=sampling,
                    eos_id=eos_id, max_decode_len=max_decode_len,
                    head=self.heads)

  def check_params(self, params) -> None:
    if not isinstance(params, dict) or set(params) != {'target', 'head'}:
      raise ValueError("Draft-head params must be {'target': target params, "
                       "'head': head params} (head_params).")
    check_head(params['head'], self.model.config, self.head)
    self.own.check_params(params['target'])

  def init(self, params, encoder_input_tokens, max_length: int):
    return self.model.init_cache(params['target'], encoder_input_tokens,
                                 max_length + 2)

  def propose(self, params, cache, sequences, lengths, gamma: int,
              sampling: SamplingConfig, rng: Array):
    """One target call on the tokens the cache lacks, then the head."""
    start = cache.position
    fed = lengths - start  # 1 .. gamma + 1 committed tokens to feed
    idx = jnp.minimum(start[:, None] + jnp.arange(gamma + 1),
                      sequences.shape[1] - 1)
    block = jnp.take_along_axis(sequences, idx, axis=1)
    (logits, hidden), cache = self.model.extend(
        params['target'], block, cache, return_hidden=True)
    last = (fed - 1)[:, None, None]
    logits = jnp.take_along_axis(logits, last, 1)[:, 0]
    state = jnp.take_along_axis(hidden, last, 1)[:, 0]
    rng1, rng2 = jax.random.split(rng)
    first, q1 = sampling_lib.draw(rng1, logits, sampling)
    cache = cache.rewind(lengths)
    if gamma == 1:
      return first[:, None], q1[:, None], cache
    rest, q_rest = self.heads.draft(params['head'], params['target'], state,
                                    first, cache, gamma - 1, sampling, rng2)
    return (jnp.concatenate([first[:, None], rest], 1),
            jnp.concatenate([q1[:, None], q_rest], 1), cache)


@dataclasses.dataclass(frozen=True)
class HeadTreeDrafter(HeadDrafter):
  """The target and its draft head drafting token trees (kind
  'heads_tree'; module docstring).

  Its merged loop (`loop.HeadTreeLoop`, gamma = the depth used, at most
  the shape's) verifies a tree per target call and the head drafts the
  next from the call's states; in the ordinary loop it is a
  `HeadDrafter`.
  """

  shape: TreeShape

  def __post_init__(self):
    super().__post_init__()
    self.shape.check_vocab(self.model.vocab_size)

  def max_gamma(self, merged: bool) -> Optional[int]:
    """The tree's depth in the merged loop; no limit in the ordinary one."""
    return self.shape.depth if merged else None

  def merged_loop(self, target, gamma: int, sampling: SamplingConfig,
                  eos_id: int, max_decode_len: int) -> HeadTreeLoop:
    """One target call on the tree (its first `gamma` levels) and a head
    step per drafted level per iteration; the target as `HeadDrafter`'s."""
    self.check_target(target, 'tree loop')
    drafter = dataclasses.replace(self, shape=self.shape.truncate(gamma))
    return HeadTreeLoop(target=target, gamma=gamma, sampling=sampling,
                        eos_id=eos_id, max_decode_len=max_decode_len,
                        drafter=drafter)


def head_params(target_params, params):
  """The drafter's params: the target's (shared, not copied) + the head's."""
  return {'target': target_params, 'head': params}


def _target_and_head(source: registry.DraftSource, kind: str):
  """(target model, HeadConfig, drafter params) of the kind `kind`."""
  check_target_source(source, kind)
  model = source.target_model
  params = source.draft_params
  if isinstance(params, dict) and KEY in params:
    head = HeadConfig(
        mlp_dim=int(params[KEY]['wi']['kernel'].shape[1]),
        cross_attention='query' in params[KEY])
  else:
    path = source.draft_checkpoint
    if path:
      path = os.fspath(path)
      if path.startswith(shipped.SCHEME):
        path = shipped.resolve(path)
      params, head = load_head(path, model.config)
    else:
      logging.warning("drafter kind '%s': no head checkpoint "
                      '(DRAFT_CHECKPOINT); using an untrained head.', kind)
      head = HeadConfig()
      params = init_head(model.config, head)
  check_head(params, model.config, head)
  return model, head, head_params(source.target_params, params)


def build(source: registry.DraftSource):
  """Target + head from `source.draft_params` when it is a head tree, else
  from `source.draft_checkpoint` (DRAFT_CHECKPOINT: a scripts/train_heads.py
  --out_dir or a shipped name such as `shipped:heads/en_de`), else untrained
  (a warning)."""
  model, head, params = _target_and_head(source, 'heads')
  return HeadDrafter(model, head), params


def build_tree(source: registry.DraftSource):
  """As `build`, drafting trees of the shape `source.tree` (TREE; default
  `drafters.tree.DEFAULT_TREE`)."""
  model, head, params = _target_and_head(source, 'heads_tree')
  shape = shape_lib.parse(source.tree or DEFAULT_TREE)
  return HeadTreeDrafter(model, head, shape), params


KIND = registry.DrafterKind(
    'heads', needs_model=False, build=build, needs_target=True,
    description='self-drafting heads: a small trained head on the target\'s '
                'own final state drafts (DRAFT_CHECKPOINT)')

TREE_KIND = registry.DrafterKind(
    'heads_tree', needs_model=False, build=build_tree, needs_target=True,
    reads_tree=True,
    description='self-drafting heads drafting a token tree (TREE: its '
                'shape; DRAFT_CHECKPOINT: the head), verified in one target '
                'call')
