"""The shipped models: they load like T5X checkpoints, corruption is named,
the right (trained, distilled) drafter is shipped, and the main job works.

The shipped folder is every new user's first contact with the project (the
README's first command runs on it) and the input of the device runs.
A corrupt or truncated file must give an error that names it, not different
weights; an untrained or wrong drafter must fail a test, not just lower a
speed-up nobody looks at.
"""

import os
import shutil

import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import drafters
from specdec_jax import measure
from specdec_jax import shipped
from specdec_jax.sampling import SamplingConfig

from conftest import loads_every_time

# Greedy alpha of the shipped dec2 drafter on the first 16 test inputs,
# measured when it was shipped: en_de 0.692, synopsis 0.628 (on 256 inputs:
# 0.708 / see results/drafters_alpha.md). The shipped small drafter gives
# 0.49 on the same en_de inputs, an untrained one ~0: the floors leave room
# for float differences between machines, not for another drafter.
ALPHA_FLOOR = {'en_de': 0.64, 'synopsis': 0.57}
DECODE_LEN = {'en_de': 64, 'synopsis': 32}


@pytest.fixture(scope='module')
def target():
  return shipped.load_model('target')


def test_shipped_folder_is_complete_and_small():
  assert shipped.available()
  assert shipped.model_names() == ['target', 'dec2', 'small']
  entries = shipped.manifest_entries(shipped.asset_dir())
  assert sum(e['bytes'] for e in entries.values()) <= 40e6
  assert shipped.verify() == len(entries)
  for task in shipped.TASKS:
    data = shipped.test_arrays(task)
    texts = shipped.test_texts(task)
    assert len(data['inputs']) == len(texts) >= 256
    # Pre-tokenized rows are the texts, with the T5 prefix, EOS-terminated.
    assert np.all(data['inputs'][:, 0] > 1)
    assert np.all((data['inputs'] == 1).sum(axis=1) == 1)


def test_shipped_models_load_as_t5x_checkpoints_in_bfloat16(target):
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  model, params = target
  raw = checkpoints.load_t5x_params(shipped.checkpoint_path('target'))
  assert {str(x.dtype) for x in _leaves(raw)} == {'bfloat16'}
  assert model.config.emb_dim == 256
  np.testing.assert_array_equal(
      np.asarray(params['decoder']['logits_dense']['kernel']),
      np.asarray(raw['decoder']['logits_dense']['kernel']).astype(np.float32))


def _leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.leaves(tree)


@pytest.fixture()
def copied(tmp_path, monkeypatch):
  dst = tmp_path / 'mini'
  shutil.copytree(shipped.asset_dir(), dst)
  monkeypatch.setenv('SPECDEC_ASSETS', str(dst))
  return dst


def _a_data_file(root, model):
  files = []
  for folder, _, names in os.walk(root / model):
    files += [os.path.join(folder, n) for n in names]
  return max(files, key=os.path.getsize)  # a tensor chunk, not metadata


def _cut_the_end(path, n_bytes):
  """Truncates `path` in place by its last `n_bytes`."""
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - n_bytes)


def _flip_a_byte(path):
  """Corrupts `path` in place without changing its size."""
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([byte[0] ^ 0xFF]))


def test_a_corrupt_shipped_file_is_named(copied):
  path = _a_data_file(copied, 'dec2')
  _flip_a_byte(path)
  with pytest.raises(shipped.ShippedAssetError, match='corrupt') as e:
    shipped.load_model('dec2')
  assert path in str(e.value)
  shipped.load_model('small')  # the other models are untouched


def test_a_truncated_or_missing_shipped_file_is_named(copied):
  path = _a_data_file(copied, 'target')
  _cut_the_end(path, 7)
  with pytest.raises(shipped.ShippedAssetError, match='truncated') as e:
    shipped.load_model('target')
  assert path in str(e.value)
  os.remove(copied / 'data' / 'sentencepiece.model')
  with pytest.raises(shipped.ShippedAssetError, match='missing: .*sentence'):
    shipped.sentencepiece_path()
  with pytest.raises(ValueError, match="No shipped model 'xxl'"):
    shipped.load_model('xxl')
  # A dtype no model takes is the argument's fault, not the asset's
  # (before: "int8: ... does not load", a ShippedAssetError).
  for dtype in ('int8', 'float99'):
    with pytest.raises(checks.InputError, match=(
        f"dtype must be a float dtype .*got '{dtype}'")):
      shipped.load_model('small', dtype=dtype)


