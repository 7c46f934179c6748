"""seqio tasks: the paper's T5 tasks and their offline Debian stand-ins.

The paper (arXiv:2211.17192) evaluates T5 on WMT EnDe and CNN/DM; we define
those two tasks exactly as the T5 library does (t5/data/tasks.py):

  wmt_t2t_ende_v003   "translate English to German: <en>" -> "<de>", BLEU.
  cnn_dailymail_v002  "summarize: <article>" -> "<highlights>", ROUGE.

Neither TFDS data set nor T5's vocabulary (on GCS) can be reached from our
machines, so two offline tasks built from Debian's package descriptions stand
in for them (scripts/build_debian_data.py makes the data and vocabulary):

  debian_desc_en_de  "translate English to German: <en>" -> "<de>", BLEU.
  debian_synopsis    "summarize: <long description>" -> "<synopsis>", ROUGE.

Registering never reads data or vocabularies (both are loaded lazily), so
importing this module works offline; only reading a task's data does I/O. The
T5 vocabulary path can be overridden (`SPECDEC_VOCAB` or
`register_tasks(vocab_path=...)`), and the Debian data directory is
`SPECDEC_DATA_DIR` or `register_tasks(data_dir=...)`. This module imports
TensorFlow (through seqio); `import specdec_jax` does not import it.
"""

import functools
import json
import os
import re
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

from rouge_score import rouge_scorer
import sacrebleu
import seqio
import tensorflow as tf

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
# Written by scripts/build_debian_data.py: <data_dir>/<task>/<split>.jsonl.
DEBIAN_VOCAB_FILE = 'sentencepiece.model'
DEBIAN_SPLITS = ('train', 'validation', 'test')
BUILD_COMMAND = ('apt-get update -o Acquire::Languages=de,en && '
                 'python scripts/build_debian_data.py --out_dir {data_dir}')

_LANGUAGE_NAMES = {'en': 'English', 'de': 'German', 'fr': 'French',
                   'ro': 'Romanian'}
_ROUGE_KEYS = ('rouge1', 'rouge2', 'rougeLsum')


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


# ---------------------------------------------------------- preprocessors ---
@seqio.map_over_dataset
def translate(x: Mapping[str, tf.Tensor], source_language: str,
              target_language: str) -> Dict[str, tf.Tensor]:
  """T5's `translate`: 'translate English to German: <src>' -> '<tgt>'."""
  prefix = (f'translate {_LANGUAGE_NAMES[source_language]} to '
            f'{_LANGUAGE_NAMES[target_language]}: ')
  return {'inputs': tf.strings.join([prefix, x[source_language]]),
          'targets': x[target_language]}


@seqio.map_over_dataset
def summarize(x: Mapping[str, tf.Tensor], article_key: str,
              summary_key: str) -> Dict[str, tf.Tensor]:
  """T5's `summarize`: 'summarize: <article>' -> '<summary>'."""
  return {'inputs': tf.strings.join(['summarize:', x[article_key]],
                                    separator=' '),
          'targets': x[summary_key]}


# ------------------------------------------------------ vocabularies, data ---
def t5_vocabulary(vocab_path: Optional[str] = None
                  ) -> seqio.SentencePieceVocabulary:
  """T5's vocabulary (lazy: nothing is read until it is used).

  Args:
    vocab_path: a copy of cc_all.32000/sentencepiece.model; default
      `$SPECDEC_VOCAB`, else T5's GCS path.

  Returns:
    The vocabulary with T5's 100 extra ids.
  """
  path = vocab_path or os.environ.get(VOCAB_ENV) or DEFAULT_VOCAB_PATH
  return seqio.SentencePieceVocabulary(path, extra_ids=DEFAULT_EXTRA_IDS)


def resolve_data_dir(data_dir: Optional[str] = None) -> str:
  """`data_dir`, else `$SPECDEC_DATA_DIR`, else ~/.cache/specdec_jax/debian.

  'shipped' names the test slices shipped with the package
  (`shipped.data_dir()`: the first rows of each test split and the
  vocabulary; no data build needed).
  """
  path = data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
  if path == 'shipped':
    from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
    return shipped.data_dir()
  return os.path.abspath(os.path.expanduser(path))


def _missing_data_error(data_dir: str, path: str) -> FileNotFoundError:
  """The error for a missing Debian file: names the dir and the build."""
  return FileNotFoundError(
      f'Debian task data not found: {path} is missing (data dir {data_dir}, '
      f'from data_dir= or ${DATA_DIR_ENV}). Build it with:\n  '
      + BUILD_COMMAND.format(data_dir=data_dir))


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
      raise _missing_data_error(self._data_dir, self.sentencepiece_model_file)
    return super()._model_context()


def debian_vocabulary(data_dir: Optional[str] = None) -> DebianVocabulary:
  """The Debian data's SentencePiece model (lazy; no extra ids)."""
  return DebianVocabulary(resolve_data_dir(data_dir))


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
  path = os.path.join(data_dir, task, f'{split}.jsonl')
  if not os.path.isfile(path):
    raise _missing_data_error(data_dir, path)
  columns: Dict[str, list] = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      for key, value in json.loads(line).items():
        columns.setdefault(key, []).append(value)
  return columns


