"""PaSS's look-ahead embeddings on the T5 decoder: parameters and forwards.

Parameters: `{'lookahead_embedder': {'embedding': [L, emb_dim]}}` (T5X's
naming of `token_embedder`), saved and loaded as a T5X orbax checkpoint
(`save_lookahead`, `load_lookahead`, which refuses embeddings of another
emb_dim). Forwards: `lookahead_logits`, the teacher-forced twin of the
decoding block (every prefix position gets its own L slots; training and
alpha per slot), and `tree_extend`, one decoder call on [last, x_1..x_g]
with one slot group after each real token (the merged loop's tree).

References: Monea, Joulin & Grave 2023, arXiv 2311.13581.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import layers
from specdec_jax import network

Array = jax.Array

KEY = 'lookahead_embedder'


# ---------------------------------------------------------------------------
# Look-ahead parameters.
# ---------------------------------------------------------------------------


def embeddings(lookahead_params) -> Array:
  """`[L, emb_dim]` of a look-ahead params tree."""
  return lookahead_params[KEY]['embedding']


def init_lookahead(target_params, num_lookahead: int, seed: int = 0):
  """Untrained look-ahead embeddings: the mean token embedding plus noise.

  Args:
    target_params: the target's params (T5X tree; `token_embedder`).
    num_lookahead: L >= 1.
    seed: PRNG seed of the noise (0.05 x the embeddings' std per entry).
  """
  checks.check_int('num_lookahead', num_lookahead)
  table = jnp.asarray(target_params['token_embedder']['embedding'],
                      jnp.float32)
  noise = jax.random.normal(jax.random.key(seed),
                            (num_lookahead, table.shape[1]))
  emb = table.mean(0)[None] + 0.05 * table.std() * noise
  return {KEY: {'embedding': emb}}


def check_lookahead(lookahead_params, config: network.T5Config,
                    source: str = 'look-ahead params') -> int:
  """Returns L; `checks.InputError` (naming what `source` holds) unless the
  tree is `[L, config.emb_dim]`."""
  try:
    shape = tuple(np.shape(embeddings(lookahead_params)))
  except (KeyError, TypeError, IndexError) as e:
    raise checks.InputError(
        f'{source} holds {describe_tree(lookahead_params)}, not look-ahead '
        f"embeddings {{'{KEY}': {{'embedding': [L, emb_dim]}}}} (what "
        'scripts/train_pass.py writes).') from e
  if len(shape) != 2 or shape[0] < 1 or shape[1] != config.emb_dim:
    raise checks.InputError(
        f'{source}: look-ahead embeddings of shape {shape} do not fit the '
        f'target (emb_dim={config.emb_dim}): want [L, {config.emb_dim}]; '
        'were they trained for another target?')
  extra = set(lookahead_params) - {KEY}
  if extra:
    raise checks.InputError(
        f'{source}: unexpected entries {sorted(extra)} beside {KEY!r}.')
  return shape[0]


def describe_tree(tree) -> str:
  if isinstance(tree, dict):
    return '{' + ', '.join(f'{k!r}: ...' for k in tree) + '}'
  return type(tree).__name__


def save_lookahead(lookahead_params, directory: str, step: int = 0,
                   extra_files: Optional[Mapping[str, bytes]] = None) -> str:
  """Writes the embeddings as a T5X orbax checkpoint `<dir>/checkpoint_<step>`
  (with `extra_files`, e.g. the training run's state).

  Beside the target's checkpoint, e.g. `<target model dir>/pass_L8/`.
  """
  params = {KEY: {'embedding': jnp.asarray(embeddings(lookahead_params),
                                           jnp.float32)}}
  return checkpoints.save_t5x_params(params, directory, step, extra_files)


def load_lookahead(path: str, config: network.T5Config):
  """Look-ahead params from a checkpoint (`save_lookahead`'s or a model dir).

  Raises:
    checks.InputError: the checkpoint holds no look-ahead embeddings (a
      draft head, a T5's params: named), or embeddings whose shape does
      not fit `config` (emb_dim).
  """
  path = os.fspath(path)
  if not checkpoints.is_gcs(path):
    path = os.path.abspath(os.path.expanduser(path))  # orbax: absolute only
  params = checkpoints.load_t5x_params(path, dtype=jnp.float32)
  check_lookahead(params, config, f'look-ahead checkpoint {path}')
  return params




def slot_layout(n: int, num_lookahead: int, owners):
  """Positions and mask of n real tokens + len(owners) x L look-ahead slots.

  Query/key order: real 0..n-1, then slot (i, j) at n + i * L + j for the
  prefix ending at real token t = owners[i]: it stands at position t + j + 1
  and sees the real tokens :t+1 and slots (i, :j+1). Real tokens see real
  tokens causally, never a slot.

  Returns:
    `(relative [q, q] int32, mask [q, q] bool)`, q = n + len(owners) * L.
  """
  big_l = num_lookahead
  k = owners.shape[0]
  t = jnp.repeat(owners, big_l)
  j = jnp.tile(jnp.arange(big_l), k)
  pos = jnp.concatenate([jnp.arange(n), t + j + 1])
  owner = jnp.concatenate([jnp.arange(n), t])  # the prefix end of a query
  is_slot = jnp.concatenate([jnp.zeros(n, bool), jnp.ones(k * big_l, bool)])
  group = jnp.concatenate([jnp.full(n, -1), jnp.repeat(jnp.arange(k),
                                                       big_l)])
  slot_j = jnp.concatenate([jnp.zeros(n, jnp.int32), j])
  real_key = ~is_slot[None, :] & (jnp.arange(n + k * big_l)[None, :] <=
                                  owner[:, None])
  slot_key = (is_slot[None, :] & is_slot[:, None] &
              (group[None, :] == group[:, None]) &
              (slot_j[None, :] <= slot_j[:, None]))
  return pos[None, :] - pos[:, None], real_key | slot_key


def lookahead_forward(module, encoder_input_tokens, decoder_input_tokens,
                       lookahead, owners):
  """`Transformer` method: logits of real tokens and of every slot.

  Returns:
    `(real [batch, n, vocab], slots [batch, len(owners), L, vocab])`.
  """
  dec = module.decoder
  cfg = module.config
  b, n = decoder_input_tokens.shape
  big_l = lookahead.shape[0]
  k = owners.shape[0]
  encoded = module.encode(encoder_input_tokens)
  relative, mask = slot_layout(n, big_l, owners)
  self_bias = dec.relpos_bias(relative, bidirectional=False)[None]
  self_bias = self_bias + layers.mask_to_bias(mask)
  cross_bias = layers.mask_to_bias(
      (encoder_input_tokens > 0)[:, None, None, :])
  real = dec.shared_embedding(decoder_input_tokens).astype(cfg.compute_dtype)
  slots = jnp.broadcast_to(lookahead.astype(cfg.compute_dtype)[None, None],
                           (b, k, big_l, lookahead.shape[1]))
  y = jnp.concatenate([real, slots.reshape(b, k * big_l, -1)], axis=1)
  for layer, kv in zip(dec.layers, zip(*dec.project_cross_kv(encoded))):
    y, _ = layer(y, self_bias, kv, cross_bias)
  logits = dec.output_logits(y)
  return logits[:, :n], logits[:, n:].reshape(b, k, big_l, -1)


def lookahead_logits(model: network.T5Model, target_params, lookahead_params,
                     encoder_input_tokens, decoder_input_tokens, owners=None):
  """Teacher-forced logits of the real tokens and the look-ahead slots.

  Args:
    model: the target.
    target_params: its params (T5X's tree or the fused layout).
    lookahead_params: `{'lookahead_embedder': {'embedding': [L, emb]}}`.
    encoder_input_tokens: `[batch, input_length]`.
    decoder_input_tokens: `[batch, n]`, BOS first.
    owners: `[k]` int32 prefix ends t that get slots (default: all n);
      training samples a few per step (the cost grows with k x L).

  Returns:
    `(real [batch, n, vocab], slots [batch, k, L, vocab])`: real[:, t]
    predicts token t + 1 of the decoder stream (as `model.logits`),
    slots[:, i, j] predicts token owners[i] + j + 2, from the prefix
    :owners[i]+1 alone.
  """
  if owners is None:
    owners = jnp.arange(decoder_input_tokens.shape[1])
  return model.module_for(target_params).apply(
      {'params': target_params}, encoder_input_tokens, decoder_input_tokens,
      embeddings(lookahead_params), jnp.asarray(owners, jnp.int32),
      method=lookahead_forward)




def tree_layout(gamma: int, group: int):
  """Stand-for offsets and block mask of [last, x_1..x_g] + g+1 slot groups.

  Block index i < g + 1 is real token i (offset i from the block's first
  slot); group h (after x_h; h = 0: right after the last committed token)
  holds `group` slots, slot (h, j) standing at offset h + j + 1 and seeing
  real tokens 0..h and slots (h, :j+1).

  Returns:
    `(offsets [W] int32, mask [W, W] bool)`, W = g + 1 + (g + 1) * group.
  """
  real = gamma + 1
  h = np.repeat(np.arange(real), group)
  j = np.tile(np.arange(group), real)
  offsets = np.concatenate([np.arange(real), h + j + 1])
  last_real = np.concatenate([np.arange(real), h])  # real tokens seen: <=
  is_slot = np.concatenate([np.zeros(real, bool), np.ones(real * group, bool)])
  grp = np.concatenate([np.full(real, -1), h])
  slot_j = np.concatenate([np.full(real, -1), j])
  w = real + real * group
  real_key = ~is_slot[None, :] & (np.arange(w)[None, :] <= last_real[:, None])
  slot_key = (is_slot[None, :] & is_slot[:, None] & (grp[None] == grp[:, None])
              & (slot_j[None, :] <= slot_j[:, None]))
  return offsets.astype(np.int32), real_key | slot_key


def tree_extend(model, params, tokens, cache, lookahead):
  """One call of `model` on [last, x_1..x_g] + g+1 slot groups.

  Group h (L = lookahead's rows) is placed after real token h and stands for
  the positions after it, seeing only the real tokens up to it, so whatever
  the number n of accepted drafts, group n drafts the next iteration. The
  call is the model's own `extend` (any decoding model: a sharded target's
  constrains its cache and logits), the layout a `network.TreeMask` of
  `tree_layout`'s offsets and mask at each row's position, the slots' look-
  ahead embeddings in place of their tokens'. The block is written into the
  cache at each row's position (the caller rewinds past the slots);
  earlier cache slots are seen as the prefix.

  Returns:
    `(logits [batch, W, vocab], cache)` with position advanced by W.
  """
  b, real = tokens.shape
  offsets, block_mask = tree_layout(real - 1, lookahead.shape[0])
  w = offsets.shape[0]
  mask = network.TreeMask(
      base=cache.position,
      depth=jnp.broadcast_to(jnp.asarray(offsets), (b, w)),
      visible=jnp.broadcast_to(jnp.asarray(block_mask), (b, w, w)))
  block = jnp.concatenate([tokens, jnp.zeros((b, w - real), jnp.int32)], 1)
  return model.extend(params, block, cache, jnp.tile(lookahead, (real, 1)),
                      tree=mask)
