"""Pre-tokenized data sets: token arrays on disk, no seqio or TensorFlow.

A seqio task is the source of truth for preprocessing (tasks.py); this module
holds what a task yields after tokenization, as plain arrays, so that machines
without seqio / TensorFlow (an accelerator host, a fresh clone) can train and
evaluate on exactly the same tokens:

  <dir>/<split>.npz   inputs  [N, input_length]  int32, EOS (1) terminated,
                      targets [N, target_length] int32  0-padded, trimmed like
                                                        seqio's
                                                        append_eos_after_trim
                      task    [N] int32 (optional): index into `task_names`
                      task_names [T] str (optional)

`<dir>` may be a gs:// address. `scripts/export_arrays.py` writes them from
seqio tasks / mixtures; the distillation data (a target's own outputs over
the train inputs, `distill.generate`) is written in the same format, in
shards (`<split>-00000-of-00008.npz`). `features` turns a batch of arrays
into the model features of seqio's `EncDecFeatureConverter(pack=False)`, so
training on arrays and training on the seqio task see identical batches'
contents.
"""

from __future__ import annotations

import fnmatch
import io
import os
from typing import Dict, Iterator, List, Mapping, Optional

import numpy as np

from specdec_jax import checkpoints

# What seqio's EncDecFeatureConverter(pack=False) makes, the training
# features; all `[batch, length]` int32. `data.FEATURES` is this tuple.
FEATURES = ('encoder_input_tokens', 'decoder_input_tokens',
            'decoder_target_tokens', 'decoder_loss_weights')

Arrays = Dict[str, np.ndarray]


def split_files(data_dir: str, split: str) -> List[str]:
  """The npz files of a split: `<split>.npz` or its shards, in order
  (`data_dir` local or a gs:// address)."""
  names = sorted(n for n in checkpoints.list_files(data_dir) if '/' not in n)
  files = [os.path.join(data_dir, n) for n in names if n == f'{split}.npz'] + [
      os.path.join(data_dir, n)
      for n in fnmatch.filter(names, f'{split}-*-of-*.npz')]
  if not files:
    raise FileNotFoundError(
        f'No {split!r} split in {data_dir!r} (expected {split}.npz or '
        f'{split}-NNNNN-of-NNNNN.npz; scripts/export_arrays.py writes them).')
  return files


def load(data_dir: str, split: str) -> Arrays:
  """All rows of a split as `{'inputs', 'targets'[, 'task']}` arrays.

  Shards are concatenated in order; shorter rows are 0-padded to the widest.

  Raises:
    FileNotFoundError: no such split.
    ValueError: a file without 'inputs'/'targets', or rows that disagree.
  """
  parts = []
  task_names = None
  for path in split_files(data_dir, split):
    with np.load(io.BytesIO(checkpoints.read_bytes(path)),
                 allow_pickle=False) as f:
      for key in ('inputs', 'targets'):
        if key not in f.files:
          raise ValueError(f'{path} has no {key!r} array (has {f.files}).')
      part = {k: f[k] for k in ('inputs', 'targets', 'task') if k in f.files}
      if 'task_names' in f.files:
        task_names = [str(t) for t in f['task_names']]
    if len(part['inputs']) != len(part['targets']):
      raise ValueError(f'{path}: {len(part["inputs"])} inputs but '
                       f'{len(part["targets"])} targets.')
    parts.append(part)
  out = {}
  for key in parts[0]:
    width = max(p[key].shape[1] for p in parts) if parts[0][key].ndim == 2 \
        else None
    out[key] = np.concatenate([
        np.pad(p[key], ((0, 0), (0, width - p[key].shape[1])))
        if width is not None else p[key] for p in parts]).astype(np.int32)
  if task_names is not None:
    out['task_names'] = np.asarray(task_names)
  return out


