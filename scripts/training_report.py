r"""Summarizes the mini-model training runs: a table and loss curves.

  python scripts/training_report.py --models_dir ~/models [--out_dir results]

Reads <models_dir>/<task>_mini_<size>/log.jsonl (written by scripts/train.py)
and writes results/training.md (final train / validation loss and accuracy,
steps, wall time, parameters) and results/training_<task>.png (the curves of
the four models of each task, `experiments.plots.plot_losses`).
"""

import argparse
import json
import os
import pathlib
import sys

from specdec_jax import checks
from specdec_jax import training
from specdec_jax.experiments import plots
from specdec_jax.measure import machine

SIZES = ('xxl', 'large', 'base', 'small')
SPLITS = ('train', 'validation')  # the records of scripts/train.py's log


def read(path: pathlib.Path):
  """A run's log records; a log that is not JSON lines (e.g. its last line
  cut off as it was written) or not scripts/train.py's records (a folder,
  an empty log, a record of no split or no step, loss and accuracy)
  refused, naming it."""
  if not path.is_file():
    raise checks.InputError(f'{path} is a folder, not a training log.')
  try:
    records = training.read_log(str(path))
  except ValueError as e:
    raise checks.InputError(f'{path} is no training log (a line cut off '
                            f'as it was written?): {e}') from None
  if not records:
    raise checks.InputError(f'{path} is empty: no training log records.')
  for i, record in enumerate(records, 1):
    if not isinstance(record, dict) or record.get('split') not in SPLITS or (
        not checks.is_int(record.get('step'))) or not all(
            checks.is_number(record.get(k, 0 if k == 'seconds' else None))
            for k in ('loss', 'accuracy', 'seconds')):
      raise checks.InputError(
          f'{path} is no training log of scripts/train.py: its record {i}, '
          f'{json.dumps(record)[:200]}, is not an object with a "split" '
          '(train or validation), an int "step" and numbers "loss" and '
          '"accuracy".')
  return records


def fmt(value, spec: str = '.3f') -> str:
  """A figure of the table, '-' where the log has none (no validation
  record yet)."""
  return '-' if value is None else format(value, spec)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models_dir', type=checks.local_path,
                      default='~/models')
  parser.add_argument('--out_dir', type=checks.local_path, default='results')
  parser.add_argument('--tasks', default='en_de,synopsis')
  args = parser.parse_args(argv)
  root = pathlib.Path(os.path.expanduser(args.models_dir))
  out = pathlib.Path(args.out_dir)
  checks.check_local_folder('--out_dir', out)
  command = 'python scripts/training_report.py ' + ' '.join(
      sys.argv[1:] if argv is None else argv)
  lines = ['# Mini-model training runs', '', f'Command: `{command}`  ',
           f'Machine: {machine()}', '',
           'Trained with `python scripts/train.py --gin_file=train/'
           '<task>_mini_<size>.gin` (optax Adafactor, T5X loss with z-loss, '
           'rsqrt schedule, batch 16; gin_configs/train/mini_recipe.gin). '
           'Validation: 512 examples of the validation split, teacher '
           'forced. Wall time as logged (the machine was shared with other '
           'work at times).', '',
           '| task | model | steps | train loss | val loss | val accuracy '
           '| wall min |', '|---|---|---|---|---|---|---|']
  logs = {}  # every task's logs read before anything is written
  for task in args.tasks.split(','):
    dirs = [root / f'{task}_mini_{s}' for s in SIZES
            if (root / f'{task}_mini_{s}' / training.LOG_FILE).exists()]
    if not dirs:
      raise checks.InputError(f'no training logs under {root} for {task}')
    logs[task] = {d: read(d / training.LOG_FILE) for d in dirs}
  out.mkdir(parents=True, exist_ok=True)
  rows = []
  for task, runs in logs.items():
    for d, records in runs.items():
      train = [r for r in records if r.get('split') == 'train']
      val = [r for r in records if r.get('split') == 'validation']
      row = dict(task=task, model=d.name,
                 steps=train[-1]['step'] if train else None,
                 train_loss=train[-1]['loss'] if train else None,
                 val_loss=val[-1]['loss'] if val else None,
                 val_accuracy=val[-1]['accuracy'] if val else None,
                 seconds=max((r.get('seconds', 0) for r in records),
                             default=0))
      rows.append(row)
      lines.append(
          f"| {task} | {d.name} | {fmt(row['steps'], 'd')} | "
          f"{fmt(row['train_loss'])} | {fmt(row['val_loss'])} | "
          f"{fmt(row['val_accuracy'])} | {row['seconds'] / 60:.1f} |")
    plots.plot_losses([str(d) for d in runs],
                      str(out / f'training_{task}.png'))
    lines += ['', f'![{task}](training_{task}.png)', '']
  (out / 'training.md').write_text('\n'.join(lines) + '\n')
  (out / 'training.json').write_text(json.dumps(
      dict(command=command, rows=rows), indent=1))
  print('\n'.join(lines))


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
