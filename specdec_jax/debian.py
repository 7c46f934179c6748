"""The offline Debian tasks' data, built from apt's package lists.

Debian's package index ships English package descriptions and their German
translations; records align on `Description-md5`. `build` reads apt's
`*_i18n_Translation-{en,de}*` lists (`find_lists`), strips the description
markup, builds

  debian_desc_en_de: English -> German pairs: each aligned synopsis and, where
    both long descriptions have the same number of paragraphs, each paragraph;
  debian_synopsis: English long description -> its one-line synopsis;

deduplicates them, splits them 90/5/5 by a hash of each example's source text
(`split_for_key`: an example's split never changes when Debian updates, and a
text that occurs in several descriptions is in one split only), trains a
SentencePiece model on the train text of both tasks with T5's conventions
(pad=0, eos=1, unk=2, no bos), or takes a given one, and writes
`<out_dir>/<task>/<split>.jsonl` beside it: nothing before every split has
an example and the model is made. `tasks` reads what it writes (the task
names, splits and vocabulary file are its). The command line is
scripts/build_debian_data.py; neither TensorFlow nor seqio is needed.
"""

from __future__ import annotations

import bz2
import collections
import glob
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
import unicodedata
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import sentencepiece as spm
import tqdm

from specdec_jax import checks
from specdec_jax import tasks

MANIFEST_FILE = 'manifest.json'
# Cumulative percent thresholds of the hash buckets: train, validation, test.
SPLIT_PERCENT = (90, 95, 100)

# md5 -> (synopsis, [paragraph, ...]) for one language.
Descriptions = Dict[str, Tuple[str, List[str]]]


def clean_text(text: str) -> str:
  """NFKC-normalizes `text` and collapses all whitespace to single spaces."""
  return ' '.join(unicodedata.normalize('NFKC', text).split())


def split_for_key(key: str) -> str:
  """The fixed split of an example: a pure function of its key.

  Args:
    key: the example's source text (any string).

  Returns:
    'train', 'validation' or 'test' (90/5/5 in expectation), from the first
    8 bytes of the key's SHA-256, so it never depends on the other examples,
    on their order, on the Python hash seed or on the Debian release.
  """
  digest = hashlib.sha256(key.encode('utf-8')).digest()
  bucket = int.from_bytes(digest[:8], 'big') % 100
  for split, upper in zip(tasks.DEBIAN_SPLITS, SPLIT_PERCENT):
    if bucket < upper:
      return split
  raise AssertionError('unreachable')


def parse_long_description(lines: Iterable[str]) -> List[str]:
  """Strips Debian's description markup from the long-description lines.

  Debian policy 5.6.13: each line after the synopsis starts with a space; a
  line ` .` separates paragraphs; lines starting with two spaces are
  verbatim. We drop the leading space, split paragraphs at ` .`, join each
  paragraph's lines with single spaces (verbatim lines included) and drop
  empty paragraphs and paragraphs that are only '.'.

  Args:
    lines: the continuation lines, as in the file (leading space included).

  Returns:
    The cleaned paragraphs, in order.
  """
  paragraphs, current = [], []

  def flush():
    text = clean_text(' '.join(current))
    if text and text != '.':
      paragraphs.append(text)
    current.clear()

  for line in lines:
    body = line[1:] if line[:1] in (' ', '\t') else line
    if body.strip() == '.':
      flush()
    else:
      current.append(body)
  flush()
  return paragraphs


def read_list_file(path: str) -> str:
  """Returns the text of an apt list file, decompressing it as needed.

  gzip, xz and bzip2 are read with the standard library; lz4 and zstd (apt's
  usual choices) through `apt-helper cat-file`, else `lz4cat`/`zstdcat`.

  Args:
    path: a `*_i18n_Translation-*` file, plain or compressed.

  Returns:
    The decoded UTF-8 text.
  """
  openers = {'.gz': gzip.open, '.xz': lzma.open, '.lzma': lzma.open,
             '.bz2': bz2.open}
  ext = os.path.splitext(path)[1]
  if ext in openers:
    with openers[ext](path, 'rb') as f:
      return f.read().decode('utf-8')
  if ext in ('.lz4', '.zst'):
    tools = [['/usr/lib/apt/apt-helper', 'cat-file', path],
             ['lz4cat' if ext == '.lz4' else 'zstdcat', path]]
    for cmd in tools:
      if shutil.which(cmd[0]) or os.path.exists(cmd[0]):
        out = subprocess.run(cmd, check=True, capture_output=True).stdout
        return out.decode('utf-8')
    raise RuntimeError(f'cannot decompress {path}: need apt-helper or '
                       f'{tools[1][0]}')
  with open(path, 'rb') as f:
    return f.read().decode('utf-8')


