r"""Trains PaSS look-ahead embeddings on a frozen target (its own outputs).

  python scripts/train_pass.py --task en_de --num_lookahead 8 \
    --out_dir /tmp/pass/en_de

Data: the target's greedy outputs (sequence-level, `distill.generate`) on
the task's inputs, teacher-forced: for every prefix :t+1 of an output, the
L look-ahead slots predict tokens t+2 .. t+L+1 (`lookahead_train.loss_fn`).
Only the L x emb_dim embeddings train (optax Adam on them alone; the target
is an argument under stop_gradient and is never updated).

The target: --target `shipped:<name>` (default shipped:target) or a T5X
checkpoint with --target_config (a `specdec_jax.models.config` spec, e.g.
't5_1_1_small' or 't5_1_1_tiny,vocab_size=256,dtype=float32'). The inputs:
with --arrays DIR (a folder of task folders in the `specdec_jax.arrays`
format, what scripts/export_arrays.py --out_dir writes; needed for a
checkpoint target) the rows --train_rows (default all) of DIR/<task>/train,
so DIR/<task>/test stays held out for the eval job and the lookahead
spec; without it the shipped test slice's rows --train_rows (default
64:256), so its first 64 rows stay held out.

Writes to --out_dir: settings.json (what the run is, written first:
`distill.claim_run`), data/ (the generated outputs, reused on a rerun),
checkpoint_<step>/ (T5X orbax layout, `lookahead.save_lookahead`; the
eval job's DRAFT_CHECKPOINT; with Adam's moments and the batches'
generator, so a rerun resumes from the latest checkpoint exactly: an
interrupted run ends with an uninterrupted one's embeddings), log.jsonl;
its last line says where the run stands (`training.method_line`). A
rerun resumes a run of the same settings, all but --steps, --save_every
and the folders (of --arrays, the rows' content counts; with more
--steps: trains on); it refuses, in one line and before writing
anything, a folder of another run (each changed setting named: the task,
the rows, --max_decode_len, --num_lookahead, the target, ...), of another
program or holding a later step than --steps.
SIGTERM or Ctrl-C saves the step running, then ends the command (status
143 / 130; `training.stop_asked`). --out_dir may be a gs:// address
(kept in a local copy, copied up at each save: bucket_folder.kept_here).
Because slot j sees only slots 1..j, the first L' < L embeddings of an
L-slot run are themselves an L'-slot drafter.

To ship them: copy checkpoint_<step>/ to
specdec_jax/assets/mini/lookahead/<task>/ and log.jsonl to
results/pass_embeddings/<task>/ (logs are results), record the checkpoint
under "methods" in specdec_jax/assets/mini/models.json and rewrite the
manifest (`shipped.write_manifest(shipped.ASSETS_DIR)`); the eval job then
loads them as `shipped:lookahead/<task>`.
"""

import argparse
import os
import re
from typing import Tuple

import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import arrays
from specdec_jax import bucket_folder
from specdec_jax import checks
from specdec_jax import distill
from specdec_jax import shipped
from specdec_jax import training
from specdec_jax.bench import flags
from specdec_jax import models
from specdec_jax.drafters import lookahead
from specdec_jax.drafters.lookahead import train as lookahead_train


# The flags that only extend or place a run: a rerun with other values
# resumes it (`distill.claim_run` refuses other values of the others; of
# --arrays, the folder, the content of the rows is checked).
FREE = ('steps', 'save_every', 'out_dir', 'arrays')


def _row_range(text: str) -> str:
  """--train_rows: 'start:stop', either left out (as the flag's type)."""
  if not re.fullmatch(r'\d*(:\d*)?', text):
    raise argparse.ArgumentTypeError(f'rows start:stop expected, got {text!r}')
  return text


