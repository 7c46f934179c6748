"""Every gin file parses, and every model file builds T5X's model.

Researchers launch runs from these files; a typo or a wrong dimension in one
would only surface on a TPU hours later. Models are built with
`jax.eval_shape` (`T5Model.param_shapes`: no memory), so XXL costs nothing
here; a file whose config is the one tests/test_network.py builds and
traces against T5X's tree is compared with it instead.
"""

import pathlib

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import eval as eval_lib
from specdec_jax import loading
from specdec_jax import network
from specdec_jax import models

import test_network

GIN_DIR = pathlib.Path(__file__).resolve().parents[1] / 'gin_configs'
MODEL_FILES = sorted(GIN_DIR.glob('models/*/*.gin'))
PAPER_FILES = sorted(GIN_DIR.glob('paper/*.gin'))

# Parameter counts of the released checkpoints' architectures (vocab 32128).
EXPECTED_PARAMS = {
    't5_1_0/small': 60_506_624,
}
# The T5 1.1 sizes whose trees tests/test_network.py traces in the default
# run (names, shapes, axes against T5X's; small's 76,961,152 parameters):
# their files' configs are checked here against those dims, not traced
# again. 'large' and 'xl' (test_network's are `slow`) are traced here.
T5_1_1_TRACED = {size: dims for size, dims in test_network.T5_1_1.items()
                 if size in ('small', 'base', 'xxl')}


@gin.configurable
def _capture(config=gin.REQUIRED):
  return config


def _macro(path):
  return path.parent.name.upper() + '_' + path.stem.upper()


def _parse(files, bindings=()):
  gin.clear_config(clear_constants=True)
  gin.add_config_file_search_path(str(GIN_DIR))
  gin.parse_config_files_and_bindings([str(f) for f in files], list(bindings))


@pytest.mark.parametrize('path', MODEL_FILES, ids=lambda p: f'{p.parent.name}/{p.stem}')
def test_model_file_builds(path):
  _parse([path], [f'_capture.config = %{_macro(path)}'])
  config = _capture()
  gin.clear_config(clear_constants=True)
  assert isinstance(config, network.T5Config)
  assert config.dtype == 'bfloat16' and config.vocab_size == 32128
  # The Python twin (specdec_jax.models) binds the same config.
  assert models.CONFIGS[f'{path.parent.name}_{path.stem}'] == config
  size = T5_1_1_TRACED.get(path.stem)
  if path.parent.name in ('t5_1_1', 'flan_t5') and size:
    # The config whose tree tests/test_network.py traces against T5X's,
    # every field (but the dtype and dropout it builds with).
    assert config.replace(dtype=jnp.float32) == network.T5Config(
        vocab_size=32128, mlp_activations=('gelu', 'linear'),
        logits_via_embedding=False, dropout_rate=config.dropout_rate, **size)
    return
  # `param_shapes` traces the init once per config: the Flan-T5 files
  # bind T5 1.1's architectures, which are not traced twice.
  variables = network.T5Model(config.replace(dtype=jnp.float32)).param_shapes()
  n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(variables))
  key = f'{path.parent.name}/{path.stem}'
  if key in EXPECTED_PARAMS:
    assert n == EXPECTED_PARAMS[key]
  assert ('logits_dense' in variables['decoder']) == (
      not config.logits_via_embedding)


def test_python_twin_has_no_config_without_gin_file():
  names = {f'{p.parent.name}_{p.stem}' for p in MODEL_FILES}
  assert set(models.CONFIGS) == names


def test_twelve_paper_rows():
  assert len(PAPER_FILES) == 12  # 2 tasks x 2 temperatures x 3 drafters


@pytest.mark.parametrize('path', PAPER_FILES, ids=lambda p: p.stem)
def test_paper_file_binds_every_argument(path):
  """A paper file plus the three site-specific paths is a complete run."""
  _parse([path], [
      "TARGET_CHECKPOINT = '/ckpt/target'",
      "DRAFT_CHECKPOINT = '/ckpt/draft'",
      "EVAL_OUTPUT_DIR = '/tmp/out'",
  ])
  bindings = gin.get_configurable(loading.EvalSetup)()
  output_dir = gin.query_parameter('%EVAL_OUTPUT_DIR')
  gin.clear_config(clear_constants=True)
  task, temp, drafter = path.stem.split('_')
  assert bindings.sampling.temperature == float(temp[1:])
  assert bindings.data.mixture_or_task_name == {
      'ende': 'wmt_t2t_ende_v003', 'cnndm': 'cnn_dailymail_v002'}[task]
  assert isinstance(bindings.gamma, int) and bindings.gamma >= 1
  assert bindings.target_checkpoint == '/ckpt/target'
  assert output_dir == '/tmp/out'
  sizes = {'small': 512, 'base': 768, 'large': 1024}
  assert bindings.draft.config.emb_dim == sizes[drafter]
  assert bindings.target_config.emb_dim == 4096  # T5 1.1 XXL
  assert bindings.target_config.mlp_dim == 10240


def test_missing_required_macro_is_named():
  with pytest.raises(Exception, match='TARGET_CHECKPOINT|REQUIRED'):
    _parse([GIN_DIR / 'paper' / 'ende_t0_small.gin'])
    gin.get_configurable(eval_lib.evaluate)()
  gin.clear_config(clear_constants=True)


