"""T5 1.1 / 1.0 encoder-decoder with T5X's parameter tree and an explicit cache.

The parameter tree (names, nesting, 2-D kernels, logical axes) is that of
t5x/examples/t5/network.py, so T5X checkpoints load with no renaming. Unlike
T5X, the decoder cache is an explicit pytree (`DecoderCache`) passed in and out:
one `extend` call appends k >= 1 tokens per row at each row's own position, and
rewinding a row is setting its position back.

Fused projections (`T5Config.fused_projections`, `for_decoding`) are a
decoding-time layout of the same weights: self-attention's query/key/value
kernels as one `qkv` kernel, every decoder layer's cross-attention key/value
as one `decoder/cross_kv` kernel, a gated MLP's `wi_0`/`wi_1` as one
`wi_fused` (fewer matmuls per step; on a GPU, fewer kernel launches). Checkpoints, widening, training and diagnostics only ever
see T5X's unfused tree: `fuse_params` / `unfuse_params` convert.

A `T5Model` reads either layout: the params' tree says which
(`T5Model.module_for`). Every decode loop runs on the fused layout,
laid out once before its `lax.while_loop` (`decoding_layout`, applied by
`scaffold.run` to every T5 params tree among the loop's arguments; a
no-op on params laid out at load): inside a loop no weight is joined,
split or converted (a compiler that merges two matmuls sharing an input
would otherwise concatenate their weights on every iteration).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from flax import struct
from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import layers

Array = jax.Array


@struct.dataclass
class T5Config:
  """T5X's T5Config (same fields, same defaults) plus `activation_dtype`.

  Attributes:
    dtype: T5X's dtype: weights are rounded to it, and, unless
      `activation_dtype` is set, activations and arithmetic use it too.
    activation_dtype: None (T5X's behaviour: activations in `dtype`) or the
      dtype of the activations, the arithmetic and the decoder cache, apart
      from the weights': `dtype='bfloat16', activation_dtype='float32'` runs
      bfloat16 weights with float32 activations (on a GPU a step costs about
      the same, since it is bound by reading the weights; ../shared/GPU.md).
      Not part of the parameter tree; both decoders (baseline and
      speculative) share the model and so the setting.
    fused_projections: False (T5X's parameter tree) or True: the decoding-
      time layout of the same weights (one `qkv`, `kv` and `wi_fused` kernel
      where T5X has two or three; see `fuse_params`). Not a checkpoint
      format: build it with `for_decoding`.
    attention_kernel: 'dot_product' (T5X's attention) or 'cudnn' (cuDNN's
      fused kernel on a CUDA GPU, float32 softmax; the same math in XLA
      elsewhere: `layers.fused_attention`). Not part of the parameter tree.
    dense_kernel: 'xla' (T5X's: each decoder layer's norms and projections
      apart) or 'pallas': on a CUDA GPU, bfloat16, a decoder layer's three
      norms each normalized by the projection that reads it, the MLP's
      gate applied as wi's product is written (`kernels.norm_dense`, one
      Pallas kernel each; the same math in XLA elsewhere). One device
      only. Not part of the parameter tree.
  """

  vocab_size: int
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ('relu',)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False
  activation_dtype: Any = None
  fused_projections: bool = False
  attention_kernel: str = 'dot_product'
  dense_kernel: str = 'xla'

  @property
  def compute_dtype(self) -> Any:
    """The activations' dtype: `activation_dtype`, else `dtype`."""
    return self.dtype if self.activation_dtype is None else (
        self.activation_dtype)


# cuBLAS runs a bfloat16 GEMM on a multiple of 8 rows (an alignment rule of
# the library, as XLA's cublas_pad_for_gemms applies it; no measured figure
# of a chip, which live in profiles and chips.json): a GPU build pads the
# operand of each matmul of a call on k % 8 != 0 tokens and slices its
# result (XLA's cublas_pad_for_gemms), about 9 more kernels a decoder layer.
# `Decoder.extend` pads the call once instead, on a GPU: at T5 1.1-XXL cost
# (compile-only H100, cuBLAS GEMMs) a 65-token tree call 678 -> 461 kernels
# and 12.23 -> 11.99 GB, a 7-token chain call 677 -> 460 kernels
# (results/compiled/tree_call_bytes_h100.md).
CUBLAS_ROWS = 8


def padded_rows(k: int) -> int:
  """The rows a call on k tokens runs on on a GPU: k rounded up to a
  multiple of `CUBLAS_ROWS` (k = 1, a matrix-vector product, stays 1)."""
  return k if k == 1 else -(-k // CUBLAS_ROWS) * CUBLAS_ROWS


@struct.dataclass
class PendingMove:
  """Cache slots to move, moved by the next `Decoder.extend` as it writes
  (`DecoderCache.move_slots(..., later=True)`).

  Attributes:
    source: `[batch, m]` int32 slots to read.
    start: `[batch]` int32 first slot to write. The next call moves its
      row's first `position - start` of them (the call writes from
      `position`, after a `rewind` to the end of what was accepted): the
      same as a move made at once where that position is in start ..
      start + m (the tree loop's: start + the accepted count); a row at
      or before start moves none.
  """

  source: Array
  start: Array


@struct.dataclass
class DecoderCache:
  """Everything the decoder needs between calls, as a pytree.

  Attributes:
    self_key: per decoder layer, `[batch, max_length, heads, head_dim]`.
    self_value: per decoder layer, `[batch, max_length, heads, head_dim]`.
    cross_key: per decoder layer, `[batch, input_length, heads, head_dim]`,
      computed once from the encoder output.
    cross_value: as `cross_key`.
    encoder_mask: `[batch, input_length]` bool, True on real input tokens.
    position: `[batch]` int32, the number of decoder tokens each row holds;
      the next `extend` writes row b's tokens at slots position[b], ...
      Slots at or after `position` are stale and never attended to.
    pending: None, or the move of slots the next `extend` makes before
      its tokens' (`with_pending`, `move_slots(..., later=True)`).
  """

  self_key: Tuple[Array, ...]
  self_value: Tuple[Array, ...]
  cross_key: Tuple[Array, ...]
  cross_value: Tuple[Array, ...]
  encoder_mask: Array
  position: Array
  pending: Optional[PendingMove] = None

  @property
  def max_length(self) -> int:
    return self.self_key[0].shape[1]

  def rewind(self, position: Array) -> 'DecoderCache':
    """Sets each row's position (e.g. back to drop rejected tokens)."""
    return self.replace(position=jnp.asarray(position, jnp.int32))

  def with_pending(self, m: int) -> 'DecoderCache':
    """This cache with room for a pending move of up to m slots (none
    pending): the form a loop that moves slots `later` carries, so that
    its state keeps one structure. Each call then writes m + k slots from
    its position back to where the move starts: the cache needs m slots
    of room past the last call's."""
    batch = self.position.shape[0]
    return self.replace(pending=PendingMove(
        source=jnp.zeros((batch, m), jnp.int32), start=self.position))

  def move_slots(self, source: Array, start: Array,
                 later: bool = False) -> 'DecoderCache':
    """Copies self-attention slots `source[b, i]` to `start[b] + i`.

    A token tree's accepted path: its nodes sit at their tree slots after
    the verification call and move to the consecutive slots a chain would
    have written (their keys / values already hold the right positions:
    `TreeMask`). Gathers before writing, so overlapping ranges are safe;
    the position is unchanged (callers `rewind`).

    With `later`, nothing is copied now: the next `extend` writes the
    slots it keeps (those before its position, `PendingMove`) in the
    same update slice as its tokens' keys / values. On a GPU a move is a
    kernel per layer's key and value (48 at T5 1.1-XXL); later, none.
    The cache must come from `with_pending(m)`.

    Args:
      source: `[batch, m]` int32 slots to read (each < max_length).
      start: `[batch]` int32 first slot to write (start + m <= max_length).
      later: move them in the next `extend`'s writes.

    Raises:
      ValueError: `later` on a cache with no room for m pending slots.
    """
    if later:
      if self.pending is None or (
          self.pending.source.shape != source.shape):
        room = None if self.pending is None else self.pending.source.shape
        raise ValueError(
            f'move_slots(later=True) of {source.shape} slots needs a cache '
            f'from with_pending({source.shape[1]}); this one has room for '
            f'{room}.')
      return self.replace(pending=PendingMove(
          source=source.astype(jnp.int32), start=jnp.asarray(start, jnp.int32)))

    def move(buffer):
      rows = jnp.take_along_axis(buffer, source[:, :, None, None], axis=1)
      return layers.write_rows(buffer, rows, start)
    return self.replace(self_key=tuple(map(move, self.self_key)),
                        self_value=tuple(map(move, self.self_value)))


@struct.dataclass
class TreeMask:
  """A token tree in the decoder cache: where it sits, who sees whom.

  The tree's T slots are cache slots base[b] .. base[b] + T - 1, slot 0 its
  root (the row's last committed token). A tree token at depth d stands at
  position base + d for the relative position bias (the position it would
  have in a chain), and attends to the committed slots before base, to its
  ancestors in the tree and to itself: along any root-to-leaf path the
  logits equal a chain call on that path (tests/drafters/test_trees.py).

  Attributes:
    base: `[batch]` int32, the root's slot.
    depth: `[batch, T]` int32, each tree slot's depth (the root's 0).
    visible: `[batch, T, T]` bool, visible[b, i, j]: tree slot i attends to
      tree slot j (j is i or one of its ancestors).
  """

  base: Array
  depth: Array
  visible: Array

  @property
  def size(self) -> int:
    return self.depth.shape[1]

  def positions(self, slots: Array) -> Tuple[Array, Array, Array]:
    """(tree index clipped to the tree, in-tree mask, position) of
    `slots` `[batch, n]` (positions of slots outside the tree: the slot)."""
    index = slots - self.base[:, None]
    inside = (index >= 0) & (index < self.size)
    index = jnp.clip(index, 0, self.size - 1)
    depth = jnp.take_along_axis(self.depth, index, axis=1)
    return index, inside, jnp.where(inside, self.base[:, None] + depth, slots)

  def bias_inputs(self, q_slots: Array, max_length: int):
    """(relative position `[batch, k, max_length]`, attend mask, same shape)
    for queries at cache slots `q_slots` `[batch, k]` (in the tree; a slot
    after it, a row `Decoder.extend` pads, sees what the last slot sees)."""
    batch = q_slots.shape[0]
    k_slots = jnp.broadcast_to(jnp.arange(max_length, dtype=jnp.int32),
                               (batch, max_length))
    q_index, _, q_pos = self.positions(q_slots)
    k_index, k_inside, k_pos = self.positions(k_slots)
    relative = k_pos[:, None, :] - q_pos[:, :, None]
    # [batch, k, T] rows of the queries, then their columns at the keys.
    rows = jnp.take_along_axis(self.visible, q_index[:, :, None], axis=1)
    seen = jnp.take_along_axis(
        rows, jnp.broadcast_to(k_index[:, None, :], relative.shape), axis=2)
    committed = k_slots < self.base[:, None]
    mask = jnp.where(k_inside[:, None, :], seen, committed[:, None, :])
    return relative, mask


class EncoderLayer(nn.Module):
  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_attention_layer_norm = _norm(cfg)
    self.attention = _attention(cfg)
    self.pre_mlp_layer_norm = _norm(cfg)
    self.mlp = _mlp(cfg)

  def __call__(self, inputs: Array, bias: Array) -> Array:
    # [batch, length, embed] -> [batch, length, embed]
    x = self.pre_attention_layer_norm(inputs)
    x = self.attention.attend_projected(
        *self.attention.project_qkv(x), bias) + inputs
    return self.mlp(self.pre_mlp_layer_norm(x)) + x


class DecoderLayer(nn.Module):
  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = _norm(cfg)
    self.self_attention = _attention(cfg)
    self.pre_cross_attention_layer_norm = _norm(cfg)
    self.encoder_decoder_attention = _attention(cfg, cross=True)
    self.pre_mlp_layer_norm = _norm(cfg)
    self.mlp = _mlp(cfg)

  def cross_kv(self, encoded: Array) -> Tuple[Array, Array]:
    """This layer's cross-attention key and value (T5X's layout only; the
    fused layout projects every layer's at once:
    `Decoder.project_cross_kv`)."""
    # [batch, input_length, embed] -> 2 x [batch, input_length, heads, dim]
    return self.encoder_decoder_attention.project_kv(encoded)

  def __call__(self, inputs, self_bias, cross_kv, cross_bias,
               cache_kv=None, position=None, written=None, moved=None):
    """One decoder layer.

    Args:
      inputs: `[batch, k, embed]`.
      self_bias: `[batch or 1, heads, k, kv_length]` (relpos + causal mask).
      cross_kv: projected encoder key/value, `[batch, input_length, heads, d]`.
      cross_bias: `[batch, 1, 1 or k, input_length]`.
      cache_kv: None (teacher forcing: attend to these k tokens only) or the
        cached `(key, value)` `[batch, max_length, heads, d]` to write into.
      position: `[batch]` write position in the cache.
      written: how many of the k tokens write their key / value to the
        cache (the first; None: all); the rest only attend (rows padded for
        the GPU's matmuls, `Decoder.extend`).
      moved: None, or `(source [batch, m], count [batch])`: the cache's
        slots to move before `position` as the keys / values are written
        (`layers.write_rows_moved`; `DecoderCache.move_slots` later).

    Returns:
      `([batch, k, embed], (key, value))`, the keys/values attended over.
    """
    defer = _defers_norms(self.config)
    x = self.pre_self_attention_layer_norm(inputs, defer)
    query, key, value = self.self_attention.project_qkv(x)
    if cache_kv is not None:
      write = layers.write_rows if moved is None else functools.partial(
          layers.write_rows_moved, source=moved[0], moved=moved[1])
      key = write(cache_kv[0], key[:, :written], position)
      value = write(cache_kv[1], value[:, :written], position)
    x = self.self_attention.attend_projected(query, key, value,
                                             self_bias) + inputs
    y = self.encoder_decoder_attention.attend(
        self.pre_cross_attention_layer_norm(x, defer), *cross_kv,
        cross_bias) + x
    z = self.mlp(self.pre_mlp_layer_norm(y, defer)) + y
    return z, (key, value)


# Every layer computes in cfg.compute_dtype on weights rounded to cfg.dtype.


DENSE_KERNELS = ('xla', 'pallas')


def _defers_norms(cfg: T5Config) -> bool:
  """Whether a decoder layer's norms go to the projections reading them
  (`T5Config.dense_kernel`)."""
  return cfg.dense_kernel == 'pallas'


def _norm(cfg: T5Config) -> layers.LayerNorm:
  return layers.LayerNorm(dtype=cfg.compute_dtype, weight_dtype=cfg.dtype)


def _attention(cfg: T5Config,
               cross: bool = False) -> layers.MultiHeadAttention:
  fused = ('kv' if cross else 'qkv') if cfg.fused_projections else None
  return layers.MultiHeadAttention(
      num_heads=cfg.num_heads,
      head_dim=cfg.head_dim,
      out_features=cfg.emb_dim,
      dtype=cfg.compute_dtype,
      weight_dtype=cfg.dtype,
      float32_logits=cfg.float32_attention_logits,
      fused=fused,
      kernel=cfg.attention_kernel,
  )


def _mlp(cfg: T5Config) -> layers.MlpBlock:
  return layers.MlpBlock(
      intermediate_dim=cfg.mlp_dim,
      activations=tuple(cfg.mlp_activations),
      dtype=cfg.compute_dtype,
      weight_dtype=cfg.dtype,
      fused=cfg.fused_projections,
  )


def _relpos(cfg: T5Config) -> layers.RelativePositionBiases:
  return layers.RelativePositionBiases(
      num_heads=cfg.num_heads, dtype=cfg.compute_dtype, weight_dtype=cfg.dtype)


class Encoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = _relpos(cfg)
    self.layers = [EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)]
    self.encoder_norm = _norm(cfg)

  def __call__(self, tokens: Array) -> Array:
    # [batch, length] -> [batch, length, embed]
    x = self.shared_embedding(tokens).astype(self.config.compute_dtype)
    length = tokens.shape[-1]
    relative = np.arange(length)[None, :] - np.arange(length)[:, None]
    mask = tokens > 0
    # [heads, q, k] + [batch, 1, q, k] -> [batch, heads, q, k]
    bias = self.relpos_bias(relative, bidirectional=True)[None] + (
        layers.mask_to_bias(mask[:, None, :, None] & mask[:, None, None, :])
    )
    for layer in self.layers:
      x = layer(x, bias)
    return self.encoder_norm(x)


class Decoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = _relpos(cfg)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = _norm(cfg)
    if cfg.fused_projections:
      # Every layer's cross-attention key / value kernel in one:
      # [embed, heads * layers * 2 * head_dim] (per head, per layer, k | v).
      n = cfg.num_decoder_layers
      self.cross_kv = layers.DenseGeneral(
          (cfg.num_heads, n, 2, cfg.head_dim), dtype=cfg.compute_dtype,
          weight_dtype=cfg.dtype, kernel_axes=('embed', 'joined_kv'),
          kernel_init=layers.interleaved_init(
              *[layers.default_kernel_init] * (2 * n), groups=cfg.num_heads))
    if not cfg.logits_via_embedding:
      self.logits_dense = layers.DenseGeneral(
          cfg.vocab_size, dtype=jnp.float32, kernel_axes=('embed', 'vocab'),
          float32_output=True)

  def output_logits(self, y: Array, return_hidden: bool = False):
    """The final norm and the logits layer (`[batch, k, embed]` -> float32
    `[batch, k, vocab]`; with the normalized states if `return_hidden`)."""
    # [batch, k, embed] -> [batch, k, vocab], float32
    y = self.decoder_norm(y)
    if self.config.logits_via_embedding:
      logits = self.shared_embedding.attend(y) / jnp.sqrt(y.shape[-1])
    else:
      logits = self.logits_dense(y)
    return (logits, y) if return_hidden else logits

  def project_cross_kv(self, encoded: Array):
    """Every layer's cross-attention keys and values of `encoded`.

    `[batch, input_length, embed]` -> `(keys, values)`, one
    `[batch, input_length, heads, head_dim]` per layer each: in the fused
    layout one matmul for all layers (a compiler merging the layers' matmuls
    itself would join their kernels on every call, e.g. in a streaming
    loop's refill).
    """
    if not self.config.fused_projections:
      kv = [layer.cross_kv(encoded) for layer in self.layers]
      return tuple(k for k, _ in kv), tuple(v for _, v in kv)
    # [batch, len, embed] -> [batch, len, heads, layers, 2, head_dim]
    kv = self.cross_kv(encoded)
    n = len(self.layers)
    return (tuple(kv[:, :, :, i, 0] for i in range(n)),
            tuple(kv[:, :, :, i, 1] for i in range(n)))

  def __call__(self, encoded, encoder_mask, decoder_input_tokens,
               decoder_mask=None, return_hidden=False):
    """Teacher-forced logits `[batch, length, vocab]` (no cache).

    With `return_hidden`, `(logits, hidden)`: hidden `[batch, length,
    embed]` is the normalized final state the logits are computed from.
    """
    length = decoder_input_tokens.shape[-1]
    relative = np.arange(length)[None, :] - np.arange(length)[:, None]
    mask = relative <= 0
    if decoder_mask is not None:
      mask = mask & decoder_mask[:, None, :, None] & decoder_mask[:, None,
                                                                  None, :]
    self_bias = self.relpos_bias(relative, bidirectional=False)[None]
    self_bias = self_bias + layers.mask_to_bias(mask)
    cross_bias = layers.mask_to_bias(encoder_mask[:, None, None, :])
    y = self.shared_embedding(decoder_input_tokens).astype(
        self.config.compute_dtype)
    keys, values = self.project_cross_kv(encoded)
    for layer, kv in zip(self.layers, zip(keys, values)):
      y, _ = layer(y, self_bias, kv, cross_bias)
    return self.output_logits(y, return_hidden)

  def extend(self, tokens: Array, cache: DecoderCache, lookahead=None,
             lookahead_start=None, return_hidden: bool = False,
             tree: Any = None, rows: Optional[int] = None):
    """Appends `tokens` `[batch, k]` at each row's position; returns logits.

    On a CUDA GPU a call on k > 1 tokens runs its layers on k rounded up to
    a multiple of `CUBLAS_ROWS` rows (`jax.lax.platform_dependent`; other
    platforms run k): the padded rows stand at the slots after the call's
    (a tree's: see `TreeMask.bias_inputs`), write no key / value and are
    dropped, so the outputs are those of the k tokens alone.

    Args:
      tokens: `[batch, k]` token ids.
      cache: the cache; row b writes at slots position[b], ...
      lookahead: None, or PaSS look-ahead input embeddings `[L, embed]` or
        `[batch, L, embed]` (L <= k): block positions lookahead_start[b] ..
        + L - 1 take them in place of their tokens' embeddings (those token
        ids are ignored). Slot j stands for position (its row's last real
        token before it) + j + 1 by its place in the block; the causal mask
        keeps earlier block positions from seeing it. Callers drop the
        slots afterwards with `cache.rewind` (specdec_jax/drafters/lookahead).
      lookahead_start: `[batch]` int32 block index of the first slot
        (default k - L: the last L positions of the block).
      return_hidden: also return the normalized final state the logits are
        computed from (what self-drafting heads read,
        specdec_jax/drafters/heads).
      tree: None (a chain: each token sees every earlier slot) or a
        `TreeMask` holding slots position .. position + k - 1: each token
        then sees the committed slots, its tree ancestors and itself, at
        its depth's position (specdec_jax/drafters/tree).
      rows: the rows the layers run on, >= k, on every platform (None: as
        said above).

    A cache with a pending move (`DecoderCache.move_slots(later=True)`)
    has it made in this call's writes of keys / values, before its
    tokens' are attended to.

    Returns:
      `(logits [batch, k, vocab], cache)` with position advanced by k;
      with `return_hidden`, `((logits, hidden [batch, k, embed]), cache)`.
    """
    k = tokens.shape[-1]
    if rows is None:
      call = functools.partial(self.extend, tokens, cache, lookahead,
                               lookahead_start, return_hidden, tree)
      if padded_rows(k) == k:
        return call(k)
      return jax.lax.platform_dependent(
          cuda=lambda: call(padded_rows(k)), default=lambda: call(k))
    if rows < k:
      raise ValueError(f'rows={rows}: fewer than the {k} tokens of the call')
    # [batch, rows] query slots; [max_length] key slots.
    q_pos = cache.position[:, None] + jnp.arange(rows, dtype=jnp.int32)
    if tree is None:
      k_pos = jnp.arange(cache.max_length, dtype=jnp.int32)
      relative = k_pos[None, None, :] - q_pos[:, :, None]  # [b, rows, len]
      mask = relative <= 0
    else:
      relative, mask = tree.bias_inputs(q_pos, cache.max_length)
    # [batch, heads, rows, max_len]: block-causal mask + relative position
    # bias.
    self_bias = self.relpos_bias(relative, bidirectional=False)
    self_bias = self_bias + layers.mask_to_bias(mask)[:, None]
    # Made once, in the dtype the logits add it in (the same values): left
    # to itself XLA recomputes a tree's bias in every layer, in a kernel of
    # its own (the gathers keep it out of the softmax's).
    self_bias = jax.lax.optimization_barrier(
        self_bias.astype(self._logits_dtype(cache)))
    cross_bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])
    y = self.shared_embedding(tokens).astype(self.config.compute_dtype)
    if lookahead is not None:
      y = _with_lookahead(y, lookahead, lookahead_start)
    # [batch, k, embed] -> [batch, rows, embed]
    y = jnp.pad(y, ((0, 0), (0, rows - k), (0, 0)))
    pending, moved = cache.pending, None
    if pending is not None:  # the slots a last move left to this call
      moved = (pending.source, jnp.clip(
          cache.position - pending.start, 0, pending.source.shape[1]))
      pending = pending.replace(start=cache.position + k)  # nothing left
    new_k, new_v = [], []
    for i, layer in enumerate(self.layers):
      y, (key, value) = layer(
          y, self_bias, (cache.cross_key[i], cache.cross_value[i]),
          cross_bias, (cache.self_key[i], cache.self_value[i]),
          cache.position, k, moved,
      )
      new_k.append(key)
      new_v.append(value)
    cache = cache.replace(
        self_key=tuple(new_k), self_value=tuple(new_v),
        position=cache.position + k, pending=pending,
    )
    out = self.output_logits(y, return_hidden)
    return jax.tree.map(lambda x: x[:, :k], out), cache

  def _logits_dtype(self, cache: DecoderCache) -> Any:
    """The dtype of the self-attention's logits (`layers.
    dot_product_attention`: float32, or the query's and cached key's)."""
    cfg = self.config
    if cfg.float32_attention_logits:
      return jnp.float32
    return jnp.result_type(cfg.compute_dtype, cache.self_key[0].dtype)


