"""Distillation and array data: the pieces that make the shipped drafters.

A KD loss with the wrong sign or normalization, a teacher that receives
gradients, a drafter cut from the wrong target layers, or array batches that
differ from what seqio feeds would each ship drafters that agree with the
target less than they should, without any error. These tests pin each piece
to an independent computation.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import arrays
from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import distill
from specdec_jax import network
from specdec_jax import tasks
from specdec_jax import training

from conftest import teacher_forced_logits  # pylint: disable=g-bad-import-order

TEACHER = network.T5Config(
    vocab_size=64, dtype='float32', emb_dim=32, num_heads=2, head_dim=16,
    mlp_dim=64, num_encoder_layers=2, num_decoder_layers=3,
    mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
    logits_via_embedding=False)
STUDENT = TEACHER.replace(num_encoder_layers=1, num_decoder_layers=1)


@pytest.fixture(scope='module')
def teacher():
  model = network.T5Model(TEACHER)
  return model, model.init_params(jax.random.key(3))


def _toy_arrays(n=24, li=10, lt=8, seed=0):
  rng = np.random.default_rng(seed)
  inputs = rng.integers(2, 64, (n, li)).astype(np.int32)
  targets = rng.integers(2, 64, (n, lt)).astype(np.int32)
  for row, stop in enumerate(rng.integers(3, lt, n)):  # ragged, EOS ended
    targets[row, stop] = 1
    targets[row, stop + 1:] = 0
  inputs[:, -1] = 1
  return {'inputs': inputs, 'targets': targets}


def test_tvd_is_one_minus_beta_on_a_hand_made_pair():
  """TV(p, q) = 1 - sum min(p, q) (Leviathan et al., Lemma 3.3 / Cor. 3.6)."""
  p = np.array([0.5, 0.5, 0.0, 0.0])
  q = np.array([0.2, 0.3, 0.5, 0.0])
  # By hand: TV = (0.3 + 0.2 + 0.5) / 2 = 0.5; beta = 0.2 + 0.3 = 0.5.
  with np.errstate(divide='ignore'):
    lp, lq = np.log(p), np.log(np.where(q > 0, q, 1e-30))
  sums = distill.token_kd_sums(jnp.asarray(lq)[None, None],
                               jnp.asarray(lp)[None, None],
                               jnp.ones((1, 1)), 'tvd')
  assert float(sums['kd']) == pytest.approx(0.5, abs=1e-6)
  assert float(sums['beta']) == pytest.approx(0.5, abs=1e-6)
  # Forward KL with p's zero entries contributing 0, by hand.
  fkl = distill.token_kd_sums(jnp.asarray(lq)[None, None],
                              jnp.asarray(lp)[None, None],
                              jnp.ones((1, 1)), 'fkl')
  expected = 0.5 * np.log(0.5 / 0.2) + 0.5 * np.log(0.5 / 0.3)
  assert float(fkl['kd']) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize('kind', ['fkl', 'tvd'])
def test_kd_is_zero_when_the_drafter_is_the_target(kind):
  logits = jax.random.normal(jax.random.key(0), (2, 5, 64)) * 3
  weights = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.float32)
  sums = distill.token_kd_sums(logits, logits, weights, kind)
  assert float(sums['kd']) == pytest.approx(0.0, abs=1e-5)
  assert float(sums['beta']) == pytest.approx(8.0, abs=1e-4)  # = weight


def test_kd_rejects_an_unknown_loss():
  with pytest.raises(ValueError, match='kind'):
    distill.token_kd_sums(jnp.zeros((1, 1, 4)), jnp.zeros((1, 1, 4)),
                          jnp.ones((1, 1)), 'rkl')
  with pytest.raises(ValueError, match='kd_loss'):
    training.make_train_step(network.T5Model(STUDENT), 0.01, 'constant', 1,
                             1e-4, None, 'js', 1.0)


def test_generate_refuses_an_out_dir_at_a_url():
  """pathlib would write 'gs://b/d' to a local folder 'gs:/b/d'."""
  with pytest.raises(ValueError, match="out_dir 'gs://b/d' is not a local"):
    distill.generate(None, None, {'inputs': np.zeros((1, 2))}, 'gs://b/d',
                     'train', max_decode_len=2)


@pytest.mark.parametrize('kind', ['fkl', 'tvd'])
def test_kd_falls_in_a_few_steps_and_the_teacher_stays_frozen(teacher, kind):
  model_t, params_t = teacher
  student = network.T5Model(STUDENT)
  step = training.make_train_step(student, 0.01, 'constant', 1, 1e-4,
                                  model_t, kind, 1.0)
  batch = arrays.features(**_toy_arrays())
  state = training.init_state(student, 0)
  frozen = jax.tree.map(np.array, params_t)
  kd = []
  for _ in range(12):
    state, metrics = step(state, batch, params_t)
    kd.append(float(metrics['kd']) / float(metrics['weight']))
  assert kd[-1] < 0.8 * kd[0], kd
  for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(params_t)):
    np.testing.assert_array_equal(a, np.asarray(b))


def test_init_from_teacher_keeps_the_picked_layers(teacher):
  _, params_t = teacher
  assert distill.pick_layers(3, 1) == [0]
  assert distill.pick_layers(3, 2) == [0, 2]
  assert distill.pick_layers(4, 2) == [0, 3]
  cut = distill.init_from_teacher(params_t, TEACHER,
                                  TEACHER.replace(num_decoder_layers=2))
  np.testing.assert_array_equal(cut['decoder']['layers_1']['mlp']['wo'][
      'kernel'], params_t['decoder']['layers_2']['mlp']['wo']['kernel'])
  assert 'layers_2' not in cut['decoder']
  # The full depth is the teacher itself: same logits.
  same = distill.init_from_teacher(params_t, TEACHER, TEACHER)
  model = network.T5Model(TEACHER)
  data = arrays.features(**_toy_arrays(n=2))
  args = (data['encoder_input_tokens'], data['decoder_input_tokens'])
  np.testing.assert_array_equal(teacher_forced_logits(model, same, *args),
                                teacher_forced_logits(model, params_t, *args))
  with pytest.raises(ValueError, match='emb_dim'):
    distill.init_from_teacher(params_t, TEACHER, TEACHER.replace(emb_dim=16))
  with pytest.raises(ValueError, match='cannot keep'):
    distill.init_from_teacher(params_t, TEACHER,
                              TEACHER.replace(num_decoder_layers=4))


def test_claim_run_resumes_only_a_run_of_the_same_settings(tmp_path):
  """A method training run's folder: claimed when new, resumed with the
  same settings (the free ones aside), refused otherwise, naming why."""
  inputs = np.arange(12, dtype=np.int32).reshape(3, 4)
  flags = {'target': 'shipped:target', 'task': 'en_de', 'rows': '64:80',
           'steps': 4, 'out_dir': str(tmp_path)}
  settings = distill.run_settings('train_x.py', flags, ('steps', 'out_dir'),
                                  inputs, rows='64:256')
  assert 'steps' not in settings and settings['rows'] == '64:256'
  out = str(tmp_path / 'run')
  distill.claim_run(out, 'RUN', settings)
  assert os.listdir(out) == [distill.SETTINGS_FILE]
  distill.claim_run(out, 'RUN', distill.run_settings(
      'train_x.py', dict(flags, steps=9), ('steps', 'out_dir'), inputs,
      rows='64:256'))  # more --steps: the same run
  with pytest.raises(checks.InputError, match=(
      r'RUN holds a run with other settings \(task: "en_de" -> "synopsis"; '
      r'train_inputs: "\w+" -> "\w+"\)\. Rerun with its settings')):
    distill.claim_run(out, 'RUN', distill.run_settings(
        'train_x.py', dict(flags, task='synopsis'), ('steps', 'out_dir'),
        inputs + 1, rows='64:256'))
  with pytest.raises(checks.InputError, match=(
      'RUN holds a run of train_x.py, not of train_y.py')):
    distill.claim_run(out, 'RUN', dict(settings, script='train_y.py'))
  with open(os.path.join(out, distill.SETTINGS_FILE), 'w') as f:
    f.write('[1')
  with pytest.raises(checks.InputError, match=(
      r'RUN/settings.json is damaged \(JSONDecodeError')):
    distill.claim_run(out, 'RUN', settings)
  os.remove(os.path.join(out, distill.SETTINGS_FILE))
  os.mkdir(os.path.join(out, 'checkpoint_4'))
  with pytest.raises(checks.InputError, match=(
      'RUN holds checkpoint_4 and no settings.json: not a run of '
      'train_x.py')):
    distill.claim_run(out, 'RUN', settings)
  assert os.listdir(out) == ['checkpoint_4']


def test_generate_writes_the_targets_greedy_outputs_and_resumes(teacher,
                                                                 tmp_path):
  model, params = teacher
  data = _toy_arrays(n=10)
  paths = distill.generate(model, params, data, str(tmp_path), 'train',
                           max_decode_len=6, batch_size=4, num_shards=2,
                           tag='greedy', progress=False)
  assert [os.path.basename(p) for p in paths] == [
      'train-greedy-00000-of-00002.npz', 'train-greedy-00001-of-00002.npz']
  got = arrays.load(str(tmp_path), 'train')
  expected = decoding.temperature_sample(model, params, data['inputs'],
                                         max_decode_len=6)
  np.testing.assert_array_equal(got['inputs'], data['inputs'])
  np.testing.assert_array_equal(got['targets'], np.asarray(expected.tokens))
  # A rerun decodes nothing: a finished shard is kept as it is.
  os.utime(paths[0], (0, 0))
  distill.generate(model, params, data, str(tmp_path), 'train',
                   max_decode_len=6, batch_size=4, num_shards=2,
                   tag='greedy', progress=False)
  assert os.path.getmtime(paths[0]) == 0


def test_array_features_match_seqio_enc_dec_converter():
  """Training on arrays feeds what seqio's converter feeds (no packing)."""
  seqio = tasks.import_seqio()  # triton first, where installed
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  data = _toy_arrays(n=3)
  row = {k: v[0][v[0] != 0] for k, v in data.items()}  # one unpadded row
  ds = tf.data.Dataset.from_tensors(row)
  lengths = {'inputs': data['inputs'].shape[1],
             'targets': data['targets'].shape[1]}
  converted = next(seqio.EncDecFeatureConverter(pack=False)(
      ds, lengths).as_numpy_iterator())
  ours = arrays.features(data['inputs'][:1], data['targets'][:1])
  for key in arrays.FEATURES:
    np.testing.assert_array_equal(ours[key][0], converted[key], err_msg=key)


