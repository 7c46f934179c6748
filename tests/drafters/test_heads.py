"""Self-drafting heads (specdec_jax/drafters/heads/): states, loops, training.

- States: `extend(..., return_hidden=True)` gives the teacher-forced final
  states (`target_features`), and `project` of them gives the target's
  logits (untied T5 1.1 and tied T5 1.0), so the head reads at decode time
  what it was trained on.
- A head step after a decode matches the teacher-forced chain (`Head.draft`
  from the merged loop's state = `chain_loss`'s path).
- Exactness: greedy outputs equal `decoding.temperature_sample` token for
  token (batch 4, ragged) for the merged loop (`heads.HeadLoop`), the
  Drafter-protocol version and the tree loop (`heads.HeadTreeLoop`, kind
  'heads_tree', whose trees' rank-0 path is the head's chain); sampled
  sequences follow the target's exact law (chi-square,
  tests/test_speculative.py; the trees' in tests/drafters/test_trees.py).
- Training: the target's params bit-identical after steps, the loss falls;
  save / load with the head config, clear errors for another target or a
  folder that is not a head checkpoint; the kind builds, refuses, and
  `speculative.speculative_sample` decodes with the merged loop by default.

Run alone: `python -m pytest -q tests/drafters/test_heads.py`.
"""

import types
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import interfaces
from specdec_jax import layers
from specdec_jax import speculative
from specdec_jax.drafters import heads
from specdec_jax.drafters.heads import train as heads_train
from specdec_jax.drafters.tree import shape as tree_shape
from specdec_jax import spec_stats

from conftest import extend
from conftest import init_cache
from conftest import teacher_forced_logits
from test_speculative import assert_sampled_law
from test_speculative import SAMPLING_CASES
from test_speculative import tiny_target  # pylint: disable=unused-import

MAX_LEN = 20
EOS = 68
HEAD = heads.HeadConfig(mlp_dim=48, cross_attention=True)


def random_head(config, head=HEAD, seed=0, scale=0.5):
  """A head whose zero-initialized projections are random too (an untrained
  head only repeats the previous position's distribution)."""
  params = heads.init_head(config, head, seed)
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  leaves = [x + scale * jax.random.normal(k, x.shape) / np.sqrt(x.shape[0])
            for k, x in zip(keys, leaves)]
  return jax.tree_util.tree_unflatten(tree, leaves)


@pytest.fixture(scope='module')
def setup(v11):
  model, params = v11
  rng = np.random.default_rng(3)  # as test_drafters: rows end on EOS
  enc = rng.integers(2, model.vocab_size, (4, 12))
  enc[1, 8:] = 0
  enc[2, 5:] = 0
  enc[3, 2:] = 0
  return model, params, jnp.asarray(enc)


def fitted_head(model, params, enc, head, steps=40):
  """A head fitted a few steps to the target's greedy outputs on `enc`
  (so that drafts are accepted sometimes, rejected sometimes)."""
  out = decoding.temperature_sample(model, params, enc,
                                    max_decode_len=MAX_LEN, eos_id=EOS).tokens
  hidden, kv = heads_train.target_features(model, params, enc, out)
  opt = optax.adam(1e-2)
  step = heads_train.make_train_step(heads.Head(model.config, head),
                                     opt, depth=3)
  hp = heads.init_head(model.config, head)
  state = opt.init(hp)
  positions = jnp.tile(jnp.arange(MAX_LEN)[None], (enc.shape[0], 1))
  for _ in range(steps):
    hp, state, _, _ = step(hp, state, params, hidden, kv, enc, out,
                           positions)
  return hp


@pytest.fixture(scope='module')
def fitted(setup):
  """`fitted_head` per HeadConfig, fitted once per module (each fit
  compiles its train step)."""
  model, params, enc = setup
  heads_by_config = {}

  def get(head):
    if head not in heads_by_config:
      heads_by_config[head] = fitted_head(model, params, enc, head)
    return heads_by_config[head]

  return get


