"""Training: the loss T5X optimizes, a model that learns, runs that resume.

The mini models trained on the Debian tasks are the targets and drafters of
every acceptance-rate result, and the long runs are interrupted and resumed:
a wrong mask or z-loss, a resume that restarts from step 0 or sees other data,
or a checkpoint the loader cannot read would spoil hours of CPU time without
an error. Runs here use a tiny model on the Debian slice in tests/testdata.
"""

import functools
import json
import os
import pathlib
import shutil
import signal
import tempfile

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import data
from specdec_jax import network
from specdec_jax import training
from specdec_jax.experiments import plots

import fake_gcs  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / 'tests' / 'testdata' / 'debian'
TRAIN_GIN = ROOT / 'gin_configs' / 'train'
TASK = 'debian_desc_en_de'
LENGTHS = {'inputs': 16, 'targets': 8}

BATCH = 4
# The Debian slice's vocabulary has 1000 pieces. dtype is the string gin
# gives, so the script test's model (mini_small shrunk by bindings to these
# sizes) is this one and reuses its compiled steps.
TINY = network.T5Config(
    vocab_size=1024, dtype='float32', emb_dim=32, num_heads=2, head_dim=16,
    mlp_dim=64, num_encoder_layers=1, num_decoder_layers=1,
    mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
    logits_via_embedding=False)
# One compiled train step for every test (same model, settings and shapes).
LR, SCHEDULE, WARMUP, Z_LOSS = 0.01, 'constant', 1, 1e-4


def _train(model_dir, train_steps, **overrides):
  kwargs = dict(
      model_config=TINY, mixture_or_task_name=TASK,
      task_feature_lengths=LENGTHS, train_steps=train_steps,
      model_dir=str(model_dir), batch_size=BATCH, learning_rate=LR,
      schedule=SCHEDULE, warmup_steps=WARMUP, z_loss=Z_LOSS, seed=0,
      log_period=1, eval_period=2, eval_examples=6, checkpoint_period=2,
      data_dir=str(DATA))
  kwargs.update(overrides)
  return training.train(**kwargs)


def _assert_trees_equal(a, b):
  flat_a = jax.tree_util.tree_leaves_with_path(a)
  flat_b = jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                  err_msg=jax.tree_util.keystr(path))


def test_loss_matches_numpy_with_padding_and_z_loss():
  """The objective is T5X's: CE + 1e-4 log(Z)^2 over real tokens only.

  Random logits with large values make log(Z) big, so a missing or wrongly
  scaled z-loss changes the sums; padding positions hold huge losses, so a
  mask that lets them in is caught.
  """
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 5, (3, 5, 11)).astype(np.float32) + 20.0
  targets = rng.integers(1, 11, (3, 5))
  weights = np.ones((3, 5), np.float32)
  weights[0, 3:] = 0
  weights[2, 1:] = 0
  targets[weights == 0] = 0
  logits[weights == 0, 0] = -1e4  # padding: a huge cross entropy
  metrics = jax.jit(training.weighted_metrics, static_argnames='z_loss')
  sums = jax.device_get(metrics(jnp.asarray(logits), jnp.asarray(targets),
                                jnp.asarray(weights), z_loss=1e-4))

  m = logits.astype(np.float64).max(-1, keepdims=True)
  log_z = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
  ce = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  z = 1e-4 * log_z ** 2
  real = weights > 0
  np.testing.assert_allclose(sums['cross_ent_loss'], ce[real].sum(),
                             rtol=1e-5)
  np.testing.assert_allclose(sums['z_loss'], z[real].sum(), rtol=1e-5)
  assert sums['z_loss'] > 0.1  # log Z ~ 20+: the z-loss is visible
  np.testing.assert_allclose(sums['loss'], ce[real].sum() + z[real].sum(),
                             rtol=1e-5)
  assert sums['weight'] == real.sum() == 9
  np.testing.assert_allclose(
      sums['correct'], (logits.argmax(-1) == targets)[real].sum())
  means = training.normalize(sums)
  np.testing.assert_allclose(means['loss'], (ce + z)[real].mean(), rtol=1e-5)


