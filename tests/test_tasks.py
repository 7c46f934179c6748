"""Tests of the tasks (seqio and array), the Debian data build and metrics.

Reading seqio tasks imports TensorFlow (~7 s): the tests that need it take
the `seqio` fixture or import it in their body, so that collecting this file
(every xdist worker collects every file) costs no TensorFlow import;
specdec_jax.tasks itself imports neither (checked in a subprocess). The committed slice of real Debian data
in tests/testdata/debian is made by the build script (command in its
README.md).
"""

import filecmp
import gzip
import importlib
import importlib.util
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import types

import numpy as np
import pytest
import sentencepiece as spm

from command_line import run_script
from specdec_jax import data
from specdec_jax import debian
from specdec_jax import checks
from specdec_jax import tasks

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTDATA = ROOT / 'tests' / 'testdata' / 'debian'
DEBIAN = (tasks.DEBIAN_TRANSLATION_TASK, tasks.DEBIAN_SYNOPSIS_TASK)
PREFIX = {tasks.DEBIAN_TRANSLATION_TASK: 'translate English to German: ',
          tasks.DEBIAN_SYNOPSIS_TASK: 'summarize: '}
SOURCE_FIELD = {tasks.DEBIAN_TRANSLATION_TASK: 'en',
                tasks.DEBIAN_SYNOPSIS_TASK: 'description'}
TARGET_FIELD = {tasks.DEBIAN_TRANSLATION_TASK: 'de',
                tasks.DEBIAN_SYNOPSIS_TASK: 'synopsis'}

MD5_A = 'a' * 32
MD5_B = 'b' * 32
MD5_C = 'c' * 32
# Handwritten apt Translation files: a multi-paragraph description with a
# verbatim list, an empty paragraph and a duplicate record; one whose German
# paragraph count differs; one without a long description.
SAMPLE_EN = f"""Package: foo
Description-md5: {MD5_A}
Description-en: Foo tool for bars
 Foo converts bars into
 bazzes   quickly.
 .
 Features:
   * verbatim item one
   * item two
 .
 .
 Last paragraph.

Package: foo-data
Description-md5: {MD5_A}
Description-en: Foo tool for bars
 Foo converts bars into
 bazzes   quickly.
 .
 Features:
   * verbatim item one
   * item two
 .
 .
 Last paragraph.

Package: qux
Description-md5: {MD5_B}
Description-en: Qux library
 Qux does things.
 .
 More things.

Package: bare
Description-md5: {MD5_C}
Description-en: Only a synopsis
"""
SAMPLE_DE = f"""Package: foo
Description-md5: {MD5_A}
Description-de: Foo-Werkzeug für Bars
 Foo wandelt Bars schnell
 in Bazzes um.
 .
 Funktionen:
   * wörtlicher Punkt eins
   * Punkt zwei
 .
 Letzter Absatz.

Package: qux
Description-md5: {MD5_B}
Description-de: Qux-Bibliothek
 Qux macht Dinge. Und mehr.
"""


@pytest.fixture(scope='module')
def sample_lists(tmp_path_factory):
  """An apt lists folder holding the sample (German gzip-compressed)."""
  lists = tmp_path_factory.mktemp('lists')
  (lists / 'x_dists_y_main_i18n_Translation-en').write_text(
      SAMPLE_EN, encoding='utf-8')
  with gzip.open(lists / 'x_dists_y_main_i18n_Translation-de.gz', 'wb') as f:
    f.write(SAMPLE_DE.encode('utf-8'))
  return lists


@pytest.fixture(scope='module')
def seqio():
  """The seqio module, imported when a test first reads a task (as the
  package imports it)."""
  return tasks.import_seqio()


@pytest.fixture
def restore_registry():
  """Re-registers the tasks with the defaults after a test changed them."""
  yield
  tasks.register_tasks()


@pytest.fixture(scope='module')
def testdata_examples():
  """All validation examples of both Debian tasks, read through seqio."""
  out = {}
  for name in DEBIAN:
    task = tasks.make_task(name, data_dir=str(TESTDATA))
    ds = task.get_dataset(sequence_length=None, split='validation',
                          shuffle=False)
    out[name] = list(ds.as_numpy_iterator())
  return out