def save(path: str, arrays: Mapping[str, np.ndarray]) -> str:
  """Writes arrays to `path` (.npz, local or a gs:// address) atomically:
  a reader never sees half."""
  if not checkpoints.is_gcs(path):  # refuses another URL
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  buf = io.BytesIO()
  np.savez_compressed(buf, **{k: np.asarray(v) for k, v in arrays.items()})
  checkpoints.write_bytes(path, buf.getvalue())  # whole or absent
  return path


def fit(tokens: np.ndarray, length: int) -> np.ndarray:
  """Trims rows to `length` keeping a final EOS (seqio's rule) or pads with 0.

  Args:
    tokens: `[N, L]` int, EOS (1) terminated, 0-padded.
    length: the new width.

  Returns:
    `[N, length]` int32. A row longer than `length` keeps its first
    `length - 1` tokens and ends in EOS, as `append_eos_after_trim` does.
  """
  tokens = np.asarray(tokens, np.int32)
  width = tokens.shape[1]
  if width <= length:
    return np.pad(tokens, ((0, 0), (0, length - width)))
  out = tokens[:, :length].copy()
  trimmed = tokens[:, length:].any(axis=1) | (out[:, -1] != 0)
  out[trimmed, -1] = 1
  return out


def features(inputs: np.ndarray, targets: np.ndarray) -> Arrays:
  """Model features of `EncDecFeatureConverter(pack=False)`.

  Args:
    inputs: `[B, Li]` int, 0-padded.
    targets: `[B, Lt]` int, 0-padded.

  Returns:
    encoder_input_tokens `[B, Li]`, decoder_input_tokens `[B, Lt]` (targets
    shifted right, 0 first), decoder_target_tokens `[B, Lt]`,
    decoder_loss_weights `[B, Lt]` (1 on real target tokens).
  """
  targets = np.asarray(targets, np.int32)
  dec_in = np.zeros_like(targets)
  dec_in[:, 1:] = targets[:, :-1]
  return {
      'encoder_input_tokens': np.asarray(inputs, np.int32),
      'decoder_input_tokens': dec_in,
      'decoder_target_tokens': targets,
      'decoder_loss_weights': (targets != 0).astype(np.int32),
  }


def array_train_batches(data: Arrays, batch_size: int, seed: int,
                        start_step: int = 0) -> Iterator[Arrays]:
  """Endless shuffled batches of features, from batch `start_step` on.

  Epoch e visits the rows in `np.random.default_rng([seed, e])`'s
  permutation; batch i is a pure function of (data, batch_size, seed, i), so
  a resumed run continues exactly where it stopped, skipping nothing but
  index arithmetic.

  Args:
    data: `load(...)` of the train split.
    batch_size: rows per batch (<= rows).
    seed: order seed.
    start_step: the first batch to yield.

  Yields:
    FEATURES dicts of `[batch_size, length]` int32 arrays.
  """
  n = len(data['inputs'])
  if batch_size > n:
    raise ValueError(f'batch_size {batch_size} > {n} rows.')
  per_epoch = n // batch_size
  step = start_step
  epoch, order = None, None
  while True:
    e, i = divmod(step, per_epoch)
    if e != epoch:
      epoch, order = e, np.random.default_rng([seed, e]).permutation(n)
    rows = order[i * batch_size:(i + 1) * batch_size]
    yield features(data['inputs'][rows], data['targets'][rows])
    step += 1


def array_eval_batches(data: Arrays, batch_size: int,
                       num_examples: Optional[int] = None) -> List[Arrays]:
  """The first `num_examples` rows in order, as full batches (0-row padded)."""
  n = len(data['inputs']) if num_examples is None else min(
      num_examples, len(data['inputs']))
  batches = []
  for start in range(0, n, batch_size):
    stop = min(start + batch_size, n)
    pad = batch_size - (stop - start)
    f = features(data['inputs'][start:stop], data['targets'][start:stop])
    batches.append({k: np.pad(v, ((0, pad), (0, 0))) for k, v in f.items()})
  return batches
