"""PaSS: the target drafts for itself with learned look-ahead embeddings.

PaSS (Monea, Joulin & Grave 2023, arXiv 2311.13581) appends L learned
"look-ahead" input embeddings after the decoder's last real token; the
target's logits at look-ahead slot j are a draft distribution for the j-th
token after the next one. Only the L x emb_dim embeddings are trained (the
target is frozen); drafts are verified by speculative sampling (Leviathan et
al. 2023, Algorithm 1), so outputs follow the target's law in every sampling
mode.

Here, for T5X encoder-decoders (`network.T5Model`):

- `network.Decoder.extend(..., lookahead, lookahead_start)` puts the slots in
  a decoding block; they stand for the positions after the row's last real
  token; callers drop them with `cache.rewind`. `lookahead_logits` is the
  teacher-forced twin (every prefix position t gets its own L slots, each
  seeing the real tokens :t+1 and the slots before it), used for training
  (`loss_fn`, scripts/train_pass.py) and for alpha per look-ahead position
  (`position_alpha`).
- `PassDrafter`, kind `'pass'`: an `interfaces.Drafter` for the ordinary
  loop (`speculative.speculative_sample`): one target call per `propose` on
  [the committed tokens its own cache lacks, slot_1..slot_L]. Draft 1 comes
  from the target's own next-token logits (q_1 = p_1 up to rounding), draft
  i >= 2 from slot i-1, so gamma <= L + 1. It keeps its own copy of the
  target's decoder cache (memory: one more target decoder cache, batch x
  (max_len + 2L + 2) x layers x 2 x heads x head_dim); the target's weights
  are shared, not copied. q_i for i >= 2 depends on the prefix only, not on
  drafts 1..i-1: exactness needs only x_i ~ q_i with that q_i handed to the
  verification (it is); `score` gives q_1's logits (the target's).
- `merged_sample`: the merged draft+verify loop. One target call per
  iteration on [last committed, x_1..x_gamma, slot_1..slot_L] (gamma <= L):
  positions 0..gamma verify this iteration's drafts, the slots after x_gamma
  draft the next iteration's. No drafter call at all.

Rejection handling (merged loop). The slots after x_gamma are conditioned on
all gamma drafts and stand for positions after x_gamma; they are only
aligned with the committed prefix when every draft was accepted (then the
bonus token is the token at x_gamma's position + 1 and slot j predicts the
j-th token after it). After a rejection at n < gamma they would still be
*valid* proposals (exactness does not depend on them) but for the wrong
positions, so nearly worthless. They are dropped: the next iteration of that
row is a "recovery" call on [last committed, slot_1..slot_L, pad]: q = 0
everywhere (no drafts; `speculative.verify` then draws the next token from
p_1, i.e. Algorithm 1 with gamma = 0), and its slots, now right after the
committed prefix, draft the iteration after. Both kinds of rows share one
compiled (gamma + 1 + L)-token call, L = gamma (`merged_sample` keeps the
first gamma slots; the slots' place in the block is per row:
`lookahead_start`). A recovery iteration commits one token, as a baseline
step would, at the cost of one (gamma+1+L)-token call.
`merged_sample(..., tree=True)` avoids recovery calls: one group of gamma
slots after each of last, x_1..x_gamma ((gamma + 1)^2 tokens per call,
group h seeing only the prefix up to x_h, `_tree_extend`), and group n
drafts the next iteration whatever n is. On the shipped target it is the
better of the two at gamma = 1 (results/pass_shipped.md).

Parameters: `{'lookahead_embedder': {'embedding': [L, emb_dim]}}` (T5X's
naming of `token_embedder`), saved and loaded as a T5X orbax checkpoint
beside the target's (`save_lookahead`, `load_lookahead`, which refuses
embeddings of another emb_dim).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import layers
from specdec_jax import network
from specdec_jax import sampling as sampling_lib
from specdec_jax import speculative
from specdec_jax.sampling import SamplingConfig

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
  if isinstance(num_lookahead, bool) or not isinstance(
      num_lookahead, int) or num_lookahead < 1:
    raise ValueError(f'num_lookahead must be an int >= 1, got '
                     f'{num_lookahead!r}.')
  table = jnp.asarray(target_params['token_embedder']['embedding'],
                      jnp.float32)
  noise = jax.random.normal(jax.random.key(seed),
                            (num_lookahead, table.shape[1]))
  emb = table.mean(0)[None] + 0.05 * table.std() * noise
  return {KEY: {'embedding': emb}}


def check_lookahead(lookahead_params, config: network.T5Config,
                    source: str = 'look-ahead params') -> int:
  """Returns L; ValueError unless the tree is `[L, config.emb_dim]`."""
  try:
    shape = tuple(np.shape(embeddings(lookahead_params)))
  except (KeyError, TypeError, IndexError) as e:
    raise ValueError(f"{source} must be {{'{KEY}': {{'embedding': "
                     f"[L, emb_dim]}}}}, got {_describe(lookahead_params)}."
                     ) from e
  if len(shape) != 2 or shape[0] < 1 or shape[1] != config.emb_dim:
    raise ValueError(
        f'{source}: look-ahead embeddings of shape {shape} do not fit the '
        f'target (emb_dim={config.emb_dim}): want [L, {config.emb_dim}]; '
        'were they trained for another target?')
  extra = set(lookahead_params) - {KEY}
  if extra:
    raise ValueError(f'{source}: unexpected entries {sorted(extra)}.')
  return shape[0]


def _describe(tree) -> str:
  if isinstance(tree, dict):
    return '{' + ', '.join(f'{k!r}: ...' for k in tree) + '}'
  return type(tree).__name__


def save_lookahead(lookahead_params, directory: str, step: int = 0) -> str:
  """Writes the embeddings as a T5X orbax checkpoint `<dir>/checkpoint_<step>`.

  Beside the target's checkpoint, e.g. `<target model dir>/pass_L8/`.
  """
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  params = {KEY: {'embedding': jnp.asarray(embeddings(lookahead_params),
                                           jnp.float32)}}
  return checkpoints.save_t5x_params(params, directory, step)


def load_lookahead(path: str, config: network.T5Config):
  """Look-ahead params from a checkpoint (`save_lookahead`'s or a model dir).

  Raises:
    ValueError: the embeddings' shape does not fit `config` (emb_dim).
  """
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  if not path.startswith('gs://'):
    path = os.path.abspath(os.path.expanduser(path))  # orbax: absolute only
  params = checkpoints.load_t5x_params(path, dtype=jnp.float32)
  check_lookahead(params, config, f'look-ahead checkpoint {path}')
  return params


# ---------------------------------------------------------------------------
# Teacher-forced look-ahead logits (training, alpha per position).
# ---------------------------------------------------------------------------


def _slot_layout(n: int, num_lookahead: int, owners):
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


def _lookahead_forward(module, encoder_input_tokens, decoder_input_tokens,
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
  relative, mask = _slot_layout(n, big_l, owners)
  self_bias = dec.relpos_bias(relative, bidirectional=False)[None]
  self_bias = self_bias + layers.mask_to_bias(mask)
  cross_bias = layers.mask_to_bias(
      (encoder_input_tokens > 0)[:, None, None, :])
  real = dec.shared_embedding(decoder_input_tokens).astype(cfg.compute_dtype)
  slots = jnp.broadcast_to(lookahead.astype(cfg.compute_dtype)[None, None],
                           (b, k, big_l, lookahead.shape[1]))
  y = jnp.concatenate([real, slots.reshape(b, k * big_l, -1)], axis=1)
  for layer in dec.layers:
    y, _ = layer(y, self_bias, layer.cross_kv(encoded), cross_bias)
  logits = dec._logits(y)  # pylint: disable=protected-access
  return logits[:, :n], logits[:, n:].reshape(b, k, big_l, -1)


def lookahead_logits(model: network.T5Model, target_params, lookahead_params,
                     encoder_input_tokens, decoder_input_tokens, owners=None):
  """Teacher-forced logits of the real tokens and the look-ahead slots.

  Args:
    model: the target.
    target_params: its params (unfused T5X tree).
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
  return model.module.apply(
      {'params': target_params}, encoder_input_tokens, decoder_input_tokens,
      embeddings(lookahead_params), jnp.asarray(owners, jnp.int32),
      method=_lookahead_forward)


def loss_fn(model, target_params, lookahead_params, encoder_input_tokens,
            decoder_target_tokens, owners=None):
  """Mean cross-entropy of the slots' predictions (teacher forcing).

  Slot (t, j) predicts `decoder_target_tokens[:, t + j + 1]` (0 = padding,
  no loss), for the prefix ends t in `owners` (default: all). Gradients
  flow to `lookahead_params` only: the target's params enter under
  `stop_gradient`.

  Returns:
    `(loss, {'loss', 'accuracy_at' [L], 'weight_at' [L]})`.
  """
  targets = decoder_target_tokens
  n = targets.shape[1]
  dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
  owners = jnp.arange(n) if owners is None else jnp.asarray(owners)
  _, slots = lookahead_logits(model, jax.lax.stop_gradient(target_params),
                              lookahead_params, encoder_input_tokens, dec_in,
                              owners)
  big_l = slots.shape[2]
  idx = owners[:, None] + jnp.arange(big_l)[None, :] + 1  # [k, L]
  labels = jnp.take(jnp.pad(targets, ((0, 0), (0, big_l + 1))), idx, axis=1)
  weights = (labels > 0) & (idx < n)[None]
  log_p = jax.nn.log_softmax(slots, axis=-1)
  nll = -jnp.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
  w = weights.astype(jnp.float32)
  loss = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)
  correct = (jnp.argmax(slots, -1) == labels) * w
  return loss, {'loss': loss, 'accuracy_at': correct.sum((0, 1)),
                'weight_at': w.sum((0, 1))}


