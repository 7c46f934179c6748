"""The lookup (prompt-lookup) drafter: what it copies, and that it pays.

The registry suite (tests/drafters/test_drafters.py) checks the kind's exactness; here
the drafts themselves are checked against hand-computed ones, and a target
that copies its input shows lookup accepting more tokens per iteration than
a fixed-token (unigram) drafter.

Run alone: `python -m pytest -q tests/drafters/test_lookup.py`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from specdec_jax import drafters
from specdec_jax import speculative
from specdec_jax.sampling import SamplingConfig

VOCAB = 128
EOS = 1
GAMMA = 3
JUNK = 99  # stale buffer values after each row's committed tokens


@functools.partial(jax.jit, static_argnums=(0, 1))
def _propose(drafter, sampling, source, sequences, lengths):
  state = drafter.init((), source, sequences.shape[1] + GAMMA)
  state = drafter.prefill((), state, sequences, lengths)
  drafts, q, _ = drafter.propose((), state, sequences, lengths, GAMMA,
                                 sampling, jax.random.key(0))
  return drafts, q


def propose(drafter, rows, sampling=SamplingConfig()):
  """rows: (source, committed decoder tokens with BOS) -> drafts, q."""
  width_s = max(len(s) for s, _ in rows)
  width = max(len(p) for _, p in rows) + 2
  source = np.zeros((len(rows), width_s), np.int32)
  sequences = np.full((len(rows), width), JUNK, np.int32)
  for b, (s, p) in enumerate(rows):
    source[b, :len(s)] = s
    sequences[b, :len(p)] = p
  lengths = np.array([len(p) for _, p in rows], np.int32)
  drafts, q = _propose(drafter, sampling, jnp.asarray(source),
                       jnp.asarray(sequences), jnp.asarray(lengths))
  return np.asarray(drafts), np.asarray(q)


# (source, committed prefix with BOS 0) -> the drafts, worked out by hand.
CASES = {
    # "6 7" is in the source: copy 8, then "6 7 8" -> 9; "7 8 9" is followed
    # by EOS in the source, which is never copied; nothing else matches:
    # fallback EOS.
    'copies_source': ([5, 6, 7, 8, 9, EOS, 0, 0], [0, 6, 7], [8, 9, EOS]),
    # "3 4 5" is followed by 20 in the source; the shorter "4 5" (-> 30) and
    # "5" (-> 40 in the source, -> 41 in the prefix) matches are more recent,
    # but the longest n wins.
    'longest_wins': ([3, 4, 5, 20, 4, 5, 30, 5, 40, EOS],
                     [0, 5, 41, 3, 4, 5], [20, 4, 5]),
    # Nothing in the source: "7 8" occurred earlier in the prefix (-> 9),
    # then "7 8 9" (-> 7), then "8 9 7" (-> 8).
    'copies_own_prefix': ([50, 51, EOS], [0, 7, 8, 9, 7, 8], [9, 7, 8]),
    # No match anywhere: the fallback, EOS, every time.
    'no_match': ([50, 51, EOS], [0, 60, 61], [EOS, EOS, EOS]),
    # BOS alone: no pattern (a pattern never includes BOS): EOS.
    'bos_only': ([50, 51, EOS], [0], [EOS, EOS, EOS]),
}


def test_drafts_are_the_hand_computed_ones_batched():
  """All cases in one batch (rows independent, stale values ignored)."""
  drafter = drafters.LookupDrafter(VOCAB)
  rows = [(s, p) for s, p, _ in CASES.values()]
  drafts, q = propose(drafter, rows)
  want = np.array([d for _, _, d in CASES.values()])
  np.testing.assert_array_equal(drafts, want)
  np.testing.assert_array_equal(q, np.eye(VOCAB)[want])  # one-hot q
  # Sampling modes draw the same (deterministic) drafts with the same q.
  for sampling in (SamplingConfig(temperature=1.0),
                   SamplingConfig(temperature=0.5, topk=5),
                   SamplingConfig(temperature=2.0, topp=0.9)):
    drafts_s, q_s = propose(drafter, rows, sampling)
    np.testing.assert_array_equal(drafts_s, want)
    np.testing.assert_array_equal(q_s, q)


@pytest.mark.parametrize('name', sorted(CASES))
def test_each_case_alone(name):
  source, prefix, want = CASES[name]
  drafts, _ = propose(drafters.LookupDrafter(VOCAB), [(source, prefix)])
  np.testing.assert_array_equal(drafts[0], want)


def test_most_recent_match_among_equal_lengths():
  """With n = 1 only, the latest "5" wins: in the prefix (-> 41) over the
  source's; and among source matches, the later one (-> 40 over 20)."""
  one = drafters.LookupDrafter(VOCAB, n_max=1, n_min=1)
  source = [3, 4, 5, 20, 4, 5, 30, 5, 40, EOS]
  drafts, _ = propose(one, [(source, [0, 5, 41, 3, 4, 5]),
                            (source, [0, 9, 5])])
  # Row 0: "5" -> 41 (prefix), "41" -> 3 (prefix), "3" -> 4 (prefix).
  # Row 1: "5" -> 40 (latest in the source), "40" -> EOS never copied,
  # nothing else: fallback.
  np.testing.assert_array_equal(drafts, [[41, 3, 4], [40, EOS, EOS]])