def _with_lookahead(y: Array, lookahead, start) -> Array:
  """y `[batch, k, embed]` with L rows from `start[b]` replaced by lookahead."""
  batch, k, _ = y.shape
  la = jnp.asarray(lookahead).astype(y.dtype)
  if la.ndim == 2:
    la = jnp.broadcast_to(la[None], (batch,) + la.shape)
  n = la.shape[1]
  if n > k:
    raise ValueError(f'{n} look-ahead embeddings do not fit a block of {k}.')
  if start is None:
    start = jnp.full((batch,), k - n, jnp.int32)
  idx = jnp.arange(k)[None, :] - jnp.asarray(start, jnp.int32)[:, None]
  slot = jnp.take_along_axis(la, jnp.clip(idx, 0, n - 1)[..., None], axis=1)
  return jnp.where(((idx >= 0) & (idx < n))[..., None], slot, y)


class Transformer(nn.Module):
  """T5 encoder-decoder (T5X's `Transformer`, parameter for parameter)."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(
        num_embeddings=cfg.vocab_size, features=cfg.emb_dim,
        dtype=cfg.compute_dtype, weight_dtype=cfg.dtype,
    )
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def encode(self, encoder_input_tokens: Array) -> Array:
    """`[batch, input_length]` int -> `[batch, input_length, embed]`."""
    return self.encoder(encoder_input_tokens)

  def __call__(self, encoder_input_tokens, decoder_input_tokens,
               decoder_target_tokens=None, return_hidden=False):
    """Teacher-forced logits `[batch, target_length, vocab]` (float32).

    With `return_hidden`, also the decoder's normalized final state
    `[batch, target_length, embed]` (see `Decoder.__call__`).
    """
    encoded = self.encode(encoder_input_tokens)
    decoder_mask = None
    if decoder_target_tokens is not None:
      decoder_mask = decoder_target_tokens > 0
    return self.decoder(
        encoded, encoder_input_tokens > 0, decoder_input_tokens, decoder_mask,
        return_hidden,
    )

  def init_cache(self, encoder_input_tokens: Array,
                 max_length: int) -> DecoderCache:
    """Encodes the inputs once and returns an empty decoder cache."""
    cfg = self.config
    encoded = self.encode(encoder_input_tokens)
    cross_key, cross_value = self.decoder.project_cross_kv(encoded)
    batch = encoder_input_tokens.shape[0]
    empty = jnp.zeros(
        (batch, max_length, cfg.num_heads, cfg.head_dim), cfg.compute_dtype
    )
    n = cfg.num_decoder_layers
    return DecoderCache(
        self_key=(empty,) * n,
        self_value=(empty,) * n,
        cross_key=cross_key,
        cross_value=cross_value,
        encoder_mask=encoder_input_tokens > 0,
        position=jnp.zeros((batch,), jnp.int32),
    )

  def extend(self, tokens: Array, cache: DecoderCache, lookahead=None,
             lookahead_start=None, return_hidden: bool = False,
             tree: Any = None, rows: Optional[int] = None):
    return self.decoder.extend(tokens, cache, lookahead, lookahead_start,
                               return_hidden, tree, rows)


def check_float_dtype(name: str, value) -> None:
  """Raises InputError naming `name` unless `value` is a float dtype."""
  try:
    floating = jnp.issubdtype(jnp.dtype(value), jnp.floating)
  except TypeError:
    floating = False
  if not floating:
    raise checks.InputError(
        f"{name} must be a float dtype ('float32', 'bfloat16', "
        f"'float16'), got {value!r}.")


def check_config(cfg: T5Config, what: str = 'T5Config') -> None:
  """Raises InputError naming the first field of `cfg` (`what`, e.g.
  'target_config') that no T5 can have: a size below 1, a dtype that is
  not a float type, an unknown MLP activation, attention kernel or dense
  kernel, a dropout rate outside [0, 1), a flag that is not a bool.
  (`T5Model` checks its config: a bad one fails when it is given,
  not deep inside a trace.)"""
  checks.check_type(what, cfg, T5Config, 'a network.T5Config')
  for name in ('vocab_size', 'emb_dim', 'num_heads', 'head_dim', 'mlp_dim',
               'num_encoder_layers', 'num_decoder_layers'):
    checks.check_int(f'{what}.{name}', getattr(cfg, name))
  for name in ('dtype', 'activation_dtype'):
    value = getattr(cfg, name)
    if value is not None or name != 'activation_dtype':
      check_float_dtype(f'{what}.{name}', value)
  acts = cfg.mlp_activations
  if isinstance(acts, str) or not acts:
    raise checks.InputError(f'{what}.mlp_activations must be a non-empty '
                            f"sequence of names, e.g. ('gelu', 'linear'), "
                            f'got {acts!r}.')
  for act in acts:
    try:
      layers.activation(act)
    except (ValueError, TypeError):
      raise checks.InputError(
          f"{what}.mlp_activations: unknown activation {act!r} ('linear' "
          'or a function of flax.linen, e.g. relu, gelu).') from None
  for name, known in (('attention_kernel', layers.ATTENTION_KERNELS),
                      ('dense_kernel', DENSE_KERNELS)):
    if getattr(cfg, name) not in known:
      raise checks.InputError(f'{what}.{name} must be one of {known}, '
                              f'got {getattr(cfg, name)!r}.')
  rate = cfg.dropout_rate  # NaN fails the comparison too
  if not checks.is_number(rate) or not 0 <= rate < 1:
    raise checks.InputError(f'{what}.dropout_rate must be a number in '
                            f'[0, 1), got {rate!r}.')
  for name in ('logits_via_embedding', 'float32_attention_logits',
               'fused_projections'):
    checks.check_type(f'{what}.{name}', getattr(cfg, name), (bool, np.bool_),
                      'True or False')


def check_token_ids(name: str, tokens, vocab_size: int) -> tuple:
  """Raises unless `tokens` are `[batch, length]` integer ids < vocab_size.

  The one rule of token ids, the model's methods' and the decoders'.
  Shape and dtype are read from arrays and `jax.ShapeDtypeStruct`s alike;
  the values only on concrete arrays (with numpy, on the host; a jax
  array is copied there once): a tracer (a method or a decoder called
  under an outer jit) or a `jax.ShapeDtypeStruct` (the `lower_*`
  functions) has none, and an id past the vocabulary then reads NaN from
  the embedding: its row decodes nothing but 0s. Check ids before the
  outer jit.

  Args:
    name: the argument's name, for the messages.
    tokens: `[batch, length]` int token ids (or their abstract value).
    vocab_size: ids must be in [0, vocab_size).

  Returns:
    The shape `(batch, length)`.

  Raises:
    checks.InputError: not 2-D with batch, length >= 1, or an id out of
      range.
    TypeError: not an integer dtype.
  """
  try:
    shape = tuple(np.shape(tokens))
  except ValueError:  # numpy's "inhomogeneous shape": lists of lists
    raise checks.InputError(
        f'{name} must be [batch, length]; got rows of different lengths '
        '(pad them with 0: data.pad_rows).') from None
  if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
    raise checks.InputError(
        f'{name} must be [batch, length] with batch, length >= 1; got shape '
        f'{shape}.')
  dtype = getattr(tokens, 'dtype', None)
  if dtype is None:
    dtype = np.asarray(tokens).dtype
  if not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f'{name} must be integer token ids, got dtype {dtype}.')
  abstract = isinstance(tokens, (jax.ShapeDtypeStruct, jax.core.Tracer))
  if abstract or not getattr(tokens, 'is_fully_addressable', True):
    return shape
  values = np.asarray(tokens)
  low, high = values.min(), values.max()
  if low < 0 or high >= vocab_size:
    raise checks.InputError(
        f'{name} must be token ids in [0, vocab_size={vocab_size}); got '
        f'ids from {low} to {high}.')
  return shape


@functools.lru_cache(maxsize=None)
def _raw_key_shape(impl: str) -> tuple:
  """The shape of a raw key (`jax.random.PRNGKey`) of PRNG `impl`."""
  return jax.eval_shape(lambda: jax.random.key_data(
      jax.random.key(0, impl=impl))).shape


def check_key(name: str, rng) -> None:
  """Raises InputError unless `rng` is one PRNG key: a typed key
  `jax.random.key(seed)` (shape ()) or a raw one `jax.random.PRNGKey(seed)`
  of jax's PRNG implementation (uint32 [2], or [4] under the rbg
  implementations); an array, a tracer or a `jax.ShapeDtypeStruct` of one.
  The one rule of a key, the model's initializer's and the decoders'."""
  array = isinstance(rng, (jax.Array, jax.ShapeDtypeStruct, np.ndarray))
  if array and (
      (jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) and rng.shape == ())
      or (rng.dtype == np.uint32 and rng.shape == _raw_key_shape(
          jax.config.jax_default_prng_impl))):
    return
  said = (f'{type(rng).__name__} of shape {rng.shape} and dtype '
          f'{rng.dtype}' if array else repr(rng)[:80])
  raise checks.InputError(
      f'{name} must be one PRNG key, jax.random.key(seed) (or a raw '
      f'jax.random.PRNGKey(seed)), got {said}.')