def make_train_step(model: network.T5Model, optimizer):
  """A jitted `(target_params, la_params, opt_state, inputs, targets[,
  owners]) -> (la_params, opt_state, metrics)`: one optax step on the
  embeddings only (`loss_fn`).

  Gradients are taken with respect to the look-ahead params alone; the
  target's params are an argument under `stop_gradient` and come back
  untouched (tests/test_pass.py checks them bit for bit).
  """

  @jax.jit
  def step(target_params, lookahead_params, opt_state, inputs, targets,
           owners=None):
    grad_fn = jax.grad(
        lambda la: loss_fn(model, target_params, la, inputs, targets,
                           owners),
        has_aux=True)
    grads, metrics = grad_fn(lookahead_params)
    updates, opt_state = optimizer.update(grads, opt_state, lookahead_params)
    return optax.apply_updates(lookahead_params, updates), opt_state, metrics

  return step


def position_alpha(model, target_params, lookahead_params,
                   encoder_input_tokens, target_outputs,
                   sampling: SamplingConfig = SamplingConfig()):
  """alpha per look-ahead slot on the target's outputs (teacher forcing).

  beta(t, j) = sum_x min(p, q) between the target's standardized p of token
  t + j + 2 (after the true prefix) and slot j's q after prefix :t+1.

  Args:
    target_outputs: `[batch, n]` the target's outputs (EOS kept, 0 after).

  Returns:
    `(beta_sum [L], count [L])` numpy float64 (alpha_j = sum / count).
  """
  targets = jnp.asarray(target_outputs, jnp.int32)
  dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
  enc = jnp.asarray(encoder_input_tokens, jnp.int32)
  real, slots = _lookahead_jit(model, target_params, lookahead_params, enc,
                               dec_in)
  p = sampling_lib.probabilities(real, sampling)  # p[:, s]: token s + 1
  q = sampling_lib.probabilities(slots, sampling)
  b, n, big_l, _ = q.shape
  sums, counts = np.zeros(big_l), np.zeros(big_l)
  targets = np.asarray(targets)
  for j in range(big_l):
    # slot (t, j) vs p at real position t + j + 1.
    m = n - j - 1
    if m <= 0:
      continue
    beta = np.asarray(jnp.sum(jnp.minimum(q[:, :m, j], p[:, j + 1:]), -1))
    w = targets[:, j + 1:] > 0
    sums[j] += (beta * w).sum()
    counts[j] += w.sum()
  return sums, counts


