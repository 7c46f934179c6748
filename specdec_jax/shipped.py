"""The models and data the project ships: the embedded default of every job.

`specdec_jax/assets/mini/` holds, committed once (scripts/ship_models.py
writes it; its README says how it was produced and how to reproduce it; the
method weights under heads/ and lookahead/ come from scripts/train_heads.py
and scripts/train_pass.py, their models.json "methods" entries say how):

  models.json        "models": name -> role, T5Config fields, checkpoint
                     folder, provenance (training command, steps, measured
                     alpha); "methods": the trained weights of the methods
                     that draft with the target itself, '<kind>/<task>' ->
                     kind ('heads' / 'lookahead'), task, checkpoint folder,
                     provenance (training commands, log in results/)
  <name>/checkpoint_<step>/   T5X's orbax checkpoint layout, bfloat16
  heads/<task>/checkpoint_<step>/      self-drafting heads (draft_head.json,
                                       their own MANIFEST.json as written)
  lookahead/<task>/checkpoint_<step>/  PaSS look-ahead embeddings (same)
  data/                       a Debian data dir (scripts/build_debian_data.py
                              layout) holding only test slices:
    sentencepiece.model       the Debian tasks' vocabulary (8000 pieces)
    <task>/test.jsonl         the first rows of each task's test split
    arrays/<task>_test.npz    the same rows pre-tokenized: inputs (with the
                              T5 task prefix), targets (references), EOS = 1
  MANIFEST.json      sha256 and size of every file above

The eval job reads it as an ordinary data dir (`DataSpec.data_dir =
'shipped'`, see `tasks.resolve_data_dir`) and loads checkpoints named
`shipped:<model>` (`checkpoint_path`), so the main job is an ordinary gin
eval job (gin_configs/shipped/). The method weights are named
`shipped:heads/<task>` and `shipped:lookahead/<task>` (`method_names()`,
the DRAFT_CHECKPOINT of gin_configs/heads/ and gin_configs/pass/); `resolve`
checks every file of theirs against MANIFEST.json before it returns the
folder (a few MB; their loaders check them again against the checkpoint's
own manifest, array hashes included).

Loading goes through the same code as a real T5X checkpoint
(`checkpoints.load_t5x_params`), which checks the model's files against
MANIFEST.json (the manifest of a folder above the checkpoint: the shipped
checkpoints have none of their own) and names the file that is missing,
truncated or corrupt (orbax / tensorstore keep no checksums of their own);
`verify()` does the same for the data files. models.json is checked against
MANIFEST.json whenever it is read (`index`, so `config`, `load_model`,
`resolve`, ...): an edited one would load another model, a truncated one
is named, not reported as a bare JSON error. One manifest implementation,
`checkpoints.manifest`, serves both. Needs neither seqio nor TensorFlow nor
gin.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import network
from specdec_jax import task_table
from specdec_jax.checkpoints import manifest

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          'assets', 'mini')
MANIFEST = 'MANIFEST.json'  # == checkpoints.manifest.MANIFEST
MODELS = 'models.json'
# short task name -> the seqio task (and data folder) of its test slice
TASKS = {name: entry.task['shipped']
         for name, entry in task_table.TASKS.items()}
SCHEME = 'shipped:'



class ShippedAssetError(ValueError):
  """A shipped file is missing, truncated or corrupt (names the file)."""


def asset_dir() -> str:
  """The shipped folder (`SPECDEC_ASSETS` overrides it, e.g. for a copy)."""
  return os.environ.get('SPECDEC_ASSETS', ASSETS_DIR)


def available() -> bool:
  """Whether the shipped models are present."""
  return os.path.isfile(os.path.join(asset_dir(), MODELS))


def manifest_entries(root: str) -> Dict[str, Dict[str, Any]]:
  """`{relative path: {'sha256', 'bytes'}}` of every file under `root`."""
  return manifest.file_entries(root)


def write_manifest(root: str) -> str:
  """Writes `root/MANIFEST.json` for the files under `root`."""
  return manifest.write_json(os.path.join(root, MANIFEST),
                             manifest_entries(root))


def _manifest(root: Optional[str] = None):
  """The parsed shipped manifest (`checkpoints.manifest.Manifest`)."""
  path = os.path.join(root or asset_dir(), MANIFEST)
  if not os.path.isfile(path):
    raise ShippedAssetError(f'{path} is missing: the shipped models '
                            'cannot be checked.')
  try:
    return manifest.read(path)
  except ValueError as e:
    raise ShippedAssetError(f'Shipped manifest unreadable: {e}') from None


def verify(prefix: str = '', root: Optional[str] = None) -> int:
  """Checks the shipped files (those under `prefix`) against the manifest.

  Args:
    prefix: only files whose relative path starts with it (e.g. 'target/').
    root: the folder (default `asset_dir()`).

  Returns:
    How many files were checked.

  Raises:
    ShippedAssetError: naming every missing, truncated or corrupt file.
  """
  found = _manifest(root)
  problems = manifest.check_files(found.root, found.files, prefix)
  if problems:
    raise ShippedAssetError('Shipped file ' + '; '.join(problems) + '.')
  return sum(rel.startswith(prefix) for rel in found.files)


def _check_listed(path: str) -> None:
  """Raises unless the manifest lists the files of a checkpoint folder
  (which `load_t5x_params` then checks against it)."""
  prefix = os.path.relpath(path, asset_dir()).replace(os.sep, '/') + '/'
  if not any(rel.startswith(prefix) for rel in _manifest().files):
    raise ShippedAssetError(f'{MANIFEST} lists no file of {path}: the '
                            'shipped model cannot be checked.')


def verify_file(rel: str, root: Optional[str] = None) -> str:
  """Checks one shipped file against the manifest; returns its path.

  Args:
    rel: its path relative to the shipped folder, e.g. 'models.json'.
    root: the folder (default `asset_dir()`).

  Raises:
    ShippedAssetError: naming the file when the manifest does not list it
      or it is missing, truncated or corrupt.
  """
  found = _manifest(root)
  path = os.path.join(found.root, rel)
  entry = found.files.get(rel)
  if entry is None:
    raise ShippedAssetError(f'{found.path} does not list {path}: the shipped '
                            'file cannot be checked.')
  problems = manifest.check_files(found.root, {rel: entry}, complete=False)
  if problems:
    raise ShippedAssetError('Shipped file ' + '; '.join(problems) + '.')
  return path


def index() -> Dict[str, Any]:
  """The parsed models.json, checked against the shipped manifest first.

  Raises:
    FileNotFoundError: there is no models.json (nothing shipped).
    ShippedAssetError: models.json is truncated, edited or corrupt (named),
      or the manifest cannot be read.
  """
  path = os.path.join(asset_dir(), MODELS)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'No shipped models at {asset_dir()} ({path} missing); '
        'scripts/ship_models.py writes them.')
  verify_file(MODELS)  # Another models.json would load other models.
  try:
    with open(path, encoding='utf-8') as f:
      entries = json.load(f)
  except ValueError as e:
    raise ShippedAssetError(f'Shipped file {path} is not JSON ({e}).') from None
  if not isinstance(entries, dict) or not isinstance(
      entries.get('models'), dict):
    raise ShippedAssetError(f'Shipped file {path} has no "models" mapping.')
  return entries


def model_names() -> List[str]:
  """The shipped models, target first."""
  return list(index()['models'])


def method_names() -> List[str]:
  """The shipped method weights: '<kind>/<task>', e.g. 'heads/en_de'."""
  return list(index().get('methods', {}))


def _known() -> str:
  """The shipped names, for errors."""
  return (f'shipped models: {", ".join(model_names())}; shipped methods: '
          f'{", ".join(method_names()) or "none"}')


def t5_config(fields: Dict[str, Any], dtype: Any = 'float32'):
  """A `network.T5Config` from a models.json `config` entry (no dtype)."""
  fields = dict(fields)
  fields['mlp_activations'] = tuple(fields['mlp_activations'])
  return network.T5Config(dtype=dtype, **fields)


def config(name: str, dtype: Any = 'float32'):
  """The `network.T5Config` of a shipped model (models.json checked)."""
  models = index()['models']
  if name not in models:
    raise checks.InputError(f'No shipped model {name!r}; {_known()}.')
  try:
    return t5_config(models[name]['config'], dtype)
  except (KeyError, TypeError, ValueError) as e:
    raise ShippedAssetError(
        f'Shipped file {os.path.join(asset_dir(), MODELS)}: model {name!r} '
        f'has no valid config ({type(e).__name__}: {e}).') from None


def checkpoint_path(name: str) -> str:
  """The `checkpoint_<step>` folder of a shipped model or method."""
  entries = index()
  for section in ('models', 'methods'):
    if name in entries.get(section, {}):
      return os.path.join(asset_dir(), entries[section][name]['checkpoint'])
  raise KeyError(f'No shipped model or method {name!r}; {_known()}.')


def load_model(name: str, dtype: Any = None,
               check: bool = True) -> Tuple[Any, Any]:
  """A shipped model and its parameters.

  Args:
    name: e.g. 'target' or a drafter name from `model_names()`.
    dtype: parameter dtype after loading (default float32; the files are
      bfloat16). The model computes in float32 unless dtype is bfloat16.
    check: verify the model's files against the manifest (while loading).

  Returns:
    `(network.T5Model, params)`.

  Raises:
    ShippedAssetError: models.json or a file of the model is missing /
      truncated / corrupt (named), checked before anything is loaded.
  """
  if dtype is not None:  # an argument, not the asset: said as one
    network.check_float_dtype('dtype', dtype)
  dtype = jnp.float32 if dtype is None else jnp.dtype(dtype)
  cfg = config(name, dtype='bfloat16' if dtype == jnp.bfloat16 else
               'float32')
  path = checkpoint_path(name)
  if check:
    _check_listed(path)
  try:  # load_t5x_params checks the files against the shipped manifest.
    params = checkpoints.load_t5x_params(path, config=cfg, dtype=dtype,
                                         verify=check)
  except ValueError as e:  # CheckpointError included
    raise ShippedAssetError(f'Shipped model {name!r} at {path} does not '
                            f'load: {e}') from e
  return network.T5Model(cfg), params


def data_dir() -> str:
  """The shipped Debian data dir (test slices and vocabulary)."""
  return os.path.join(asset_dir(), 'data')


def resolve(checkpoint: str) -> str:
  """`shipped:<model>` or `shipped:<kind>/<task>` -> its checkpoint folder.

  For a model, checks that the manifest lists its files; `load_t5x_params`
  checks the files themselves against it when it loads them (once). For a
  method's weights (`method_names()`, e.g. 'heads/en_de'), whose loaders
  check them against the checkpoint's own manifest, every file is checked
  against the shipped manifest here too.

  Raises:
    FileNotFoundError: no such shipped name (the error lists them all).
    ShippedAssetError: a file is unlisted, missing, truncated or corrupt.
  """
  name = checkpoint[len(SCHEME):] if checkpoint.startswith(SCHEME) else \
      checkpoint
  name = name.strip('/')
  methods = method_names()
  if name not in model_names() and name not in methods:
    raise FileNotFoundError(f'No shipped model or method {name!r} '
                            f'({checkpoint}); {_known()}.')
  path = checkpoint_path(name)
  _check_listed(path)
  if name in methods:
    prefix = os.path.relpath(path, asset_dir()).replace(os.sep, '/') + '/'
    verify(prefix)
  return path


def test_arrays(task: str) -> Dict[str, np.ndarray]:
  """A task's shipped test slice: `{'inputs', 'targets'}` int32 arrays."""
  task_table.get(task)  # an unknown one: its InputError, naming them
  rel = f'data/arrays/{task}_test.npz'
  verify(rel)
  with np.load(os.path.join(asset_dir(), rel)) as f:
    return {k: f[k].astype(np.int32) for k in ('inputs', 'targets')}


def test_texts(task: str) -> List[Dict[str, str]]:
  """The same rows as text: `[{'source', 'reference'}, ...]`."""
  task_table.get(task)  # an unknown one: its InputError, naming them
  rel = f'data/{TASKS[task]}/test.jsonl'
  verify(rel)
  src, ref = (('en', 'de') if task == 'en_de' else
              ('description', 'synopsis'))
  with open(os.path.join(asset_dir(), rel), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [{'source': r[src], 'reference': r[ref]} for r in rows]


def sentencepiece_path() -> str:
  """The shipped SentencePiece model (the Debian tasks' vocabulary)."""
  verify('data/sentencepiece.model')
  return os.path.join(data_dir(), 'sentencepiece.model')
