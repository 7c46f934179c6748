"""Bad arguments fail at the API boundary, named, before anything compiles.

Token ids outside the vocabulary, float or 1-D token
arrays, `eos_id=None`, bigram tables of another size or `draft_input_tokens`
of another batch used to fail deep inside jax (or not at all: an id past
the vocabulary reads NaN from the embedding). Every case of the table runs
through the four decode functions that take the argument
(`temperature_sample`, `speculative_sample` and their `lower_*` twins) with
a target that raises AssertionError if it is ever traced: the error must be
the ValueError (TypeError for a dtype) whose message names the argument.

Run alone: `python -m pytest -q tests/test_validation.py` (a few seconds).
"""

import argparse
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import diagnostics
from specdec_jax import drafters
from specdec_jax import eval as eval_lib
from specdec_jax import network
from specdec_jax import sampling
from specdec_jax import speculative
from specdec_jax import summary
from specdec_jax.experiments import sweep

from conftest import numpy_params
from conftest import TINY_V11
from test_decoding import StepStub
from test_decoding import Untouchable  # a target that fails if traced

VOCAB = Untouchable.vocab_size  # 32
BIGRAM = drafters.ngram_params([[2, 3, 1], [4, 4, 5, 1]], VOCAB, order=2,
                               top_k=4)
T5_SMALL = TINY_V11.replace(vocab_size=VOCAB, emb_dim=16, num_heads=2,
                            mlp_dim=32, num_encoder_layers=1,
                            num_decoder_layers=1)


def ids(*rows, dtype=np.int32):
  return np.array(rows, dtype)


GOOD_INPUTS = ids([1, 2, 3], [4, 5, 0])


@dataclasses.dataclass(frozen=True)
class UntouchableT5(network.T5Model):
  """A T5 that checks its params as any does, and fails if traced."""

  init_cache = extend = Untouchable.init_cache


def baseline(lower=False, inputs=GOOD_INPUTS, target=None, params=None,
             **kwargs):
  fn = (decoding.temperature_sample.lower if lower else
        decoding.temperature_sample)
  kwargs.setdefault('max_decode_len', 4)
  kwargs.setdefault('rng', jax.random.key(0))
  return fn(Untouchable() if target is None else target,
            {} if params is None else params, inputs, **kwargs)


def spec(lower=False, inputs=GOOD_INPUTS, drafter=None, draft_params=None,
         target=None, params=None, **kwargs):
  fn = (speculative.speculative_sample.lower if lower else
        speculative.speculative_sample)
  drafter = drafter or drafters.NgramDrafter(VOCAB, 2)
  draft_params = BIGRAM if draft_params is None else draft_params
  kwargs.setdefault('max_decode_len', 4)
  kwargs.setdefault('rng', jax.random.key(0))
  return fn(Untouchable() if target is None else target,
            {} if params is None else params, drafter, draft_params,
            inputs, gamma=2, **kwargs)


def bigram(**changes):
  """BIGRAM with some entries replaced (None: removed)."""
  params = dict(BIGRAM, **changes)
  return {k: v for k, v in params.items() if v is not None}


def t5_params_of(config):
  return jax.eval_shape(network.T5Model(config).init_params,
                        jax.random.key(0))


ABSTRACT = jax.ShapeDtypeStruct

