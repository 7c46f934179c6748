"""PaSS (specdec_jax/drafters/lookahead/): look-ahead slots, drafter, merged loop.

- Masking: a real token after look-ahead slots (dropped by `rewind`) gets the
  logits of plain decoding, and real tokens of a block with slots get the
  logits they have without them (float32, atol 1e-5); the decoding path's
  slots equal the teacher-forced ones (`lookahead_logits`).
- Exactness: greedy outputs equal `decoding.temperature_sample` token for
  token (batch 4, ragged inputs and acceptance) for the Drafter-protocol
  version (the merged draft+verify loop, one slot group, is kind 'pass'
  of tests/drafters/test_drafters.py, and its tree of one group per draft
  position kind 'pass_tree'); sampled sequences follow the target's
  exact law (the chi-square test of tests/test_speculative.py), the tree
  layout's too.
- Training: target params bit-identical after steps, loss falls; save /
  load beside a checkpoint, and a clear error for another emb_dim.

Run alone: `python -m pytest -q tests/drafters/test_lookahead.py`.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import interfaces
from specdec_jax import speculative
from specdec_jax.drafters import heads
from specdec_jax.drafters import lookahead
from specdec_jax.drafters.lookahead import train as lookahead_train
from specdec_jax import spec_stats

from conftest import extend
from conftest import init_cache
from conftest import teacher_forced_logits
from test_speculative import assert_sampled_law
from test_speculative import SAMPLING_CASES
from test_speculative import tiny_target  # pylint: disable=unused-import

MAX_LEN = 20
EOS = 68
L = 3


@functools.lru_cache(maxsize=None)
def jitted(model):
  """The model's PaSS calls (teacher-forced slots, a tree call), compiled;
  its plain calls are conftest's."""
  tree = lambda p, t, c, e: lookahead.model.tree_extend(model, p, t, c, e)
  return dict(
      slots=jax.jit(lambda *a: lookahead.lookahead_logits(model, *a)[1]),
      tree=jax.jit(tree))


@pytest.fixture(scope='module')
def setup(v11):
  model, params = v11
  la = lookahead.init_lookahead(params, L, seed=1)
  rng = np.random.default_rng(3)  # as test_drafters: rows end on EOS
  enc = rng.integers(2, model.vocab_size, (4, 12))
  enc[1, 8:] = 0
  enc[2, 5:] = 0
  enc[3, 2:] = 0
  return model, params, la, jnp.asarray(enc)


def test_slots_are_invisible_to_real_tokens(setup):
  """Before the slots (causal) and after them (rewind): plain logits."""
  model, params, la, enc = setup
  f = jitted(model)
  dec = jnp.asarray(np.random.default_rng(1).integers(2, 128, (4, 10)))
  dec = dec.at[:, 0].set(0)
  ref = teacher_forced_logits(model, params, enc, dec)
  # Rows at different positions: row b has consumed b + 1 tokens.
  pos = jnp.arange(4) + 1
  cache = init_cache(model, params, enc, 24)
  _, cache = extend(model, params, dec[:, :1], cache)
  cache = extend(model, params, dec[:, 1:4], cache)[1].rewind(pos)
  idx = pos[:, None] + jnp.arange(3)
  real = jnp.take_along_axis(dec, idx, 1)  # 3 real tokens per row
  block = jnp.concatenate([real, jnp.zeros((4, L), jnp.int32)], 1)
  with_slots, cache2 = extend(model, params, block, cache,
                               lookahead=lookahead.embeddings(la))
  without, _ = extend(model, params, real, cache)
  np.testing.assert_allclose(with_slots[:, :3], without, atol=1e-5)
  want = jnp.take_along_axis(ref, idx[..., None], 1)
  np.testing.assert_allclose(with_slots[:, :3], want, atol=1e-5)
  # Drop the slots; the next real tokens see exactly the plain prefix.
  after, _ = extend(model, params, jnp.take_along_axis(dec, idx + 3, 1),
                    cache2.rewind(pos + 3))
  np.testing.assert_allclose(
      after, jnp.take_along_axis(ref, (idx + 3)[..., None], 1), atol=1e-5)
  # Slots stand for the positions after the last real token: the
  # teacher-forced slots of prefix :pos+3 are the same logits.
  tf_slots = f['slots'](params, la, enc, dec)
  want_slots = jnp.take_along_axis(tf_slots, (pos + 2)[:, None, None, None],
                                   1)[:, 0]
  np.testing.assert_allclose(with_slots[:, 3:], want_slots, atol=1e-5)