def check_rows(name: str, rows: int, other: str, other_rows: int) -> None:
  """Raises InputError unless `name` has the rows of `other`."""
  if rows != other_rows:
    raise checks.InputError(
        f'{name} has {rows} rows, {other} {other_rows}: the rows must be '
        'the same examples.')


@dataclasses.dataclass(frozen=True)
class T5Model:
  """The callables decoding needs, for a T5 `Transformer` of `config`.

  Hashable and compared by config, so jitted decoders are compiled once per
  configuration and shape and reused across instances and parameter values.
  """

  config: T5Config

  def __post_init__(self):
    cfg = self.config
    checks.check_type('config', cfg, T5Config, 'a network.T5Config (e.g. '
                      'T5Model(T5Config(vocab_size=32128)))')
    check_config(cfg)
    if not isinstance(cfg.mlp_activations, tuple):
      object.__setattr__(
          self, 'config',
          cfg.replace(mlp_activations=tuple(cfg.mlp_activations)),
      )

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  def module_for(self, params) -> Transformer:
    """The network that reads `params`: T5X's tree or the fused decoding
    layout (`is_fused`), whichever `config.fused_projections` says."""
    fused = is_fused(params)
    if fused == self.config.fused_projections:
      return self.module
    return Transformer(self.config.replace(fused_projections=fused))

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def init_params(self, rng: Array, input_length: int = 8,
                  target_length: int = 8):
    """Random parameters (T5X's initializers): the 'params' tree (their
    logical axes: `param_axes`).

    Raises:
      checks.InputError: rng not one PRNG key (`check_key`), a length
        that is not an int >= 1.
    """
    check_key('rng', rng)
    checks.check_ints(input_length=input_length, target_length=target_length)
    variables = self.module.init(
        rng,
        jnp.ones((1, input_length), jnp.int32),
        jnp.ones((1, target_length), jnp.int32),
    )
    return variables['params']

  def param_shapes(self):
    """The parameters as `jax.ShapeDtypeStruct`s (no weights): the tree
    `init_params` returns, traced once per configuration (a fresh copy of
    the containers each call)."""
    return jax.tree.map(lambda x: x, _abstract_variables(self)['params'])

  def param_axes(self):
    """T5X's `params_axes` collection (logical axis names per parameter)."""
    return jax.tree.map(lambda x: x,
                        _abstract_variables(self)['params_axes'])

  def check_params(self, params, source: str = 'the tree') -> None:
    """Raises InputError unless `params` is this model's tree, shapes and
    all (`check_params`, its message starting with `source`): T5X's
    layout or the fused decoding one (`is_fused`: the model reads either).
    Leaves may be arrays or `jax.ShapeDtypeStruct`s; nothing is
    compiled."""
    leaves, treedef = jax.tree.flatten(params)
    if any(_fits(leaves, treedef, self.config.replace(fused_projections=f))
           for f in (False, True)):
      return  # each decode call's: 1.4 ms at XXL's 558 leaves, not 6.5
    check_params(params,
                 self.config.replace(fused_projections=is_fused(params)),
                 source=source)

  # The methods check their arguments' shapes and dtypes (Python, at trace
  # time: nothing is added to a program) and the token ids' values where
  # they are concrete (`check_token_ids`). The params are checked where a
  # decode starts (`init_cache`, once per loop's trace) and where a call is
  # no loop's (`encode`, `logits`); not in `extend`, which a loop traces
  # many times with the params `init_cache` took.

  def init_cache(self, params, encoder_input_tokens, max_length: int):
    """The encoded inputs' cross-attention keys / values and `max_length`
    empty decoder slots (`Transformer.init_cache`).

    Raises:
      checks.InputError: params not this model's (`check_params`),
        max_length not an int >= 1, token ids that are not
        `[batch, length]` ids of the vocabulary (TypeError: not ints).
    """
    self.check_params(params, source='params')
    checks.check_int('max_length', max_length)
    check_token_ids('encoder_input_tokens', encoder_input_tokens,
                    self.vocab_size)
    return self.module_for(params).apply(
        {'params': params}, encoder_input_tokens, max_length,
        method=Transformer.init_cache,
    )

  def encode(self, params, encoder_input_tokens):
    """The encoder's output `[batch, length, emb_dim]`."""
    self.check_params(params, source='params')
    check_token_ids('encoder_input_tokens', encoder_input_tokens,
                    self.vocab_size)
    return self.module_for(params).apply(
        {'params': params}, encoder_input_tokens, method=Transformer.encode)

  def extend(self, params, tokens, cache: DecoderCache, lookahead=None,
             lookahead_start=None, return_hidden: bool = False,
             tree: Any = None, rows: Optional[int] = None):
    """`Decoder.extend`; `lookahead`: PaSS slots (see there), else None;
    `return_hidden`: `((logits, hidden), cache)`; `tree`: a `TreeMask`;
    `rows`: the rows its layers run on (None: padded on a GPU only).

    Raises:
      checks.InputError: tokens not `[batch, k]` ids of the vocabulary
        (TypeError: not ints), a cache that is not `init_cache`'s, of
        another batch or of fewer than k slots.
    """
    batch, k = check_token_ids('tokens', tokens, self.vocab_size)
    checks.check_type('cache', cache, DecoderCache,
                      "a network.DecoderCache (init_cache's)")
    check_rows('tokens', batch, 'the cache', cache.position.shape[0])
    if k > cache.max_length:
      raise checks.InputError(
          f'tokens has {k} tokens per row, more than the cache holds '
          f"(max_length={cache.max_length}, init_cache's).")
    return self.module_for(params).apply(
        {'params': params}, tokens, cache, lookahead, lookahead_start,
        return_hidden, tree, rows, method=Transformer.extend
    )

  def check_teacher_forced(self, params, encoder_input_tokens,
                           decoder_input_tokens,
                           decoder_target_tokens=None) -> None:
    """Raises InputError unless `logits`' arguments fit this model and
    each other: the params (`check_params`), `[batch, length]` ids of the
    vocabulary (TypeError: not ints), one batch, targets of the decoder
    inputs' shape."""
    self.check_params(params, source='params')
    vocab = self.vocab_size
    batch = check_token_ids('encoder_input_tokens', encoder_input_tokens,
                            vocab)[0]
    shape = check_token_ids('decoder_input_tokens', decoder_input_tokens,
                            vocab)
    check_rows('decoder_input_tokens', shape[0], 'encoder_input_tokens',
               batch)
    if decoder_target_tokens is not None:
      targets = check_token_ids('decoder_target_tokens',
                                decoder_target_tokens, vocab)
      if targets != shape:
        raise checks.InputError(
            f'decoder_target_tokens must have the shape of '
            f'decoder_input_tokens {shape} (one target per position); got '
            f'{targets}.')

  def logits(self, params, encoder_input_tokens, decoder_input_tokens,
             decoder_target_tokens=None):
    """Teacher-forced logits, the reference the cached path must match
    (arguments checked: `check_teacher_forced`)."""
    self.check_teacher_forced(params, encoder_input_tokens,
                              decoder_input_tokens, decoder_target_tokens)
    return self.module_for(params).apply(
        {'params': params}, encoder_input_tokens, decoder_input_tokens,
        decoder_target_tokens,
    )

  def logits_and_hidden(self, params, encoder_input_tokens,
                        decoder_input_tokens):
    """Teacher-forced `(logits [b, n, vocab], hidden [b, n, embed])`.

    hidden is the normalized final decoder state: logits = hidden @ W with W
    the logits kernel (or the embedding / sqrt(embed) when tied).
    """
    self.check_teacher_forced(params, encoder_input_tokens,
                              decoder_input_tokens)
    return self.module_for(params).apply(
        {'params': params}, encoder_input_tokens, decoder_input_tokens,
        None, True,
    )


