"""The model sets a spec runs on, as the eval job's setups.

Three model sets: `MiniSetup` ('mini'), the mini models trained here
(gin_configs/train/, `scripts/train.py`) in
`<models_dir>/<task>_mini_<size>/checkpoint_<step>`; `ShippedSetup`
('shipped'), the package's own models; `PaperSetup` ('paper'), real T5X
checkpoints of T5 1.1 XXL / small / base / large through the paper's gin
files, for a TPU / GPU. Each task's gin file is `task_table`'s. A setup
names the eval job's flags for a (task, drafter) pair (`flags`: also the
command that reruns a cell, `eval_flags` / `shell_command`); `eval_setup`
turns them into the job's typed `loading.EvalSetup`. This module also
holds `predict_at_xxl_cost`: a row's PREDICTED speed-up at T5-XXL target
cost on a measured hardware profile, through `hardware.predict`.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Dict, Optional, Sequence, Tuple


from specdec_jax import checkpoints
from specdec_jax import drafters as drafters_lib
from specdec_jax import gin_utils
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import shipped
from specdec_jax import theory
from specdec_jax import widening
from specdec_jax import hardware
from specdec_jax.bench import report
from specdec_jax.experiments import task_table

T5_DRAFTERS = {'small': '%MINI_SMALL', 'base': '%MINI_BASE',
               'large': '%MINI_LARGE'}


def model_free_drafters() -> Tuple[str, ...]:
  """The registered drafter kinds that need no draft model (n-grams, ...).

  Every setup offers them next to its T5 drafters, so a kind registered in
  `drafters.KINDS` is reproduced without touching this module.
  """
  return tuple(name for name, kind in drafters_lib.KINDS.items()
               if not kind.needs_model)


def all_drafters(t5_names: Sequence[str]) -> Tuple[str, ...]:
  return tuple(t5_names) + model_free_drafters()

def model_checkpoint(models_dir: str, task: str, size: str) -> str:
  """Latest checkpoint of a trained mini model; a clear error if missing.

  `<models_dir>/<task>_mini_<size>`, or `<models_dir>/<size>` when task is
  ''.
  """
  directory = os.path.join(os.path.expanduser(models_dir),
                           f'{task}_mini_{size}' if task else size)
  path = checkpoints.latest_checkpoint(directory)
  if path is None:
    raise FileNotFoundError(
        f'No checkpoint in {directory}. Train it first: python '
        f'scripts/train.py --gin_file=train/{task}_mini_{size}.gin '
        f"--gin.MODEL_DIR=\"'{directory}'\"")
  return path


# Predicted speed-ups at T5-XXL target cost on a measured hardware profile
# (`hardware`: the H100 run's by default). Each drafter of the setups
# is taken at the cost the accelerator run timed it under (the paper's
# T5 1.1-small drafter for 'small': the shipped small widened to T5
# 1.1-small cost), or, for one the run did not time, a shipped model whose
# decoder step sets the profile's bytes / launches model (labelled).
XXL_COST_DRAFTERS = {'small': 'small@t5_1_1_small_cost', 'dec2': 'dec2',
                     'unigram': 'unigram', 'bigram': 'bigram'}
# name -> (shipped model, widening preset or config changes): the step of a
# drafter the profile did not time.
MODELLED_DRAFTERS = {
    'base': ('small', 't5_1_1_base_cost'),
    'large': ('small', 't5_1_1_large_cost'),
    'dec1': ('dec2', {'num_decoder_layers': 1}),
}
# The timed T5 drafter whose step fits the launches per decoder layer of
# the bytes / launches model: (profile name, shipped model, preset).
LAUNCH_FIT = ('small@t5_1_1_small_cost', 'small', 't5_1_1_small_cost')
ROOT = pathlib.Path(__file__).resolve().parents[2]
_CACHE: Dict[Any, Any] = {}


def _source_setup(profile) -> Dict[str, Any]:
  """The `setup` of the run a profile was read from ({} if not here)."""
  path = ROOT / profile.source
  return report.read_json(path).get('setup', {}) if path.is_file() else {}


def _step(profile, model: str, change) -> Tuple[int, int, str]:
  """(bytes one decoder step reads, decoder layers, what) of a shipped
  model at a preset / with config changes, bfloat16, at the profile run's
  input length and half its output length decoded."""
  key = ('step', profile.name, model, str(change))
  if key not in _CACHE:
    cfg = shipped.config(model, dtype='bfloat16')
    cfg = (widening.preset_config(cfg, change) if isinstance(change, str)
           else cfg.replace(**change))
    net = network.T5Model(cfg)
    shapes = net.param_shapes()
    setup = _source_setup(profile)
    length_in = int(setup.get('input_length', 0))
    context = int(setup.get('output_length', 0)) // 2
    what = (f'shipped {model} ' + (f'at {change}' if isinstance(change, str)
                                   else f'with {change}') +
            f', bfloat16, {cfg.num_decoder_layers} decoder layers, caches at '
            f'input {length_in}, {context} decoded tokens')
    _CACHE[key] = (measure.step_bytes(net, shapes, 1, context, length_in),
                   cfg.num_decoder_layers, what)
  return _CACHE[key]


def launches_per_layer(profile) -> Tuple[float, str]:
  """(kernel launches per decoder layer, how): fitted to `LAUNCH_FIT`.

  The timed drafter's step time less its bytes / bandwidth, in units of
  the profile's launch time, per decoder layer; 0 (said) where the profile
  has no launch time, bandwidth or that drafter.
  """
  name, model, preset = LAUNCH_FIT
  if (profile.launch_ms is None or profile.bandwidth is None
      or name not in profile.c.get(1, {})):
    return 0.0, f'no launches (profile {profile.name} has no {name} or ' \
        'launch time)'
  nbytes, layers, _ = _step(profile, model, preset)
  rest_s = profile.c[1][name] * profile.t1_ms * 1e-3 - (
      nbytes / profile.bandwidth)
  per_layer = max(rest_s, 0.0) / (profile.launch_ms * 1e-3) / layers
  return per_layer, (f'{per_layer:.2f} launches per decoder layer, fitted '
                     f'to the timed {name} ({layers} layers)')


def predict_at_xxl_cost(profile, alpha: float, drafter: str,
                        gamma: Optional[int] = None
                        ) -> Optional[Dict[str, Any]]:
  """The PREDICTED speed-up of `drafter` at T5-XXL target cost on `profile`.

  `hardware.predict` with alpha, the best gamma within the measured
  cost(k) (or `gamma`), the profile's measured cost(gamma + 1) and the c
  it measured for the drafter's stand-in (`XXL_COST_DRAFTERS`), or the
  bytes / launches model of `MODELLED_DRAFTERS`.

  Returns:
    `Prediction.to_json()` plus `drafter_as` (what the drafter is taken
    as), or None for a drafter neither timed nor modelled.
  """
  alpha = theory.clamp_alpha(alpha)
  if drafter in XXL_COST_DRAFTERS:
    name = XXL_COST_DRAFTERS[drafter]
    if name not in profile.drafters(1):
      return None
    p = hardware.predict(profile, alpha=alpha, gamma=gamma, drafter=name)
    return dict(p.to_json(), drafter_as=f'{name} (timed)')
  if drafter not in MODELLED_DRAFTERS or profile.bandwidth is None:
    return None
  nbytes, layers, what = _step(profile, *MODELLED_DRAFTERS[drafter])
  per_layer, how = launches_per_layer(profile)
  kernels = round(per_layer * layers)
  p = hardware.predict(profile, alpha=alpha, gamma=gamma,
                       drafter=f'{drafter} (modelled)', step_bytes=nbytes,
                       kernels=kernels)
  return dict(p.to_json(), drafter_as=f'{what} (not timed)',
              step_bytes=nbytes, kernels=kernels, kernels_how=how)


def xxl_cost_cell(pred: Optional[Dict[str, Any]]) -> str:
  """'2.05x (5)', a dagger for the bytes / launches model, '-' for None."""
  if not pred:
    return '-'
  mark = '' if pred['c_how'].startswith('measured') else ' †'
  return f"{pred['speedup']:.2f}x ({pred['gamma']}){mark}"


def xxl_cost_note(profile) -> str:
  """What a 'predicted <profile>' column is, for a results .md."""
  fitted = launches_per_layer(profile)[1]
  stand_in = ', '.join(f'{k} as {v}' for k, v in XXL_COST_DRAFTERS.items())
  modelled = ', '.join(
      f'{k} as shipped {m} ' + (f'at {c}' if isinstance(c, str) else
                                f'with {c}')
      for k, (m, c) in MODELLED_DRAFTERS.items())
  return (
      f'"predicted {profile.name}" is PREDICTED, not measured: predicted on '
      f'profile {profile.name} (specdec_jax/profiles, read from '
      f'{profile.source}) through hardware.predict: Theorem 3.8 with '
      "the row's alpha, the profile's measured cost(gamma + 1) of its "
      f'target ({profile.target}) and the best gamma within the measured '
      f'k (in brackets). c: measured for {stand_in}; marked † the bytes / '
      f'launches model of the profile (step bytes / its bandwidth + '
      f'launches x its launch time, over its t(1); {fitted}) for '
      f'{modelled}: the profile did not time them.')


def _bindings(**bindings) -> list:
  flags = []
  for name, value in bindings.items():
    quoted = isinstance(value, str) and not value.startswith('%')
    flags.append(f'--gin.{name}={value!r}' if quoted else
                 f'--gin.{name}={value}')
  return flags


class _Setup:
  """What the three setups share: a (task, drafter) pair -> eval job flags.

  A setup says which gin file runs a task (`gin_file`), where the target's
  checkpoint is (`target_checkpoint`) and, for each of its T5 drafters
  (`t5_drafters`), the gin model macro and checkpoint (`draft`). Every
  registered drafter kind that needs no model is offered too.
  """
  models = ''  # the model set: a `task_table.MODEL_SETS` name

  @property
  def tasks(self) -> Tuple[str, ...]:
    return task_table.names()

  def t5_drafters(self) -> Sequence[str]:
    raise NotImplementedError

  def gin_file(self, task: str, drafter: str) -> str:
    del drafter
    return task_table.get(task).gin_file(self.models)

  def target_checkpoint(self, task: str) -> Optional[str]:
    raise NotImplementedError

  def draft(self, task: str, drafter: str) -> Tuple[Optional[str], str]:
    """(gin model macro or None to keep the file's, checkpoint) of a T5."""
    raise NotImplementedError

  def extra_flags(self) -> list:
    return []

  @property
  def drafters(self) -> Tuple[str, ...]:
    return all_drafters(self.t5_drafters())

  def flags(self, task: str, drafter: str) -> list:
    """The eval job's flags for one (task, drafter): the setup's gin file,
    checkpoints and drafter (the command that reruns it)."""
    task_table.get(task)  # a clear error for an unknown task
    t5 = self.t5_drafters()  # (ShippedSetup looks for checkpoints)
    if drafter not in all_drafters(t5):
      raise ValueError(f'Unknown drafter {drafter!r}; expected one of '
                       f'{list(all_drafters(t5))}.')
    flags = [f'--gin_file={self.gin_file(task, drafter)}']
    target = self.target_checkpoint(task)
    if target is not None:
      flags.append(f"--gin.TARGET_CHECKPOINT='{target}'")
    flags += self.extra_flags()
    if drafter in t5:
      macro, checkpoint = self.draft(task, drafter)
      if macro is not None:
        flags.append(f'--gin.DRAFT_MODEL={macro}')
      flags.append(f"--gin.DRAFT_CHECKPOINT='{checkpoint}'")
    else:
      flags += ['--gin.DRAFT_CHECKPOINT=None', f"--gin.DRAFTER='{drafter}'"]
    return flags


@dataclasses.dataclass(frozen=True)
class MiniSetup(_Setup):
  """The mini models trained here: gin_configs/mini/<task>.gin."""
  models_dir: str = '~/models'
  models = 'mini'
  describe = ('mini-XXL target trained here (emb 256, 4+4 layers); drafters '
              'mini small (emb 64, 1+1), base (128, 2+2), large (192, 3+3)')

  def t5_drafters(self) -> Sequence[str]:
    return tuple(T5_DRAFTERS)

  def target_checkpoint(self, task: str) -> str:
    return model_checkpoint(self.models_dir, task, 'xxl')

  def draft(self, task: str, drafter: str) -> Tuple[str, str]:
    return (T5_DRAFTERS[drafter],
            model_checkpoint(self.models_dir, task, drafter))


@dataclasses.dataclass(frozen=True)
class PaperSetup(_Setup):
  """Real T5X checkpoints through the paper's gin files (gin_configs/paper).

  `checkpoints` maps '<task>_<size>' (a `task_table` name; size 'xxl'
  for the target, 'small' / 'base' / 'large' for drafters) to T5X checkpoint
  paths (local or gs://), e.g. {'en_de_xxl': ..., 'en_de_small': ...}.
  n-gram drafters are estimated from the task's train split (TFDS data).
  """
  checkpoints: Tuple[Tuple[str, str], ...] = ()
  models = 'paper'
  describe = ('T5 1.1 XXL target and T5 1.1 small / base / large drafters '
              'from T5X checkpoints (gin_configs/paper)')

  def _checkpoint(self, key: str) -> str:
    known = dict(self.checkpoints)
    if key not in known:
      raise ValueError(f'No checkpoint given for {key!r} (--checkpoints '
                       f'{key}=PATH); given: {sorted(known)}.')
    return known[key]

  def t5_drafters(self) -> Sequence[str]:
    return tuple(T5_DRAFTERS)

  def gin_file(self, task: str, drafter: str) -> str:
    size = drafter if drafter in T5_DRAFTERS else 'small'
    return task_table.get(task).gin_file(self.models, size)

  def target_checkpoint(self, task: str) -> str:
    return self._checkpoint(task + '_xxl')

  def draft(self, task: str, drafter: str) -> Tuple[None, str]:
    return None, self._checkpoint(f'{task}_{drafter}')


# name -> (gin model macro, where the checkpoint is): shipped ones, or the
# `<name>_fkl` runs of scripts/train_shipped_models.py in `models_dir`.
SHIPPED_T5_DRAFTERS = {
    'dec2': ('%MINI_DEC2', 'shipped'), 'small': ('%MINI_SMALL', 'shipped'),
    'dec1': ('%MINI_DEC1', 'export'), 'base': ('%MINI_BASE', 'export'),
    'large': ('%MINI_LARGE', 'export'),
}


@dataclasses.dataclass(frozen=True)
class ShippedSetup(_Setup):
  """The shipped models (specdec_jax/assets/mini, gin_configs/shipped).

  The target and the dec2 / small drafters are the shipped ones. `models_dir`
  may name the `export` folder of scripts/train_shipped_models.py for the
  drafters trained with them but not shipped (dec1, base, large: the
  `<name>_fkl` runs). `data_dir` is the full Debian data (the shipped
  folder holds only test slices; n-gram drafters need the train split).
  """
  models_dir: Optional[str] = None
  data_dir: Optional[str] = None
  models = 'shipped'
  describe = ('shipped multi-task mini-XXL target (emb 256, 4+4 layers, '
              'trained on a GPU); drafters distilled on it (forward KL on '
              'its outputs): dec2 / dec1 (cut from the target: emb 256, 2 '
              'encoder + 2 / 1 decoder layers), small (emb 64, 1+1), base '
              '(128, 2+2), large (192, 3+3)')

  def t5_drafters(self) -> Sequence[str]:
    return tuple(
        n for n, (_, where) in SHIPPED_T5_DRAFTERS.items()
        if where == 'shipped' or (self.models_dir and
                                  checkpoints.latest_checkpoint(
                                      os.path.join(os.path.expanduser(
                                          self.models_dir), n + '_fkl'))))

  def target_checkpoint(self, task: str) -> None:
    return None  # the gin file's: 'shipped:target'

  def extra_flags(self) -> list:
    return ([f"--gin.EvalSetup.data_dir='{self.data_dir}'"]
            if self.data_dir else [])

  def draft(self, task: str, drafter: str) -> Tuple[str, str]:
    macro, where = SHIPPED_T5_DRAFTERS[drafter]
    return macro, (f'shipped:{drafter}' if where == 'shipped' else
                   model_checkpoint(self.models_dir, '', drafter + '_fkl'))


def make_setup(kind: str, models_dir: str = '~/models',
               checkpoint_list: str = '', data_dir: Optional[str] = None):
  """'mini' -> MiniSetup(models_dir); 'paper' -> PaperSetup from 'k=v,...';
  'shipped' -> ShippedSetup(models_dir or None, data_dir)."""
  if kind == 'mini':
    return MiniSetup(models_dir)
  if kind == 'shipped':
    return ShippedSetup(models_dir if models_dir != '~/models' else None,
                        data_dir)
  if kind == 'paper':
    pairs = []
    for item in filter(None, checkpoint_list.split(',')):
      if '=' not in item:
        raise ValueError(f'--checkpoints entries look like en_de_xxl=PATH, got '
                         f'{item!r}.')
      key, path = item.split('=', 1)
      pairs.append((key.strip(), path.strip()))
    return PaperSetup(tuple(pairs))
  raise ValueError(f"setup must be 'mini', 'shipped' or 'paper', got "
                   f'{kind!r}.')


def eval_flags(setup, task: str, drafter: str, **bindings) -> list:
  """T5X-style flags of one eval run.

  Args:
    setup: `MiniSetup` or `PaperSetup` (models and gin files).
    task: a key of `setup.tasks`.
    drafter: a name in `setup.drafters`.
    **bindings: more gin bindings, e.g. GAMMA=4; strings are quoted unless
      they are macro references ('%...').
  """
  return setup.flags(task, drafter) + _bindings(**bindings)


def shell_command(flags: Sequence[str]) -> str:
  return report.portable('python -m specdec_jax.eval ' + ' '.join(
      f'"{f}"' if ' ' in f else f for f in flags))


def eval_setup(setup, task: str, drafter: str, /,
               **changes) -> loading.EvalSetup:
  """The eval job's `EvalSetup` for a (task, drafter) of a setup.

  Args:
    setup: `MiniSetup`, `ShippedSetup` or `PaperSetup`.
    task: a key of `setup.tasks`.
    drafter: a name in `setup.drafters`.
    **changes: `EvalSetup` fields to set (e.g. gamma=4, temperature=1.0);
      gamma defaults to 1 where the gin files leave it unset.
  """
  # gamma 1 in gin, then every change at once: a setup checks its fields
  # together (a deep gamma with its tree, say), not the gin file's first.
  flags = setup.flags(task, drafter) + ['--gin.GAMMA=1',
                                        "--gin.EVAL_OUTPUT_DIR='-'"]
  args = gin_utils.parse_flags(flags, 'experiments.reproduce')
  changes.setdefault('gamma', 1)
  return loading.setup_from_flags(args).replace(**changes)
