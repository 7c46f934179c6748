"""Continuous batching (streaming.py): exact outputs, refill, fewer iterations."""

import dataclasses

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import speculative
from specdec_jax import streaming
from specdec_jax import spec_stats
from specdec_jax.drafters import ngram

from test_speculative import (N_SAMPLES, SAMPLING_CASES, SEQ_LEN, SMALL_EOS,
                              adversarial_unigram, assert_matches,
                              exact_sequence_distribution, perturbed,
                              sample_optimized,
                              tiny_target)  # pylint: disable=unused-import

MAX_LEN = 24
EOS = 62  # with these inputs the tiny target's rows end after 1..24 tokens
SLOTS = 4  # 14 examples: not a multiple of the slot batch
GAMMA = 3


@pytest.fixture(scope='module')
def stream_setup(v11):
  model, params = v11
  rng = np.random.default_rng(0)
  enc = rng.integers(2, model.vocab_size, (11, 12))
  for row in enc:
    row[rng.integers(2, 13):] = 0
  # Copies end in the same iteration: slots 0-1 (example 0: 1 token) and
  # 2-3 (example 2: 3 tokens) free up two at a time, so refills assign
  # several new examples at once. 14 examples, 4 slots.
  enc = enc[[0, 0, 2, 2] + list(range(1, 11))]
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=MAX_LEN, eos_id=EOS)
  return model, params, enc, base


def slot_schedule(costs, slots):
  """Loop iterations of a refilled slot batch, simulated in Python.

  Example i needs costs[i] iterations; it takes the first free slot (slot
  order) at the end of the iteration its predecessor in that slot ended.
  """
  busy = list(costs[:slots]) + [0] * max(0, slots - len(costs))
  queue = list(costs[slots:])
  t = 0
  while any(b > 0 for b in busy):
    t += 1
    busy = [b - 1 if b > 0 else 0 for b in busy]
    for s in range(slots):
      if busy[s] == 0 and queue:
        busy[s] = queue.pop(0)
  return t


def fixed_schedule(costs, slots):
  """Loop iterations of fixed batches: each waits for its slowest row."""
  return sum(max(costs[i:i + slots]) for i in range(0, len(costs), slots))


def test_setup_is_not_trivial(stream_setup):
  _, _, _, base = stream_setup
  lengths = np.asarray(base.lengths)
  assert len(set(lengths.tolist())) >= 5 and lengths.max() == MAX_LEN
  assert lengths.min() < MAX_LEN // 4


def test_sample_stream_greedy_equals_baseline(stream_setup):
  model, params, enc, base = stream_setup
  out = streaming.sample_stream(model, params, enc, batch_size=SLOTS,
                                max_decode_len=MAX_LEN, eos_id=EOS,
                                refill_sizes=(1,))  # sub-batches of 1 or 4
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  lengths = np.asarray(base.lengths).tolist()
  # One decoder call per token; a freed slot restarts in the next iteration.
  assert int(out.iterations) == slot_schedule(lengths, SLOTS)
  assert int(out.iterations) < fixed_schedule(lengths, SLOTS)


# Every kind streams with greedy outputs equal to the baseline in
# tests/drafters/test_drafters.py (2 slots, the default refill sub-batches); here the
# T5 drafter (the target plus noise: accepts some drafts, not all) on 4
# slots with refills of 1-2 rows in a sub-batch of 2, 3-4 in one of 4
# (padded), and the counters and schedules.
def test_speculative_stream_greedy_equals_baseline(stream_setup):
  model, params, enc, base = stream_setup
  dr, dparams = drafters.T5Drafter(model), perturbed(params, 0.3, 0)
  out = streaming.speculative_stream(
      model, params, dr, dparams, enc, batch_size=SLOTS, gamma=GAMMA,
      max_decode_len=MAX_LEN, eos_id=EOS, refill_sizes=(2,))
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  st = out.stats
  row_iters = np.asarray(st.row_iterations)
  # Per-example counters: every example ran, drafts gamma per iteration,
  # verified positions between 1 and gamma per iteration.
  assert row_iters.shape == (len(enc),) and row_iters.min() >= 1
  np.testing.assert_array_equal(st.drafted, GAMMA * row_iters)
  assert np.all(np.asarray(st.accepted) <= np.asarray(st.drafted))
  assert np.all(row_iters <= np.asarray(st.beta_count))
  assert np.all(np.asarray(st.beta_count) <= GAMMA * row_iters)
  # Tokens = accepted drafts + one per iteration (minus the cut at EOS/limit).
  assert np.all(np.asarray(out.lengths) <= np.asarray(st.accepted) + row_iters)
  assert int(np.asarray(st.accepted_at).sum()) == int(np.sum(st.accepted))
  costs = row_iters.tolist()
  assert int(st.iterations) == slot_schedule(costs, SLOTS)
  assert int(st.iterations) < fixed_schedule(costs, SLOTS)
  summary = spec_stats.summarize(st)
  assert 0.0 < summary['acceptance_rate'] < 1.0
  # The same counters as the fixed-batch loop, row for row (greedy).
  fixed = speculative.speculative_sample(
      model, params, dr, dparams, enc, gamma=GAMMA, max_decode_len=MAX_LEN,
      eos_id=EOS)
  for name in ('row_iterations', 'drafted', 'accepted', 'beta_count'):
    np.testing.assert_array_equal(getattr(st, name),
                                  getattr(fixed.stats, name), err_msg=name)
  np.testing.assert_allclose(st.beta_sum, fixed.stats.beta_sum, rtol=1e-5)
  np.testing.assert_array_equal(st.accepted_at, fixed.stats.accepted_at)


