"""alpha as measured for the reproductions (measure.py, drafters' `score`).

alpha = E[sum_x min(p, q)] is what the paper's Table 3 reports and what the
gamma choice of Table 2 rests on, so the teacher-forced measurement must agree
with what the drafter really proposes (tests/drafters/test_drafters.py checks, for
every drafter kind, that `score` is what `propose` drafts from) and with the
acceptance the speculative loop itself observes.
"""

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import speculative
from specdec_jax.drafters.tree import grow
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.sampling import SamplingConfig

from test_speculative import perturbed

MAX_LEN = 16


@pytest.fixture(scope='module')
def setup(v11):
  model, params = v11
  enc = np.random.default_rng(0).integers(2, model.vocab_size, (8, 10))
  enc[3, 6:] = 0
  # n-grams of the target's own outputs on other inputs, so they agree often.
  other = np.random.default_rng(1).integers(2, model.vocab_size, (32, 10))
  out = decoding.temperature_sample(model, params, other,
                                    max_decode_len=MAX_LEN, eos_id=68)
  ngram = drafters.ngram_params(
      [t[:n] for t, n in zip(np.asarray(out.tokens), np.asarray(out.lengths))],
      model.vocab_size, 2, top_k=8)
  return model, params, enc, {
      't5': (drafters.T5Drafter(model), perturbed(params, 0.3, 0)),
      'bigram': (drafters.NgramDrafter(model.vocab_size, 2), ngram),
  }


def test_alpha_of_the_target_itself_is_one(setup):
  model, params, enc, _ = setup
  for temperature in (0.0, 1.0):
    out = measure.alpha(model, params, drafters.T5Drafter(model), params, enc,
                        sampling=SamplingConfig(temperature),
                        max_decode_len=MAX_LEN, rng=jax.random.key(1),
                        eos_id=68)
    np.testing.assert_allclose(out['alpha'], 1.0, atol=1e-5)
    assert out['positions'] == int(out['lengths'].sum())


@pytest.mark.parametrize('name', ['t5', 'bigram'])
def test_greedy_alpha_is_the_argmax_agreement_rate(setup, name):
  model, params, enc, ds = setup
  drafter, dparams = ds[name]
  out = measure.alpha(model, params, drafter, dparams, enc,
                      sampling=SamplingConfig(), max_decode_len=MAX_LEN,
                      eos_id=68)
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=MAX_LEN, eos_id=68)
  tokens = np.asarray(base.tokens)
  dec_in = np.pad(tokens, ((0, 0), (1, 0)))[:, :-1]
  guess = np.asarray(jax.jit(drafter.score)(
      dparams, jnp.asarray(enc), jnp.asarray(dec_in))).argmax(-1)
  agree = [guess[i, :n] == tokens[i, :n]
           for i, n in enumerate(np.asarray(base.lengths))]
  expected = np.concatenate(agree).mean()
  assert 0.05 < expected < 0.95  # neither trivial case
  assert out['alpha'] == pytest.approx(expected, abs=1e-6)


def test_rank_probs_count_the_ranks_of_the_output_tokens(setup):
  """`measure.rank_probs`: the share of output positions (through EOS)
  where the token is the drafter's rank-r candidate, against numpy's ranks
  of the same teacher-forced logits; rank 0 is the greedy alpha. A second
  call (other rows, same shapes) compiles nothing."""
  model, params, enc, ds = setup
  drafter, dparams = ds['t5']
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=MAX_LEN, eos_id=68)
  tokens, lengths = np.asarray(base.tokens), np.asarray(base.lengths)
  got = measure.rank_probs(drafter, dparams, enc, tokens, lengths,
                           max_rank=4, batch_size=4)
  dec_in = np.pad(tokens, ((0, 0), (1, 0)))[:, :-1]
  logits = np.asarray(drafter.score(dparams, jnp.asarray(enc),
                                    jnp.asarray(dec_in)))
  mine = np.take_along_axis(logits, tokens[..., None], -1)
  ranks = np.concatenate([(logits[i, :n] > mine[i, :n]).sum(-1)
                          for i, n in enumerate(lengths)])
  want = np.bincount(ranks, minlength=4)[:4] / ranks.size
  assert 0.05 < want[0] < 0.95 and want[1] > 0  # neither trivial case
  np.testing.assert_allclose(got, want, atol=1e-9)
  size = measure._score_ranks.cache_size()  # pylint: disable=protected-access
  measure.rank_probs(drafter, dparams, enc[::-1], tokens[::-1],
                     lengths[::-1], max_rank=4, batch_size=4)
  assert measure._score_ranks.cache_size() == size  # pylint: disable=protected-access