def read_jsonl(path):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def test_register_tasks_offline_and_idempotent(monkeypatch, tmp_path,
                                               restore_registry, seqio):
  """Registering (and re-importing) must not touch the network or any file.

  The T5 vocabulary lives on GCS and the TFDS data is absent here: if
  defining a task loaded either, importing tasks.py would fail or hang. With
  sockets blocked, nonexistent paths and a second import, all four tasks
  must still register, pointing at the requested paths.
  """
  def no_network(*args, **kwargs):
    raise OSError('network access during task registration')

  monkeypatch.setattr(socket.socket, 'connect', no_network)
  monkeypatch.setattr(socket, 'create_connection', no_network)
  monkeypatch.setattr(socket, 'getaddrinfo', no_network)
  importlib.reload(tasks)  # Importing twice re-registers without error.
  vocab = str(tmp_path / 'no_such_vocab.model')
  names = tasks.register_tasks(vocab_path=vocab,
                               data_dir=str(tmp_path / 'no_data'))
  assert set(names) == set(tasks.TASK_NAMES)
  assert set(tasks.TASK_NAMES) <= set(seqio.TaskRegistry.names())
  wmt = seqio.get_mixture_or_task(tasks.WMT_TASK)
  assert wmt.output_features['targets'].vocabulary.sentencepiece_model_file \
      == vocab
  assert wmt.output_features['targets'].vocabulary.extra_ids == 100
  assert wmt.source.tfds_dataset.name == 'wmt_t2t_translate/de-en:1.0.0'
  cnn = seqio.get_mixture_or_task(tasks.CNN_DM_TASK)
  assert cnn.source.tfds_dataset.name == 'cnn_dailymail:3.4.0'
  assert [f.__name__ for f in cnn.metric_fns] == ['rouge']
  assert [f.__name__ for f in wmt.metric_fns] == ['bleu']


def test_vocab_env_override(monkeypatch, restore_registry, seqio):
  """SPECDEC_VOCAB replaces T5's unreachable GCS vocabulary path."""
  monkeypatch.setenv(tasks.VOCAB_ENV, '/models/cc_all.32000.model')
  tasks.register_tasks()
  task = seqio.get_mixture_or_task(tasks.CNN_DM_TASK)
  assert (task.output_features['inputs'].vocabulary.sentencepiece_model_file
          == '/models/cc_all.32000.model')
  # A vocabulary file it cannot read (here none there; offline, T5's at
  # gs://) is said by name, not in TensorFlow's traceback.
  with pytest.raises(checks.InputError, match=(
      f'Task {tasks.CNN_DM_TASK}: its vocabulary cannot be read .*'
      '/models/cc_all.32000.model')):
    tasks.vocab_size(task)
  monkeypatch.delenv(tasks.VOCAB_ENV)
  tasks.register_tasks()
  task = seqio.get_mixture_or_task(tasks.CNN_DM_TASK)
  assert (task.output_features['inputs'].vocabulary.sentencepiece_model_file
          == tasks.DEFAULT_VOCAB_PATH)


@pytest.mark.parametrize('name', DEBIAN)
def test_debian_examples(name, testdata_examples):
  """Every record becomes an example with T5's prefix and EOS-ended ids.

  The model sees exactly these ids: a missing prefix, a dropped EOS (id 1)
  or a vocabulary that does not decode back to the text would silently
  change what the drafter and the target are trained and scored on.
  """
  records = read_jsonl(TESTDATA / name / 'validation.jsonl')
  examples = testdata_examples[name]
  assert len(examples) == len(records) > 0
  vocab = tasks.debian_vocabulary(str(TESTDATA))
  for record, ex in zip(records, examples):
    inputs = ex['inputs_pretokenized'].decode('utf-8')
    targets = ex['targets_pretokenized'].decode('utf-8')
    assert inputs == PREFIX[name] + record[SOURCE_FIELD[name]]
    assert targets == record[TARGET_FIELD[name]]
    for key in ('inputs', 'targets'):
      assert ex[key][-1] == 1 and 1 not in ex[key][:-1]
    assert vocab.decode(ex['targets'][:-1].tolist()) == targets


