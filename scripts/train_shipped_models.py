r"""Trains the shipped mini models: a multi-task target and distilled drafters.

  python scripts/export_arrays.py --out_dir ~/.cache/specdec_jax/arrays
  python scripts/train_shipped_models.py \
      --arrays ~/.cache/specdec_jax/arrays --work_dir ~/models/shipped

Stages (`--stages`, default all; each resumes / skips what is done):

1. target: MINI_XXL on both Debian tasks (gin_configs/train/
   multitask_mini_xxl.gin) at each of `--target_lrs`, the runs side by side;
   the one with the lowest final validation loss is the target
   (`work_dir/target.json`).
2. generate: the target's own outputs over the train inputs, greedy and one
   t = 1 sample each, and greedy over the validation inputs
   (`distill.generate`, sharded, resumable) -> `work_dir/generated`.
3. drafters: each `--drafters` entry `<model>_<loss>` trained side by side
   (gin_configs/train/distill.gin): model small / base / large (the paper's
   three roles, mini_{small,base,large}.gin) or gpu (deep encoder, one
   decoder layer, mini_gpu.gin); loss `ref` (plain training on the
   references: the drafters as before), `ce` (sequence-level KD: cross
   entropy on the target's outputs), `fkl` / `tvd` (token-level KD against
   the target's logits, on the target's outputs).
4. export: every model in bfloat16 in T5X's checkpoint layout under
   `work_dir/export/<name>/checkpoint_<step>` with `models.json` (configs,
   steps, final validation metrics, the commands), ready for
   `scripts/ship_models.py` to choose and commit.

Runs of one stage go side by side (`--parallel`, default on): on a GPU these
small models leave the device mostly idle, so several runs share it. Every
run is a plain `scripts/train.py` job, capped by wall time (`--*_seconds`)
and resumable. Needs jax, flax, optax, orbax, numpy and gin-config (no
seqio / TensorFlow: the data are arrays).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from specdec_jax import checks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILES = {
    'xxl': ('train/mini_xxl.gin', '%MINI_XXL'),
    'large': ('train/mini_large.gin', '%MINI_LARGE'),
    'base': ('train/mini_base.gin', '%MINI_BASE'),
    'small': ('train/mini_small.gin', '%MINI_SMALL'),
    'dec1': ('train/mini_dec1.gin', '%MINI_DEC1'),
    'dec2': ('train/mini_dec2.gin', '%MINI_DEC2'),
}
# Cut from the target, then distilled (INIT_FROM_TEACHER).
FROM_TEACHER = ('dec1', 'dec2')
LOSSES = ('ref', 'ce', 'fkl', 'tvd')
DEFAULT_DRAFTERS = 'small_fkl,large_fkl,dec1_fkl,dec2_fkl'
DRAFTERS = tuple(f'{kind}_{loss}' for kind in MODEL_FILES for loss in LOSSES)


def _gin_str(value):
  return "'" + str(value) + "'"


def _launch(name, flags, log_dir, env):
  """Starts one scripts/train.py run; its output goes to log_dir/name.txt."""
  cmd = [sys.executable, os.path.join(REPO, 'scripts', 'train.py'),
         '--no_progress'] + flags
  os.makedirs(log_dir, exist_ok=True)
  out = open(os.path.join(log_dir, f'{name}.txt'), 'w')
  print(f'[{time.strftime("%H:%M:%S")}] start {name}: {" ".join(cmd[1:])}',
        flush=True)
  return name, cmd, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                     env=env, cwd=REPO), out


def _run_all(jobs, parallel):
  """Runs `(name, thunk)` launches side by side or one by one; checks rc."""
  failed = []
  running = []
  for name, start in jobs:
    running.append(start())
    if not parallel:
      _wait(running.pop(), failed)
  for job in running:
    _wait(job, failed)
  if failed:
    raise SystemExit(f'runs failed: {failed} (see their logs)')


def _wait(job, failed):
  name, _, proc, out = job
  rc = proc.wait()
  out.close()
  print(f'[{time.strftime("%H:%M:%S")}] done {name}: rc {rc}', flush=True)
  if rc:
    failed.append(name)


def _last(model_dir, split):
  from specdec_jax import training  # pylint: disable=g-import-not-at-top
  rows = [r for r in training.read_log(os.path.join(model_dir, 'log.jsonl'))
          if r['split'] == split]
  return rows[-1] if rows else None


def _env(parallel_runs):
  env = dict(os.environ)
  env.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  if parallel_runs > 1:
    env.setdefault('XLA_PYTHON_CLIENT_MEM_FRACTION',
                   f'{0.9 / parallel_runs:.3f}')
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  return env


def stage_target(args):
  lrs = args.target_lrs
  env = _env(len(lrs) if args.parallel else 1)
  jobs = []
  for lr in lrs:
    model_dir = os.path.join(args.work_dir, f'target_lr{lr:g}')
    flags = ['--gin_file=train/multitask_mini_xxl.gin',
             f'--gin.ARRAY_DIR={_gin_str(os.path.join(args.arrays, "multitask"))}',
             f'--gin.MODEL_DIR={_gin_str(model_dir)}',
             f'--gin.LEARNING_RATE={lr}',
             f'--gin.MAX_SECONDS={args.target_seconds}'] + args.extra
    jobs.append((f'target_lr{lr:g}',
                 lambda f=flags, n=f'target_lr{lr:g}': _launch(
                     n, f, os.path.join(args.work_dir, 'logs'), env)))
  _run_all(jobs, args.parallel)
  results = {}
  for lr in lrs:
    model_dir = os.path.join(args.work_dir, f'target_lr{lr:g}')
    results[lr] = (_last(model_dir, 'validation') or {}).get('loss', 1e9)
  best = min(results, key=results.get)
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  model_dir = os.path.join(args.work_dir, f'target_lr{best:g}')
  record = dict(learning_rate=best, model_dir=model_dir,
                checkpoint=checkpoints.latest_checkpoint(model_dir),
                validation_loss_by_lr={f'{k:g}': v for k, v in
                                       results.items()})
  with open(os.path.join(args.work_dir, 'target.json'), 'w') as f:
    json.dump(record, f, indent=1)
  print('target:', record, flush=True)
  return record


def _target(args):
  with open(os.path.join(args.work_dir, 'target.json')) as f:
    return json.load(f)


def stage_generate(args):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import arrays, checkpoints, distill, network  # pylint: disable=g-import-not-at-top

  target = _target(args)
  config = _mini_config('xxl')
  model = network.T5Model(config)
  params = checkpoints.load_t5x_params(target['checkpoint'], config=config,
                                       dtype=jnp.float32)
  out_dir = os.path.join(args.work_dir, 'generated')
  src = os.path.join(args.arrays, 'multitask')
  for split, temperature, tag in (('validation', 0.0, 'greedy'),
                                  ('train', 0.0, 'greedy'),
                                  ('train', 1.0, 'sample')):
    data = arrays.load(src, split)
    distill.generate(model, params, data, out_dir, split,
                     max_decode_len=args.max_decode_len,
                     batch_size=args.gen_batch, temperature=temperature,
                     seed=1, tag=tag, num_examples=args.gen_examples)


def _mini_config(kind):
  """The T5Config of a mini model file, read through gin."""
  import gin  # pylint: disable=g-import-not-at-top
  from specdec_jax import gin_utils  # pylint: disable=g-import-not-at-top
  from specdec_jax import network  # pylint: disable=g-import-not-at-top
  path, macro = MODEL_FILES[kind]
  gin_utils.parse([path])
  config = gin.query_parameter(macro).scoped_configurable_fn()
  gin.clear_config(clear_constants=True)
  assert isinstance(config, network.T5Config), config
  return config


def stage_drafters(args):
  target = _target(args)
  names = args.drafters
  env = _env(len(names) if args.parallel else 1)
  jobs = []
  for name in names:
    kind, loss = name.rsplit('_', 1)
    gin_file, macro = MODEL_FILES[kind]
    model_dir = os.path.join(args.work_dir, name)
    data = (os.path.join(args.arrays, 'multitask') if loss == 'ref'
            else os.path.join(args.work_dir, 'generated'))
    flags = ['--gin_file=train/distill.gin', f'--gin_file={gin_file}',
             f'--gin.MODEL={macro}', f'--gin.ARRAY_DIR={_gin_str(data)}',
             f'--gin.MODEL_DIR={_gin_str(model_dir)}',
             f'--gin.MAX_SECONDS={args.drafter_seconds}']
    if loss in ('ref', 'ce'):
      flags += ['--gin.TEACHER_MODEL=None', '--gin.TEACHER_CHECKPOINT=None',
                "--gin.KD_LOSS='none'", '--gin.KD_WEIGHT=0.0']
    else:
      flags += [f'--gin.TEACHER_CHECKPOINT={_gin_str(target["checkpoint"])}',
                f"--gin.KD_LOSS='{loss}'"]
    if kind in FROM_TEACHER:
      if loss in ('ref', 'ce'):
        raise SystemExit(f'{name}: {kind} is cut from the target; use a KD '
                         'loss (fkl / tvd).')
      flags.append('--gin.INIT_FROM_TEACHER=True')
    flags += args.extra
    jobs.append((name, lambda f=flags, n=name: _launch(
        n, f, os.path.join(args.work_dir, 'logs'), env)))
  _run_all(jobs, args.parallel)


def stage_export(args):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top

  target = _target(args)
  export = os.path.join(args.work_dir, 'export')
  models = {}
  runs = {'target': (target['model_dir'], 'xxl')}
  for name in args.drafters:
    runs[name] = (os.path.join(args.work_dir, name), name.rsplit('_', 1)[0])
  for name, (model_dir, kind) in runs.items():
    latest = checkpoints.latest_checkpoint(model_dir)
    if latest is None:
      print(f'skip {name}: no checkpoint', flush=True)
      continue
    config = _mini_config(kind)
    params = checkpoints.load_t5x_params(latest, config=config)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
    step = int(os.path.basename(latest).split('_')[-1])
    out = os.path.join(export, name)
    if checkpoints.latest_checkpoint(out) is None:
      checkpoints.save_t5x_params(params, out, step)
    cfg = {k: v for k, v in dataclasses.asdict(config).items()
           if k != 'dtype'}
    cfg['mlp_activations'] = list(cfg['mlp_activations'])
    models[name] = dict(kind=kind, config=cfg, step=step,
                        checkpoint=f'{name}/checkpoint_{step}',
                        validation=_last(model_dir, 'validation'),
                        train=_last(model_dir, 'train'))
    for fname in ('log.jsonl', 'config.gin'):
      src = os.path.join(model_dir, fname)
      if os.path.isfile(src):
        with open(src) as f, open(os.path.join(out, fname), 'w') as g:
          g.write(f.read())
  with open(os.path.join(export, 'models.json'), 'w') as f:
    json.dump(dict(target=target, models=models,
                   command=' '.join(sys.argv)), f, indent=1)
  print(f'exported {sorted(models)} to {export}', flush=True)


STAGES = dict(target=stage_target, generate=stage_generate,
              drafters=stage_drafters, export=stage_export)


def _names(known):
  """A flag's comma-separated names, each one of `known` (argparse's
  error naming the flag and the known names otherwise)."""
  def parse(text):
    names = tuple(x for x in text.split(',') if x)
    unknown = [x for x in names if x not in known]
    if unknown or not names:
      raise argparse.ArgumentTypeError(
          f'unknown {unknown or text!r}; known: {",".join(known)}')
    return names
  return parse


def _seed(text):
  """--seed: 'RUN=CHECKPOINT' as (run, checkpoint) (as the flag's type)."""
  run, _, checkpoint = text.partition('=')
  if not run or '/' in run or not checkpoint:
    raise argparse.ArgumentTypeError(
        f'RUN=CHECKPOINT expected (e.g. small_fkl=/w/small_fkl/'
        f'checkpoint_2000), got {text!r}')
  return run, checkpoint


def parse_flags(argv):
  """The command's flags; a bad one is the parser's error naming it,
  before any stage runs."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--arrays', required=True,
                      help='scripts/export_arrays.py output')
  parser.add_argument('--work_dir', type=checks.local_path, required=True)
  parser.add_argument('--stages', type=_names(STAGES),
                      default=','.join(STAGES))
  parser.add_argument('--target_lrs', default='0.003,0.01,0.03', type=(
      lambda text: tuple(checks.positive(x) for x in text.split(','))))
  parser.add_argument('--target_seconds', type=checks.positive, default=240)
  parser.add_argument('--drafters', type=_names(DRAFTERS),
                      default=DEFAULT_DRAFTERS)
  parser.add_argument('--drafter_seconds', type=checks.positive, default=180)
  parser.add_argument('--max_decode_len', type=checks.count, default=64)
  parser.add_argument('--gen_batch', type=checks.count, default=512)
  parser.add_argument('--gen_examples', type=checks.count, default=None,
                      help='decode only the first N rows of each split')
  parser.add_argument('--serial', dest='parallel', action='store_false',
                      help='one run at a time (default: side by side)')
  parser.add_argument('--extra', action='append', default=[],
                      help='extra train.py flag for every run, e.g. '
                      '--extra=--gin.TRAIN_STEPS=5 (smoke runs)')
  parser.add_argument('--seed', action='append', default=[], type=_seed,
                      help='RUN=CHECKPOINT: start run RUN (e.g. target_lr0.03, '
                      'small_fkl) from this checkpoint folder (copied into its '
                      'model dir if it has none; params only, fresh Adafactor '
                      'statistics): continues an earlier session\'s training')
  args = parser.parse_args(argv)
  cut = [n for n in args.drafters if n.rsplit('_', 1)[0] in FROM_TEACHER
         and n.rsplit('_', 1)[1] in ('ref', 'ce')]
  if cut:  # found before the target's training, not after it
    parser.error(f'--drafters {",".join(cut)}: {"/".join(FROM_TEACHER)} are '
                 'cut from the target; use a KD loss (fkl / tvd)')
  return args


def _seeds(args):
  """The --seed checkpoints to copy, (folder, model dir) each; raises
  InputError for one that is no folder (before anything is written)."""
  copies = []
  for run, checkpoint in args.seed:
    model_dir = os.path.join(args.work_dir, run)
    if os.path.isdir(model_dir) and any(
        n.startswith('checkpoint_') for n in os.listdir(model_dir)):
      continue  # the run has its own checkpoints: the seed was copied
    if not os.path.isdir(checkpoint):
      raise checks.InputError(f'--seed {run}={checkpoint}: {checkpoint} is '
                              'not a checkpoint folder.')
    copies.append((checkpoint, model_dir))
  return copies


def main(argv=None):
  args = parse_flags(sys.argv[1:] if argv is None else argv)
  # Refused before anything is written: a file where --work_dir would be,
  # a seed that is not there, a later stage without the target's record.
  checks.check_local_folder('--work_dir', args.work_dir)
  copies = _seeds(args)
  if args.stages[0] != 'target' and not os.path.isfile(
      os.path.join(args.work_dir, 'target.json')):
    raise checks.InputError(
        f'--stages {",".join(args.stages)} needs the target stage\'s '
        f'{os.path.join(args.work_dir, "target.json")}: run the target '
        'stage first (add it to --stages), or give the --work_dir it ran in.')
  os.makedirs(args.work_dir, exist_ok=True)
  for checkpoint, model_dir in copies:
    shutil.copytree(checkpoint, os.path.join(
        model_dir, os.path.basename(checkpoint.rstrip('/'))))
    log = os.path.join(os.path.dirname(checkpoint.rstrip('/')), 'log.jsonl')
    if os.path.isfile(log):
      shutil.copy(log, os.path.join(model_dir, 'log.jsonl'))
  for stage in args.stages:
    tic = time.perf_counter()
    STAGES[stage](args)
    print(f'[{time.strftime("%H:%M:%S")}] stage {stage}: '
          f'{time.perf_counter() - tic:.0f} s', flush=True)


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