def test_rsqrt_schedule_is_t5xs_constant_times_rsqrt_decay():
  """'rsqrt' holds the peak for warmup_steps, then decays as 1/sqrt(step)."""
  rsqrt = training.learning_rate_fn(0.01, 'rsqrt', 100)
  np.testing.assert_allclose(
      [float(rsqrt(s)) for s in (0, 99, 100, 400, 10_000)],
      [0.01, 0.01, 0.01, 0.005, 0.001], rtol=1e-6)
  assert float(training.learning_rate_fn(0.003, 'constant')(10**6)) == (
      np.float32(0.003))
  with pytest.raises(ValueError, match='schedule'):
    training.learning_rate_fn(0.01, 'cosine')
  for rate in (0.0, -0.01, float('nan')):  # a negative rate would ascend
    with pytest.raises(ValueError, match=r'learning_rate must be a number > '
                       r'0, got'):
      training.learning_rate_fn(rate, 'constant')


@pytest.fixture(scope='module')
def debian_slice():
  from specdec_jax import tasks  # pylint: disable=g-import-not-at-top
  tasks.register_tasks(data_dir=str(DATA))
  return DATA


def test_batches_are_t5x_teacher_forcing(debian_slice):
  """Decoder inputs are the targets shifted right (BOS 0), padded with 0.

  A shift the wrong way would let the model see the token it predicts; a
  weight on padding would train on it.
  """
  del debian_slice
  batch, padded = data.task_eval_batches(TASK, LENGTHS, BATCH, 6)
  tgt, dec_in = batch['decoder_target_tokens'], batch['decoder_input_tokens']
  assert tgt.shape == (BATCH, LENGTHS['targets'])
  assert batch['encoder_input_tokens'].shape == (BATCH, LENGTHS['inputs'])
  np.testing.assert_array_equal(dec_in[:, 0], 0)
  np.testing.assert_array_equal(dec_in[:, 1:], tgt[:, :-1])
  np.testing.assert_array_equal(batch['decoder_loss_weights'], tgt > 0)
  assert (tgt[:, -1] == 1).all()  # trimmed, EOS kept
  # The last eval batch is padded to full size with weightless rows.
  assert padded['decoder_target_tokens'].shape == (BATCH, LENGTHS['targets'])
  assert padded['decoder_loss_weights'][:2].any(axis=1).all()
  assert not padded['decoder_loss_weights'][2:].any()


def test_tiny_model_overfits_a_fixed_batch():
  """The step must actually descend: gradients, optimizer and lr wired up.

  30 Adafactor steps on one fixed batch of random tokens must drive the
  loss far below its start (log vocab ~ 6.9).
  """
  model = network.T5Model(TINY)
  rng = np.random.default_rng(1)
  targets = rng.integers(3, 1000, (4, 8)).astype(np.int32)
  targets[:, -2:] = 0  # some padding
  batch = {
      'encoder_input_tokens': rng.integers(3, 1000, (4, 16)).astype(np.int32),
      'decoder_input_tokens': np.pad(targets[:, :-1], ((0, 0), (1, 0))),
      'decoder_target_tokens': targets,
      'decoder_loss_weights': (targets > 0).astype(np.int32),
  }
  step = training.make_train_step(model, LR, SCHEDULE, WARMUP, Z_LOSS)
  state = training.init_state(model, 0)
  losses = []
  for _ in range(30):
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss'] / metrics['weight']))
  assert int(state.step) == 30
  assert losses[0] > 6.0
  assert losses[-1] < 0.25 * losses[0], losses
  assert losses[-1] < min(losses[:5])


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, debian_slice):
  """A 4-step run in one go: (summary, model dir)."""
  del debian_slice
  model_dir = tmp_path_factory.mktemp('uninterrupted')
  return _train(model_dir, 4, checkpoint_period=4, eval_examples=0), model_dir