def test_score_is_one_hot_on_what_propose_drafts():
  drafter = drafters.LookupDrafter(VOCAB)
  source, prefix, want = CASES['copies_source']
  decoder = jnp.asarray([prefix + want])
  logits = jax.jit(drafter.score)((), jnp.asarray([source]), decoder)
  picked = np.argmax(np.asarray(logits)[0], axis=-1)
  # Positions 2, 3, 4 predict the three drafts.
  np.testing.assert_array_equal(picked[2:5], want)
  assert np.isneginf(np.sort(np.asarray(logits), -1)[..., :-1]).all()


def test_fields_and_params_are_checked():
  with pytest.raises(ValueError, match='n_min'):
    drafters.LookupDrafter(VOCAB, n_max=1, n_min=2)
  with pytest.raises(ValueError, match='eos_id'):
    drafters.LookupDrafter(4, eos_id=4)
  drafter = drafters.LookupDrafter(VOCAB)
  drafter.check_params(())
  drafter.check_params(None)
  with pytest.raises(ValueError, match='draft_params'):
    drafter.check_params({'log_unigram': jnp.zeros(VOCAB)})
  assert hash(drafter) == hash(drafters.LookupDrafter(VOCAB))


# ---------------------------------------------------------------------------
# A target that copies: greedy output = the source (its EOS included).
# ---------------------------------------------------------------------------


@struct.dataclass
class CopyCache:
  source: jax.Array
  position: jax.Array

  def rewind(self, position):
    return self.replace(position=position)


@struct.dataclass
class CopyModel:
  """After decoder position p the next token is source[p] (EOS past it)."""

  vocab_size: int = struct.field(pytree_node=False, default=VOCAB)

  def check_params(self, params):
    del params  # a stub's params are whatever its test gives

  def init_cache(self, params, encoder_input_tokens, max_length):
    del params, max_length
    batch = encoder_input_tokens.shape[0]
    return CopyCache(jnp.asarray(encoder_input_tokens, jnp.int32),
                     jnp.zeros((batch,), jnp.int32))

  def extend(self, params, tokens, cache):
    del params
    k = tokens.shape[1]
    pos = cache.position[:, None] + jnp.arange(k)
    length = cache.source.shape[1]
    nxt = jnp.take_along_axis(cache.source, jnp.minimum(pos, length - 1), 1)
    nxt = jnp.where((pos < length) & (nxt != 0), nxt, EOS)
    logits = 5.0 * jax.nn.one_hot(nxt, self.vocab_size)
    return logits, cache.rewind(cache.position + k)

  def logits(self, *args):
    raise NotImplementedError('a decoding stub: no teacher-forced pass')


