"""The model sets' setups are the intended eval runs, built without gin.

`reproduce.eval_setup` builds each setup as a value (configs, checkpoints,
the task table); the eval job's command line gives it through the gin
files (`gin_flags`, built here from the model set's gin file, macros and
checkpoints). These checks need no weights: the two must be equal for
every model set, task and drafter; the value path must run where gin and
seqio are not installed (the device image); the mini setup must pick the
trained mini models' latest checkpoints, the paper setup the T5 1.1 XXL
target with the named T5X drafter, xxl_cost the shipped models widened to
the paper's costs (a widened drafter drafting what it drafted before),
synthetic a random target and noisy copies of it at those costs, and a
missing model or checkpoint must be named clearly.
"""

import subprocess
import sys
import textwrap

import pytest

import jax
import numpy as np

from specdec_jax import decoding
from specdec_jax import gin_utils
from specdec_jax import loading
from specdec_jax import models
from specdec_jax import synthetic
from specdec_jax import task_table
from specdec_jax import widening
from specdec_jax.bench import at_xxl_cost
from specdec_jax.bench import report
from specdec_jax.experiments import reproduce


def make_models(root, steps=(500, 1000)):
  for task in ('en_de', 'synopsis'):
    for size in ('xxl', 'large', 'base', 'small'):
      for step in steps:
        (root / f'{task}_mini_{size}' / f'checkpoint_{step}').mkdir(
            parents=True)


def make_exports(root):
  """The shipped drafters trained but not shipped (`<name>_fkl` runs)."""
  for name, where in reproduce.SHIPPED_T5_DRAFTERS.items():
    if where == 'export':
      (root / f'{name}_fkl' / 'checkpoint_5').mkdir(parents=True)


PAPER_CHECKPOINTS = ','.join(f'{task}_{size}=/ckpt/{task}_{size}'
                             for task in task_table.names()
                             for size in ('xxl',) + reproduce.T5_SIZES)


def every_model_set(root):
  """A setup of each model set (both xxl_cost and synthetic sizes, shipped
  with a data folder too), every drafter found."""
  make_models(root)
  make_exports(root)
  variants = {'xxl_cost': ((False, None), (True, None)),
              'synthetic': ((False, None), (True, None)),
              'shipped': ((False, None), (False, '/data'))}
  for name in task_table.MODEL_SETS:
    for shrink, data_dir in variants.get(name, ((False, None),)):
      yield reproduce.make_setup(name, str(root), PAPER_CHECKPOINTS,
                                 data_dir=data_dir, shrink=shrink)


def _binding(name, value):
  quoted = isinstance(value, str) and not value.startswith('%')
  return f'--gin.{name}={value!r}' if quoted else f'--gin.{name}={value}'


def mini_macro(config):
  """The gin macro of a mini config (MINI_<NAME>: gin_configs/train/)."""
  return next(f'%MINI_{name.upper()}' for name, known in models.MINI.items()
              if known == config)


def gin_flags(models, task, drafter):
  """The eval job's flags that give a (task, drafter) of a model set
  through its gin files: the task's file (paper: the drafter size's), the
  checkpoints, a T5 drafter's config macro (mini models: MINI_<NAME> of
  its config; a paper file names its own), a model-free kind on the file's
  DRAFT_MODEL, the widenings and data folder (no file has them)."""
  files = task_table.files_of(models.models)
  t5 = drafter in models.t5_drafters()
  gin_file = task_table.get(task).gin_file(models.models,
                                           drafter if t5 else 'small')
  flags = [f'--gin_file={gin_file}', '--gin.GAMMA=1',
           "--gin.EVAL_OUTPUT_DIR='-'"]
  target = models.checkpoint(task, 'xxl')
  if target != 'shipped:target':  # the shipped files name the shipped one
    flags.append(_binding('TARGET_CHECKPOINT', target))
  if 'target' in models.widening:
    flags.append(_binding('EvalSetup.target_widen_to',
                          models.widening['target']))
  if models.data_dir is not None:
    flags.append(_binding('DataSpec.data_dir', models.data_dir))
  if not t5:
    return flags + ['--gin.DRAFT_CHECKPOINT=None',
                    _binding('DRAFTER', drafter)]
  if files != 'paper':
    flags.append(f'--gin.DRAFT_MODEL={mini_macro(models.config(drafter))}')
  flags.append(_binding('DRAFT_CHECKPOINT', models.checkpoint(task, drafter)))
  if models.widening.get(drafter) is not None:
    flags.append(_binding('DrafterSpec.widen_to', models.widening[drafter]))
  return flags


def gin_setup(models, task, drafter):
  """What the eval job's gin files give for a (task, drafter) (gamma 1)."""
  args = gin_utils.parse_flags(gin_flags(models, task, drafter), 'test')
  return loading.setup_from_flags(args)


