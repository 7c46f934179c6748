"""The CPU costs run (scripts/benchmark_costs.py): its models and its files.

The run times a T5 1.1-small-size target (`TARGET`, random weights, float32)
and a much smaller T5 drafter (`DRAFT`) on this CPU; its profile names them
`TARGET_DESCRIPTION` and `DRAFTER_NAME`. `write_results` writes the run's
costs.json and costs.md and the hardware profile the json gives
(`hardware.from_costs_run`), named after the machine (`profile_name`).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Dict, Tuple

from specdec_jax import checks
from specdec_jax import hardware
from specdec_jax import models
from specdec_jax.bench import report

# T5 1.1 small dimensions, float32 (random weights).
TARGET = models.CONFIGS['t5_1_1_small'].replace(
    vocab_size=models.VOCAB_SIZE, dtype='float32')
DRAFT = TARGET.replace(emb_dim=128, num_heads=2, num_encoder_layers=2,
                       num_decoder_layers=2, mlp_dim=256)
# The drafter's name in the profile, and the target the profile times.
DRAFTER_NAME = 't5_emb128_2+2'
TARGET_DESCRIPTION = ('T5 1.1-small size (random weights), float32, batch '
                      '1, 64 input tokens')


def profile_name(machine: str) -> str:
  """'AMD EPYC, 2 cores, jax ...' -> 'cpu-amd-epyc-2-cores'."""
  return 'cpu-' + report.device_name(machine.split(', jax ')[0])


def check_folders(out_dir, profile_dir=None) -> None:
  """Raises InputError where `write_results` could not write its files
  (`checks.check_local_folder`): checked before the run, not after."""
  checks.check_local_folder('--out_dir', out_dir)
  if profile_dir is not None:
    checks.check_local_folder('--profile_dir', profile_dir)


def write_results(out_dir, result: Dict[str, Any], markdown: str,
                  profile_dir=None
                  ) -> Tuple[hardware.HardwareProfile, pathlib.Path]:
  """costs.json, costs.md and the profile the json gives.

  The profile (`hardware.from_costs_run` of the json as written) names the
  json as its source and goes to `profile_dir` (default: profiles)
  as <name>.json.

  Returns:
    (the profile, the path of its file).
  """
  json_path = report.write_json(os.path.join(out_dir, 'costs.json'), result)
  report.write_md(os.path.join(out_dir, 'costs.md'), markdown)
  run = report.read_json(json_path)
  source = report.portable(hardware.in_repository(json_path))
  profile = hardware.from_costs_run(run, source,
                                    name=profile_name(run['machine']))
  path = hardware.write(profile, None if profile_dir is None else
                        os.path.join(profile_dir, f'{profile.name}.json'))
  return profile, path