def test_fit_trims_with_eos_like_seqio_and_pads():
  rows = np.array([[5, 6, 7, 8, 1, 0], [5, 6, 1, 0, 0, 0]], np.int32)
  np.testing.assert_array_equal(arrays.fit(rows, 4),
                                [[5, 6, 7, 1], [5, 6, 1, 0]])
  np.testing.assert_array_equal(arrays.fit(rows, 8)[:, 6:], 0)


def test_array_train_batches_resume_exactly_and_cover_each_epoch():
  data = _toy_arrays(n=12)
  first = [b for _, b in zip(range(7), arrays.array_train_batches(data, 4, 3))]
  resumed = next(arrays.array_train_batches(data, 4, 3, start_step=5))
  np.testing.assert_array_equal(resumed['encoder_input_tokens'],
                                first[5]['encoder_input_tokens'])
  epoch = np.concatenate([b['encoder_input_tokens'] for b in first[:3]])
  assert sorted(map(tuple, epoch)) == sorted(map(tuple, data['inputs']))


def test_train_on_arrays_with_kd_resumes_and_stops_on_time(teacher, tmp_path):
  """The shipped recipe end to end on arrays: KD from a teacher checkpoint,
  init from the teacher, a stop by wall time, a resume to the end."""
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  model_t, params_t = teacher
  teacher_dir = checkpoints.save_t5x_params(params_t, str(tmp_path / 't'), 1)
  data_dir = tmp_path / 'arrays'
  arrays.save(str(data_dir / 'train.npz'), _toy_arrays(n=16))
  arrays.save(str(data_dir / 'validation.npz'), _toy_arrays(n=4, seed=1))
  del model_t
  kwargs = dict(model_config=STUDENT, mixture_or_task_name='toy',
                task_feature_lengths={'inputs': 10, 'targets': 8},
                train_steps=4, model_dir=str(tmp_path / 's'), batch_size=4,
                learning_rate=0.01, schedule='constant', warmup_steps=1,
                log_period=1, eval_period=2, eval_examples=4,
                checkpoint_period=2, array_dir=str(data_dir),
                teacher_config=TEACHER, teacher_checkpoint=teacher_dir,
                kd_loss='tvd', kd_weight=1.0)
  stopped = training.train(**dict(kwargs, max_seconds=0.0))
  assert stopped['step'] == 2  # the compiling step, then out of time
  said = training.status_line(stopped)
  assert said.startswith(f"{tmp_path / 's'}: stopped at step 2 of 4 by "
                         'max_seconds (steps 1-2 trained here; '), said
  assert said.endswith('; rerun the same command to continue'), said
  first = training.read_log(str(tmp_path / 's' / 'log.jsonl'))
  assert {'kd', 'beta'} <= set(first[0])
  done = training.train(**kwargs)
  assert done['start_step'] == 2 and done['step'] == 4
  with pytest.raises(ValueError, match='vocab_size'):
    training.train(**dict(kwargs, model_dir=str(tmp_path / 'x'),
                          model_config=STUDENT.replace(vocab_size=32)))