# Fused projections: a decoding-time layout of T5X's tree (see T5Config).
FUSED_NAMES = ('qkv', 'cross_kv', 'wi_fused')
_QKV = ('query', 'key', 'value')


def _fusions(encoder_layers: int, decoder_layers: int, activations: int):
  """(module path, fused name, the T5X kernels' paths under the module in
  interleaved order, per_head: columns interleaved per head, else per MLP
  unit), per fused kernel of a model with these layers and activations."""
  wi = tuple((f'wi_{i}',) for i in range(activations))
  for stack, n, attention in (
      ('encoder', encoder_layers, 'attention'),
      ('decoder', decoder_layers, 'self_attention')):
    for i in range(n):
      layer = (stack, f'layers_{i}')
      yield layer + (attention,), 'qkv', tuple((k,) for k in _QKV), True
      if activations > 1:
        yield layer + ('mlp',), 'wi_fused', wi, False
  yield ('decoder',), 'cross_kv', tuple(
      (f'layers_{i}', 'encoder_decoder_attention', k)
      for i in range(decoder_layers) for k in ('key', 'value')), True


def _config_fusions(config: T5Config):
  return _fusions(config.num_encoder_layers, config.num_decoder_layers,
                  len(config.mlp_activations))


def is_fused(params) -> bool:
  """Whether a params tree holds a fused kernel (`FUSED_NAMES`) anywhere."""
  if not isinstance(params, Mapping):
    return False
  return any(k in FUSED_NAMES or is_fused(v) for k, v in params.items())