def test_alpha_agrees_with_the_speculative_loop(setup):
  """At t=1 the loop's own beta statistics estimate the same alpha."""
  model, params, _, ds = setup
  drafter, dparams = ds['t5']
  enc = np.random.default_rng(5).integers(2, model.vocab_size, (64, 10))
  sampling = SamplingConfig(temperature=1.0)
  measured = measure.alpha(model, params, drafter, dparams, enc,
                           sampling=sampling, max_decode_len=MAX_LEN,
                           rng=jax.random.key(2), eos_id=68)
  out = speculative.speculative_sample(
      model, params, drafter, dparams, enc, gamma=3, max_decode_len=MAX_LEN,
      sampling=sampling, eos_id=68, rng=jax.random.key(3))
  loop = float(out.stats.beta_sum.sum() / out.stats.beta_count.sum())
  betas = measured['betas']
  se = betas.std() / np.sqrt(len(betas))
  assert 0.2 < measured['alpha'] < 0.98
  # Two independent estimates of one mean; ~4 standard errors each side.
  assert abs(measured['alpha'] - loop) < 6 * se + 0.01, (measured, loop, se)


def test_widened_target_has_the_same_alpha(setup):
  from specdec_jax import widening  # pylint: disable=g-import-not-at-top
  model, params, enc, ds = setup
  wide_params, wide_config = widening.widen_to(
      params, model.config, {'emb_dim': 48, 'mlp_dim': 96})
  wide = network.T5Model(wide_config)
  drafter, dparams = ds['t5']
  a = measure.alpha(model, params, drafter, dparams, enc,
                    sampling=SamplingConfig(), max_decode_len=MAX_LEN)
  b = measure.alpha(wide, wide_params, drafter, dparams, enc,
                    sampling=SamplingConfig(), max_decode_len=MAX_LEN)
  assert a['alpha'] == b['alpha']
  np.testing.assert_array_equal(a['lengths'], b['lengths'])


def test_time_alternating_flips_the_order_and_keeps_the_last_results():
  """A B, B A, A B: drift hits both calls alike; medians per name."""
  order = []
  calls = {name: (lambda name=name: order.append(name) or len(order))
           for name in ('a', 'b')}
  results, seconds = measure.time_alternating(calls, repeats=3)
  assert order == ['a', 'b', 'b', 'a', 'a', 'b']
  assert results == {'a': 5, 'b': 6}
  assert set(seconds) == {'a', 'b'} and min(seconds.values()) >= 0
  order.clear()
  measure.time_alternating(calls, repeats=2, reverse=True)
  assert order == ['b', 'a', 'a', 'b']
  with pytest.raises(ValueError, match='repeats'):
    measure.time_alternating(calls, repeats=0)


def test_whose_clock_ends_the_doubling_is_decided_by_the_job():
  """`loop_time` doubles n until this process's clock says a loop is long
  enough; inside `decided_by(agree)` the stop is `agree`'s (on a mesh
  spanning processes, process 0's: each clock would stop at its own n and
  the processes would call different programs)."""
  ns = []
  run = lambda n: ns.append(n) or 0  # instant: the clock never says stop
  asked = []
  with measure.decided_by(lambda stop: asked.append(stop) or len(asked) == 3):
    measure.loop_time(run, 2, repeats=1, min_seconds=60.0)
  assert asked == [False, False, False]  # this clock's, overruled
  assert ns == [2, 2, 4, 8, 8]  # compile, three checks, the timed repeat
  ns.clear()
  measure.loop_time(run, 1 << 15, repeats=1, min_seconds=60.0)  # own clock
  assert ns == [1 << 15, 1 << 15, 1 << 16, 1 << 16]  # stops at the cap