def test_slot_start_per_row(setup):
  """`lookahead_start` places the slots per row; later block positions do
  not change what the real tokens before them see."""
  model, params, la, enc = setup
  f = jitted(model)
  cache = init_cache(model, params, enc, 24)
  tokens = jnp.asarray(np.random.default_rng(2).integers(2, 128, (4, 6)))
  tokens = tokens.at[:, 0].set(0)
  start = jnp.array([1, 2, 3, 1])
  out, _ = extend(model, params, tokens, cache,
                  lookahead=lookahead.embeddings(la), lookahead_start=start)
  plain, _ = extend(model, params, tokens, cache)
  for b, s in enumerate(np.asarray(start)):
    np.testing.assert_allclose(out[b, :s], plain[b, :s], atol=1e-5)
    assert np.abs(out[b, s] - plain[b, s]).max() > 1e-3  # a slot
  # Each row's slots are the teacher-forced slots of its prefix :start.
  tf_slots = f['slots'](params, la, enc, tokens)
  for b, s in enumerate(np.asarray(start)):
    np.testing.assert_allclose(out[b, s:s + L], tf_slots[b, s - 1],
                               atol=1e-5)


def test_tree_groups_see_their_prefix_only(setup):
  """The tree call: real tokens get plain logits, group h the slots of the
  prefix ending at real token h, and after a rewind nothing of it shows."""
  model, params, la, enc = setup
  f = jitted(model)
  dec = jnp.asarray(np.random.default_rng(4).integers(2, 128, (4, 10)))
  dec = dec.at[:, 0].set(0)
  ref = teacher_forced_logits(model, params, enc, dec)
  tf_slots = f['slots'](params, la, enc, dec)
  pos = jnp.array([1, 2, 3, 4])
  cache = init_cache(model, params, enc, 40)
  cache = extend(model, params, dec[:, :6], cache)[1].rewind(pos)
  g = L
  idx = pos[:, None] + jnp.arange(g + 1)
  out, cache2 = f['tree'](params, jnp.take_along_axis(dec, idx, 1), cache,
                          lookahead.embeddings(la))
  np.testing.assert_allclose(
      out[:, :g + 1], jnp.take_along_axis(ref, idx[..., None], 1), atol=1e-5)
  for h in range(g + 1):
    want = jnp.take_along_axis(tf_slots, (pos + h)[:, None, None, None], 1)
    np.testing.assert_allclose(out[:, g + 1 + h * L:g + 1 + (h + 1) * L],
                               want[:, 0], atol=1e-5)
  after, _ = extend(model, params, dec[:, 5:8], cache2.rewind(jnp.full(4, 5)))
  np.testing.assert_allclose(after, ref[:, 5:8], atol=1e-5)


# Greedy in the ordinary loop (gamma = L + 1: draft 1 is the target's own
# token). The merged loop is kind 'pass' and its tree layout kind
# 'pass_tree' in the per-kind suite (tests/drafters/test_drafters.py: fixed
# and streamed).
def test_greedy_equals_baseline(setup):
  model, params, la, enc = setup
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=MAX_LEN, eos_id=EOS)
  drafter = lookahead.PassDrafter(model, L)
  dparams = lookahead.pass_params(params, la)
  out = speculative.speculative_sample(
      model, params, drafter, dparams, enc, gamma=L + 1,
      max_decode_len=MAX_LEN, eos_id=EOS, merged=False)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  assert len(set(np.asarray(base.lengths).tolist())) > 1  # ragged rows
  st = spec_stats.summarize(out.stats)
  assert st['per_position_acceptance'][0] == 1.0
  assert st['target_calls'] < MAX_LEN


# The merged loop at t = 1, top-k 3 is the kind 'pass' in
# tests/drafters/test_drafters.py.
@pytest.mark.parametrize('loop,case', [('tree', 't0.7'),
                                       ('protocol', 'topp0.8')])
