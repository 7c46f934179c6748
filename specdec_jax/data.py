"""Task data for the jobs: examples, padded batches, text and metrics.

What the eval job, the reproduction scripts and the peer benchmark read from a
task, in one place: the examples of a split (`task_examples`), token rows
padded into a `[batch, length]` array (`pad_rows`) and split into batches of
one compiled shape (`batches`), model output back to text (`decode_text`),
the task's metrics (`task_metrics`), and the training batches of a task
(`task_train_batches`, `task_eval_batches`: seqio's T5X pipeline).
A task is a seqio task or a `tasks.ArrayTask` (stored token ids, no seqio);
nothing here is jitted; seqio is imported only when a seqio task is read.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional
from typing import Sequence, Tuple

import numpy as np

# The training features, defined beside the pre-tokenized arrays (which do
# not import this module) and re-exported here.
from specdec_jax import checks
from specdec_jax import tasks
from specdec_jax.arrays import FEATURES

EOS_ID = 1
Batch = Dict[str, np.ndarray]


def split_examples(task, split: str) -> Iterator[Mapping[str, Any]]:
  """The examples of a split, in order, untrimmed: 'inputs' / 'targets' ids
  (EOS-terminated) and their '*_pretokenized' texts (str or bytes).

  Args:
    task: a seqio task, or a `tasks.ArrayTask` (read without seqio).
    split: e.g. 'validation'.
  """
  if isinstance(task, tasks.ArrayTask):
    return iter(task.examples(split))
  ds = task.get_dataset(sequence_length=None, split=split, shuffle=False,
                        trim_output_features=False)
  return ds.as_numpy_iterator()


def task_examples(task, split: str, lengths: Mapping[str, int],
                  num_examples: Optional[int], truncate_inputs: bool
                  ) -> Iterator[Tuple[int, List[int], str, str]]:
  """Yields (index, input ids, input text, target text) of a split.

  Args:
    task: a seqio task or a `tasks.ArrayTask` (see `split_examples`).
    split: e.g. 'validation'.
    lengths: {'inputs': N, ...}: inputs longer than N tokens are an error,
      or cut to N (keeping the last token, EOS) with `truncate_inputs`.
    num_examples: the first that many (None = all).
    truncate_inputs: cut long inputs instead of failing.
  """
  max_in = lengths['inputs']
  for i, ex in enumerate(split_examples(task, split)):
    if num_examples is not None and i >= num_examples:
      return
    ids = [int(t) for t in ex['inputs']]
    if len(ids) > max_in:
      if not truncate_inputs:
        raise checks.InputError(
            f'Example {i} of {task.name}/{split} has {len(ids)} input tokens, '
            f"more than TASK_FEATURE_LENGTHS['inputs'] = {max_in}. Raise the "
            'length or set DataSpec.truncate_inputs = True.')
      ids = ids[:max_in - 1] + [ids[-1]]
    text = lambda key: ex.get(key, b'').decode('utf-8') if isinstance(
        ex.get(key, b''), bytes) else str(ex.get(key, ''))
    yield i, ids, text('inputs_pretokenized'), text('targets_pretokenized')


def train_targets(task, max_examples: int = 20000) -> Iterator[List[int]]:
  """The target ids (no padding) of the first examples of the train split."""
  for ex in itertools.islice(split_examples(task, 'train'), max_examples):
    yield [int(t) for t in ex['targets'] if t != 0]


def train_pairs(task, max_examples: int = 20000
                ) -> Iterator[Tuple[List[int], List[int]]]:
  """(input ids, target ids) of the first train examples (no padding).

  What an output cache is seeded with (`drafters.DraftSource.train_pairs`).
  """
  for ex in itertools.islice(split_examples(task, 'train'), max_examples):
    yield ([int(t) for t in ex['inputs'] if t != 0],
           [int(t) for t in ex['targets'] if t != 0])


def pad_rows(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
  """Token id rows -> int32 `[len(rows), length]`, 0-padded on the right."""
  out = np.zeros((len(rows), length), np.int32)
  for i, ids in enumerate(rows):
    if len(ids) > length:
      raise checks.InputError(
          f'Row {i} has {len(ids)} tokens, more than {length}.')
    if min(ids, default=0) < 0:
      raise checks.InputError(f'Row {i} holds a negative id: {list(ids)}.')
    out[i, :len(ids)] = ids
  return out


def batches(rows: np.ndarray, batch_size: int, fill: str = 'first'
            ) -> Iterator[Tuple[int, int, np.ndarray]]:
  """Yields (start, rows used, batch): every batch `[batch_size, ...]`.

  A short last batch is filled so that every call has one compiled shape:
  `fill='first'` repeats the batch's first row (the filler rows then decode
  like a real one: timings of the last batch stay comparable), `fill='eos'`
  gives them a lone EOS input (they stop at once: cheapest when only the
  real rows' outputs matter).
  """
  if fill not in ('first', 'eos'):
    raise checks.InputError(f"fill must be 'first' or 'eos', got {fill!r}.")
  checks.check_int('batch_size', batch_size)
  rows = np.asarray(rows)
  for start in range(0, len(rows), batch_size):
    n = min(batch_size, len(rows) - start)
    batch = np.zeros((batch_size,) + rows.shape[1:], rows.dtype)
    batch[:n] = rows[start:start + n]
    if n < batch_size:
      if fill == 'first':
        batch[n:] = rows[start]
      else:
        batch[n:, 0] = EOS_ID
    yield start, n, batch


def task_inputs(task, lengths: Mapping[str, int], n: Optional[int],
                split: str = 'validation', with_targets: bool = False):
  """The first n inputs of a split (long ones cut), 0-padded `[n, inputs]`.

  With `with_targets`, returns `(inputs, target texts)`.
  """
  examples = list(task_examples(task, split, lengths, n,
                                truncate_inputs=True))
  inputs = pad_rows([ids for _, ids, _, _ in examples], lengths['inputs'])
  if with_targets:
    return inputs, [target for *_, target in examples]
  return inputs


def decode_text(vocab, tokens: Iterable[int], length: int,
                eos_id: int = EOS_ID) -> str:
  """The text of one output row: its first `length` tokens, EOS dropped."""
  ids = [int(t) for t in list(tokens)[:length] if int(t) != eos_id]
  return vocab.decode(ids)


def task_metrics(task, targets: Sequence[str], predictions: Sequence[str],
                 not_computed: Optional[Dict[str, str]] = None
                 ) -> Dict[str, float]:
  """The task's metric functions (BLEU, ROUGE, ...) as plain floats.

  Args:
    task: a seqio task or `tasks.ArrayTask` (its `predict_metric_fns`).
    targets: one reference string per example.
    predictions: one decoded string per example.
    not_computed: where given, a metric whose package is not installed
      (rouge-score on a machine without it) is left out and named here
      (function name -> why) instead of failing the caller: the eval job's
      summary of decoded records is written all the same.
  """
  out: Dict[str, Any] = {}
  for fn in task.predict_metric_fns:
    try:
      scores = fn(targets, predictions)
    except ImportError as e:
      if not_computed is None:
        raise
      not_computed[fn.__name__] = f'{e.name or e} is not installed'
      continue
    for k, v in scores.items():
      out[k] = float(getattr(v, 'value', v))
  return out


# ------------------------------------------------- training batches (seqio) ---
def get_dataset(mixture_or_task_name: str,
                task_feature_lengths: Mapping[str, int], split: str, *,
                shuffle: bool, seed: Optional[int], num_epochs: Optional[int]):
  """A task's examples as unbatched model features (T5X's pipeline).

  Args:
    mixture_or_task_name: a registered seqio task or mixture.
    task_feature_lengths: {'inputs': N, 'targets': M}; longer examples are
      trimmed (keeping EOS), shorter ones padded with 0.
    split: e.g. 'train' or 'validation'.
    shuffle: shuffle examples (seqio's buffer), seeded by `seed`.
    seed: the shuffle seed.
    num_epochs: passes over the split; None repeats forever.

  Returns:
    A tf.data.Dataset of FEATURES, `[N]` or `[M]` int32 each.
  """
  seqio = tasks.import_seqio()

  lengths = {k: int(task_feature_lengths[k]) for k in ('inputs', 'targets')}
  task = tasks.get_task(mixture_or_task_name)
  ds = task.get_dataset(sequence_length=lengths, split=split, shuffle=shuffle,
                        seed=seed, num_epochs=num_epochs,
                        trim_output_features=True)
  ds = seqio.EncDecFeatureConverter(pack=False)(ds, lengths)
  return ds.map(lambda ex: {k: ex[k] for k in FEATURES})


def task_train_batches(mixture_or_task_name: str,
                       task_feature_lengths: Mapping[str, int],
                       batch_size: int, seed: int, start_step: int = 0
                       ) -> Iterator[Batch]:
  """Endless shuffled training batches, from batch `start_step` on.

  Batch i is the same for every call with the same arguments (the order is
  seeded), so a resumed run skips the batches it has seen; skipping runs the
  input pipeline for them (tokenizing, no model work).

  Args:
    mixture_or_task_name: a registered seqio task.
    task_feature_lengths: {'inputs': N, 'targets': M}.
    batch_size: examples per batch.
    seed: shuffle seed.
    start_step: the first batch to yield.

  Yields:
    FEATURES as numpy `[batch_size, N or M]` int32 arrays.
  """
  ds = get_dataset(mixture_or_task_name, task_feature_lengths, 'train',
                   shuffle=True, seed=seed, num_epochs=None)
  ds = ds.batch(batch_size, drop_remainder=True).skip(start_step)
  yield from ds.prefetch(2).as_numpy_iterator()


def task_eval_batches(mixture_or_task_name: str,
                      task_feature_lengths: Mapping[str, int],
                      batch_size: int, num_examples: Optional[int] = None,
                      split: str = 'validation') -> List[Batch]:
  """The first `num_examples` of a split, in order, as full batches.

  The last batch is padded with all-zero rows (weight 0), so every batch has
  the training shape and the eval step compiles once.

  Args:
    mixture_or_task_name: a registered seqio task.
    task_feature_lengths: {'inputs': N, 'targets': M}.
    batch_size: rows per batch.
    num_examples: None for the whole split.
    split: the split to read.

  Returns:
    A list of FEATURES dicts of `[batch_size, N or M]` int32 arrays.
  """
  ds = get_dataset(mixture_or_task_name, task_feature_lengths, split,
                   shuffle=False, seed=None, num_epochs=1)
  if num_examples is not None:
    ds = ds.take(num_examples)
  batches = []
  for batch in ds.batch(batch_size).as_numpy_iterator():
    pad = batch_size - len(batch[FEATURES[0]])
    batches.append({k: np.pad(v, ((0, pad), (0, 0))) for k, v in
                    batch.items()})
  return batches