@pytest.mark.parametrize('which', ['v11', 'v10'])
def test_states_and_projection_match_teacher_forcing(which, request):
  model, params = request.getfixturevalue(which)
  enc = jnp.asarray(np.random.default_rng(0).integers(
      2, model.vocab_size, (2, 7)))
  out = jnp.asarray(np.random.default_rng(1).integers(
      2, model.vocab_size, (2, 6)))
  hidden, (key, _) = heads_train.target_features(model, params, enc, out)
  dec_in = jnp.pad(out[:, :-1], ((0, 0), (1, 0)))
  ref = teacher_forced_logits(model, params, enc, dec_in)
  np.testing.assert_allclose(heads.model.project(params, model.config,
                                                 hidden), ref, atol=1e-4)
  cache = init_cache(model, params, enc, 10)
  np.testing.assert_allclose(key, cache.cross_key[-1], atol=1e-5)
  (_, h1), cache = extend(model, params, dec_in[:, :2], cache,
                          return_hidden=True)
  (logits, h2), _ = extend(model, params, dec_in[:, 2:], cache,
                           return_hidden=True)
  np.testing.assert_allclose(jnp.concatenate([h1, h2], 1), hidden,
                             atol=1e-5)
  np.testing.assert_allclose(logits, ref[:, 2:], atol=1e-4)


def test_decode_time_draft_matches_training_chain(setup):
  """Head.draft from a cached state = the teacher-forced chain's steps."""
  model, params, enc = setup
  head = heads.Head(model.config, HEAD)
  hp = random_head(model.config)
  out = decoding.temperature_sample(model, params, enc, max_decode_len=8,
                                    eos_id=-1).tokens
  hidden, kv = heads_train.target_features(model, params, enc, out)
  t = 2  # from h_t (which gave y_{t+1} = out[:, t]) with token out[:, t]
  cache = init_cache(model, params, enc, 12)
  dec_in = jnp.pad(out[:, :-1], ((0, 0), (1, 0)))
  (_, h), cache = extend(model, params, dec_in[:, :t + 1], cache,
                         return_hidden=True)
  drafts, q = jax.jit(head.draft, static_argnums=(5, 6))(
      hp, params, h[:, t], out[:, t], cache, 3, speculative.SamplingConfig(),
      jax.random.key(0))
  bias = layers.mask_to_bias((enc > 0)[:, None, None, :])
  s, tok = hidden[:, t:t + 1], out[:, t:t + 1]
  step = jax.jit(head.step)
  for k in range(3):
    s, logits = step(hp, params, s, tok, kv, bias)
    np.testing.assert_array_equal(drafts[:, k], jnp.argmax(logits[:, 0], -1))
    np.testing.assert_allclose(q[:, k].max(-1), 1.0)  # greedy: one-hot
    tok = drafts[:, k:k + 1]
    if k == 0:
      root_state = s
  # A tree's rank-0 path is that chain (`Head.draft_tree` steps each node
  # that gets children from its parent's state): 'static-beam:2,2,3' holds
  # it at tree indices 1, 3, 7; the root's rank-1 child (index 2) is
  # stepped from the root's state too.
  tree = jax.jit(head.draft_tree, static_argnums=(5, 6))(
      hp, params, h[:, t], out[:, t], cache,
      tree_shape.parse('static-beam:2,2,3'), speculative.SamplingConfig(),
      jax.random.key(0))
  np.testing.assert_array_equal(tree.tokens[:, [1, 3, 7]], drafts)
  # Greedy q is one-hot: the tree keeps its argmax (`Tree.top`).
  np.testing.assert_array_equal(tree.top[:, [0, 1, 3]], np.argmax(q, -1))
  assert (tree.tokens[:, 2] != tree.tokens[:, 1]).all()
  _, logits = step(hp, params, root_state, tree.tokens[:, 2:3], kv, bias)
  np.testing.assert_array_equal(tree.top[:, 2], jnp.argmax(logits[:, 0], -1))


# Each loop once and each head once: the head without cross-attention in
# the merged loop, the one with it in the protocol loop (the 'heads' kind,
# a head with cross-attention in the merged loop, decodes greedily in fixed
# batches and streamed in tests/drafters/test_drafters.py).
@pytest.mark.parametrize('loop,cross', [('merged', False),
                                        ('protocol', True)])