def test_step_bytes_is_the_decoder_weights_and_the_caches_it_reads():
  """The floor's numerator, against the arrays a real cache holds."""
  config = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2,
                            num_encoder_layers=1, num_decoder_layers=3,
                            head_dim=4, mlp_dim=24, dtype='float32')
  model = network.T5Model(config)
  params = jax.eval_shape(model.init_params, jax.random.key(0))
  inputs = jnp.ones((2, 5), jnp.int32)
  cache = jax.eval_shape(lambda p, x: model.init_cache(p, x, 7), params,
                         inputs)
  kv = sum(x.size * x.dtype.itemsize for x in
           cache.self_key + cache.self_value + cache.cross_key +
           cache.cross_value)
  weights = sum(x.size * x.dtype.itemsize
                for x in jax.tree_util.tree_leaves(params['decoder']))
  assert measure.step_bytes(model, params, 2, 7, 5) == weights + kv
  # The embedding table is read one row per token: not counted.
  assert 'token_embedder' not in params['decoder']


# Level 1: 3 nodes, 2 of them get children (fed); level 2: 3 nodes, 1 fed;
# level 3: 1 node. Fed counts differ per level, so a level timed with
# another level's (or the tree's) width is a different program.
UNEVEN_TREE = 'static:0.0,0.1,0.2;0.0,0.1,1.0;2.0'


def test_a_tree_level_is_the_call_grow_makes_at_that_level(setup):
  """`tree_level_call` gives the drafter call `grow.grow` makes once a
  level is drawn: that level's fed nodes (not the tree's width), under
  the mask grow builds of the nodes called so far, the root at slot
  `context` and the level after the nodes before it."""
  model, params, enc, _ = setup
  tree = drafters.TreeDrafter(drafters.T5Drafter(model),
                              shape_lib.parse(UNEVEN_TREE))
  context, vocab = 4, model.vocab_size
  root = jnp.full((1,), 5, jnp.int32)
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(1, vocab)))
  shapes = []  # each call's tokens, recorded as grow is traced

  @jax.jit
  def masks(logits):
    calls = []

    def expand(carry, tokens, parent, mask_of):
      del parent
      shapes.append(tokens.shape)
      calls.append(mask_of(jnp.full((1,), context)))
      return jnp.asarray(np.random.default_rng(len(calls)).normal(
          size=tokens.shape + (vocab,))), carry

    grow.grow(tree.shape, SamplingConfig(), root, logits, expand, None,
              jax.random.key(0))
    return calls

  calls = masks(logits)
  assert shapes == [(1, 2), (1, 1)]
  for level, (shape, mask) in enumerate(zip(shapes, calls), 1):
    tokens, cache, ours = measure.tree_level_call(
        tree, params, enc[:1], level, context=context, jit_setup=True)
    assert tokens.shape == shape
    assert int(cache.position[0]) == context + tree.shape.fed_offsets[level]
    for field in ('base', 'depth', 'visible'):
      np.testing.assert_array_equal(getattr(ours, field),
                                    getattr(mask, field), err_msg=field)
  with pytest.raises(ValueError, match='level 3 outside 1..2'):
    measure.tree_level_call(tree, params, enc[:1], 3)


def test_tree_level_time_times_each_level_as_requested(setup, monkeypatch):
  """The mean over levels times every level's own call (its width and
  slot), one level only that level's. Timings are only sane here, never
  claims."""
  model, params, enc, _ = setup
  tree = drafters.TreeDrafter(drafters.T5Drafter(model),
                              shape_lib.parse(UNEVEN_TREE))
  real, entries, runs = measure.repeated_levels, [], []

  class Spy:

    def entry(self, args):
      entries.append(args)
      fn = real.entry(args)

      def run(model, params, tokens, cache, mask, k, n):
        runs.append((tokens.shape, int(cache.position[0]), mask.size, k))
        return fn(model, params, tokens, cache, mask, k, n)
      return run

  monkeypatch.setattr(measure, 'repeated_levels', Spy())
  seconds = measure.tree_level_time(tree, params, enc[:1], repeats=1,
                                    n_calls=2, context=4, jit_setup=True)
  assert math.isfinite(seconds) and 0 < seconds < 10  # a call's seconds
  assert entries == [(params,)]
  # (nodes, the level's first slot: context + fed offset, fed width, k).
  assert set(runs) == {((1, 2), 5, 4, 3), ((1, 1), 7, 4, 3)}
  runs.clear()
  measure.tree_level_time(tree, params, enc[:1], 2, repeats=1, n_calls=2,
                          context=4, jit_setup=True)
  assert set(runs) == {((1, 1), 7, 4, 3)}
  with pytest.raises(ValueError, match='has one level'):
    measure.tree_level_time(drafters.TreeDrafter(
        drafters.T5Drafter(model), shape_lib.parse('chain:1')), params,
                            enc[:1])


