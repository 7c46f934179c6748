"""Token trees (specdec_jax/drafters/tree): exact in every mode.

1. One tree call equals a chain call on every root-to-leaf path (float32).
2. Greedy: output identical to the baseline, every shape, batch > 1 with
   ragged rows; the target as its own drafter accepts whole paths (what
   fails if the drafter's path commit is wrong); the state the loop hands
   the heads is the last accepted node's. Streaming, and t = 1 with
   top-k, are the kind 'tree''s cases in tests/drafters/test_drafters.py.
3. Sampled: the law over whole sequences is the target's by chi-square
   (t = 1, t = 0.7 with top-k, top-p; an adversarial drafter whose best
   candidates the target likes least; a random head drafting the trees,
   kind 'heads_tree'), and a planted bug (a rejected sibling's subtree
   stays reachable) fails the same test. The heads' greedy trees are
   tests/drafters/test_heads.py's.
4. The verifier alone, on hand-built trees (no model: cheap): the law of
   the first two committed tokens is the target's by chi-square under
   both sibling rules (siblings drawn by the rule: i.i.d. from q, or
   Gumbel-top-k), with repeated siblings, q = 0 siblings and nodes under
   rejected parents, at t = 1, t = 0.5, top-k and top-p; planted bugs (a
   wrong residual update for each rule, a rejected sibling's subtree
   kept) fail it; greedy takes the first of repeated argmax siblings.
"""

import dataclasses
import functools
import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checks
from specdec_jax import loading
from specdec_jax import network
from specdec_jax import drafters
from specdec_jax import hardware
from specdec_jax import sampling as sampling_lib
from specdec_jax import scaffold
from specdec_jax import spec_stats
from specdec_jax import speculative
from specdec_jax.drafters import heads
from specdec_jax.drafters.heads import train as heads_train
from specdec_jax.drafters import tree as tree_lib
from specdec_jax.drafters.tree import drafter as tree_drafter_lib
from specdec_jax.drafters.tree import grow as grow_lib
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.drafters.tree import verify as verify_lib
from specdec_jax.sampling import SamplingConfig

import reference
from conftest import RAGGED_EOS
from conftest import RAGGED_MAX_LEN
from conftest import TINY_V11
from conftest import init_cache
from test_heads import random_head
from test_speculative import (MAX_NOISE_TV, N_SAMPLES, SEQ_LEN, SMALL_EOS,
                              assert_matches, exact_sequence_distribution,
                              perturbed, run_optimized, total_variation,
                              tiny_target)  # pylint: disable=unused-import

MAX_LEN = RAGGED_MAX_LEN
EOS = RAGGED_EOS


def tree_drafter(model, spec):
  return tree_lib.TreeDrafter(drafters.T5Drafter(model),
                              shape_lib.parse(spec))


# ---------------------------------------------------------------------------
# 1. Path equivalence.
# ---------------------------------------------------------------------------


def test_tree_call_equals_chain_call_on_every_path(v11):
  """Row 0 has the shape's parents, row 1 a permutation of each level's
  parents (as a dynamic tree may have); every node of both is checked."""
  model, params = v11
  rng = np.random.default_rng(0)
  batch, committed = 2, 4
  shape = shape_lib.beam(3, 2, 3, dynamic=False)
  width, depth = shape.width, shape.depth
  enc = jnp.asarray(rng.integers(2, 128, (batch, 10)))
  prefix = rng.integers(2, 128, (batch, committed + 1))
  prefix[:, 0] = 0
  parent = np.zeros((batch, width), np.int32)
  offsets = shape.offsets
  for d in range(1, depth + 1):
    for b in range(batch):
      order = np.arange(shape.sizes[d - 2] if d > 1 else 1)
      if b == 1:
        order = rng.permutation(order)
      for j, (p, _) in enumerate(shape.levels[d - 1]):
        parent[b, offsets[d] + j] = offsets[d - 1] + order[p]
  tokens = rng.integers(2, 128, (batch, width))
  tokens[:, 0] = prefix[:, committed]
  tree = tree_lib.verify.empty(batch, shape, model.vocab_size).replace(
      tokens=jnp.asarray(tokens), parent=jnp.asarray(parent))
  # Every node's path from the root, right-padded: one chain call per row
  # of (batch x width) paths; causal, so the padding changes nothing
  # before it.
  paths = np.zeros((batch, width, depth + 1), np.int32)
  ends = np.zeros((batch, width), np.int32)
  for b in range(batch):
    for node in range(width):
      path = [node]
      while path[-1]:
        path.append(int(parent[b, path[-1]]))
      path = path[::-1]
      paths[b, node, :len(path)] = tokens[b, path]
      ends[b, node] = len(path) - 1

  @jax.jit
  def calls(params):
    cache = model.init_cache(params, enc, 40)
    _, cache = model.extend(params, jnp.asarray(prefix[:, :committed]),
                            cache)
    logits, _ = model.extend(params, tree.tokens, cache,
                             tree=tree.mask(jnp.full((batch,), committed)))
    plain, _ = model.extend(params, tree.tokens, cache)  # no tree mask
    many = jax.tree_util.tree_map(lambda x: jnp.repeat(x, width, 0), cache)
    chain, _ = model.extend(params, jnp.asarray(paths).reshape(
        batch * width, depth + 1), many)
    return logits, plain, chain

  logits, plain, chain = calls(params)
  chain = np.asarray(chain).reshape(batch, width, depth + 1, -1)
  last = np.take_along_axis(chain, ends[:, :, None, None], 2)[:, :, 0]
  np.testing.assert_allclose(last, logits, atol=1e-5, rtol=1e-5)
  # The check has power: the same tokens as one chain differ.
  assert not np.allclose(last[:, 2:], plain[:, 2:], atol=1e-3)


def test_move_slots_moves_a_path_into_chain_slots(v11):
  model, params = v11
  cache = init_cache(model, params, jnp.ones((2, 4), jnp.int32), 12)
  keys = jnp.arange(2 * 12, dtype=jnp.float32).reshape(2, 12, 1, 1)
  cache = cache.replace(self_key=(jnp.broadcast_to(
      keys, cache.self_key[0].shape),) * len(cache.self_key))
  moved = cache.move_slots(jnp.array([[5, 7], [3, 4]]), jnp.array([1, 2]))
  got = np.asarray(moved.self_key[0][:, :, 0, 0])
  assert got[0, 1] == 5 and got[0, 2] == 7 and got[0, 3] == 3
  assert got[1, 2] == 12 + 3 and got[1, 3] == 12 + 4 and got[1, 0] == 12


