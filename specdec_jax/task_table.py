"""The one task table: each task a benchmark names, for every model set.

A task has a short name (what specs, flags and results say: 'en_de',
'synopsis') and, for each model set, the gin file the eval job runs it with
(`gin`), the seqio task and feature lengths that file configures, and the
column of the paper it stands in for. The model sets: 'mini' (per-task
models trained here, gin_configs/mini/), 'shipped' (the package's models on
its test slices, gin_configs/shipped/), 'paper' (T5 1.1 checkpoints of the
paper's sizes, gin_configs/paper/; '{size}' is the drafter's size),
'xxl_cost' (the shipped models widened to T5 1.1 cost: the shipped gin
files, `FILES_OF`), 'synthetic' (a random target and noisy copies of it as
drafters, at the same costs, on the shipped tasks and data: the shipped
gin files too). `TaskEntry.fields` gives the `loading.DataSpec`
fields those files set (task, lengths and the model set's `SET_FIELDS`),
so a setup is built as a value without gin. tests/experiments/test_sweep.py
checks every entry against its gin file, so the table cannot drift from
what the job runs. It imports nothing of the package (the lowest layer):
the shipped assets (`shipped.TASKS`), the demo, the device run and the
scripts read their tasks here too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Tuple

from specdec_jax import checks

MODEL_SETS = ('mini', 'shipped', 'paper', 'xxl_cost', 'synthetic')
# A model set that runs the gin files (and tasks) of another, with bindings
# of its own (`reproduce`).
FILES_OF = {'xxl_cost': 'shipped', 'synthetic': 'shipped'}
# The `loading.DataSpec` fields a model set's gin files set beside a
# task's name and lengths (the others are gin_configs/runs/eval.gin's
# defaults, the dataclass's own).
SET_FIELDS: Dict[str, Dict[str, Any]] = {
    'mini': dict(split='test', truncate_inputs=True),
    'shipped': dict(split='test', truncate_inputs=True, data_dir='shipped',
                    num_examples=16),
    'paper': {},
}


@dataclasses.dataclass(frozen=True)
class TaskEntry:
  """One task of the table.

  Attributes:
    name: the short name.
    paper: the paper's column this task stands in for ('EnDe', 'CNNDM').
    gin: model set -> the eval job's gin file (relative to gin_configs/).
    task: model set -> the seqio task that file decodes.
    lengths: model set -> its TASK_FEATURE_LENGTHS.
  """
  name: str
  paper: str
  gin: Mapping[str, str]
  task: Mapping[str, str]
  lengths: Mapping[str, Mapping[str, int]]

  def gin_file(self, models: str, size: str = 'small') -> str:
    return self.gin[files_of(models)].format(size=size)

  def fields(self, models: str) -> Dict[str, Any]:
    """The `loading.DataSpec` fields a model set's gin file of this task
    sets: the seqio task, its feature lengths and the model set's
    `SET_FIELDS`."""
    files = files_of(models)
    return dict(mixture_or_task_name=self.task[files],
                task_feature_lengths=dict(self.lengths[files]),
                **SET_FIELDS[files])


def _lengths(inputs: int, targets: int) -> Dict[str, int]:
  return {'inputs': inputs, 'targets': targets}


TASKS: Dict[str, TaskEntry] = {
    'en_de': TaskEntry(
        name='en_de', paper='EnDe',
        gin={'mini': 'mini/en_de.gin', 'shipped': 'shipped/en_de.gin',
             'paper': 'paper/ende_t0_{size}.gin'},
        task={'mini': 'debian_desc_en_de', 'shipped': 'debian_desc_en_de',
              'paper': 'wmt_t2t_ende_v003'},
        lengths={'mini': _lengths(64, 64), 'shipped': _lengths(128, 64),
                 'paper': _lengths(256, 256)}),
    'synopsis': TaskEntry(
        name='synopsis', paper='CNNDM',
        gin={'mini': 'mini/synopsis.gin', 'shipped': 'shipped/synopsis.gin',
             'paper': 'paper/cnndm_t0_{size}.gin'},
        task={'mini': 'debian_synopsis', 'shipped': 'debian_synopsis',
              'paper': 'cnn_dailymail_v002'},
        lengths={'mini': _lengths(128, 32), 'shipped': _lengths(128, 64),
                 'paper': _lengths(512, 256)}),
}


def check_model_set(models: str) -> None:
  if models not in MODEL_SETS:
    raise checks.InputError(f'Unknown model set {models!r}; expected one of '
                            f'{list(MODEL_SETS)}.')


def files_of(models: str) -> str:
  """The model set whose gin files (and tasks) `models` runs."""
  check_model_set(models)
  return FILES_OF.get(models, models)


def get(name: str) -> TaskEntry:
  """The entry of a short task name; a clear error naming the known ones."""
  if name not in TASKS:
    raise checks.InputError(f'Unknown task {name!r}; expected one of '
                            f'{list(TASKS)}.')
  return TASKS[name]


def names() -> Tuple[str, ...]:
  return tuple(TASKS)
