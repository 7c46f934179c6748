"""programs.py: the one builder of a setup's four decode programs.

The eval job's unit loop and the compile-only targets run and lower their
programs through `programs.Program`; these tests pin that each program is
the decoder it names, called with the spec's settings: the same tokens as
the decoder called directly on sampled rows (a wrong gamma, block, slot
count or rng would draw other tokens), and the same lowered program.
"""

import dataclasses
import pathlib

import jax
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import programs
from specdec_jax import speculative
from specdec_jax import streaming
from specdec_jax.sampling import SamplingConfig

from conftest import RAGGED_EOS
from test_speculative import perturbed

MAX_LEN = 12
EOS = RAGGED_EOS
GAMMA = 3
SLOTS = 2
SAMPLING = SamplingConfig(temperature=1.0)
COMMON = dict(max_decode_len=MAX_LEN, sampling=SAMPLING, eos_id=EOS)


@pytest.fixture(scope='module')
def setup(v11, ragged_greedy):
  """(target, params, drafter, draft params, inputs [4, 12], rng)."""
  model, params = v11
  enc, _ = ragged_greedy
  return (model, params, drafters.T5Drafter(model), perturbed(params, 0.3, 0),
          enc, jax.random.key(7))


def _spec(kind, mode, **fields):
  stream = dict(batch_size=SLOTS, refill_sizes=(1,)) if mode == 'stream' else {}
  return programs.ProgramSpec(kind, mode, **COMMON, **stream, **fields)


def _assert_same(out, ref):
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)


def test_fixed_programs_are_the_fixed_decoders(setup):
  model, params, dr, dparams, enc, rng = setup
  base = programs.Program(_spec('baseline', 'fixed'), model)
  spec = programs.Program(_spec('speculative', 'fixed', gamma=GAMMA), model,
                          dr)
  _assert_same(base(params, enc, rng), decoding.temperature_sample(
      model, params, enc, rng=rng, **COMMON))
  ref = speculative.speculative_sample(model, params, dr, dparams, enc,
                                       gamma=GAMMA, rng=rng, **COMMON)
  out = spec(params, dparams, enc, rng)
  _assert_same(out, ref)
  np.testing.assert_array_equal(out.stats.drafted, ref.stats.drafted)


def test_stream_programs_are_the_stream_decoders(setup):
  model, params, dr, dparams, enc, rng = setup
  stream = dict(batch_size=SLOTS, refill_sizes=(1,), rng=rng, **COMMON)
  base = programs.Program(_spec('baseline', 'stream'), model)
  assert base.__name__ == 'sample_stream'  # a jitted program's module name
  _assert_same(base(params, enc, rng), streaming.sample_stream(
      model, params, enc, **stream))
  spec = programs.Program(_spec('speculative', 'stream', gamma=GAMMA), model,
                          dr)
  _assert_same(spec(params, dparams, enc, rng), streaming.speculative_stream(
      model, params, dr, dparams, enc, gamma=GAMMA, **stream))


def test_lowered_program_is_the_decoders(setup):
  """`lower` hands the decoder the spec's settings (gamma, slots, refill,
  block)."""
  model, params, dr, dparams, enc, rng = setup
  spec = _spec('speculative', 'stream', gamma=GAMMA)
  text = programs.Program(spec, model, dr).lower(params, dparams, enc,
                                                 rng).as_text()
  assert text == streaming.speculative_stream.lower(
      model, params, dr, dparams, enc, gamma=GAMMA, batch_size=SLOTS,
      refill_sizes=(1,), rng=rng, **COMMON).as_text()
  other = dataclasses.replace(spec, gamma=GAMMA + 1)
  assert programs.Program(other, model, dr).lower(
      params, dparams, enc, rng).as_text() != text
  # A same-shape baseline (`EvalSetup.same_shape_baseline`): its blocks of
  # gamma + 1 tokens draw the tokens of blocks of 1, so only its program
  # shows the block.
  block = _spec('baseline', 'fixed', block_size=GAMMA + 1)
  assert programs.Program(block, model).lower(params, enc, rng).as_text() == (
      decoding.temperature_sample.lower(model, params, enc, rng=rng,
                                        block_size=GAMMA + 1,
                                        **COMMON).as_text())


def test_no_speculation_is_the_baseline_both_ways(setup):
  """gamma 0 (the unit loop's choice of no speculation): both calls are the
  baseline, the speculative one as a decode that drafted nothing."""
  model, params, _, dparams, enc, rng = setup
  base = programs.Program(_spec('baseline', 'fixed'), model)
  calls = programs.calls(base, None, params, dparams, enc, rng)
  ref, out = calls['baseline'](), calls['speculative']()
  _assert_same(out, ref)
  assert not np.asarray(out.stats.drafted).any()
  np.testing.assert_array_equal(out.stats.row_iterations, ref.lengths)


def test_a_spec_is_checked():
  with pytest.raises(ValueError, match='kind must be one of'):
    programs.ProgramSpec('beam', 'fixed', max_decode_len=MAX_LEN)
  with pytest.raises(ValueError, match='mode must be one of'):
    programs.ProgramSpec('baseline', 'ragged', max_decode_len=MAX_LEN)
  with pytest.raises(ValueError, match='gamma >= 1'):
    programs.ProgramSpec('speculative', 'fixed', max_decode_len=MAX_LEN)


def test_a_program_names_its_arguments(setup):
  model, params, dr, _, enc, rng = setup
  spec = programs.Program(_spec('speculative', 'fixed', gamma=GAMMA), model,
                          dr)
  with pytest.raises(TypeError, match='params, draft_params, inputs, rng'):
    spec(params, enc, rng)


def test_a_crowded_process_releases_its_programs():
  """Past its share of the memory mappings the OS allows a process, the
  programs jax keeps compiled are dropped (a process past the limit
  segfaults in XLA's next compile); below it they are kept, and off Linux
  (nothing to count) always. Last in the file: the release drops the
  module's programs too."""
  on_linux = pathlib.Path('/proc/self/maps').exists()
  add = jax.jit(lambda x: x + 1)
  add(np.int32(1))
  assert not programs.release_if_crowded(share=1.0)
  assert add._cache_size() == 1  # pylint: disable=protected-access
  assert programs.release_if_crowded(share=0.0) == on_linux
  kept = add._cache_size()  # pylint: disable=protected-access
  assert kept == (0 if on_linux else 1)