@pytest.mark.parametrize('batch', [1, 2])
def test_a_move_left_to_the_next_call_is_the_move_made_now(v11, batch):
  """`move_slots(later=True)`: the next `extend` writes the moved slots in
  its own update (one kernel a buffer on a GPU, not two). Its logits, and
  every slot before its last token, equal a move made at once; with each
  row accepting a different count of the 3 path slots (0 to 3: the slots
  before the call's position move, the rest do not). Fails if the later
  move were dropped (the path's keys are not those of the chain)."""
  model, params = v11
  rng = np.random.default_rng(1)
  enc = jnp.asarray(rng.integers(2, model.vocab_size, (batch, 5)))
  nodes = jnp.asarray(rng.integers(2, model.vocab_size, (batch, 8)))
  source = jnp.asarray([[4, 6, 7], [2, 5, 3]][:batch], jnp.int32)
  start = jnp.ones((batch,), jnp.int32)
  kept = np.array([2, 3][:batch])  # each row's accepted count
  tokens = jnp.asarray(rng.integers(2, model.vocab_size, (batch, 4)))
  position = jnp.asarray(1 + kept, jnp.int32)

  @jax.jit
  def calls(params):
    cache = model.init_cache(params, enc, 24).with_pending(3)
    # A call on 8 tokens at slots 0..7 (the tree's nodes, say), then rows
    # accept the nodes at slots `source` into slots 1.. and rewind.
    cache = model.extend(params, nodes, cache)[1]
    now = model.extend(params, tokens, cache.move_slots(
        source, start).rewind(position))
    later = model.extend(params, tokens, cache.move_slots(
        source, start, later=True).rewind(position))
    unmoved = model.extend(params, tokens, cache.rewind(position))[0]
    return cache, now, later, unmoved

  cache, now, later, unmoved = calls(params)
  np.testing.assert_allclose(later[0], now[0], atol=1e-6, rtol=1e-6)
  for b in range(batch):
    end = int(position[b]) + 4
    for got, want in zip(later[1].self_key + later[1].self_value,
                         now[1].self_key + now[1].self_value):
      np.testing.assert_array_equal(got[b, :end], want[b, :end])
  # The check has power: without the move the logits differ.
  assert not np.allclose(unmoved, now[0], atol=1e-3)
  with pytest.raises(ValueError, match=r'with_pending\(2\)'):
    cache.move_slots(source[:, :2], start, later=True)


# ---------------------------------------------------------------------------
# 2. Greedy.
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def greedy_setup(v11, ragged_greedy):
  model, params = v11
  enc, base = ragged_greedy
  lengths = np.asarray(base.lengths)
  assert len(set(lengths.tolist())) >= 3  # ragged rows
  return model, params, enc, base


# 'beam:3,2,4/6': drafted wide, the best 6 nodes verified (re-ranked), with
# `attention_kernel='cudnn'` (off a GPU, XLA's float32-softmax attention;
# `layers.fused_attention`): its tree masks, padded rows, cross-attention
# masks and caches give the baseline's tokens (float32, where both kernels
# compute the same to rounding). Fails when the kernel's bias or mask is
# misapplied. (The default kernel: the static tree here, and every other
# tree test.)
@pytest.mark.parametrize('spec,kernel', [('static-beam:3,2,4', 'dot_product'),
                                         ('beam:3,2,4/6', 'cudnn')])
def test_greedy_tree_equals_baseline(greedy_setup, spec, kernel):
  model, params, enc, base = greedy_setup
  if kernel != 'dot_product':
    model = network.T5Model(model.config.replace(attention_kernel=kernel))
  drafter = tree_drafter(model, spec)
  depth = drafter.shape.depth
  # The caches hold what a call writes past the committed prefix: the
  # target the verified width (root + 6 of the 21 nodes 'beam:3,2,4/6'
  # drafts) and the path its next call's writes move (depth 4), the
  # drafter the nodes that get children (root, then 2 a level).
  loop = drafter.merged_loop(model, depth, SamplingConfig(), EOS, MAX_LEN)
  assert loop.cache_length == MAX_LEN + (7 if '/' in spec else 22) + depth
  assert loop.draft_cache_length == MAX_LEN + 1 + 2 + 2 + 2
  calls = {}
  for name, dparams in (('self', params),
                        ('good', perturbed(params, 0.3, 0))):
    out = speculative.speculative_sample(
        model, params, drafter, dparams, enc, gamma=depth,
        max_decode_len=MAX_LEN, eos_id=EOS)
    np.testing.assert_array_equal(out.tokens, base.tokens)
    np.testing.assert_array_equal(out.lengths, base.lengths)
    calls[name] = out.stats
  if not drafter.shape.dynamic:
    # The target drafting for itself: every row's greedy path is in a
    # static tree, so each call yields depth + 1 tokens (the last one cut
    # by EOS or the length limit). Fails if the drafter's path commit
    # leaves a wrong key / value in its cache.
    want = np.ceil(np.asarray(base.lengths) / (depth + 1))
    np.testing.assert_array_equal(calls['self'].row_iterations, want)
  good = spec_stats.summarize(calls['good'])
  assert 0.0 < good['acceptance_rate'] < 1.0


def test_verify_commit_returns_the_state_of_the_last_accepted_node(
    greedy_setup):
  """The target state `TreeLoop.verify_commit` returns (what the heads
  draft the next tree from, kind 'heads_tree') is the one the committed
  next token was drawn after: the teacher-forced state at the last
  accepted node, the root where none was. A static tree holds each path
  at tree indices other than its depths; a drafter that agrees in part;
  three iterations, ragged rows."""
  model, params, enc, base = greedy_setup
  loop, args = speculative.speculative_sample.prepare(
      model, params, tree_drafter(model, 'static-beam:2,2,3'),
      perturbed(params, 0.1, 0), enc, gamma=3, max_decode_len=MAX_LEN,
      eos_id=EOS)

  @jax.jit
  def iterations(tp, dp, inputs, draft_inputs, rng):
    def step(state, _):
      tree, draft_state = loop.drafter.propose_tree(
          dp, state.draft_state, state.sequences, state.lengths,
          loop.sampling, state.rng)
      sequences, lengths, ended, cache, stats, h = loop.verify_commit(
          tp, state, tree, state.rng, return_hidden=True)
      n = stats.accepted - state.stats.accepted
      return (speculative.SpecState(sequences, lengths, ended, cache,
                                    draft_state, state.rng, stats),
              (h, lengths, ended, n))
    state = loop.start(tp, dp, inputs, draft_inputs, rng)
    return jax.lax.scan(step, state, None, length=3)[1]

  h, lengths, ended, n = map(np.asarray, iterations(*args))
  hidden, _ = heads_train.target_features(model, params, jnp.asarray(enc),
                                          jnp.asarray(base.tokens))
  # The last committed token is output lengths - 2; its state, hidden's.
  want = np.asarray(hidden)[np.arange(len(enc))[None], lengths - 2]
  live = ~ended  # a row cut at EOS commits less than it accepted
  np.testing.assert_allclose(h[live], want[live], atol=1e-4)
  assert n[live].min() == 0 and n[live].max() >= 2, n


