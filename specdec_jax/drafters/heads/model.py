"""The draft head network on the target's final states, and its parameters.

`DraftHead` (flax) is one drafting step; `Head` the callables the loops use
(a head step on the target's own embedding and logits layer, `draft` a
chain, `draft_tree` a token tree);
`init_head` / `check_head` / `save_head` / `load_head` the parameters (a
T5X orbax checkpoint with its `HeadConfig` in draft_head.json);
`head_step_bytes` what one step reads (its cost at a memory-bound scale).

References: Ankner et al. 2024 (Hydra), arXiv 2402.05109; Li et al. 2024
(EAGLE), arXiv 2401.15077.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Mapping, Optional, Tuple

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import layers
from specdec_jax import network
from specdec_jax import sampling as sampling_lib
from specdec_jax import widening
from specdec_jax import hardware
from specdec_jax.drafters.tree import grow as grow_lib
from specdec_jax.drafters.tree import verify as verify_lib
from specdec_jax.drafters.tree.shape import TreeShape

Array = jax.Array

KEY = 'draft_head'
CONFIG_FILE = 'draft_head.json'


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """A draft head's shape (saved beside its checkpoint as draft_head.json).

  Attributes:
    mlp_dim: hidden width of the head's MLP.
    cross_attention: attend over the target's last decoder layer's encoder
      keys / values (one trained query and output projection).
  """

  mlp_dim: int = 1024
  cross_attention: bool = True

  def __post_init__(self):
    checks.check_int('mlp_dim', self.mlp_dim)


class DraftHead(nn.Module):
  """One drafting step: (state, token embedding) -> next state."""

  config: network.T5Config
  head: HeadConfig

  def setup(self):
    cfg = self.config
    dense = functools.partial(layers.DenseGeneral, dtype=cfg.compute_dtype,
                              weight_dtype=cfg.dtype)
    zeros = nn.initializers.zeros
    if self.head.cross_attention:
      self.query = dense((cfg.num_heads, cfg.head_dim),
                         kernel_axes=('embed', 'joined_kv'),
                         kernel_init=nn.initializers.variance_scaling(
                             1.0 / cfg.head_dim, 'fan_in', 'normal'))
      self.out = dense(cfg.emb_dim, axis=(-2, -1), kernel_init=zeros,
                       kernel_axes=('joined_kv', 'embed'))
    self.wi = dense(self.head.mlp_dim, kernel_axes=('embed', 'mlp'))
    self.wo = dense(cfg.emb_dim, kernel_init=zeros,
                    kernel_axes=('mlp', 'embed'))

  def __call__(self, state: Array, token_embedding: Array, cross_kv=None,
               cross_bias=None) -> Array:
    """`state`, `token_embedding` `[batch, k, embed]` -> next `[b, k, e]`.

    cross_kv: the target's last layer's `(key, value)` `[batch, input_len,
    heads, head_dim]` (with `cross_bias` `[batch, 1, 1, input_len]`), used
    when the head has cross-attention.
    """
    x = jnp.asarray(state, self.config.compute_dtype)
    e = jnp.asarray(token_embedding, self.config.compute_dtype)
    if self.head.cross_attention:
      q = self.query(jnp.concatenate([x, e], -1))
      a = layers.dot_product_attention(q, cross_kv[0], cross_kv[1],
                                       cross_bias, self.config.compute_dtype)
      x = x + self.out(a)
    return x + self.wo(jax.nn.gelu(self.wi(jnp.concatenate([x, e], -1))))




def init_head(config: network.T5Config, head: HeadConfig = HeadConfig(),
              seed: int = 0):
  """An untrained head (`{'draft_head': ...}`): drafts the previous
  position's distribution until trained (`out` and `wo` start at zero)."""
  d = config.emb_dim
  kv = jnp.zeros((1, 2, config.num_heads, config.head_dim))
  variables = DraftHead(config, head).init(
      jax.random.key(seed), jnp.zeros((1, 1, d)), jnp.zeros((1, 1, d)),
      (kv, kv), jnp.zeros((1, 1, 1, 2)))
  return {KEY: jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32),
                                      dict(variables['params']))}


@functools.lru_cache(maxsize=None)
def _shapes(config: network.T5Config, head: HeadConfig):
  return jax.tree_util.tree_map(
      lambda x: tuple(x.shape),
      jax.eval_shape(lambda: init_head(config, head)))


