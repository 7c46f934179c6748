"""The model sets a spec runs on, as the eval job's setups.

Four model sets: `MiniSetup` ('mini'), the mini models trained here
(gin_configs/train/, `scripts/train.py`) in
`<models_dir>/<task>_mini_<size>/checkpoint_<step>`; `ShippedSetup`
('shipped'), the package's own models; `PaperSetup` ('paper'), real T5X
checkpoints of T5 1.1 XXL / small / base / large through the paper's gin
files, for a TPU / GPU; `XxlCostSetup` ('xxl_cost'), the shipped models
widened function-preservingly to the paper's costs. `eval_setup` builds
the job's typed `loading.EvalSetup` for a (task, drafter) pair as a value,
from the configs (`MINI`, `models.CONFIGS`) and `task_table` (each task's
gin file, seqio task, lengths and the model set's fields), with no gin:
it runs where gin and seqio are not installed. A setup also names the
eval job's flags that give the same setup through the gin files (`flags`:
the command that reruns a cell, `eval_flags` / `shell_command`); the
suite checks the two agree for every model set, task and drafter. This
module also
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
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import models as models_lib
from specdec_jax import network
from specdec_jax import shipped
from specdec_jax import task_table
from specdec_jax import theory
from specdec_jax import widening
from specdec_jax import hardware
from specdec_jax.bench import report

T5_SIZES = ('small', 'base', 'large')  # the paper's T5 drafters


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


def _mini(emb: int, heads: int, encoder: int, decoder: int, head_dim: int,
          mlp: int) -> network.T5Config:
  return network.T5Config(
      vocab_size=8064, dtype='float32', emb_dim=emb, num_heads=heads,
      num_encoder_layers=encoder, num_decoder_layers=decoder,
      head_dim=head_dim, mlp_dim=mlp, mlp_activations=('gelu', 'linear'),
      dropout_rate=0.0, logits_via_embedding=False)


# The mini models' configs: name -> the `network.T5Config` that
# gin_configs/train/mini_<name>.gin binds to MINI_<NAME> (the target 'xxl'
# and the drafters of the mini and shipped model sets; the suite checks
# every setup built from them against the gin files).
MINI = {'xxl': _mini(256, 4, 4, 4, 64, 640),
        'large': _mini(192, 3, 3, 3, 64, 512),
        'base': _mini(128, 2, 2, 2, 64, 320),
        'small': _mini(64, 2, 1, 1, 32, 160),
        'dec2': _mini(256, 4, 2, 2, 64, 640),
        'dec1': _mini(256, 4, 2, 1, 64, 640)}


class _Setup:
  """What the setups share: a (task, drafter) pair -> the eval job's setup.

  A setup says which gin file runs a task (`gin_file`), the target's config
  and checkpoint, and, for each of its T5 drafters (`t5_drafters`), the
  config, gin model macro and checkpoint; every registered drafter kind
  that needs no model is offered too. From these `setup` builds the job's
  `loading.EvalSetup` as a value (no gin), and `flags` writes the job's
  command line that gives the same setup through the gin files (the
  command that reruns a cell; the suite checks that both agree).
  """
  models = ''  # the model set: a `task_table.MODEL_SETS` name
  default_draft = 'small'  # the gin file's DRAFT_MODEL (a T5 drafter name)
  file_target: Optional[str] = None  # the gin file's TARGET_CHECKPOINT

  @property
  def tasks(self) -> Tuple[str, ...]:
    return task_table.names()

  def t5_drafters(self) -> Sequence[str]:
    raise NotImplementedError

  def gin_file(self, task: str, drafter: str) -> str:
    del drafter
    return task_table.get(task).gin_file(self.models)

  def target_config(self) -> network.T5Config:
    return MINI['xxl']

  def draft_config(self, drafter: str) -> network.T5Config:
    """The config of a T5 drafter (or of the file's default drafter)."""
    return MINI[drafter]

  def draft_macro(self, drafter: str) -> Optional[str]:
    """The gin macro of a T5 drafter's config; None keeps the file's."""
    return f'%MINI_{drafter.upper()}'

  def target_checkpoint(self, task: str) -> Optional[str]:
    raise NotImplementedError

  def draft_checkpoint(self, task: str, drafter: str) -> str:
    raise NotImplementedError

  def draft_widen_to(self, drafter: str) -> Any:
    """`DrafterSpec.widen_to` of a T5 drafter (None: as trained)."""
    del drafter
    return None

  def overrides(self) -> Dict[str, Any]:
    """`EvalSetup` fields the setup sets beyond its gin files'."""
    return {}

  @property
  def drafters(self) -> Tuple[str, ...]:
    return all_drafters(self.t5_drafters())

  def _t5_checked(self, task: str, drafter: str) -> Sequence[str]:
    """The T5 drafters, after checking that the task and drafter exist."""
    task_table.get(task)  # a clear error for an unknown task
    t5 = self.t5_drafters()  # (ShippedSetup looks for checkpoints)
    if drafter not in all_drafters(t5):
      raise ValueError(f'Unknown drafter {drafter!r}; expected one of '
                       f'{list(all_drafters(t5))}.')
    return t5

  def setup(self, task: str, drafter: str) -> loading.EvalSetup:
    """The eval job's setup of one (task, drafter) at gamma 1, built as a
    value: what `flags` gives through the gin files."""
    if drafter in self._t5_checked(task, drafter):
      draft = loading.DrafterSpec(
          config=self.draft_config(drafter),
          checkpoint=self.draft_checkpoint(task, drafter),
          widen_to=self.draft_widen_to(drafter))
    else:
      draft = loading.DrafterSpec(
          kind=drafter, config=self.draft_config(self.default_draft))
    fields = {**task_table.get(task).fields(self.models), **self.overrides()}
    target = self.target_checkpoint(task)
    return loading.EvalSetup(
        target_config=self.target_config(),
        target_checkpoint=self.file_target if target is None else target,
        gamma=1, draft=draft, **fields)

  def flags(self, task: str, drafter: str) -> list:
    """The eval job's flags for one (task, drafter): the setup's gin file,
    checkpoints and drafter (the command that reruns it)."""
    t5 = self._t5_checked(task, drafter)
    flags = [f'--gin_file={self.gin_file(task, drafter)}']
    target = self.target_checkpoint(task)
    if target is not None:
      flags.append(f"--gin.TARGET_CHECKPOINT='{target}'")
    flags += _bindings(**{f'EvalSetup.{name}': value
                          for name, value in self.overrides().items()})
    if drafter in t5:
      macro = self.draft_macro(drafter)
      if macro is not None:
        flags.append(f'--gin.DRAFT_MODEL={macro}')
      flags.append(
          f"--gin.DRAFT_CHECKPOINT='{self.draft_checkpoint(task, drafter)}'")
      widen_to = self.draft_widen_to(drafter)
      if widen_to is not None:
        flags += _bindings(**{'DrafterSpec.widen_to': widen_to})
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
    return T5_SIZES

  def target_checkpoint(self, task: str) -> str:
    return model_checkpoint(self.models_dir, task, 'xxl')

  def draft_checkpoint(self, task: str, drafter: str) -> str:
    return model_checkpoint(self.models_dir, task, drafter)


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
    return T5_SIZES

  def gin_file(self, task: str, drafter: str) -> str:
    size = drafter if drafter in T5_SIZES else self.default_draft
    return task_table.get(task).gin_file(self.models, size)

  def target_config(self) -> network.T5Config:
    return models_lib.CONFIGS['t5_1_1_xxl']

  def draft_config(self, drafter: str) -> network.T5Config:
    return models_lib.CONFIGS[f't5_1_1_{drafter}']

  def draft_macro(self, drafter: str) -> None:
    return None  # each size's gin file names its drafter

  def target_checkpoint(self, task: str) -> str:
    return self._checkpoint(task + '_xxl')

  def draft_checkpoint(self, task: str, drafter: str) -> str:
    return self._checkpoint(f'{task}_{drafter}')


# The T5 drafters of the shipped models: name -> where the checkpoint is
# ('shipped' ones, or the `<name>_fkl` runs of
# scripts/train_shipped_models.py in `models_dir`, 'export').
SHIPPED_T5_DRAFTERS = {'dec2': 'shipped', 'small': 'shipped',
                       'dec1': 'export', 'base': 'export', 'large': 'export'}


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
  default_draft = 'dec2'
  file_target = 'shipped:target'
  describe = ('shipped multi-task mini-XXL target (emb 256, 4+4 layers, '
              'trained on a GPU); drafters distilled on it (forward KL on '
              'its outputs): dec2 / dec1 (cut from the target: emb 256, 2 '
              'encoder + 2 / 1 decoder layers), small (emb 64, 1+1), base '
              '(128, 2+2), large (192, 3+3)')

  def t5_drafters(self) -> Sequence[str]:
    return tuple(
        n for n, where in SHIPPED_T5_DRAFTERS.items()
        if where == 'shipped' or (self.models_dir and
                                  checkpoints.latest_checkpoint(
                                      os.path.join(os.path.expanduser(
                                          self.models_dir), n + '_fkl'))))

  def target_checkpoint(self, task: str) -> None:
    return None  # the gin file's: 'shipped:target'

  def overrides(self) -> Dict[str, Any]:
    return {} if self.data_dir is None else {'data_dir': self.data_dir}

  def draft_checkpoint(self, task: str, drafter: str) -> str:
    return (f'shipped:{drafter}' if SHIPPED_T5_DRAFTERS[drafter] == 'shipped'
            else model_checkpoint(self.models_dir, '', drafter + '_fkl'))


# What the xxl_cost set widens each shipped model to: the costs the
# accelerator run times them at (the target at T5 1.1-XXL cost, a drafter
# named after a T5 1.1 size at that size's; dec2 / dec1 keep their own).
XXL_COST = {'target': 't5_1_1_xxl_cost', 'small': 't5_1_1_small_cost',
            'base': 't5_1_1_base_cost', 'large': 't5_1_1_large_cost'}
# The same shrunk (`--shrink`: a CPU run in seconds): the drafters grown a
# little, function-preservingly all the same; the target as it is, so that
# its programs are the shipped set's (compiled once; `EvalSetup.
# target_widen_to` has tests of its own).
XXL_COST_SHRUNK = {'target': None, 'small': {'mlp_dim': 192},
                   'base': {'mlp_dim': 384}, 'large': {'mlp_dim': 576}}


@dataclasses.dataclass(frozen=True)
class XxlCostSetup(ShippedSetup):
  """The shipped models at the paper's costs (no gin file of its own).

  The shipped setup with its target widened function-preservingly to T5
  1.1-XXL cost (`EvalSetup.target_widen_to`) and the drafters small / base
  / large to their T5 1.1 size's (`DrafterSpec.widen_to`), `XXL_COST`: the
  shipped models' outputs and alpha at the costs of the paper's models,
  as the accelerator run times them. `shrunk`: `XXL_COST_SHRUNK` instead.
  """
  shrunk: bool = False
  models = 'xxl_cost'
  describe = ('the shipped models widened function-preservingly (same '
              'outputs and alpha): target at T5 1.1-XXL cost, drafters '
              'small / base / large at their T5 1.1 size\'s, dec2 / dec1 '
              'at their own')

  def _widening(self) -> Dict[str, Any]:
    return XXL_COST_SHRUNK if self.shrunk else XXL_COST

  def overrides(self) -> Dict[str, Any]:
    target = self._widening()['target']
    return dict(super().overrides(), **(
        {} if target is None else {'target_widen_to': target}))

  def draft_widen_to(self, drafter: str) -> Any:
    return self._widening().get(drafter)


SETUPS = {'mini': MiniSetup, 'shipped': ShippedSetup, 'paper': PaperSetup,
          'xxl_cost': XxlCostSetup}


def make_setup(kind: str, models_dir: str = '~/models',
               checkpoint_list: str = '', data_dir: Optional[str] = None,
               shrink: bool = False):
  """A model set's setup (`task_table.MODEL_SETS`, `SETUPS`).

  'mini' -> MiniSetup(models_dir); 'paper' -> PaperSetup from
  `checkpoint_list` ('en_de_xxl=PATH,...'); 'shipped' ->
  ShippedSetup(models_dir or None, data_dir); 'xxl_cost' -> the same as
  XxlCostSetup, its widenings `shrink`-ed if asked (the other sets take
  their models as they are).
  """
  task_table.check_model_set(kind)
  if kind == 'mini':
    return MiniSetup(models_dir)
  if kind == 'paper':
    pairs = []
    for item in filter(None, checkpoint_list.split(',')):
      if '=' not in item:
        raise ValueError(f'--checkpoints entries look like en_de_xxl=PATH, got '
                         f'{item!r}.')
      key, path = item.split('=', 1)
      pairs.append((key.strip(), path.strip()))
    return PaperSetup(tuple(pairs))
  models_dir = models_dir if models_dir != '~/models' else None
  if kind == 'xxl_cost':
    return XxlCostSetup(models_dir, data_dir, shrink)
  return ShippedSetup(models_dir, data_dir)


def eval_flags(setup, task: str, drafter: str, **bindings) -> list:
  """T5X-style flags of one eval run.

  Args:
    setup: a model set's setup (`make_setup`: models and gin files).
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
  """The eval job's `EvalSetup` for a (task, drafter) of a setup, as a
  value: no gin (the device image has none).

  Args:
    setup: a model set's setup (`make_setup`).
    task: a key of `setup.tasks`.
    drafter: a name in `setup.drafters`.
    **changes: `EvalSetup` fields to set (e.g. gamma=4, temperature=1.0),
      by their flat names too (`loading.GROUPED`); gamma defaults to 1
      where the gin files leave it unset. Set together: a setup checks its
      fields at once (a deep gamma with its tree, say).
  """
  return setup.setup(task, drafter).replace(**changes)