def iter_records(text: str, desc: str = '') -> Iterator[Dict[str, List[str]]]:
  """Parses deb822 text into records {field: [first line, continuation...]}."""
  record: Dict[str, List[str]] = {}
  field = None
  for line in tqdm.tqdm(text.splitlines(), desc=desc, unit=' lines',
                        disable=not desc, mininterval=1.0):
    if not line.strip():
      if record:
        yield record
      record, field = {}, None
    elif line[0] in (' ', '\t'):
      if field is not None:
        record[field].append(line)
    else:
      field, _, value = line.partition(':')
      record[field] = [value.strip()]
  if record:
    yield record


def parse_translation_text(text: str, language: str,
                           desc: str = '') -> Descriptions:
  """Reads one Translation-<language> file's descriptions.

  Args:
    text: the file's text.
    language: 'en' or 'de' (selects the `Description-<language>` field).
    desc: a progress-bar label; empty hides the bar.

  Returns:
    md5 -> (cleaned synopsis, cleaned paragraphs); records without a
    Description-md5 or without that field are skipped.
  """
  out: Descriptions = {}
  for record in iter_records(text, desc):
    md5 = record.get('Description-md5', [''])[0]
    lines = record.get(f'Description-{language}')
    if not md5 or not lines:
      continue
    out.setdefault(md5, (clean_text(lines[0]),
                         parse_long_description(lines[1:])))
  return out


def file_sha256(path: str) -> str:
  """The SHA-256 of a file's bytes (as listed in apt's InRelease)."""
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def default_lists_dir() -> str:
  """apt's lists folder (`apt-config shell`), else /var/lib/apt/lists."""
  try:
    out = subprocess.run(['apt-config', 'shell', 'D', 'Dir::State::Lists/d'],
                         check=True, capture_output=True, text=True).stdout
    value = out.strip().partition('=')[2].strip("'\"")
    if value:
      return value
  except (OSError, subprocess.CalledProcessError):
    pass
  return '/var/lib/apt/lists'


def find_translation_files(lists_dir: str, language: str) -> List[str]:
  """The `*_i18n_Translation-<language>[.ext]` files in `lists_dir`, sorted."""
  files = glob.glob(os.path.join(lists_dir,
                                 f'*_i18n_Translation-{language}*'))
  suffixes = ('', '.gz', '.xz', '.lzma', '.bz2', '.lz4', '.zst')
  name = f'_i18n_Translation-{language}'
  return sorted(f for f in files if os.path.isfile(f) and any(
      f.endswith(name + s) for s in suffixes))


def read_descriptions(files: List[str], language: str,
                      progress: bool = True) -> Descriptions:
  """Merges the descriptions of several list files (first file wins)."""
  out: Descriptions = {}
  for path in files:
    desc = f'{os.path.basename(path)}' if progress else ''
    for md5, value in parse_translation_text(
        read_list_file(path), language, desc).items():
      out.setdefault(md5, value)
  return out


def build_examples(en: Descriptions, de: Descriptions
                   ) -> Dict[str, Dict[str, List[dict]]]:
  """Builds the deduplicated, split examples of both tasks.

  Args:
    en: md5 -> (synopsis, paragraphs) of the English descriptions.
    de: the same for the German translations (keys are English md5s).

  Returns:
    {task: {split: [record, ...]}}, records in md5 order. Translation records
    are {'id', 'en', 'de'}: the synopsis pair (id `<md5>:s`) and, when both
    sides have the same paragraph count, paragraph pairs (`<md5>:p<i>`);
    pairs with an empty side or identical sides are dropped; the first record
    of each English text is kept; the split key is the English text.
    Synopsis records are {'id', 'description', 'synopsis'} with the
    paragraphs joined by spaces, deduplicated on (description, synopsis),
    split on the description.
  """
  out = {t: {s: [] for s in tasks.DEBIAN_SPLITS}
         for t in (tasks.DEBIAN_TRANSLATION_TASK, tasks.DEBIAN_SYNOPSIS_TASK)}
  seen = set()
  for md5 in sorted(set(en) & set(de)):
    (en_syn, en_pars), (de_syn, de_pars) = en[md5], de[md5]
    pairs = [(f'{md5}:s', en_syn, de_syn)]
    if len(en_pars) == len(de_pars):
      pairs += [(f'{md5}:p{i}', e, d)
                for i, (e, d) in enumerate(zip(en_pars, de_pars))]
    for uid, e, d in pairs:
      if not e or not d or e == d or e in seen:
        continue
      seen.add(e)
      out[tasks.DEBIAN_TRANSLATION_TASK][split_for_key(e)].append(
          {'id': uid, 'en': e, 'de': d})
  seen = set()
  for md5 in sorted(en):
    synopsis, paragraphs = en[md5]
    description = ' '.join(paragraphs)
    if not synopsis or not description or (description, synopsis) in seen:
      continue
    seen.add((description, synopsis))
    out[tasks.DEBIAN_SYNOPSIS_TASK][split_for_key(description)].append(
        {'id': md5, 'description': description, 'synopsis': synopsis})
  return out