def test_train_checkpoints_logs_and_resumes_exactly(tmp_path, uninterrupted,
                                                    monkeypatch):
  """A rerun continues from the checkpoint, and ends where one run would.

  Run B stops at step 2 and is restarted to step 4; the fixture's run goes to
  4 at once. B must resume at step 2 (not 0), skip the batches it has seen
  and restore the Adafactor statistics, so its final parameters equal the
  uninterrupted run's bit for bit. A log record written after B's checkpoint
  (a crash before the next save) must be dropped, and the checkpoints must
  load with load_t5x_params.
  """
  first = _train(tmp_path, 2)
  assert first['start_step'] == 0 and first['step'] == 2
  assert (tmp_path / 'checkpoint_2' / training.OPTIMIZER_STATE_FILE).is_file()
  params_2 = checkpoints.load_t5x_params(str(tmp_path / 'checkpoint_2'),
                                         config=TINY)
  with open(tmp_path / training.LOG_FILE, 'a') as f:
    f.write(json.dumps(dict(step=3, split='train', loss=0.0, seconds=1.0))
            + '\n')

  second = _train(tmp_path, 4)
  assert second['start_step'] == 2 and second['step'] == 4
  # keep_checkpoints=1 pruned step 2.
  assert sorted(os.listdir(tmp_path)) == ['checkpoint_4', 'log.jsonl']
  records = training.read_log(str(tmp_path / training.LOG_FILE))
  assert [r['step'] for r in records if r['split'] == 'train'] == [1, 2, 3, 4]
  assert [r['step'] for r in records if r['split'] == 'validation'] == [2, 4]
  assert all(r['loss'] > 1.0 for r in records)  # the fake record is gone
  seconds = [r['seconds'] for r in records]
  assert seconds == sorted(seconds)
  assert {'loss', 'z_loss', 'accuracy', 'lr', 'seconds'} <= set(records[0])

  summary, model_dir = uninterrupted
  assert summary['train']['loss'] == second['train']['loss']
  params_a = checkpoints.load_t5x_params(str(model_dir), config=TINY)
  params_b = checkpoints.load_t5x_params(str(tmp_path), config=TINY)
  _assert_trees_equal(params_a, params_b)
  changed = jax.tree.map(lambda x, y: bool(np.any(x != y)), params_2,
                         params_b)
  assert all(jax.tree.leaves(changed))  # steps 3-4 trained every parameter
  # Nothing left to do: a rerun at the final step trains nothing, and
  # reads neither the validation split nor the teacher it would distill
  # from (here neither could be read).
  def unread(*args, **kwargs):
    raise AssertionError('a finished run read its validation split')

  monkeypatch.setattr(data, 'task_eval_batches', unread)
  again = _train(tmp_path, 4, teacher_config=TINY, kd_loss='fkl',
                 kd_weight=0.5, teacher_checkpoint=str(tmp_path / 'none'))
  assert again['start_step'] == again['step'] == 4
  # The job's last line says so, and what each call trained.
  assert training.status_line(second).startswith(
      f'{tmp_path}: complete at step 4 of 4 (steps 3-4 trained here, '
      'resumed at step 2; ')
  assert training.status_line(again).startswith(
      f'{tmp_path}: complete at step 4 of 4 (nothing left to train; ')
  assert training.status_line(again).endswith(
      f"validation loss {second['validation']['loss']:.4g}, accuracy "
      f"{second['validation']['accuracy']:.3g}); checkpoint_4, log.jsonl")


def test_sigterm_saves_the_step_and_the_rerun_ends_as_uninterrupted(
    tmp_path, uninterrupted):
  """SIGTERM (a preemption's notice) during step 1 (sent here by the
  progress callback): step 2 finishes, is checkpointed although
  checkpoint_period is 4, and the run stops; the rerun resumes from it and
  ends with the uninterrupted run's parameters."""
  def preempted(step, total, metrics):
    del total, metrics
    if step == 1:
      os.kill(os.getpid(), signal.SIGTERM)

  stopped = _train(tmp_path, 4, checkpoint_period=4, eval_examples=0,
                   progress=preempted)
  assert (stopped['step'], stopped['stopped_by']) == (2, 'SIGTERM')
  assert training.status_line(stopped).startswith(
      f'{tmp_path}: stopped at step 2 of 4 by SIGTERM (steps 1-2 trained ')
  assert (tmp_path / 'checkpoint_2').is_dir()
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
  resumed = _train(tmp_path, 4, checkpoint_period=4, eval_examples=0)
  assert (resumed['start_step'], resumed['stopped_by']) == (2, None)
  _, model_dir = uninterrupted
  _assert_trees_equal(
      checkpoints.load_t5x_params(str(model_dir), config=TINY),
      checkpoints.load_t5x_params(str(tmp_path), config=TINY))