def _debian_source(task: str, fields: Tuple[str, ...],
                   data_dir: str) -> seqio.FunctionDataSource:
  """A source reading the task's JSONL split files when a split is read."""

  def dataset_fn(split: str, shuffle_files: bool,
                 seed: Optional[int] = None) -> tf.data.Dataset:
    del shuffle_files, seed  # One file per split; seqio shuffles examples.
    columns = read_debian_split(data_dir, task, split)
    return tf.data.Dataset.from_tensor_slices(
        {k: tf.constant(columns.get(k, []), tf.string) for k in fields})

  return seqio.FunctionDataSource(dataset_fn, splits=DEBIAN_SPLITS)


def _output_features(vocab: seqio.Vocabulary) -> Dict[str, seqio.Feature]:
  """T5's DEFAULT_OUTPUT_FEATURES with `vocab`."""
  return {'inputs': seqio.Feature(vocab, add_eos=True, required=False),
          'targets': seqio.Feature(vocab, add_eos=True)}


def _pipeline(preprocessor: Callable[..., tf.data.Dataset]) -> list:
  """T5's preprocessing: task format, tokenize, cache point, append EOS."""
  return [preprocessor, seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim]


def _task_specs(vocab_path: Optional[str], data_dir: Optional[str],
                debian_vocab_path: Optional[str]) -> Dict[str, dict]:
  """TaskRegistry.add keyword arguments of our four tasks, by name."""
  t5_features = _output_features(t5_vocabulary(vocab_path))
  data_dir = resolve_data_dir(data_dir)
  debian_vocab = (seqio.SentencePieceVocabulary(debian_vocab_path)
                  if debian_vocab_path else debian_vocabulary(data_dir))
  debian_features = _output_features(debian_vocab)
  en_de = functools.partial(translate, source_language='en',
                            target_language='de')
  return {
      WMT_TASK: dict(
          source=seqio.TfdsDataSource(
              tfds_name='wmt_t2t_translate/de-en:1.0.0'),
          preprocessors=_pipeline(en_de), output_features=t5_features,
          metric_fns=[bleu]),
      # T5 pins cnn_dailymail:3.1.0, which current TFDS can no longer build;
      # 3.4.0 has the same article/highlights text plus id/publisher fields.
      CNN_DM_TASK: dict(
          source=seqio.TfdsDataSource(tfds_name='cnn_dailymail:3.4.0'),
          preprocessors=_pipeline(functools.partial(
              summarize, article_key='article', summary_key='highlights')),
          output_features=t5_features, metric_fns=[rouge]),
      DEBIAN_TRANSLATION_TASK: dict(
          source=_debian_source(DEBIAN_TRANSLATION_TASK, ('en', 'de'),
                                data_dir),
          preprocessors=_pipeline(en_de), output_features=debian_features,
          metric_fns=[bleu]),
      DEBIAN_SYNOPSIS_TASK: dict(
          source=_debian_source(DEBIAN_SYNOPSIS_TASK,
                                ('description', 'synopsis'), data_dir),
          preprocessors=_pipeline(functools.partial(
              summarize, article_key='description', summary_key='synopsis')),
          output_features=debian_features, metric_fns=[rouge]),
  }


def make_task(name: str, vocab_path: Optional[str] = None,
              data_dir: Optional[str] = None,
              debian_vocab_path: Optional[str] = None) -> seqio.Task:
  """Builds one of our tasks without registering it (see `register_tasks`)."""
  specs = _task_specs(vocab_path, data_dir, debian_vocab_path)
  if name not in specs:
    raise ValueError(f'Unknown task {name!r}; known tasks: '
                     + ', '.join(TASK_NAMES))
  return seqio.Task(name, **specs[name])


def register_tasks(vocab_path: Optional[str] = None,
                   data_dir: Optional[str] = None,
                   debian_vocab_path: Optional[str] = None
                   ) -> Tuple[str, ...]:
  """(Re-)registers the four tasks in seqio.TaskRegistry; reads nothing.

  Safe to call repeatedly: existing registrations of these names are
  replaced, so a call with new paths takes effect. Runs on import with the
  defaults.

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
  return TASK_NAMES


def get_task(name: str) -> seqio.Task:
  """A registered seqio task by name.

  Args:
    name: e.g. one of TASK_NAMES.

  Returns:
    The seqio.Task.

  Raises:
    ValueError: for an unknown name, listing the known tasks.
  """
  known = set(seqio.TaskRegistry.names()) | set(
      seqio.MixtureRegistry.names())
  if name not in known:
    others = sorted(set(known) - set(TASK_NAMES))
    raise ValueError(
        f'Unknown task {name!r}. Known tasks: {", ".join(TASK_NAMES)}'
        + (f' (and other registered seqio tasks: {", ".join(others)})'
           if others else ''))
  return seqio.get_mixture_or_task(name)


register_tasks()