def test_vocabulary_round_trips_english_and_german():
  """The Debian vocabulary follows T5's ids and keeps umlauts (no unk)."""
  vocab = tasks.debian_vocabulary(str(TESTDATA))
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  manifest = json.loads((TESTDATA / 'manifest.json').read_text())
  assert vocab.vocab_size == manifest['vocab']['vocab_size']
  for text in ('This package contains the library for the program.',
               'Dieses Paket enthält die Bibliothek für größere Dateien.'):
    ids = vocab.encode(text)
    assert vocab.unk_id not in ids
    assert vocab.decode(ids) == text


def test_split_is_a_fixed_function_of_the_key():
  """Splits must never change, whatever Debian adds or removes.

  The split is a pure function of the example's key; the pinned values
  catch any change of the hash, and the fractions must be about 90/5/5.
  """
  assert debian.split_for_key('Foo tool for bars') == debian.split_for_key(
      'Foo tool for bars')
  pinned = {k: debian.split_for_key(k) for k in ('k0', 'k2', 'k7', 'k8')}
  assert pinned == {'k0': 'train', 'k2': 'validation', 'k7': 'validation',
                    'k8': 'test'}
  counts = {s: 0 for s in tasks.DEBIAN_SPLITS}
  for i in range(20000):
    counts[debian.split_for_key(f'key {i}')] += 1
  assert abs(counts['train'] / 20000 - 0.90) < 0.01
  assert abs(counts['validation'] / 20000 - 0.05) < 0.01
  assert abs(counts['test'] / 20000 - 0.05) < 0.01


def test_committed_testdata_respects_split():
  """Each committed record lies in the split its key hashes to."""
  for name in DEBIAN:
    for split in tasks.DEBIAN_SPLITS:
      for record in read_jsonl(TESTDATA / name / f'{split}.jsonl'):
        assert debian.split_for_key(record[SOURCE_FIELD[name]]) == split


def test_parse_debian_markup(sample_lists):
  """Markup is stripped: leading space, ' .' breaks, empty paragraphs."""
  en = debian.read_descriptions(
      debian.find_translation_files(str(sample_lists), 'en'), 'en',
      progress=False)
  de = debian.read_descriptions(
      debian.find_translation_files(str(sample_lists), 'de'), 'de',
      progress=False)
  assert en[MD5_A] == ('Foo tool for bars', [
      'Foo converts bars into bazzes quickly.',
      'Features: * verbatim item one * item two', 'Last paragraph.'])
  assert en[MD5_C] == ('Only a synopsis', [])
  assert de[MD5_A] == ('Foo-Werkzeug für Bars', [
      'Foo wandelt Bars schnell in Bazzes um.',
      'Funktionen: * wörtlicher Punkt eins * Punkt zwei',
      'Letzter Absatz.'])
  examples = debian.build_examples(en, de)
  pairs = [r for split in examples[tasks.DEBIAN_TRANSLATION_TASK].values()
           for r in split]
  # foo: synopsis + 3 paragraphs; qux: synopsis only (1 vs 2 paragraphs).
  assert sorted(r['id'] for r in pairs) == [
      f'{MD5_A}:p0', f'{MD5_A}:p1', f'{MD5_A}:p2', f'{MD5_A}:s', f'{MD5_B}:s']
  synopses = [r for split in examples[tasks.DEBIAN_SYNOPSIS_TASK].values()
              for r in split]
  assert sorted((r['id'], r['synopsis']) for r in synopses) == [
      (MD5_A, 'Foo tool for bars'), (MD5_B, 'Qux library')]
  qux = next(r for r in synopses if r['id'] == MD5_B)
  assert qux['description'] == 'Qux does things. More things.'


def test_build_is_deterministic(sample_lists, tmp_path):
  """Two builds from the same lists write byte-identical data files."""
  outs = []
  for i in range(2):
    out = tmp_path / f'out{i}'
    en = debian.read_descriptions(
        debian.find_translation_files(str(sample_lists), 'en'), 'en',
        progress=False)
    de = debian.read_descriptions(
        debian.find_translation_files(str(sample_lists), 'de'), 'de',
        progress=False)
    debian.write_examples(debian.build_examples(en, de), str(out))
    outs.append(out)
  for name in DEBIAN:
    for split in tasks.DEBIAN_SPLITS:
      a, b = (o / name / f'{split}.jsonl' for o in outs)
      assert filecmp.cmp(a, b, shallow=False)
  assert sum(len(read_jsonl(outs[0] / tasks.DEBIAN_TRANSLATION_TASK /
                            f'{s}.jsonl')) for s in tasks.DEBIAN_SPLITS) == 5


