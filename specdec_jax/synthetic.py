"""Synthetic checkpoints: a model's random weights and noisy copies of them.

A checkpoint named 'synthetic:seed=S' is the model's own random
initialization at seed S (`network.T5Model(config).init_params(
jax.random.key(S))`); 'synthetic:seed=S,noise=SIGMA' is those weights with
every leaf plus SIGMA x std(leaf) x N(0, 1) noise (`perturbed`; a constant
leaf, such as a layer norm's scale at initialization, has std 0 and stays as
it is). The noise has its own PRNG key, folded in from S and SIGMA, so a
name always gives the same weights (a `loading.LoadCache` keys models by the
checkpoint string) and no two sigmas share a draw.

A noisy copy of a random target is a drafter whose agreement with it falls
as SIGMA grows: the 'synthetic' model set (experiments/reproduce.py) runs
every spec with no trained weights, alpha set by the noise. `loading.
load_model` reads the scheme, as it reads 'shipped:<name>'.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import network

SCHEME = 'synthetic:'
_KEYS = ('seed', 'noise')
_SEEDS = 2**32  # jax.random.key keeps a seed's low 32 bits only
_NOISE_STREAM = 1  # folded into the seed's key: the noise's key, not init's


@dataclasses.dataclass(frozen=True)
class Spec:
  """What a 'synthetic:' checkpoint names.

  Attributes:
    seed: the PRNG seed of the random initialization, in [0, 2**32).
    noise: sigma, the noise added to each leaf in units of its std (0: the
      initialization itself).
  """
  seed: int
  noise: float = 0.0

  @property
  def checkpoint(self) -> str:
    """The canonical name: 'synthetic:seed=S' or '...,noise=SIGMA'."""
    if not self.noise:
      return f'{SCHEME}seed={self.seed}'
    return f'{SCHEME}seed={self.seed},noise={float(self.noise)!r}'


def parse(checkpoint: str) -> Spec:
  """'synthetic:seed=S[,noise=SIGMA]' -> its `Spec`.

  Raises:
    ValueError: not the scheme, an entry that is not KEY=VALUE, an unknown
      or repeated key, no seed, a seed that is not an integer in
      [0, 2**32), or a noise that is not a finite number >= 0 (each named).
  """
  text = str(checkpoint)
  form = f"expected '{SCHEME}seed=S' or '{SCHEME}seed=S,noise=SIGMA'"
  if not text.startswith(SCHEME):
    raise ValueError(f'Not a synthetic checkpoint: {text!r}; {form}.')
  fields = {}
  for item in text[len(SCHEME):].split(','):
    key, eq, value = (part.strip() for part in item.partition('='))
    if not eq or not key or not value:
      raise ValueError(f'Synthetic checkpoint {text!r}: entry {item!r} is '
                       f'not KEY=VALUE; {form}.')
    if key not in _KEYS:
      raise ValueError(f'Synthetic checkpoint {text!r}: unknown key '
                       f'{key!r}; the keys are {list(_KEYS)}.')
    if key in fields:
      raise ValueError(f'Synthetic checkpoint {text!r}: {key!r} given '
                       'twice.')
    fields[key] = value
  if 'seed' not in fields:
    raise ValueError(f'Synthetic checkpoint {text!r} has no seed; {form}.')
  try:
    seed = int(fields['seed'])
  except ValueError:
    seed = -1
  if not 0 <= seed < _SEEDS:
    raise ValueError(f'Synthetic checkpoint {text!r}: the seed must be an '
                     f'integer in [0, 2**32), got {fields["seed"]!r}.')
  try:
    noise = float(fields.get('noise', 0))
  except ValueError:
    noise = math.nan
  if not math.isfinite(noise) or noise < 0:
    raise ValueError(f'Synthetic checkpoint {text!r}: the noise must be a '
                     f'finite number >= 0, got {fields["noise"]!r}.')
  return Spec(seed, noise)


def noise_key(spec: Spec) -> jax.Array:
  """The PRNG key of a spec's noise: its seed's key with a stream tag and
  the noise's float64 bits folded in (distinct from the initialization's
  key, and from another sigma's)."""
  bits = struct.unpack('<II', struct.pack('<d', spec.noise))
  key = jax.random.fold_in(jax.random.key(spec.seed), _NOISE_STREAM)
  for word in bits:
    key = jax.random.fold_in(key, word)
  return key


def perturbed(params: Any, sigma: float, key: jax.Array) -> Any:
  """Each leaf plus sigma x std(leaf) x N(0, 1) noise, in the leaf's dtype.

  One draw of N(0, 1) values, as many as the tree has, is cut into the
  leaves in `jax.tree_util` order (one random call however many leaves: a
  call per leaf would compile for seconds on a CPU); the arithmetic is
  float32 numpy (jnp where the params are traced).

  Args:
    params: a params tree.
    sigma: the noise in units of each leaf's std.
    key: PRNG key of the draw.

  Returns:
    The noisy tree, of the same structure, shapes and dtypes.
  """
  leaves, tree = jax.tree_util.tree_flatten(params)
  sizes = [int(np.size(x)) for x in leaves]
  # Traced (in a jit, or `jax.eval_shape`'s shapes alone): the same in jnp.
  xp = jnp if any(isinstance(x, jax.core.Tracer) for x in leaves) else np
  draw = xp.asarray(jax.random.normal(key, (sum(sizes),), jnp.float32))
  noisy, start = [], 0
  for x, size in zip(leaves, sizes):
    x32 = xp.asarray(x, xp.float32)
    z = draw[start:start + size].reshape(x32.shape)
    noisy.append(jnp.asarray(x32 + sigma * x32.std() * z, x.dtype))
    start += size
  return jax.tree_util.tree_unflatten(tree, noisy)


def params(config: network.T5Config, checkpoint: str) -> Any:
  """The weights a 'synthetic:' checkpoint names, for a model config.

  Args:
    config: the model's `T5Config`.
    checkpoint: 'synthetic:seed=S' or 'synthetic:seed=S,noise=SIGMA'.

  Returns:
    `network.T5Model(config).init_params(jax.random.key(S))`, plus the
    noise when SIGMA > 0.
  """
  spec = parse(checkpoint)
  init = network.T5Model(config).init_params(jax.random.key(spec.seed))
  if not spec.noise:
    return init
  return perturbed(init, spec.noise, noise_key(spec))
