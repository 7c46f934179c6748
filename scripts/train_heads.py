r"""Trains a self-drafting head on a frozen target (specdec_jax/drafters/heads).

  python scripts/train_heads.py --task en_de --out_dir /tmp/heads/en_de

0. Records what the run is in <out_dir>/settings.json (`distill.claim_run`:
   every flag but --save_every, --eval_rows and the folders, of --arrays
   the content of the rows; --steps too, which sets the learning-rate
   schedule); a rerun resumes only a run of the same settings and refuses
   in one line, before writing anything, a run of other settings (each
   named: the task, the rows, the head, the target, --steps, ...) and a
   folder of another program.
1. Decodes the task's train inputs with the target (greedy, its own outputs:
   what the head must predict), into <out_dir>/data (sharded, resumable:
   finished shards are kept).
2. Computes the target's teacher-forced final states and last-layer cross
   K/V on those outputs, in chunks as training needs them.
3. Trains the head (optax AdamW, warm-up + cosine decay) with
   `heads_train.chain_loss`, unrolled --depth steps from --positions random
   positions per row; the target is never updated.
4. Writes <out_dir>/checkpoint_<step> (T5X orbax layout + draft_head.json,
   every --save_every steps, with AdamW's state and the batches'
   generator, so a rerun resumes from the latest exactly: an interrupted
   run ends with an uninterrupted one's head; SIGTERM or Ctrl-C saves the
   step running, then ends the command: `training.stop_asked`) and
   log.jsonl; the final alpha per depth on the held-out test rows (never
   trained on; see Data below) goes into log.jsonl and the last line
   (`training.method_line`); with --export_dir, the final head in
   bfloat16 (to ship) and the log (a folder holding anything but heads'
   checkpoint_<step> exports and log.jsonl is refused before training).
   --out_dir and --export_dir may be gs:// addresses (--out_dir kept in a
   local copy, copied up at each save: bucket_folder.kept_here).

To ship a head: --export_dir specdec_jax/assets/mini/heads/<task>, move the
log.jsonl it copies there to results/draft_heads/<task>/ (logs are results),
record the checkpoint under "methods" in specdec_jax/assets/mini/models.json
and rewrite the manifest (`shipped.write_manifest(shipped.ASSETS_DIR)`);
the eval job then loads it as `shipped:heads/<task>`.

The target: --target `shipped:<name>` (default shipped:target) or a T5X
checkpoint with --target_config (a `specdec_jax.models.config` spec, e.g.
't5_1_1_small' or 't5_1_1_tiny,vocab_size=256,dtype=float32').

Data: --arrays DIR, a folder of task folders in the `specdec_jax.arrays`
format (what scripts/export_arrays.py --out_dir writes): the head trains on
the first --train_rows inputs of DIR/<task>/train (DIR/debian_desc_en_de
for --task en_de, DIR/debian_synopsis for synopsis, when DIR/<task> is not
there) and alpha is measured on the first --eval_rows of DIR/<task>/test;
a checkpoint target needs --arrays. Without it (shipped target only) the
train split is ~/.cache/specdec_jax/arrays/<task dir>/ (the Debian train
split, scripts/build_debian_data.py --vocab_file <shipped vocab> +
scripts/export_arrays.py), else the shipped test rows 64..255 (a warning:
few rows, the head overfits); alpha on the shipped test rows 0..63.
Outputs are decoded to the test targets' width (--max_decode_len).
Runs on CPU or an accelerator; needs neither seqio nor gin.
"""

import argparse
import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import arrays
from specdec_jax import bucket_folder
from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import distill
from specdec_jax import shipped
from specdec_jax import training
from specdec_jax.bench import flags
from specdec_jax import models
from specdec_jax.drafters import heads
from specdec_jax.drafters.heads import train as heads_train