@pytest.mark.parametrize('path', sorted(GIN_DIR.glob('examples/*.gin')),
                         ids=lambda p: p.stem)
def test_example_files_are_complete_runs(path):
  _parse([path], ["EVAL_OUTPUT_DIR = '/tmp/out'"])
  resolved = gin.get_configurable(loading.EvalSetup)()
  gin.clear_config(clear_constants=True)
  assert isinstance(resolved.target_config, network.T5Config)
  assert resolved.target_config.vocab_size == (
      resolved.draft.config.vocab_size)


def test_a_folder_named_like_a_gin_folder_does_not_break_includes(
    tmp_path, monkeypatch):
  """gin also reads an include ('runs/eval.gin') as a resource of a Python
  package ('runs'); a `runs/` folder importable from the working directory
  made its check raise a TypeError from inside gin instead of trying the
  search paths (the main job failed when run from such a folder)."""
  (tmp_path / 'runs').mkdir()
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.chdir(tmp_path)
  setup = eval_lib.configured(['--gin_file=shipped/en_de.gin', '--dry_run',
                               "--gin.EVAL_OUTPUT_DIR='/tmp/x'"])[1]
  assert setup.data.mixture_or_task_name == 'debian_desc_en_de'


def test_a_value_gin_cannot_parse_is_shown_with_its_line(tmp_path):
  """gin names such a line by its number alone; the command shows its text,
  and for a --gin. binding how a string is written."""
  with pytest.raises(SystemExit) as e:
    eval_lib.configured(['--gin_file=shipped/en_de.gin', '--dry_run',
                         '--gin.EVAL_OUTPUT_DIR=/tmp/x'])
  assert e.value.code == (
      "error: gin configuration: Unable to parse value. In the binding "
      "'EVAL_OUTPUT_DIR = /tmp/x' (a string is quoted: "
      """--gin.EVAL_OUTPUT_DIR="'/tmp/x'")""")
  bad = tmp_path / 'bad.gin'
  bad.write_text("include 'shipped/en_de.gin'\nGAMMA = 3 4\n")
  with pytest.raises(SystemExit) as e:  # no hint: not an unquoted string
    eval_lib.configured([f'--gin_file={bad}', '--dry_run'])
  assert e.value.code == ('error: gin configuration: Expected newline. '
                          f'({bad}, line 2: GAMMA = 3 4)')
  # A bracket left open: gin's tokenizer names no file (before: "('EOF in
  # multi-line statement', (3, 0))" alone); the file given is named.
  opened = tmp_path / 'opened.gin'
  opened.write_text("include 'shipped/en_de.gin'\nGAMMA = (3,\n")
  with pytest.raises(SystemExit) as e:
    eval_lib.configured(['--gin_file=shipped/en_de.gin', f'--gin_file={opened}',
                         '--dry_run'])
  assert e.value.code == (
      'error: gin configuration: EOF in multi-line statement (a bracket or '
      f'quote left open?) in {opened} or a file it includes')
  # A bare word is an unquoted string too (gin's "malformed node or
  # string ... <ast.Name object at 0x...>", before); a macro no file
  # defines is named (the whole configuration printed after it, before).
  for binding, said in (
      ('--gin.DRAFTER=t5', "Unable to parse value. In the binding 'DRAFTER "
       """= t5' (a string is quoted: --gin.DRAFTER="'t5'")"""),
      ('--gin.DRAFT_MODEL=%MINI_DEC', '%MINI_DEC is a macro no gin file or '
       'binding defines (a typo?)')):
    with pytest.raises(SystemExit) as e:
      eval_lib.configured(['--gin_file=shipped/en_de.gin', '--dry_run',
                           binding])
    assert e.value.code == f'error: gin configuration: {said}'
  with pytest.raises(SystemExit) as e:  # a bad name, not an unquoted value
    eval_lib.configured(['--gin_file=shipped/en_de.gin', '--dry_run',
                         '--gin.DataSpec.truncate-inputs=True'])
  assert 'quoted' not in e.value.code, e.value.code


def test_a_binding_of_a_moved_parameter_says_where_it_is_now():
  """A gin file written before the setup's groups binds
  `loading.EvalSetup.data_dir`; gin's error then says its new name, and
  every new name is one gin takes."""
  with pytest.raises(SystemExit) as e:
    eval_lib.configured(['--gin_file=shipped/en_de.gin', '--dry_run',
                         "--gin.loading.EvalSetup.data_dir='/tmp/d'"])
  assert e.value.code.endswith(
      "named 'data_dir'.\n  In bindings string line 1\n    "
      "loading.EvalSetup.data_dir = '/tmp/d'\n  It is now bound as "
      'loading.DataSpec.data_dir.'), e.value.code
  eval_lib.configured(['--gin_file=shipped/en_de.gin', '--dry_run',
                       "--gin.EVAL_OUTPUT_DIR='/tmp/x'"])  # registers them
  with gin.unlock_config():
    for now in loading.MOVED.values():
      gin.parse_config([f'{now} = 0'])  # raises for a name gin has not
  gin.clear_config(clear_constants=True)
  assert len(loading.MOVED) == len(loading.GROUPED)