# scripts/build_debian_data.py refuses what it cannot build, in one line,
# before it writes anything (run as a command).
@pytest.mark.parametrize('flags,said', [
    (['--vocab_file', 'MISSING'], 'error: No vocab_file'),
    (['--out_dir', 'FILE/out'], 'error: out_dir'),
    (['--normalization', 'bogus'], "error: normalization 'bogus' is none"),
])
def test_build_refuses_in_one_line(tmp_path, flags, said):
  lists = tmp_path / 'lists'
  lists.mkdir()
  (lists / 'x_i18n_Translation-en').write_text(SAMPLE_EN, encoding='utf-8')
  with gzip.open(lists / 'x_i18n_Translation-de.gz', 'wb') as f:
    f.write(SAMPLE_DE.encode('utf-8'))
  (tmp_path / 'file').write_text('')
  flags = [f.replace('MISSING', str(tmp_path / 'missing.model')).replace(
      'FILE', str(tmp_path / 'file')) for f in flags]
  proc = run_script('build_debian_data', '--out_dir', str(tmp_path / 'out'),
                    '--lists_dir', str(lists), '--vocab_size', '20', *flags,
                    check=False)
  assert proc.returncode == 1, proc.stderr
  assert said in proc.stderr and 'Traceback' not in proc.stderr, proc.stderr
  assert not (tmp_path / 'out').exists()  # refused before anything is written


def _numbered_lists(folder, n):
  """apt lists of `n` made-up packages, each described in both languages."""
  folder.mkdir()
  for lang, words in (('en', 'Tool {} does thing number {}.'),
                      ('de', 'Werkzeug {} macht Ding Nummer {}.')):
    (folder / f'x_i18n_Translation-{lang}').write_text(''.join(
        f'Package: p{i}\nDescription-md5: {i:032x}\n'
        f'Description-{lang}: {words.split()[0]} {i}\n '
        f'{words.format(i, i)}\n\n' for i in range(n)), encoding='utf-8')
  return debian.find_lists(str(folder))


def test_a_build_writes_nothing_until_every_split_has_examples(tmp_path):
  """Lists too small to give each split an example are refused before
  anything is written (a job on an empty split finds nothing to decode;
  before, the folder was written and SentencePiece then failed); lists
  that fill them build the folder: every split's file holds the records
  counted, beside the vocabulary trained on the train split."""
  few = _numbered_lists(tmp_path / 'few', 4)
  with pytest.raises(checks.InputError, match=(
      r'no example for debian_desc_en_de validation, debian_synopsis '
      r'validation \(4 aligned')):
    debian.build(few, str(tmp_path / 'out'), vocab_size=60)
  assert not (tmp_path / 'out').exists()
  manifest = debian.build(_numbered_lists(tmp_path / 'many', 120),
                          str(tmp_path / 'out'), vocab_size=60)
  for task, counts in manifest['counts'].items():
    for split, n in counts.items():
      assert n == len(read_jsonl(tmp_path / 'out' / task / f'{split}.jsonl'))
      assert n > 0, (task, split)
  vocab = tmp_path / 'out' / tasks.DEBIAN_VOCAB_FILE
  assert spm.SentencePieceProcessor(model_file=str(vocab)).get_piece_size(
      ) == manifest['vocab']['vocab_size'] == 60


def test_build_checks_its_normalization_before_reading(tmp_path):
  """`debian.build` from Python refuses a rule SentencePiece lacks as the
  script does, before it reads the lists it is given (none here)."""
  with pytest.raises(checks.InputError, match="normalization 'bogus' is"):
    debian.build({}, str(tmp_path / 'out'), normalization='bogus')
  assert not (tmp_path / 'out').exists()