# Arguments both decoders take: run through all four functions.
COMMON = {
    'id_past_vocab': (dict(inputs=ids([1, 2, 3], [4, VOCAB, 0])), ValueError,
                      r'encoder_input_tokens must be token ids in '
                      r'\[0, vocab_size=32\); got ids from 0 to 32'),
    'negative_id': (dict(inputs=ids([1, -1, 3], [4, 5, 0])), ValueError,
                    r'encoder_input_tokens .*\[0, vocab_size=32\)'),
    'float_ids': (dict(inputs=ids([1, 2], [3, 4], dtype=np.float32)),
                  TypeError, r'encoder_input_tokens must be integer .*float32'),
    'bool_ids': (dict(inputs=ids([True, False], dtype=bool)), TypeError,
                 'encoder_input_tokens must be integer'),
    'abstract_float_ids': (dict(inputs=ABSTRACT((2, 3), jnp.float32)),
                           TypeError, 'encoder_input_tokens must be integer'),
    'eos_none': (dict(eos_id=None), ValueError,
                 r'eos_id must be an int in \[0, vocab_size=32\) \(or -1: '
                 r'no EOS\), got None'),
    'eos_past_vocab': (dict(eos_id=VOCAB), ValueError, 'eos_id .* got 32'),
    'eos_negative': (dict(eos_id=-2), ValueError, 'eos_id .* got -2'),
    'eos_float': (dict(eos_id=1.0), ValueError, r'eos_id .* got 1\.0'),
    'eos_bool': (dict(eos_id=True), ValueError, 'eos_id .* got True'),
    # said as params (the baseline's argument) or target_params
    'target_params_of_another_config': (
        dict(target=UntouchableT5(T5_SMALL),
             params=t5_params_of(T5_SMALL.replace(mlp_dim=48))), ValueError,
        r'params do not fit the UntouchableT5: the tree: 6 parameters '
        r"differ .*mlp_dim 48, .* the config's .*mlp_dim 32, .*:\n"
        r'.*decoder/layers_0/mlp/wi_0/kernel: \(16, 48\) vs config '
        r'\(16, 32\)'),
    'int_target_params': (  # they would decode 0s, silently
        dict(target=UntouchableT5(T5_SMALL), params=jax.tree.map(
            lambda x: ABSTRACT(x.shape, jnp.int32), t5_params_of(T5_SMALL))),
        TypeError, r'params do not fit the UntouchableT5: the tree: '
        r'parameters must be floating point .*; decoder/.* is int32'),
    'rng_an_int': (dict(rng=0), ValueError,
                   r'rng must be one PRNG key, jax\.random\.key\(seed\) .*'
                   r'got 0\.'),
    'model_and_params_swapped': (
        dict(target={'encoder': {}}, params=Untouchable()), ValueError,
        r'model must be an interfaces\.DecodingModel, e\.g\. '
        r'network\.T5Model\(config\), got a dict\.'),
    'rng_a_batch_of_keys': (
        dict(rng=jax.random.split(jax.random.key(0), 2)), ValueError,
        r'rng must be one PRNG key.* got .*of shape \(2,\) and dtype key'),
}

# Arguments of the speculative decoder only.
SPECULATIVE = {
    'draft_inputs_other_batch': (
        dict(draft_input_tokens=ids([1, 2], [3, 4], [5, 6])), ValueError,
        'draft_input_tokens has 3 rows, encoder_input_tokens 2'),
    'abstract_draft_inputs_other_batch': (
        dict(inputs=ABSTRACT((2, 3), jnp.int32),
             draft_input_tokens=ABSTRACT((4, 3), jnp.int32)), ValueError,
        'draft_input_tokens has 4 rows'),
    'draft_id_past_vocab': (
        dict(draft_input_tokens=ids([1, 40], [3, 4])), ValueError,
        r'draft_input_tokens must be token ids in \[0, vocab_size=32\)'),
    'draft_float_ids': (
        dict(draft_input_tokens=ids([1, 2], [3, 4], dtype=np.float64)),
        TypeError, 'draft_input_tokens must be integer'),
    'draft_inputs_1d': (
        dict(draft_input_tokens=ids(1, 2, 3)), ValueError,
        r'draft_input_tokens must be \[batch, length\]'),
    'unigram_of_another_vocab': (
        dict(drafter=drafters.NgramDrafter(VOCAB, 1),
             draft_params={'log_unigram': jnp.zeros(30)}), ValueError,
        r"draft_params do not fit the NgramDrafter: 'log_unigram' has shape "
        r'\(30,\); vocab_size=32, order=1 needs \(32,\)'),
    'unigram_params_not_a_dict': (
        dict(drafter=drafters.NgramDrafter(VOCAB, 1),
             draft_params=jnp.zeros(VOCAB)), ValueError,
        'draft_params do not fit the NgramDrafter: params must be a dict'),
    'bigram_without_successors': (
        dict(draft_params=bigram(next_tokens=None)), ValueError,
        r"draft_params .*'next_tokens' is missing \(order 2 needs"),
    'bigram_table_of_another_vocab': (
        dict(draft_params=bigram(next_tokens=BIGRAM['next_tokens'][:30])),
        ValueError, r"draft_params .*'next_tokens' has shape \(30, 4\)"),
    'bigram_log_probs_of_another_k': (
        dict(draft_params=bigram(next_log_probs=jnp.zeros((VOCAB, 5)))),
        ValueError, r"draft_params .*'next_log_probs' has shape \(32, 5\); "
        r'.* needs \(32, 4\)'),
    'bigram_backoff_of_another_vocab': (
        dict(draft_params=bigram(log_backoff=jnp.zeros(VOCAB + 1))),
        ValueError, r"draft_params .*'log_backoff' has shape \(33,\)"),
    'bigram_float_successors': (
        dict(draft_params=bigram(
            next_tokens=BIGRAM['next_tokens'].astype(jnp.float32))),
        TypeError, 'draft_params .*next_tokens must be integer'),
    'bigram_successor_past_vocab': (
        dict(draft_params=bigram(
            next_tokens=BIGRAM['next_tokens'].at[3, 1].set(VOCAB + 7))),
        ValueError, r'draft_params .*next_tokens must be token ids in '
        r'\[0, vocab_size=32\); got ids from 0 to 39'),
    'drafter_a_model': (
        dict(drafter=network.T5Model(T5_SMALL)), ValueError,
        r'drafter must be an interfaces\.Drafter, e\.g\. drafters\.'
        r'T5Drafter\(draft_model\), got a T5Model\.'),
    'drafter_a_class': (
        dict(drafter=drafters.T5Drafter), ValueError,
        r'drafter must .*, got the class T5Drafter\.'),
    't5_params_of_another_config': (
        dict(drafter=drafters.T5Drafter(network.T5Model(T5_SMALL)),
             draft_params=t5_params_of(T5_SMALL.replace(mlp_dim=48))),
        ValueError, r'draft_params do not fit the T5Drafter: the tree: 6 '
        r"parameters differ .*mlp_dim 48, .* the config's .*mlp_dim 32, "
        r'.*:\n'
        r'.*decoder/layers_0/mlp/wi_0/kernel: \(16, 48\) vs config '
        r'\(16, 32\)'),
    't5_params_missing_a_layer': (
        dict(drafter=drafters.T5Drafter(network.T5Model(
            T5_SMALL.replace(num_decoder_layers=2))),
             draft_params=t5_params_of(T5_SMALL)), ValueError,
        r"draft_params .*say .*1 \+ 1 layers.*the config's .*1 \+ 2 "
        r'layers.*\n  decoder/layers_1/.*: missing \(config \(16, 16\)\)'),
}