def test_greedy_equals_baseline(setup, fitted, loop, cross):
  model, params, enc = setup
  head = heads.HeadConfig(mlp_dim=48, cross_attention=cross)
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=MAX_LEN, eos_id=EOS)
  drafter = heads.HeadDrafter(model, head)
  dparams = heads.head_params(params, fitted(head))
  out = speculative.speculative_sample(
      model, params, drafter, dparams, enc, gamma=3, max_decode_len=MAX_LEN,
      eos_id=EOS, merged=loop == 'merged')
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  assert len(set(np.asarray(base.lengths).tolist())) > 1  # ragged rows
  st = spec_stats.summarize(out.stats)
  assert 0 < st['acceptance_rate'] < 1, st  # both branches ran
  if loop == 'merged':  # one target call per iteration, fewer than tokens
    assert st['target_calls'] < np.asarray(base.lengths).max()
  else:  # draft 1 is the target's own greedy token
    assert st['per_position_acceptance'][0] == 1.0


def test_greedy_trees_equal_baseline_and_beat_the_chain(setup, fitted):
  """Kind 'heads_tree': the fitted head drafting dynamic trees, the best 6
  of 12 nodes verified, at batch 4 with ragged rows: the baseline token
  for token, and more tokens per target call than its chain of the same
  depth. (The state each tree starts from: tests/drafters/test_trees.py.)"""
  model, params, enc = setup
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=MAX_LEN, eos_id=EOS)
  dparams = heads.head_params(params, fitted(HEAD))
  per_call = {}
  for name, drafter in (
      ('chain', heads.HeadDrafter(model, HEAD)),
      ('tree', heads.HeadTreeDrafter(model, HEAD,
                                     tree_shape.parse('beam:3,2,3/6')))):
    out = speculative.speculative_sample(
        model, params, drafter, dparams, enc, gamma=3,
        max_decode_len=MAX_LEN, eos_id=EOS)
    np.testing.assert_array_equal(out.tokens, base.tokens)
    np.testing.assert_array_equal(out.lengths, base.lengths)
    st = spec_stats.summarize(out.stats)
    assert 0 < st['acceptance_rate'] < 1, st  # both branches ran
    per_call[name] = (np.asarray(out.lengths).sum() /
                      np.asarray(out.stats.row_iterations).sum())
  assert len(set(np.asarray(base.lengths).tolist())) > 1  # ragged rows
  assert per_call['tree'] > per_call['chain'], per_call


# The head's laws (tests/drafters/test_drafters.py leaves the kind 'heads'
# to these two); the tree loop's law is tests/drafters/test_trees.py's.
@pytest.mark.parametrize('loop,case', [('merged', 't0.7'),
                                       ('protocol', 'topp0.8')])
def test_sampled_sequences_follow_target_distribution(tiny_target, loop,
                                                      case):
  """Chi-square p > 1e-4 and TV < 0.02 vs the exact law of 3 tokens."""
  model, params, _ = tiny_target
  head = heads.HeadConfig(mlp_dim=16)
  hp = random_head(model.config, head, seed=zlib.crc32(case.encode()) % 97)
  out = assert_sampled_law(
      tiny_target, SAMPLING_CASES[case], heads.HeadDrafter(model, head),
      heads.head_params(params, hp), loop + case, 2, merged=loop == 'merged')
  assert 0 < spec_stats.summarize(out.stats)['acceptance_rate'] < 1  # both


def test_training_leaves_target_untouched_and_loss_falls(setup):
  model, params, enc = setup
  out = decoding.temperature_sample(model, params, enc, max_decode_len=12,
                                    eos_id=-1).tokens
  hidden, kv = heads_train.target_features(model, params, enc, out)
  head = heads.Head(model.config, HEAD)
  hp = heads.init_head(model.config, HEAD)
  before = jax.tree.map(np.array, params)
  opt = optax.adam(3e-3)
  step = heads_train.make_train_step(head, opt, depth=2)
  state = opt.init(hp)
  positions = jnp.tile(jnp.arange(10)[None], (4, 1))
  alpha0 = heads_train.depth_alpha(model, params, head, hp, enc, out, 2)
  losses = []
  for _ in range(30):
    hp, state, loss, m = step(hp, state, params, hidden, kv, enc, out,
                              positions)
    losses.append(float(loss))
  assert losses[-1] < losses[0] - 0.5, losses
  assert np.all(np.asarray(m['weight_at']) > 0)
  jax.tree.map(np.testing.assert_array_equal, before,
               jax.tree.map(np.array, params))
  sums, counts = heads_train.depth_alpha(model, params, head, hp, enc, out, 2)
  o = np.asarray(out)  # step k counts t with y_{t+k+1} > 1 (not EOS/pad)
  for k in range(2):   # and a real label y_{t+k+2}
    assert counts[k] == ((o[:, k:-1] > 1) & (o[:, k + 1:] > 0)).sum()
  assert sums[0] / counts[0] > alpha0[0][0] / alpha0[1][0] + 0.1