@functools.lru_cache(maxsize=None)
def expected_shapes(config: T5Config) -> Mapping[str, Tuple[int, ...]]:
  """{'decoder/layers_0/mlp/wo/kernel': shape, ...} of `config` (eval_shape),
  computed once per config (read-only: every check shares it; the params
  are checked on every decode call)."""
  shapes = T5Model(config).param_shapes()
  flat = traverse_util.flatten_dict(shapes, sep='/')
  return types.MappingProxyType({k: tuple(v.shape) for k, v in flat.items()})


def _leaves(tree) -> Dict[str, Any]:
  """{'a/b/c': leaf} of a params tree (arrays or ShapeDtypeStructs)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {'/'.join(str(getattr(key, 'key', key)) for key in path): leaf
          for path, leaf in leaves}


def _dtype(leaf):
  if isinstance(leaf, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)):
    return jnp.dtype(leaf.dtype)
  return np.asarray(leaf).dtype


def _described(shapes: Mapping[str, Tuple[int, ...]]) -> str:
  """What a T5 tree's shapes say of its architecture, in T5Config's
  names: 'vocab_size 32128, emb_dim 8, 2 + 2 layers, mlp_dim 16, heads x
  head_dim 12' (what the tree lacks is left out)."""
  said = []
  embedding = shapes.get('token_embedder/embedding')
  if embedding is not None and len(embedding) == 2:
    said.append(f'vocab_size {embedding[0]}, emb_dim {embedding[1]}')
  depth = [len({k.split('/')[1] for k in shapes
                if k.startswith(f'{side}/layers_')})
           for side in ('encoder', 'decoder')]
  said.append(f'{depth[0]} + {depth[1]} layers')
  for name, path, axis in (
      ('mlp_dim', 'encoder/layers_0/mlp/wo/kernel', 0),
      ('heads x head_dim', 'encoder/layers_0/attention/query/kernel', 1)):
    if len(shapes.get(path, ())) == 2:
      said.append(f'{name} {shapes[path][axis]}')
  return ', '.join(said)


