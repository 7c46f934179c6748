"""T5 building blocks with T5X's parameter names, shapes and logical axes.

Every parameter is created through `flax.linen.partitioning.param_with_axes`,
as in t5x/examples/t5/layers.py, so `init` returns the same `params` tree as
T5X and a `params_axes` collection with the same logical axis names
(embed, mlp, joined_kv, heads, vocab, relpos_buckets); `param_with_axes` below
reads an existing parameter without tracing its initializer.

Projections keep T5X's 2-D kernels ([embed, heads * head_dim] for
query/key/value, [heads * head_dim, embed] for the output) and reshape them at
call time.

Fused projections (`MultiHeadAttention(fused='qkv' | 'kv')`,
`MlpBlock(fused=True)`) are a decoding-time layout, never a checkpoint's:
one kernel holding T5X's kernels' columns interleaved per head (per MLP
unit), so one matmul does the work of two or three and a mesh that shards
heads (MLP units) gives each device whole heads (network.fuse_params
builds it).

Two dtypes per layer: `dtype`, the dtype of the activations and of the
arithmetic (as in T5X), and `weight_dtype`, the dtype every weight is rounded
to before it is used (None: straight to `dtype`, T5X's behaviour). bfloat16
weights with float32 activations are `weight_dtype=bfloat16, dtype=float32`:
the weights hold bfloat16 values (stored so, they are read at 2 bytes each)
and everything computed from them is float32.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable, Sequence, Tuple

from flax import errors as flax_errors
import flax.linen as nn
from flax.core import meta as flax_meta
from flax.linen import partitioning as nn_partitioning
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kernels

Array = jax.Array
DType = Any
Initializer = Callable[..., Array]

# T5X's masking value for attention logits.
ATTENTION_NEG_INF = -1e10

# `dot_product_attention`'s kernels: T5X's, and cuDNN's fused one.
ATTENTION_KERNELS = ('dot_product', 'cudnn')

default_kernel_init = nn.initializers.variance_scaling(
    1.0, 'fan_in', 'truncated_normal'
)


def _same_axes(sown, new):
  """The sow reduction of flax's `param_with_axes`: a parameter's axes sown
  again in one apply (`sown`: () before the first) must be the ones sown
  first."""
  if isinstance(sown, nn_partitioning.AxisMetadata) and sown != new:
    raise ValueError('If axis names are sown twice, expected them to match. '
                     f'Got {sown} and {new}.')
  return new


def param_with_axes(module: nn.Module, name: str, init_fn: Initializer,
                    shape: Tuple[int, ...], dtype: DType,
                    axes: Tuple[str, ...]) -> Array:
  """`flax.linen.partitioning.param_with_axes(name, init_fn, shape, dtype,
  axes=axes)` of `module`, without tracing `init_fn` when the parameter
  exists.

  When applied, flax checks an existing parameter's shape against
  `jax.eval_shape` of its initializer: a trace of the initializer per
  parameter per trace of the model, a third of the time it takes to trace
  a decode loop. The shape is known here, so it is checked directly (same
  error); initializing goes through flax as before.
  """
  if module.is_initializing() or not module.has_variable('params', name):
    return nn_partitioning.param_with_axes(name, init_fn, shape, dtype,
                                           axes=axes, module=module)
  value = flax_meta.unbox(module.get_variable('params', name))
  if np.shape(value) != tuple(shape):
    raise flax_errors.ScopeParamShapeError(name, module.scope.path_text,
                                           np.shape(value), tuple(shape))
  # The axes, as flax sows them (kept where the collection is mutable).
  module.sow('params_axes', f'{name}_axes', nn_partitioning.AxisMetadata(axes),
             reduce_fn=_same_axes)
  return nn_partitioning.with_sharding_constraint(
      value, jax.sharding.PartitionSpec(*axes))


def float32_dot(x: Array, kernel: Array, contract: int = 0) -> Array:
  """`x @ kernel` accumulated and returned in float32, the kernel unconverted.

  The product runs in the wider of the two dtypes: only the narrower operand
  is converted, so a bfloat16 kernel times bfloat16 activations is a
  bfloat16 matmul with float32 accumulation (the products of two bfloat16
  values are exact in float32: the same numbers as converting both first),
  and a decode loop never rewrites the kernel in float32 on every call.

  Args:
    x: `[..., n]`.
    kernel: 2-D, contracted on axis `contract` (of size n).
    contract: 0 (`[n, m]`, a dense kernel) or 1 (`[m, n]`, an embedding
      table used as the logits layer).

  A one-row product in a narrower dtype (a batch-1 step's logits) runs on
  two copies of the row: XLA's GPU compiler (cuBLAS GEMMs) makes a one-row
  bfloat16 x bfloat16 -> float32 product a float32 one, converting the
  whole kernel on every call; with two rows it stays bfloat16.

  Returns:
    `[..., m]` float32.
  """
  dtype = jnp.promote_types(x.dtype, kernel.dtype)
  lead = x.shape[:-1]
  rows = x.reshape(-1, x.shape[-1]).astype(dtype)
  one_row = rows.shape[0] == 1 and dtype != jnp.float32
  if one_row:
    rows = jnp.concatenate([rows, rows], axis=0)
  # [rows, n] x kernel -> [rows, m]
  out = jax.lax.dot_general(
      rows, kernel.astype(dtype), (((1,), (contract,)), ((), ())),
      preferred_element_type=jnp.float32)
  return out[:1].reshape(lead + out.shape[-1:]) if one_row else out.reshape(
      lead + out.shape[-1:])


def as_weight(param: Array, weight_dtype: DType | None, dtype: DType) -> Array:
  """A parameter rounded to `weight_dtype` (if given), then cast to `dtype`.

  Args:
    param: the stored parameter (any float dtype).
    weight_dtype: the dtype the weight's values are rounded to, or None.
    dtype: the dtype it is computed in (the activations').

  Returns:
    `param` as `dtype`; with `weight_dtype=None`, `jnp.asarray(param, dtype)`.
  """
  if weight_dtype is not None:
    param = jnp.asarray(param, weight_dtype)
  return jnp.asarray(param, dtype)


class DenseGeneral(nn.Module):
  """Bias-free projection with a 2-D kernel, as T5X's DenseGeneral.

  Attributes:
    features: output features; a tuple gives a multi-dimensional output.
    axis: input axes to contract.
    kernel_axes: logical axis names of the 2-D kernel.
    dtype: dtype of the inputs, the product and the output.
    weight_dtype: the kernel is rounded to it first (None: not rounded).
    float32_output: T5X's float32 logits layer (`dtype` float32) without
      converting the kernel: `float32_dot` of the inputs as they come and
      the kernel as stored (a 1-D `features` and the last axis only).
  """

  features: int | Tuple[int, ...]
  axis: int | Tuple[int, ...] = -1
  dtype: DType = jnp.float32
  weight_dtype: DType | None = None
  kernel_init: Initializer = default_kernel_init
  kernel_axes: Tuple[str, ...] = ()
  float32_output: bool = False

  @nn.compact
  def __call__(self, inputs: Array, gate: bool = False) -> Array:
    """`inputs` (or a deferred norm's rows, `kernels.Normed`: normalized
    here, on a CUDA GPU in one kernel with the product,
    `kernels.norm_dense`) times the kernel; `gate`: `kernels.gated` of
    the product (`features` `(n, 2)`, the MLP's gate)."""
    normed = inputs if isinstance(inputs, kernels.Normed) else None
    if normed is not None:
      if self.float32_output or _tuple(self.axis) != (-1,):
        inputs, normed = normed.value(), None
      else:
        inputs = normed.x
    features = _tuple(self.features)
    axis = tuple(a % inputs.ndim for a in _tuple(self.axis))
    if not self.float32_output:
      inputs = jnp.asarray(inputs, self.dtype)
    in_shape = tuple(inputs.shape[a] for a in axis)
    kernel = param_with_axes(
        self,
        'kernel',
        self.kernel_init,
        (int(np.prod(in_shape)), int(np.prod(features))),
        jnp.float32,
        axes=self.kernel_axes,
    )
    if self.float32_output:
      if self.weight_dtype is not None:
        kernel = jnp.asarray(kernel, self.weight_dtype)
      # [..., embed] x [embed, features] -> [..., features] float32
      return float32_dot(inputs, kernel)
    kernel = as_weight(kernel, self.weight_dtype, self.dtype)
    contract = tuple(range(len(axis)))

    def plain(x):
      out = jax.lax.dot_general(x, kernel.reshape(in_shape + features),
                                ((axis, contract), ((), ())))
      return kernels.gated(out) if gate else out
    if normed is None:
      return plain(inputs)
    if not kernels.fits(normed, kernel, gate):
      return plain(normed.value())
    shape = inputs.shape[:-1] + (features[:-1] if gate else features)
    return kernels.on_cuda(
        lambda: kernels.norm_dense(normed, kernel, gate).reshape(shape),
        lambda: plain(normed.value()))


def _tuple(x) -> Tuple[int, ...]:
  return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class Embed(nn.Module):
  """Token embedding table `[vocab, embed]` (T5X name `embedding`).

  Lookups use a gather: T5X's one-hot contraction exists for SPMD partitioning
  and gives the same numbers at vocab-times the cost on one device.
  """

  num_embeddings: int
  features: int
  dtype: DType = jnp.float32
  attend_dtype: DType = jnp.float32
  weight_dtype: DType | None = None
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

  def setup(self):
    self.embedding = param_with_axes(
        self,
        'embedding',
        self.embedding_init,
        (self.num_embeddings, self.features),
        jnp.float32,
        axes=('vocab', 'embed'),
    )

  def __call__(self, tokens: Array) -> Array:
    # [batch, length] -> [batch, length, embed]; rounding commutes with the
    # gather, so only the rows used are converted.
    rows = jnp.take(self.embedding, tokens, axis=0)
    return as_weight(rows, self.weight_dtype, self.dtype)

  def attend(self, query: Array) -> Array:
    # [batch, length, embed] x [vocab, embed] -> [batch, length, vocab]
    if jnp.dtype(self.attend_dtype) == jnp.float32:
      return float32_dot(query, self.embedding, contract=1)
    return jnp.dot(query, jnp.asarray(self.embedding, self.attend_dtype).T)


class LayerNorm(nn.Module):
  """T5 RMS norm (no mean subtraction, no bias), computed in float32
  (`kernels.rms_norm`). `defer`: the rows and the scale
  (`kernels.Normed`), for the projection that reads them to normalize."""

  epsilon: float = 1e-6
  dtype: DType = jnp.float32
  weight_dtype: DType | None = None

  @nn.compact
  def __call__(self, x: Array, defer: bool = False) -> Array:
    y = None if defer else kernels.rms_norm(x, self.epsilon, self.dtype)
    scale = as_weight(param_with_axes(
        self,
        'scale', nn.initializers.ones, (x.shape[-1],), jnp.float32,
        axes=('embed',),
    ), self.weight_dtype, self.dtype)
    return kernels.Normed(x, scale, self.epsilon, self.dtype) if defer else (
        y * scale)


class MlpBlock(nn.Module):
  """T5 MLP: `wi` (one activation) or `wi_0, wi_1, ...` (gated), then `wo`.

  With `fused` and several activations, `wi_0, wi_1, ...` are one kernel
  `wi_fused` `[embed, mlp * n]`: column `u * n + i` is `wi_i`'s column u
  (units interleaved, so a mesh sharding 'mlp' keeps each unit's gates on
  one device): one matmul.
  """

  intermediate_dim: int
  activations: Sequence[str] = ('relu',)
  dtype: DType = jnp.float32
  weight_dtype: DType | None = None
  fused: bool = False

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    dense = functools.partial(
        DenseGeneral, dtype=self.dtype, weight_dtype=self.weight_dtype,
        kernel_axes=('embed', 'mlp'),
    )
    n = len(self.activations)
    normed = isinstance(inputs, kernels.Normed)
    width = (inputs.x if normed else inputs).shape[-1]
    if self.fused and n > 1:
      # [batch, length, embed] -> [batch, length, mlp, n] -> n x [..., mlp];
      # a deferred norm's rows are gated as the product is written.
      gate = normed and tuple(self.activations) == kernels.GATE
      x = dense((self.intermediate_dim, n), name='wi_fused',
                kernel_init=interleaved_init(
                    *[default_kernel_init] * n))(inputs, gate=gate)
      xs = None if gate else [x[..., i] for i in range(n)]
    else:
      # [batch, length, embed] -> n x [batch, length, mlp]
      xs = [dense(self.intermediate_dim, name='wi' if n == 1 else f'wi_{i}')(
          inputs) for i in range(n)]
    if xs is not None:
      x = functools.reduce(
          operator.mul,
          [activation(act)(h) for act, h in zip(self.activations, xs)])
    # [batch, length, mlp] -> [batch, length, embed]
    return DenseGeneral(
        width, dtype=self.dtype, weight_dtype=self.weight_dtype,
        kernel_axes=('mlp', 'embed'), name='wo',
    )(x)


def activation(name: str) -> Callable[[Array], Array]:
  """An MLP activation by T5X's name: 'linear' (none) or a function of
  flax.linen ('relu', 'gelu', ...); a ValueError for any other name."""
  if name == 'linear':
    return lambda x: x
  fn = getattr(nn, name, None)
  if fn is None:
    raise ValueError(f'Unknown MLP activation {name!r}.')
  return fn


def relative_position_bucket(
    relative_position: Array,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Array:
  """T5's bucketing of `memory_position - query_position` (T5X's formula).

  Works on numpy or jax int arrays (the decoder computes it on traced
  positions).
  """
  xp = jnp if isinstance(relative_position, jax.Array) else np
  ret = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = xp.abs(n)
  else:
    n = xp.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  val_if_large = max_exact + (
      xp.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
      / np.log(max_distance / max_exact)
      * (num_buckets - max_exact)
  ).astype(np.int32)
  val_if_large = xp.minimum(val_if_large, num_buckets - 1)
  return ret + xp.where(is_small, n, val_if_large)


class RelativePositionBiases(nn.Module):
  """T5 relative position biases, one table `[heads, buckets]` per stack."""

  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  dtype: DType = jnp.float32
  weight_dtype: DType | None = None
  embedding_init: Initializer = nn.initializers.variance_scaling(
      1.0, 'fan_avg', 'uniform'
  )

  @nn.compact
  def __call__(self, relative_position: Array, bidirectional: bool) -> Array:
    """Biases for given relative positions.

    Args:
      relative_position: int `[..., q_len, k_len]`, memory minus query position.
      bidirectional: whether positive offsets get their own buckets.

    Returns:
      `[..., heads, q_len, k_len]` biases.
    """
    table = param_with_axes(
        self,
        'rel_embedding',
        self.embedding_init,
        (self.num_heads, self.num_buckets),
        jnp.float32,
        axes=('heads', 'relpos_buckets'),
    )
    bucket = relative_position_bucket(
        relative_position, bidirectional, self.num_buckets, self.max_distance
    )
    # [heads, buckets] gathered at [..., q, k] -> [heads, ..., q, k]
    values = jnp.take(as_weight(table, self.weight_dtype, self.dtype), bucket,
                      axis=1)
    return jnp.moveaxis(values, 0, -3)


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array,
    dtype: DType = jnp.float32,
    float32_logits: bool = False,
    kernel: str = 'dot_product',
) -> Array:
  """Unscaled dot-product attention (T5 folds 1/sqrt(d) into the query init).

  Args:
    query: `[batch, q_len, heads, head_dim]`.
    key: `[batch, k_len, heads, head_dim]`.
    value: `[batch, k_len, heads, head_dim]`.
    bias: broadcastable to `[batch, heads, q_len, k_len]`; masks are folded in.
    dtype: output dtype.
    float32_logits: compute the logits in float32 ('dot_product').
    kernel: one of `ATTENTION_KERNELS`: 'dot_product' (T5X's: logits,
      bias and softmax in the query's dtype unless `float32_logits`) or
      'cudnn' (`fused_attention`).

  Returns:
    `[batch, q_len, heads, head_dim]`.

  Raises:
    ValueError: an unknown kernel.
  """
  if kernel not in ATTENTION_KERNELS:
    raise ValueError(f'attention kernel must be one of {ATTENTION_KERNELS}, '
                     f'got {kernel!r}.')
  if kernel == 'cudnn':
    return fused_attention(query, key, value, bias).astype(dtype)
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  # [batch, q, heads, d] x [batch, k, heads, d] -> [batch, heads, q, k]
  logits = jnp.einsum('bqhd,bkhd->bhqk', query, key)
  # On a CUDA GPU the bias is added in the softmax's kernel, not as the
  # matmul's C operand: cuBLAS-Lt writes its output over C, so XLA would
  # copy a bias that several layers share once per layer (a kernel, and
  # the [heads, q, k] bias read and written again). The same values.
  logits = jax.lax.platform_dependent(
      logits, cuda=jax.lax.optimization_barrier, default=lambda x: x)
  logits = logits + bias.astype(logits.dtype)
  weights = jax.nn.softmax(logits).astype(dtype)
  # [batch, heads, q, k] x [batch, k, heads, d] -> [batch, q, heads, d]
  return jnp.einsum('bhqk,bkhd->bqhd', weights, value)


def fused_attention(query: Array, key: Array, value: Array,
                    bias: Array) -> Array:
  """`dot_product_attention` as one fused kernel on a CUDA GPU: cuDNN's
  (`jax.nn.dot_product_attention(..., implementation='cudnn')`), where
  XLA's is a matmul, a softmax and a matmul (three kernels, the scores
  written and read between them).

  Its math everywhere: float32 logits, the bias (in the query's dtype)
  added in float32, a float32 softmax, probabilities in the value's dtype.
  Off a CUDA GPU, for queries neither bfloat16 nor float16 (cuDNN's), or
  where this jax has no cuDNN, the same math in XLA (`implementation=
  'xla'`), so a CPU runs what the GPU's kernel computes. Not T5X's
  numerics (its softmax runs in the logits' dtype): a model decodes with
  one kernel, its baseline and speculative loops alike.

  Args: as `dot_product_attention`'s (the bias's batch and heads may be 1).
  """
  key, value = key.astype(query.dtype), value.astype(query.dtype)
  bias = jnp.broadcast_to(bias, bias.shape[:2] + (query.shape[1], key.shape[1]))
  bias = bias.astype(query.dtype)

  def attend(implementation):
    return lambda q, k, v, b: jax.nn.dot_product_attention(
        q, k, v, bias=b, scale=1.0, implementation=implementation)

  if query.dtype not in (jnp.bfloat16, jnp.float16) or not _has_cudnn():
    return attend('xla')(query, key, value, bias)
  return jax.lax.platform_dependent(query, key, value, bias,
                                    cuda=attend('cudnn'), default=attend('xla'))


@functools.cache
def _has_cudnn() -> bool:
  """Whether this jax can lower cuDNN's attention (its CUDA plugin found
  cuDNN): what jax's own test (`check_cudnn_version`) reads, which has no
  public name."""
  try:
    from jax._src.lib import cuda_versions  # pylint: disable=g-import-not-at-top
  except ImportError:  # another jax: XLA's attention, the same math
    return False
  return cuda_versions is not None


def mask_to_bias(mask: Array, dtype: DType = jnp.float32) -> Array:
  """Boolean mask (True = attend) -> additive bias (0 or T5X's -1e10)."""
  return jnp.where(mask, 0.0, ATTENTION_NEG_INF).astype(dtype)


def write_rows(buffer: Array, update: Array, start: Array) -> Array:
  """Writes `update[b]` into `buffer[b]` from index `start[b]` of axis 1.

  Each row at its own offset (a vmap'd `dynamic_update_slice`): the decoder
  cache's per-row positions, the speculative loop's committed tokens.

  Args:
    buffer: `[batch, n, ...]`.
    update: `[batch, k, ...]` (cast to buffer's dtype), k <= n.
    start: `[batch]` int32; callers keep start + k <= n (else, as
      `dynamic_update_slice`, the start is clamped so the update fits).

  Returns:
    The updated buffer (overwrites, never adds).
  """
  def write(row, new, s):
    # [n, ...] <- [k, ...] at (s, 0, ...)
    return jax.lax.dynamic_update_slice(row, new, (s,) + (0,) * (row.ndim - 1))
  update = update.astype(buffer.dtype)
  if buffer.shape[0] == 1:
    # One row: the update slice itself (a vmap makes it a scatter, which a
    # GPU build lowers with a bounds check and a select, a kernel more).
    return write(buffer[0], update[0], start[0])[None]
  return jax.vmap(write)(buffer, update, start)


def write_rows_moved(buffer: Array, update: Array, start: Array,
                     source: Array, moved: Array) -> Array:
  """`write_rows(buffer, update, start)` after moving slots: row b's slots
  `source[b, :moved[b]]` first go to `start[b] - moved[b]`, ... (the slots
  just before the update's), in the same write.

  One update slice of m + k rows from `start - moved` (m = source's
  width): a GPU runs it in the kernel that writes the update, where a
  move of its own would take a kernel per buffer. The window's last
  m - moved slots (after start + k) are written zeros: callers keep
  them stale (at or past the position) and leave m slots of room after
  start + k (else the write's start is clamped, as `write_rows`').

  Args:
    buffer: `[batch, n, ...]`.
    update: `[batch, k, ...]`.
    start: `[batch]` int32, where the update goes.
    source: `[batch, m]` int32 slots to move (read before any write).
    moved: `[batch]` int32 in 0..m, how many of them move.
  """
  m, k = source.shape[1], update.shape[1]
  trailing = (None,) * (buffer.ndim - 2)
  rows = jnp.take_along_axis(buffer, source[(...,) + trailing], axis=1)
  pad = ((0, 0), (0, k)) + ((0, 0),) * (buffer.ndim - 2)
  padded = jnp.pad(update.astype(buffer.dtype),
                   ((0, 0), (m, m)) + ((0, 0),) * (buffer.ndim - 2))
  shifted = jax.vmap(lambda u, s: jax.lax.dynamic_slice_in_dim(
      u, s, m + k, axis=0))(padded, m - moved)
  first = (jnp.arange(m + k) < moved[:, None])[(...,) + trailing]
  return write_rows(buffer, jnp.where(first, jnp.pad(rows, pad), shifted),
                    start - moved)


def interleave(kernels: Sequence[Array], groups: int) -> Array:
  """n 2-D kernels `[rows, groups * d]` -> one `[rows, groups * n * d]`.

  Column `(g * n + i) * d + j` of the result is column `g * d + j` of
  `kernels[i]`: per group (a head, an MLP unit) the n kernels' columns side
  by side, the fused projections' layout. Works on numpy and jax arrays.
  """
  xp = np if all(isinstance(k, np.ndarray) for k in kernels) else jnp
  rows, cols = kernels[0].shape
  # n x [rows, groups, 1, d] -> [rows, groups, n, d] -> [rows, groups * n * d]
  parts = [k.reshape(rows, groups, 1, cols // groups) for k in kernels]
  return xp.concatenate(parts, axis=2).reshape(rows, cols * len(kernels))


def deinterleave(kernel: Array, n: int, groups: int) -> Tuple[Array, ...]:
  """The inverse of `interleave`: n kernels `[rows, groups * d]`."""
  rows, cols = kernel.shape
  # [rows, groups * n * d] -> [rows, groups, n, d] -> n x [rows, groups * d]
  split = kernel.reshape(rows, groups, n, cols // (groups * n))
  return tuple(split[:, :, i].reshape(rows, cols // n) for i in range(n))


def interleaved_init(*inits: Initializer, groups: int = 0) -> Initializer:
  """Initializer of a fused 2-D kernel: `inits[i]` for the i-th kernel of
  `interleave` (groups 0: one column per group, an MLP's units)."""
  def init(key, shape, dtype=jnp.float32):
    rows, cols = shape
    keys = jax.random.split(key, len(inits))
    parts = [f(k, (rows, cols // len(inits)), dtype)
             for f, k in zip(inits, keys)]
    return interleave(parts, groups or cols // len(inits))
  return init


class MultiHeadAttention(nn.Module):
  """T5X's MultiHeadDotProductAttention parameters, functional in use.

  Projections and `attend_projected` are separate so that callers may compute
  key/value once (cross-attention) or write them into an explicit cache
  (decoder self-attention) between the two.

  Attributes:
    fused: None (T5X's `query`, `key`, `value` kernels), 'qkv' (self-
      attention: one `qkv` kernel `[embed, heads * 3 * head_dim]`, query,
      key and value's columns interleaved per head: `interleave`) or 'kv'
      (cross-attention in the fused layout: `query` and `out` only; its
      keys and values come projected, by the decoder's one kernel for all
      layers: network.Decoder.project_cross_kv).
  """

  num_heads: int
  head_dim: int
  out_features: int
  dtype: DType = jnp.float32
  float32_logits: bool = False
  weight_dtype: DType | None = None
  fused: str | None = None
  kernel: str = 'dot_product'

  def setup(self):
    if self.fused not in (None, 'qkv', 'kv'):
      raise ValueError(f"fused must be None, 'qkv' or 'kv', got "
                       f'{self.fused!r}.')
    proj = functools.partial(
        DenseGeneral,
        kernel_axes=('embed', 'joined_kv'),
        dtype=self.dtype,
        weight_dtype=self.weight_dtype,
    )
    heads = (self.num_heads, self.head_dim)
    depth_scaling = np.sqrt(self.head_dim).astype(np.float32)
    query_init = lambda *a: default_kernel_init(*a) / depth_scaling
    if self.fused == 'qkv':
      self.qkv = proj(features=(self.num_heads, 3, self.head_dim),
                      kernel_init=interleaved_init(
                          query_init, default_kernel_init,
                          default_kernel_init, groups=self.num_heads))
    else:
      self.query = proj(features=heads, kernel_init=query_init)
    if self.fused is None:
      self.key = proj(features=heads)
      self.value = proj(features=heads)
    self.out = DenseGeneral(
        features=self.out_features,
        axis=(-2, -1),
        kernel_axes=('joined_kv', 'embed'),
        dtype=self.dtype,
        weight_dtype=self.weight_dtype,
    )

  def project_kv(self, inputs_kv: Array) -> Tuple[Array, Array]:
    """Key and value of `inputs_kv` (unfused attention only)."""
    if self.fused is not None:
      raise ValueError(f'A fused {self.fused!r} attention projects no key '
                       'and value alone: qkv projects them with the query '
                       '(project_qkv), kv reads them projected '
                       '(network.Decoder.project_cross_kv).')
    # [batch, len, embed] -> 2 x [batch, len, heads, head_dim]
    return self.key(inputs_kv), self.value(inputs_kv)

  def project_qkv(self, inputs: Array) -> Tuple[Array, Array, Array]:
    """Query, key and value of the same `inputs` (self-attention)."""
    if self.fused == 'qkv':
      # [batch, len, embed] -> [batch, len, heads, 3, head_dim]
      qkv = self.qkv(inputs)
      return qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]
    # [batch, len, embed] -> 3 x [batch, len, heads, head_dim]
    return (self.query(inputs),) + self.project_kv(inputs)

  def attend_projected(self, query: Array, key: Array, value: Array,
                       bias: Array) -> Array:
    """Attention of a projected query `[batch, q, heads, head_dim]`."""
    x = dot_product_attention(
        query, key, value, bias, self.dtype, self.float32_logits,
        self.kernel)
    # [batch, q, heads, head_dim] -> [batch, q, embed]
    return self.out(x)

  def attend(self, inputs_q: Array, key: Array, value: Array,
             bias: Array) -> Array:
    """Attention of `inputs_q` `[batch, q, embed]` over projected key/value."""
    # [batch, q, embed] -> [batch, q, heads, head_dim]
    return self.attend_projected(self.query(inputs_q), key, value, bias)
