"""Tasks: the paper's T5 tasks, their offline Debian stand-ins, BLEU / ROUGE.

The paper (arXiv:2211.17192) evaluates T5 on WMT EnDe and CNN/DM; we define
those two tasks exactly as the T5 library does (t5/data/tasks.py):

  wmt_t2t_ende_v003   "translate English to German: <en>" -> "<de>", BLEU.
  cnn_dailymail_v002  "summarize: <article>" -> "<highlights>", ROUGE.

Neither TFDS data set nor T5's vocabulary (on GCS) can be reached from our
machines, so two offline tasks built from Debian's package descriptions stand
in for them (`debian.build`, scripts/build_debian_data.py, makes the data and
vocabulary):

  debian_desc_en_de  "translate English to German: <en>" -> "<de>", BLEU.
  debian_synopsis    "summarize: <long description>" -> "<synopsis>", ROUGE.

All four are seqio tasks (`register_tasks`, `get_task`, `make_task`).
Importing this module imports neither seqio nor TensorFlow: `register_tasks`
puts the tasks in seqio's registry (`get_task` calls it with the defaults on
first use); registering reads no data and no vocabulary, so it works
offline.

A Debian data dir may also store a split's token ids as its seqio pipeline
made them (`arrays/<en_de|synopsis>_<split>.npz`: the shipped test slices,
`shipped.data_dir()`). `array_task` then gives an `ArrayTask`: the same
examples, texts, vocabulary and metrics without seqio or TensorFlow (the eval
job's task for the shipped data). The T5 vocabulary path can be overridden
(`SPECDEC_VOCAB` or `register_tasks(vocab_path=...)`), and the Debian data
directory is `SPECDEC_DATA_DIR` or `register_tasks(data_dir=...)`.
"""

import functools
import importlib.util
import json
import logging
import os
import re
import sys
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

from specdec_jax import checks

WMT_TASK = 'wmt_t2t_ende_v003'
CNN_DM_TASK = 'cnn_dailymail_v002'
DEBIAN_TRANSLATION_TASK = 'debian_desc_en_de'
DEBIAN_SYNOPSIS_TASK = 'debian_synopsis'
TASK_NAMES = (WMT_TASK, CNN_DM_TASK, DEBIAN_TRANSLATION_TASK,
              DEBIAN_SYNOPSIS_TASK)
# The multi-task mixture of the two Debian tasks (the shipped target's).
DEBIAN_MIXTURE = 'debian_multitask'

# T5's default vocabulary (t5.data.DEFAULT_SPM_PATH, DEFAULT_EXTRA_IDS).
DEFAULT_VOCAB_PATH = 'gs://t5-data/vocabs/cc_all.32000/sentencepiece.model'
DEFAULT_EXTRA_IDS = 100
VOCAB_ENV = 'SPECDEC_VOCAB'

DATA_DIR_ENV = 'SPECDEC_DATA_DIR'
DEFAULT_DATA_DIR = os.path.join('~', '.cache', 'specdec_jax', 'debian')
# Written by `debian.build` (scripts/build_debian_data.py):
# <data_dir>/<task>/<split>.jsonl.
DEBIAN_VOCAB_FILE = 'sentencepiece.model'
DEBIAN_SPLITS = ('train', 'validation', 'test')
# Downloads apt's German and English package lists (`debian.find_lists`).
APT_COMMAND = 'apt-get update -o Acquire::Languages=de,en'
BUILD_COMMAND = (APT_COMMAND + ' && python scripts/build_debian_data.py '
                 '--out_dir {data_dir}')

_LANGUAGE_NAMES = {'en': 'English', 'de': 'German', 'fr': 'French',
                   'ro': 'Romanian'}
_ROUGE_KEYS = ('rouge1', 'rouge2', 'rougeLsum')

# Where a Debian data dir stores a split's token ids (`ArrayTask`), by task.
ARRAY_NAMES = {DEBIAN_TRANSLATION_TASK: 'en_de',
               DEBIAN_SYNOPSIS_TASK: 'synopsis'}
ARRAYS_DIR = 'arrays'
EOS_ID = 1