def test_sampled_sequences_follow_target_distribution(tiny_target, loop,
                                                      case):
  """Chi-square p > 1e-4 and TV < 0.02 vs the exact law of 3 tokens."""
  model, params, _ = tiny_target
  la = lookahead.init_lookahead(params, 2, seed=3)
  out = assert_sampled_law(
      tiny_target, SAMPLING_CASES[case],
      lookahead.PassDrafter(model, 2, tree=loop == 'tree'),
      lookahead.pass_params(params, la), loop + case, 2,
      merged=loop != 'protocol')
  assert 0 < spec_stats.summarize(out.stats)['acceptance_rate'] < 1  # both


def test_training_leaves_target_untouched_and_loss_falls(setup):
  model, params, la, enc = setup
  targets = decoding.temperature_sample(model, params, enc,
                                        max_decode_len=12, eos_id=-1).tokens
  before = jax.tree.map(np.array, params)
  opt = optax.adam(0.3)
  step = lookahead_train.make_train_step(model, opt)
  state = opt.init(la)
  losses = []
  for _ in range(5):
    la, state, m = step(params, la, state, enc, targets)
    losses.append(float(m['loss']))
  assert losses[-1] < losses[0] - 0.1, losses
  jax.tree.map(np.testing.assert_array_equal, before,
               jax.tree.map(np.array, params))


def test_save_load_and_shape_mismatch(setup, gcs):
  """Embeddings saved and loaded on gs:// (saved on disk: the test below
  and the shipped ones); a misfit named."""
  model, params, la, _ = setup
  path = lookahead.save_lookahead(la, f'{gcs}/pass_L3', 7)
  back = lookahead.load_lookahead(path, model.config)
  np.testing.assert_array_equal(lookahead.embeddings(back),
                                lookahead.embeddings(la))
  wider = model.config.replace(emb_dim=48)
  with pytest.raises(checks.InputError, match=r'emb_dim=48.*want \[L, 48\]'):
    lookahead.load_lookahead(path, wider)
  # Another method's checkpoint (a draft head's folder as DRAFT_CHECKPOINT):
  # what it holds, named (before: a ValueError, the eval job's traceback).
  head_cfg = heads.HeadConfig(mlp_dim=8)
  heads.save_head(heads.init_head(model.config, head_cfg), head_cfg,
                  f'{gcs}/head', 2)
  with pytest.raises(checks.InputError, match=(
      f"look-ahead checkpoint {gcs}/head holds {{'draft_head': ...}}, not "
      "look-ahead embeddings")):
    lookahead.load_lookahead(f'{gcs}/head', model.config)


def test_kind_builds_and_refuses(setup, tmp_path):
  model, params, la, enc = setup
  source = drafters.DraftSource(vocab_size=128, target_model=model,
                                target_params=params, draft_params=la)
  drafter, dparams = drafters.get_kind('pass').build(source)
  assert isinstance(drafter, interfaces.Drafter)
  assert drafter == lookahead.PassDrafter(model, L)
  drafter.check_params(dparams)
  # From DRAFT_CHECKPOINT (the source field loading passes for 'pass').
  path = lookahead.save_lookahead(la, str(tmp_path / 'pass'), 1)
  from_ckpt = types.SimpleNamespace(target_model=model, target_params=params,
                                    draft_params=None, draft_checkpoint=path)
  drafter2, dparams2 = drafters.get_kind('pass').build(from_ckpt)
  assert drafter2 == drafter
  np.testing.assert_array_equal(
      lookahead.embeddings(dparams2['lookahead']),
      lookahead.embeddings(la))
  with pytest.raises(ValueError, match='no target_model'):
    drafters.get_kind('pass').build(drafters.DraftSource(vocab_size=128))
  with pytest.raises(ValueError, match='gamma=4 > 3'):
    speculative.speculative_sample(model, params, drafter, dparams, enc,
                                   gamma=4, max_decode_len=MAX_LEN)
  with pytest.raises(ValueError, match='gamma=5 > 4'):
    speculative.speculative_sample(model, params, drafter, dparams, enc,
                                   gamma=5, max_decode_len=MAX_LEN,
                                   merged=False)
  bad = lookahead.pass_params(params, {'lookahead_embedder': {
      'embedding': jnp.zeros((L, 16))}})
  with pytest.raises(ValueError, match='emb_dim=32'):
    speculative.speculative_sample(model, params, drafter, bad, enc,
                                   gamma=2, max_decode_len=MAX_LEN)