@functools.lru_cache(maxsize=None)
def _expected_flat(config: T5Config):
  """(treedef, leaf shapes) of `config`'s params, once per config."""
  leaves, treedef = jax.tree.flatten(T5Model(config).param_shapes())
  return treedef, tuple(tuple(leaf.shape) for leaf in leaves)


def _fits(leaves, treedef, config: T5Config) -> bool:
  """Whether flattened params are `config`'s tree, shapes and floating
  dtypes (`check_params`' fast path: its message only where they are
  not)."""
  want_def, want_shapes = _expected_flat(config)
  return (treedef == want_def and
          all(np.shape(leaf) == shape
              for leaf, shape in zip(leaves, want_shapes)) and
          all(jnp.issubdtype(dtype, jnp.floating)
              for dtype in {_dtype(leaf) for leaf in leaves}))


def check_params(params, config: T5Config, source: str = 'checkpoint'
                 ) -> None:
  """Raises InputError unless `params` has exactly `config`'s tree and
  shapes (the rule every load and every decode call checks).

  Args:
    params: a T5X params tree (nested dicts of arrays or shape structs).
    config: the network the params are meant for.
    source: where the params come from (named in the message).

  Raises:
    checks.InputError: what each side's shapes say of its architecture
      (vocab_size, emb_dim, layers, mlp_dim, heads x head_dim), then the
      first 8 missing, unexpected or mis-shaped parameters, e.g.
      'decoder/layers_3/mlp/wi_0/kernel: (512, 1024) vs config (512, 2048)'.
    TypeError: a parameter that is not floating point (a network of int
      or bool weights computes nothing: every token would come out 0).
  """
  leaves = _leaves(params)
  got, want = {k: tuple(np.shape(v)) for k, v in leaves.items()}, (
      expected_shapes(config))
  problems = [f'{k}: missing (config {want[k]})'
              for k in sorted(set(want) - set(got))]
  problems += [f'{k}: {got[k]}, not in the config'
               for k in sorted(set(got) - set(want))]
  problems += [f'{k}: {got[k]} vs config {want[k]}'
               for k in sorted(set(got) & set(want)) if got[k] != want[k]]
  if problems:
    more = len(problems) - 8
    raise checks.InputError(
        f'{source}: {len(problems)} parameters differ from the T5Config; '
        f"its shapes say {_described(got)}, the config's "
        f'{_described(want)}:\n  ' + '\n  '.join(problems[:8])
        + (f'\n  ... and {more} more' if more > 0 else ''))
  for name, leaf in leaves.items():
    if not jnp.issubdtype(_dtype(leaf), jnp.floating):
      raise TypeError(
          f'{source}: parameters must be floating point (float32, '
          f'bfloat16, ...); {name} is {_dtype(leaf)}.')