TASK_DIRS = shipped.TASKS  # short name -> its data folder (the task table)
CACHE = '~/.cache/specdec_jax/arrays'
# The flags that only extend, place or measure a run: a rerun with other
# values resumes it (`distill.claim_run` refuses other values of the
# others; of --arrays, the folder, the content of the rows is checked).
# (Not --steps: the learning-rate schedule's horizon, warm-up and cosine
# decay, is set by it, so a run of more steps is another run.)
FREE = ('save_every', 'out_dir', 'export_dir', 'eval_rows', 'arrays')


def parse_flags(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  flags.add_model_flags(p, target='shipped:target')
  p.add_argument('--task', default='en_de')
  p.add_argument('--train_rows', type=checks.count, default=12288,
                 help='first N rows of the train inputs')
  p.add_argument('--eval_rows', type=checks.count, default=64,
                 help='first N test rows alpha is measured on (held out)')
  p.add_argument('--max_decode_len', type=checks.count, default=None,
                 help='default: the width of the test targets')
  p.add_argument('--mlp_dim', type=checks.count, default=1024)
  p.add_argument('--no_cross_attention', action='store_true')
  p.add_argument('--depth', type=checks.count, default=4,
                 help='chained head steps trained (drafts 1..depth of the '
                 'merged loop)')
  p.add_argument('--steps', type=checks.count, default=3000)
  p.add_argument('--batch_size', type=checks.count, default=64)
  p.add_argument('--positions', type=checks.count, default=16)
  p.add_argument('--learning_rate', type=checks.positive, default=1e-3)
  p.add_argument('--weight_decay', type=checks.non_negative, default=0.01)
  p.add_argument('--chunk_rows', type=checks.count, default=2048,
                 help='rows whose target states are held at once')
  p.add_argument('--seed', type=checks.natural, default=0)
  p.add_argument('--save_every', type=checks.count, default=500)
  p.add_argument('--out_dir', required=True)
  p.add_argument('--export_dir', default=None,
                 help='also write the final head here in bfloat16 (what to '
                 'ship, e.g. specdec_jax/assets/mini/heads/en_de; move '
                 'the log.jsonl copied with it to results/draft_heads/en_de)')
  args = p.parse_args(argv)
  flags.check_model_flags(p, args, 'target')
  for flag in ('train_rows', 'chunk_rows'):  # a batch is of distinct rows
    if getattr(args, flag) < args.batch_size:
      p.error(f'--{flag} {getattr(args, flag)} is fewer than --batch_size '
              f'{args.batch_size} (a batch draws distinct rows of them)')
  if (args.target.startswith(models.SHIPPED) and not args.arrays and
      args.task not in TASK_DIRS):
    p.error(f'--task {args.task} is not shipped ({sorted(TASK_DIRS)}): give '
            '--arrays')
  return args


def task_data(args, vocab_size):
  """(train inputs, held-out inputs, decode length, what they are)."""
  if args.arrays:
    folder = os.path.join(args.arrays, args.task)
    if not checkpoints.isdir(folder) and args.task in TASK_DIRS:
      folder = os.path.join(args.arrays, TASK_DIRS[args.task])
    train, test = arrays.load(folder, 'train'), arrays.load(folder, 'test')
    where = f'arrays {os.path.basename(folder)} test'
  else:
    test, where = shipped.test_arrays(args.task), 'shipped test'
    folder = os.path.expanduser(f'{CACHE}/{TASK_DIRS[args.task]}')
    try:
      train = arrays.load(folder, 'train')
    except FileNotFoundError:
      print(f'WARNING: no train split in {folder} (scripts/build_debian_'
            'data.py + scripts/export_arrays.py make it); training on the '
            'shipped test rows 64..255 instead: few rows, the head will '
            'overfit.', file=sys.stderr)
      train = {'inputs': test['inputs'][64:256]}
  if max(int(train['inputs'].max()), int(test['inputs'].max())) >= vocab_size:
    raise checks.InputError(
        f'{args.task}: token ids beyond the target vocab {vocab_size}')
  rows = train['inputs'][:args.train_rows]
  if len(rows) < args.batch_size:  # before anything is generated
    raise checks.InputError(
        f'{args.task} has {len(rows)} train rows, fewer than --batch_size '
        f'{args.batch_size} (a batch draws distinct rows): give a smaller '
        '--batch_size, or more rows.')
  return (rows, test['inputs'][:args.eval_rows],
          args.max_decode_len or test['targets'].shape[1],
          f'{where} rows 0..{min(args.eval_rows, len(test["inputs"])) - 1}')


def check_export_dir(args):
  """Refuses (before training, `checks.InputError` naming what it holds)
  an --export_dir holding anything but exported heads (checkpoint_<step>
  folders with their draft_head.json, a rerun's own among them: the head
  itself is compared as it is exported) and the log beside them."""
  bucket_folder.check_folder('export_dir', args.export_dir)
  export = os.fspath(bucket_folder.join(args.export_dir))  # '~' expanded
  if os.path.abspath(export) == os.path.abspath(
      os.fspath(bucket_folder.join(args.out_dir))):
    raise checks.InputError('--export_dir is --out_dir: give another folder '
                            '(the head to ship goes beside the run).')
  if bucket_folder.is_bucket(export):
    held = {name.split('/')[0] for name in checkpoints.list_files(export)}
  else:
    held = set(os.listdir(export)) if os.path.isdir(export) else set()
  exported = {n for n in held if re.fullmatch(r'checkpoint_\d+', n)}
  if held - exported - {training.LOG_FILE} or not all(checkpoints.isfile(
      str(bucket_folder.join(export, n, heads.CONFIG_FILE)))
                                                      for n in exported):
    raise checks.InputError(
        f"--export_dir {args.export_dir} holds {', '.join(sorted(held))}: "
        f'not exported heads (checkpoint_<step> with {heads.CONFIG_FILE}) '
        f'and their {training.LOG_FILE}; give another folder, or empty it.')


def main(argv=None):
  args = parse_flags(argv)
  if args.export_dir:  # refused before training, as --out_dir is
    check_export_dir(args)
  # A gs:// --out_dir: written in a local copy, copied up at each save
  # and at the end (bucket_folder.kept_here).
  with bucket_folder.kept_here('out_dir', args.out_dir) as here:
    train(args, here.path, here.sync)


def train(args, out_dir, saved):
  """Trains as the flags `args` say into `out_dir`, calling `saved()`
  after each checkpoint."""
  model, params = models.load(args.target, args.target_config)
  inputs, test, decode_len, held_out = task_data(args, model.vocab_size)
  settings = distill.run_settings('train_heads.py', vars(args), FREE, inputs,
                                  max_decode_len=decode_len)
  # The folder is this run's (or refused) before anything is written in it.
  latest, first = training.method_start(out_dir, args.out_dir, settings,
                                        args.steps)
  data_dir = os.path.join(out_dir, 'data')
  distill.generate(model, params, {'inputs': inputs}, data_dir, 'train',
                   max_decode_len=decode_len, batch_size=128,
                   num_shards=max(1, len(inputs) // 2048))
  data = arrays.load(data_dir, 'train')
  enc, out = data['inputs'], data['targets']
  print(f'{len(enc)} rows; mean output length '
        f'{(out > 0).sum(1).mean():.1f}', flush=True)
  test_out = np.asarray(decoding.temperature_sample(
      model, params, jnp.asarray(test), max_decode_len=decode_len).tokens)

  head_cfg = heads.HeadConfig(
      mlp_dim=args.mlp_dim, cross_attention=not args.no_cross_attention)
  head = heads.Head(model.config, head_cfg)
  # A warm-up of at most steps - 1 (none for one step): optax's cosine
  # decay needs a step after it.
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, args.learning_rate,
      min(200, args.steps // 10 + 1, args.steps - 1), args.steps)
  # A resumed head is of these flags: settings.json holds them (claimed).
  hp = (heads.load_head(latest, model.config)[0] if latest else
        heads.init_head(model.config, head_cfg, args.seed))
  optimizer = optax.adamw(schedule, weight_decay=args.weight_decay)
  opt_state = optimizer.init(hp)
  rng = np.random.default_rng(args.seed)
  rows = None  # the rows of the chunk trained on
  if latest:  # AdamW's state (its step count too) and the batches', saved
    opt_state, values = training.restore_run_state(latest, opt_state, rng)
    rows = values.get('rows')
  step_fn = heads_train.make_train_step(head, optimizer, args.depth)

  def chunk_of(rows):
    feats = [heads_train.target_features(
        model, params, jnp.asarray(enc[rows[i:i + 256]]),
        jnp.asarray(out[rows[i:i + 256]]))
             for i in range(0, len(rows), 256)]
    return (jnp.concatenate([f[0] for f in feats]),
            (jnp.concatenate([f[1][0] for f in feats]),
             jnp.concatenate([f[1][1] for f in feats])),
            jnp.asarray(enc[rows]), jnp.asarray(out[rows]))

  chunk = None if rows is None else chunk_of(np.asarray(rows))
  steps_per_chunk = max(1, args.chunk_rows // args.batch_size * 4)
  n = out.shape[1]

  def step(i):
    nonlocal hp, opt_state, rows, chunk
    if chunk is None or (i - 1) % steps_per_chunk == 0:
      rows = np.sort(rng.choice(len(enc), min(args.chunk_rows, len(enc)),
                                replace=False))
      chunk = chunk_of(rows)
    hidden, (ck, cv), c_enc, c_out = chunk
    idx = jnp.asarray(rng.choice(hidden.shape[0], args.batch_size,
                                 replace=False))
    positions = jnp.asarray(
        rng.integers(0, n, (args.batch_size, args.positions)), jnp.int32)
    hp, opt_state, loss, m = step_fn(
        hp, opt_state, params, hidden[idx], (ck[idx], cv[idx]), c_enc[idx],
        c_out[idx], positions)
    return round(float(loss), 4), m

  last = training.method_steps(
      out_dir, args.out_dir, first, args.steps, step,
      lambda i: heads.save_head(hp, head_cfg, out_dir, i, extra_files=(
          training.run_state_files(opt_state, rng,
                                   rows=[int(r) for r in rows]))),
      saved, save_every=args.save_every, log_every=50)
  sums, counts = heads_train.depth_alpha(model, params, head, hp, test,
                                         test_out, args.depth)
  alpha = [round(float(s / max(c, 1)), 4) for s, c in zip(sums, counts)]
  rec = {'held_out_alpha_t0': alpha, 'rows': held_out,
         'note': 'alpha of head steps 1..depth (draft k of the merged loop)'}
  with open(os.path.join(out_dir, training.LOG_FILE), 'a') as log:
    log.write(json.dumps(rec) + '\n')
  if args.export_dir:
    export(args, out_dir, hp, head_cfg, model.config)
  print(training.method_line(
      args.out_dir, first, args.steps, args.steps, last,
      [f"held-out alpha by head step {'/'.join(f'{a:.3g}' for a in alpha)} "
       f'({held_out})']), flush=True)


def export(args, out_dir, hp, head_cfg, config):
  """The final head `hp` in bfloat16 and the log into --export_dir (local
  or gs://). A rerun finds the same head there and keeps it; another head
  at that step is refused (a checkpoint is never overwritten)."""
  path = str(bucket_folder.join(args.export_dir, f'checkpoint_{args.steps}'))
  if checkpoints.isdir(path):
    there, there_cfg = heads.load_head(path, config)
    same = there_cfg == head_cfg and all(jax.tree.leaves(jax.tree.map(
        lambda a, b: np.array_equal(a, jnp.asarray(b, jnp.bfloat16)),
        there, hp)))
    if not same:
      raise checks.InputError(f'--export_dir: {path} holds another head; '
                              'delete it or name another folder.')
    said = 'already there'
  else:
    path, said = heads.save_head(hp, head_cfg, args.export_dir, args.steps,
                                 dtype=jnp.bfloat16), 'bfloat16'
  with open(os.path.join(out_dir, training.LOG_FILE), 'rb') as f:
    bucket_folder.write_file(bucket_folder.join(
        args.export_dir, training.LOG_FILE), f.read())
  print(f'exported {path} ({said})', flush=True)


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
