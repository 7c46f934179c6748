r"""Trains a T5 on a seqio task, launched like a T5X training job.

  python scripts/train.py \
    --gin_file=gin_configs/train/en_de_mini_xxl.gin \
    --gin.MODEL_DIR="'/tmp/models/en_de_mini_xxl'"

Flags follow T5X: `--gin_file` (repeatable), `--gin_bindings` (repeatable),
`--gin.NAME=VALUE` (shorthand for a binding), `--gin_search_paths`
(comma-separated; the project's gin_configs/ is always searched). The run
file is gin_configs/train/train.gin; the library is specdec_jax.training.

Writes to MODEL_DIR: config.gin (the full gin config, before training),
checkpoint_<step>/ (T5X orbax layout), log.jsonl, operative_config.gin (after
training) and, with --plot, loss.png. A rerun resumes from the latest
checkpoint.
"""

import argparse
import os
import sys
from typing import Any, Dict, Optional, Sequence

import gin

from specdec_jax import gin_utils
from specdec_jax import training
from specdec_jax.experiments import plots


def _add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument('--plot', action='store_true',
                      help='write MODEL_DIR/loss.png after training')
  parser.add_argument('--no_progress', action='store_true',
                      help='no progress bar')


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
  """T5X's flags; `--gin.NAME=VALUE` becomes a `--gin_bindings`."""
  return gin_utils.parse_flags(argv, 'python scripts/train.py',
                               __doc__.splitlines()[0], _add_arguments)


class _ProgressBar:
  """A tqdm bar fed by `training.train`'s progress callback."""

  def __init__(self):
    self._bar = None

  def __call__(self, step: int, total: int, metrics: Dict[str, float]):
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    if self._bar is None:
      self._bar = tqdm(total=total, initial=step - 1, desc='train',
                       unit='step', dynamic_ncols=True)
    self._bar.update(1)
    self._bar.set_postfix(loss=f"{metrics['loss']:.3f}",
                          acc=f"{metrics['accuracy']:.3f}", refresh=False)

  def close(self):
    if self._bar is not None:
      self._bar.close()


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """Parses T5X-style flags and gin files, then runs `training.train`."""
  args = parse_flags(sys.argv[1:] if argv is None else argv)
  run = gin_utils.configure(args, training.train,
                           'gin_configs/train/en_de_mini_small.gin')
  bar = None if args.no_progress else _ProgressBar()
  try:
    summary = run(config_str=gin.config_str(), progress=bar)
  finally:
    if bar is not None:
      bar.close()
  model_dir = summary['model_dir']
  with open(os.path.join(model_dir, 'operative_config.gin'), 'w') as f:
    f.write(gin.operative_config_str())
  if args.plot:
    plots.plot_losses([model_dir], os.path.join(model_dir, 'loss.png'))
  print(f"step {summary['step']}: train {summary['train']}\n"
        f"validation {summary['validation']}\n"
        f"checkpoint {summary['checkpoint']}")
  return summary


if __name__ == '__main__':
  main()
