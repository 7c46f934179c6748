"""A semantic cache of earlier outputs: what the 'cache' drafter copies from.

The paper's open question (sec. 3.6: drafting without a draft model, e.g.
where similar requests repeat, by retrieving earlier outputs) as a store of
(request, output) pairs:

- key: an embedding of the request, the target encoder's output mean-pooled
  over the request's tokens and L2-normalized (`embed`), float32 `[d]`;
- value: the output token ids the decoder emitted (no BOS, EOS kept),
  0-padded to a fixed `output_length`.

`OutputCache` is the host-side store: built from (inputs, outputs) pairs
(e.g. a task's train split), grown by `add` (the eval job appends every
finished output), saved to and loaded from one `.npz` file (atomic writes;
a corrupt, truncated or mismatched file raises `OutputCacheError` naming
the file and the problem). `device_params` hands the drafter fixed-capacity
arrays (capacity a power of two), so a growing cache recompiles the loop
only when its capacity doubles.

Retrieval is on device, inside the jitted loop (`drafters.CacheDrafter`):
one `[batch, d] x [d, capacity]` product and `lax.top_k`, then the lookup
of `drafters.lookup_next` over the neighbours' outputs. An exact-n-gram
datastore (REST, He et al. 2024) is the same structure with every entry a
neighbour: `neighbours = capacity` (see the README for when that suffices).

Memory: `capacity x (4 d + 4 output_length)` bytes on device (keys float32,
outputs int32): 10k entries at d = 512, output_length = 64 are 23 MB.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import zipfile
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import network
from specdec_jax import partitioning

FORMAT = 'specdec_jax.output_cache/1'


class OutputCacheError(ValueError):
  """A cache file is missing, corrupt, or does not fit the model / task.

  Attributes:
    problem: what is wrong with the file (the message without the file's
      name and the advice).
    message: the whole message, one line (before anything a caller
      appends to the exception's text: gin's "In call to configurable").
  """

  def __init__(self, path: str, problem: str):
    self.problem = problem
    self.message = (
        f'Output cache {path!r} {problem}. Delete it (a new cache is '
        'built, seeded with the task\'s train pairs) or name another file '
        '(OUTPUT_CACHE).')
    super().__init__(self.message)


def fingerprint(config, params) -> str:
  """A short id of the embedder (its config and a sample of its weights).

  Keys built by another model are meaningless to this one: `load` compares
  the fingerprint stored in the file with the caller's.
  """
  h = hashlib.sha256(repr(config).encode())
  leaves = jax.tree_util.tree_leaves(params)
  for leaf in leaves[:4] + leaves[-4:]:
    h.update(np.asarray(partitioning.to_host(leaf.ravel()[:256]),
                        np.float32).tobytes())
  return h.hexdigest()[:16]


def embed(model, params, encoder_input_tokens) -> jax.Array:
  """`[batch, d]` float32: mean-pooled encoder output, L2-normalized.

  Args:
    model: a `network.T5Model` (the target: its encoder reads the request).
    params: its parameters.
    encoder_input_tokens: `[batch, input_length]`, 0-padded.
  """
  tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
  mask = (tokens > 0).astype(jnp.float32)[..., None]
  encoded = model.encode(params, tokens).astype(jnp.float32)
  pooled = jnp.sum(encoded * mask, 1) / jnp.maximum(jnp.sum(mask, 1), 1.0)
  norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
  return pooled / jnp.maximum(norm, 1e-6)


_embed_jit = jax.jit(embed, static_argnums=0)


def capacity_for(n: int, minimum: int = 64) -> int:
  """The power of two >= max(n, minimum) (compiled shapes change rarely)."""
  c = minimum
  while c < n:
    c *= 2
  return c


@dataclasses.dataclass
class OutputCache:
  """(request embedding, output) pairs; see the module docstring.

  Attributes:
    keys: `[n, d]` float32, L2-normalized request embeddings.
    outputs: `[n, output_length]` int32 output ids (EOS kept, 0-padded).
    vocab_size: the vocabulary the outputs are ids of.
    embedder: `fingerprint` of the model that computed the keys.
    path: where `save` writes by default (None: nowhere).
  """

  keys: np.ndarray
  outputs: np.ndarray
  vocab_size: int
  embedder: str
  path: Optional[str] = None

  @classmethod
  def empty(cls, dim: int, output_length: int, vocab_size: int,
            embedder: str, path: Optional[str] = None) -> 'OutputCache':
    checks.check_ints(dim=dim, output_length=output_length,
                      vocab_size=vocab_size)
    return cls(np.zeros((0, dim), np.float32),
               np.zeros((0, output_length), np.int32), vocab_size, embedder,
               path)

  @classmethod
  def for_model(cls, model, params, output_length: int,
                path: Optional[str] = None) -> 'OutputCache':
    """An empty cache keyed by `model`'s encoder (the target)."""
    return cls.empty(model.config.emb_dim, output_length, model.vocab_size,
                     fingerprint(model.config, params), path)

  def __len__(self) -> int:
    return int(self.keys.shape[0])

  @property
  def dim(self) -> int:
    return int(self.keys.shape[1])

  @property
  def output_length(self) -> int:
    return int(self.outputs.shape[1])

  def add(self, keys, outputs: Sequence[Sequence[int]]) -> None:
    """Appends pairs: keys `[m, d]`, outputs m id lists (cut or 0-padded)."""
    keys = np.asarray(keys, np.float32)
    if keys.shape != (len(outputs), self.dim):  # before: reshaped to fit
      raise checks.InputError(
          f'keys must be [outputs, dim] = {(len(outputs), self.dim)}, got '
          f'shape {keys.shape}.')
    if not np.all(np.isfinite(keys)):
      raise checks.InputError('keys must be finite (a NaN key matches none).')
    rows = np.zeros((len(outputs), self.output_length), np.int32)
    for i, out in enumerate(outputs):
      out = [int(t) for t in out if int(t) != 0][:self.output_length]
      if any(not 0 <= t < self.vocab_size for t in out):
        raise checks.InputError(
            f'output {i} has ids outside [0, {self.vocab_size})')
      rows[i, :len(out)] = out
    self.keys = np.concatenate([self.keys, keys])
    self.outputs = np.concatenate([self.outputs, rows])

  def add_requests(self, model, params, inputs, outputs,
                   batch_size: int = 64) -> None:
    """Embeds requests `[m, input_length]` with `model` and appends them.

    In calls of `batch_size` rows; a shorter last call is padded to the
    power of two above it (a few compiled shapes, and adding one unit's
    outputs embeds that unit, not `batch_size` rows).
    """
    checks.check_int('batch_size', batch_size)
    network.check_token_ids('inputs', inputs, model.vocab_size)  # embedded
    inputs = np.asarray(inputs, np.int32)
    for i in range(0, len(inputs), batch_size):
      chunk = inputs[i:i + batch_size]
      pad = min(capacity_for(len(chunk), 1), batch_size) - len(chunk)
      keys = _embed_jit(model, params,
                        np.pad(chunk, ((0, pad), (0, 0))))[:len(chunk)]
      self.add(partitioning.to_host(keys), outputs[i:i + len(chunk)])

  def add_pairs(self, model, params, pairs: Sequence[Tuple[Sequence[int],
                                                          Sequence[int]]],
                input_length: Optional[int] = None) -> None:
    """Embeds and appends (input ids, output ids) pairs.

    Inputs are 0-padded to `input_length` (cut to it when longer; default:
    the longest input).
    """
    if not pairs:
      return
    width = input_length or max(len(i) for i, _ in pairs)
    inputs = np.zeros((len(pairs), width), np.int32)
    for row, (ids, _) in zip(inputs, pairs):
      ids = list(ids)[:width]
      row[:len(ids)] = ids
    self.add_requests(model, params, inputs, [o for _, o in pairs])

  def device_params(self, capacity: Optional[int] = None) -> Dict[str, Any]:
    """{'keys' [c, d], 'outputs' [c, L], 'valid' [c]} padded to capacity."""
    c = self._capacity(capacity)
    pad = c - len(self)
    return {
        'keys': jnp.asarray(np.pad(self.keys, ((0, pad), (0, 0)))),
        'outputs': jnp.asarray(np.pad(self.outputs, ((0, pad), (0, 0)))),
        'valid': jnp.asarray(np.arange(c) < len(self)),
    }

  def nbytes(self, capacity: Optional[int] = None) -> int:
    """Device bytes of `device_params(capacity)`."""
    c = self._capacity(capacity)
    return c * (4 * self.dim + 4 * self.output_length + 1)

  def _capacity(self, capacity: Optional[int]) -> int:
    """`capacity`, an int >= the entries (None: `capacity_for` them)."""
    if capacity is None:
      return capacity_for(len(self))
    checks.check_int('capacity', capacity, max(len(self), 1),
                     f' (the cache holds {len(self)} entries)')
    return capacity

  # -- persistence ----------------------------------------------------------

  def save(self, path: Optional[str] = None) -> str:
    """Writes the cache to `path` (default `self.path`) atomically; the
    same content gives the same bytes."""
    path = path or self.path
    if not path:
      raise checks.InputError('OutputCache.save needs a path.')
    if not checkpoints.is_gcs(path) and os.path.dirname(path):
      os.makedirs(os.path.dirname(path), exist_ok=True)
    meta = {'format': FORMAT, 'vocab_size': self.vocab_size,
            'embedder': self.embedder, 'entries': len(self),
            'dim': self.dim, 'output_length': self.output_length}
    arrays = {'keys': self.keys, 'outputs': self.outputs,
              'meta': np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    buf = io.BytesIO()
    # An .npz (np.load reads it) whose bytes depend on the content alone:
    # np.savez would stamp each member with the time of writing.
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_STORED) as z:
      for name, value in arrays.items():
        member = io.BytesIO()
        np.lib.format.write_array(member, np.asarray(value),
                                  allow_pickle=False)
        z.writestr(zipfile.ZipInfo(name + '.npy', (1980, 1, 1, 0, 0, 0)),
                   member.getvalue())
    checkpoints.write_bytes(path, buf.getvalue())
    return path

  @classmethod
  def load(cls, path: str, *, vocab_size: Optional[int] = None,
           embedder: Optional[str] = None,
           output_length: Optional[int] = None) -> 'OutputCache':
    """Reads a cache file; checks it against what the caller expects.

    Raises:
      OutputCacheError: the file is missing, not a cache file, corrupt
        (zip CRC, truncation, inconsistent arrays), or built for another
        vocabulary / embedder / output length.
    """
    if not checkpoints.isfile(path):
      raise OutputCacheError(path, 'does not exist')
    try:
      with np.load(io.BytesIO(checkpoints.read_bytes(path)),
                   allow_pickle=False) as f:
        meta = json.loads(bytes(f['meta']).decode())
        keys = np.asarray(f['keys'], np.float32)
        outputs = np.asarray(f['outputs'], np.int32)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile,
            UnicodeDecodeError, TypeError) as e:  # TypeError: one .npy array
      raise OutputCacheError(path, f'is corrupt or not a cache file '
                             f'({type(e).__name__}: {e})') from e
    if not isinstance(meta, dict) or meta.get('format') != FORMAT:
      found = meta.get('format') if isinstance(meta, dict) else meta
      raise OutputCacheError(path, f'has format {found!r}, expected '
                             f'{FORMAT!r}')
    missing = sorted({'entries', 'dim', 'output_length', 'vocab_size',
                      'embedder'} - set(meta))
    if missing or not checks.is_int(meta['vocab_size']):
      raise OutputCacheError(path, f'is corrupt: its meta lacks {missing} or '
                             f"has vocab_size {meta.get('vocab_size')!r}")
    n = meta.get('entries')
    if (keys.ndim != 2 or outputs.ndim != 2 or len(keys) != n or
        len(outputs) != n or keys.shape[1] != meta.get('dim') or
        outputs.shape[1] != meta.get('output_length')):
      raise OutputCacheError(
          path, f'is inconsistent: meta says {n} entries of dim '
          f'{meta.get("dim")}, output_length {meta.get("output_length")}; '
          f'arrays are {keys.shape} and {outputs.shape}')
    problems = []
    if vocab_size is not None and meta['vocab_size'] != vocab_size:
      problems.append(f'vocab_size {meta["vocab_size"]}, the target has '
                      f'{vocab_size}')
    if embedder is not None and meta['embedder'] != embedder:
      problems.append(f'keys embedded by model {meta["embedder"]}, this '
                      f'target is {embedder} (another model or checkpoint)')
    if output_length is not None and meta['output_length'] != output_length:
      problems.append(f'output_length {meta["output_length"]}, the task '
                      f'decodes {output_length}')
    if outputs.size and (outputs.min() < 0 or
                         outputs.max() >= meta['vocab_size']):
      problems.append('output ids outside the vocabulary')
    if problems:
      raise OutputCacheError(path, 'does not fit: ' + '; '.join(problems))
    return cls(keys, outputs, meta['vocab_size'], meta['embedder'], path)

  @classmethod
  def open(cls, path: Optional[str], model, params,
           output_length: int) -> 'OutputCache':
    """The cache at `path` if the file exists (checked), else a new one."""
    if path and checkpoints.isfile(path):
      return cls.load(path, vocab_size=model.vocab_size,
                      embedder=fingerprint(model.config, params),
                      output_length=output_length)
    return cls.for_model(model, params, output_length, path)


