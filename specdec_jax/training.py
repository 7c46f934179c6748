r"""Trains T5 models on seqio tasks the way T5X trains T5.

The recipe is T5X's (t5x/models.py, t5x/losses.py, t5x/adafactor.py, the
t5_1_1 gin files), on our network:

- Batches: a seqio task, trimmed to `task_feature_lengths` (EOS kept), run
  through `seqio.EncDecFeatureConverter(pack=False)`: encoder inputs, decoder
  inputs (the targets shifted right, BOS = 0), decoder targets and loss
  weights, padded with 0 to fixed shapes. Packing is not supported (our
  network has no segment ids).
- Loss: per real (non-padding) target token, cross entropy plus T5X's z-loss
  `z_loss * logsumexp(logits)**2` (1e-4), averaged over the batch's real
  target tokens (T5X's 'NUM_REAL_TARGET_TOKENS' normalization).
- Optimizer: optax.adafactor with T5X's settings: factored second moments,
  decay_rate 0.8, no momentum, update clipping at RMS 1.0, updates scaled by
  the parameter RMS (so the learning rate is relative).
- Learning rate: 'rsqrt' is T5X's pretraining schedule `constant *
  rsqrt_decay`: `learning_rate` for the first `warmup_steps` steps, then
  `learning_rate * sqrt(warmup_steps / step)`; 'constant' (T5X's fine-tuning
  schedule, 1e-3 there). The rate is computed from the checkpointed train
  step, not from the optimizer's counter.
- No dropout: our network implements none, so `T5Config.dropout_rate` is
  ignored and training runs as T5 1.1 pretraining does (dropout 0). Small
  data sets can therefore overfit; the validation loss in the log shows it.
- Seeds: `seed` draws the initial parameters and the data order (seqio's
  shuffle seed), so a rerun with the same seed is identical, step for step.
- Checkpoints: `model_dir/checkpoint_<step>` in T5X's orbax layout
  (`checkpoints.save_t5x_params`, read back by `load_t5x_params` and by T5X),
  plus `optimizer_state.msgpack` (the Adafactor statistics, flax
  serialization) in the same folder. Every `checkpoint_period` steps and at
  the end; the last `keep_checkpoints` are kept. A rerun resumes from the
  latest one and skips the batches already seen, so an interrupted run ends
  with the same parameters as an uninterrupted one; a checkpoint whose save
  was cut short (`SAVING_FILE` names its step) is removed first, and the
  run resumes from the one before. SIGTERM (a preemption's notice) or
  Ctrl-C stops the run after the step running, with a checkpoint (a
  second one stops it at once). The teacher's params are read only to
  distill or to start from, and the validation split only when there are
  steps to run.
- Logs: `model_dir/log.jsonl`, one record per `log_period` steps
  (`split: 'train'`, means over those steps) and per evaluation (`split:
  'validation'`): step, loss (cross entropy + z-loss, T5X's 'loss'),
  cross_ent_loss, z_loss, accuracy (argmax == target, real tokens), lr,
  steps_per_sec (data + train step; the first record includes compiling),
  seconds (wall clock, summed over resumed runs).

`model_dir` is a local folder or a gs:// address (kept in a local copy,
copied to the bucket when the step being saved is named and again once the
checkpoint is whole: bucket_folder.py). Batches come from
`data.task_train_batches` / `data.task_eval_batches` (seqio, imported when
called) or from pre-tokenized arrays (`arrays.array_train_batches` /
`arrays.array_eval_batches`, no seqio). `main` is the job as a command
line (scripts/train.py): T5X-style flags and gin files (`gin_utils`), then
`train`.

References: T5, arXiv:1910.10683; Adafactor, arXiv:1804.04235; z-loss,
arXiv:2202.08906 (ST-MoE) and arXiv:2204.02311 (PaLM).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Tuple)

from flax import serialization
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import arrays
from specdec_jax import bucket_folder
from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import data
from specdec_jax import distill
from specdec_jax import gin_utils
from specdec_jax import network
from specdec_jax import run_folder
from specdec_jax import tasks

Array = jax.Array
PyTree = Any
Batch = data.Batch

Z_LOSS = 1e-4
LOG_FILE = 'log.jsonl'
OPTIMIZER_STATE_FILE = 'optimizer_state.msgpack'
# In the model dir while a checkpoint is being saved: its step. A save is
# not atomic (orbax puts the params in place, then the optimizer state and
# the manifest are written), so a run that finds this file resumes from the
# checkpoint before (`remove_cut_short_save`).
SAVING_FILE = 'saving.json'
# Beside a checkpoint of a loop that draws its batches from a numpy
# generator (the method training scripts): its state (`run_state_files`).
DATA_STATE_FILE = 'data_state.json'
SCHEDULES = ('rsqrt', 'constant')


@struct.dataclass
class TrainState:
  """What a train step reads and writes.

  Attributes:
    step: `[]` int32, the number of steps taken.
    params: the T5X params tree.
    opt_state: the Adafactor state (factored second-moment statistics).
  """

  step: Array
  params: PyTree
  opt_state: optax.OptState


# ---------------------------------------------------------------- recipe ---
def learning_rate_fn(learning_rate: float, schedule: str = 'rsqrt',
                     warmup_steps: int = 10_000
                     ) -> Callable[[Array], Array]:
  """The learning rate of each step.

  Args:
    learning_rate: the peak (and initial) rate.
    schedule: 'rsqrt' (T5X's `constant * rsqrt_decay`: constant for
      `warmup_steps`, then decaying as 1 / sqrt(step)) or 'constant'.
    warmup_steps: length of the constant phase of 'rsqrt'. T5X pretrains
      with learning_rate 0.01 and warmup_steps 10000.

  Returns:
    `step -> rate`, step `[]` int (0 for the first step), rate `[]` float32.
  """
  checks.check_positive('learning_rate', learning_rate)
  if schedule == 'constant':
    return lambda step: jnp.asarray(learning_rate, jnp.float32)
  if schedule == 'rsqrt':
    if warmup_steps < 1:
      raise checks.InputError(
          f'warmup_steps must be >= 1, got {warmup_steps}.')

    def rsqrt(step):
      step = jnp.maximum(jnp.asarray(step, jnp.float32), warmup_steps)
      return jnp.asarray(learning_rate, jnp.float32) * jnp.sqrt(
          warmup_steps / step)

    return rsqrt
  raise checks.InputError(
      f'schedule must be one of {SCHEDULES}, got {schedule!r}.')


def make_optimizer(learning_rate: Any) -> optax.GradientTransformation:
  """optax Adafactor with T5X's T5 settings (t5x/adafactor.py defaults).

  Args:
    learning_rate: a float or a `[]` array (the step's rate; traced values
      are fine, the state does not depend on it).

  Returns:
    The transformation; its state holds no learning rate, so `init` of any
    rate gives the state of every rate.
  """
  return optax.adafactor(
      learning_rate=learning_rate,
      min_dim_size_to_factor=128,
      decay_rate=0.8,
      decay_offset=0,
      multiply_by_parameter_scale=True,
      clipping_threshold=1.0,
      momentum=None,
      factored=True,
      eps=1e-30,
  )


@functools.lru_cache(maxsize=None)
def _init_fn(model: network.T5Model) -> Callable[[Array], TrainState]:
  """Jitted `key -> TrainState` (one compile instead of ~70 eager ones)."""

  def init(key):
    params = model.init_params(key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=make_optimizer(0.0).init(params))

  return jax.jit(init)


def init_state(model: network.T5Model, seed: int) -> TrainState:
  """Random parameters (T5X's initializers, `PRNGKey(seed)`), fresh state."""
  return _init_fn(model)(jax.random.key(seed))


def weighted_metrics(logits: Array, targets: Array, weights: Array,
                     z_loss: float = Z_LOSS) -> Dict[str, Array]:
  """Sums of T5X's per-token losses over the weighted (real) tokens.

  Per token, cross_ent = logsumexp(logits) - logits[target] and z_loss =
  `z_loss` * logsumexp(logits)**2 (T5X's `cross_entropy_with_logits` with
  one-hot targets and no label smoothing).

  Args:
    logits: `[batch, length, vocab]`.
    targets: `[batch, length]` int token ids.
    weights: `[batch, length]`, 1 on real tokens and 0 on padding.
    z_loss: coefficient of the z-loss.

  Returns:
    `[]` float32 sums: 'loss' (cross_ent + z_loss), 'cross_ent_loss',
    'z_loss', 'correct' (argmax == target) and 'weight' (the number of real
    tokens); divide by 'weight' for means (`normalize`).
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  # [batch, length, vocab] -> [batch, length]
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)
  cross_ent = log_z - target_logit[..., 0]
  z = z_loss * jnp.square(log_z)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {
      'loss': jnp.sum((cross_ent + z) * weights),
      'cross_ent_loss': jnp.sum(cross_ent * weights),
      'z_loss': jnp.sum(z * weights),
      'correct': jnp.sum(correct * weights),
      'weight': jnp.sum(weights),
  }


def normalize(sums: Mapping[str, Any]) -> Dict[str, float]:
  """Per-token means of `weighted_metrics` sums (summed over batches)."""
  weight = max(float(sums['weight']), 1.0)
  out = {
      'loss': float(sums['loss']) / weight,
      'cross_ent_loss': float(sums['cross_ent_loss']) / weight,
      'z_loss': float(sums['z_loss']) / weight,
      'accuracy': float(sums['correct']) / weight,
  }
  for key in ('kd', 'beta'):  # distillation: divergence and alpha on batch
    if key in sums:
      out[key] = float(sums[key]) / weight
  return out


def _batch_metrics(model: network.T5Model, params: PyTree,
                   batch: Mapping[str, Array], z_loss: float):
  # [batch, input_len], [batch, target_len] -> [batch, target_len, vocab]
  logits = model.logits(params, batch['encoder_input_tokens'],
                        batch['decoder_input_tokens'],
                        batch['decoder_target_tokens'])
  return weighted_metrics(logits, batch['decoder_target_tokens'],
                          batch['decoder_loss_weights'], z_loss)


@functools.lru_cache(maxsize=None)
def make_train_step(model: network.T5Model, learning_rate: float,
                    schedule: str = 'rsqrt', warmup_steps: int = 10_000,
                    z_loss: float = Z_LOSS,
                    teacher: Optional[network.T5Model] = None,
                    kd_loss: str = 'none', kd_weight: float = 0.0
                    ) -> Callable[..., tuple[TrainState, Dict[str, Array]]]:
  """The jitted train step (compiled once per model, settings and shape).

  Args:
    model: the network.
    learning_rate: peak rate (see `learning_rate_fn`).
    schedule: 'rsqrt' or 'constant'.
    warmup_steps: constant phase of 'rsqrt'.
    z_loss: z-loss coefficient.
    teacher: a frozen target for token-level distillation (`distill.py`).
    kd_loss: 'none', 'fkl' or 'tvd' (`distill.token_kd_sums`).
    kd_weight: the per-token loss is `(1 - kd_weight) * (cross_ent + z_loss)
      + kd_weight * kd` (0: plain training, 1: pure token-level KD).

  Returns:
    `train_step(state, batch[, teacher_params]) -> (state, metrics)`: batch
    holds `data.FEATURES`, each `[batch, length]`; metrics are the
    `weighted_metrics` sums of the batch (before the update), 'lr' (the rate
    applied) and, when distilling, 'kd' and 'beta' sums.
  """
  lr_fn = learning_rate_fn(learning_rate, schedule, warmup_steps)
  distilling = kd_loss != 'none'
  if kd_loss not in distill.KD_LOSSES:
    raise checks.InputError(f'kd_loss must be one of {distill.KD_LOSSES}, got '
                            f'{kd_loss!r}.')
  if distilling and teacher is None:
    raise checks.InputError(f'kd_loss={kd_loss!r} needs a teacher model.')
  if not 0.0 <= kd_weight <= 1.0:
    raise checks.InputError(f'kd_weight must be in [0, 1], got {kd_weight}.')

  def loss_fn(params, batch, teacher_params):
    if not distilling:
      sums = _batch_metrics(model, params, batch, z_loss)
      return sums['loss'] / jnp.maximum(sums['weight'], 1.0), sums
    # [batch, input_len], [batch, target_len] -> [batch, target_len, vocab]
    logits = model.logits(params, batch['encoder_input_tokens'],
                          batch['decoder_input_tokens'],
                          batch['decoder_target_tokens'])
    teacher_logits = jax.lax.stop_gradient(teacher.logits(
        teacher_params, batch['encoder_input_tokens'],
        batch['decoder_input_tokens'], batch['decoder_target_tokens']))
    sums = weighted_metrics(logits, batch['decoder_target_tokens'],
                            batch['decoder_loss_weights'], z_loss)
    sums.update(distill.token_kd_sums(logits, teacher_logits,
                                      batch['decoder_loss_weights'], kd_loss))
    total = (1.0 - kd_weight) * sums['loss'] + kd_weight * sums['kd']
    return total / jnp.maximum(sums['weight'], 1.0), sums

  @jax.jit
  def train_step(state: TrainState, batch: Batch, teacher_params=None):
    grads, sums = jax.grad(loss_fn, has_aux=True)(state.params, batch,
                                                  teacher_params)
    lr = lr_fn(state.step)
    updates, opt_state = make_optimizer(lr).update(grads, state.opt_state,
                                                   state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(step=state.step + 1, params=params,
                           opt_state=opt_state)
    return new_state, dict(sums, lr=lr)

  return train_step


@functools.lru_cache(maxsize=None)
def make_eval_step(model: network.T5Model, z_loss: float = Z_LOSS
                   ) -> Callable[[PyTree, Batch], Dict[str, Array]]:
  """Jitted `eval_step(params, batch) -> weighted_metrics sums`."""
  return jax.jit(functools.partial(_batch_metrics, model, z_loss=z_loss))


def eval_loss(model: network.T5Model, params: PyTree,
              batches: Sequence[Batch], z_loss: float = Z_LOSS
              ) -> Dict[str, float]:
  """Teacher-forced loss and accuracy over `batches`, per real token."""
  eval_step = make_eval_step(model, z_loss)
  total = None
  for batch in batches:
    sums = jax.device_get(eval_step(params, batch))
    total = sums if total is None else jax.tree.map(np.add, total, sums)
  if total is None:
    raise ValueError('No evaluation batches.')
  return normalize(total)


# ----------------------------------------------------------- checkpoints ---
def save_checkpoint(state: TrainState, model_dir: str,
                    keep_checkpoints: int = 1,
                    on_write: Optional[Callable[[], Any]] = None) -> str:
  """Writes `model_dir/checkpoint_<step>` and prunes older ones.

  Args:
    state: the state to save.
    model_dir: the model dir.
    keep_checkpoints: how many of the newest checkpoint folders to keep.
    on_write: called once the step being saved is named (SAVING_FILE) and
      once the checkpoint is whole and the older ones pruned (a model dir in
      a bucket is copied up then: `train`).

  Returns:
    The new checkpoint folder (T5X orbax params + OPTIMIZER_STATE_FILE,
    both in its checksum manifest, which restore_checkpoint verifies).
  """
  step = int(state.step)
  return save_whole(model_dir, step, lambda: checkpoints.save_t5x_params(
      jax.device_get(state.params), model_dir, step,
      extra_files=run_state_files(state.opt_state)),
                    keep_checkpoints, on_write)


def save_whole(model_dir: str, step: int, save: Callable[[], str],
               keep_checkpoints: Optional[int] = 1,
               on_write: Optional[Callable[[], Any]] = None) -> str:
  """Runs `save()`, which writes `model_dir/checkpoint_<step>` and returns
  it, as a save a rerun can tell was cut short (SAVING_FILE names `step`
  meanwhile: `remove_cut_short_save`); then prunes all but the
  `keep_checkpoints` newest checkpoints (None: keeps every one). `on_write`
  as `save_checkpoint`'s."""
  saving = os.path.join(model_dir, SAVING_FILE)
  bucket_folder.write_file(saving, json.dumps({'step': step}).encode())
  if on_write is not None:
    on_write()
  path = save()
  checkpoints.delete(saving)  # the checkpoint is whole
  if keep_checkpoints is not None:
    for _, old in checkpoints.all_steps(model_dir)[:-max(keep_checkpoints,
                                                         1)]:
      shutil.rmtree(old)
  if on_write is not None:
    on_write()
  return path


def run_state_files(opt_state: optax.OptState,
                    rng: Optional[np.random.Generator] = None,
                    **values) -> Dict[str, bytes]:
  """The files beside a checkpoint's params that resume its run exactly
  (`save_t5x_params`' extra_files, in its checksum manifest): the optimizer
  state (OPTIMIZER_STATE_FILE) and, for a loop that draws its batches from
  a numpy generator, that generator's state and the JSON `values` it needs
  (DATA_STATE_FILE: the rows of a chunk being trained on, say)."""
  files = {OPTIMIZER_STATE_FILE: serialization.to_bytes(
      jax.device_get(opt_state))}
  if rng is not None:
    files[DATA_STATE_FILE] = json.dumps(
        dict(values, rng=rng.bit_generator.state)).encode()
  return files


def restore_run_state(path: str, opt_state: optax.OptState,
                      rng: Optional[np.random.Generator] = None
                      ) -> Tuple[optax.OptState, Dict[str, Any]]:
  """What `run_state_files` saved in the checkpoint `path`: `(the optimizer
  state, the values)`, `rng` set to the state saved. Where the checkpoint
  holds no optimizer state (T5X's params only), `opt_state` as given, a
  fresh one, with a warning; where it holds no generator's, `rng` as given,
  with a warning.
  """
  opt_file = os.path.join(path, OPTIMIZER_STATE_FILE)
  if checkpoints.isfile(opt_file):
    opt_state = serialization.from_bytes(opt_state,
                                         checkpoints.read_bytes(opt_file))
  else:
    logging.warning('%s has no %s; the optimizer statistics start afresh.',
                    path, OPTIMIZER_STATE_FILE)
  data_file = os.path.join(path, DATA_STATE_FILE)
  if rng is None:
    return opt_state, {}
  if not checkpoints.isfile(data_file):
    logging.warning('%s has no %s; the batches are drawn afresh.', path,
                    DATA_STATE_FILE)
    return opt_state, {}
  values = json.loads(checkpoints.read_bytes(data_file))
  rng.bit_generator.state = values.pop('rng')
  return opt_state, values


def remove_cut_short_save(model_dir: str) -> None:
  """Removes the checkpoint a crashed save left unfinished (its step in
  SAVING_FILE: params, perhaps without the optimizer state or the
  manifest), so that the run resumes from the one before, exactly."""
  saving = os.path.join(model_dir, SAVING_FILE)
  if not os.path.isfile(saving):
    return
  try:
    step = int(json.loads(checkpoints.read_bytes(saving))['step'])
  except (ValueError, KeyError, TypeError) as e:
    raise checks.InputError(
        f'{saving} is damaged ({type(e).__name__}); it names the checkpoint '
        'a save left unfinished: delete that checkpoint and this file.'
    ) from None
  cut_short = os.path.join(model_dir, f'checkpoint_{step}')
  if os.path.isdir(cut_short):
    logging.warning('%s was left unfinished by a save cut short: removed; '
                    'resuming from the checkpoint before it.', cut_short)
    shutil.rmtree(cut_short)
  os.remove(saving)


def restore_checkpoint(model: network.T5Model, path: str) -> TrainState:
  """The train state saved in a `checkpoint_<step>` folder.

  A folder without OPTIMIZER_STATE_FILE (a T5X params-only checkpoint)
  restores the params and step with fresh Adafactor statistics, with a
  warning. (A save of ours cut short is removed before a run resumes:
  `SAVING_FILE`.)

  Args:
    model: the network; the params must match its config.
    path: the `checkpoint_<step>` folder.

  Returns:
    The state at that step.
  """
  path = path.rstrip('/')
  step = checkpoints.step_of(path)
  if step is None:
    raise checks.InputError(f'{path} is not a checkpoint_<step> folder.')
  params = checkpoints.load_t5x_params(path, config=model.config,
                                       dtype=jnp.float32)
  opt_state, _ = restore_run_state(path, make_optimizer(0.0).init(params))
  return TrainState(step=jnp.asarray(step, jnp.int32), params=params,
                    opt_state=opt_state)


# -------------------------------------------------------------- the loop ---
def read_log(path: str) -> List[Dict[str, Any]]:
  """The records of a log.jsonl, local or gs:// (empty if there is
  none)."""
  if not checkpoints.isfile(path):
    return []
  text = checkpoints.read_bytes(path).decode()
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def log_up_to(path: str, step: int) -> List[Dict[str, Any]]:
  """Rewrites the local log at `path` with its records of steps up to
  `step` (those after came from a run that stopped before its next save;
  a record of no step, a finished run's closing one, goes too); returns
  them."""
  records = [r for r in read_log(path) if r.get('step', step + 1) <= step]
  with open(path, 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  return records


def append_step_record(log, step: int, loss: float, metrics: Mapping[str, Any],
                       seconds: float) -> Dict[str, Any]:
  """Appends a method training script's record of `step` to its open log
  (flushed) and prints it: `loss`, the accuracy at each draft position
  (`metrics`' 'accuracy_at' / 'weight_at' sums) and the run's `seconds`
  (to 0.1 s)."""
  accuracy = np.asarray(metrics['accuracy_at']) / np.maximum(
      np.asarray(metrics['weight_at']), 1)
  record = {'step': step, 'loss': loss,
            'accuracy_at': [round(float(a), 4) for a in accuracy],
            'seconds': round(seconds, 1)}
  log.write(json.dumps(record) + '\n')
  log.flush()
  print(record, flush=True)
  return record


def method_steps(out_dir: str, where: str, first: int, total: int,
                 step: Callable[[int], Tuple[float, Mapping[str, Any]]],
                 save: Callable[[int], str],
                 saved: Optional[Callable[[], Any]], *, save_every: int,
                 log_every: int) -> Optional[Dict[str, Any]]:
  """A method training script's loop, resumed after step `first` (0: a
  fresh run): `step(i)` trains step i and returns its loss and metrics,
  for i = first + 1 .. `total`. The log in `out_dir` keeps its records up
  to `first` (`log_up_to`; their 'seconds' run on over every run) and
  gets one (`append_step_record`) for the first step run, every
  `log_every`-th and the last; `save(i)` writes checkpoint_i
  (`save_whole`, `saved` after each write) every `save_every` steps and
  at the last. A signal (`stop_asked`) has the step running saved and
  logged, then ends the command (`run_folder.exit_stopped`, its
  `method_line` of `where`). Returns the last step's record (None: the
  log holds none)."""
  log_path = os.path.join(out_dir, LOG_FILE)
  kept = log_up_to(log_path, first)
  last = kept[-1] if kept else None
  t0 = time.time() - (last['seconds'] if last else 0.0)
  with open(log_path, 'a') as log, stop_asked() as asked:
    for i in range(first + 1, total + 1):
      loss, metrics = step(i)
      stop = asked()  # a signal: save this step, then end
      if i % log_every == 0 or i in (first + 1, total) or stop:
        last = append_step_record(log, i, loss, metrics, time.time() - t0)
      if i % save_every == 0 or i == total or stop:
        save_whole(out_dir, i, functools.partial(save, i),
                   keep_checkpoints=None, on_write=saved)
      if stop and i < total:
        log.close()
        run_folder.exit_stopped(stop, method_line(
            where, first, i, total, last, stopped_by=stop))
  return last


def method_start(out_dir: str, where: str, settings: Mapping[str, Any],
                 steps: int) -> Tuple[Optional[str], int]:
  """Where a method training script's run in `out_dir` (`where`: as the
  user named it) starts: (its latest checkpoint or None, its step), the
  folder claimed for `settings` first (`distill.claim_run`), a save cut
  short undone, and a run of more than `steps` refused (`check_steps`)."""
  distill.claim_run(out_dir, where, settings)
  remove_cut_short_save(out_dir)
  latest = checkpoints.latest_checkpoint(out_dir)
  first = checkpoints.step_of(latest) if latest else 0
  check_steps(where, first, steps)
  return latest, first


def check_steps(where: str, held: int, steps: int, flag: str = '--steps',
                folder: str = '--out_dir') -> None:
  """Refuses a rerun of fewer steps (`flag`) than the run in `where` holds
  (its latest checkpoint is of step `held`): it cannot make a run of
  `steps` (`train`'s and the method training scripts' alike)."""
  if held > steps:
    raise checks.InputError(
        f'{where} already holds step {held}, more than the {steps} asked '
        f'({flag}): give {flag} {held} or more to resume it, or another '
        f'{folder}.')


def _check_args(model_config, task_feature_lengths, train_steps, batch_size,
                periods, model_dir, rate, teacher):
  """`train`'s arguments, refused (`checks.InputError`) before anything
  loads; `rate`: `learning_rate_fn`'s, `teacher`: `_check_teacher_args`'."""
  bucket_folder.check_folder('model_dir', model_dir)
  if not isinstance(model_config, network.T5Config):
    raise checks.InputError(f'MODEL must be a T5Config, got {model_config!r}.')
  checks.check_feature_lengths(task_feature_lengths)
  checks.check_ints(train_steps=train_steps, batch_size=batch_size, **periods)
  learning_rate_fn(*rate)  # validates
  _check_teacher_args(model_config, *teacher)


def _check_teacher_args(model_config, teacher_config, teacher_checkpoint,
                        kd_loss, init_from_teacher):
  """A teacher comes with its checkpoint and MODEL's vocabulary; a KD loss
  and init_from_teacher need one."""
  if (teacher_config is None) != (teacher_checkpoint is None):
    raise checks.InputError(
        'teacher_config and teacher_checkpoint go together; got '
        f'{teacher_config!r} and {teacher_checkpoint!r}.')
  if teacher_config is None:
    for name, value in (('kd_loss', kd_loss),
                        ('init_from_teacher', init_from_teacher)):
      if value not in ('none', False):
        raise checks.InputError(f'{name}={value!r} needs teacher_config and '
                                'teacher_checkpoint.')
  elif teacher_config.vocab_size != model_config.vocab_size:
    raise checks.InputError(
        f'The teacher has vocab_size {teacher_config.vocab_size} but MODEL '
        f'has {model_config.vocab_size}: distillation needs one vocabulary.')


@dataclasses.dataclass(frozen=True)
class _Data:
  """A run's examples at `lengths` (`train`'s task_feature_lengths): the
  seqio task `name`, or the pre-tokenized array data set at `array_dir`
  (`train_arrays`: its train split, fit to `lengths`)."""

  name: str
  lengths: Dict[str, int]
  array_dir: Optional[str] = None
  train_arrays: Optional[arrays.Arrays] = None

  def eval_batches(self, batch_size: int, eval_examples: Optional[int]
                   ) -> List[Batch]:
    """The validation batches: the first `eval_examples` (None: all) of
    the validation split, none if `eval_examples` is 0.

    Raises:
      InputError: `eval_examples` is not 0 and the split has no example.
    """
    if eval_examples == 0:
      return []
    if self.array_dir is not None:
      found = arrays.array_eval_batches(
          _fit(arrays.load(self.array_dir, 'validation'), self.lengths),
          batch_size, eval_examples)
      where = f'The array data set {self.array_dir}'
    else:
      found = data.task_eval_batches(self.name, self.lengths, batch_size,
                                     eval_examples)
      where = f'Task {self.name}'
    if not found:
      raise checks.InputError(
          f'{where} has no validation example to evaluate: set '
          'train.eval_examples = 0 to train without validation.')
    return found

  def batches(self, batch_size: int, seed: int, start: int
              ) -> Iterator[Batch]:
    """The train batches from step `start + 1` on."""
    if self.array_dir is not None:
      return arrays.array_train_batches(self.train_arrays, batch_size, seed,
                                        start_step=start)
    return data.task_train_batches(self.name, self.lengths, batch_size, seed,
                                   start_step=start)


def _fit(examples: arrays.Arrays, lengths: Mapping[str, int]
         ) -> arrays.Arrays:
  """Array examples trimmed or padded to `lengths` (`arrays.fit`)."""
  return dict(inputs=arrays.fit(examples['inputs'], lengths['inputs']),
              targets=arrays.fit(examples['targets'], lengths['targets']))


def _open_data(model_config: network.T5Config, mixture_or_task_name: str,
               task_feature_lengths: Mapping[str, int],
               data_dir: Optional[str], array_dir: Optional[str]) -> _Data:
  """A run's examples (`train`'s arguments of the same names), once their
  vocabulary is checked to fit MODEL's; the task registered from `data_dir`
  if given."""
  train_arrays = None
  if array_dir is not None:
    train_arrays = arrays.load(array_dir, 'train')
    vocab_size = int(max(train_arrays['inputs'].max(),
                         train_arrays['targets'].max())) + 1
    source = f'array data set {array_dir}'
  else:
    if data_dir is not None:
      tasks.register_tasks(data_dir=data_dir)
    vocab_size = tasks.vocab_size(tasks.get_task(mixture_or_task_name))
    source = f'Task {mixture_or_task_name}'
  if vocab_size > model_config.vocab_size:
    raise checks.InputError(
        f'{source} has a vocabulary of {vocab_size} tokens but MODEL has '
        f'vocab_size {model_config.vocab_size}.')
  lengths = dict(task_feature_lengths)
  return _Data(mixture_or_task_name, lengths, array_dir,
               None if train_arrays is None else _fit(train_arrays, lengths))


@dataclasses.dataclass
class _Teacher:
  """The distillation target (`train`'s teacher_config, teacher_checkpoint:
  both None without one), its params loaded when first asked for: a run
  that resumes past the start reads them only to distill, and a rerun of
  a finished run not at all."""

  config: Optional[network.T5Config]
  checkpoint: Optional[str]

  @functools.cached_property
  def params(self) -> PyTree:
    return checkpoints.load_t5x_params(self.checkpoint, config=self.config,
                                       dtype=jnp.float32)


def _first_drawn(batches: Iterator[Batch]) -> Iterator[Batch]:
  """`batches` with its first batch drawn now: a split that cannot be
  read is refused before the run writes anything."""
  first = next(batches, None)
  return batches if first is None else itertools.chain([first], batches)


def _write_config(model_dir: str, config_str: str):
  """Makes `model_dir`; writes `config_str` to its config.gin if not empty."""
  os.makedirs(model_dir, exist_ok=True)
  if config_str:
    with open(os.path.join(model_dir, 'config.gin'), 'w') as f:
      f.write(config_str)


def _initial_state(model: network.T5Model, model_config: network.T5Config,
                   model_dir: str, seed: int, init_from_teacher: bool,
                   teacher: _Teacher) -> TrainState:
  """The state a run starts from: `model_dir`'s latest checkpoint, else a
  fresh one (random parameters, or with `init_from_teacher` the teacher's
  cut to MODEL's depth)."""
  remove_cut_short_save(model_dir)
  latest = checkpoints.latest_checkpoint(model_dir)
  if latest is None and init_from_teacher:
    params = distill.init_from_teacher(teacher.params, teacher.config,
                                       model_config)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=make_optimizer(0.0).init(params))
  if latest is None:
    return init_state(model, seed)
  state = restore_checkpoint(model, latest)
  logging.info('Resuming from %s.', latest)
  return state


def _step_fn(model: network.T5Model, teacher: _Teacher, learning_rate: float,
             schedule: str, warmup_steps: int, z_loss: float, kd_loss: str,
             kd_weight: float
             ) -> Callable[[TrainState, Batch], tuple[TrainState, Any]]:
  """`make_train_step`'s step as `(state, batch) -> (state, metrics)`, the
  teacher's params bound when it distills (loaded then)."""
  distills = kd_loss != 'none'
  train_step = make_train_step(
      model, float(learning_rate), schedule, int(warmup_steps),
      float(z_loss), network.T5Model(teacher.config) if distills else None,
      kd_loss, float(kd_weight))
  if not distills:
    return train_step
  params = teacher.params
  return lambda state, batch: train_step(state, batch, params)


class _ModelDir:
  """What a run resumed at step `start` writes to `model_dir`: log.jsonl
  (the records up to `start` kept, as those after come from a run that
  stopped before saving; each record's 'seconds' summed over the runs) and
  the `keep_checkpoints` newest checkpoints."""

  def __init__(self, model_dir: str, start: int, keep_checkpoints: int,
               on_write: Optional[Callable[[], Any]] = None):
    self.path, self.start = model_dir, start
    self.stopped_by = None  # what stopped the run early (`_run_steps`)
    self._keep, self._on_write = keep_checkpoints, on_write
    self._log = os.path.join(model_dir, LOG_FILE)
    self.records = log_up_to(self._log, start)
    self._elapsed = self.records[-1]['seconds'] if self.records else 0.0
    self._t0 = None

  def start_clock(self):
    """This run's seconds count from now."""
    self._t0 = time.perf_counter()

  def write(self, record: Dict[str, Any]):
    """Appends `record` to the log, with its 'seconds'."""
    record['seconds'] = round(
        self._elapsed + time.perf_counter() - self._t0, 3)
    self.records.append(record)
    with open(self._log, 'a') as f:
      f.write(json.dumps(record) + '\n')

  def save(self, state: TrainState):
    """Checkpoints `state`, pruning the older checkpoints."""
    save_checkpoint(state, self.path, self._keep, self._on_write)

  def summary(self, state: TrainState) -> Dict[str, Any]:
    """`train`'s summary of the run, ended at `state`."""
    last = lambda split: next(
        (r for r in reversed(self.records) if r['split'] == split), None)
    return dict(model_dir=self.path, start_step=self.start,
                step=int(state.step), stopped_by=self.stopped_by,
                checkpoint=checkpoints.latest_checkpoint(self.path),
                train=last('train'), validation=last('validation'),
                seconds=self.records[-1]['seconds'] if self.records else 0.0)


class _Window:
  """The train metrics summed over the steps since the last train record."""

  def __init__(self):
    self._restart()

  def _restart(self):
    self._sums, self._steps, self._seconds = None, 0, 0.0

  def add(self, metrics: Dict[str, Any], seconds: float):
    """Adds a step's metric sums and its seconds (data + train step)."""
    self._seconds += seconds
    self._steps += 1
    self._sums = metrics if self._sums is None else jax.tree.map(
        np.add, self._sums, metrics)

  def record(self, step: int, lr: float) -> Dict[str, Any]:
    """The window's train record (per-token means); the window restarts."""
    # steps_per_sec: data + train step only (no eval, no checkpointing).
    record = dict(step=step, split='train', **normalize(self._sums),
                  lr=float(f'{lr:.6g}'),
                  steps_per_sec=round(self._steps / self._seconds, 4))
    self._restart()
    return record


def _run_steps(step_fn: Callable[[TrainState, Batch], tuple[TrainState, Any]],
               state: TrainState, batches: Iterator[Batch],
               eval_data: List[Batch], model: network.T5Model,
               out: _ModelDir, *, train_steps: int, z_loss: float,
               max_seconds: Optional[float],
               progress: Optional[Callable[[int, int, Dict[str, float]], None]],
               log_period: int, eval_period: int, checkpoint_period: int
               ) -> TrainState:
  """`train`'s loop: the steps after `out.start` up to `train_steps` (or
  until `max_seconds` have passed after the first, or a signal asks it to
  stop: `stop_asked`; `out.stopped_by` says which), with their train
  records, evaluations and checkpoints (each also at the last step; a
  signal's skips the evaluation, to save at once).

  Returns:
    The last step's state.
  """
  out.start_clock()
  window = _Window()
  t_first = None  # the clock of max_seconds starts after the compile
  stopped_by = None
  with stop_asked() as asked:
    for step in range(out.start + 1, train_steps + 1):
      if (max_seconds is not None and t_first is not None
          and time.perf_counter() - t_first > max_seconds):
        stopped_by = 'max_seconds'
      tic = time.perf_counter()
      state, metrics = step_fn(state, next(batches))
      metrics = jax.device_get(metrics)  # waits for the step
      t_first = time.perf_counter() if t_first is None else t_first
      seconds = time.perf_counter() - tic
      lr = float(metrics.pop('lr'))
      window.add(metrics, seconds)
      signalled = asked()
      stopped_by = stopped_by or signalled
      last = step == train_steps or stopped_by is not None
      if step % log_period == 0 or last:
        out.write(window.record(step, lr))
      if eval_data and (step % eval_period == 0 or last) and not signalled:
        out.write(dict(step=step, split='validation',
                       **eval_loss(model, state.params, eval_data, z_loss)))
      if step % checkpoint_period == 0 or last:
        out.save(state)
      if progress is not None:
        progress(step, train_steps, normalize(metrics))
      if stopped_by is not None and step < train_steps:
        logging.warning('Stopped at step %d of %d by %s; a rerun continues '
                        'from its checkpoint.', step, train_steps, stopped_by)
        out.stopped_by = stopped_by
        break
  return state


@contextlib.contextmanager
def stop_asked() -> Iterator[Callable[[], Optional[str]]]:
  """While a training loop runs (`train`'s, the method scripts'): SIGTERM
  (e.g. a preemption's notice) or Ctrl-C asks it to stop after the step
  running, with a checkpoint of that step (then
  `run_folder.exit_stopped`); a second one stops it at once. Yields what
  says which signal asked ('SIGTERM', 'SIGINT'; None: none yet). (Only
  the main thread sets signal handlers.)"""
  asked: List[str] = []
  if threading.current_thread() is not threading.main_thread():
    yield lambda: None
    return

  def handler(signum, frame):
    del frame
    if asked:
      raise KeyboardInterrupt
    asked.append(signal.Signals(signum).name)
    logging.warning('%s: stopping after this step, with a checkpoint (once '
                    'more: at once).', asked[0])

  previous = {sig: signal.signal(sig, handler)
              for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield lambda: asked[0] if asked else None
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


def train(
    *,
    model_config: network.T5Config,
    mixture_or_task_name: str,
    task_feature_lengths: Mapping[str, int],
    train_steps: int,
    model_dir: str,
    batch_size: int = 32,
    learning_rate: float = 0.01,
    schedule: str = 'rsqrt',
    warmup_steps: int = 10_000,
    z_loss: float = Z_LOSS,
    seed: int = 0,
    log_period: int = 50,
    eval_period: int = 500,
    eval_examples: Optional[int] = 512,
    checkpoint_period: int = 500,
    keep_checkpoints: int = 1,
    data_dir: Optional[str] = None,
    array_dir: Optional[str] = None,
    teacher_config: Optional[network.T5Config] = None,
    teacher_checkpoint: Optional[str] = None,
    kd_loss: str = 'none',
    kd_weight: float = 0.0,
    max_seconds: Optional[float] = None,
    init_from_teacher: bool = False,
    config_str: str = '',
    progress: Optional[Callable[[int, int, Dict[str, float]], None]] = None,
) -> Dict[str, Any]:
  """Trains `model_config` on a task up to `train_steps`; resumes.

  Args:
    model_config: the network to train.
    mixture_or_task_name: a registered seqio task (see tasks.py).
    task_feature_lengths: {'inputs': N, 'targets': M} of every batch.
    train_steps: the step to train to (a resumed run continues to it).
    model_dir: folder (or gs://) for checkpoints, log.jsonl, config.gin.
    batch_size: examples per step.
    learning_rate: peak rate (Adafactor's, relative to the parameter RMS).
    schedule: 'rsqrt' or 'constant' (see `learning_rate_fn`).
    warmup_steps: constant phase of 'rsqrt'.
    z_loss: z-loss coefficient (T5X: 1e-4).
    seed: initial parameters and data order.
    log_period: steps per train record in the log.
    eval_period: steps between validation evaluations (and one at the end).
    eval_examples: the first N validation examples are evaluated (None: the
      whole split; 0: no evaluation).
    checkpoint_period: steps between checkpoints (and one at the end).
    keep_checkpoints: newest checkpoints kept.
    data_dir: data of the offline Debian tasks (default: $SPECDEC_DATA_DIR
      or ~/.cache/specdec_jax/debian).
    array_dir: train on a pre-tokenized array data set instead of the seqio
      task (arrays.py: `train*.npz` and `validation*.npz`; no seqio or
      TensorFlow needed); `mixture_or_task_name` then only names the run.
    teacher_config: the frozen target of token-level distillation.
    teacher_checkpoint: its checkpoint (any format `checkpoints` reads).
    kd_loss: 'none', 'fkl' or 'tvd' (distill.py).
    kd_weight: weight of the KD term (see `make_train_step`).
    max_seconds: stop (saved) after this much wall time in this call past
      its first (compiling) step; a rerun continues to `train_steps`.
    init_from_teacher: a fresh run starts from the teacher's parameters cut
      to MODEL's depth (`distill.init_from_teacher`) instead of random ones.
    config_str: written to model_dir/config.gin if not empty.
    progress: `progress(step, train_steps, metrics)` after every step.

  Returns:
    A summary (`status_line` says it): model_dir, start_step, step,
    train_steps, stopped_by (None, or what stopped it before: 'max_seconds',
    'SIGTERM', 'SIGINT'), checkpoint (latest folder), train and validation
    (the last records of each in the log), seconds.
  """
  periods = dict(log_period=log_period, eval_period=eval_period,
                 checkpoint_period=checkpoint_period)
  _check_args(model_config, task_feature_lengths, train_steps, batch_size,
              periods, model_dir, (learning_rate, schedule, warmup_steps),
              (teacher_config, teacher_checkpoint, kd_loss, init_from_teacher))
  examples = _open_data(model_config, mixture_or_task_name,
                        task_feature_lengths, data_dir, array_dir)
  teacher = _Teacher(teacher_config, teacher_checkpoint)
  with bucket_folder.kept_here('model_dir', model_dir) as here:
    model = network.T5Model(model_config)
    state = _initial_state(model, model_config, here.path, seed,
                           init_from_teacher, teacher)
    start = int(state.step)
    check_steps(model_dir, start, train_steps, 'TRAIN_STEPS', 'MODEL_DIR')
    if start < train_steps:  # what it reads refused before it writes
      eval_data = examples.eval_batches(batch_size, eval_examples)
      step_fn = _step_fn(model, teacher, learning_rate, schedule,
                         warmup_steps, z_loss, kd_loss, kd_weight)
      batches = _first_drawn(examples.batches(batch_size, seed, start))
      _write_config(here.path, config_str)
    out = _ModelDir(here.path, start, keep_checkpoints, here.sync)
    if start < train_steps:
      state = _run_steps(step_fn, state, batches, eval_data, model, out,
                         train_steps=train_steps, z_loss=z_loss,
                         max_seconds=max_seconds, progress=progress,
                         **periods)
    summary = out.summary(state)
  return dict(summary, model_dir=model_dir, train_steps=train_steps,
              checkpoint=here.shown(summary['checkpoint']))


# --------------------------------------------------------------- the job ---
class _ProgressBar:
  """A tqdm bar fed by `train`'s progress callback."""

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


def main(argv: Optional[Sequence[str]] = None,
         plot: Optional[Callable[[Sequence[str], str], Any]] = None
         ) -> Dict[str, Any]:
  """The training job (scripts/train.py): T5X-style flags, gin, `train`.

  Flags: `gin_utils.parse_flags`' (`--gin_file`, `--gin_bindings`,
  `--gin.NAME=VALUE`, `--gin_search_paths`), `--no_progress` (no progress
  bar) and, given `plot`, `--plot`. After training it writes
  MODEL_DIR/operative_config.gin and prints `status_line`.

  Args:
    argv: the command line (default: `sys.argv[1:]`).
    plot: `plot([MODEL_DIR/log.jsonl], <png>, [its name])` draws the run's
      curves after training when `--plot` is given
      (`experiments.plots.plot_losses`, a layer above this one), written
      to MODEL_DIR/loss.png (local or gs://).

  Returns:
    `train`'s summary.
  """
  import gin  # pylint: disable=g-import-not-at-top

  def add_arguments(parser):
    if plot is not None:
      parser.add_argument('--plot', action='store_true',
                          help='write MODEL_DIR/loss.png after training')
    parser.add_argument('--no_progress', action='store_true',
                        help='no progress bar')

  args = gin_utils.parse_flags(
      sys.argv[1:] if argv is None else argv, 'python scripts/train.py',
      'Trains a T5 on a seqio task, launched like a T5X training job.',
      add_arguments)
  run = gin_utils.configure(args, train,
                            'gin_configs/train/en_de_mini_small.gin')
  bar = None if args.no_progress else _ProgressBar()
  try:
    with checks.one_line(*checks.REFUSED):  # its arguments, task, data
      summary = run(config_str=gin.config_str(), progress=bar)
  finally:
    if bar is not None:
      bar.close()
  model_dir, written = os.fspath(bucket_folder.join(summary['model_dir'])), []
  if summary['step'] > summary['start_step']:  # this config trained it
    checkpoints.write_bytes(os.path.join(model_dir, 'operative_config.gin'),
                            gin.operative_config_str().encode())
    written.append('operative_config.gin')
  if plot is not None and args.plot:
    written.append('loss.png')
    png = os.path.join(model_dir, 'loss.png')
    with bucket_folder.written_here('model_dir', png) as (here, _):
      plot([os.path.join(model_dir, LOG_FILE)], here or png,
           [os.path.basename(os.path.abspath(model_dir))])  # '.' named
  if summary['stopped_by'] in ('SIGTERM', 'SIGINT'):
    run_folder.exit_stopped(summary['stopped_by'],
                            status_line(summary, written))
  print(status_line(summary, written))
  return summary


def run_line(where: str, start: int, step: int, total: int, seconds: float,
             figures: Sequence[str], files: Sequence[str],
             stopped_by: Optional[str] = None) -> str:
  """A training command's last line: its output folder `where`, complete
  at step `total` or stopped at `step` by `stopped_by` (a rerun
  continues), the steps this run trained (from `start`, the step it
  resumed at), the `seconds` of training over every run, `figures`, and
  the `files` it leaves (the checkpoint and the log first)."""
  ran = ('nothing left to train' if step <= start else
         f'step {step} trained here' if step == start + 1 else
         f'steps {start + 1}-{step} trained here')
  if start and step > start:
    ran += f', resumed at step {start}'
  said = (f'complete at step {step} of {total}' if step >= total else
          f'stopped at step {step} of {total} by {stopped_by}')
  figures = '; '.join([ran, f'{seconds:.1f} s of training in all', *figures])
  line = f"{where}: {said} ({figures}); {', '.join(files)}"
  if step < total:
    line += '; rerun the same command to continue'
  return line


def method_line(where: str, start: int, step: int, total: int,
                record: Optional[Mapping[str, Any]],
                figures: Sequence[str] = (),
                files: Sequence[str] = (),
                stopped_by: Optional[str] = None) -> str:
  """A method training script's `run_line`, its figures those of its last
  step `record` (`append_step_record`'s: None where the log holds none)
  and `figures`; its files checkpoint_`step`, the log and `files`."""
  if record is not None:
    accuracy = '/'.join(f'{a:.3g}' for a in record['accuracy_at'])
    figures = [f"loss {record['loss']:.4g}, accuracy by draft position "
               f'{accuracy}', *figures]
  return run_line(where, start, step, total,
                  record['seconds'] if record else 0.0, figures,
                  [f'checkpoint_{step}', LOG_FILE, *files], stopped_by)


def status_line(summary: Dict[str, Any], written: Sequence[str] = ()
                ) -> str:
  """The training job's `run_line`: complete at TRAIN_STEPS or stopped
  before by `max_seconds` or a signal, the last train and validation
  losses, and the files `written` beside the checkpoint and the log."""
  figures = [f"{split} loss {summary[split]['loss']:.4g}, accuracy "
             f"{summary[split]['accuracy']:.3g}"
             for split in ('train', 'validation') if summary[split]]
  files = [os.path.basename(summary['checkpoint'] or '') or 'no checkpoint',
           LOG_FILE, *written]
  return run_line(summary['model_dir'], summary['start_step'],
                  summary['step'], summary['train_steps'], summary['seconds'],
                  figures, files, summary['stopped_by'])