def check_head(head_params, config: network.T5Config, head: HeadConfig,
               source: str = 'draft head params') -> None:
  """ValueError unless `head_params` has the shapes `head` on `config` has."""
  try:
    got = jax.tree_util.tree_map(lambda x: tuple(np.shape(x)), head_params)
  except Exception as e:  # pylint: disable=broad-except
    raise checks.InputError(f'{source}: not a params tree ({e}).') from e
  want = _shapes(config, head)
  if got != want:
    raise checks.InputError(
        f'{source} do not fit this target and head config {head}: expected '
        f'{want}, got {got} (a head trained for another target, emb_dim '
        f'{config.emb_dim}, heads {config.num_heads} x {config.head_dim}?).')


def save_head(head_params, head: HeadConfig, directory: str,
              step: int = 0, dtype: Any = jnp.float32,
              extra_files: Optional[Mapping[str, bytes]] = None) -> str:
  """Writes the head as a T5X orbax checkpoint `<dir>/checkpoint_<step>`,
  with its `HeadConfig` in `draft_head.json` inside it (and `extra_files`,
  e.g. the training run's state); `dtype` bfloat16 halves the files of a
  head to ship (`load_head` returns float32)."""
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype),
                                  head_params)
  meta = json.dumps(dataclasses.asdict(head), indent=1).encode()
  return checkpoints.save_t5x_params(
      params, directory, step,
      extra_files={**(extra_files or {}), CONFIG_FILE: meta})


def load_head(path: str, config: network.T5Config
              ) -> Tuple[Any, HeadConfig]:
  """`(head params, HeadConfig)` from `save_head`'s checkpoint (or its dir).

  Raises:
    ValueError: no draft_head.json, or shapes that do not fit `config`.
  """
  path = os.fspath(path)
  if not checkpoints.is_gcs(path):
    path = os.path.abspath(os.path.expanduser(path))
  if checkpoints.isdir(path) and not os.path.basename(
      path.rstrip('/')).startswith('checkpoint_'):
    latest = checkpoints.latest_checkpoint(path)
    if latest is None:
      raise checks.InputError(
          f'No checkpoint_<step> in {path} (a draft head dir written by '
          'scripts/train_heads.py?).')
    path = latest
  meta_path = os.path.join(path, CONFIG_FILE)
  if not checkpoints.isfile(meta_path):
    raise checks.InputError(f'{path} has no {CONFIG_FILE}: not a draft head '
                            'checkpoint (scripts/train_heads.py writes them).')
  try:
    head = HeadConfig(**json.loads(checkpoints.read_bytes(meta_path)))
  except (TypeError, ValueError) as e:
    raise checks.InputError(f'{meta_path}: not a head config ({e}).') from e
  params = checkpoints.load_t5x_params(path, dtype=jnp.float32)
  check_head(params, config, head, f'draft head checkpoint {path}')
  return params, head




def embed(target_params, config: network.T5Config, tokens: Array) -> Array:
  """The target's input embedding of `tokens`."""
  table = target_params['token_embedder']['embedding']
  return jnp.asarray(jnp.take(table, tokens, axis=0), config.compute_dtype)


def project(target_params, config: network.T5Config, state: Array) -> Array:
  """The target's logits of a normalized final state (float32; the
  target's weights read as stored, never converted: `layers.float32_dot`)."""
  if config.logits_via_embedding:
    table = target_params['token_embedder']['embedding']
    return layers.float32_dot(state, table, contract=1) / jnp.sqrt(
        jnp.float32(state.shape[-1]))
  kernel = target_params['decoder']['logits_dense']['kernel']
  return layers.float32_dot(state, kernel)


