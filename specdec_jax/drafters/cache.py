"""The semantic output cache as a drafter: copies from similar requests.

`CacheDrafter` (kind 'cache') is a `LookupDrafter` whose stream holds, after
the row's source, the outputs of the most similar earlier requests in an
`output_cache.OutputCache` (retrieved on device with the target's encoder).
`open_cache` opens the job's store or seeds a new one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import network
from specdec_jax import output_cache
from specdec_jax.drafters import registry
from specdec_jax.drafters.lookup import LookupDrafter
from specdec_jax.drafters.lookup import source_stream


@dataclasses.dataclass(frozen=True)
class CacheDrafter(LookupDrafter):
  """Drafts copied from the outputs of the most similar earlier requests.

  `init` embeds each row's request with the target's encoder
  (`output_cache.embed`), retrieves its `neighbours` nearest entries of the
  cache (`output_cache.retrieve`: a matrix product and top-k, on device)
  and lays out the lookup stream `source, neighbour_k, ..., neighbour_1`
  (`output_cache.neighbour_stream`: the most similar last, each output
  after a BOS marker, EOS kept). Drafting is then `LookupDrafter`'s: the
  longest recent match of the prefix's last n tokens in the row's own
  output, else its nearest neighbours' outputs, else its source; a prefix
  of BOS alone matches the start of every neighbour's output, so the first
  token is drafted too. One-hot q: exact in every sampling mode.

  params: `{'keys', 'outputs', 'valid'}` (`output_cache.OutputCache.
  device_params`; `with_store` refreshes them after the cache grew). The
  target's params it embeds with are not among them: the loop hands them in
  (`with_target`: an `interfaces.TargetReader`), so a compiled loop takes
  the target's weights once.
  """

  embedder: Any = None  # the target's T5Model: embeds the requests
  neighbours: int = 4

  def __post_init__(self):
    super().__post_init__()
    if self.embedder is None:
      raise ValueError('CacheDrafter needs embedder, the target T5Model '
                       'whose encoder embeds the requests.')
    checks.check_int('neighbours', self.neighbours)

  def check_params(self, params) -> None:
    """Raises unless params hold a cache (and the embedder's params, if
    `with_target` gave them)."""
    if not isinstance(params, Mapping) or not {
        'keys', 'outputs', 'valid'} <= set(params):
      raise ValueError("the cache drafter's params are {'keys', 'outputs', "
                       "'valid'} (OutputCache.device_params), got "
                       f'{type(params).__name__}.')
    if 'embedder' in params:
      self.embedder.check_params(params['embedder'])
    c, d = np.shape(params['keys'])
    if d != self.embedder.config.emb_dim:
      raise checks.InputError(
          f"cache keys have dim {d}; the embedder's emb_dim is "
          f'{self.embedder.config.emb_dim} (a cache built by another model).')
    if np.shape(params['outputs'])[0] != c or np.shape(
        params['valid']) != (c,):
      raise ValueError(f'cache arrays disagree: keys {np.shape(params["keys"])}'
                       f', outputs {np.shape(params["outputs"])}, valid '
                       f'{np.shape(params["valid"])}.')
    if c < self.neighbours:
      raise ValueError(f'cache capacity {c} < neighbours {self.neighbours}.')
    network.check_token_ids('cache outputs', params['outputs'],
                             self.vocab_size)

  def with_store(self, params, store):
    """`params` after `store` (an `output_cache.OutputCache`) changed."""
    return dict(params, **store.device_params())

  def with_target(self, params, target_params):
    """`params` with the target's, which `init` embeds the requests with."""
    return dict(params, embedder=target_params)

  def init(self, params, encoder_input_tokens, max_length: int):
    """The stream `source, neighbours (least similar first)` `[batch, s]`."""
    del max_length
    if 'embedder' not in params:
      raise ValueError(
          "the cache drafter embeds requests with the target's params: give "
          'it speculative.with_target(drafter, params, target_params) (the '
          'loops do).')
    queries = output_cache.embed(self.embedder, params['embedder'],
                                 encoder_input_tokens)
    index, ok = output_cache.retrieve(params, queries, self.neighbours)
    source = source_stream(encoder_input_tokens, self.eos_id)
    gap = jnp.full((source.shape[0], 1), -1, jnp.int32)
    return jnp.concatenate(
        [source, gap, output_cache.neighbour_stream(params, index, ok)], 1)



def open_cache(source: registry.DraftSource):
  """`source.output_cache`, or a new store seeded with its train pairs."""
  if source.target_model is None or source.target_params is None:
    raise checks.InputError(
        'an output cache embeds requests with the target: the source needs '
        'target_model and target_params.')
  if source.output_cache is not None:
    checks.check_type('DraftSource output_cache', source.output_cache,
                      output_cache.OutputCache, 'an output_cache.OutputCache'
                      ' (OutputCache.open reads one from its file)')
    return source.output_cache
  store = output_cache.OutputCache.for_model(
      source.target_model, source.target_params, source.output_length)
  store.add_pairs(source.target_model, source.target_params,
                  list(source.train_pairs()) if source.train_pairs else [])
  return store


def build(source: registry.DraftSource):
  """A `CacheDrafter` over `open_cache(source)`, embedding with the target."""
  store = open_cache(source)
  drafter = CacheDrafter(source.vocab_size, adaptive=source.confidence > 0,
                         embedder=source.target_model)
  return drafter, store.device_params()


# The 'combined' kind's rule: copy where the draft model's top token is less
# likely than COMBINED_TRUST, or where the match is COMBINED_LONG_MATCH
# tokens long; else the model's draft. On the shipped synopsis rows (cache
# of other rows' outputs, gamma 6, greedy) copying wherever anything matched
# lowered alpha (0.585 vs dec2's 0.619); this rule raised it (0.629).


KIND = registry.DrafterKind(
    'cache', needs_model=False, build=build, uses_cache=True,
    needs_target=True, reads_confidence=True,
    description='semantic output cache: copies from the outputs of the most '
                'similar earlier requests (and the input, the output)')