def test_build_without_lists_names_apt_command(tmp_path):
  """Without apt's lists the script says exactly how to download them."""
  proc = run_script('build_debian_data', '--out_dir', str(tmp_path / 'out'),
                    '--lists_dir', str(tmp_path), check=False)
  assert proc.returncode == 1
  assert tasks.APT_COMMAND in proc.stderr
  assert not (tmp_path / 'out').exists()


def test_metrics_scale_and_sentence_split():
  """BLEU and ROUGE are 0-100 (T5's scale): 100 identical, low unrelated.

  Reversing the sentence order keeps rougeLsum at 100 only if texts are
  split into sentences before scoring (what Lsum is defined on).
  """
  refs = ['the cat sat on the mat today .', 'a quick brown fox jumps high .']
  assert tasks.bleu(refs, refs)['bleu'] == pytest.approx(100.0)
  assert tasks.rouge(refs, refs) == pytest.approx(
      {'rouge1': 100.0, 'rouge2': 100.0, 'rougeLsum': 100.0})
  other = ['completely different words here now .',
           'nothing shared with those examples .']
  assert tasks.bleu(refs, other)['bleu'] < 5.0
  assert all(v < 20.0 for v in tasks.rouge(refs, other).values())
  summary = ['Foo makes bars. It is fast.']
  swapped = ['It is fast. Foo makes bars.']
  assert tasks.rouge(summary, swapped)['rougeLsum'] == pytest.approx(100.0)


def test_unknown_task_lists_known_names():
  """A typo in a task name gets the list of valid names, not a KeyError."""
  with pytest.raises(ValueError) as e:
    tasks.get_task('wmt_ende')
  for name in tasks.TASK_NAMES:
    assert name in str(e.value)
  assert tasks.get_task(tasks.DEBIAN_SYNOPSIS_TASK).name == \
      tasks.DEBIAN_SYNOPSIS_TASK


def test_missing_data_dir_names_build_command(tmp_path):
  """Reading an unbuilt data dir raises a plain error saying how to build.

  Both the data and the vocabulary (the eval job asks for its size first)
  must fail this way, not with a TensorFlow file-system traceback. A data
  dir in a bucket, read with local file operations, is refused as such
  (before: as a missing local folder 'gs:/...').
  """
  with pytest.raises(checks.InputError, match="Debian data dir 'gs://b/d': "
                     'a local folder expected'):
    tasks.resolve_data_dir('gs://b/d')
  missing = tmp_path / 'absent'
  task = tasks.make_task(tasks.DEBIAN_TRANSLATION_TASK, data_dir=str(missing))
  with pytest.raises(FileNotFoundError) as e:
    task.get_dataset(sequence_length=None, split='train', shuffle=False)
  with pytest.raises(FileNotFoundError) as e_vocab:
    _ = task.output_features['targets'].vocabulary.vocab_size
  for message in (str(e.value), str(e_vocab.value)):
    assert str(missing) in message
    assert f'build_debian_data.py --out_dir {missing}\n' in message
    assert tasks.DATA_DIR_ENV in message
    assert "data_dir 'shipped', split 'test'" in message
  # A split the package's own slices lack: the splits they hold, and the
  # build into the default dir, never into the package.
  with pytest.raises(FileNotFoundError) as e:
    tasks.read_debian_split(tasks.resolve_data_dir('shipped'),
                     tasks.DEBIAN_TRANSLATION_TASK, 'validation')
  message = str(e.value)
  assert "holds the splits ['test']" in message
  assert f'--out_dir {tasks.DEFAULT_DATA_DIR}' in message
  assert "data_dir 'shipped'" not in message