def write_examples(examples: Dict[str, Dict[str, List[dict]]], out_dir: str,
                   max_examples: Optional[int] = None) -> Dict[str, dict]:
  """Writes `out_dir/<task>/<split>.jsonl`; returns the counts written."""
  counts = {}
  for task, splits in examples.items():
    os.makedirs(os.path.join(out_dir, task), exist_ok=True)
    counts[task] = {}
    for split, records in splits.items():
      records = records[:max_examples] if max_examples else records
      with open(tasks.split_path(out_dir, task, split), 'w',
                encoding='utf-8') as f:
        for r in records:
          f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + '\n')
      counts[task][split] = len(records)
  return counts


def train_text(examples: Dict[str, Dict[str, List[dict]]]) -> List[str]:
  """The deduplicated train-split text of both tasks' records."""
  fields = {tasks.DEBIAN_TRANSLATION_TASK: ('en', 'de'),
            tasks.DEBIAN_SYNOPSIS_TASK: ('description', 'synopsis')}
  lines = {}
  for task, keys in fields.items():
    for record in examples[task]['train']:
      for k in keys:
        lines.setdefault(record[k], None)
  return list(lines)


def train_vocab(sentences: List[str], vocab_size: int,
                normalization: str = 'nmt_nfkc', num_threads: int = 2,
                seed: int = 0) -> bytes:
  """Trains the unigram SentencePiece model; returns its file's bytes.

  T5 conventions: pad=0, eos=1, unk=2, no bos; character coverage 1.0 (all
  German characters kept); sentences up to 8192 bytes (long descriptions).
  """
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()  # Not model_prefix: that stores out_dir in the model.
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model,
        vocab_size=vocab_size, model_type='unigram', character_coverage=1.0,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        normalization_rule_name=normalization, max_sentence_length=8192,
        input_sentence_size=0, num_threads=num_threads, minloglevel=2)
  except RuntimeError as e:  # a value it cannot use, said in one line
    raise checks.InputError(
        f'SentencePiece cannot train a vocabulary of {vocab_size} pieces '
        f'with normalization {normalization!r} on {len(sentences)} '
        f'texts: {e}'.replace('\n', ' ')) from None
  return model.getvalue()


def find_lists(lists_dir: Optional[str] = None,
               fetch: bool = False) -> Dict[str, List[str]]:
  """apt's Translation lists of both languages.

  Args:
    lists_dir: apt's lists folder (default: `default_lists_dir()`).
    fetch: run `tasks.APT_COMMAND` when a language has no list.

  Returns:
    {'en': [file, ...], 'de': [file, ...]}.

  Raises:
    FileNotFoundError: a language has no list; the message names the apt
      command that downloads them.
  """
  lists_dir = lists_dir or default_lists_dir()

  def find():
    return {lang: find_translation_files(lists_dir, lang)
            for lang in ('en', 'de')}

  files = find()
  if not all(files.values()) and fetch:
    print(f'Running: {tasks.APT_COMMAND}', file=sys.stderr)
    subprocess.run(tasks.APT_COMMAND.split(), check=True)
    files = find()
  if not all(files.values()):
    missing = [lang for lang, f in files.items() if not f]
    raise FileNotFoundError(
        f'No *_i18n_Translation-{{{",".join(missing)}}} files in '
        f'{lists_dir}. Download them (as root) with\n  {tasks.APT_COMMAND}\n'
        'or rerun scripts/build_debian_data.py with --fetch.')
  return files


# SentencePiece's built-in normalization rules (`normalization_rule_name`).
NORMALIZATIONS = ('nmt_nfkc', 'nfkc', 'nmt_nfkc_cf', 'nfkc_cf', 'identity')