def _killed_mid_save(monkeypatch, model_dir, train_steps, **overrides):
  """`_train` to `train_steps`, killed inside a save: after the params were
  put in place, before the Adafactor statistics were written."""
  from specdec_jax.checkpoints import _storage  # pylint: disable=g-import-not-at-top
  real = _storage.write_bytes

  def crash(path, data):
    if path.endswith(training.OPTIMIZER_STATE_FILE):
      raise RuntimeError('killed mid-save')
    real(path, data)

  monkeypatch.setattr(_storage, 'write_bytes', crash)
  with pytest.raises(RuntimeError, match='killed mid-save'):
    _train(model_dir, train_steps, **overrides)
  monkeypatch.setattr(_storage, 'write_bytes', real)


def test_a_save_cut_short_resumes_from_the_checkpoint_before(
    tmp_path, uninterrupted, monkeypatch):
  """A crash inside the save at step 2, after the params were put in place
  but before the Adafactor statistics were written: the rerun removes that
  checkpoint and starts before it (from step 0), and ends with the
  uninterrupted run's parameters. Resumed from it, steps 3-4 would run
  with fresh statistics."""
  _killed_mid_save(monkeypatch, tmp_path, 4, checkpoint_period=2,
                   eval_examples=0)
  assert (tmp_path / 'checkpoint_2').is_dir()
  assert (tmp_path / training.SAVING_FILE).is_file()
  resumed = _train(tmp_path, 4, checkpoint_period=2, eval_examples=0)
  assert resumed['start_step'] == 0 and resumed['step'] == 4
  assert not (tmp_path / training.SAVING_FILE).exists()
  _, model_dir = uninterrupted
  _assert_trees_equal(
      checkpoints.load_t5x_params(str(model_dir), config=TINY),
      checkpoints.load_t5x_params(str(tmp_path), config=TINY))


def test_a_corrupt_optimizer_state_is_named(tmp_path, uninterrupted):
  """The checksum manifest covers the Adafactor statistics too: a flipped
  byte there would otherwise resume with other statistics, silently."""
  _, model_dir = uninterrupted
  ckpt = tmp_path / 'checkpoint_4'
  shutil.copytree(model_dir / 'checkpoint_4', ckpt)
  path = ckpt / training.OPTIMIZER_STATE_FILE
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 1
  path.write_bytes(data)
  with pytest.raises(checkpoints.CheckpointError, match=str(path)):
    training.restore_checkpoint(network.T5Model(TINY), str(ckpt))


def test_a_checkpoint_on_gcs_restores_as_on_disk(uninterrupted, gcs):
  """A training checkpoint (params and Adafactor statistics) restores from
  a gs:// address as from its copy on disk."""
  _, model_dir = uninterrupted
  address = fake_gcs.upload(model_dir / 'checkpoint_4', f'{gcs}/checkpoint_4')
  model = network.T5Model(TINY)
  want = training.restore_checkpoint(model, str(model_dir / 'checkpoint_4'))
  got = training.restore_checkpoint(model, address)
  assert int(got.step) == 4
  _assert_trees_equal(got.params, want.params)
  _assert_trees_equal(got.opt_state, want.opt_state)


def test_a_model_dir_in_a_bucket_resumes_a_save_cut_short_exactly(
    tmp_path, gcs, uninterrupted, monkeypatch):
  """MODEL_DIR at a gs:// address (bucket_folder.py): a run to step 2,
  then one to 4 that crashes inside its save (after the params, before the
  Adafactor statistics), leaving the bucket naming step 4 as being saved;
  the rerun takes the bucket's checkpoint_2, removes checkpoint_4 there,
  resumes at step 2 and ends with the uninterrupted run's parameters, its
  summary naming the bucket. No local copy is left."""
  url = f'{gcs}/model'
  local_copies = tmp_path / 'tmp'
  local_copies.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(local_copies))
  _train(url, 2, eval_examples=0)
  _killed_mid_save(monkeypatch, url, 4, eval_examples=0)
  names = checkpoints.list_files(url)
  assert training.SAVING_FILE in names and any(
      n.startswith('checkpoint_4/') for n in names)
  resumed = _train(url, 4, eval_examples=0)
  assert resumed['start_step'] == 2 and resumed['step'] == 4
  assert resumed['model_dir'] == url
  assert resumed['checkpoint'] == f'{url}/checkpoint_4'
  names = checkpoints.list_files(url)
  assert training.SAVING_FILE not in names and 'log.jsonl' in names
  assert {n.split('/')[0] for n in names if '/' in n} == {'checkpoint_4'}
  _, model_dir = uninterrupted
  _assert_trees_equal(
      checkpoints.load_t5x_params(str(model_dir), config=TINY),
      checkpoints.load_t5x_params(url, config=TINY))
  assert [r['step'] for r in training.read_log(f'{url}/log.jsonl')] == [
      1, 2, 3, 4]
  assert not list(local_copies.iterdir())