def _regroup(params, fusions, num_heads: int, fuse: bool):
  """A copy of `params` with each group of `fusions` joined or split."""
  params = _copy_dicts(params)
  for path, fused, parts, per_head in fusions:
    module = params
    for key in path:
      module = module[key]
    have = parts[0] if fuse else (fused,)
    holder = module
    for key in have[:-1]:
      holder = holder.get(key, {})
    if have[-1] not in holder:
      state = 'already fused' if fuse else 'not fused'
      raise ValueError(f"{'/'.join(path + have[:-1])} has no {have[-1]!r} "
                       f'kernel (keys: {sorted(holder)}): is the tree '
                       f'{state}?')
    if fuse:
      kernels = [_parent(module, part).pop(part[-1])['kernel']
                 for part in parts]
      groups = num_heads if per_head else kernels[0].shape[1]
      module[fused] = {'kernel': layers.interleave(kernels, groups)}
    else:
      kernel = module.pop(fused)['kernel']
      groups = num_heads if per_head else kernel.shape[1] // len(parts)
      for part, k in zip(parts, layers.deinterleave(kernel, len(parts),
                                                    groups)):
        _parent(module, part)[part[-1]] = {'kernel': k}
  return params


def _parent(module, path):
  """The dict holding `path[-1]` under `module` (made where missing)."""
  for key in path[:-1]:
    module = module.setdefault(key, {})
  return module