CASES = [(f'{fn.__name__}{"_lowered" if lower else ""}-{name}', fn, lower,
          case) for table, fns in ((COMMON, (baseline, spec)),
                                   (SPECULATIVE, (spec,)))
         for fn in fns for lower in (False, True)
         for name, case in table.items()]


@pytest.mark.parametrize('fn,lower,case', [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_argument_is_named_before_compiling(fn, lower, case):
  """Each a `checks.InputError` (but a dtype's TypeError): what a command
  says in one line, a refusal, not a fault of the code."""
  kwargs, error, message = case
  with pytest.raises(checks.InputError if error is ValueError else error,
                     match=message):
    fn(lower=lower, **kwargs)


def test_good_parameters_pass_the_drafters_checks():
  """What `ngram_params` and `init_params` make fits (ShapeDtypeStructs too)."""
  for order in (1, 2):
    params = drafters.ngram_params([[2, 3, 1]], VOCAB, order=order)
    drafters.NgramDrafter(VOCAB, order).check_params(params)
    drafters.NgramDrafter(VOCAB, order).check_params(
        jax.tree.map(lambda x: ABSTRACT(x.shape, x.dtype), params))
  drafters.T5Drafter(network.T5Model(T5_SMALL)).check_params(
      t5_params_of(T5_SMALL))


def test_abstract_and_traced_ids_skip_the_value_check():
  """ShapeDtypeStructs and tracers have no values: shapes and dtypes only.

  The baseline lowers from a ShapeDtypeStruct and runs under an outer jit
  (its inputs then tracers), where a value check would raise a
  TracerArrayConversionError.
  """
  offsets = jnp.full((2, 8), 3)
  decoding.temperature_sample.lower(
      StepStub(), offsets, ABSTRACT((2, 3), jnp.int32), max_decode_len=4)

  @jax.jit
  def traced(inputs):
    return decoding.temperature_sample(StepStub(), offsets, inputs,
                                       max_decode_len=4).tokens

  np.testing.assert_array_equal(traced(jnp.ones((2, 3), jnp.int32)),
                                [[3, 6, 9, 12]] * 2)


def test_eos_minus_one_means_no_eos():
  """-1 is allowed: scripts/benchmark_*.py decode fixed lengths with it."""
  offsets = jnp.full((2, 8), 1)  # token 1 every step: EOS if eos_id were 1
  out = decoding.temperature_sample(StepStub(), offsets,
                                    jnp.ones((2, 3), jnp.int32),
                                    max_decode_len=4, eos_id=-1)
  np.testing.assert_array_equal(out.lengths, [4, 4])


@pytest.mark.parametrize('value', [True, 2.0, '3', None, 0, -1])
def test_an_int_argument_refuses_bools_floats_and_small_values(value):
  with pytest.raises(ValueError,
                     match=r'^gamma must be an int >= 1, got .*\.$'):
    checks.check_int('gamma', value)


def test_numpy_ints_pass_and_the_note_is_in_the_message():
  checks.check_int('gamma', np.int64(3))
  checks.check_int('topk', 0, 0)
  assert checks.is_int(np.int32(1)) and not checks.is_int(np.bool_(True))
  with pytest.raises(ValueError, match=r'topk must be an int >= 0 \(0 = off\)'
                     r', got -2\.'):
    checks.check_int('topk', -2, 0, ' (0 = off)')
  checks.check_ints(batch=1, gamma=np.int64(2))  # each named by its keyword
  assert checks.counts('1, 8,32') == (1, 8, 32) and checks.counts('') == ()
  for bad in ('1,0', '-2', '1,x', '1.5'):
    with pytest.raises(argparse.ArgumentTypeError, match='ints >= 1'):
      checks.counts(bad)
  assert checks.count('3') == 3 and checks.positive('1e-3') == 1e-3
  assert checks.natural('0') == 0 and checks.natural('7') == 7
  for bad in ('-1', 'x', '1.5'):  # a seed numpy would refuse in a traceback
    with pytest.raises(argparse.ArgumentTypeError, match='an int >= 0'):
      checks.natural(bad)
  for bad in ('0', '-1', '2.5', 'x', ''):
    with pytest.raises(argparse.ArgumentTypeError, match='an int >= 1'):
      checks.count(bad)
  for bad in ('0', '-1e-3', 'nan', 'inf', 'x'):
    with pytest.raises(argparse.ArgumentTypeError, match='finite number > 0'):
      checks.positive(bad)
  home = os.path.expanduser('~')
  assert checks.local_path('~/runs/x') == os.path.join(home, 'runs', 'x')
  with pytest.raises(argparse.ArgumentTypeError, match='a local path'):
    checks.local_path('gs://bucket/x')
  with pytest.raises(ValueError, match=r'^gamma must be an int >= 1, got 0\.'):
    checks.check_ints(batch=1, gamma=0)


@pytest.mark.parametrize('value', [0, -5.0, float('nan'), True, '3', None])
def test_a_positive_number_refuses_zero_nan_bools_and_strings(value):
  with pytest.raises(ValueError, match=r'^max_minutes must be a number of '
                     r'minutes > 0, got .*\.$'):
    checks.check_positive('max_minutes', value, 'minutes')


def test_positive_numbers_pass_and_one_line_ends_a_command():
  for value in (1, 0.5, np.float32(2.0), np.int64(3), float('inf')):
    checks.check_positive('max_minutes', value, 'minutes')
  with pytest.raises(SystemExit) as e:
    with checks.one_line(ValueError):
      raise ValueError('gamma must be an int >= 1, got 0.')
  assert e.value.code == 'error: gamma must be an int >= 1, got 0.'
  with pytest.raises(SystemExit) as e:  # `said` names the file and the type
    with checks.one_line(KeyError, said='x.json is no results file: '):
      raise KeyError('spec')
  assert e.value.code == "error: x.json is no results file: KeyError: 'spec'"
  with pytest.raises(TypeError):  # not one of the types: as it was
    with checks.one_line(ValueError):
      raise TypeError('a bug')


def test_a_command_a_signal_stopped_leaves_at_once(monkeypatch):
  """`run_main`: a refusal is its line; a command a signal stopped (exit
  status 130 / 143) leaves by `os._exit`, not the interpreter's exit (an
  XLA compile still running there crashed it); other exits as they were."""
  import os  # pylint: disable=g-import-not-at-top
  left = []

  def leave(code):
    left.append(code)
    raise GeneratorExit  # what os._exit is to the caller: no return

  monkeypatch.setattr(os, '_exit', leave)
  for code in (130, 143):
    with pytest.raises(GeneratorExit):
      checks.run_main(lambda code=code: (_ for _ in ()).throw(
          SystemExit(code)))
  assert left == [130, 143]
  for code in (0, 1, 'error: x'):
    with pytest.raises(SystemExit) as e:
      checks.run_main(lambda code=code: (_ for _ in ()).throw(
          SystemExit(code)))
    assert e.value.code == code
  with pytest.raises(SystemExit, match='error: gamma'):
    checks.run_main(lambda: (_ for _ in ()).throw(
        checks.InputError('gamma')))
  assert left == [130, 143]


def test_a_local_folder_a_job_writes_is_no_url_and_no_file(
    tmp_path, monkeypatch):
  checks.check_local_folder('out_dir', tmp_path / 'new' / 'folder')
  checks.check_local_folder('out_dir', tmp_path)  # one that exists
  with pytest.raises(checks.InputError, match="'gs://b/x' is not a local "):
    checks.check_local_folder('out_dir', 'gs://b/x')
  (tmp_path / 'f').write_text('')
  with pytest.raises(checks.InputError, match=(
      f"out_dir '{tmp_path}/f/x/y' cannot be a folder: {tmp_path}/f is a "
      'file')):
    checks.check_local_folder('out_dir', f'{tmp_path}/f/x/y')
  # A folder this process may not write (as root every folder is writable:
  # the permission is what os.access says).
  monkeypatch.setattr(os, 'access', lambda path, mode: (
      os.fspath(path) != os.fspath(tmp_path)))
  with pytest.raises(checks.InputError, match=(
      f"out_dir '{tmp_path}/new' cannot be written: {tmp_path} is not "
      'writable here')):
    checks.check_local_folder('out_dir', tmp_path / 'new')
  checks.check_local_folder('out_dir', tmp_path.parent / 'other')


def test_a_url_but_gs_is_refused_where_a_path_is_read_or_written(
    tmp_path, monkeypatch):
  """Paths are local or gs:// (`checkpoints.is_gcs`, where every read and
  write chooses its storage): another URL is refused by name, not looked
  up as a local 's3:' folder ("checkpoint not found") or written to one."""
  from specdec_jax import arrays  # pylint: disable=g-import-not-at-top
  from specdec_jax import loading  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  url = "'s3://b/x' is neither a local path nor a gs:// address"
  with pytest.raises(checks.InputError, match='target checkpoint ' + url):
    loading.load_model(TINY_V11, 's3://b/x', what='target')
  with pytest.raises(checks.InputError, match='output_cache ' + url):
    loading.DrafterSpec(kind='cache', output_cache='s3://b/x')
  with pytest.raises(checks.InputError, match=url):
    arrays.load('s3://b/x', 'test')
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize('call, message', [
    (lambda: decoding.SamplingConfig(topk=True), 'topk must be an int >= 0'),
    (lambda: decoding.SamplingConfig(temperature=True), 'temperature must'),
    (lambda: decoding.SamplingConfig(1.0, topp=True), 'topp must'),
    (lambda: speculative.check_gamma(np.int64(0)), 'gamma must be an int'),
    (lambda: diagnostics.diagnose(None, None, None, None, None,
                                  rows_per_call=True),
     'rows_per_call must be an int >= 1, got True'),
])
def test_the_entry_points_use_the_shared_check(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_a_sharded_model_meets_the_contract_statically():
  """From Python 3.12 `isinstance` of a runtime-checkable Protocol
  (`decoding.check_is`) reads members statically, past `__getattr__`:
  every `DecodingModel` member must be on `ShardedModel` itself, or every
  decode on a mesh is refused there."""
  import inspect  # pylint: disable=g-import-not-at-top
  from specdec_jax import interfaces  # pylint: disable=g-import-not-at-top
  from specdec_jax import partitioning  # pylint: disable=g-import-not-at-top
  for name in [n for n in vars(interfaces.DecodingModel)
               if not n.startswith('_')]:
    inspect.getattr_static(partitioning.ShardedModel, name)


def test_raw_keys_of_every_prng_implementation_are_keys():
  """A raw key is uint32 [2] (threefry) or [4] (rbg, unsafe_rbg), as jax's
  PRNG implementation makes them; one of another width is refused here,
  not in jax's PRNG inside the trace."""
  sampled = decoding.SamplingConfig(1.0)
  for impl, width in (('threefry2x32', 2), ('rbg', 4), ('unsafe_rbg', 4)):
    with jax.default_prng_impl(impl):
      key = jnp.zeros((width,), jnp.uint32)
      assert decoding.default_rng(key, sampled) is key
      for other in (width + 1, 6 - width):
        with pytest.raises(ValueError, match='rng must be one PRNG key'):
          decoding.default_rng(jnp.zeros((other,), jnp.uint32), sampled)


def test_numpy_and_jax_scalars_are_numbers_to_sampling():
  """A temperature read from an array is a float like any other (the
  config stays hashable and equal to the float's)."""
  for t in (np.float32(0.5), jnp.float32(0.5), np.float64(0.5)):
    config = decoding.SamplingConfig(t, topp=np.float32(0.75))
    assert config == decoding.SamplingConfig(0.5, topp=0.75)
    assert type(config.temperature) is float and hash(config)
  # ... and a run's settings are JSON's types whatever was given.
  config = decoding.SamplingConfig(1, np.int64(3))
  assert config.settings() == {'temperature': 1.0, 'topk': 3, 'topp': 1.0}
  assert [type(v) for v in config.settings().values()] == [float, int, float]


def test_the_sampling_fields_have_one_home():
  """Every field of `SamplingConfig` is in a setup's flat view, a run's
  settings, what a measurement of its examples depends on and the
  summary's sentence (a new rule: its field, check and words there)."""
  assert sampling.FIELDS == ('temperature', 'topk', 'topp')
  config = sampling.SamplingConfig(0.7, topp=0.9)
  setup = dataclasses.replace(eval_lib.configured([
      '--gin_file=shipped/en_de.gin', '--dry_run',
      "--gin.EVAL_OUTPUT_DIR='unused'"])[1], sampling=config)
  assert {f: setup.flat()[f] for f in sampling.FIELDS} == config.settings()
  assert setup.settings().items() >= config.settings().items()
  # A measurement of decoded examples is taken again for another sampling.
  key = lambda c: sweep._measurement_key(  # pylint: disable=protected-access
      'm', dataclasses.replace(setup, sampling=c),
      {'m': (None, sweep.EXAMPLE_FIELDS)})
  assert len({key(c) for c in (config, sampling.SamplingConfig(0.7),
                               sampling.SamplingConfig(0.7, topk=5))}) == 3
  assert [c.describe() for c in (sampling.SamplingConfig(), config,
                                 sampling.SamplingConfig(1.0, topk=40))] == [
      'greedy', 'temperature 0.7, top-p 0.9', 'temperature 1, top-k 40']
  said = summary.markdown(summary.summarize([], setup.settings()), {}, {})
  assert '; temperature 0.7, top-p 0.9; batch' in said, said
  # A run of an earlier rule (top-k with greedy, refused now) is still
  # described as it ran.
  said = summary.markdown(summary.summarize([], dict(
      setup.settings(), temperature=0.0, topk=5, topp=1.0)), {}, {})
  assert '; greedy, top-k 5; batch' in said, said


def test_a_confidence_for_a_kind_that_ignores_it_is_refused():
  """DRAFT_CONFIDENCE changes only the kinds that draft adaptive lengths;
  set for any other kind it would change nothing: a named error."""
  from specdec_jax import loading  # pylint: disable=g-import-not-at-top
  readers = sorted(k for k, v in drafters.KINDS.items() if v.reads_confidence)
  assert readers == ['cache', 'lookup', 't5']
  spec = loading.DrafterSpec(config=TINY_V11, confidence=0.4)
  assert spec.confidence == 0.4 and spec.source(
      vocab_size=6, output_length=8).confidence == 0.4
  for kind in ('combined', 'bigram', 'pass'):
    with pytest.raises(ValueError, match=(
        f"draft_confidence is set but drafter '{kind}' drafts no adaptive "
        r"lengths \(kinds that do: \['cache', 'lookup', 't5'\]\)")):
      spec.replace(kind=kind)


# speculative.verify, called directly (the notebook does) and in every loop
# that verifies drafts: a batch of one, gamma 1, a 5-token vocabulary.
P = jnp.full((1, 2, 5), 0.2)  # [batch, gamma + 1, vocab]
Q = jnp.full((1, 1, 5), 0.2)  # [batch, gamma, vocab]
DRAFTS = jnp.array([[2]])
SAMPLED = sampling.SamplingConfig(1.0)
KEY = jax.random.key(0)
VERIFY = {
    'p_of_gamma_positions': (  # the bonus token came back 0, silently
        (KEY, DRAFTS, Q, P[:, :1], SAMPLED),
        r'p must be \[batch, gamma \+ 1, vocab\] = \(1, 2, 5\) \(drafts '
        r'\[batch, gamma\] = \(1, 1\), vocab 5: .*got shape \(1, 1, 5\)\.'),
    'drafts_of_another_batch': (  # shapes of 2 rows from 1 row's p and q
        (KEY, jnp.array([[2], [3]]), Q, P, SAMPLED),
        r'q must be \[batch, gamma, vocab\] = \(2, 1, 5\) .*got shape '
        r'\(1, 1, 5\)'),
    'draft_past_vocab': (  # rejected, silently
        (KEY, jnp.array([[7]]), Q, P, SAMPLED),
        r'drafts must be token ids in \[0, vocab_size=5\); got ids from 7'),
    'q_of_another_vocab': ((KEY, DRAFTS, Q[..., :4], P, SAMPLED),
                           r'q must be .* got shape \(1, 1, 4\)'),
    'p_without_batch': ((KEY, DRAFTS, Q[0], P[0], SAMPLED),
                        r'p must be \[batch, gamma \+ 1, vocab\] '
                        r'probabilities, got shape \(2, 5\)'),
    'rng_none_when_sampling': ((None, DRAFTS, Q, P, SAMPLED),
                               'rng is required when temperature > 0'),
    'rng_an_int': ((0, DRAFTS, Q, P, SAMPLED),
                   r'rng must be one PRNG key.* got 0\.'),
    'sampling_a_dict': ((KEY, DRAFTS, Q, P, {'temperature': 1.0}),
                        'sampling must be a SamplingConfig, got a dict'),
}


@pytest.mark.parametrize('args, message', VERIFY.values(), ids=list(VERIFY))
def test_verify_refuses_arguments_that_do_not_fit(args, message):
  """`verify` of mismatched shapes returned a wrong answer (a bonus token
  0, 2 rows from 1) or failed deep in jnp; now each is named. Its checks
  are static but for the drafts' values, checked only when concrete."""
  with pytest.raises(checks.InputError, match=message):
    speculative.verify(*args)


def test_verify_checks_cost_no_values_under_jit():
  """Float drafts are refused as token ids are; under jit (every loop's
  verify) the drafts are tracers: no value check, the shapes still are."""
  with pytest.raises(TypeError, match='drafts must be integer token ids'):
    speculative.verify(KEY, DRAFTS.astype(jnp.float32), Q, P, SAMPLED)
  n, _, token, _ = speculative.verify(None, DRAFTS, Q, P,
                                      sampling.SamplingConfig())
  assert int(n[0]) == 1 and int(token[0]) == 0  # greedy: no rng needed
  traced = jax.eval_shape(
      lambda d: speculative.verify(KEY, d, Q, P, SAMPLED), DRAFTS)
  assert traced[0].shape == (1,)
  with pytest.raises(checks.InputError, match='p must be'):
    jax.eval_shape(lambda p: speculative.verify(KEY, DRAFTS, Q, p, SAMPLED),
                   P[:, :1])


@pytest.fixture(scope='module')
def small_t5():
  """T5_SMALL with numpy weights (no compile) and two rows of inputs."""
  return network.T5Model(T5_SMALL), numpy_params(T5_SMALL, 0, 1.0)


ENC = ids([3, 4, 5, 2, 1], [6, 7, 1, 0, 0])
DEC = ids([0, 3], [0, 4])
# (method, its arguments after the params (None: a cache of 4 slots),
# error, message): each used to decode NaN silently or fail deep in flax.
T5_CALLS = {
    'encoder_id_past_vocab': (
        'logits', (ENC + 30, DEC), checks.InputError,
        r'encoder_input_tokens must be token ids in \[0, vocab_size=32\); '
        r'got ids from 30 to 37'),
    'decoder_id_past_vocab': ('logits', (ENC, DEC + 40), checks.InputError,
                              r'decoder_input_tokens must be token ids'),
    'target_id_past_vocab': ('logits', (ENC, DEC, DEC + 40), checks.InputError,
                             r'decoder_target_tokens must be token ids'),
    'targets_of_another_shape': (
        'logits', (ENC, DEC, DEC[:, :1]), checks.InputError,
        r'decoder_target_tokens must have the shape of decoder_input_tokens '
        r'\(2, 2\) .*got \(2, 1\)'),
    'encode_id_past_vocab': ('encode', (ENC + 30,), checks.InputError,
                             'encoder_input_tokens must be token ids'),
    'extend_id_past_vocab': ('extend', (DEC + 40, None), checks.InputError,
                             r'^tokens must be token ids in \[0, vocab_'),
    'float_ids': ('logits', (ENC.astype(np.float32), DEC), TypeError,
                  'encoder_input_tokens must be integer token ids'),
    'decoder_of_another_batch': (
        'logits', (ENC, DEC[:1]), checks.InputError,
        'decoder_input_tokens has 1 rows, encoder_input_tokens 2'),
    'decoder_ids_1d': ('logits_and_hidden', (ENC, DEC[0]), checks.InputError,
                       r'decoder_input_tokens must be \[batch, length\] '
                       r'.*got shape \(2,\)'),
    'cache_of_no_slots': ('init_cache', (ENC, 0), checks.InputError,
                          'max_length must be an int >= 1, got 0'),
    'cache_of_1d_inputs': ('init_cache', (ENC[0], 4), checks.InputError,
                           r'encoder_input_tokens must be \[batch, length\]'),
    'extend_past_the_cache': (
        'extend', (np.ones((2, 5), np.int32), None), checks.InputError,
        r"tokens has 5 tokens per row, more than the cache holds \(max_length"
        r"=4, init_cache's\)"),
    'extend_another_batch': (
        'extend', (np.ones((3, 1), np.int32), None), checks.InputError,
        'tokens has 3 rows, the cache 2'),
    'extend_1d_tokens': (
        'extend', (np.ones(2, np.int32), None), checks.InputError,
        r'tokens must be \[batch, length\]'),
    'extend_no_cache': ('extend', (DEC, {'position': 0}), checks.InputError,
                        'cache must be a network.DecoderCache'),
}


@pytest.mark.parametrize('method, args, error, message', T5_CALLS.values(),
                         ids=list(T5_CALLS))
def test_t5_methods_refuse_ids_and_caches_that_do_not_fit(
    small_t5, method, args, error, message):
  """The model's methods are public (the notebook, scoring, tests call
  them): an id past the vocabulary gave NaN logits, silently; a cache too
  short or of another batch failed in XLA. Each is now named (a dtype a
  TypeError), before flax runs."""
  model, params = small_t5
  if any(a is None for a in args):
    args = tuple(model.init_cache(params, ENC, 4) if a is None else a
                 for a in args)
  with pytest.raises(error, match=message):
    getattr(model, method)(params, *args)


def test_t5_methods_refuse_params_keys_and_configs_by_name(small_t5):
  """Params of another size failed in flax (ScopeParamShapeError), an int
  for a key in flax's InvalidRngError, a dict for the config with an
  AttributeError; a dropout rate of 2 or a flag 'no' was taken. Traced
  ids (a loop's) are not value-checked: no tracer conversion error."""
  model, params = small_t5
  other = numpy_params(T5_SMALL.replace(mlp_dim=48), 0, 1.0)
  with pytest.raises(checks.InputError, match=(
      r"params: 6 parameters differ .*mlp_dim 48, .* the config's "
      r'.*mlp_dim 32')):
    model.logits(other, ENC, DEC)
  with pytest.raises(checks.InputError, match='^params: 6 parameters'):
    model.encode(other, ENC)
  with pytest.raises(checks.InputError, match='^params: 6 parameters'):
    model.init_cache(other, ENC, 4)  # a decode's start: a flax error
  with pytest.raises(checks.InputError, match=(
      r'rng must be one PRNG key, jax\.random\.key\(seed\) .*got 0\.')):
    model.init_params(0)
  for config, said in ((None, 'None'), (params, 'a dict')):
    with pytest.raises(checks.InputError, match=(
        r'config must be a network\.T5Config \(e\.g\. .*\), got '
        f'{said}\\.$')):
      network.T5Model(config)
  for value in (2.0, -0.1, float('nan'), '0.1', True):
    with pytest.raises(checks.InputError, match=(
        r'T5Config\.dropout_rate must be a number in \[0, 1\), got ')):
      network.T5Model(T5_SMALL.replace(dropout_rate=value))
  for name in ('logits_via_embedding', 'float32_attention_logits',
               'fused_projections'):
    with pytest.raises(checks.InputError, match=(
        f"T5Config.{name} must be True or False, got 'no'.")):
      network.T5Model(T5_SMALL.replace(**{name: 'no'}))
  network.T5Model(T5_SMALL.replace(dropout_rate=0, fused_projections=True))
  out = jax.eval_shape(lambda d: model.logits(params, ENC, d), DEC)
  assert out.shape == (2, 2, VOCAB)
  assert np.isfinite(model.logits(params, ENC, DEC)).all()
