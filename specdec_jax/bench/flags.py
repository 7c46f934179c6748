"""The model and data flags every benchmark and method script shares.

`add_model_flags(parser, target=..., draft=...)` adds `--<name>` (a
`shipped:<name>` model or a T5X `checkpoint_<step>` folder) and
`--<name>_config` (its `specdec_jax.models.config` spec) per model, and
`--arrays` (a folder of `<task>/{train,test}` arrays in the
`specdec_jax.arrays` format, what scripts/export_arrays.py writes);
`check_model_flags` stops with a clear message when a checkpoint comes
without its config or without its task data. `task_arrays` reads a task's
rows from `--arrays` or the shipped slices, `checkpoint_of` a method's
weights from `shipped:<kind>/<task>`, a checkpoint folder or a model dir.
`add_prediction_flags` adds `--profile` (the measured hardware profile of
the predicted figures) and `--repredict` (recompute them in a results file,
measuring nothing); `profile_of(args)` loads the profile.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, Optional

from specdec_jax import arrays
from specdec_jax import checkpoints
from specdec_jax import shipped
from specdec_jax import hardware
from specdec_jax import models


def add_model_flags(parser: argparse.ArgumentParser, **defaults: str
                    ) -> None:
  """`--<name>` and `--<name>_config` per model (name=default), --arrays."""
  for name, default in defaults.items():
    parser.add_argument(f'--{name}', default=default,
                        help="'shipped:<name>' or a T5X checkpoint_<step> "
                        'folder')
    parser.add_argument(f'--{name}_config', default=None,
                        help=f'specdec_jax.models.config spec of a checkpoint '
                        f"--{name}, e.g. 't5_1_1_small' or "
                        "'t5_1_1_tiny,vocab_size=256,dtype=float32'")
  parser.add_argument('--arrays', default=None,
                      help='folder of <task>/{train,test} arrays '
                      '(specdec_jax.arrays; scripts/export_arrays.py)')


def check_model_flags(parser: argparse.ArgumentParser, args,
                      *names: str) -> None:
  """A checkpoint needs its config, and a checkpoint target its data.

  A config is refused, as the parser's error naming its flag, where it is
  no `models.config` spec, and where it would be unused: a shipped model's
  config ships with it.
  """
  for name in names:
    value = getattr(args, name)
    spec = getattr(args, f'{name}_config')
    if value.startswith(models.SHIPPED):
      if spec is not None:
        parser.error(f'--{name}_config is for a checkpoint --{name}; '
                     f'{value} is a shipped model, whose config ships with '
                     f'it: leave --{name}_config out')
      continue
    if not models.parts(spec or ''):  # none, or only commas
      parser.error(f'--{name} {value} is a checkpoint path: give its '
                   f"--{name}_config too (e.g. 't5_1_1_small' or "
                   "'t5_1_1_tiny,vocab_size=256,dtype=float32')")
    try:
      models.config(spec, f'--{name}_config')
    except ValueError as e:  # checks.InputError too
      said = str(e)
      parser.error(said if said.startswith(f'--{name}_config') else
                   f'--{name}_config {spec!r}: {said}')
  if (names and not getattr(args, names[0]).startswith(models.SHIPPED)
      and not args.arrays):
    parser.error(f'a checkpoint --{names[0]} needs --arrays (its task data)')


def task_arrays(arrays_dir: Optional[str], task: str, vocab_size: int,
                split: str = 'test') -> Dict[str, Any]:
  """A task's rows: `<arrays_dir>/<task>/<split>`, else the shipped slice.

  Raises:
    ValueError: token ids beyond the model's vocabulary.
  """
  data = (arrays.load(os.path.join(arrays_dir, task), split) if arrays_dir
          else shipped.test_arrays(task))
  if int(data['inputs'].max()) >= vocab_size:
    raise ValueError(f'{task} has token ids >= the target vocab {vocab_size}')
  return data


def checkpoint_of(where: str) -> str:
  """A `shipped:` name, a checkpoint_<step> folder or a model dir's latest.

  Raises:
    FileNotFoundError: nothing there.
  """
  if where.startswith(shipped.SCHEME):
    return shipped.resolve(where)
  path = checkpoints.latest_checkpoint(where) or where
  if not os.path.isdir(path):
    raise FileNotFoundError(f'no checkpoint under {where}')
  return path


NO_PROFILE = 'none'


def add_prediction_flags(parser: argparse.ArgumentParser, *,
                         optional: bool = False,
                         repredict: bool = True) -> None:
  """`--profile` (and `--repredict`): where predicted figures come from.

  Args:
    parser: the script's parser.
    optional: '--profile none' leaves the predicted figures out.
    repredict: also `--repredict JSON`: recompute the predicted figures of
      that results file from its measured values (nothing is measured) and
      rewrite it.
  """
  parser.add_argument(
      '--profile', default=hardware.H100,
      help='the measured hardware profile of the predicted figures '
      '(hardware.names(), or its json file, local or gs://)' +
      (f"; '{NO_PROFILE}': leave them out" if optional else ''))
  if repredict:
    parser.add_argument(
        '--repredict', default=None, metavar='JSON',
        help='recompute the predicted figures of this results file from its '
        'measured values (nothing is measured) and rewrite it')


def profile_of(args, optional: bool = False
               ) -> Optional[hardware.HardwareProfile]:
  """The `--profile` flag's profile (with `optional`, None for 'none')."""
  if optional and args.profile == NO_PROFILE:
    return None
  if checkpoints.is_gcs(args.profile):  # as the profile spec writes it
    return hardware.parse(checkpoints.read_bytes(args.profile).decode(),
                          args.profile)
  return hardware.load(args.profile)