def test_lengths_without_targets_are_refused_before_anything_loads(
    tmp_path):
  """The eval job's rule for TASK_FEATURE_LENGTHS holds for training too
  (one check, `checks.check_feature_lengths`)."""
  with pytest.raises(checks.InputError,
                     match='TASK_FEATURE_LENGTHS needs "inputs" and'):
    _train(tmp_path / 'run', 1, task_feature_lengths={'inputs': 16})
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('overrides, message', [
    (dict(kd_loss='fkl'), "kd_loss='fkl' needs teacher_config and"),
    (dict(init_from_teacher=True), 'init_from_teacher=True needs teacher_'),
    (dict(teacher_config=TINY), 'teacher_config and teacher_checkpoint go '
     'together'),
    (dict(teacher_config=TINY.replace(vocab_size=2048), teacher_checkpoint='t'),
     'The teacher has vocab_size 2048 but MODEL has 1024')])
def test_teacher_arguments_are_refused_before_anything_loads(
    tmp_path, overrides, message):
  with pytest.raises(checks.InputError, match=message):
    _train(tmp_path / 'run', 1, **overrides)
  assert not (tmp_path / 'run').exists()


def test_a_model_dir_at_a_url_but_gs_is_refused(tmp_path, monkeypatch):
  """pathlib would write 's3://b/run' to a local folder 's3:/b/run'."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match="model_dir 's3://b/run' is neither a "
                     'local path nor a gs:// address'):
    _train('s3://b/run', 1)
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize('overrides, message', [
    ({}, 'has no validation example.*train.eval_examples = 0'),
    (dict(kd_loss='kl'), 'kd_loss must be one of'),
    (dict(kd_loss='fkl'), 'No T5X checkpoint'),
    (dict(init_from_teacher=True), 'No T5X checkpoint')])
def test_what_a_run_reads_is_refused_before_its_model_dir_is_made(
    tmp_path, overrides, message):
  """Asked to evaluate on a validation split that has no example, the job
  says so before it makes its model dir, rather than train without the
  validation records it was asked for; so for a KD loss it does not know
  and a teacher checkpoint that is not there (read as it starts)."""
  from specdec_jax import arrays  # pylint: disable=g-import-not-at-top
  rows = np.arange(2, 50, dtype=np.int32).reshape(8, 6)
  arrays.save(str(tmp_path / 'a' / 'train.npz'),
              dict(inputs=rows, targets=rows))
  arrays.save(str(tmp_path / 'a' / 'validation.npz'),
              dict(inputs=rows[:0] if not overrides else rows,
                   targets=rows[:0] if not overrides else rows))
  if overrides:
    overrides.update(teacher_config=TINY,
                     teacher_checkpoint=str(tmp_path / 'none' / 'c_1'))
  with pytest.raises((checks.InputError, FileNotFoundError), match=message):
    _train(tmp_path / 'run', 1, array_dir=str(tmp_path / 'a'), **overrides)
  assert not (tmp_path / 'run').exists()


def test_same_seed_same_params_other_seed_differs(debian_slice):
  """Seeds fix the initial parameters and the data order, nothing else.

  Two runs of the library's pieces (init_state, task_train_batches, the train
  step) with one seed must agree bit for bit after 3 steps (no unseeded
  shuffle or initializer anywhere), so results reproduce; another seed must
  draw other parameters and another data order. (The resume test checks the
  same of `train` as a whole.)
  """
  del debian_slice
  model = network.T5Model(TINY)
  step = training.make_train_step(model, LR, SCHEDULE, WARMUP, Z_LOSS)

  def run(seed):
    state = training.init_state(model, seed)
    batches = data.task_train_batches(TASK, LENGTHS, BATCH, seed)
    first = None
    for _ in range(3):
      batch = next(batches)
      first = batch if first is None else first
      state, _ = step(state, batch)
    return state.params, first

  params_0, batch_0 = run(0)
  params_again, batch_again = run(0)
  params_1, batch_1 = run(1)
  _assert_trees_equal(params_0, params_again)
  _assert_trees_equal(batch_0, batch_again)
  assert not np.array_equal(params_0['token_embedder']['embedding'],
                            params_1['token_embedder']['embedding'])
  assert not np.array_equal(batch_0['decoder_target_tokens'],
                            batch_1['decoder_target_tokens'])


# ------------------------------------------------- entry point, gin files ---
SHRINK = [('vocab_size', 1024), ('emb_dim', 32), ('num_heads', 2),
          ('head_dim', 16), ('mlp_dim', 64)]


@gin.configurable
def _capture_run(model=gin.REQUIRED, task=gin.REQUIRED,
                 lengths=gin.REQUIRED, steps=gin.REQUIRED):
  return model, task, lengths, steps


def _resolve(gin_file, bindings=()):
  gin.clear_config(clear_constants=True)
  gin.add_config_file_search_path(str(ROOT / 'gin_configs'))
  gin.parse_config_files_and_bindings([str(gin_file)], [
      '_capture_run.model = %MODEL',
      '_capture_run.task = %MIXTURE_OR_TASK_NAME',
      '_capture_run.lengths = %TASK_FEATURE_LENGTHS',
      '_capture_run.steps = %TRAIN_STEPS', "MODEL_DIR = '/tmp/unused'",
      *bindings])
  try:
    return _capture_run()
  finally:
    gin.clear_config(clear_constants=True)


@functools.lru_cache(maxsize=None)
def _num_params(config):
  shapes = jax.eval_shape(network.T5Model(config).init_params,
                          jax.random.key(0))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize('task', ['en_de', 'synopsis'])
def test_experiment_files_are_complete_runs_of_shrinking_models(task):
  """Each task has four complete runs; the target is the largest model.

  A typo in a file would surface only when the two-hour batch of runs
  starts; a drafter larger than the target would make the acceptance
  experiments meaningless.
  """
  sizes = []
  for name in ('xxl', 'large', 'base', 'small'):
    model, task_name, lengths, steps = _resolve(
        TRAIN_GIN / f'{task}_mini_{name}.gin')
    assert isinstance(model, network.T5Config)
    assert model.vocab_size == 8064 and model.dtype == 'float32'
    assert task_name == {'en_de': 'debian_desc_en_de',
                         'synopsis': 'debian_synopsis'}[task]
    assert set(lengths) == {'inputs', 'targets'}
    assert isinstance(steps, int) and steps > 0
    sizes.append((_num_params(model), model))
  counts = [n for n, _ in sizes]
  assert counts == sorted(counts, reverse=True) and len(set(counts)) == 4
  target, smallest = sizes[0][1], sizes[-1][1]
  assert target.num_encoder_layers >= 4 and target.emb_dim >= 256
  assert smallest.num_decoder_layers <= 2 and smallest.emb_dim <= 128
  assert counts[0] > 5 * counts[-1]


def test_job_trains_from_gin_and_writes_its_outputs(tmp_path, debian_slice,
                                                    capsys, monkeypatch):
  """The training job (`training.main`, scripts/train.py) wires flags, gin
  and the library like a T5X job.

  Trains the real en_de mini_small experiment file, its model shrunk by
  bindings to TINY (so the compiled step is reused), for 2 steps on the test
  slice; the checkpoint must load with the config the same gin file and
  bindings define, and the gin configs must be written. A missing required
  macro must stop the job with gin's message.
  """
  del debian_slice
  out = tmp_path / 'run'
  gin_file = TRAIN_GIN / 'en_de_mini_small.gin'
  argv = [
      f'--gin_file={gin_file}', f"--gin.MODEL_DIR='{out}'",
      f"--gin.DATA_DIR='{DATA}'", '--gin.TRAIN_STEPS=2',
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
      f'--gin.BATCH_SIZE={BATCH}', f'--gin.LEARNING_RATE={LR}',
      f"--gin.LR_SCHEDULE='{SCHEDULE}'", f'--gin.WARMUP_STEPS={WARMUP}',
      '--gin.train.eval_examples=4', '--no_progress', '--plot',
  ] + [f'--gin.mini_small/network.T5Config.{k}={v}' for k, v in SHRINK]
  summary = training.main(argv, plot=plots.plot_losses)
  assert summary['step'] == 2
  last = capsys.readouterr().out.splitlines()[-1]
  assert last.startswith(f'{out}: complete at step 2 of 2 (steps 1-2 trained '
                         'here; '), last
  assert f"train loss {summary['train']['loss']:.4g}, accuracy" in last
  assert last.endswith(
      '); checkpoint_2, log.jsonl, operative_config.gin, loss.png'), last
  # A rerun of the finished run trains nothing: its configs stay those of
  # the run that trained it.
  operative = (out / 'operative_config.gin').read_text()
  training.main([a for a in argv if a != '--plot']
                + ['--gin.LEARNING_RATE=0.5'])
  assert capsys.readouterr().out.splitlines()[-1].endswith(
      '); checkpoint_2, log.jsonl')
  assert (out / 'operative_config.gin').read_text() == operative
  with pytest.raises(SystemExit) as e:  # it cannot be a run of 1 step
    training.main([a for a in argv if a != '--plot']
                  + ['--gin.TRAIN_STEPS=1'])
  assert str(e.value.code).startswith(
      f'error: {out} already holds step 2, more than the 1 asked '
      '(TRAIN_STEPS): give TRAIN_STEPS 2 or more'), e.value.code
  assert 'LEARNING_RATE = 0.5' not in (out / 'config.gin').read_text()
  # SIGTERM during step 1 (a preemption): step 2 saved, said, and the job
  # exits as a killed one would.
  bar = training._ProgressBar  # pylint: disable=protected-access
  monkeypatch.setattr(bar, '__call__', lambda self, step, *_: (
      step == 1 and os.kill(os.getpid(), signal.SIGTERM)))
  # (MODEL_DIR in the home folder, '~': every file of the run there.)
  monkeypatch.setenv('HOME', str(tmp_path))
  monkeypatch.chdir(tmp_path / 'run')
  with pytest.raises(SystemExit) as e:
    training.main([a for a in argv if a not in ('--no_progress', '--plot')]
                  + ['--gin.TRAIN_STEPS=4', "--gin.MODEL_DIR='~/run3'"])
  assert e.value.code == 128 + signal.SIGTERM
  last = capsys.readouterr().out.splitlines()[-1]
  assert last.startswith('~/run3: stopped at step 2 of 4 by SIGTERM'), last
  assert last.endswith('; rerun the same command to continue'), last
  assert (tmp_path / 'run3' / 'checkpoint_2').is_dir()
  assert (tmp_path / 'run3' / 'operative_config.gin').is_file()
  for name in ('config.gin', 'operative_config.gin', 'log.jsonl',
               'loss.png', 'checkpoint_2'):
    assert (out / name).exists(), name
  assert 'TRAIN_STEPS = 2' in (out / 'config.gin').read_text()
  model, *_ = _resolve(gin_file, [
      f'mini_small/network.T5Config.{k} = {v}' for k, v in SHRINK])
  assert model == TINY
  params = checkpoints.load_t5x_params(str(out / 'checkpoint_2'),
                                       config=model)
  assert params['token_embedder']['embedding'].shape == (1024, 32)
  with pytest.raises(SystemExit, match='MODEL_DIR|REQUIRED'):
    training.main([f'--gin_file={gin_file}', '--no_progress',
                   f"--gin.DATA_DIR='{DATA}'"])
  # An argument `train` refuses: its line, before a model dir is made.
  for binding, said in (('TRAIN_STEPS=0', 'train_steps must be an int >= 1'),
                        ('LEARNING_RATE=-0.01', 'learning_rate must be a')):
    with pytest.raises(SystemExit) as e:
      training.main(argv + [f'--gin.{binding}', f"--gin.MODEL_DIR='{out}2'"],
                    plot=plots.plot_losses)
    assert str(e.value.code).startswith(f'error: {said}'), e.value.code
  assert not (tmp_path / 'run2').exists()