def test_tree_stream_greedy_equals_baseline(stream_setup):
  """A token tree's loop in refilled slots: each refilled row starts with
  no pending path move (`TreeLoop.init_target_cache`), and every row's
  accepted path moves in its next call's writes; greedy output equals
  the baseline's, with refills of 2 rows."""
  model, params, enc, base = stream_setup
  dr = drafters.TreeDrafter(drafters.T5Drafter(model),
                            drafters.tree.shape.parse('beam:2,2,3'))
  out = streaming.speculative_stream(
      model, params, dr, perturbed(params, 0.3, 0), enc, batch_size=SLOTS,
      gamma=3, max_decode_len=MAX_LEN, eos_id=EOS, refill_sizes=(2,))
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  assert int(np.sum(out.stats.accepted)) > 0  # paths were moved


@pytest.fixture(scope='module')
def t1_law(tiny_target):  # pylint: disable=redefined-outer-name
  """The tiny target, its input and its exact law of 3-token sequences at
  t = 1 (computed once: the slowest part of a chi-square test)."""
  model, params, enc = tiny_target
  config = SAMPLING_CASES['t1']
  return model, params, enc, config, exact_sequence_distribution(
      model, params, enc, config)


def test_sampled_stream_follows_target_distribution(t1_law):
  """N_SAMPLES copies of one input streamed through 64 slots (t = 1).

  The drafter has q = 0 on the tokens the target likes, so most tokens come
  from residuals; refilled slots must start from fresh caches and counters.
  Refills encode a full slot batch here (one switch branch: compiles
  faster); the sub-batch refills are checked by the greedy tests.
  """
  model, params, enc, config, dist = t1_law
  dr, dparams = adversarial_unigram([0, 1])
  inputs = jnp.tile(enc, (N_SAMPLES, 1))
  out = sample_optimized(
      streaming.speculative_stream,
      model, params, dr, dparams, inputs, batch_size=64, gamma=3,
      max_decode_len=SEQ_LEN, sampling=config, eos_id=SMALL_EOS,
      rng=jax.random.key(11), refill_sizes=(64,))
  assert_matches(np.asarray(out.tokens), dist)
  np.testing.assert_array_equal(
      out.lengths, decoding.output_lengths(out.tokens, SMALL_EOS))
  # Slots were refilled about N_SAMPLES / 64 times each.
  assert int(out.stats.iterations) < N_SAMPLES // 16