def parse_flags(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--task', default='en_de', help='shipped task (en_de, '
                 'synopsis), or a task folder of --arrays')
  flags.add_model_flags(p, target='shipped:target')
  p.add_argument('--train_rows', default=None, type=_row_range,
                 help='rows of the inputs to train on (start:stop; default '
                 '64:256 of the shipped slice, all of --arrays)')
  p.add_argument('--max_decode_len', type=checks.count, default=64)
  p.add_argument('--num_lookahead', type=checks.count, default=8)
  p.add_argument('--steps', type=checks.count, default=300)
  p.add_argument('--batch_size', type=checks.count, default=16)
  p.add_argument('--positions', type=checks.count, default=16,
                 help='prefix ends per step that get look-ahead slots')
  p.add_argument('--learning_rate', type=checks.positive, default=0.3)
  p.add_argument('--seed', type=checks.natural, default=0)
  p.add_argument('--save_every', type=checks.count, default=50)
  p.add_argument('--out_dir', required=True)
  args = p.parse_args(argv)
  flags.check_model_flags(p, args, 'target')
  return args


def train_inputs(args, vocab_size) -> Tuple[np.ndarray, str]:
  """(the rows --train_rows of the task's train split or shipped slice,
  those rows as start:stop)."""
  if args.arrays:
    inputs = arrays.load(os.path.join(args.arrays, args.task),
                         'train')['inputs']
  else:
    inputs = shipped.test_arrays(args.task)['inputs']
  rows = args.train_rows or (':' if args.arrays else '64:256')
  start, stop = (int(x) if x else None for x in (rows.split(':') + [''])[:2])
  inputs = inputs[start:stop]
  if not len(inputs) or int(inputs.max()) >= vocab_size:
    raise checks.InputError(f'{args.task} rows {rows}: none, or token ids '
                            f'beyond the target vocab {vocab_size}')
  if len(inputs) < args.batch_size:  # before anything is generated
    raise checks.InputError(
        f'--train_rows {rows} of {args.task} are {len(inputs)} rows, fewer '
        f'than --batch_size {args.batch_size} (a batch draws distinct '
        'rows): give more rows or a smaller --batch_size.')
  return inputs, rows


def main(argv=None):
  args = parse_flags(argv)
  # A gs:// --out_dir: written in a local copy, copied up at each save
  # and at the end (bucket_folder.kept_here).
  with bucket_folder.kept_here('out_dir', args.out_dir) as here:
    train(args, here.path, here.sync)


def train(args, out_dir, saved):
  """Trains as the flags `args` say into `out_dir`, calling `saved()`
  after each checkpoint."""
  model, params = models.load(args.target, args.target_config)
  inputs, rows = train_inputs(args, model.vocab_size)
  settings = distill.run_settings('train_pass.py', vars(args), FREE, inputs,
                                  train_rows=rows)
  # The folder is this run's (or refused) before anything is written in it.
  latest, first = training.method_start(out_dir, args.out_dir, settings,
                                        args.steps)
  # Resumed embeddings are --num_lookahead's: settings.json holds it.
  la = (lookahead.load_lookahead(latest, model.config) if latest else
        lookahead.init_lookahead(params, args.num_lookahead, args.seed))
  data_dir = os.path.join(out_dir, 'data')
  distill.generate(model, params, {'inputs': inputs}, data_dir, 'train',
                   max_decode_len=args.max_decode_len, batch_size=64,
                   num_shards=1, progress=False)
  data = arrays.load(data_dir, 'train')
  enc, out = data['inputs'], data['targets']
  print(f'{len(enc)} rows; mean output length '
        f'{(out > 0).sum(1).mean():.1f}', flush=True)

  optimizer = optax.adam(args.learning_rate)
  opt_state = optimizer.init(la)
  rng = np.random.default_rng(args.seed)
  if latest:  # Adam's moments and the batches' generator, as saved
    opt_state, _ = training.restore_run_state(latest, opt_state, rng)
  step_fn = lookahead_train.make_train_step(model, optimizer)

  def step(_):
    nonlocal la, opt_state
    idx = rng.choice(len(enc), args.batch_size, replace=False)
    # Trim to the batch's longest output (in steps of 16: few shapes) and
    # give slots to --positions random prefix ends of it.
    width = int((out[idx] > 0).sum(1).max())
    width = min(out.shape[1], -(-width // 16) * 16)
    owners = np.sort(rng.choice(width, min(args.positions, width),
                                replace=False))
    la, opt_state, m = step_fn(params, la, opt_state, jnp.asarray(enc[idx]),
                               jnp.asarray(out[idx, :width]),
                               jnp.asarray(owners, jnp.int32))
    return float(m['loss']), m

  last = training.method_steps(
      out_dir, args.out_dir, first, args.steps, step,
      lambda i: lookahead.save_lookahead(
          la, out_dir, i, training.run_state_files(opt_state, rng)),
      saved, save_every=args.save_every, log_every=10)
  print(training.method_line(args.out_dir, first, args.steps, args.steps,
                             last), flush=True)


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
