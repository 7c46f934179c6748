"""Every registered drafter kind keeps speculative decoding exact.

The suite is parametrized over `drafters.KINDS`, so a kind added to that
list is tested here with no edit. Each kind is built as the
eval job builds it, from a `DraftSource` of a tiny random target: the draft
model is the target's weights plus noise (it agrees often, not always, so
both the acceptance and the rejection branches run), the train targets are
the target's own greedy outputs. Whatever a kind reads from the source, it
must give:

- greedy outputs equal to the baseline's, token for token (float32), in
  fixed batches and streamed (continuous batching, `streaming`);
- sampled outputs that follow the target's distribution (the chi-square test
  of tests/test_speculative.py over whole sequences);
- `propose`, after `prefill` to any prefix, drafting from the standardized
  distribution of its own `score` (what the acceptance test and
  `measure.alpha` rely on; a tree kind whose proposals are its chain
  kind's is checked as that kind, `SAME_PROPOSALS`);
- the `interfaces.Drafter` members, and refusals of a foreign vocabulary and
  of a bad gamma before anything is compiled.

Run alone: `python -m pytest -q tests/drafters/test_drafters.py` (about 30 s on 2
cores).
"""

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax.drafters import registry
from specdec_jax import interfaces
from specdec_jax import network
from specdec_jax import spec_stats
from specdec_jax import speculative
from specdec_jax import streaming
from specdec_jax.sampling import SamplingConfig
from specdec_jax.sampling import probabilities

from conftest import TINY_V11
from test_speculative import EOS
from test_speculative import MAX_LEN
from test_speculative import SAMPLING_CASES
from test_speculative import assert_sampled_law
from test_speculative import exact_sequence_distribution
from test_speculative import perturbed
from test_speculative import tiny_target  # pylint: disable=unused-import

KINDS = sorted(drafters.KINDS)
GAMMA = 3


def source_for(model, params, train_targets, train_inputs):
  """A DraftSource with everything a kind may read, for this target.

  The train pairs (an output cache's seed) pair each input row with the
  train target of the next row, so a retrieved output is right in part.
  """
  pairs = [(list(i), t) for i, t in zip(
      train_inputs, train_targets[1:] + train_targets[:1])]
  return drafters.DraftSource(
      vocab_size=model.vocab_size, draft_model=model,
      draft_params=perturbed(params, 0.3, 0),
      train_targets=lambda: train_targets, target_model=model,
      target_params=params, train_pairs=lambda: pairs, output_length=MAX_LEN,
      tree='beam:2,2,3')  # tree kinds: a small tree of depth >= GAMMA


@pytest.fixture(scope='module')
def greedy(v11):
  """Target (vocab 128), inputs of 4 lengths, its baseline, every kind."""
  model, params = v11
  enc = np.random.default_rng(3).integers(2, model.vocab_size, (4, 12))
  enc[1, 8:] = 0
  enc[2, 5:] = 0
  enc[3, 2:] = 0
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=MAX_LEN, eos_id=EOS)
  outputs = [row[:n].tolist() for row, n in zip(np.asarray(base.tokens),
                                                np.asarray(base.lengths))]
  source = source_for(model, params, outputs, enc)
  built = {name: drafters.get_kind(name).build(source) for name in KINDS}
  return model, params, enc, base, built, source


@pytest.fixture(scope='module')
def sampled(tiny_target):  # pylint: disable=redefined-outer-name
  """Target (vocab 6), its exact sequence law under top-k, every kind."""
  model, params, enc = tiny_target
  config = SAMPLING_CASES['topk3']
  dist = exact_sequence_distribution(model, params, enc, config)
  # A few sequences as "train targets": n-grams that often disagree with p.
  source = source_for(model, params, [[2, 3, 1], [4, 4, 5, 1], [3, 5, 2, 1]],
                      np.tile(enc, (3, 1)))
  built = {name: drafters.get_kind(name).build(source) for name in KINDS}
  return model, params, enc, config, dist, built