def test_save_load_and_mismatch(setup, tmp_path, gcs):
  """A head saved and loaded on gs:// (the shipped heads load from disk in
  the specs' tests), from its checkpoint or its dir; misfits named."""
  model, _, _ = setup
  hp = random_head(model.config)
  path = heads.save_head(hp, HEAD, f'{gcs}/head', 5)
  for where in (path, f'{gcs}/head'):  # checkpoint or its dir
    back, cfg = heads.load_head(where, model.config)
    assert cfg == HEAD
    jax.tree.map(np.testing.assert_array_equal, back, hp)
  wider = model.config.replace(emb_dim=48)
  with pytest.raises(ValueError, match='emb_dim 48'):
    heads.load_head(path, wider)
  with pytest.raises(ValueError, match='No checkpoint_<step>'):
    heads.load_head(str(tmp_path), model.config)
  with pytest.raises(ValueError, match='mlp_dim must be'):
    heads.HeadConfig(mlp_dim=0)


def test_kind_builds_refuses_and_decodes_with_merged_loop(setup, tmp_path):
  model, params, enc = setup
  hp = random_head(model.config)
  source = drafters.DraftSource(vocab_size=model.vocab_size,
                                target_model=model, target_params=params,
                                draft_params=hp)
  drafter, dparams = drafters.get_kind('heads').build(source)
  assert isinstance(drafter, interfaces.Drafter)
  assert drafter == heads.HeadDrafter(model, HEAD)
  drafter.check_params(dparams)
  assert isinstance(drafter, interfaces.MergedDrafter)
  assert not isinstance(drafters.T5Drafter(model), interfaces.MergedDrafter)
  # By default the drafter decodes with its merged loop (a HeadLoop).
  loop, _ = speculative.speculative_sample.prepare(
      model, params, drafter, dparams, enc, gamma=2, max_decode_len=MAX_LEN)
  assert isinstance(loop, heads.HeadLoop)
  loop, _ = speculative.speculative_sample.prepare(
      model, params, drafter, dparams, enc, gamma=2, max_decode_len=MAX_LEN,
      merged=False)
  assert isinstance(loop, speculative.SpecLoop)
  path = heads.save_head(hp, HEAD, str(tmp_path / 'h'), 1)
  from_ckpt = types.SimpleNamespace(target_model=model, target_params=params,
                                    draft_params=None, draft_checkpoint=path)
  drafter2, dparams2 = drafters.get_kind('heads').build(from_ckpt)
  assert drafter2 == drafter
  jax.tree.map(np.testing.assert_array_equal, dparams2['head'], hp)
  with pytest.raises(ValueError, match='no target_model'):
    drafters.get_kind('heads').build(drafters.DraftSource(vocab_size=128))
  with pytest.raises(ValueError, match='not a draft head checkpoint'):
    drafters.get_kind('heads').build(types.SimpleNamespace(
        target_model=model, target_params=params, draft_params=None,
        draft_checkpoint='shipped:dec2'))
  with pytest.raises(ValueError, match='merged=True needs a drafter'):
    speculative.speculative_sample(
        model, params, drafters.T5Drafter(model), params, enc, gamma=2,
        max_decode_len=MAX_LEN, merged=True)
  other = heads.head_params(params, random_head(
      model.config, heads.HeadConfig(mlp_dim=8)))
  with pytest.raises(ValueError, match='do not fit'):
    speculative.speculative_sample(model, params, drafter, other, enc,
                                   gamma=2, max_decode_len=MAX_LEN)
