"""Function-preserving widening of a trained T5 into a bigger one.

A speculative decoding speed-up depends on the acceptance rate alpha (how well
the drafter predicts the target) and on the cost ratio c of drafter to target.
Here targets are trained on small offline tasks, so they are small. `widen`
turns a trained small target into one with the shapes, and therefore the cost,
of T5 1.1 base/large/XXL while computing the same function: alpha stays that of
the trained target while c becomes that of a big one.

Construction (old width E, new width E' >= E; gain g = sqrt(E' / E)):

- Residual stream. The old stream x becomes g * [x, 0]: the embedding and
  every residual-branch output projection (attention `out`, MLP `wo`) are
  multiplied by g and zero-padded, so the E' - E new dims stay exactly 0.
- RMS norms. With `m = mean_E(x^2)`, a norm sees
  `mean_E'((g x)^2) = g^2 (E / E') m = m`, i.e. the same mean square and the
  same `rsqrt(m + eps)`, so scaling every norm scale by 1 / g restores the old
  norm output exactly, epsilon included.
  (The alternative of leaving the stream at x and scaling the norm scales by
  sqrt(E / E') -- not sqrt(E' / E): the mean over the wider width is smaller by
  E / E', so rsqrt grows by sqrt(E' / E) and must be divided out -- gives
  `x * rsqrt(m + (E' / E) eps) * s` instead of `x * rsqrt(m + eps) * s`, a
  relative error of about `(E' / E - 1) eps / (2 m)` per norm: 3.5e-6 for
  512 -> 4096 at m = 1, but O(1) when m is near eps. The rescaled stream has
  no such error.)
- Tied logits. `logits = norm(y) . emb^T / sqrt(E)`: the table is now g * emb
  and the divisor sqrt(E') = g sqrt(E), so the two factors of g cancel and no
  further compensation is needed.
- Attention. Kernels are reshaped to `[embed, heads, head_dim]` (T5X's joined
  layout, index `head * head_dim + d`) before padding, so growing both heads
  and head_dim keeps each old (head, d) column in place. New heads and new
  head_dim dims of old heads get zero `out` rows; new head_dim dims of old
  heads also get zero `key` columns, so query . key is unchanged.
- MLP. New units get zero `wo` rows.
- Layers. Extra layers are appended after the old ones (encoder and decoder
  separately) with zero `out` and `wo` kernels, so each is the identity on the
  residual stream: `x + 0 + 0`.

Everything not pinned above is "dead": multiplied by an exact zero before it
reaches the residual stream (rows for the new embedding dims, whose inputs are
0; new heads' query/key/value and relative-position rows; query/value columns
of old heads' new head_dim dims; new MLP units' `wi` columns; new layers' norms
and input kernels; norm-scale entries of the new dims). Dead weights are
`noise` times unit-variance pseudo-random values, zero by default. Noise keeps
outputs exact (a finite value times 0 is 0) and makes the new weights
non-zero, so that nothing downstream (a sparsity-aware kernel, a compressor, a
reader) can mistake the widened model for a padded small one. XLA does not
skip zero weights, so timings are the same either way.

Exactness is up to float rounding: g and 1 / g are rounded to the parameter
dtype, and wider contractions may be summed in a different order (adding
exact zeros, but in different blocks). In float32 the logits agree to ~1e-5
(measured ~2e-6 on logits of magnitude ~5); with a bfloat16 `dtype`, to
bfloat16 rounding.

References:
  Chen, Goodfellow, Shlens. Net2Net: Accelerating Learning via Knowledge
  Transfer. arXiv:1511.05641 (function-preserving widening/deepening).
  Leviathan, Kalman, Matias. Fast Inference from Transformers via Speculative
  Decoding. arXiv:2211.17192 (the cost ratio c).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import models
from specdec_jax import network
from specdec_jax.network import T5Config

Array = jax.Array
Params = Mapping[str, Any]

# Dimensions that may grow (never shrink).
GROWABLE = ('emb_dim', 'num_heads', 'head_dim', 'mlp_dim',
            'num_encoder_layers', 'num_decoder_layers')
# Fields that change the function or the vocabulary: must be equal.
FIXED = ('vocab_size', 'mlp_activations', 'logits_via_embedding')

# T5X's t5x/examples/t5/t5_1_1/{base,large,xxl}.gin dimensions.
# '<size>_cost': the dimensions of a T5 size (specdec_jax.models, the twin of
# gin_configs/models/), e.g. 't5_1_1_xxl_cost'; `_SIZE_OF` its size.
_SIZE_OF = {f'{size}_cost': size for size in (
    't5_1_1_small', 't5_1_1_base', 't5_1_1_large', 't5_1_1_xl', 't5_1_1_xxl')}
PRESETS: Dict[str, Dict[str, int]] = {
    preset: {k: models.DIMS[size][k] for k in GROWABLE}
    for preset, size in _SIZE_OF.items()}

_ENCODER_NORMS = ('pre_attention_layer_norm', 'pre_mlp_layer_norm')
_DECODER_NORMS = ('pre_self_attention_layer_norm',
                  'pre_cross_attention_layer_norm', 'pre_mlp_layer_norm')


def check_growth(config: T5Config, new_config: T5Config) -> None:
  """Raises ValueError unless `new_config` only grows `config`'s dimensions.

  Args:
    config: the trained model's config.
    new_config: the widened model's config.

  Raises:
    InputError: a `FIXED` field differs, or a `GROWABLE` field shrinks.
  """
  for name in FIXED:
    old, new = getattr(config, name), getattr(new_config, name)
    if name == 'mlp_activations':
      old, new = tuple(old), tuple(new)
    if old != new:
      raise checks.InputError(
          f'widen cannot change {name}: {old!r} -> {new!r}.')
  for name in GROWABLE:
    old, new = getattr(config, name), getattr(new_config, name)
    if new < old:
      raise checks.InputError(f'widen cannot shrink {name}: {old} -> {new}.')


def preset_config(config: T5Config, size: str) -> T5Config:
  """`config` with the dimensions of a `PRESETS` entry (same vocab etc.)
  and the dtype T5X computes that size in (its gin file's
  `network.T5Config.dtype`: bfloat16 for T5 1.1): a model at a T5 size's
  cost runs as T5X runs that size. float32 activations on a GPU would
  cost more than the size does, and differently: matmuls in float32 on
  bfloat16 weights, and at batch 1 XLA may convert a weight to float32 in
  the loop, every call.

  Args:
    config: the trained model's config.
    size: a key of `PRESETS`, e.g. 't5_1_1_xxl_cost'.

  Returns:
    The widened model's config.
  """
  if size not in PRESETS:
    raise checks.InputError(
        f'Unknown size {size!r}; expected one of {list(PRESETS)}.')
  return config.replace(**PRESETS[size],
                        dtype=models.CONFIGS[_SIZE_OF[size]].dtype)


def _lowbias32(x: Array) -> Array:
  """Integer hash of uint32 values (C. Wellons' lowbias32)."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _hash_uniform(seed: Array, stream: int, shape: Tuple[int, ...]) -> Array:
  """Uniform values from a counter-based hash.

  Dead weights only need to be non-zero, not statistically strong; one
  `jax.random` call per parameter would cost ~20 s of XLA compilation on CPU
  (threefry inlined ~100 times), while this is a few fused integer ops
  computed in place.

  Args:
    seed: uint32 scalar.
    stream: distinct per array.
    shape: output shape (fewer than 2**32 elements).

  Returns:
    float32 `shape`, uniform on [-1, 1): exact multiples of 2**-23 (no
    rounding, so a program split over a mesh gives the same values).
  """
  key = _lowbias32(seed + jnp.uint32((stream * 0x9E3779B9) % 2**32))
  # [n] counters -> [n] hashes -> [n] uniform floats in [0, 1)
  bits = _lowbias32(jax.lax.iota(jnp.uint32, math.prod(shape)) ^ key)
  uniform = (bits >> 8).astype(jnp.float32) * (2.0 ** -24)
  return (2 * uniform - 1).reshape(shape)


class _Widener:
  """Per-parameter widening rules for one (config, new_config) pair."""

  def __init__(self, config: T5Config, new_config: T5Config,
               noise: Optional[Array], seed: Array, dtype):
    self.old, self.new, self.dtype = config, new_config, dtype
    self.noise, self.seed, self.count = noise, seed, 0
    if noise is not None:
      self.noise_scale = noise * jnp.float32(math.sqrt(3))
    # Residual-stream gain g = sqrt(E' / E); norm scales get 1 / g.
    self.gain = math.sqrt(new_config.emb_dim / config.emb_dim)

  def dead(self, shape: Tuple[int, ...], dtype) -> Array:
    """`noise * U(-sqrt(3), sqrt(3))` (unit variance) of `shape`, or zeros."""
    if self.noise is None:
      return jnp.zeros(shape, dtype)
    self.count += 1
    # One rounding (the scale is a scalar): the same wherever it runs.
    uniform = _hash_uniform(self.seed, self.count, shape)
    return (uniform * self.noise_scale).astype(dtype)

  @staticmethod
  def _expect(x: Array, shape: Tuple[int, ...], name: str) -> None:
    if tuple(x.shape) != tuple(shape):
      raise checks.InputError(
          f'{name}: expected shape {tuple(shape)} from config, got '
          f'{tuple(x.shape)}.')

  def embedding(self, emb: Array) -> Array:
    # [vocab, E] -> [vocab, E']: g * old, new residual dims exactly 0.
    o, n = self.old, self.new
    self._expect(emb, (o.vocab_size, o.emb_dim), 'token_embedder/embedding')
    return jnp.pad(emb * jnp.asarray(self.gain, emb.dtype),
                   ((0, 0), (0, n.emb_dim - o.emb_dim)))

  def scale(self, scale: Optional[Array], name: str) -> Array:
    # [E] -> [E']: old / g; entries for the (zero) new dims are dead.
    new = self.dead((self.new.emb_dim,), self.dtype)
    if scale is None:  # an appended layer: the whole norm is dead.
      return new
    self._expect(scale, (self.old.emb_dim,), name)
    return new.astype(scale.dtype).at[:self.old.emb_dim].set(
        scale * jnp.asarray(1 / self.gain, scale.dtype))

  def relpos(self, table: Array, name: str) -> Array:
    # [H, buckets] -> [H', buckets]: new heads' rows are dead.
    o, n = self.old, self.new
    self._expect(table, (o.num_heads, table.shape[1]), name)
    new = self.dead((n.num_heads, table.shape[1]), table.dtype)
    return new.at[:o.num_heads].set(table)

  def qkv(self, kernel: Optional[Array], which: str, name: str) -> Array:
    """Query/key/value kernel `[E, H * D]` -> `[E', H' * D']`."""
    o, n = self.old, self.new
    new = self.dead((n.emb_dim, n.num_heads, n.head_dim), self.dtype)
    if kernel is None:  # an appended layer: out is 0, so q/k/v are dead.
      return new.reshape(n.emb_dim, -1)
    self._expect(kernel, (o.emb_dim, o.num_heads * o.head_dim), name)
    new = new.astype(kernel.dtype)
    # [E, H * D] -> [E, H, D] (joined index = head * head_dim + d).
    old = kernel.reshape(o.emb_dim, o.num_heads, o.head_dim)
    new = new.at[:o.emb_dim, :o.num_heads, :o.head_dim].set(old)
    if which == 'key':
      # New head_dim dims of old heads: k_d = 0 so sum_d q_d k_d is unchanged
      # (the query side may then be anything).
      new = new.at[:, :o.num_heads, o.head_dim:].set(0)
    # [E', H', D'] -> [E', H' * D']
    return new.reshape(n.emb_dim, n.num_heads * n.head_dim)

  def out(self, kernel: Optional[Array], name: str) -> Array:
    """Attention output kernel `[H * D, E]` -> `[H' * D', E']`, g * old."""
    o, n = self.old, self.new
    shape = (n.num_heads * n.head_dim, n.emb_dim)
    if kernel is None:
      return jnp.zeros(shape, self.dtype)
    self._expect(kernel, (o.num_heads * o.head_dim, o.emb_dim), name)
    # [H * D, E] -> [H, D, E] -> zero-padded [H', D', E'] -> [H' * D', E']
    old = kernel.reshape(o.num_heads, o.head_dim, o.emb_dim)
    old = old * jnp.asarray(self.gain, kernel.dtype)
    return jnp.pad(old, ((0, n.num_heads - o.num_heads),
                         (0, n.head_dim - o.head_dim),
                         (0, n.emb_dim - o.emb_dim))).reshape(shape)

  def attention(self, p: Optional[Params], name: str) -> Dict[str, Any]:
    get = lambda k: None if p is None else p[k]['kernel']
    tree = {k: {'kernel': self.qkv(get(k), k, f'{name}/{k}/kernel')}
            for k in ('query', 'key', 'value')}
    tree['out'] = {'kernel': self.out(get('out'), f'{name}/out/kernel')}
    return tree

  def mlp(self, p: Optional[Params], name: str) -> Dict[str, Any]:
    o, n = self.old, self.new
    acts = tuple(n.mlp_activations)
    names = ['wi'] if len(acts) == 1 else [f'wi_{i}' for i in range(len(acts))]
    tree = {}
    for wi in names:
      # [E, M] -> [E', M']: new emb rows (input 0) and new units are dead.
      new = self.dead((n.emb_dim, n.mlp_dim), self.dtype)
      if p is not None:
        kernel = p[wi]['kernel']
        self._expect(kernel, (o.emb_dim, o.mlp_dim), f'{name}/{wi}/kernel')
        new = new.astype(kernel.dtype).at[:o.emb_dim, :o.mlp_dim].set(kernel)
      tree[wi] = {'kernel': new}
    # [M, E] -> [M', E']: g * old; new units' rows and new emb columns 0.
    if p is None:
      wo = jnp.zeros((n.mlp_dim, n.emb_dim), self.dtype)
    else:
      kernel = p['wo']['kernel']
      self._expect(kernel, (o.mlp_dim, o.emb_dim), f'{name}/wo/kernel')
      wo = jnp.pad(kernel * jnp.asarray(self.gain, kernel.dtype),
                   ((0, n.mlp_dim - o.mlp_dim), (0, n.emb_dim - o.emb_dim)))
    tree['wo'] = {'kernel': wo}
    return tree

  def logits_dense(self, kernel: Array) -> Array:
    # [E, vocab] -> [E', vocab]: new emb rows see 0 inputs, so are dead.
    o, n = self.old, self.new
    name = 'decoder/logits_dense/kernel'
    self._expect(kernel, (o.emb_dim, o.vocab_size), name)
    new = self.dead((n.emb_dim, n.vocab_size), kernel.dtype)
    return new.at[:o.emb_dim].set(kernel)

  def stack(self, p: Params, stack: str) -> Dict[str, Any]:
    """One encoder or decoder stack, extra layers appended at the end."""
    if stack == 'encoder':
      n_old, n_new = self.old.num_encoder_layers, self.new.num_encoder_layers
      norms, attns = _ENCODER_NORMS, ('attention',)
    else:
      n_old, n_new = self.old.num_decoder_layers, self.new.num_decoder_layers
      norms = _DECODER_NORMS
      attns = ('self_attention', 'encoder_decoder_attention')
    missing = [i for i in range(n_old) if f'layers_{i}' not in p]
    if missing or f'layers_{n_old}' in p:
      raise checks.InputError(
          f'{stack}: params do not have the {n_old} layers of the config.')
    name = f'{stack}/relpos_bias/rel_embedding'
    tree = {'relpos_bias': {
        'rel_embedding': self.relpos(p['relpos_bias']['rel_embedding'], name)}}
    for i in range(n_new):
      layer = p[f'layers_{i}'] if i < n_old else None
      prefix = f'{stack}/layers_{i}'
      new = {}
      for norm in norms:
        scale = None if layer is None else layer[norm]['scale']
        new[norm] = {'scale': self.scale(scale, f'{prefix}/{norm}/scale')}
      for attn in attns:
        new[attn] = self.attention(
            None if layer is None else layer[attn], f'{prefix}/{attn}')
      new['mlp'] = self.mlp(None if layer is None else layer['mlp'],
                            f'{prefix}/mlp')
      tree[f'layers_{i}'] = new
    norm = f'{stack}_norm'
    tree[norm] = {'scale': self.scale(p[norm]['scale'], f'{stack}/{norm}')}
    if stack == 'decoder' and not self.new.logits_via_embedding:
      tree['logits_dense'] = {
          'kernel': self.logits_dense(p['logits_dense']['kernel'])}
    return tree


def widen(params: Params, config: T5Config, new_config: T5Config, *,
          noise: float = 0.0, rng: Optional[Array] = None,
          shardings=None) -> Dict[str, Any]:
  """Widens/deepens T5 parameters without changing the function they compute.

  The result has exactly the tree and shapes of
  `T5Model(new_config).init_params`, and `T5Model(new_config).logits` on it
  equals `T5Model(config).logits` on `params` up to float rounding (~1e-5 in
  float32, no epsilon error; see the module docstring for the construction).
  Runs as one jitted program per pair of configs (on the default device: XXL
  float32 needs ~44 GB), and traces: `jax.eval_shape(lambda p: widen(p, ...),
  params)` checks full-size shapes at no cost.

  Args:
    params: T5X parameter tree of `config` (dict or FrozenDict).
    config: the trained model's config.
    new_config: the widened model's config; any of `GROWABLE` may be larger,
      `FIXED` fields must be equal. dtype, dropout_rate,
      float32_attention_logits, attention_kernel and dense_kernel are not
      parameters and may differ.
    noise: standard deviation of the (hash-based, uniform) pseudo-random
      values put in dead weights (those multiplied by an exact zero
      downstream); 0 leaves them zero.
    rng: PRNG key for the noise (default `jax.random.key(0)`).
    shardings: None (the default device), or a tree of `NamedSharding`s of
      the widened tree (one mesh): the program writes each device's slices
      straight into them (from `params` replicated), so that no device
      ever holds the whole widened model.

  Returns:
    The widened parameter tree (plain nested dicts).

  Raises:
    ValueError: a dimension shrinks, a fixed field differs, or `params` do not
      match `config`.

  References:
    Chen et al. Net2Net. arXiv:1511.05641.
  """
  checks.check_non_negative('noise', noise)  # inf: a model of NaNs
  args = statics(config, new_config, noise)
  if rng is None:
    rng = jax.random.key(0)
  if shardings is None:
    return _widen_jit(params, rng, jnp.float32(noise), *args)
  # Inputs from the host: a process's own arrays may not join a mesh that
  # spans processes.
  return into(shardings)(jax.device_get(params),
                         np.asarray(jax.random.key_data(rng)),
                         np.float32(noise), *args)


def statics(config: T5Config, new_config: T5Config, noise: float
            ) -> Tuple[T5Config, T5Config, bool]:
  """The widening program's static arguments (configs hashable:
  activations as a tuple), growth checked: one compiled program per pair
  of configs instead of hundreds of eagerly dispatched ops."""
  check_growth(config, new_config)
  return (config.replace(mlp_activations=tuple(config.mlp_activations)),
          new_config.replace(mlp_activations=tuple(
              new_config.mlp_activations)), bool(noise > 0))


def into(shardings):
  """`widen`'s program writing the widened tree straight into `shardings`
  (a tree of `NamedSharding`s on one mesh), its inputs replicated there:
  `into(s)(params, the noise key's raw data, noise, *statics(...))`, or
  `.lower` on shapes (`python -m specdec_jax.compiled --programs=widen`:
  bytes per device of an XXL-cost widening on a TPU slice)."""
  mesh = jax.tree.leaves(shardings)[0].mesh
  everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.jit(_widen_keyed, static_argnums=(3, 4, 5),
                 in_shardings=everywhere, out_shardings=shardings)


def _widen(params: Params, rng: Array, noise: Array, config: T5Config,
           new_config: T5Config, use_noise: bool) -> Dict[str, Any]:
  """`widen`'s program."""
  seed = jax.random.bits(rng, (), jnp.uint32)
  w = _Widener(config, new_config, noise if use_noise else None, seed,
               params['token_embedder']['embedding'].dtype)
  return {
      'token_embedder': {
          'embedding': w.embedding(params['token_embedder']['embedding'])},
      'encoder': w.stack(params['encoder'], 'encoder'),
      'decoder': w.stack(params['decoder'], 'decoder'),
  }


_widen_jit = jax.jit(_widen, static_argnums=(3, 4, 5))


def _widen_keyed(params: Params, key_data: Array, *args) -> Dict[str, Any]:
  """`_widen` of the noise's key as its raw data (a host array)."""
  return _widen(params, jax.random.wrap_key_data(key_data), *args)


def widened_config(config: T5Config,
                   size: Union[str, Mapping[str, int], T5Config]) -> T5Config:
  """The config `size` names for `config`, checked to be a growth of it.

  Args:
    config: the trained model's config.
    size: a `PRESETS` key (e.g. 't5_1_1_xxl_cost'), a mapping of `GROWABLE`
      fields to new values, or a `T5Config`.
  """
  if isinstance(size, str):
    new_config = preset_config(config, size)
  elif isinstance(size, T5Config):
    new_config = size
  else:
    checks.check_type('size', size, Mapping, 'a PRESETS name, a T5Config '
                      "or {dimension: size}, e.g. {'emb_dim': 64}")
    unknown = set(size) - set(GROWABLE)
    if unknown:
      raise checks.InputError(f'Not growable dimensions: {sorted(unknown)}.')
    new_config = config.replace(**size)
  network.check_config(new_config, 'the widened config')  # ints, not 64.5
  check_growth(config, new_config)
  return new_config


def widen_to(params: Params, config: T5Config,
             size: Union[str, Mapping[str, int], T5Config], *,
             noise: float = 0.0, rng: Optional[Array] = None
             ) -> Tuple[Dict[str, Any], T5Config]:
  """Widens to a preset name, a dict of dimensions, or a full config.

  Args:
    params: T5X parameter tree of `config`.
    config: the trained model's config.
    size: see `widened_config`.
    noise: see `widen`.
    rng: see `widen`.

  Returns:
    `(new_params, new_config)`.
  """
  new_config = widened_config(config, size)
  return widen(params, config, new_config, noise=noise, rng=rng), new_config


def param_count(params: Params) -> int:
  """Total number of parameters in a tree (arrays or ShapeDtypeStructs)."""
  return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))
