"""The model sets a spec runs on, as the eval job's setups.

A `ModelSet` ('mini', 'shipped', 'paper', 'xxl_cost', 'synthetic':
`task_table.MODEL_SETS`) builds the job's typed `loading.EvalSetup` for a
(task, drafter) as a value (`eval_setup`), with no gin, so it runs where gin
and seqio are not installed. Its data: the configs (`models.MINI`;
`models.CONFIGS` for 'paper'), the drafter a model-free kind carries
(`DEFAULT_DRAFT`: its gin files' DRAFT_MODEL), where each model's checkpoint
is (`ModelSet.checkpoint`), the widenings of 'xxl_cost' and 'synthetic'
(`XXL_COST`), the noise of the synthetic drafters (`SYNTHETIC_NOISE`) and
`task_table` (each task's seqio task, lengths and the set's fields).
tests/experiments/test_reproduce.py checks every model set, task and
drafter against what the gin files give.
`profile_name`: a drafter's name in the profile a model set's run writes.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional, Tuple

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import drafters as drafters_lib
from specdec_jax import loading
from specdec_jax import models as models_lib
from specdec_jax import network
from specdec_jax import synthetic
from specdec_jax import task_table
from specdec_jax.bench import at_xxl_cost

T5_SIZES = ('small', 'base', 'large')  # the paper's T5 drafters


def model_free_drafters() -> Tuple[str, ...]:
  """The registered drafter kinds that need no draft model (n-grams, ...):
  every model set offers them next to its T5 drafters."""
  return tuple(name for name, kind in drafters_lib.KINDS.items()
               if not kind.needs_model)


def model_checkpoint(models_dir: str, task: str, size: str) -> str:
  """Latest checkpoint in `<models_dir>/<task>_mini_<size>` (or
  `<models_dir>/<size>` when task is ''); a clear error if missing."""
  directory = os.path.join(os.path.expanduser(models_dir),
                           f'{task}_mini_{size}' if task else size)
  path = checkpoints.latest_checkpoint(directory)
  if path is None:
    raise FileNotFoundError(
        f'No checkpoint in {directory}. Train it first: python '
        f'scripts/train.py --gin_file=train/{task}_mini_{size}.gin '
        f"--gin.MODEL_DIR=\"'{directory}'\"")
  return path


# The config a model-free drafter carries: its gin files' DRAFT_MODEL.
DEFAULT_DRAFT = {'mini': 'small', 'shipped': 'dec2', 'paper': 'small'}
# The T5 drafters of the shipped models: name -> where the checkpoint is
# ('shipped' ones, or the `<name>_fkl` runs of
# scripts/train_shipped_models.py in `models_dir`, 'export').
SHIPPED_T5_DRAFTERS = {'dec2': 'shipped', 'small': 'shipped',
                       'dec1': 'export', 'base': 'export', 'large': 'export'}
# What 'xxl_cost' widens the shipped models to, function-preservingly (the
# same outputs and alpha): the costs the H100 profile's run timed them at
# (the target at T5 1.1-XXL cost, a drafter named after a T5 1.1 size at
# that size's; dec2 / dec1 keep their own). 'synthetic' widens its models
# to the same costs.
XXL_COST = {'target': 't5_1_1_xxl_cost', 'small': 't5_1_1_small_cost',
            'base': 't5_1_1_base_cost', 'large': 't5_1_1_large_cost'}
# The same shrunk (`--shrink`: a CPU run in seconds): the drafters grown a
# little; the target as it is, so that its programs are the shipped set's.
XXL_COST_SHRUNK = {'target': None, 'small': {'mlp_dim': 192},
                   'base': {'mlp_dim': 384}, 'large': {'mlp_dim': 576}}
# 'synthetic': a random target (`models.MINI['xxl']`, seed `SYNTHETIC_SEED`)
# and noisy copies of it as the T5 drafters (`synthetic`): name -> sigma.
# Greedy alpha on en_de's first 16 / all 256 test examples (`measure.alpha`,
# t = 0), small / base / large: 0.758 / 0.812 / 0.821, 0.751 / 0.801 / 0.826;
# the paper's T5s on EnDe: 0.75 / 0.8 / 0.82. Each sigma draws noise of its
# own. Re-measured by `run table3 --models synthetic --tasks en_de`.
SYNTHETIC_SEED = 0
SYNTHETIC_NOISE = {'small': 0.038, 'base': 0.029, 'large': 0.025}


@dataclasses.dataclass(frozen=True)
class ModelSet:
  """A model set: its models' configs and checkpoints (`eval_setup`).

  'mini': the mini-XXL target and mini small / base / large drafters
  trained here (scripts/train.py) in `<models_dir>/<task>_mini_<size>`.
  'shipped': the package's multi-task mini-XXL target and the drafters
  distilled on it (`SHIPPED_T5_DRAFTERS`). 'paper': T5 1.1 XXL / small /
  base / large T5X checkpoints. 'xxl_cost': the shipped models widened to
  the paper's costs (`XXL_COST`; no gin file of its own). 'synthetic': a
  random target of the shipped target's config and noisy copies of it as
  the drafters small / base / large (`SYNTHETIC_NOISE`), widened as
  'xxl_cost' widens (no weights, no gin file of its own).

  Attributes:
    models: the set's `task_table.MODEL_SETS` name.
    models_dir: 'mini': the trained models; 'shipped' / 'xxl_cost': None,
      or the `export` folder of scripts/train_shipped_models.py holding the
      drafters trained with the shipped ones but not shipped; 'synthetic':
      unused.
    checkpoints: 'paper': ('<task>_<size>', T5X path) pairs, size 'xxl'
      the target's (e.g. ('en_de_xxl', 'gs://...')).
    data_dir: the Debian data every setup reads (None: the gin files').
    shrink: 'xxl_cost' widens as `XXL_COST_SHRUNK`, 'synthetic' nothing.
  """
  models: str
  models_dir: Optional[str] = None
  checkpoints: Tuple[Tuple[str, str], ...] = ()
  data_dir: Optional[str] = None
  shrink: bool = False

  @property
  def widening(self) -> Dict[str, Any]:
    if self.models == 'synthetic' and not self.shrink:
      return XXL_COST
    if self.models != 'xxl_cost':
      return {}
    return XXL_COST_SHRUNK if self.shrink else XXL_COST

  def t5_drafters(self) -> Tuple[str, ...]:
    """The T5 drafters: the paper's sizes, or the shipped ones found."""
    if (task_table.files_of(self.models) != 'shipped'
        or self.models == 'synthetic'):
      return T5_SIZES
    def found(name):
      return self.models_dir and checkpoints.latest_checkpoint(os.path.join(
          os.path.expanduser(self.models_dir), name + '_fkl'))
    return tuple(n for n, where in SHIPPED_T5_DRAFTERS.items()
                 if where == 'shipped' or found(n))

  @property
  def drafters(self) -> Tuple[str, ...]:
    return self.t5_drafters() + model_free_drafters()

  def config(self, size: str) -> network.T5Config:
    """The config of the target ('xxl') or of a T5 drafter."""
    if self.models == 'paper':
      return models_lib.CONFIGS[f't5_1_1_{size}']
    if self.models == 'synthetic' and size in T5_SIZES:
      return models_lib.MINI['xxl']  # noisy copies of the target
    return models_lib.MINI[size]

  def checkpoint(self, task: str, size: str) -> str:
    """The checkpoint of the target ('xxl') or of a T5 drafter for a task."""
    if self.models == 'mini':
      return model_checkpoint(self.models_dir, task, size)
    if self.models == 'paper':
      known, key = dict(self.checkpoints), f'{task}_{size}'
      if key not in known:
        raise checks.InputError(f'No checkpoint for {key!r} (--checkpoints '
                                f'{key}=PATH); given: {sorted(known)}.')
      return known[key]
    if self.models == 'synthetic':
      return synthetic.Spec(SYNTHETIC_SEED, 0.0 if size == 'xxl' else
                            SYNTHETIC_NOISE[size]).checkpoint
    if size == 'xxl':
      return 'shipped:target'
    if SHIPPED_T5_DRAFTERS[size] == 'shipped':
      return f'shipped:{size}'
    return model_checkpoint(self.models_dir, '', size + '_fkl')


def make_setup(kind: str, models_dir: str = '~/models',
               checkpoint_list: str = '', data_dir: Optional[str] = None,
               shrink: bool = False) -> ModelSet:
  """A model set from the command line's flags: `checkpoint_list`
  ('en_de_xxl=PATH,...') for 'paper'; the default `models_dir` only for
  'mini' (the shipped sets look there only when it is given)."""
  task_table.check_model_set(kind)
  pairs = []
  for item in filter(None, checkpoint_list.split(',') if kind == 'paper'
                     else []):
    if '=' not in item:
      raise checks.InputError(
          f'--checkpoints entries look like en_de_xxl=PATH, got {item!r}.')
    key, path = item.split('=', 1)
    pairs.append((key.strip(), path.strip()))
  if kind != 'mini' and models_dir == '~/models':
    models_dir = None
  return ModelSet(kind, models_dir, tuple(pairs), data_dir, shrink)


def eval_setup(models: ModelSet, task: str, drafter: str, /,
               **changes) -> loading.EvalSetup:
  """The eval job's `EvalSetup` for a (task, drafter) of a model set.

  Args:
    models: a model set (`make_setup`).
    task: a `task_table` name.
    drafter: a name in `models.drafters`.
    **changes: `EvalSetup` fields to set (e.g. gamma=4, temperature=1.0),
      by their flat names too (`loading.GROUPED`); gamma defaults to 1.
      Set together: a setup checks its fields at once.
  """
  fields = task_table.get(task).fields(models.models)
  t5, widen = models.t5_drafters(), models.widening
  if drafter not in t5 + model_free_drafters():
    raise checks.InputError(f'Unknown drafter {drafter!r}; expected one of '
                            f'{list(models.drafters)}.')
  target = models.checkpoint(task, 'xxl')
  if drafter in t5:
    draft = loading.DrafterSpec(
        config=models.config(drafter), widen_to=widen.get(drafter),
        checkpoint=models.checkpoint(task, drafter))
  else:
    draft = loading.DrafterSpec(kind=drafter, config=models.config(
        DEFAULT_DRAFT[task_table.files_of(models.models)]))
  if models.data_dir is not None:
    fields['data_dir'] = models.data_dir
  return loading.EvalSetup(
      target_config=models.config('xxl'), target_checkpoint=target, gamma=1,
      draft=draft, target_widen_to=widen.get('target'),
      data=loading.DataSpec(**fields)).replace(**changes)


# The model sets whose models run at the paper's costs (widened, unless
# shrunk), where a drafter's c is its stand-in's (`profile_name`).
AT_XXL_COST = ('xxl_cost', 'synthetic')


def profile_name(models: str, drafter: str, shrink: bool = False) -> str:
  """The name of a drafter's c in the profile of a model set's run: at
  the paper's costs (`AT_XXL_COST`, not shrunk) the name the H100
  profile's run gave it (`at_xxl_cost.STAND_INS`: 'small' is 'small@
  t5_1_1_small_cost'), so that a profile measured there reads as that one;
  elsewhere its own."""
  if models in AT_XXL_COST and not shrink:
    return at_xxl_cost.STAND_INS.get(drafter, drafter)
  return drafter
