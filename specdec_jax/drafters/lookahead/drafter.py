"""PaSS as a drafter: the target drafts for itself from look-ahead slots.

`PassDrafter` (kind 'pass') is an `interfaces.MergedDrafter`: its merged
loop (`loop.LookaheadLoop`, what `speculative.speculative_sample` runs by
default) makes one target call per iteration; with `merged=False` it runs in
the ordinary loop as an `interfaces.Drafter` (one target call of its own per
`propose`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Optional

import jax
import jax.numpy as jnp

from specdec_jax import sampling as sampling_lib
from specdec_jax import shipped
from specdec_jax.drafters import registry
from specdec_jax.drafters.lookahead.loop import LookaheadLoop
from specdec_jax.drafters.lookahead.model import KEY
from specdec_jax.drafters.lookahead.model import check_lookahead
from specdec_jax.drafters.lookahead.model import describe_tree
from specdec_jax.drafters.lookahead.model import embeddings
from specdec_jax.drafters.lookahead.model import init_lookahead
from specdec_jax.drafters.lookahead.model import load_lookahead
from specdec_jax.drafters.t5 import SelfDrafting
from specdec_jax.drafters.t5 import check_target_source
from specdec_jax.sampling import SamplingConfig

Array = jax.Array

DEFAULT_LOOKAHEAD = 4


@dataclasses.dataclass(frozen=True)
class PassDrafter(SelfDrafting):
  """The target drafting for itself with L look-ahead slots (kind 'pass').

  params: `{'target': the target's params, 'lookahead': look-ahead params}`
  (`pass_params`). In the ordinary loop gamma <= L + 1 (draft 1 from the
  target's next-token logits, draft i >= 2 from slot i - 1); in the merged
  loop gamma <= L. `tree`: the merged loop's tree layout (one slot group
  after each of last, x_1..x_gamma: no recovery iterations).

  q_i for i >= 2 comes from look-ahead slot i - 1 (the prefix only), not
  from `score` after prefix ++ drafts 1..i-1: still exact (x_i ~ q_i, that
  q_i verified); `drafts_from_score` says so.
  """

  num_lookahead: int
  tree: bool = False

  def max_gamma(self, merged: bool) -> Optional[int]:
    """L in the merged loop, L + 1 in the ordinary one."""
    return self.num_lookahead + (0 if merged else 1)

  def merged_loop(self, target, gamma: int, sampling: SamplingConfig,
                  eos_id: int, max_decode_len: int) -> LookaheadLoop:
    """One (2 gamma + 1)-token target call per iteration (the first gamma
    slots draft); `tree`: (gamma + 1)^2 tokens, no recovery iterations."""
    self.check_target(target, 'merged loop')
    return LookaheadLoop(target=target, gamma=gamma, sampling=sampling,
                         eos_id=eos_id, max_decode_len=max_decode_len,
                         num_lookahead=gamma, tree=self.tree)

  def check_params(self, params) -> None:
    if not isinstance(params, dict) or set(params) != {'target', 'lookahead'}:
      raise ValueError("PaSS params must be {'target': target params, "
                       "'lookahead': look-ahead params} (pass_params), got "
                       f'{describe_tree(params)}.')
    big_l = check_lookahead(params['lookahead'], self.model.config)
    if big_l != self.num_lookahead:
      raise ValueError(f'{big_l} look-ahead embeddings, the drafter was '
                       f'built for {self.num_lookahead}.')
    self.own.check_params(params['target'])

  def init(self, params, encoder_input_tokens, max_length: int):
    # Room for a block of (gamma + 1) real tokens and L slots after the
    # last committed one, gamma <= L + 1.
    return self.model.init_cache(params['target'], encoder_input_tokens,
                                 max_length + 2 * self.num_lookahead + 2)

  def propose(self, params, cache, sequences, lengths, gamma: int,
              sampling: SamplingConfig, rng: Array):
    """One target call on [tokens the cache lacks, slots]; q_1 = p_1."""
    big_l = self.num_lookahead
    real = gamma + 1  # the loop commits <= gamma + 1 tokens per iteration
    start = cache.position
    fed = lengths - start  # 1 .. gamma + 1 committed tokens to feed
    idx = jnp.minimum(start[:, None] + jnp.arange(real + big_l),
                      sequences.shape[1] - 1)
    block = jnp.take_along_axis(sequences, idx, axis=1)
    logits, cache = self.model.extend(
        params['target'], block, cache, embeddings(params['lookahead']), fed)
    # q_1 after the last committed token, q_i (i >= 2) from slot i - 1.
    pick = (fed - 1)[:, None] + jnp.arange(gamma)
    chosen = jnp.take_along_axis(logits, pick[..., None], axis=1)
    b, _, v = chosen.shape
    drafts, q = sampling_lib.draw(rng, chosen.reshape(b * gamma, v), sampling)
    return (drafts.reshape(b, gamma), q.reshape(b, gamma, v),
            cache.rewind(lengths))


def pass_params(target_params, lookahead_params):
  """The drafter's params: the target's (shared, not copied) + look-ahead."""
  return {'target': target_params, 'lookahead': lookahead_params}


def build(source: registry.DraftSource, tree: bool = False):
  """Target + look-ahead embeddings: from `source.draft_params` when it is a
  look-ahead tree, else from `source.draft_checkpoint` (DRAFT_CHECKPOINT: a
  path or a shipped name such as `shipped:lookahead/en_de`), else untrained
  (a warning; still exact, drafts poor). `tree`: the tree layout (kind
  'pass_tree')."""
  name = 'pass_tree' if tree else 'pass'
  check_target_source(source, name)
  model = source.target_model
  lookahead = source.draft_params
  if not (isinstance(lookahead, dict) and KEY in lookahead):
    path = source.draft_checkpoint
    if path:
      path = os.fspath(path)
      if path.startswith(shipped.SCHEME):
        path = shipped.resolve(path)
      lookahead = load_lookahead(path, model.config)
    else:
      logging.warning("drafter kind '%s': no look-ahead checkpoint "
                      '(DRAFT_CHECKPOINT); using untrained embeddings.', name)
      lookahead = init_lookahead(source.target_params, DEFAULT_LOOKAHEAD)
  big_l = check_lookahead(lookahead, model.config)
  return (PassDrafter(model, big_l, tree=tree),
          pass_params(source.target_params, lookahead))


KIND = registry.DrafterKind(
    'pass', needs_model=False, build=build, needs_target=True,
    description='PaSS: the target drafts for itself from L learned '
                'look-ahead embeddings (DRAFT_CHECKPOINT)')

TREE_KIND = registry.DrafterKind(
    'pass_tree', needs_model=False, build=functools.partial(build, tree=True),
    needs_target=True,
    description="PaSS in its tree layout: a group of slots after each "
                "draft, (gamma + 1)^2 tokens a call, no recovery calls "
                "(DRAFT_CHECKPOINT: as 'pass')")