# ---------------------------------------------------------------- metrics ---
def bleu(targets: Sequence[str], predictions: Sequence[str]
         ) -> Dict[str, float]:
  """Corpus BLEU (0-100) with T5's sacrebleu settings (t5.evaluation.metrics).

  Args:
    targets: one reference string per example.
    predictions: one decoded string per example.

  Returns:
    {'bleu': score}; identical corpora score 100.
  """
  import sacrebleu  # pylint: disable=g-import-not-at-top

  if len(targets) != len(predictions):
    raise ValueError(f'{len(targets)} targets vs {len(predictions)} '
                     'predictions')
  score = sacrebleu.corpus_bleu(
      list(predictions), [list(targets)], smooth_method='exp',
      smooth_value=0.0, force=False, lowercase=False, tokenize='intl',
      use_effective_order=False)
  return {'bleu': score.score}


def _split_sentences(text: str) -> str:
  """One sentence per line, as rougeLsum expects (T5 splits at ' . ')."""
  return re.sub(r'(?<=[.!?])\s+', '\n', text.strip())


def rouge(targets: Sequence[str], predictions: Sequence[str]
          ) -> Dict[str, float]:
  """ROUGE-1/2/Lsum F-measures (0-100, T5's scale), averaged over examples.

  Uses rouge-score's default tokenizer (lower-cased ASCII words, no stemmer)
  as T5 does; for rougeLsum each text is split into sentences first
  (newline-joined). Unlike T5 we report the plain mean, not the bootstrap
  median, so the result is deterministic.

  Args:
    targets: one reference string per example.
    predictions: one decoded string per example.

  Returns:
    {'rouge1', 'rouge2', 'rougeLsum'}: identical texts score 100.
  """
  # rouge-score imports nltk (~2 s): only when a summary is scored.
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top

  if len(targets) != len(predictions):
    raise ValueError(f'{len(targets)} targets vs {len(predictions)} '
                     'predictions')
  scorer = rouge_scorer.RougeScorer(list(_ROUGE_KEYS))
  totals = dict.fromkeys(_ROUGE_KEYS, 0.0)
  for target, prediction in zip(targets, predictions):
    scores = scorer.score(_split_sentences(target),
                          _split_sentences(prediction))
    for key in _ROUGE_KEYS:
      totals[key] += scores[key].fmeasure
  n = max(len(targets), 1)
  return {key: 100.0 * total / n for key, total in totals.items()}


# ---------------------------------------------------------------- formats ---
def translate_prefix(source_language: str, target_language: str) -> str:
  """T5's `translate` prefix, e.g. 'translate English to German: '."""
  return (f'translate {_LANGUAGE_NAMES[source_language]} to '
          f'{_LANGUAGE_NAMES[target_language]}: ')


SUMMARIZE_PREFIX = 'summarize: '  # T5's `summarize`: 'summarize:' + ' ' + x

# The Debian tasks' records -> (input text, target text): (prefix, source
# field, target field). The seqio preprocessors below make the same texts.
DEBIAN_FORMATS = {
    DEBIAN_TRANSLATION_TASK: (translate_prefix('en', 'de'), 'en', 'de'),
    DEBIAN_SYNOPSIS_TASK: (SUMMARIZE_PREFIX, 'description', 'synopsis'),
}


def _translate(x, source_language: str, target_language: str):
  """T5's `translate`: 'translate English to German: <src>' -> '<tgt>'."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  prefix = translate_prefix(source_language, target_language)
  return {'inputs': tf.strings.join([prefix, x[source_language]]),
          'targets': x[target_language]}


def _summarize(x, article_key: str, summary_key: str):
  """T5's `summarize`: 'summarize: <article>' -> '<summary>'."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {'inputs': tf.strings.join([SUMMARIZE_PREFIX.rstrip(' '),
                                     x[article_key]], separator=' '),
          'targets': x[summary_key]}


def import_seqio():
  """seqio, which imports TensorFlow: every seqio import of the package.

  Where triton (torch's GPU compiler, which transformers' T5 imports) is
  installed, it is imported first: TensorFlow 2.20 and 2.21's wheels load
  their LLVM into the process's global symbols, and a triton (3.7 and
  later) loaded after them segfaults in its initializers
  (https://github.com/tensorflow/tensorflow/issues/124205). Loaded first,
  triton binds its own LLVM and both work. Nothing is reordered once
  TensorFlow is in (triton would crash).
  """
  if ('tensorflow' not in sys.modules
      and importlib.util.find_spec('triton') is not None):
    import triton  # pylint: disable=g-import-not-at-top,unused-import
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio


# ------------------------------------------------------ vocabularies, data ---
def t5_vocabulary(vocab_path: Optional[str] = None):
  """T5's vocabulary (lazy: nothing is read until it is used).

  Args:
    vocab_path: a copy of cc_all.32000/sentencepiece.model; default
      `$SPECDEC_VOCAB`, else T5's GCS path.

  Returns:
    The seqio.SentencePieceVocabulary with T5's 100 extra ids.
  """
  seqio = import_seqio()
  path = vocab_path or os.environ.get(VOCAB_ENV) or DEFAULT_VOCAB_PATH
  return seqio.SentencePieceVocabulary(path, extra_ids=DEFAULT_EXTRA_IDS)


def vocab_size(task) -> int:
  """The size of `task`'s output vocabulary. A seqio task reads its file
  through TensorFlow's file system (gs:// too): one it cannot read (no
  network, no such file) is an InputError naming the task and why, not
  TensorFlow's traceback."""
  vocab = task.output_features['targets'].vocabulary
  if isinstance(task, ArrayTask):
    return vocab.vocab_size
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (seqio's)
  try:
    return vocab.vocab_size
  except tf.errors.OpError as e:
    raise checks.InputError(
        f'Task {task.name}: its vocabulary cannot be read '
        f'({type(e).__name__}: {e.message}). Without network, copy the '
        f'file here (T5\'s: ${VOCAB_ENV} names the copy).') from None


def resolve_data_dir(data_dir: Optional[str] = None) -> str:
  """`data_dir`, else `$SPECDEC_DATA_DIR`, else ~/.cache/specdec_jax/debian.

  'shipped' names the test slices shipped with the package
  (`shipped.data_dir()`: the first rows of each test split, their token ids
  and the vocabulary; no data build needed).
  """
  path = data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
  if path == 'shipped':
    from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
    return shipped.data_dir()
  if checks.is_url(path):  # read with local file operations
    raise checks.InputError(
        f'Debian data dir {path!r}: a local folder expected (copy it from '
        'the bucket, or export the tasks as arrays, which may be read from '
        'gs://: scripts/export_arrays.py).')
  return os.path.abspath(os.path.expanduser(path))


def _missing_data_error(data_dir: str, path: str) -> FileNotFoundError:
  """The error for a missing Debian file: names the dir, the splits its
  task folder holds, and the build (into the default dir where the dir is
  the package's own slices, which only a split of theirs can come from)."""
  from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  folder = os.path.dirname(path)
  held = sorted(n[:-len('.jsonl')] for n in os.listdir(folder)
                if n.endswith('.jsonl')) if os.path.isdir(folder) else []
  has = f'; {folder} holds the splits {held}' if held else ''
  ours = os.path.abspath(data_dir) == os.path.abspath(shipped.data_dir())
  build = BUILD_COMMAND.format(
      data_dir=DEFAULT_DATA_DIR if ours else data_dir)
  return FileNotFoundError(
      f'Debian task data not found: {path} is missing (data dir {data_dir}, '
      f'from data_dir= or ${DATA_DIR_ENV}{has}). '
      + ('The slices this package ships hold only those; build the whole '
         'data into the default data dir (read where data_dir is None) '
         'with:\n  ' if ours else
         'Build it with:\n  ') + build
      + ('' if ours else "\nor decode the slices this package ships (each "
         "task's first test rows): data_dir 'shipped', split 'test'."))


@functools.lru_cache(maxsize=None)
def _debian_vocabulary_class():
  """seqio's SentencePieceVocabulary with the missing-file error (built when
  seqio is first needed)."""
  seqio = import_seqio()

  class DebianVocabulary(seqio.SentencePieceVocabulary):
    """The data dir's SentencePiece model (lazy, no extra ids).

    When the model is first needed and the file is missing, raises the
    FileNotFoundError that names the build command, not a TensorFlow error.
    """

    def __init__(self, data_dir: str):
      self._data_dir = data_dir
      super().__init__(os.path.join(data_dir, DEBIAN_VOCAB_FILE))

    def _model_context(self):
      if getattr(self, '_model', None) is None and not os.path.isfile(
          self.sentencepiece_model_file):
        raise _missing_data_error(self._data_dir,
                                  self.sentencepiece_model_file)
      return super()._model_context()

  return DebianVocabulary


def debian_vocabulary(data_dir: Optional[str] = None):
  """The Debian data's SentencePiece model as a seqio vocabulary (lazy; no
  extra ids). `PlainVocabulary` is the same without seqio."""
  return _debian_vocabulary_class()(resolve_data_dir(data_dir))


def split_path(data_dir: str, task: str, split: str) -> str:
  """Where a Debian data dir stores a task's split: its records."""
  return os.path.join(data_dir, task, f'{split}.jsonl')


def source_files(task, data_dir: Optional[str] = None,
                 splits: Sequence[str] = ()) -> Dict[str, str]:
  """The files a task reads that decide its tokens: {label: path}.

  Its vocabularies' SentencePiece models ('vocabulary', or '<feature>
  vocabulary' where the features' differ), and for a Debian task the files
  of each of `splits` (the records, '<split> split', and the token ids a
  data dir stores, '<split> ids'), where they exist. A task read from
  elsewhere (TFDS) has no split files here: its name carries its version.

  Args:
    task: a seqio task or an `ArrayTask`.
    data_dir: the Debian data dir it was registered from (an `ArrayTask`
      knows its own); None: `resolve_data_dir`'s default.
    splits: the splits whose files to list.
  """
  seqio = sys.modules.get('seqio')  # a seqio task has imported it
  kinds = (PlainVocabulary,) + ((seqio.SentencePieceVocabulary,)
                                if seqio is not None else ())
  vocabs = {name: feature.vocabulary.sentencepiece_model_file
            for name, feature in task.output_features.items()
            if isinstance(feature.vocabulary, kinds)}
  files = ({'vocabulary': next(iter(vocabs.values()))}
           if len(set(vocabs.values())) == 1 else
           {f'{name} vocabulary': path for name, path in vocabs.items()})
  if task.name not in DEBIAN_FORMATS:
    return files
  root = (task.data_dir if isinstance(task, ArrayTask)
          else resolve_data_dir(data_dir))
  for split in splits:
    for label, path in ((f'{split} split', split_path(root, task.name, split)),
                        (f'{split} ids', array_path(root, task.name, split))):
      if os.path.isfile(path):
        files[label] = path
  return files


def read_debian_split(data_dir: str, task: str, split: str
                      ) -> Dict[str, list]:
  """Reads `<data_dir>/<task>/<split>.jsonl` into columns of strings.

  Args:
    data_dir: a directory written by scripts/build_debian_data.py.
    task: DEBIAN_TRANSLATION_TASK or DEBIAN_SYNOPSIS_TASK.
    split: 'train', 'validation' or 'test'.

  Returns:
    {field: [value per record]}.

  Raises:
    FileNotFoundError: naming the directory and the build command, when the
      split's file is missing.
  """
  path = split_path(data_dir, task, split)
  if not os.path.isfile(path):
    raise _missing_data_error(data_dir, path)
  columns: Dict[str, list] = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      for key, value in json.loads(line).items():
        columns.setdefault(key, []).append(value)
  return columns


# ------------------------------------------ Debian tasks without seqio ---
class PlainVocabulary:
  """A SentencePiece model read with the sentencepiece package alone.

  Encodes and decodes as `seqio.SentencePieceVocabulary` without extra ids
  does (`decode` stops after EOS and reads ids past the model as unknown),
  loading the model on first use; a missing file raises the
  FileNotFoundError that names the data build.
  """

  pad_id = 0
  extra_ids = 0

  def __init__(self, path: str, data_dir: Optional[str] = None):
    self.sentencepiece_model_file = path
    self._data_dir = data_dir or os.path.dirname(path)
    self._processor = None

  @property
  def tokenizer(self):
    """The `sentencepiece.SentencePieceProcessor`."""
    if self._processor is None:
      if not os.path.isfile(self.sentencepiece_model_file):
        raise _missing_data_error(self._data_dir,
                                  self.sentencepiece_model_file)
      import sentencepiece  # pylint: disable=g-import-not-at-top
      self._processor = sentencepiece.SentencePieceProcessor(
          model_file=self.sentencepiece_model_file)
    return self._processor

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.GetPieceSize()

  @property
  def eos_id(self) -> int:
    return self.tokenizer.eos_id()

  @property
  def unk_id(self) -> int:
    return self.tokenizer.unk_id()

  def encode(self, text: str) -> List[int]:
    """Token ids of `text`, without EOS."""
    return list(self.tokenizer.EncodeAsIds(text))

  def decode(self, ids) -> str:
    """The text of `ids` up to the first EOS (seqio's `decode`)."""
    size, unk, eos = self.vocab_size, self.unk_id, self.eos_id
    ids = [unk if int(i) >= size else int(i) for i in ids]
    if eos in ids:
      ids = ids[:ids.index(eos) + 1]
    return self.tokenizer.DecodeIds(ids)


class Feature:
  """What `seqio.Feature` offers the jobs: its vocabulary."""

  def __init__(self, vocabulary):
    self.vocabulary = vocabulary


def array_path(data_dir: str, name: str, split: str) -> str:
  """Where a data dir stores the token ids of a Debian task's split."""
  return os.path.join(data_dir, ARRAYS_DIR, f'{ARRAY_NAMES[name]}_{split}.npz')


class ArrayTask:
  """A Debian task of a data dir that stores its token ids: no seqio.

  The examples of a split whose ids the data dir stores
  (`arrays/<en_de|synopsis>_<split>.npz`, written from the seqio task:
  EOS-terminated, 0-padded, trimmed to a width keeping EOS) are the seqio
  task's examples (`get_dataset(sequence_length=None)`: untrimmed ids), read
  without seqio or TensorFlow: texts from `<task>/<split>.jsonl` formatted as
  the seqio preprocessors format them, ids from the arrays. A row stored at
  full width may have been trimmed: its ids are the text tokenized with the
  sentencepiece package, which agrees with seqio's tokenizer except on rare
  exact score ties (a warning names a row whose stored ids it does not
  reproduce; beyond the stored width such a tie goes unnoticed).
  Splits without stored ids are read through the seqio task (imported
  then). Offers what the jobs use of a seqio task: `name`,
  `output_features[...].vocabulary` (a `PlainVocabulary`),
  `predict_metric_fns`, and `examples(split)`.
  """

  def __init__(self, name: str, data_dir: str):
    if name not in DEBIAN_FORMATS:
      raise checks.InputError(f'No array task {name!r}; Debian tasks: '
                              + ', '.join(DEBIAN_FORMATS))
    self.name = name
    self.data_dir = data_dir
    vocab = PlainVocabulary(os.path.join(data_dir, DEBIAN_VOCAB_FILE),
                            data_dir)
    self.output_features = {'inputs': Feature(vocab),
                            'targets': Feature(vocab)}
    self.metric_fns = [bleu] if name == DEBIAN_TRANSLATION_TASK else [rouge]

  @property
  def splits(self) -> Tuple[str, ...]:
    """The splits of the task (a seqio task's `splits`), not necessarily
    all in its data dir: reading one that is not raises
    FileNotFoundError."""
    return DEBIAN_SPLITS

  @property
  def predict_metric_fns(self) -> List[Callable[..., Dict[str, float]]]:
    return self.metric_fns

  @property
  def vocabulary(self) -> PlainVocabulary:
    return self.output_features['targets'].vocabulary

  def has_arrays(self, split: str) -> bool:
    return os.path.isfile(array_path(self.data_dir, self.name, split))

  def texts(self, split: str) -> List[Tuple[str, str]]:
    """(input text, target text) of every record of a split."""
    prefix, source, target = DEBIAN_FORMATS[self.name]
    columns = read_debian_split(self.data_dir, self.name, split)
    return [(prefix + s, t) for s, t in zip(columns.get(source, []),
                                             columns.get(target, []))]

  def examples(self, split: str) -> Iterator[Dict[str, Any]]:
    """Yields the split's examples: 'inputs' and 'targets' (EOS-terminated
    id lists), 'inputs_pretokenized' and 'targets_pretokenized' (str)."""
    if not self.has_arrays(split):
      yield from self._seqio_examples(split)
      return
    import numpy as np  # pylint: disable=g-import-not-at-top
    path = array_path(self.data_dir, self.name, split)
    texts = self.texts(split)
    with np.load(path, allow_pickle=False) as f:
      stored = {key: f[key] for key in ('inputs', 'targets')}
    for key, rows in stored.items():
      if len(rows) != len(texts):
        raise checks.InputError(
            f'{path} holds {len(rows)} rows of {key} but '
            f'{split_path(self.data_dir, self.name, split)} '
            f'holds {len(texts)} records.')
    for i, text in enumerate(texts):
      example = {}
      for key, value in zip(('inputs', 'targets'), text):
        example[key] = self._ids(stored[key][i], value, path, key, i)
        example[key + '_pretokenized'] = value
      yield example

  def _ids(self, row, text: str, path: str, key: str, index: int
           ) -> List[int]:
    """A row's ids: the stored ones, or tokenized here if it may be cut."""
    stored = [int(t) for t in row]
    while stored and stored[-1] == 0:
      stored.pop()
    if len(stored) < len(row):
      return stored  # Padded, so whole.
    ids = self.vocabulary.encode(text) + [EOS_ID]
    if ids[:len(stored) - 1] != stored[:-1]:
      logging.warning(
          'row %d of %s (%s): SentencePiece here tokenizes the text other '
          'than the stored ids (a tie between two segmentations); using the '
          'tokenization here.', index, path, key)
    return ids

  def _seqio_examples(self, split: str) -> Iterator[Dict[str, Any]]:
    """A split without stored ids, read through the seqio task."""
    path = split_path(self.data_dir, self.name, split)
    if not os.path.isfile(path):  # Say so without importing TensorFlow.
      raise _missing_data_error(self.data_dir, path)
    task = make_task(self.name, data_dir=self.data_dir)
    ds = task.get_dataset(sequence_length=None, split=split, shuffle=False,
                          trim_output_features=False)
    yield from ds.as_numpy_iterator()


def array_task(name: str, data_dir: Optional[str], split: str
               ) -> Optional[ArrayTask]:
  """The `ArrayTask` of a Debian task whose `split` has stored ids in
  `data_dir` (e.g. 'shipped', test split), else None (use the seqio task).

  The shipped data dir's files are checked against the shipped manifest.

  Raises:
    ShippedAssetError: a shipped data file is missing or damaged.
  """
  if name not in ARRAY_NAMES:
    return None
  path = resolve_data_dir(data_dir)
  if not os.path.isfile(array_path(path, name, split)):
    return None
  from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  if os.path.abspath(path) == os.path.abspath(shipped.data_dir()):
    shipped.verify('data/')
  return ArrayTask(name, path)


# ----------------------------------------------------------- seqio tasks ---
def _debian_source(task: str, fields: Tuple[str, ...], data_dir: str):
  """A seqio source reading the task's JSONL split files when read."""
  seqio = import_seqio()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def dataset_fn(split: str, shuffle_files: bool,
                 seed: Optional[int] = None) -> tf.data.Dataset:
    del shuffle_files, seed  # One file per split; seqio shuffles examples.
    columns = read_debian_split(data_dir, task, split)
    return tf.data.Dataset.from_tensor_slices(
        {k: tf.constant(columns.get(k, []), tf.string) for k in fields})

  return seqio.FunctionDataSource(dataset_fn, splits=DEBIAN_SPLITS)


def _output_features(vocab) -> Dict[str, Any]:
  """T5's DEFAULT_OUTPUT_FEATURES with `vocab`."""
  seqio = import_seqio()
  return {'inputs': seqio.Feature(vocab, add_eos=True, required=False),
          'targets': seqio.Feature(vocab, add_eos=True)}


def _pipeline(preprocessor: Callable[..., Any], **kwargs) -> list:
  """T5's preprocessing: task format, tokenize, cache point, append EOS."""
  seqio = import_seqio()
  return [functools.partial(seqio.map_over_dataset(preprocessor), **kwargs),
          seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim]


def _task_specs(vocab_path: Optional[str], data_dir: Optional[str],
                debian_vocab_path: Optional[str]) -> Dict[str, dict]:
  """TaskRegistry.add keyword arguments of our four tasks, by name."""
  seqio = import_seqio()

  t5_features = _output_features(t5_vocabulary(vocab_path))
  data_dir = resolve_data_dir(data_dir)
  debian_vocab = (seqio.SentencePieceVocabulary(debian_vocab_path)
                  if debian_vocab_path else debian_vocabulary(data_dir))
  debian_features = _output_features(debian_vocab)
  en_de = dict(source_language='en', target_language='de')
  return {
      WMT_TASK: dict(
          source=seqio.TfdsDataSource(
              tfds_name='wmt_t2t_translate/de-en:1.0.0'),
          preprocessors=_pipeline(_translate, **en_de),
          output_features=t5_features, metric_fns=[bleu]),
      # T5 pins cnn_dailymail:3.1.0, which current TFDS can no longer build;
      # 3.4.0 has the same article/highlights text plus id/publisher fields.
      CNN_DM_TASK: dict(
          source=seqio.TfdsDataSource(tfds_name='cnn_dailymail:3.4.0'),
          preprocessors=_pipeline(_summarize, article_key='article',
                                  summary_key='highlights'),
          output_features=t5_features, metric_fns=[rouge]),
      DEBIAN_TRANSLATION_TASK: dict(
          source=_debian_source(DEBIAN_TRANSLATION_TASK, ('en', 'de'),
                                data_dir),
          preprocessors=_pipeline(_translate, **en_de),
          output_features=debian_features, metric_fns=[bleu]),
      DEBIAN_SYNOPSIS_TASK: dict(
          source=_debian_source(DEBIAN_SYNOPSIS_TASK,
                                ('description', 'synopsis'), data_dir),
          preprocessors=_pipeline(_summarize, article_key='description',
                                  summary_key='synopsis'),
          output_features=debian_features, metric_fns=[rouge]),
  }


def make_task(name: str, vocab_path: Optional[str] = None,
              data_dir: Optional[str] = None,
              debian_vocab_path: Optional[str] = None):
  """Builds one of our seqio tasks without registering it (see
  `register_tasks`)."""
  seqio = import_seqio()
  specs = _task_specs(vocab_path, data_dir, debian_vocab_path)
  if name not in specs:
    raise checks.InputError(f'Unknown task {name!r}; known tasks: '
                            + ', '.join(TASK_NAMES))
  return seqio.Task(name, **specs[name])


# Whether our tasks are in seqio's registry (`register_tasks` has run).
_REGISTERED = [False]


def register_tasks(vocab_path: Optional[str] = None,
                   data_dir: Optional[str] = None,
                   debian_vocab_path: Optional[str] = None
                   ) -> Tuple[str, ...]:
  """(Re-)registers the four tasks in seqio.TaskRegistry; reads nothing.

  Safe to call repeatedly: existing registrations of these names are
  replaced, so a call with new paths takes effect. `get_task` calls it with
  the defaults when nothing registered them yet.

  Args:
    vocab_path: T5 vocabulary for the WMT and CNN/DM tasks; default
      `$SPECDEC_VOCAB`, else gs://t5-data/vocabs/cc_all.32000.
    data_dir: Debian data directory; default `$SPECDEC_DATA_DIR`, else
      ~/.cache/specdec_jax/debian.
    debian_vocab_path: vocabulary of the Debian tasks; default the data
      directory's sentencepiece.model.

  Returns:
    The registered task names (the mixture DEBIAN_MIXTURE is registered too).
  """
  seqio = import_seqio()
  for name, spec in _task_specs(vocab_path, data_dir,
                                debian_vocab_path).items():
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, **spec)
  # One multi-task model for both Debian tasks, like T5's own mixtures: the
  # task is named by the input's prefix; sampled by number of examples.
  seqio.MixtureRegistry.remove(DEBIAN_MIXTURE)
  seqio.MixtureRegistry.add(
      DEBIAN_MIXTURE, [DEBIAN_TRANSLATION_TASK, DEBIAN_SYNOPSIS_TASK],
      default_rate=seqio.mixing_rate_num_examples)
  _REGISTERED[0] = True
  return TASK_NAMES


def get_task(name: str):
  """A registered seqio task (or mixture) by name.

  Registers our tasks with the defaults first if nothing registered them.

  Args:
    name: e.g. one of TASK_NAMES.

  Returns:
    The seqio.Task.

  Raises:
    ValueError: for an unknown name, listing the known tasks.
  """
  seqio = import_seqio()
  if not _REGISTERED[0]:
    register_tasks()
  known = set(seqio.TaskRegistry.names()) | set(
      seqio.MixtureRegistry.names())
  if name not in known:
    others = sorted(set(known) - set(TASK_NAMES))
    raise checks.InputError(
        f'Unknown task {name!r}. Known tasks: {", ".join(TASK_NAMES)}'
        + (f' (and other registered seqio tasks: {", ".join(others)})'
           if others else ''))
  return seqio.get_mixture_or_task(name)