# ---------------------------------------------------------------------------
# 3. Sampled law.
# ---------------------------------------------------------------------------

# One compiled loop per (shape, sampling). These are the tree kinds' laws:
# tests/drafters/test_drafters.py's per-kind law test leaves 'tree' and
# 'heads_tree' to them; 'heads' is a random head drafting the trees (kind
# 'heads_tree').
CASES = {
    't0.7-topk3-static': ('static-beam:2,2,3',
                          SamplingConfig(temperature=0.7, topk=3), 'other'),
    't0.7-topp0.8': ('beam:2,2,3', SamplingConfig(temperature=0.7, topp=0.8),
                     'other'),
    'adversarial': ('beam:3,2,3', SamplingConfig(temperature=1.0),
                    'adversarial'),
    'heads': ('beam:3,2,3', SamplingConfig(temperature=1.0), 'heads'),
}


def _sampled(tiny_target, case, accept_rejected=False, rows=N_SAMPLES):
  """(samples, the exact law, stats) of `rows` tree decodes of `case`.

  Compiled `OPTIMIZED` (30,000 rows run ~2x faster), but for the planted
  bug: its tenth of the rows runs in less time than level 1 costs to
  compile, so it takes the suite's level."""
  model, params, enc = tiny_target
  spec, config, kind = CASES[case]
  drafter = tree_drafter(model, spec)
  if kind == 'heads':
    head = heads.HeadConfig(mlp_dim=16)
    drafter = heads.HeadTreeDrafter(model, head, shape_lib.parse(spec))
    dparams = heads.head_params(params, random_head(model.config, head))
  elif kind == 'other':
    dparams = model.init_params(jax.random.key(77))  # a different model
  else:
    # The target with its logits negated: its best candidates are the
    # tokens the target likes least.
    dparams = jax.tree_util.tree_map(lambda x: x, params)
    dense = dparams['decoder']['logits_dense']
    dparams['decoder']['logits_dense'] = {'kernel': -dense['kernel']}
  loop, args = speculative.speculative_sample.prepare(
      model, params, drafter, dparams,
      jnp.tile(enc, (rows, 1)), gamma=3, max_decode_len=SEQ_LEN,
      sampling=config, eos_id=SMALL_EOS,
      rng=jax.random.key(zlib.crc32(case.encode())))
  if accept_rejected:
    loop = dataclasses.replace(loop, accept_rejected=True)
  out = (scaffold.run if accept_rejected else run_optimized)(loop, *args)
  dist = exact_sequence_distribution(model, params, enc, config)
  return np.asarray(out.tokens), dist, out.stats


@pytest.mark.parametrize('case', list(CASES))
def test_sampled_tree_follows_target_distribution(tiny_target, case):
  samples, dist, stats = _sampled(tiny_target, case)
  assert_matches(samples, dist)
  # Both ways of leaving a node happen: a child accepted, all rejected.
  accepted = np.asarray(stats.accepted).sum()
  assert 0 < accepted < np.asarray(stats.drafted).sum()