def test_other_load_counts_other_processes_not_this_one(monkeypatch):
  """`OtherLoad` reads what every process and this one used (here
  scripted: 4 CPU s of all, 2 of them this process's, over 2 s): 2 CPU s
  of others. A real busy process beside a waiting one: at least half a
  core of its second counted (the suite's other workers only add)."""
  readings = iter([(10.0, 100.0, 3.0), (12.0, 104.0, 5.0)])
  monkeypatch.setattr(measure, '_cpu_seconds', lambda: next(readings))
  with measure.OtherLoad() as load:
    pass
  assert (load.cpu_s, load.seconds) == (2.0, 2.0)
  monkeypatch.undo()
  if measure._cpu_seconds() is None:  # pylint: disable=protected-access
    pytest.skip('no /proc/stat here (not Linux): OtherLoad reads nothing '
                'and the job records no load; its arithmetic ran above')
  with measure.OtherLoad() as load:
    subprocess.run([sys.executable, '-c', 'import time\nt = time.time()\n'
                    'while time.time() - t < 1.0: pass'], check=True)
  assert load.seconds >= 1.0 and load.cpu_s >= 0.5, (load.cpu_s,
                                                      load.seconds)


def test_the_jobs_own_processes_are_not_other_load(monkeypatch):
  """Inside `job_processes(pids)` the CPU of those processes (the job's
  others on this machine) is the job's, not other work: scripted, 4 CPU s
  of all, 1 of this process, 2 of a peer -> 1 of others (3 outside).
  `_process_cpu_seconds` reads a process's CPU from /proc/<pid>/stat:
  this one's as `os.times` counts it."""
  readings = iter([(10.0, 100.0, 3.0), (12.0, 104.0, 4.0)] * 2)
  monkeypatch.setattr(measure, '_cpu_seconds', lambda: next(readings))
  peer = iter([7.0, 9.0])
  monkeypatch.setattr(measure, '_process_cpu_seconds',
                      lambda pids: next(peer) if pids == (123,) else 0.0)
  with measure.job_processes([123]):
    with measure.OtherLoad() as load:
      pass
  assert load.cpu_s == 1.0
  with measure.OtherLoad() as load:
    pass
  assert load.cpu_s == 3.0
  monkeypatch.undo()
  if not os.path.exists(f'/proc/{os.getpid()}/stat'):
    pytest.skip('no /proc here (not Linux): OtherLoad reads no process\'s '
                'CPU and the job records no load; the scripted arithmetic '
                'ran above, the /proc read needs Linux')
  own = lambda: sum(os.times()[:2])
  before, read, after = own(), measure._process_cpu_seconds(  # pylint: disable=protected-access
      [os.getpid(), 2 ** 22 + 1]), own()  # the second: no such process
  assert before - 0.05 <= read <= after + 0.05


def test_the_summary_says_how_busy_other_processes_kept_the_machine():
  """Pooled over the timed units (CPU s over wall s), and a warning only
  above `measure.BUSY_CORES` across at least a second; None where no unit
  knows (records of a run before this, or not Linux)."""
  from specdec_jax import summary  # pylint: disable=g-import-not-at-top
  quiet = summary.timing_load([[0.1, 2.0], [0.1, 2.0]])
  assert quiet['other_load_cores'] == pytest.approx(0.05)
  assert quiet['timing_warning'] is None
  busy = summary.timing_load([[0.1, 2.0], [3.9, 2.0], None])
  assert busy['other_load_cores'] == pytest.approx(1.0)
  assert 'other processes kept 1.00 of' in busy['timing_warning']
  assert summary.timing_load([[0.5, 0.5]])['timing_warning'] is None
  assert summary.timing_load([None, None]) == {
      'other_load_cores': None, 'timing_warning': None}