def test_sampled_baseline_stream_follows_target_distribution(t1_law):
  """The streamed baseline (the eval job's at batch > 1) samples the
  target's law: N_SAMPLES copies of one input through 2048 refilled slots at
  t = 1, chi-square (p > 1e-4) and total variation < 0.02 over whole
  3-token sequences (`assert_matches`). A refilled slot must restart from a
  fresh cache at position 0 and draw fresh randomness, or the law shifts.
  """
  model, params, enc, config, dist = t1_law
  out = sample_optimized(
      streaming.sample_stream,
      model, params, jnp.tile(enc, (N_SAMPLES, 1)), batch_size=2048,
      max_decode_len=SEQ_LEN, sampling=config, eos_id=SMALL_EOS,
      rng=jax.random.key(12), refill_sizes=(2048,))
  assert_matches(np.asarray(out.tokens), dist)
  np.testing.assert_array_equal(
      out.lengths, decoding.output_lengths(out.tokens, SMALL_EOS))
  # Slots were refilled: ~N_SAMPLES / 2048 examples each, <= 3 calls each.
  assert 3 < int(out.iterations) <= 3 * (N_SAMPLES // 2048 + 1)


def test_merge_rows_and_bad_arguments(v11):
  old = {'a': jnp.zeros((3, 2)), 'b': jnp.zeros((3,), jnp.int32)}
  new = {'a': jnp.ones((3, 2)), 'b': jnp.full((3,), 7, jnp.int32)}
  got = streaming.merge_rows(old, new, jnp.array([True, False, True]))
  np.testing.assert_array_equal(got['a'], [[1, 1], [0, 0], [1, 1]])
  np.testing.assert_array_equal(got['b'], [7, 0, 7])
  with pytest.raises(ValueError, match='leading axis'):
    streaming.merge_rows({'s': jnp.zeros(())}, {'s': jnp.ones(())},
                         jnp.array([True]))
  model, params = v11
  enc = np.ones((2, 4), np.int32)
  for bad in (0, 2.0, True):
    with pytest.raises(ValueError, match='batch_size'):
      streaming.sample_stream(model, params, enc, batch_size=bad,
                              max_decode_len=4)
  with pytest.raises(ValueError, match='refill_sizes'):
    streaming.sample_stream(model, params, enc, batch_size=2,
                            max_decode_len=4, refill_sizes=(0,))
  with pytest.raises(ValueError, match='refill_sizes must be a list of ints '
                     '>= 1, got 1'):  # not a TypeError from iterating 1
    streaming.bucket_sizes(8, 1)
  assert streaming.bucket_sizes(8) == (1, 2, 4, 8)
  assert streaming.bucket_sizes(5) == (1, 2, 4, 5)
  assert streaming.bucket_sizes(1) == (1,)
  assert streaming.bucket_sizes(8, (8, 3, 16)) == (3, 8)
  # A mesh splitting every batch in 2 (4): multiples of it, named if not.
  assert streaming.bucket_sizes(8, multiple=2) == (2, 4, 8)
  assert streaming.bucket_sizes(8, multiple=4) == (4, 8)
  assert streaming.bucket_sizes(2, multiple=2) == (2,)
  with pytest.raises(ValueError, match=r"refill_sizes \[1, 3\] do not divide "
                     r"into the 2 parts the target's mesh"):
    streaming.bucket_sizes(8, (1, 2, 3), multiple=2)
  with pytest.raises(ValueError, match='gamma'):
    streaming.speculative_stream(model, params, drafters.T5Drafter(model),
                                 params, enc, batch_size=2, gamma=0,
                                 max_decode_len=4)


@dataclasses.dataclass(frozen=True)
class _CountingDrafter(ngram.NgramDrafter):
  """A unigram drafter whose state has a leaf with no batch axis."""

  def init(self, params, encoder_input_tokens, max_length):
    del params, max_length
    return {'rows': jnp.zeros(encoder_input_tokens.shape[:1], jnp.int32),
            'calls': jnp.zeros((), jnp.int32)}


def test_a_state_leaf_without_batch_axis_is_named(v11):
  """A drafter state (or cache) leaf without the rows as its leading axis
  cannot be refilled: the stream says which leaf of which argument, when it
  compiles and before any row is indexed (not numpy's 'axis 0 is out of
  bounds' from deep in the refill)."""
  model, params = v11
  drafter = _CountingDrafter(model.vocab_size, order=1)
  draft_params = ngram.ngram_params([[3, 4, 5]], model.vocab_size, order=1)
  enc = np.ones((5, 4), np.int32)
  for call in (streaming.speculative_stream,
               streaming.speculative_stream.lower):
    with pytest.raises(ValueError) as e:
      call(model, params, drafter, draft_params, enc, batch_size=2, gamma=2,
           max_decode_len=4)
    message = str(e.value)
    assert "the drafter's state (`_CountingDrafter.init`" in message
    assert "leaf ['calls']: () for 2 rows" in message
    assert "'rows'" not in message  # the batched leaf is fine
    assert 'out of bounds' not in message

  class SharedCacheModel:
    """The target with a cache leaf shared by every row."""
    vocab_size = model.vocab_size

    def __getattr__(self, name):
      return getattr(model, name)

    def init_cache(self, p, tokens, length):
      return (model.init_cache(p, tokens, length), jnp.zeros((3,)))

  with pytest.raises(ValueError, match=r"model's cache .*leaf \[1\]: "
                     r'\(3,\) for 2 rows, \(3,\) for 4 rows'):
    streaming.sample_stream(SharedCacheModel(), params, enc, batch_size=2,
                            max_decode_len=4)