@pytest.mark.parametrize('kind', KINDS)
def test_greedy_equals_baseline(greedy, kind):
  """Greedy speculative decoding is the baseline, token for token."""
  model, params, enc, base, built, _ = greedy
  drafter, dparams = built[kind]
  out = speculative.speculative_sample(
      model, params, drafter, dparams, enc, gamma=GAMMA,
      max_decode_len=MAX_LEN, eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  # Both branches of the acceptance test ran, but for the untrained head of
  # 'heads', which agrees with nothing here (tests/drafters/test_heads.py
  # decodes a fitted one greedily, accepting and rejecting).
  rate = spec_stats.summarize(out.stats)['acceptance_rate']
  assert kind == 'heads' or 0 < rate < 1, rate


# Not streamed once more here: 't5' and 'tree', whose loops
# tests/test_streaming.py streams greedily with the same drafters (a T5 draft
# model, its beam:2,2,3 tree) through 4 slots refilled 2 at a time from 14
# examples (`test_speculative_stream_greedy_equals_baseline`,
# `test_tree_stream_greedy_equals_baseline`); nor 'unigram', an order-1
# `NgramDrafter`, streamed here as 'bigram', the same drafter with a context
# a refilled row must reset.
STREAMED_ELSEWHERE = ('t5', 'tree', 'unigram')


@pytest.mark.parametrize('kind',
                         [k for k in KINDS if k not in STREAMED_ELSEWHERE])
def test_streamed_greedy_equals_baseline(greedy, kind):
  """Continuous batching (2 slots refilled from 4 examples of different
  lengths) decodes every kind, in the loop it decodes with by default (a
  merged one for PaSS and heads), exactly as the fixed-batch baseline."""
  model, params, enc, base, built, _ = greedy
  drafter, dparams = built[kind]
  kw = dict(batch_size=2, gamma=GAMMA, max_decode_len=MAX_LEN, eos_id=EOS)
  loop, _ = streaming.speculative_stream.prepare(model, params, drafter,
                                                 dparams, enc, **kw)
  # A merged drafter runs its own loop (PaSS's, the heads', the tree's).
  assert isinstance(loop.loop, speculative.SpecLoop) != isinstance(
      drafter, interfaces.MergedDrafter)
  out = streaming.speculative_stream(model, params, drafter, dparams, enc,
                                     **kw)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  # Each example was decoded in >= 1 iteration of its own.
  assert np.asarray(out.stats.row_iterations).min() >= 1


# The token-tree kinds' sequence laws are tested in tests/drafters/test_trees.py
# (`test_sampled_tree_follows_target_distribution`: a tree drafter at static
# top-k, top-p and against an adversarial drafter, the heads' tree), each a
# 30,000-row tree decode; not once more here at top-k 3. Nor is 't5':
# tests/test_speculative.py samples the same chain loop with a T5 drafter at
# t = 0.7 and top-p, and the 'combined' kind here drafts with a T5 draft
# model at top-k 3. Nor is 'unigram' (an order-1 `NgramDrafter`):
# tests/test_speculative.py's [q_zero_where_p-topk3] and [q_off_p-topk3]
# decode that drafter in the same loop at top-k 3 and the same gamma, with
# adversarial unigrams that a wrong q fails harder. Nor is 'pass_tree':
# tests/drafters/test_lookahead.py's [tree-t0.7] samples that loop at
# t = 0.7. Nor is 'heads': tests/drafters/test_heads.py samples its merged
# loop at t = 0.7 and the ordinary loop at top-p (its drafts through the
# same `sampling.draw` as every kind here at top-k 3).
LAW_ELSEWHERE = ('tree', 'heads_tree', 't5', 'unigram', 'pass_tree',
                 'heads')


@pytest.mark.parametrize('kind', [k for k in KINDS if k not in LAW_ELSEWHERE])
def test_sampled_sequences_follow_target_distribution(sampled, kind):
  """N_SAMPLES speculative samples of whole sequences fit the target's law.

  Chi-square (p > 1e-4) and total variation < 0.02 against the exact
  distribution of 3-token sequences (`assert_matches`), at temperature 1,
  top-k 3.
  """
  model, params, enc, config, dist, built = sampled
  drafter, dparams = built[kind]
  assert_sampled_law((model, params, enc), config, drafter, dparams, kind,
                     GAMMA, dist)


@pytest.mark.parametrize('kind', KINDS)
def test_drafter_of_another_vocabulary_is_refused(greedy, sampled, kind):
  """A drafter built for a 6-token target may not draft for a 128-token one."""
  model, params, enc, _, _, _ = greedy
  drafter, dparams = sampled[-1][kind]
  assert drafter.vocab_size != model.vocab_size
  with pytest.raises(ValueError, match='vocabularies differ'):
    speculative.speculative_sample(model, params, drafter, dparams, enc,
                                   gamma=GAMMA, max_decode_len=MAX_LEN)


@pytest.fixture(scope='module')
def other_target(v11):
  """A target of the same vocabulary, twice as wide."""
  model, _ = v11
  other = type(model)(model.config.replace(emb_dim=2 * model.config.emb_dim))
  return other, other.init_params(jax.random.key(7))


@pytest.mark.parametrize('kind', [k for k in KINDS if drafters.KINDS[
    k].needs_target or drafters.KINDS[k].uses_cache])
def test_a_drafter_built_for_another_target_is_refused(greedy, other_target,
                                                       kind):
  """The kinds that read the target (ride on its call, embed with its
  encoder), built for another one of the same vocabulary: refused before
  anything is traced, where they used to fail deep inside jax or Flax."""
  model, params, enc, _, _, source = greedy
  other, other_params = other_target
  drafter, dparams = drafters.get_kind(kind).build(dataclasses.replace(
      source, target_model=other, target_params=other_params))
  with pytest.raises(checks.InputError, match=(
      r'(built for another target than its (merged|tree) loop rides on'
      r'|target_params, which the drafter reads, do not fit).*emb_dim')):
    speculative.speculative_sample(model, params, drafter, dparams, enc,
                                   gamma=2, max_decode_len=MAX_LEN)


@pytest.mark.parametrize('gamma', [0, 1.5, True])
@pytest.mark.parametrize('kind', KINDS)
def test_bad_gamma_is_refused(greedy, kind, gamma):
  model, params, enc, _, built, _ = greedy
  drafter, dparams = built[kind]
  with pytest.raises(ValueError, match='gamma must be an int >= 1'):
    speculative.speculative_sample(model, params, drafter, dparams, enc,
                                   gamma=gamma, max_decode_len=MAX_LEN)


@pytest.mark.parametrize('kind', KINDS)
def test_kind_builds_a_drafter(greedy, kind):
  """The protocol's members; equal when rebuilt (compiled once per config)."""
  model, _, _, _, built, source = greedy
  drafter, _ = built[kind]
  assert isinstance(drafter, interfaces.Drafter)
  # A kind that drafts from the output cache can be handed the grown store.
  assert isinstance(drafter, interfaces.StoreDrafter) == (
      drafters.get_kind(kind).uses_cache)
  assert drafter.vocab_size == model.vocab_size
  again, _ = drafters.get_kind(kind).build(source)
  assert again == drafter and hash(again) == hash(drafter)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _prefill_propose(drafter, sampling, params, enc, sequences, lengths, rng):
  state = drafter.init(params, enc, sequences.shape[1] + GAMMA)
  state = drafter.prefill(params, state, sequences, lengths)
  drafts, q, _ = drafter.propose(params, state, sequences, lengths, GAMMA,
                                 sampling, rng)
  return drafts, q


@functools.partial(jax.jit, static_argnums=0)
def _score(drafter, params, enc, decoder_inputs):
  """`drafter.score` compiled (op by op it is hundreds of small compiles)."""
  return drafter.score(params, enc, decoder_inputs)


# Not 'heads_tree' nor 'pass_tree': their `init`, `prefill`, `propose` and
# `score` are those of 'heads' and 'pass' (a tree changes their merged loops
# only), so the same check would compile the same program once more.
SAME_PROPOSALS = ('heads_tree', 'pass_tree')


@pytest.mark.parametrize('kind',
                         [k for k in KINDS if k not in SAME_PROPOSALS])
def test_prefill_then_propose_drafts_from_score(greedy, kind):
  """After `prefill` to a prefix, q_i is the adjusted `score` after it.

  Rows start at different lengths (1 = BOS only) with other tokens after
  them in `sequences`, which must be ignored: prefix ++ drafts[:i] is then
  teacher-forced through `score`, whose standardized distribution at each
  draft's position must be the q that `propose` returned.
  """
  _, params, enc, base, built, _ = greedy
  drafter, dparams = built[kind]
  # Outside a loop the caller hands a TargetReader the target's params.
  dparams = speculative.with_target(drafter, dparams, params)
  # A MergedDrafter may draw q_2.. from the target's own states (PaSS's
  # slots, a head): then its contract binds q_1 only (tests/drafters/test_lookahead.py and
  # tests/drafters/test_heads.py check the later drafts against the target).
  checked = GAMMA
  if isinstance(drafter, interfaces.MergedDrafter) and not (
      drafter.drafts_from_score):
    checked = 1
  sampling = SamplingConfig(temperature=0.8)
  sequences = jnp.pad(base.tokens, ((0, 0), (1, 0)))  # BOS, then outputs
  lengths = np.array([1, 4, 9, 17])
  drafts, q = _prefill_propose(drafter, sampling, dparams, jnp.asarray(enc),
                               sequences, jnp.asarray(lengths, jnp.int32),
                               jax.random.key(4))
  width = lengths.max() + GAMMA
  decoder_inputs = np.zeros((len(lengths), width), np.int32)
  for row, n in enumerate(lengths):
    decoder_inputs[row, :n] = sequences[row, :n]
    decoder_inputs[row, n:n + GAMMA] = drafts[row]
  expected = probabilities(_score(drafter, dparams, jnp.asarray(enc),
                                 jnp.asarray(decoder_inputs)), sampling)
  # Position n - 1 + i predicts draft i.
  index = lengths[:, None] - 1 + np.arange(GAMMA)
  expected = np.take_along_axis(np.asarray(expected), index[..., None], 1)
  # q = 0 marks a position not drafted (adaptive lengths): only after the
  # last drafted one, and never the first.
  q = np.asarray(q)
  drafted = q.sum(-1) > 0
  assert drafted[:, 0].all()
  assert (np.cumprod(drafted, 1) == drafted).all()
  drafted[:, checked:] = False
  np.testing.assert_allclose(q[drafted], expected[drafted], atol=2e-5)
  picked = np.take_along_axis(q, np.asarray(drafts)[..., None], -1)[..., 0]
  assert (picked[drafted] > 0).all()  # each draft is in its q's support


def test_registry_refuses_duplicates_and_names_the_kinds():
  with pytest.raises(ValueError, match="Two drafter kinds are named 't5'"):
    registry.KindTable(drafters.KINDS['t5'], drafters.KINDS['t5'])
  with pytest.raises(ValueError, match="known kinds: .*'bigram'"):
    drafters.get_kind('trigram')


def test_kinds_refuse_a_source_without_what_they_need():
  """A kind built from a model, the target or task data refuses a source
  without it (an InputError naming the kind, one line in a job); a kind
  that needs none builds from nothing."""
  empty = drafters.DraftSource(vocab_size=128)
  for name, kind in drafters.KINDS.items():
    if kind.needs_model or kind.data_only or kind.needs_target:
      with pytest.raises(checks.InputError, match=name):
        kind.build(empty)
    else:
      drafter, params = kind.build(empty)
      assert isinstance(drafter, interfaces.Drafter)
      assert drafter.vocab_size == 128
      drafter.check_params(params)


MODEL = network.T5Model(TINY_V11)  # constructed only: no params, no trace
ROWS = [[3, 4, 5, 1], [6, 7, 1]]


@pytest.mark.parametrize('build, error, message', [
    (lambda: drafters.T5Drafter(MODEL.config), checks.InputError,
     r'^T5Drafter model must be an interfaces\.DecodingModel, e\.g\. '
     r'network\.T5Model\(config\), got a T5Config\.$'),
    (lambda: drafters.PassDrafter(MODEL.config, 2), checks.InputError,
     r'^PassDrafter model must be an interfaces\.DecodingModel, .*, got a '
     r'T5Config\.$'),
    (lambda: drafters.T5Drafter(MODEL, confidence=None), checks.InputError,
     r'^T5Drafter confidence \(adaptive draft length\) must be a number in '
     r'\[0, 1\), got None\.$'),
    (lambda: drafters.T5Drafter(MODEL, confidence='0.5'), checks.InputError,
     r"must be a number in \[0, 1\), got '0\.5'\.$"),
    (lambda: drafters.NgramDrafter(32.0), checks.InputError,
     r'^NgramDrafter vocab_size must be an int >= 1, got 32\.0\.$'),
    (lambda: drafters.NgramDrafter(32, 2.0), checks.InputError,
     r'^NgramDrafter order must be 1 \(unigram\) or 2 \(bigram\), got '
     r'2\.0\.$'),
    (lambda: drafters.ngram_params(ROWS, 32, order=3), checks.InputError,
     r'^order must be 1 \(unigram\) or 2 \(bigram\), got 3\.$'),
    (lambda: drafters.ngram_params(ROWS, 32, order=0), checks.InputError,
     r'^order must be 1 .*, got 0\.$'),
    (lambda: drafters.ngram_params(ROWS, 32, top_k=0), checks.InputError,
     r'^top_k must be an int >= 1, got 0\.$'),
    (lambda: drafters.ngram_params(ROWS, 32, top_k=-1), checks.InputError,
     r'^top_k must be an int >= 1, got -1\.$'),
    (lambda: drafters.ngram_params(ROWS, 0), checks.InputError,
     r'^vocab_size must be an int >= 1, got 0\.$'),
    (lambda: drafters.ngram_params(ROWS, 32.0), checks.InputError,
     r'^vocab_size must be an int >= 1, got 32\.0\.$'),
    (lambda: drafters.ngram_params(ROWS, 32, smoothing=None),
     checks.InputError, r'^smoothing must be a number in \(0, 1\], got None'),
    (lambda: drafters.ngram_params(ROWS, 32, bos_id=40), checks.InputError,
     r'^bos_id must be an int in \[0, vocab_size=32\), got 40\.$'),
    (lambda: drafters.ngram_params(ROWS, 32, bos_id=-1), checks.InputError,
     r'^bos_id must be an int in \[0, vocab_size=32\), got -1\.$'),
    (lambda: drafters.ngram_params([3, 4, 5], 32), checks.InputError,
     r'^sequences must be token id sequences, e\.g\. \[\[3, 4, 1\], '
     r'\[5, 1\]\]; got sequences\[0\] = 3\.$'),
    (lambda: drafters.ngram_params([[3.5, 4]], 32), TypeError,
     r'^sequences must be integer token ids, got dtype float64\.$'),
    (lambda: drafters.ngram_params([[3, 40]], 32), checks.InputError,
     r'^sequences must be token ids in \[0, vocab_size=32\); got ids from '
     r'3 to 40\.$'),
    (lambda: drafters.DraftSource(32, train_targets=[[3, 4, 1]]),
     checks.InputError, r'^DraftSource train_targets must be a callable '
     r'returning the rows .*, e\.g\. lambda: rows; got a list\.$'),
    (lambda: drafters.DraftSource(32, train_pairs=[([3], [4, 1])]),
     checks.InputError, r'^DraftSource train_pairs must be a callable'),
    (lambda: drafters.get_kind('cache').build(drafters.DraftSource(
        32, target_model=MODEL, target_params={}, output_cache='c.npz')),
     checks.InputError, r'^DraftSource output_cache must be an '
     r"output_cache\.OutputCache .*, got 'c\.npz'\.$"),
])
def test_drafters_and_ngram_params_refuse_bad_arguments(build, error,
                                                        message):
  """Each argument outside its rule is refused when given, by name, with
  the value: not accepted to fail deep inside the first decode (a config
  for a model), in numpy (a float vocabulary, top_k 0, bos_id 40), or
  silently (order 3 built a bigram; bos_id -1 read the last row). Cheap:
  constructors and host-side statistics only, nothing compiled."""
  with pytest.raises(error, match=message):
    build()


def test_ngram_params_drop_the_padding_of_decode_output():
  """Rows of `DecodeResult.tokens` passed whole (0s after EOS) give the
  statistics of the rows cut at their lengths: the padding is not counted
  as tokens (nor 0 as EOS's successor)."""
  tokens = np.array([[3, 4, 1, 0, 0, 0], [6, 7, 1, 0, 0, 0]])
  padded = drafters.ngram_params(tokens, 32)
  cut = drafters.ngram_params([[3, 4, 1], [6, 7, 1]], 32)
  for name in cut:
    np.testing.assert_array_equal(padded[name], cut[name], err_msg=name)


def test_module_main_lists_every_kind(capsys, monkeypatch):
  """`python -m specdec_jax.drafters` is the kind list gin files and docs
  point to: one line per registered kind, with its description; it takes
  no flag (a mistyped one is refused, not ignored)."""
  import runpy  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys, 'argv', ['drafters', '--bogus'])
  with pytest.raises(SystemExit) as e:
    runpy.run_module('specdec_jax.drafters', run_name='__main__')
  assert e.value.code == 2 and '--bogus' in capsys.readouterr().err
  monkeypatch.setattr(sys, 'argv', ['drafters'])
  runpy.run_module('specdec_jax.drafters', run_name='__main__')
  out = capsys.readouterr().out
  # docs/drafters.md shows this listing: as the command prints it today.
  docs = pathlib.Path(__file__).parents[2] / 'docs' / 'drafters.md'
  assert out in docs.read_text(), 'docs/drafters.md lists other kinds'
  lines = out.strip().splitlines()[1:]
  assert [line.split()[0] for line in lines] == list(drafters.KINDS)
  for line, kind in zip(lines, drafters.KINDS.values()):
    assert kind.description in line