def test_tensorflow_is_imported_only_for_seqio_and_after_triton(tmp_path):
  """Jobs must start fast: importing the package, the tasks and the eval job
  imports neither seqio nor TensorFlow (only reading a seqio task does).
  When seqio comes in, an installed triton is imported before TensorFlow
  (a triton loaded after TensorFlow 2.20-2.21 segfaults): a stand-in
  triton notes whether TensorFlow was in when it was imported."""
  (tmp_path / 'triton').mkdir()
  (tmp_path / 'triton' / '__init__.py').write_text(
      'import sys\n'
      'print("triton after tensorflow:", "tensorflow" in sys.modules)\n')
  code = ('import sys, specdec_jax\n'
          'from specdec_jax import data, eval, loading, tasks\n'
          'bad = [m for m in ("tensorflow", "seqio") if m in sys.modules]\n'
          'assert not bad, f"imported: {bad}"\n'
          'tasks.import_seqio()\n'
          'assert "tensorflow" in sys.modules\n')
  proc = subprocess.run(
      [sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
      env={**os.environ, 'PYTHONPATH': f'{tmp_path}{os.pathsep}{ROOT}'},
      check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.splitlines() == ['triton after tensorflow: False']


def test_shipped_eval_task_reads_without_tensorflow():
  """The main job's task (gin_configs/shipped/, data_dir 'shipped') is an
  `ArrayTask`: its examples, vocabulary and both metrics work with seqio and
  TensorFlow never imported, and no CUDA / oneDNN line reaches stderr."""
  code = """
import sys
import types
from specdec_jax import data, gin_utils, loading, tasks
for gin_file in ('shipped/en_de.gin', 'shipped/synopsis.gin'):
  args = gin_utils.parse_flags(
      [f'--gin_file={gin_file}', "--gin.EVAL_OUTPUT_DIR='-'"], 'test')
  setup = loading.setup_from_flags(args)
  task = loading.load_task(setup)
  assert isinstance(task, tasks.ArrayTask), task
  rows = list(data.task_examples(task, setup.data.split,
                                 setup.data.task_feature_lengths, 3, True))
  vocab = task.output_features['targets'].vocabulary
  text = data.decode_text(vocab, task.vocabulary.encode(rows[0][3]) + [1],
                          64)
  assert text == rows[0][3], (text, rows[0][3])
  targets = [r[3] for r in rows]
  scores = data.task_metrics(task, targets, targets)
  print(gin_file, sorted(scores), [round(v, 6) for v in scores.values()])
bad = [m for m in ('tensorflow', 'seqio') if m in sys.modules]
assert not bad, f'imported: {bad}'
"""
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                        env={**os.environ, 'PYTHONPATH': str(ROOT)},
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "shipped/en_de.gin ['bleu'] [100.0]" in proc.stdout
  assert ("shipped/synopsis.gin ['rouge1', 'rouge2', 'rougeLsum'] "
          '[100.0, 100.0, 100.0]') in proc.stdout
  for noise in ('cuInit', 'oneDNN', 'cuda drivers'):
    assert noise not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize('name', DEBIAN)
def test_shipped_array_task_equals_the_seqio_task(name):
  """The eval job reads the shipped data without seqio; what it reads must be
  what the seqio task gives: every example's ids (cut at the lengths the
  jobs use) and texts, the vocabulary's size and decoding, the metrics."""
  from specdec_jax import data  # pylint: disable=g-import-not-at-top
  from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  array_task = tasks.array_task(name, 'shipped', 'test')
  seqio_task = tasks.make_task(name, data_dir=shipped.data_dir())
  assert isinstance(array_task, tasks.ArrayTask)
  assert tasks.array_task(name, 'shipped', 'train') is None  # none stored
  for length in (64, 128, 4096):
    lengths = {'inputs': length}
    got = list(data.task_examples(array_task, 'test', lengths, None, True))
    want = list(data.task_examples(seqio_task, 'test', lengths, None, True))
    assert len(got) == len(want) == 256
    assert got == want
  plain = array_task.output_features['targets'].vocabulary
  vocab = seqio_task.output_features['targets'].vocabulary
  assert (plain.vocab_size, plain.eos_id, plain.unk_id) == (
      vocab.vocab_size, vocab.eos_id, vocab.unk_id)
  rng = np.random.default_rng(0)
  for _ in range(100):  # ids past the model, EOS inside: as seqio decodes
    ids = rng.integers(0, vocab.vocab_size + 50, 30).tolist()
    ids[rng.integers(0, 30)] = 1 if rng.random() < 0.5 else ids[0]
    assert plain.decode(ids) == vocab.decode(ids)
  assert [f.__name__ for f in array_task.predict_metric_fns] == [
      f.__name__ for f in seqio_task.predict_metric_fns]


def test_array_task_rows_cut_to_their_width(tmp_path):
  """Stored rows trimmed to a width (as scripts/export_arrays.py trims) give
  the untrimmed seqio examples: a full row is tokenized again; a split
  without stored ids reads through seqio; a row count that disagrees with
  the texts is named."""
  from specdec_jax import arrays  # pylint: disable=g-import-not-at-top
  from specdec_jax import data  # pylint: disable=g-import-not-at-top
  name = tasks.DEBIAN_TRANSLATION_TASK
  shutil.copytree(TESTDATA, tmp_path / 'data')
  data_dir = str(tmp_path / 'data')
  seqio_task = tasks.make_task(name, data_dir=data_dir)
  want = list(data.split_examples(seqio_task, 'validation'))
  width = 24
  stored = {key: arrays.fit(np.stack([
      np.pad(ex[key][:width + 1], (0, max(0, width + 1 - len(ex[key]))))
      for ex in want]), width) for key in ('inputs', 'targets')}
  assert (stored['inputs'][:, -1] != 0).sum() > 10  # many rows were cut
  path = tasks.array_path(data_dir, name, 'validation')
  arrays.save(path, stored)
  task = tasks.array_task(name, data_dir, 'validation')
  got = list(data.split_examples(task, 'validation'))
  assert len(got) == len(want)
  for a, b in zip(got, want):
    for key in ('inputs', 'targets'):
      assert a[key] == b[key].tolist()
      assert a[key + '_pretokenized'] == b[key + '_pretokenized'].decode()
  # No stored train ids: read through the seqio task, as before.
  assert list(data.train_targets(task, 5)) == list(
      data.train_targets(seqio_task, 5))
  arrays.save(path, {k: v[:-1] for k, v in stored.items()})
  with pytest.raises(ValueError, match='validation.jsonl holds 100 records'):
    list(task.examples('validation'))


def test_rows_padded_and_batched_refuse_what_would_decode_wrongly():
  """A negative id would be kept as a token (before: padded as given), and
  a batch size of 0 is named (before: range()'s "arg 3 must not be
  zero")."""
  np.testing.assert_array_equal(data.pad_rows([[3, 1], [4]], 3),
                                [[3, 1, 0], [4, 0, 0]])
  with pytest.raises(checks.InputError, match=r'Row 1 holds a negative id'):
    data.pad_rows([[3, 1], [3, -1]], 4)
  with pytest.raises(checks.InputError, match='batch_size must be an int >= 1'):
    list(data.batches(np.ones((3, 2), np.int32), 0))


def test_a_metric_whose_package_is_missing_is_named_not_fatal(tmp_path):
  """On a machine without rouge-score (the GPU image) the eval job's
  summary of what it decoded is still written: the metric is left out and
  named (`metrics_not_computed`), the others computed; a caller that does
  not ask for the names gets the ImportError."""
  from specdec_jax import summary as summary_lib  # pylint: disable=g-import-not-at-top

  def rouge(targets, predictions):
    del targets, predictions
    raise ModuleNotFoundError("No module named 'rouge_score'",
                              name='rouge_score')

  task = types.SimpleNamespace(predict_metric_fns=[tasks.bleu, rouge])
  missing = {}
  text = 'the quick brown fox jumps over the lazy dog'
  scores = data.task_metrics(task, [text], [text], missing)
  assert scores == {'bleu': pytest.approx(100.0)}
  assert missing == {'rouge': 'rouge_score is not installed'}
  with pytest.raises(ImportError):
    data.task_metrics(task, ['a'], ['a'])
  record = dict(index=0, batch=0, example='x', input='i', target=text,
                baseline=text, speculative=text, baseline_length=3,
                speculative_length=3, identical=True, iterations=2,
                drafted=2, accepted=1, beta_sum=1.0, beta_count=2,
                baseline_batch_s=1.0, speculative_batch_s=0.5, gamma=1)
  summary = summary_lib.write(tmp_path, task, [record],
                              {'temperature': 0.0, 'gamma': 1}, {0}, None)
  assert summary['status'] == 'complete'
  assert summary['metrics_not_computed'] == missing
  assert summary['speculative_metrics'] == {'bleu': pytest.approx(100.0)}