def test_a_damaged_models_json_is_named(copied):
  """models.json says which model each name is: `index`, `config` and
  `load_model` check it against MANIFEST.json before using it. Cut short it
  is named (not a bare JSON error); edited as valid JSON (another drafter
  activation) it is named instead of loading a different model."""
  import json  # pylint: disable=g-import-not-at-top
  path = copied / shipped.MODELS
  original = path.read_bytes()
  path.write_bytes(original[:len(original) // 2])
  for call in (shipped.index, lambda: shipped.config('dec2'),
               lambda: shipped.load_model('dec2'), shipped.model_names):
    with pytest.raises(shipped.ShippedAssetError,
                       match='truncated or changed') as e:
      call()
    assert str(path) in str(e.value)

  edited = json.loads(original)
  config = edited['models']['dec2']['config']
  assert list(config['mlp_activations']) == ['gelu', 'linear']
  config['mlp_activations'] = ['relu', 'linear']
  text = json.dumps(edited, indent=1)
  path.write_text(text)
  for call in (lambda: shipped.config('dec2'),
               lambda: shipped.load_model('dec2'),
               lambda: shipped.resolve('shipped:dec2')):
    with pytest.raises(shipped.ShippedAssetError) as e:
      call()
    assert str(path) in str(e.value)
  # The same edit at the same size: the checksum names it.
  flipped = original.replace(b'"gelu"', b'"relu"', 1)
  assert len(flipped) == len(original) and flipped != original
  path.write_bytes(flipped)
  with pytest.raises(shipped.ShippedAssetError, match='corrupt') as e:
    shipped.load_model('dec2')
  assert str(path) in str(e.value)
  path.write_bytes(original)
  assert shipped.config('dec2').mlp_activations == ('gelu', 'linear')


def test_an_unlisted_or_unchecked_models_json_is_refused(copied):
  """Without the manifest, or with a manifest that does not list
  models.json, nothing shipped is loaded: the error names the file."""
  import json  # pylint: disable=g-import-not-at-top
  manifest = copied / shipped.MANIFEST
  entries = json.loads(manifest.read_text())
  del entries[shipped.MODELS]
  manifest.write_text(json.dumps(entries))
  with pytest.raises(shipped.ShippedAssetError, match='does not list') as e:
    shipped.config('target')
  assert str(copied / shipped.MODELS) in str(e.value)
  manifest.write_text('{"models.json": ')  # cut short
  with pytest.raises(shipped.ShippedAssetError, match='MANIFEST.json') as e:
    shipped.index()
  manifest.unlink()
  with pytest.raises(shipped.ShippedAssetError, match='MANIFEST.json'):
    shipped.load_model('small')


def test_the_manifest_covers_every_shipped_file(copied):
  """No shipped file is read unverified: a manifest missing the entry of a
  file that exists (here a heads checkpoint file) or listing a file that
  does not exist is a named error, for the method weights (checked by
  `resolve`) as for the models (checked while loading) and the folder as
  a whole (`verify`)."""
  import json  # pylint: disable=g-import-not-at-top
  manifest = copied / shipped.MANIFEST
  original = manifest.read_text()
  entries = json.loads(original)
  rel = sorted(r for r in entries if r.startswith('heads/en_de/'))[-1]
  del entries[rel]
  manifest.write_text(json.dumps(entries))
  for call in (lambda: shipped.resolve('shipped:heads/en_de'),
               shipped.verify):
    with pytest.raises(shipped.ShippedAssetError, match='not listed') as e:
      call()
    assert str(copied / rel) in str(e.value)
  shipped.resolve('shipped:heads/synopsis')  # the others are untouched

  entries = json.loads(original)
  rel = sorted(r for r in entries if r.startswith('dec2/'))[-1]
  del entries[rel]
  manifest.write_text(json.dumps(entries))
  with pytest.raises(shipped.ShippedAssetError, match='not listed') as e:
    shipped.load_model('dec2')
  assert str(copied / rel) in str(e.value)

  entries = json.loads(original)
  ghost = 'heads/en_de/checkpoint_3000/state/d/not-there'
  entries[ghost] = {'sha256': '0' * 64, 'bytes': 3}
  manifest.write_text(json.dumps(entries))
  with pytest.raises(shipped.ShippedAssetError, match='missing') as e:
    shipped.resolve('shipped:heads/en_de')
  assert str(copied / ghost) in str(e.value)


METHODS = ['heads/en_de', 'heads/synopsis', 'lookahead/en_de',
           'lookahead/synopsis']
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _files_under(folder):
  return {os.path.relpath(os.path.join(d, n), folder).replace(os.sep, '/')
          for d, _, names in os.walk(folder) for n in names}


def test_shipped_method_weights_resolve_to_listed_folders():
  """`shipped:heads/<task>` and `shipped:lookahead/<task>` name the method
  weights shipped beside the T5s: a checkpoint_<step> folder every file of
  which MANIFEST.json lists; the T5 list is unchanged."""
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  assert shipped.method_names() == METHODS
  assert shipped.model_names() == ['target', 'dec2', 'small']
  listed = shipped.manifest_entries(shipped.asset_dir())
  methods = shipped.index()['methods']
  for name in METHODS:
    path = shipped.resolve(shipped.SCHEME + name)
    entry = methods[name]
    kind, task = name.split('/')
    assert (entry['kind'], entry['task']) == (kind, task)
    assert entry['provenance']['produced_by']
    assert os.path.isabs(path) and os.path.isdir(path)
    assert path == os.path.join(shipped.asset_dir(), entry['checkpoint'])
    assert os.path.dirname(path) == os.path.join(shipped.asset_dir(), kind,
                                                 task)
    assert os.path.basename(path) == f'checkpoint_{entry["step"]}'
    files = _files_under(path)
    assert 'state/_METADATA' in files
    assert ('draft_head.json' in files) == (kind == 'heads')
    prefix = entry['checkpoint'] + '/'
    assert {prefix + f for f in files} == {
        rel for rel in listed if rel.startswith(prefix)}
    assert shipped.verify(prefix) == len(files)
    # Weights are shipped, not results: none left in results/.
    old = 'draft_heads' if kind == 'heads' else 'pass_embeddings'
    assert checkpoints.latest_checkpoint(
        os.path.join(ROOT, 'results', old, task)) is None
  for kind, folder in (('heads', 'heads'), ('lookahead', 'pass')):
    for task in shipped.TASKS:
      with open(os.path.join(ROOT, 'gin_configs', folder, f'{task}.gin')) as f:
        assert f"DRAFT_CHECKPOINT = 'shipped:{kind}/{task}'\n" in f.read()


def test_a_damaged_shipped_method_file_is_named(copied):
  """A truncated, corrupt or missing file of a method's weights is named by
  `resolve`, before any loader sees it; the other methods still resolve."""
  path = _a_data_file(copied, 'heads/en_de')
  _cut_the_end(path, 5)
  with pytest.raises(shipped.ShippedAssetError, match='truncated') as e:
    shipped.resolve('shipped:heads/en_de')
  assert path in str(e.value)

  path = _a_data_file(copied, 'lookahead/synopsis')
  _flip_a_byte(path)
  with pytest.raises(shipped.ShippedAssetError, match='corrupt') as e:
    shipped.resolve('shipped:lookahead/synopsis')
  assert path in str(e.value)

  path = str(copied / 'heads' / 'synopsis' / 'checkpoint_3000' /
             'draft_head.json')
  os.remove(path)
  with pytest.raises(shipped.ShippedAssetError, match='missing') as e:
    shipped.resolve('shipped:heads/synopsis')
  assert path in str(e.value)

  assert shipped.resolve('shipped:lookahead/en_de') == str(
      copied / 'lookahead' / 'en_de' / 'checkpoint_300')


def test_an_unknown_shipped_name_lists_the_known_ones():
  for name in ('shipped:heads/nope', 'shipped:lookahead', 'shipped:xxl'):
    with pytest.raises(FileNotFoundError) as e:
      shipped.resolve(name)
    message = str(e.value)
    assert repr(name[len(shipped.SCHEME):]) in message
    for known in shipped.model_names() + METHODS:
      assert known in message


def test_a_shipped_load_verifies_each_file_once(monkeypatch, caplog):
  """The job's path (`shipped:<model>` through loading.load_model) checks
  every file of the model once against MANIFEST.json (the shipped
  checkpoints have no manifest of their own), models.json too, and says
  nothing of unverified checkpoints."""
  from specdec_jax import loading  # pylint: disable=g-import-not-at-top
  from specdec_jax.checkpoints import manifest  # pylint: disable=g-import-not-at-top
  hashed = []
  real = manifest._size_and_sha256  # pylint: disable=protected-access

  def counting(path, *args):
    hashed.append(path)
    return real(path, *args)

  monkeypatch.setattr(manifest, '_size_and_sha256', counting)
  folder = shipped.checkpoint_path('small')
  files = [os.path.join(d, n) for d, _, names in os.walk(folder)
           for n in names]
  with caplog.at_level('INFO'), loads_every_time():
    loading.load_model(shipped.config('small'), 'shipped:small')
    shipped.load_model('small')
  models_json = os.path.join(shipped.asset_dir(), shipped.MODELS)
  assert models_json in hashed  # read, so checked, by both
  assert sorted(p for p in hashed if p != models_json) == sorted(
      files * 2)  # once per load
  assert 'not verified' not in caplog.text


@pytest.mark.parametrize('task', ['en_de', 'synopsis'])
def test_shipped_drafter_agrees_with_the_target(target, task):
  """Fails if an untrained, a wrong or a worse drafter is shipped as dec2."""
  model, params = target
  draft_model, draft_params = shipped.load_model('dec2')
  inputs = shipped.test_arrays(task)['inputs'][:16]
  res = measure.alpha(model, params, drafters.T5Drafter(draft_model),
                      draft_params, inputs,
                      sampling=SamplingConfig(temperature=0.0),
                      max_decode_len=DECODE_LEN[task])
  assert res['alpha'] >= ALPHA_FLOOR[task], res['alpha']


def test_main_job_refuses_bad_flags_before_making_a_folder(tmp_path, capsys):
  """A count below 1 is the parser's error (before: the job ran on no
  example and ended in a KeyError), and an unknown task among the tasks
  is refused before any task decodes or any run folder is made; a bad
  temperature or gin binding is one line, not a traceback."""
  from specdec_jax import demo  # pylint: disable=g-import-not-at-top
  for argv, message in (
      (['--num_examples', '0'], "--num_examples: an int >= 1 expected"),
      (['--tasks', 'en_de,de_en'],
       "error: unknown task 'de_en'; known: en_de"),
      (['--random', '--gamma', '0'], "--gamma: an int >= 1 expected"),
      (['--random', '--temperature', '-1'],
       'error: temperature must be a finite number >= 0'),
      (['--tasks', 'en_de', '--gin.GAMMA=0'],  # the eval job's line
       'error: gamma must be an int >= 1, got 0.'),
      (['--output_dir', 'gs://b/main'],  # read back with local files
       "--output_dir: a local path expected"),
      (['--output_dir', str(tmp_path / 'file')],  # before: gin's line too
       f"error: --output_dir '{tmp_path}/file' cannot be a folder: "
       f'{tmp_path}/file is a file.\n'),
      # Before: ignored by --random; passed to the eval job, whose usage
      # error came after a folder was made; a folder the job then did not
      # read its records from.
      (['--random', '--tasks', 'en_de'], '--tasks: flags of the main job'),
      (['--tasks', 'en_de', '--num_exmples', '1'], 'python -m '
       'specdec_jax.demo: error: unrecognized arguments: --num_exmples 1'),
      (['--tasks', 'en_de', "--gin.EVAL_OUTPUT_DIR='x'"], "error: \"EVAL_OUT"
       "PUT_DIR = 'x'\": the main job sets the folder and the examples "
       'itself (--output_dir, --num_examples)')):
    (tmp_path / 'file').write_text('')
    with pytest.raises(SystemExit) as e:
      demo.main(argv if argv[0] == '--random' else
                ['--output_dir', str(tmp_path)] + argv)
    assert message in f'{e.value.code}\n{capsys.readouterr().err}'
    (tmp_path / 'file').unlink()
  assert not list(tmp_path.iterdir())


# Run first in a subprocess: TensorFlow and seqio as if not installed (None
# in sys.modules: `import` raises ImportError, `importlib.util.find_spec`
# says absent, as etils' installed-check expects), so any import of them on
# the way fails the job.
_NO_TENSORFLOW = """
import sys
BLOCKED = ('tensorflow', 'tensorflow_text', 'tensorflow_datasets', 'seqio')
for name in BLOCKED:
  sys.modules[name] = None
"""


def test_main_job_translates_real_text_exactly_without_tensorflow(tmp_path):
  """The README's first command on two examples, as a user runs it, with
  seqio and TensorFlow blocked (their import takes ~10 s and prints CUDA /
  oneDNN lines): real German out, greedy speculative output identical to
  the baseline, metrics and the three speed lines printed, neither module
  imported nor any of their lines on stderr; a second run decodes again
  into a fresh folder, and --resume says that it continues the latest run.
  (One process for all three: each would compile the same loops.)"""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  main = f'demo.main(["--tasks", "en_de", "--num_examples", "2", ' \
         f'"--output_dir", {str(tmp_path)!r}'
  code = _NO_TENSORFLOW + (
      'import json\n'
      'from specdec_jax import demo\n'
      f'summary = {main}])["en_de"]\n'
      'print("summary:", json.dumps(summary))\n'
      'print("imported:", sorted(m for m in sys.modules if sys.modules[m] '
      'is not None and m.split(".")[0] in BLOCKED))\n'
      f'{main}])\n'
      'print("resumed:")\n'
      f'{main}, "--resume"])\n')
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  proc = subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path),
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert 'imported: []' in out
  for noise in ('cuInit', 'oneDNN', 'cuda drivers'):
    assert noise not in proc.stderr, proc.stderr[-3000:]
  summary = json.loads(out.split('summary: ', 1)[1].split('\n', 1)[0])
  assert summary['examples'] == 2 and summary['differing_examples'] == 0
  assert summary['status'] == 'complete'
  assert summary['alpha'] > 0.25  # 0.40 measured; untrained: ~0
  assert out.startswith('decoding into a fresh folder')
  assert 'Dieses Paket ist Teil der KDE Frameworks 5.' in out  # row 0
  assert 'greedy outputs identical: 2 of 2' in out
  # Tokens output per call (the mean accepted length also counts drafts
  # accepted past a row's end).
  calls = summary['target_calls_per_token']
  assert (f"{1 / calls:.2f} tokens per target call (gamma 4; mean accepted "
          f"length {summary['mean_accepted_length']:.2f})") in out, out
  assert 'measured here (cpu' in out
  assert 'predicted on nvidia-h100-80gb-hbm3 at T5 1.1-XXL target cost' in out
  assert 'measured on NVIDIA H100 80GB HBM3: 2.78x (dec2' in out
  runs = sorted(tmp_path.glob('run_*'))
  assert len(runs) == 2  # the second run: a fresh folder of its own
  for run in runs:
    for name in ('examples.jsonl', 'summary.json', 'summary.md',
                 'config.gin'):
      assert (run / 'en_de' / name).is_file()
  assert out.split('resumed:\n', 1)[1].startswith(
      f'resuming the latest run in {runs[1]}')