@functools.partial(jax.jit, static_argnums=0)
def _lookahead_jit(model, target_params, lookahead_params, enc, dec_in):
  return lookahead_logits(model, target_params, lookahead_params, enc, dec_in)


# ---------------------------------------------------------------------------
# The Drafter-protocol version (ordinary loop).
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PassDrafter:
  """The target drafting for itself with L look-ahead slots (kind 'pass').

  params: `{'target': the target's params, 'lookahead': look-ahead params}`
  (`pass_params`). gamma <= L + 1 (draft 1 from the target's next-token
  logits, draft i >= 2 from slot i - 1). For the merged draft+verify loop,
  call `merged_sample` with the same drafter and params (gamma <= L).
  """

  model: network.T5Model
  num_lookahead: int

  # q_i for i >= 2 comes from look-ahead slot i - 1 (the prefix only), not
  # from `score` after prefix ++ drafts 1..i-1 as `interfaces.Drafter`
  # describes: still exact (x_i ~ q_i, that q_i verified), but the generic
  # prefill/score check of tests/test_drafters.py does not apply.
  drafts_from_score = False

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def merged_loop(self):
    """The loop callers decode with (`speculative.sampler`): one target call
    per iteration, gamma <= L."""
    return merged_sample

  def check_params(self, params) -> None:
    if not isinstance(params, dict) or set(params) != {'target', 'lookahead'}:
      raise ValueError("PaSS params must be {'target': target params, "
                       "'lookahead': look-ahead params} (pass_params), got "
                       f'{_describe(params)}.')
    big_l = check_lookahead(params['lookahead'], self.model.config)
    if big_l != self.num_lookahead:
      raise ValueError(f'{big_l} look-ahead embeddings, the drafter was '
                       f'built for {self.num_lookahead}.')
    drafters.T5Drafter(self.model).check_params(params['target'])

  def check_gamma(self, gamma: int, merged: bool = False) -> None:
    top = self.num_lookahead + (0 if merged else 1)
    if gamma > top:
      raise ValueError(
          f'gamma={gamma} > {top}: with L={self.num_lookahead} look-ahead '
          'embeddings PaSS drafts at most L + 1 tokens per call (L in the '
          'merged loop).')

  def init(self, params, encoder_input_tokens, max_length: int):
    # Room for a block of (gamma + 1) real tokens and L slots after the
    # last committed one, gamma <= L + 1.
    return self.model.init_cache(params['target'], encoder_input_tokens,
                                 max_length + 2 * self.num_lookahead + 2)

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    """The target's logits: q_1's (later drafts come from the slots)."""
    return drafters.T5Drafter(self.model).score(
        params['target'], encoder_input_tokens, decoder_input_tokens)

  def prefill(self, params, cache, sequences, lengths):
    """Consumes `sequences[b, :lengths[b] - 1]` into its target cache."""
    return drafters.T5Drafter(self.model).prefill(params['target'], cache,
                                                  sequences, lengths)

  def propose(self, params, cache, sequences, lengths, gamma: int,
              sampling: SamplingConfig, rng: Array):
    """One target call on [tokens the cache lacks, slots]; q_1 = p_1."""
    self.check_gamma(gamma)
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


