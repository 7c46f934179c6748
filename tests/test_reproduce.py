"""The reproduction scripts' setups resolve to the intended eval runs.

Every setup goes through the eval job's own gin files into its EvalSetup, so these
checks need no weights: the mini setup must pick the trained mini models'
configs and latest checkpoints, the paper setup the T5 1.1 XXL target with the
named T5X drafter, and a missing model or checkpoint must be named clearly.
"""

import jax
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax import hardware
from specdec_jax import loading
from specdec_jax import models
from specdec_jax import widening
from specdec_jax.bench import report
from specdec_jax.experiments import reproduce


def make_models(root, steps=(500, 1000)):
  for task in ('en_de', 'synopsis'):
    for size in ('xxl', 'large', 'base', 'small'):
      for step in steps:
        (root / f'{task}_mini_{size}' / f'checkpoint_{step}').mkdir(
            parents=True)


def test_a_widened_drafter_drafts_what_it_drafted_before():
  """`DrafterSpec.widen_to` widens the loaded draft model as the target's
  widening does, function-preservingly: its greedy outputs are the same
  tokens (so alpha and the speculative outputs are too), at the cost of
  the bigger model; a kind with no draft model refuses it."""
  tiny = models.config('t5_1_1_tiny', vocab_size=64, dtype='float32',
                       num_encoder_layers=1, num_decoder_layers=1)
  grown = dict(emb_dim=12, mlp_dim=24, num_decoder_layers=2)
  spec = loading.DrafterSpec(config=tiny, widen_to=grown)
  model, params = loading.load_draft_model(spec, seed=3)
  assert model.config == widening.widened_config(tiny, grown)
  assert widening.param_count(params) > widening.param_count(
      loading.load_draft_model(spec.replace(widen_to=None), seed=3)[1])
  inputs = np.asarray(jax.random.randint(jax.random.key(0), (2, 6), 2, 64))
  outputs = [decoding.temperature_sample(
      *loading.load_draft_model(s, seed=3), inputs, max_decode_len=8,
      eos_id=1).tokens for s in (spec.replace(widen_to=None), spec)]
  np.testing.assert_array_equal(*outputs)
  cache = loading.LoadCache()
  kept = loading.load_draft_model(spec, 3, cache)
  assert loading.load_draft_model(spec, 3, cache)[0] == kept[0]
  assert cache.loads['draft'] == 1
  with pytest.raises(ValueError, match='no draft model to widen'):
    loading.DrafterSpec(kind='bigram', widen_to=grown)


def test_mini_setup_resolves_models_and_latest_checkpoints(tmp_path):
  make_models(tmp_path)
  setup = reproduce.MiniSetup(str(tmp_path))
  base = reproduce.eval_setup(setup, 'synopsis', 'base')
  assert base.mixture_or_task_name == 'debian_synopsis'
  assert base.target_config.emb_dim == 256
  assert base.target_config.num_decoder_layers == 4
  assert base.draft.config.emb_dim == 128
  assert base.target_checkpoint.endswith('synopsis_mini_xxl/checkpoint_1000')
  assert base.draft.checkpoint.endswith(
      'synopsis_mini_base/checkpoint_1000')
  assert base.split == 'test' and base.truncate_inputs
  bigram = reproduce.eval_setup(setup, 'en_de', 'bigram', temperature=1.0)
  assert bigram.draft.kind == 'bigram' and bigram.draft.checkpoint is None
  assert bigram.temperature == 1.0
  assert bigram.task_feature_lengths == {'inputs': 64, 'targets': 64}


def test_mini_setup_names_the_missing_model(tmp_path):
  setup = reproduce.MiniSetup(str(tmp_path))
  with pytest.raises(FileNotFoundError,
                     match='train/en_de_mini_xxl.gin'):
    reproduce.eval_flags(setup, 'en_de', 'small')
  with pytest.raises(ValueError, match="Unknown drafter 'trigram'"):
    reproduce.eval_flags(setup, 'en_de', 'trigram')


def test_paper_setup_uses_the_paper_gin_files():
  setup = reproduce.make_setup(
      'paper', checkpoint_list='en_de_xxl=/ckpt/xxl,en_de_large=/ckpt/large')
  r = reproduce.eval_setup(setup, 'en_de', 'large', gamma=3)
  assert r.gamma == 3
  assert r.mixture_or_task_name == 'wmt_t2t_ende_v003'
  assert r.target_config.emb_dim == 4096  # T5 1.1 XXL
  assert r.draft.config.emb_dim == 1024  # T5 1.1 large
  assert (r.target_checkpoint, r.draft.checkpoint) == (
      '/ckpt/xxl', '/ckpt/large')
  with pytest.raises(ValueError, match="'en_de_small'"):
    reproduce.eval_flags(setup, 'en_de', 'small')
  with pytest.raises(ValueError, match='look like en_de_xxl=PATH'):
    reproduce.make_setup('paper', checkpoint_list='en_de_xxl')


def test_results_name_no_home_directory(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path))
  make_models(tmp_path / 'models')
  setup = reproduce.MiniSetup(str(tmp_path / 'models'))
  command = reproduce.shell_command(
      reproduce.eval_flags(setup, 'en_de', 'small'))
  assert str(tmp_path) not in command
  assert "'~/models/en_de_mini_xxl/checkpoint_1000'" in command
  header = report.header('scripts/x.py', ['--models_dir',
                                          f'{tmp_path}/models'])
  assert header['command'] == 'python scripts/x.py --models_dir ~/models'


def test_no_hand_typed_h100_figures_or_restated_helpers():
  # portable lives in bench.report only: no second definition, no alias.
  for name in ('H100_C', 'predicted_h100', 'run_header', 'portable'):
    assert not hasattr(reproduce, name), name


def test_xxl_cost_prediction_is_predict_on_the_measured_profile():
  profile = hardware.load(hardware.H100)
  for drafter, timed in (('dec2', 'dec2'),
                         ('small', 'small@t5_1_1_small_cost'),
                         ('bigram', 'bigram')):
    got = reproduce.predict_at_xxl_cost(profile, 0.7, drafter)
    want = hardware.predict(profile, alpha=0.7, drafter=timed)
    assert got['speedup'] == want.speedup and got['gamma'] == want.gamma
    assert got['c'] == profile.c[1][timed]
    assert got['c_how'] == hardware.MEASURED
    assert reproduce.xxl_cost_cell(got) == (
        f'{want.speedup:.2f}x ({want.gamma})')
  # Not timed: the profile's bytes / launches model, labelled and marked.
  base = reproduce.predict_at_xxl_cost(profile, 0.7, 'base')
  assert base['c_how'] == hardware.BYTES_MODEL
  assert 'bytes / launches model' in base['label']
  assert base['kernels'] > 0 and base['step_bytes'] > 0
  c, _ = profile.c_of('base', step_bytes=base['step_bytes'],
                      kernels=base['kernels'])
  assert base['c'] == pytest.approx(c)
  large = reproduce.predict_at_xxl_cost(profile, 0.7, 'large')
  assert large['c'] > base['c']
  assert reproduce.xxl_cost_cell(base).endswith('†')
  assert reproduce.predict_at_xxl_cost(profile, 0.7, 'heads') is None
  assert reproduce.xxl_cost_cell(None) == '-'
  note = reproduce.xxl_cost_note(profile)
  assert f'predicted on profile {profile.name}' in note
  assert 'through hardware.predict' in note
