r"""Exports seqio tasks as pre-tokenized arrays (specdec_jax/arrays.py format).

  python scripts/export_arrays.py --out_dir ~/.cache/specdec_jax/arrays

For each task (default: the offline Debian tasks) and split, runs the task's
seqio pipeline (tokenize, trim with EOS kept) and writes
`OUT_DIR/<task>/<split>.npz` (`inputs`, `targets`, 0-padded to the task's
feature lengths), plus the multi-task mixture `OUT_DIR/multitask/<split>.npz`
(both tasks' rows, inputs carry their T5 prefixes "translate English to
German: " / "summarize: ", padded to the widest lengths, with a `task`
column). Trainers and accelerator hosts then need neither seqio nor
TensorFlow (training.train(array_dir=...)). Needs the Debian data
(scripts/build_debian_data.py).
"""

import argparse
import os
import sys

import numpy as np
import tqdm

from specdec_jax import arrays
from specdec_jax import checks
from specdec_jax import task_table

# seqio task -> feature lengths: the mini model set's (the one task table).
TASKS = {entry.task['mini']: dict(entry.lengths['mini'])
         for entry in task_table.TASKS.values()}
SPLITS = ('train', 'validation', 'test')
MIXTURE = 'multitask'


def export_task(name, lengths, split):
  """One split of one seqio task as `{'inputs', 'targets'}` int32 arrays."""
  from specdec_jax import tasks  # pylint: disable=g-import-not-at-top

  ds = tasks.get_task(name).get_dataset(
      sequence_length=lengths, split=split, shuffle=False, num_epochs=1,
      trim_output_features=True)
  rows = {'inputs': [], 'targets': []}
  for ex in tqdm.tqdm(ds.as_numpy_iterator(), desc=f'{name}/{split}',
                      unit='ex', dynamic_ncols=True):
    for key in rows:
      rows[key].append(ex[key])
  if not rows['inputs']:
    raise checks.InputError(f'split {split!r} of task {name!r} is empty: '
                            'rebuild the data (scripts/build_debian_data.py, '
                            'without a --max_examples that small).')
  return {key: np.stack([np.pad(r, (0, lengths[key] - len(r))) for r in v])
          .astype(np.int32) for key, v in rows.items()}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out_dir', type=checks.local_path, required=True)
  parser.add_argument('--data_dir', default=None,
                      help='Debian data (default $SPECDEC_DATA_DIR or '
                      '~/.cache/specdec_jax/debian)')
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  checks.check_local_folder('--out_dir', args.out_dir)  # before any export
  from specdec_jax import tasks  # pylint: disable=g-import-not-at-top
  if args.data_dir:
    tasks.register_tasks(data_dir=args.data_dir)
  width = {k: max(v[k] for v in TASKS.values()) for k in ('inputs',
                                                          'targets')}
  for split in SPLITS:
    parts = []
    for index, (name, lengths) in enumerate(TASKS.items()):
      data = export_task(name, lengths, split)
      arrays.save(os.path.join(args.out_dir, name, f'{split}.npz'), data)
      parts.append({
          'inputs': arrays.fit(data['inputs'], width['inputs']),
          'targets': arrays.fit(data['targets'], width['targets']),
          'task': np.full(len(data['inputs']), index, np.int32)})
      print(f'{name}/{split}: {len(data["inputs"])} rows')
    mixed = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    mixed['task_names'] = np.asarray(list(TASKS))
    arrays.save(os.path.join(args.out_dir, MIXTURE, f'{split}.npz'), mixed)
  print(f'wrote {args.out_dir}')


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