def check_build(out_dir: str, vocab_file: Optional[str] = None,
                normalization: str = 'nmt_nfkc') -> None:
  """Raises InputError (or FileNotFoundError) where `build` could not
  finish: `out_dir` cannot be a local folder, `vocab_file` is not a
  SentencePiece model, or (a model to train) `normalization` is none of
  SentencePiece's rules. Checked before anything is read or written."""
  checks.check_local_folder('out_dir', out_dir)
  if vocab_file is None:
    if normalization not in NORMALIZATIONS:
      raise checks.InputError(
          f'normalization {normalization!r} is none of SentencePiece\'s '
          f'rules: {", ".join(NORMALIZATIONS)}.')
    return
  if not os.path.isfile(vocab_file):
    raise FileNotFoundError(f'No vocab_file {vocab_file!r}.')
  try:
    spm.SentencePieceProcessor(model_file=vocab_file)
  except (RuntimeError, OSError) as e:
    raise checks.InputError(f'vocab_file {vocab_file!r} is not a '
                            f'SentencePiece model: {e}') from None


def build(files: Dict[str, List[str]], out_dir: str, vocab_size: int = 8000,
          vocab_file: Optional[str] = None,
          max_examples: Optional[int] = None,
          normalization: str = 'nmt_nfkc',
          num_threads: int = 2) -> Dict[str, Any]:
  """Builds a Debian data dir from apt's lists; prints the counts.

  Args:
    files: the lists, as `find_lists` gives them.
    out_dir: the data dir to write (`tasks.resolve_data_dir` reads it).
    vocab_size: pieces of the SentencePiece model trained on the train text.
    vocab_file: copy this SentencePiece model instead of training one.
    max_examples: keep the first N examples per task and split.
    normalization: SentencePiece normalization rule of a trained model.
    num_threads: SentencePiece training threads.

  Returns:
    The manifest written to `out_dir/manifest.json`: counts, source files
    and their SHA-256, the vocabulary, the split rule.
  """
  check_build(out_dir, vocab_file, normalization)
  start = time.perf_counter()
  en = read_descriptions(files['en'], 'en')
  de = read_descriptions(files['de'], 'de')
  aligned = len(set(en) & set(de))
  print(f'descriptions: en {len(en)}, de {len(de)}, aligned {aligned}')
  examples = {task: {split: records[:max_examples] if max_examples else
                      records for split, records in splits.items()}
              for task, splits in build_examples(en, de).items()}
  empty = [f'{t} {s}' for t, splits in examples.items()
           for s, records in splits.items() if not records]
  if empty:  # a job on the split would find no example
    raise checks.InputError(
        f'the lists give no example for {", ".join(empty)} ({aligned} '
        'aligned descriptions): give apt\'s whole Translation lists '
        f'({tasks.APT_COMMAND}).')
  parse_s = time.perf_counter() - start
  vocab_start = time.perf_counter()
  vocab_path = os.path.join(out_dir, tasks.DEBIAN_VOCAB_FILE)
  if vocab_file:
    with open(vocab_file, 'rb') as f:
      model = f.read()
    vocab_size = spm.SentencePieceProcessor(
        model_proto=model).get_piece_size()
    vocab_source = {'copied_from': os.path.basename(vocab_file),
                    'sha256': hashlib.sha256(model).hexdigest()}
  else:
    sentences = train_text(examples)
    print(f'training SentencePiece (vocab {vocab_size}) on '
          f'{len(sentences)} train texts ...')
    model = train_vocab(sentences, vocab_size, normalization, num_threads)
    vocab_source = {'trained': True}
  vocab_s = time.perf_counter() - vocab_start
  # Nothing is written before here: a refusal leaves no half-built folder.
  os.makedirs(out_dir, exist_ok=True)
  counts = write_examples(examples, out_dir)
  with open(vocab_path, 'wb') as f:
    f.write(model)

  manifest = collections.OrderedDict(
      counts=counts, aligned_descriptions=aligned,
      descriptions={'en': len(en), 'de': len(de)},
      source_files={os.path.basename(f): file_sha256(f)
                    for f in files['en'] + files['de']},
      vocab={'file': tasks.DEBIAN_VOCAB_FILE, 'vocab_size': vocab_size,
             **vocab_source, 'model_type': 'unigram', 'pad_id': 0,
             'eos_id': 1, 'unk_id': 2, 'bos_id': -1,
             'character_coverage': 1.0, 'normalization': normalization},
      split={'key': 'sha256(source text)[:8] % 100',
             'percent': dict(zip(tasks.DEBIAN_SPLITS, SPLIT_PERCENT))},
      max_examples=max_examples)
  with open(os.path.join(out_dir, MANIFEST_FILE), 'w') as f:
    json.dump(manifest, f, indent=2)
    f.write('\n')
  for task, c in counts.items():
    print(f'{task}: ' + ', '.join(f'{s} {n}' for s, n in c.items())
          + f' (total {sum(c.values())})')
  print(f'wrote {out_dir} (vocab {vocab_path}); parse+write '
        f'{parse_s:.1f}s, SentencePiece {vocab_s:.1f}s, total '
        f'{time.perf_counter() - start:.1f}s')
  return manifest