def test_planted_bug_fails_the_law_test(tiny_target):
  """Accepting a rejected child moves the law far beyond sampling noise:
  on a tenth of the rows (noise of exact draws: total variation ~0.046)
  it is at ~0.8."""
  samples, dist, _ = _sampled(tiny_target, 'adversarial',
                              accept_rejected=True, rows=N_SAMPLES // 10)
  assert total_variation(samples, dist) > 0.3
  with pytest.raises(AssertionError):
    assert_matches(samples, dist)


# ---------------------------------------------------------------------------
# 4. The verifier alone: every tree a drafter may hand it.
# ---------------------------------------------------------------------------

# Level 1: four children of the root (tree indices 1-4); level 2: two under
# index 1 (5, 6), one under index 2 (7), one under index 4 (8).
LAW_SHAPE = shape_lib.parse('static:0.0,0.1,0.2,0.3;0.0,0.1,1.0,3.0')
LAW_PARENT = np.array([0, 0, 0, 0, 0, 1, 1, 2, 4])
LAW_VOCAB = 6
Z = 0  # the drafter never proposes token 0 (q = 0), the target likes it
# One configuration per test; the verifier's program reads p and q only, so
# all four share it (one program per sibling rule and planted bug).
LAW_CONFIGS = {
    't1': SamplingConfig(temperature=1.0),
    't0.5': SamplingConfig(temperature=0.5),
    'topk4': SamplingConfig(temperature=1.0, topk=4),
    'topp0.9': SamplingConfig(temperature=1.0, topp=0.9),
}
# The reported case: a repeat of the root's first child, rejected a second
# time, made the first token's law [.6, .2, .2].
REPORTED_P = np.array([.5, .3, .2, 0, 0, 0])
REPORTED_Q = np.array([.1, .2, .7, 0, 0, 0])


@functools.lru_cache()
def _law_tables(case):
  """(p, q) `[1 + V, V]` float64: the root's, then the next token's after
  each first token, the target's and the drafter's random logits
  standardized by `LAW_CONFIGS[case]` (as the loop does); q = 0 at Z."""
  rng = np.random.default_rng(5)
  target = 1.5 * rng.normal(size=(1 + LAW_VOCAB, LAW_VOCAB))
  target[:, Z] += 1.0
  draft = 1.5 * rng.normal(size=(1 + LAW_VOCAB, LAW_VOCAB))
  draft[:, Z] = -np.inf
  logits = jnp.asarray(np.stack([target, draft]), jnp.float32)
  p, q = np.asarray(jax.jit(sampling_lib.probabilities, static_argnums=1)(
      logits, LAW_CONFIGS[case]), np.float64)
  return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


def _gumbel_top(rng, q, k):
  """`[N, k]` draws without replacement from the rows of q (Gumbel-top-k,
  as `grow.py`); where q has fewer than k tokens, q = 0 tokens follow."""
  with np.errstate(divide='ignore'):
    keys = np.log(q) + rng.gumbel(size=q.shape)
  return np.argsort(-keys, axis=1, kind='stable')[:, :k]


def _iid(rng, q, k):
  """`[N, k]` i.i.d. draws from the rows of q."""
  cdf = np.cumsum(q, 1)
  u = rng.random((q.shape[0], k)) * cdf[:, -1:]
  return np.minimum((u[:, :, None] >= cdf[:, None, :]).sum(-1),
                    q.shape[1] - 1)


# Per layout: its sibling rule, and the tree indices the walk must never
# accept (skipped siblings, nodes under them).
LAYOUTS = {
    'without': (verify_lib.WITHOUT, (2, 3, 6, 7)),
    'with': (verify_lib.WITH, (3, 8)),
    'repeat': (verify_lib.WITHOUT, (2, 7)),
}


def _law_tree(layout, p_root, q_root, p2, q2, n, seed, siblings):
  """n rows of a hand-built tree of `LAW_SHAPE`, the siblings drawn by the
  layout's rule from the drafter's q, and the target's p at each node.

  'without': level 1 [g1, g1 (a repeat), Z (q = 0), g2], g1, g2
    Gumbel-top-2 of q_root; level 2 [h1, h1 (a repeat)] under g1 (h1 from
    q2[g1]), one node under the repeat, one Gumbel draw under g2.
  'with': level 1 [i1, i2, Z, i3] i.i.d. from q_root (repeats happen);
    level 2 two i.i.d. draws under i1, one under i2, Z under i3.
  'repeat': level 1 [g1, g1] (the reported tree; the other two slots
    not drafted); level 2 Gumbel-top-2 under g1, one node under the
    repeat.

  Returns:
    `(tree, p [n, T, V] float32)`.
  """
  rng = np.random.default_rng(seed)
  z = np.flatnonzero(q_root == 0)[0]  # q = 0 at the root: Z, or 3 reported
  tokens = np.zeros((n, LAW_SHAPE.width), int)
  valid = np.ones((n, LAW_SHAPE.width), bool)
  if layout == 'with':
    i = _iid(rng, np.broadcast_to(q_root, (n, LAW_VOCAB)), 3)
    tokens[:, 1:5] = np.stack([i[:, 0], i[:, 1], np.full(n, z), i[:, 2]], 1)
    tokens[:, 5:7] = _iid(rng, q2[i[:, 0]], 2)
    tokens[:, 7] = _iid(rng, q2[i[:, 1]], 1)[:, 0]
    tokens[:, 8] = Z
  else:
    g = _gumbel_top(rng, np.broadcast_to(q_root, (n, LAW_VOCAB)), 2)
    tokens[:, 1:3] = g[:, :1]  # g1 and its repeat
    if layout == 'without':
      tokens[:, 3], tokens[:, 4] = z, g[:, 1]
      tokens[:, 5:7] = _gumbel_top(rng, q2[g[:, 0]], 1)  # h1 and its repeat
      tokens[:, 8] = _gumbel_top(rng, q2[g[:, 1]], 1)[:, 0]
    else:
      valid[:, [3, 4, 8]] = False
      tokens[:, 5:7] = _gumbel_top(rng, q2[g[:, 0]], 2)
    tokens[:, 7] = (tokens[:, 2] + 1) % LAW_VOCAB  # under the repeat
  # Each node's p and q: the root's, else the ones after its token (what
  # follows a level-2 node is never read by the two-token law).
  p = np.where((np.arange(LAW_SHAPE.width) == 0)[None, :, None],
               p_root, p2[tokens])
  q = np.where((np.arange(LAW_SHAPE.width) == 0)[None, :, None],
               q_root, q2[tokens])
  depth = np.array([0, 1, 1, 1, 1, 2, 2, 2, 2])
  tree = verify_lib.Tree(
      tokens=jnp.asarray(tokens, jnp.int32), valid=jnp.asarray(valid),
      parent=jnp.asarray(np.broadcast_to(LAW_PARENT, tokens.shape),
                         jnp.int32),
      depth=jnp.asarray(np.broadcast_to(depth, tokens.shape), jnp.int32),
      levels=LAW_SHAPE.depth,
      q=jnp.asarray(q, jnp.float32), top=jnp.zeros((n, 1), jnp.int32),
      verified=jnp.zeros((n, 1), jnp.int32),
      siblings=siblings)
  return tree, jnp.asarray(p, jnp.float32)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _verify(rng, tree, p, accept_rejected, wrong_update):
  return verify_lib.verify_tree(rng, tree, p, LAW_SHAPE,
                                SamplingConfig(temperature=1.0),
                                accept_rejected, wrong_update)


def _verifier_law(layout, case, siblings=None, accept_rejected=False,
                  wrong_update=False):
  """(samples [N, 2] of the first two committed tokens, their exact law,
  the verifier's output) for a layout and a `LAW_CONFIGS` case, or
  'reported': t = 1 with the reported p and q at the root; `siblings`
  (`Tree.siblings`) is the layout's rule unless given.

  Where the walk accepted nothing the second token is drawn from the
  target's law after the first (what the next iteration's walk yields).
  """
  p, q = _law_tables('t1' if case == 'reported' else case)
  p_root, q_root = p[0], q[0]
  if case == 'reported':
    p_root, q_root = REPORTED_P, REPORTED_Q
  p2, q2 = p[1:], q[1:]
  seed = zlib.crc32(f'{layout}/{case}'.encode())
  tree, p_nodes = _law_tree(layout, p_root, q_root, p2, q2, N_SAMPLES, seed,
                            siblings or LAYOUTS[layout][0])
  out = _verify(jax.random.key(seed), tree, p_nodes, accept_rejected,
                wrong_update)
  n, path, next_token = (np.asarray(x) for x in out[:3])
  tokens = np.take_along_axis(np.asarray(tree.tokens), path, 1)
  after = _iid(np.random.default_rng(seed + 1), p2[next_token], 1)[:, 0]
  first = np.where(n >= 1, tokens[:, 0], next_token)
  second = np.where(n >= 2, tokens[:, 1], np.where(n == 1, next_token,
                                                   after))
  law = {(a, b): p_root[a] * p2[a, b] for a in range(LAW_VOCAB)
         for b in range(LAW_VOCAB)}
  return np.stack([first, second], 1), law, (n, path)


# (layout, case, Tree.siblings if not the layout's rule). Last: i.i.d.
# siblings verified without replacement are exact too (a repeat is
# skipped; a sibling that is not one is a draw from q'), though the
# with-replacement rule accepts more of them.
LAW_CASES = ([(layout, case, None) for layout in ('without', 'with')
              for case in list(LAW_CONFIGS) + ['reported']] +
             [('repeat', 'reported', None),
              ('with', 't1', verify_lib.WITHOUT)])


@pytest.mark.parametrize('layout, case, siblings', LAW_CASES,
                         ids=['-'.join(filter(None, c)) for c in LAW_CASES])
def test_verifier_law_on_hand_built_trees(layout, case, siblings):
  """The verifier is the exactness guarantee for any drafter, so its law
  is checked on trees no shipped drafter makes: repeated siblings (a
  repeat that the without-replacement rule cannot draw is skipped; an
  i.i.d. repeat is a draw), q = 0 siblings (skipped), and level-2 nodes
  whose parent may be rejected. The bound on total variation (0.02,
  `assert_matches`) is clear of the sampling noise of N_SAMPLES exact
  draws from each law (asserted, as for the sequence laws)."""
  samples, law, (n, path) = _verifier_law(layout, case, siblings)
  values = np.array(list(law.values()))
  noise = np.sqrt(2 * values * (1 - values) / (np.pi * N_SAMPLES)).sum() / 2
  assert noise < MAX_NOISE_TV
  assert_matches(samples, law)
  # Never under a rejected or skipped parent: each accepted node's parent
  # is the node accepted before it (the root first); skipped never taken.
  before = np.concatenate([np.zeros_like(path[:, :1]), path[:, :-1]], 1)
  accepted = np.arange(path.shape[1])[None] < n[:, None]
  assert np.all(np.where(accepted, LAW_PARENT[path] == before, True))
  assert not np.isin(path[accepted], LAYOUTS[layout][1]).any()
  # Every way through the tree happens: none, one and two accepted.
  assert set(np.unique(n)) == {0, 1, 2}


# Each fails the law test. 'wrong_update' (the walk before the sibling
# rules: the without-replacement update, a sibling with q' = 0 rejected,
# not skipped) under either rule: the reported repeat (the first token's
# law [.6, .2, .2]), and the t = 1 layouts. 'accept_rejected': a rejected
# sibling's subtree is reached. A Gumbel-top-k tree declared i.i.d.
# (`Tree.siblings` = WITH): the rule must be the drafter's.
BUG_CASES = {
    'repeat-reported-wrong_update': ('repeat', 'reported',
                                     {'wrong_update': True}),
    'without-wrong_update': ('without', 't1', {'wrong_update': True}),
    'with-wrong_update': ('with', 't1', {'wrong_update': True}),
    'with-accept_rejected': ('with', 't1', {'accept_rejected': True}),
    'without-declared-with': ('without', 't1',
                              {'siblings': verify_lib.WITH}),
}


@pytest.mark.parametrize('bug', list(BUG_CASES))
def test_planted_bugs_fail_the_verifier_law(bug):
  layout, case, kwargs = BUG_CASES[bug]
  samples, law, _ = _verifier_law(layout, case, **kwargs)
  with pytest.raises(AssertionError):
    assert_matches(samples, law)


def test_greedy_walk_takes_the_first_of_repeated_siblings():
  """Greedy accepts a node's FIRST child equal to the target's argmax (a
  repeat of it is never reached), and a node under a child that was not
  accepted is never reached, even where its token is the argmax there."""
  top = np.array([  # the target's argmax after each tree index
      [2, 5, 0, 0, 0, 3, 4, 0, 0],
      [4, 1, 1, 1, 2, 0, 0, 0, 5],
      [3, 1, 4, 1, 1, 0, 0, 2, 0],
      [5, 1, 1, 1, 1, 0, 0, 0, 0],
      [4, 1, 1, 1, 2, 0, 0, 0, 0],
  ], np.int32)
  tokens = np.array([
      [7, 2, 2, 3, 4, 1, 5, 5, 5],  # first 2 at 1, then 5 at 6
      [7, 2, 2, 3, 4, 1, 1, 1, 2],  # 4 at index 4, then its child 2
      [7, 2, 3, 3, 4, 1, 1, 1, 1],  # first 3 at 2; its child is not 4
      [7, 2, 2, 3, 4, 5, 5, 5, 5],  # nothing
      [7, 2, 2, 3, 4, 1, 1, 1, 1],  # 4 at 4, its child not 2; under the
  ], np.int32)                      # rejected index 1 a 1, its argmax
  tree = verify_lib.Tree(
      tokens=jnp.asarray(tokens), valid=jnp.ones(tokens.shape, bool),
      parent=jnp.asarray(np.broadcast_to(LAW_PARENT, tokens.shape),
                         jnp.int32),
      depth=jnp.zeros(tokens.shape, jnp.int32),
      levels=LAW_SHAPE.depth,
      q=jnp.zeros(tokens.shape + (0,), jnp.float32),
      top=jnp.zeros(tokens.shape, jnp.int32),
      verified=jnp.zeros(tokens.shape, jnp.int32))
  greedy = SamplingConfig(temperature=0.0)
  walk = jax.jit(lambda tree, top: verify_lib.verify_tree(
      jax.random.key(0), tree, top, LAW_SHAPE, greedy)[:3])
  n, path, next_token = map(np.asarray, walk(tree, jnp.asarray(top)))
  np.testing.assert_array_equal(n, [2, 2, 1, 0, 1])
  np.testing.assert_array_equal(path, [[1, 6], [4, 8], [2, 0], [0, 0],
                                       [4, 0]])
  np.testing.assert_array_equal(next_token, [4, 5, 4, 5, 2])
  with pytest.raises(ValueError, match='siblings'):
    walk(tree.replace(siblings='both'), jnp.asarray(top))


@pytest.mark.parametrize('spec', ['beam:3,2,4', 'static:0.0,0.1;0.0,0.1,1.0'])
def test_greedy_walk_equals_a_level_by_level_reference(spec):
  """The walk runs on every node at once; on random trees of a small
  vocabulary (repeated siblings, undrafted nodes and their subtrees, a
  drafter that agrees with the target half the time) it gives the level
  by level walk's path, next token and beta counts (tests/reference.py)."""
  shape = shape_lib.parse(spec)
  rng = np.random.default_rng(0)
  batch, width, vocab = 64, shape.width, 3
  parent = np.zeros((batch, width), np.int32)
  offsets = shape.offsets
  for d, level in enumerate(shape.levels, 1):
    for i, (p, _) in enumerate(level):
      parent[:, offsets[d] + i] = offsets[d - 1] + p
  valid = rng.random((batch, width)) < 0.85
  valid[:, 0] = True
  for s in range(1, width):  # a node under an undrafted one is undrafted
    valid[:, s] &= valid[np.arange(batch), parent[:, s]]
  tokens = rng.integers(0, vocab, (batch, width)) * valid
  target_top = rng.integers(0, vocab, (batch, width))
  top = np.where(rng.random((batch, width)) < 0.5, target_top,
                 rng.integers(0, vocab, (batch, width)))
  tree = verify_lib.empty(batch, shape, vocab, greedy=True).replace(
      tokens=jnp.asarray(tokens, jnp.int32), valid=jnp.asarray(valid),
      parent=jnp.asarray(parent), top=jnp.asarray(top, jnp.int32))
  n, path, next_token, accepted_at, beta_sum, beta_count = map(
      np.asarray, jax.jit(verify_lib.verify_tree, static_argnums=(3, 4))(
          jax.random.key(0), tree, jnp.asarray(target_top, jnp.int32),
          shape, SamplingConfig(temperature=0.0)))
  want = reference.reference_greedy_walk(tokens, valid, parent, top,
                                         target_top, shape.sizes)
  for got, expected in zip((n, path, next_token, beta_sum, beta_count),
                           want):
    np.testing.assert_array_equal(got, expected)
  np.testing.assert_array_equal(
      accepted_at, np.arange(shape.depth)[None] < want[0][:, None])
  assert 0 < want[0].mean() < shape.depth and want[0].max() >= 2


def test_drafter_finds_the_committed_path_among_its_fed_nodes(tiny_target):
  """`TreeDrafter.committed_path` (all fed nodes at once) against the
  level by level search it replaced: from the root, the first fed child
  of the current node whose token is the next committed one, while the
  row committed past that depth. Random fed trees over 2 tokens put the
  committed token under nodes off the path and on repeated siblings;
  rows without a tree (base -1) find nothing."""
  drafter = tree_drafter(tiny_target[0], 'static-beam:3,2,5')
  shape, depth = drafter.shape, drafter.shape.depth
  offsets = shape.fed_offsets + (shape.fed_width,)
  rng = np.random.default_rng(1)
  batch, width, length = 128, shape.fed_width, 16
  parent = np.zeros((batch, width), np.int32)
  for d in range(2, depth):  # each fed node's parent: one of the level's
    for i in range(offsets[d], offsets[d + 1]):
      parent[:, i] = rng.integers(offsets[d - 1], offsets[d], batch)
  tokens = rng.integers(0, 2, (batch, width))
  valid = rng.random((batch, width)) < 0.9
  sequences = rng.integers(0, 2, (batch, length))
  base = rng.integers(-1, 6, batch)
  lengths = np.maximum(base, 0) + rng.integers(1, 9, batch)
  state = tree_drafter_lib.TreeState(
      cache=None, tokens=jnp.asarray(tokens, jnp.int32),
      valid=jnp.asarray(valid), parent=jnp.asarray(parent),
      base=jnp.asarray(base, jnp.int32))
  path, m = map(np.asarray, jax.jit(drafter.committed_path, static_argnums=3)(
      state, jnp.asarray(sequences, jnp.int32), jnp.asarray(lengths, jnp.int32),
      depth))
  want_path = np.broadcast_to(np.arange(1, depth), path.shape).copy()
  want_m = np.zeros(batch, int)
  for b in range(batch):
    u = 0
    for d in range(1, depth):
      if base[b] < 0 or base[b] + d > lengths[b] - 2:
        break
      found = [i for i in range(offsets[d], offsets[d + 1])
               if parent[b, i] == u and valid[b, i] and
               tokens[b, i] == sequences[b, base[b] + d]]
      if not found:
        break
      u = want_path[b, d - 1] = found[0]
      want_m[b] += 1
  np.testing.assert_array_equal(m, want_m)
  np.testing.assert_array_equal(path, want_path)
  assert want_m.max() >= 3 and (want_m == 0).any()


# ---------------------------------------------------------------------------
# Shapes.
# ---------------------------------------------------------------------------


def test_best_tree_beats_chain_and_round_trips():
  probs = [0.7, 0.1, 0.05, 0.03]
  tree = shape_lib.best(probs, 32, 6)
  assert tree.nodes == 32 and tree.depth <= 6
  chain = shape_lib.chain(6)
  assert tree.expected_tokens(probs) > chain.expected_tokens(probs)
  # A chain's figure is the geometric sum.
  assert chain.expected_tokens([0.5]) == pytest.approx(
      sum(0.5 ** i for i in range(7)))
  assert shape_lib.parse(tree.spec) == tree
  dynamic = shape_lib.best(probs, 32, 6, dynamic=True)
  assert shape_lib.parse(dynamic.spec) == dynamic and dynamic.dynamic


def test_measured_rank_probs_made_nonincreasing_by_pooling():
  """Sampling noise puts a rare rank above the one before it; `best`
  takes non-increasing rates: the out-of-order ranks are pooled to their
  mean (the least-squares fit), the total kept, ordered rates untouched."""
  measured = [0.66, 0.12, 0.044, 0.041, 0.018, 0.012, 0.014, 0.008]
  fit = shape_lib.nonincreasing(measured)
  assert fit[:5] == measured[:5] and fit[7] == measured[7]
  assert fit[5] == fit[6] == pytest.approx(0.013)
  assert sum(fit) == pytest.approx(sum(measured))
  assert shape_lib.nonincreasing([0.2, 0.3, 0.4]) == pytest.approx([0.3] * 3)
  with pytest.raises(ValueError, match='non-increasing'):
    shape_lib.best(measured, 8, 3)
  assert shape_lib.best(fit, 8, 3).nodes == 8


def test_choose_spends_width_where_calls_are_free():
  probs = [0.75, 0.1, 0.05, 0.03]
  flat, _ = shape_lib.choose(probs, shape_lib.TreeCosts(lambda k: 1.0, 0.02),
                             max_nodes=40, max_depth=8)
  steep, _ = shape_lib.choose(
      probs, shape_lib.TreeCosts(lambda k: 1.0 + 0.25 * (k - 1), 0.02),
      max_nodes=40, max_depth=8)
  assert flat.nodes > steep.nodes


def test_choose_goes_shallower_where_levels_cost_more():
  """The GPU's measured case: a level of drafting cost ~0.32 ms where a
  1-token drafter step was assumed (0.09 ms), so a deep tree lost to the
  chain. On one hand-made profile (flat cost(k), t(1) 5 ms), a choice
  that ignored the level's time, or counted levels wrong, would pick the
  same depth for both; the one that prices them picks a shallower tree
  where levels cost more, and a depth-1 tree where only the root's
  children are ever accepted (per-depth rates)."""
  probs = [0.75, 0.1, 0.05, 0.03]
  profile = hardware.HardwareProfile.of_run(
      'flat', 1, 5e-3, {1: 1.0, 2: 1.0, 8: 1.0}, {})
  picked = {}
  for level_ms in (0.05, 0.32, 2.0):
    costs = shape_lib.TreeCosts.of_profile(profile, level_ms=level_ms)
    picked[level_ms], rate = shape_lib.choose(probs, costs, max_nodes=40,
                                              max_depth=10)
    shape = picked[level_ms]
    assert rate == pytest.approx(1e3 * shape.expected_tokens(probs) / (
        5.0 + shape.depth * level_ms))
  depths = [picked[x].depth for x in (0.05, 0.32, 2.0)]
  assert depths[0] > depths[1] > depths[2], depths
  only_root = [[0.9, 0.5, 0.2], [0.0]]
  shape, _ = shape_lib.choose(only_root, shape_lib.TreeCosts.of_profile(
      profile, level_ms=0.05), max_nodes=8, max_depth=4)
  assert shape.depth == 1 and shape.nodes == 3
  with pytest.raises(ValueError, match='level_ms, or level_launches'):
    shape_lib.TreeCosts.of_profile(profile, level_launches=42)


def _every_tree(max_nodes, max_depth):
  """Every `TreeShape` (static) with <= max_nodes nodes and depth <=
  max_depth: each node's children ranks 0..c-1, any c."""
  found = []

  def extend(levels, previous, used):
    if levels:
      found.append(shape_lib.TreeShape(tuple(levels)))
    if len(levels) == max_depth:
      return
    for counts in itertools.product(range(max_nodes - used + 1),
                                    repeat=previous):
      total = sum(counts)
      if 0 < total <= max_nodes - used:
        level = tuple((p, r) for p, c in enumerate(counts) for r in range(c))
        extend(levels + [level], total, used + total)

  extend([], 1, 0)
  return found


def test_choose_is_the_best_of_every_small_tree():
  """Where the answer is known by exhaustion: per-depth rates, a target
  whose cost jumps past 4 tokens and a level of 0.8 ms; the rate
  `choose` predicts is the best over every tree of <= 5 nodes and depth
  <= 3 (a search that missed a (nodes, depth) pair, priced the drafted
  width or a non-optimal `best` would fall short)."""
  probs = [[0.7, 0.2, 0.1], [0.5, 0.3], [0.4]]
  costs = shape_lib.TreeCosts(lambda k: 5.0 if k <= 4 else 7.0, 0.8)
  shape, rate = shape_lib.choose(probs, costs, max_nodes=5, max_depth=3,
                                 dynamic=False)
  rates = [1e3 * t.expected_tokens(probs) / costs.iteration_ms(t)
           for t in _every_tree(5, 3)]
  assert len(rates) > 50
  assert rate == pytest.approx(max(rates))
  assert shape.width <= 4  # the jump in cost(k) is not worth it here


def test_decoded_trees_compete_at_every_depth_at_their_own_level_cost():
  """Trees decoded (a dynamic beam's tokens per call no rank probability
  gives) are chosen by their decode's counts: at depth d, its tokens per
  call scaled by the tokens its iterations would have advanced accepting
  at most d drafts (here 30 tokens in 10 calls, 10 + 8 + 2 accepted
  beyond the first token: 2.0, 2.8, 3.0 a call), priced at the tree's own
  level time (the costs' levels here are so dear
  that a choice pricing the beam's levels alike would pick depth 1). The
  depth that wins moves with the level time; a static tree is cut to its
  first levels."""
  probs = [0.3, 0.1, 0.05]
  costs = shape_lib.TreeCosts(lambda k: 5.0, level_ms=100.0)
  picked = {}
  for level_ms in (0.5, 0.1):
    beam = shape_lib.MeasuredTree('beam:8,16,3/64', [10, 8, 2], 10, 30,
                                  level_ms)
    static = shape_lib.MeasuredTree('static:0.0,0.1;0.0', [10, 0], 10, 20, 0.1)
    shape, rate = shape_lib.choose(probs, costs, max_nodes=64, max_depth=3,
                                   measured=[static, beam])
    rates = {d: 1e3 * t / (5.0 + d * level_ms)
             for d, t in ((1, 2.0), (2, 2.8), (3, 3.0))}
    picked[level_ms] = max(rates, key=rates.get)
    assert shape == shape_lib.parse(f'beam:8,16,{picked[level_ms]}/64')
    assert rate == pytest.approx(max(rates.values()))
  assert picked == {0.5: 2, 0.1: 3}
  # Without the beam: a rank-built tree of one level.
  assert shape_lib.choose(probs, costs, max_nodes=64, max_depth=3)[0].depth == 1
  assert shape_lib.filled_beams(64, 12, 8) == ('beam:8,8,12/64',
                                               'beam:8,16,12/64')
  assert shape_lib.filled_beams(6, 3, 8) == ('beam:6,6,3/6',)
  # Where the static tree's second level is never accepted, its
  # first level alone yields as much for less: the cut chosen.
  static = shape_lib.MeasuredTree('static:0.0,0.1;0.0', [10, 0], 10, 20, 0.1)
  assert shape_lib.choose(probs, costs, measured=[static])[0] == (
      shape_lib.parse('static:0.0,0.1'))
  # A cut decoded whole is weighed by its own counts, not the estimate:
  # beam:8,16,2/64 estimated at 2.8 a call (the winner above at 0.5 ms a
  # level), decoded at 2.4 it loses to the whole beam.
  beam = shape_lib.MeasuredTree('beam:8,16,3/64', [10, 8, 2], 10, 30, 0.5)
  cut = shape_lib.MeasuredTree('beam:8,16,2/64', [10, 4], 10, 24, 0.5)
  top = shape_lib.best_candidate(probs, costs, 64, 3, measured=[beam, cut])
  assert top.spec == 'beam:8,16,3/64' and top.measured and top.source is beam
  weighed = shape_lib.candidates(probs, costs, 64, 3, measured=[beam, cut])
  assert [c.tokens for c in weighed if c.spec == 'beam:8,16,2/64'] == [2.4]
  assert not [c for c in weighed if c.spec == 'beam:8,16,1/64'][0].measured
  with pytest.raises(ValueError, match='one count a level'):
    shape_lib.MeasuredTree('beam:8,16,3/64', [10, 8], 10, 30, 0.5)


@pytest.mark.parametrize('spec, message', [
    ('bush:3', 'Unknown tree spec'),
    ('beam:3,2', 'Bad tree spec'),
    ('static:0.1', 'ranks 0, 1'),
    ('static:0.0;1.0', 'parent 1 outside'),
    ('beam:2,2,3/x', 'Bad tree spec'),
    ('beam:2,2,3/-1', 'top must be an int >= 0'),
])
def test_bad_tree_specs_are_named(spec, message):
  with pytest.raises(ValueError, match=message):
    shape_lib.parse(spec)


def test_gamma_above_the_tree_depth_is_refused(greedy_setup):
  model, params, enc, _ = greedy_setup
  with pytest.raises(ValueError, match='gamma=5 > 3'):
    speculative.speculative_sample(
        model, params, tree_drafter(model, 'beam:2,2,3'), params, enc,
        gamma=5, max_decode_len=MAX_LEN, eos_id=EOS)


def test_tree_with_more_children_than_tokens_is_refused(tiny_target):
  model, _, _ = tiny_target  # 6 tokens
  with pytest.raises(checks.InputError, match=r'^the tree \(2 levels of '
                     r'\[7, 7\] slots\) gives a node 7 children; the '
                     r'vocabulary has 6 tokens\.$'):  # not its whole spec
    tree_drafter(model, 'beam:7,1,2')


def test_tree_drafter_refuses_arguments_of_another_type():
  """A spec string where the shape goes (`DraftSource.tree` takes one) and
  a model where its T5Drafter goes are refused when built, by name, not
  with an AttributeError at the check or deep inside the first decode."""
  model = network.T5Model(TINY_V11)  # constructed only: no params
  base = drafters.T5Drafter(model)
  with pytest.raises(checks.InputError, match=(
      r"^TreeDrafter shape must be a TreeShape, e\.g\. tree\.shape\.parse"
      r"\('beam:4,2,8'\), got 'beam:2,2,3'\.$")):
    tree_lib.TreeDrafter(base, 'beam:2,2,3')
  with pytest.raises(checks.InputError, match=(
      r'^TreeDrafter base must be a T5Drafter, .*, got a T5Model\.$')):
    tree_lib.TreeDrafter(model, shape_lib.parse('beam:2,2,3'))


def test_eval_setup_checks_the_tree_option():
  config = TINY_V11
  common = dict(target_config=config, target_checkpoint=None,
                data=loading.DataSpec('t', {'inputs': 8, 'targets': 8}))
  tree = loading.DrafterSpec('tree', config=config, tree='beam:2,2,3')
  setup = loading.EvalSetup(gamma=3, draft=tree, **common)
  assert setup.settings()['tree'] == 'beam:2,2,3'
  assert setup.replace(tree='beam:2,2,4').draft.tree_shape == (
      shape_lib.parse('beam:2,2,4'))
  with pytest.raises(ValueError, match="drafter 't5' does not draft trees"):
    loading.DrafterSpec(config=config, tree='beam:2,2,3')
  with pytest.raises(ValueError, match='gamma 4 is deeper than the tree'):
    loading.EvalSetup(gamma=4, draft=tree, **common)
  with pytest.raises(ValueError, match="Unknown tree spec 'bush'"):
    tree.replace(tree='bush')


def test_best_nodes_verifies_an_ancestor_closed_top_set():
  """Re-ranking keeps the root and the m - 1 most probable nodes, parents
  before children, and the target's call is on exactly those tokens."""
  shape = shape_lib.parse('static-beam:3,3,3')
  rng = np.random.default_rng(0)
  tree = tree_lib.verify.empty(2, shape, 8)
  parent = np.zeros((2, shape.width), np.int32)
  score = np.zeros((2, shape.width), np.float32)
  for d in range(1, shape.depth + 1):
    pick, _ = tree_lib.verify.children_of(shape, d)
    lo, prev = shape.offsets[d], shape.offsets[d - 1]
    for j, pj in enumerate(np.asarray(pick)):
      parent[:, lo + j] = prev + pj
      score[:, lo + j] = score[:, prev + pj] - rng.exponential(1.0, 2)
  tree = tree.replace(
      tokens=jnp.asarray(rng.integers(1, 8, (2, shape.width)), jnp.int32),
      valid=jnp.ones((2, shape.width), bool), parent=jnp.asarray(parent))
  pruned = jax.jit(grow_lib.best_nodes, static_argnums=2)(
      tree, jnp.asarray(score), 6)
  chosen = np.asarray(pruned.verified)
  for row in range(2):
    want = [0] + sorted(np.argsort(-score[row, 1:])[:5] + 1)
    np.testing.assert_array_equal(chosen[row], want)
    assert all(parent[row, i] in chosen[row] for i in chosen[row][1:])
    assert np.asarray(pruned.valid)[row].sum() == 6
  tokens, mask = pruned.verified_call(jnp.zeros((2,), jnp.int32))
  assert tokens.shape == (2, 6)
  np.testing.assert_array_equal(
      tokens, np.take_along_axis(np.asarray(tree.tokens), chosen, 1))
  every = np.asarray(tree_lib.verify.ancestors(tree.parent, shape.depth))
  np.testing.assert_array_equal(  # ancestors among the verified tokens
      mask.visible, every[np.arange(2)[:, None, None], chosen[:, :, None],
                          chosen[:, None]])