# ---------------------------------------------------------------------------
# The merged draft+verify loop.
# ---------------------------------------------------------------------------


def _tree_layout(gamma: int, group: int):
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


def _tree_extend(module, tokens, cache, lookahead):
  """`Transformer` method: one call on [last, x_1..x_g] + g+1 slot groups.

  Group h (L = lookahead's rows) is placed after real token h and stands for
  the positions after it, seeing only the real tokens up to it, so whatever
  the number n of accepted drafts, group n drafts the next iteration. The
  block is written into the cache at each row's position (the caller
  rewinds past the slots); earlier cache slots are seen as the prefix.

  Returns:
    `(logits [batch, W, vocab], cache)` with position advanced by W.
  """
  dec = module.decoder
  cfg = module.config
  b, real = tokens.shape
  group = lookahead.shape[0]
  offsets, block_mask = _tree_layout(real - 1, group)
  w = offsets.shape[0]
  p0 = cache.position
  k_idx = jnp.arange(cache.max_length, dtype=jnp.int32)
  r = k_idx[None, :] - p0[:, None]  # [batch, max_len] index in the block
  in_block = (r >= 0) & (r < w)
  rc = jnp.clip(r, 0, w - 1)
  key_pos = jnp.where(in_block, p0[:, None] + jnp.asarray(offsets)[rc],
                      k_idx[None, :])
  q_pos = p0[:, None] + jnp.asarray(offsets)[None, :]  # [batch, W]
  visible = jnp.where(
      in_block[:, None, :],
      jnp.moveaxis(jnp.asarray(block_mask)[:, rc], 0, 1),  # [b, W, max_len]
      (r < 0)[:, None, :])
  relative = key_pos[:, None, :] - q_pos[:, :, None]
  self_bias = dec.relpos_bias(relative, bidirectional=False)
  self_bias = self_bias + layers.mask_to_bias(visible)[:, None]
  cross_bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])
  y = dec.shared_embedding(tokens).astype(cfg.compute_dtype)
  slots = jnp.tile(lookahead.astype(cfg.compute_dtype), (real, 1))
  y = jnp.concatenate(
      [y, jnp.broadcast_to(slots[None], (b,) + slots.shape)], axis=1)
  new_k, new_v = [], []
  for i, layer in enumerate(dec.layers):
    y, (key, value) = layer(
        y, self_bias, (cache.cross_key[i], cache.cross_value[i]), cross_bias,
        (cache.self_key[i], cache.self_value[i]), p0)
    new_k.append(key)
    new_v.append(value)
  cache = cache.replace(self_key=tuple(new_k), self_value=tuple(new_v),
                        position=p0 + w)
  return dec._logits(y), cache  # pylint: disable=protected-access