def _copy_dicts(tree):
  """The nested mappings of `tree` copied into plain dicts (leaves shared)."""
  if hasattr(tree, 'items'):
    return {k: _copy_dicts(v) for k, v in tree.items()}
  return tree


def fuse_params(params, config: T5Config):
  """T5X's params tree -> the fused decoding layout of the same weights.

  T5X's 2-D kernels joined column-wise, interleaved per head (per MLP unit:
  `layers.interleave`, so a mesh that shards heads or MLP units keeps each
  device's columns together): per layer, `attention` / `self_attention`:
  query, key, value `[embed, H * D]` -> `qkv/kernel` `[embed, H * 3 * D]`;
  gated `mlp`: wi_0, wi_1 `[embed, mlp]` -> `wi_fused/kernel`
  `[embed, mlp * 2]` (a one-activation `wi` stays); and every decoder
  layer's `encoder_decoder_attention` key, value -> one
  `decoder/cross_kv/kernel` `[embed, H * L * 2 * D]` (the layers' queries
  stay). The parameter count is unchanged. Never save
  the result as a checkpoint: `unfuse_params` first.

  Args:
    params: an unfused tree of a model with `config`'s layers and
      activations (`fused_projections` itself is ignored).
    config: the model's config.

  Returns:
    A new tree (the input is not modified) for
    `config.replace(fused_projections=True)`.

  Raises:
    ValueError: a kernel to fuse is missing (e.g. the tree is fused already).
  """
  return _regroup(params, _config_fusions(config), config.num_heads,
                  fuse=True)


def unfuse_params(params, config: T5Config):
  """The inverse of `fuse_params`: T5X's tree, e.g. to save or widen it."""
  return _regroup(params, _config_fusions(config), config.num_heads,
                  fuse=False)


def is_params_tree(tree) -> bool:
  """Whether `tree` is a T5 params tree (T5X's or fused): a mapping with
  `token_embedder`, `encoder` and `decoder`."""
  return isinstance(tree, Mapping) and all(
      k in tree for k in ('token_embedder', 'encoder', 'decoder'))


def _layers(stack) -> int:
  return sum(1 for k in stack if k.startswith('layers_'))


def decoding_layout(tree):
  """`tree` with every T5 params tree in it in the fused decoding layout.

  The one place decoding lays out weights: `scaffold.run` applies it to a
  loop's arguments, inside the compiled program and before the loop, so
  the loop reads each fused kernel as it is and never joins weights itself
  (params already fused, e.g. at load with `for_decoding`, come back as
  they are). Anything else in `tree` (token ids, a drafter's tables, a
  head's params) is returned unchanged.

  Args:
    tree: any pytree (e.g. a loop's `(target_params, draft_params, ...)`).

  Returns:
    The same structure with each `is_params_tree` subtree fused; layers,
    heads and MLP activations are read from the tree itself.
  """
  def lay_out(params):
    if not is_params_tree(params) or is_fused(params):
      return params
    mlp = params['decoder']['layers_0']['mlp']
    activations = sum(1 for k in mlp if k.startswith('wi_'))
    heads = params['decoder']['relpos_bias']['rel_embedding'].shape[0]
    fusions = _fusions(_layers(params['encoder']), _layers(params['decoder']),
                       activations)
    return _regroup(params, fusions, heads, fuse=True)
  return jax.tree.map(lay_out, tree, is_leaf=is_params_tree)


def for_decoding(model: T5Model, params) -> Tuple[T5Model, Any]:
  """The fused model and params for decoding (same outputs, fewer matmuls).

  Args:
    model: a `T5Model`; if already fused, `(model, params)` come back as is.
    params: its parameters (T5X's tree, or fused if the model is).

  Returns:
    `(T5Model(config.replace(fused_projections=True)), fuse_params(...))`.
  """
  if model.config.fused_projections:
    return model, params
  config = model.config.replace(fused_projections=True)
  return T5Model(config), fuse_params(params, model.config)


@functools.lru_cache(maxsize=None)
def _abstract_variables(model: T5Model):
  """`model.module.init`'s variables as shapes, traced once per model (a
  model is hashable and compared by its config): tracing the whole
  network's init costs about half a second on a CPU. Its arguments are
  made inside eval_shape's trace: made outside, in a loop's trace (a check
  of the params there), they would be ops of the loop's program."""
  return jax.eval_shape(lambda: model.module.init(
      jax.random.key(0), jnp.ones((1, 8), jnp.int32),
      jnp.ones((1, 8), jnp.int32)))