def test_lookup_beats_a_fixed_token_drafter_on_a_copy_task():
  rng = np.random.default_rng(0)
  n_rows, n_src, max_len = 4, 12, 16
  source = np.zeros((n_rows, n_src + 2), np.int32)
  for b in range(n_rows):
    n = n_src - 2 * b  # rows of different lengths
    source[b, :n] = rng.permutation(np.arange(2, VOCAB))[:n]
    source[b, n] = EOS
  target = CopyModel()
  unigram = drafters.NgramDrafter(VOCAB, order=1)
  uni_params = drafters.ngram_params([[7, 7, EOS]], VOCAB, order=1)
  tokens_per_iteration = {}
  for name, drafter, params in (
      ('lookup', drafters.LookupDrafter(VOCAB), ()),
      ('unigram', unigram, uni_params)):
    out = speculative.speculative_sample(
        target, (), drafter, params, source, gamma=4,
        max_decode_len=max_len, eos_id=EOS)
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    for b in range(n_rows):  # exact: the copy, EOS kept
      n = n_src - 2 * b
      assert lengths[b] == n + 1
      np.testing.assert_array_equal(tokens[b, :n + 1], source[b, :n + 1])
    stats = out.stats
    tokens_per_iteration[name] = (lengths.sum()
                                  / np.asarray(stats.row_iterations).sum())
    if name == 'lookup':
      # First iteration: BOS only, EOS drafts rejected; from then on every
      # draft is the next source token (distinct tokens: one match each).
      assert (np.asarray(stats.row_iterations)
              == 1 + np.ceil((lengths - 1) / 5)).all()
  assert tokens_per_iteration['lookup'] > 2 * tokens_per_iteration['unigram']
  assert tokens_per_iteration['unigram'] == pytest.approx(1.0)


def test_combined_skips_its_model_where_every_row_copies(v11):
  """A target that copies its input (`CopyModel`): the combined
  drafter's output is the exact copy, and its model (a T5 that counts its
  calls) runs only in iterations where some row has nothing to copy: the
  first (BOS alone) and those at a row's end, not the copying ones."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from specdec_jax import network  # pylint: disable=g-import-not-at-top

  calls = []

  @dataclasses.dataclass(frozen=True)
  class Counting(network.T5Model):

    def extend(self, params, tokens, cache):
      jax.debug.callback(lambda: calls.append(1))
      return super().extend(params, tokens, cache)

  model, params = v11
  vocab, eos = VOCAB, EOS
  assert model.vocab_size == vocab
  rng = np.random.default_rng(0)
  source = np.zeros((2, 20), np.int32)
  for b, n in enumerate((18, 14)):
    source[b, :n] = rng.permutation(np.arange(2, vocab))[:n]
    source[b, n] = eos
  drafter = drafters.CombinedDrafter(
      drafters.LookupDrafter(vocab, eos_id=eos),
      drafters.T5Drafter(Counting(model.config)))
  gamma = 4
  out = speculative.speculative_sample(
      CopyModel(), (), drafter, {'reference': (), 'model': params},
      source, gamma=gamma, max_decode_len=20, eos_id=eos)
  jax.effects_barrier()
  lengths = np.asarray(out.lengths)
  for b, n in enumerate((18, 14)):
    assert lengths[b] == n + 1
    np.testing.assert_array_equal(np.asarray(out.tokens)[b, :n + 1],
                                  source[b, :n + 1])
  iterations = int(out.stats.iterations)
  # A T5 drafter alone makes gamma calls per iteration; here the model runs
  # in at most 3 iterations (BOS, each row's end), one catch-up each.
  assert iterations >= 5
  assert 0 < len(calls) <= 3 * (gamma + 2) < gamma * iterations