@dataclasses.dataclass(frozen=True)
class _MergedLoop(speculative.MergedLoop):
  num_lookahead: int
  tree: bool = False

  @property
  def width(self) -> int:
    if self.tree:  # g + 1 real tokens, g + 1 groups of g slots
      return (self.gamma + 1) * (self.gamma + 1)
    return self.gamma + 1 + self.num_lookahead

  def body_fn(self, target_params, lookahead,
              state: speculative.MergedState):
    g, big_l = self.gamma, self.num_lookahead
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    lengths = state.lengths
    drafts, q = state.drafts, state.q
    has = jnp.any(q[:, 0] > 0, axis=-1)  # [batch] rows with drafts
    # One call: [last, x_1..x_g, slots] (drafted) or [last, slots, pad].
    last = jnp.take_along_axis(state.sequences, (lengths - 1)[:, None], 1)
    tokens = jnp.where(has[:, None], drafts, 0)
    block = jnp.concatenate(
        [last, tokens, jnp.zeros((last.shape[0], big_l), jnp.int32)], axis=1)
    cache = state.target_cache.rewind(lengths - 1)
    if self.tree:
      logits, target_cache = self.target.module.apply(
          {'params': target_params}, jnp.concatenate([last, tokens], 1),
          cache, lookahead[:g], method=_tree_extend)
    else:
      slot0 = jnp.where(has, g + 1, 1)
      logits, target_cache = self.target.extend(
          target_params, block, cache, lookahead, slot0)
    p = sampling_lib.probabilities(logits[:, :g + 1], self.sampling)
    # Rows without drafts have q = 0 (undrafted: `speculative.verify`), so
    # n = 0 and their token comes from p_1, the target's after `last`.
    sequences, new_lengths, ended, stats, n = speculative.accept_and_commit(
        verify_rng, drafts, q, p, self.sampling, self.eos_id,
        self.max_decode_len, state.sequences, lengths, state.ended,
        state.stats)
    # Next drafts from the slots: aligned when the row had no drafts or
    # accepted all of them (slot j then predicts the j-th token after t).
    if self.tree:  # group n, after the last accepted draft
      pick = (g + 1 + n * g)[:, None] + jnp.arange(g)
      aligned = jnp.ones_like(has)
    else:
      pick = slot0[:, None] + jnp.arange(g)
      aligned = ~has | (n == g)
    chosen = jnp.take_along_axis(logits, pick[..., None], axis=1)
    b, _, v = chosen.shape
    next_drafts, next_q = sampling_lib.draw(
        draft_rng, chosen.reshape(b * g, v), self.sampling)
    next_q = jnp.where(aligned[:, None, None], next_q.reshape(b, g, v), 0.0)
    return speculative.MergedState(sequences, new_lengths, ended,
                                   target_cache, next_drafts.reshape(b, g),
                                   next_q, rng, stats)


def _prepare(target, target_params, drafter, draft_params,
             encoder_input_tokens, gamma, max_decode_len, sampling, eos_id,
             rng, tree=False):
  decoding.check_common_args(target, encoder_input_tokens, max_decode_len,
                             sampling, eos_id)
  speculative.check_gamma(gamma)
  if not isinstance(drafter, PassDrafter):
    raise ValueError(f'merged_sample needs a PassDrafter, got '
                     f'{type(drafter).__name__}.')
  speculative.check_vocab(target.vocab_size, drafter.vocab_size)
  drafter.check_gamma(gamma, merged=True)
  try:
    check_lookahead(draft_params['lookahead'], target.config)
  except (KeyError, TypeError) as e:
    raise ValueError('draft_params must be pass_params(...)') from e
  rng = decoding.default_rng(rng, sampling)
  inputs = jnp.asarray(encoder_input_tokens, jnp.int32)
  # Only slots 1..gamma draft (slot j sees slots 1..j alone, so dropping
  # the others changes nothing but the call's width: gamma + 1 + gamma).
  lookahead = embeddings(draft_params['lookahead'])[:gamma]
  loop = _MergedLoop(target, int(gamma), sampling, int(eos_id),
                     int(max_decode_len), num_lookahead=int(gamma),
                     tree=bool(tree))
  return loop, (target_params, lookahead, inputs, rng)