def retrieve(params: Dict[str, Any], queries: jax.Array,
             k: int) -> Tuple[jax.Array, jax.Array]:
  """The k nearest valid entries by cosine similarity, on device.

  Args:
    params: `OutputCache.device_params()`.
    queries: `[batch, d]` normalized embeddings.
    k: neighbours (static, <= capacity).

  Returns:
    `(index [batch, k] int32, ok [batch, k] bool)`, most similar first; ok
    False where the cache has fewer than k entries.
  """
  capacity = params['keys'].shape[0]
  if not checks.is_int(k) or not 1 <= k <= capacity:  # static: at trace
    raise checks.InputError(
        f'k must be an int in [1, capacity={capacity}], got {k!r}.')
  sims = queries @ params['keys'].T
  sims = jnp.where(params['valid'][None], sims, -jnp.inf)
  top, index = jax.lax.top_k(sims, k)
  return index.astype(jnp.int32), jnp.isfinite(top)


def neighbour_stream(params: Dict[str, Any], index: jax.Array,
                     ok: jax.Array) -> jax.Array:
  """The neighbours' outputs as one lookup stream `[batch, k * (L + 2)]`.

  Each output is written as `0 (BOS), ids..., -1`, least similar first, so
  the most similar neighbour is the most recent (wins ties in
  `drafters.lookup_next`); its padding and missing neighbours are -1.
  """
  outs = params['outputs'][index]  # [batch, k, L]
  outs = jnp.where(ok[..., None] & (outs > 0), outs, -1)
  bos = jnp.where(ok, 0, -1)[..., None]
  sep = jnp.full(outs.shape[:2] + (1,), -1, jnp.int32)
  stream = jnp.concatenate([bos, outs, sep], axis=-1)[:, ::-1]
  return stream.reshape(stream.shape[0], -1)


def from_pairs(model, params, pairs: Iterable[Tuple[Sequence[int],
                                                    Sequence[int]]],
               input_length: int, output_length: int,
               path: Optional[str] = None) -> OutputCache:
  """A cache of (input ids, output ids) pairs, e.g. a task's train split."""
  cache = OutputCache.for_model(model, params, output_length, path)
  cache.add_pairs(model, params, list(pairs), input_length)
  return cache