def test_every_setup_value_is_what_its_gin_files_give(tmp_path):
  """The setups are built without gin, but the eval job run by hand
  (`python -m specdec_jax.eval` with `gin_flags`) reads the gin files: for
  every model set, task and drafter offered, the
  two must be the same `EvalSetup`, so neither can drift from the other
  (a config, a task's lengths, a model set's split or data folder, a
  widening)."""
  checked = set()
  for setup in every_model_set(tmp_path):
    assert set(setup.t5_drafters()) >= set(reproduce.T5_SIZES), setup
    for task in task_table.names():
      for drafter in setup.drafters:
        value = reproduce.eval_setup(setup, task, drafter)
        assert value == gin_setup(setup, task, drafter), (
            setup.models, task, drafter)
        checked.add(setup.models)
  assert checked == set(task_table.MODEL_SETS)


def test_setups_are_built_where_gin_and_seqio_are_missing(tmp_path):
  """The device image has neither gin nor seqio: every model set's setup
  must be built there (the shipped ones, which read no seqio task either,
  checked field by field)."""
  make_models(tmp_path)
  script = textwrap.dedent(f'''
      import sys
      sys.modules['gin'] = sys.modules['seqio'] = None  # import raises
      from specdec_jax import task_table
      from specdec_jax.experiments import reproduce, sweep
      from specdec_jax.experiments.specs import table2
      for name in task_table.MODEL_SETS:
        models = reproduce.make_setup(name, {str(tmp_path)!r},
                                      {PAPER_CHECKPOINTS!r})
        for task in task_table.names():
          for drafter in models.drafters:
            setup = reproduce.eval_setup(models, task, drafter, gamma=3)
      shipped = reproduce.eval_setup(reproduce.make_setup('shipped'),
                                     'en_de', 'dec2', gamma=3)
      assert shipped.target_checkpoint == 'shipped:target'
      assert shipped.draft.checkpoint == 'shipped:dec2'
      assert shipped.data.data_dir == 'shipped' and shipped.gamma == 3
      options = sweep.Options(models='xxl_cost', shrink=True)
      assert sweep.plan(table2.SPEC, sweep.options_of(table2.SPEC, options))
      print('built')
      ''')
  done = subprocess.run([sys.executable, '-c', script], capture_output=True,
                        text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().endswith('built')


def test_xxl_cost_widens_the_shipped_models_to_the_paper_costs():
  """'xxl_cost' is the H100 run's Table 2 setting as eval setups:
  the shipped target at T5 1.1-XXL cost, small at T5 1.1-small cost, dec2
  as trained; `--shrink` grows the drafters only a little."""
  setup = reproduce.make_setup('xxl_cost')
  small = reproduce.eval_setup(setup, 'en_de', 'small')
  assert small.target_widen_to == 't5_1_1_xxl_cost'
  assert small.decoding_config.emb_dim == models.CONFIGS['t5_1_1_xxl'].emb_dim
  assert small.draft.widen_to == 't5_1_1_small_cost'
  assert small.draft.decoding_config.replace(
      vocab_size=32128, dtype='bfloat16') == models.CONFIGS['t5_1_1_small']
  assert small.draft.config == models.MINI['small']  # as it loads
  dec2 = reproduce.eval_setup(setup, 'en_de', 'dec2')
  assert dec2.draft.widen_to is None and dec2.target_widen_to is not None
  tiny = reproduce.eval_setup(reproduce.make_setup('xxl_cost', shrink=True),
                              'en_de', 'small')
  assert tiny.target_widen_to is None
  assert tiny.draft.widen_to == reproduce.XXL_COST_SHRUNK['small']


def test_synthetic_is_a_random_target_and_noisy_copies_at_the_paper_costs(
    tmp_path):
  """'synthetic' runs the shipped tasks with no weights: the shipped
  target's config at 'synthetic:seed=0' and, as the drafters small / base
  / large, noisy copies of it (the noise giving the paper's alpha order),
  widened as 'xxl_cost' widens (one table, `XXL_COST`); `--shrink` widens
  nothing, so a CPU runs it in seconds; a models folder of exported
  drafters adds none."""
  make_exports(tmp_path)
  setup = reproduce.make_setup('synthetic', str(tmp_path))
  assert setup.t5_drafters() == reproduce.T5_SIZES
  assert setup.drafters == (reproduce.T5_SIZES
                            + reproduce.model_free_drafters())
  noise = reproduce.SYNTHETIC_NOISE
  assert 0 < noise['large'] < noise['base'] < noise['small']
  xxl = models.CONFIGS['t5_1_1_xxl']
  for size in reproduce.T5_SIZES:
    value = reproduce.eval_setup(setup, 'en_de', size)
    assert value.target_config == models.MINI['xxl']
    assert value.draft.config == models.MINI['xxl']
    assert value.target_checkpoint == 'synthetic:seed=0'
    assert value.draft.checkpoint == f'synthetic:seed=0,noise={noise[size]}'
    assert synthetic.parse(value.draft.checkpoint) == synthetic.Spec(
        0, noise[size])
    assert value.target_widen_to == reproduce.XXL_COST['target']
    assert value.draft.widen_to == reproduce.XXL_COST[size]
    assert value.decoding_config.replace(vocab_size=xxl.vocab_size,
                                         dtype=xxl.dtype) == xxl
    assert value.draft.decoding_config.replace(
        vocab_size=xxl.vocab_size, dtype=xxl.dtype) == (
            models.CONFIGS[f't5_1_1_{size}'])
    assert value.data.data_dir == 'shipped' and value.data.num_examples == 16
  bigram = reproduce.eval_setup(setup, 'synopsis', 'bigram')
  assert bigram.draft.config == models.MINI['dec2']  # as shipped
  assert bigram.target_checkpoint == 'synthetic:seed=0'
  tiny = reproduce.make_setup('synthetic', shrink=True)
  assert tiny.widening == {}
  for size in reproduce.T5_SIZES:
    value = reproduce.eval_setup(tiny, 'en_de', size)
    assert value.target_widen_to is None and value.draft.widen_to is None
    assert value.decoding_config == models.MINI['xxl']
    assert value.draft.decoding_config == models.MINI['xxl']
    assert value.draft.checkpoint == f'synthetic:seed=0,noise={noise[size]}'


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
  setup = reproduce.make_setup('mini', str(tmp_path))
  base = reproduce.eval_setup(setup, 'synopsis', 'base')
  assert base.data.mixture_or_task_name == 'debian_synopsis'
  assert base.target_config.emb_dim == 256
  assert base.target_config.num_decoder_layers == 4
  assert base.draft.config.emb_dim == 128
  assert base.target_checkpoint.endswith('synopsis_mini_xxl/checkpoint_1000')
  assert base.draft.checkpoint.endswith(
      'synopsis_mini_base/checkpoint_1000')
  assert base.data.split == 'test' and base.data.truncate_inputs
  bigram = reproduce.eval_setup(setup, 'en_de', 'bigram', temperature=1.0)
  assert bigram.draft.kind == 'bigram' and bigram.draft.checkpoint is None
  assert bigram.sampling.temperature == 1.0
  assert bigram.data.task_feature_lengths == {'inputs': 64, 'targets': 64}


def test_mini_setup_names_the_missing_model(tmp_path):
  setup = reproduce.make_setup('mini', str(tmp_path))
  with pytest.raises(FileNotFoundError,
                     match='train/en_de_mini_xxl.gin'):
    reproduce.eval_setup(setup, 'en_de', 'small')
  with pytest.raises(ValueError, match="Unknown drafter 'trigram'"):
    reproduce.eval_setup(setup, 'en_de', 'trigram')


def test_paper_setup_uses_the_paper_gin_files():
  setup = reproduce.make_setup(
      'paper', checkpoint_list='en_de_xxl=/ckpt/xxl,en_de_large=/ckpt/large')
  r = reproduce.eval_setup(setup, 'en_de', 'large', gamma=3)
  assert r.gamma == 3
  assert r.data.mixture_or_task_name == 'wmt_t2t_ende_v003'
  assert r.target_config.emb_dim == 4096  # T5 1.1 XXL
  assert r.draft.config.emb_dim == 1024  # T5 1.1 large
  assert (r.target_checkpoint, r.draft.checkpoint) == (
      '/ckpt/xxl', '/ckpt/large')
  with pytest.raises(ValueError, match="'en_de_small'"):
    reproduce.eval_setup(setup, 'en_de', 'small')
  with pytest.raises(ValueError, match='look like en_de_xxl=PATH'):
    reproduce.make_setup('paper', checkpoint_list='en_de_xxl')


def test_results_name_no_home_directory(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path))
  header = report.header('scripts/x.py', ['--models_dir',
                                          f'{tmp_path}/models'])
  assert header['command'] == 'python scripts/x.py --models_dir ~/models'


def test_no_hand_typed_h100_figures_or_restated_helpers():
  # portable lives in bench.report only: no second definition, no alias.
  for name in ('H100_C', 'predicted_h100', 'run_header', 'portable'):
    assert not hasattr(reproduce, name), name


def test_a_drafters_profile_name_is_its_stand_ins_at_the_papers_costs():
  """At the paper's costs (xxl_cost, synthetic; not shrunk) a drafter's c
  in a run's profile has the name the H100 profile's run gave it, so the
  two profiles read alike; elsewhere, and for a drafter it never timed,
  the drafter's own name."""
  assert at_xxl_cost.STAND_INS['small'] == 'small@t5_1_1_small_cost'
  for model_set in reproduce.AT_XXL_COST:
    assert reproduce.profile_name(model_set, 'small') == (
        'small@t5_1_1_small_cost')
    assert reproduce.profile_name(model_set, 'small', shrink=True) == 'small'
    assert reproduce.profile_name(model_set, 'base') == 'base'
  assert reproduce.profile_name('shipped', 'small') == 'small'