def merged_sample(target, target_params, drafter, draft_params,
                  encoder_input_tokens, *, gamma: int, max_decode_len: int,
                  sampling: SamplingConfig = SamplingConfig(),
                  eos_id: int = 1, rng: Optional[Array] = None,
                  draft_input_tokens=None,
                  tree: bool = False) -> speculative.SpecResult:
  """PaSS with merged draft+verify: `speculative_sample`'s signature.

  One (2 gamma + 1)-token target call per iteration (the first gamma of
  the L look-ahead slots draft; slot j sees slots 1..j only, so the others
  are left out), no drafter call (see the module docstring); gamma <= L.
  `drafter` / `draft_params` are the 'pass' kind's (`PassDrafter`, `pass_params`); only the look-ahead
  embeddings are read from draft_params (the target's params are
  `target_params`). Output law = the target's; greedy = the baseline.
  `stats.iterations` counts target calls (recovery iterations included).

  tree: False, the (2 gamma + 1)-token call with one slot group after
  x_gamma (a rejection costs a recovery iteration); True, one group of gamma
  slots after each of last, x_1..x_gamma ((gamma + 1)^2 tokens per call),
  so group n drafts the next iteration whatever n: no recovery iterations.
  """
  del draft_input_tokens  # the target reads its own inputs
  loop, args = _prepare(target, target_params, drafter, draft_params,
                        encoder_input_tokens, gamma, max_decode_len, sampling,
                        eos_id, rng, tree)
  return speculative.run_merged(loop, *args)


def lower_merged_sample(target, target_params, drafter, draft_params,
                        encoder_input_tokens, *, gamma: int,
                        max_decode_len: int,
                        sampling: SamplingConfig = SamplingConfig(),
                        eos_id: int = 1, rng: Optional[Array] = None,
                        draft_input_tokens=None, tree: bool = False):
  """`merged_sample`'s compiled program, lowered but not run."""
  del draft_input_tokens
  loop, args = _prepare(target, target_params, drafter, draft_params,
                        encoder_input_tokens, gamma, max_decode_len, sampling,
                        eos_id, rng, tree)
  return speculative.run_merged.lower(loop, *args)


# ---------------------------------------------------------------------------
# The drafter kind.
# ---------------------------------------------------------------------------


def _build_pass(source: drafters.DraftSource):
  """Target + look-ahead embeddings: from `source.draft_params` when it is a
  look-ahead tree, else from `source.draft_checkpoint` (DRAFT_CHECKPOINT),
  else untrained (a warning; still exact, drafts poor)."""
  if source.target_model is None or source.target_params is None:
    raise ValueError("drafter kind 'pass' drafts with the target itself; "
                     'the source has no target_model / target_params.')
  model = source.target_model
  lookahead = source.draft_params
  if not (isinstance(lookahead, dict) and KEY in lookahead):
    path = getattr(source, 'draft_checkpoint', None)
    if path and str(path).startswith('shipped:'):
      raise ValueError(
          f"drafter kind 'pass' reads look-ahead embeddings from "
          f'DRAFT_CHECKPOINT, got {path!r} (a shipped T5): point it at a '
          'scripts/train_pass.py --out_dir (e.g. results/pass_embeddings/'
          'en_de).')
    if path:
      lookahead = load_lookahead(os.fspath(path), model.config)
    else:
      logging.warning("drafter kind 'pass': no look-ahead checkpoint "
                      '(DRAFT_CHECKPOINT); using untrained embeddings.')
      lookahead = init_lookahead(source.target_params, DEFAULT_LOOKAHEAD)
  big_l = check_lookahead(lookahead, model.config)
  return (PassDrafter(model, big_l),
          pass_params(source.target_params, lookahead))


DEFAULT_LOOKAHEAD = 4

drafters.register(drafters.DrafterKind(
    'pass', needs_model=False, build=_build_pass, needs_target=True,
    description='PaSS: the target drafts for itself from L learned '
                'look-ahead embeddings (DRAFT_CHECKPOINT)'))