@dataclasses.dataclass(frozen=True)
class Head:
  """A draft head on a target: the callables the loops use (hashable)."""

  config: network.T5Config
  head: HeadConfig

  @property
  def module(self) -> DraftHead:
    return DraftHead(self.config, self.head)

  def decoding_params(self, head_params):
    """`head_params` rounded once to the weights' dtype (`config.dtype`),
    as every step's `layers.as_weight` rounds them: the same values, which
    a decode loop then reads as stored instead of converting per step."""
    return jax.tree.map(lambda w: jnp.asarray(w, self.config.dtype),
                        head_params)

  def step(self, head_params, target_params, state, tokens, cross_kv,
           cross_bias):
    """`[batch, k, embed]` states + `[batch, k]` tokens -> (state, logits)."""
    nxt = self.module.apply({'params': head_params[KEY]}, state,
                            embed(target_params, self.config, tokens),
                            cross_kv, cross_bias)
    return nxt, project(target_params, self.config, nxt)

  def draft(self, head_params, target_params, state, token, cache, gamma,
            sampling, rng):
    """gamma drafts after `token` `[batch]`, from `state` `[batch, embed]`.

    cache: the target's `DecoderCache` (its last layer's cross K/V).
    Returns `(drafts [batch, gamma], q [batch, gamma, vocab])`.
    """
    kv = (cache.cross_key[-1], cache.cross_value[-1])
    bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])
    s, tok = state[:, None], token[:, None]
    drafts, qs = [], []
    for key in jax.random.split(rng, gamma):
      s, logits = self.step(head_params, target_params, s, tok, kv, bias)
      tok, q = sampling_lib.draw(key, logits[:, 0], sampling)
      tok = tok[:, None]
      drafts.append(tok)
      qs.append(q)
    return jnp.concatenate(drafts, 1), jnp.stack(qs, 1)

  def draft_tree(self, head_params, target_params, state, token, cache,
                 shape: TreeShape, sampling, rng) -> verify_lib.Tree:
    """A token tree of `shape` under the root `token` `[batch]`, from
    `state` `[batch, embed]` (as `draft`: the state `token` was drawn
    after).

    The root's head step gives the root's state and its children's
    logits; each node of level d < D that gets children is stepped from
    its parent's state and its own token, all of a level's such nodes at
    once (`TreeShape.fed`); the children and parents follow
    `drafters.tree.grow`'s rules.

    Returns:
      the tree the target verifies (`grow.grow`'s `verified`).
    """
    kv = (cache.cross_key[-1], cache.cross_value[-1])
    bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])
    root_state, logits = self.step(head_params, target_params,
                                   state[:, None], token[:, None], kv, bias)

    def expand(states, tokens, parent, tree):
      del tree
      inputs = jnp.take_along_axis(states, parent[..., None], 1)
      new_states, logits = self.step(head_params, target_params, inputs,
                                     tokens, kv, bias)
      return logits, new_states

    _, tree, _ = grow_lib.grow(shape, sampling, token, logits[:, 0], expand,
                               root_state, rng)
    return tree




def head_step_bytes(config: network.T5Config, head: HeadConfig,
                    weight_bytes: int = 2) -> int:
  """Weights one head step reads: the head's and the target's logits layer
  (what sets its cost at a memory-bound scale; `weight_bytes` per value)."""
  n = sum(int(np.prod(s)) for s in jax.tree_util.tree_leaves(
      _shapes(config, head), is_leaf=lambda x: isinstance(x, tuple)))
  return (n + config.emb_dim * config.vocab_size) * weight_bytes


# Kernels of one head step (cross-attention query, two einsums + softmax,
# output, two concats, wi, gelu, wo, two adds, logits, softmax / draw).
HEAD_KERNELS = 14


def head_step_c(profile: hardware.HardwareProfile, config: network.T5Config,
                head: HeadConfig, input_length: int):
  """c of one head step on `profile`, from its bytes / launches model.

  The head widened (mlp in proportion) to the widths of the profile's
  target (its run's target_config; else T5 1.1-XXL cost), bfloat16, plus
  the last layer's cross K/V at the run's input length (else
  `input_length`).

  Returns:
    {'c', 'c_how', 'step_bytes', 'kernels', 'at'} (JSON).
  """
  setup = (hardware.measured_run(profile) or {}).get('setup', {})
  dims = ('emb_dim', 'num_heads', 'head_dim', 'vocab_size')
  wide = (config.replace(**{k: setup['target_config'][k] for k in dims})
          if 'target_config' in setup else
          widening.preset_config(config, 't5_1_1_xxl_cost'))
  length = int(setup.get('input_length', input_length))
  wide_head = HeadConfig(int(head.mlp_dim * wide.emb_dim / config.emb_dim),
                         head.cross_attention)
  nbytes = head_step_bytes(wide, wide_head, weight_bytes=2)
  if head.cross_attention:
    nbytes += 2 * length * wide.num_heads * wide.head_dim * 2
  c, how = profile.c_of('heads', step_bytes=nbytes, kernels=HEAD_KERNELS)
  return dict(c=c, c_how=how, step_bytes=nbytes, kernels=HEAD_KERNELS,
              at=f'emb {wide.emb_dim}, head mlp {wide_head.mlp_dim}, vocab '
              f'{wide.vocab_size}, input {length}, bfloat16')
