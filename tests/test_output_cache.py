"""The output cache (store, persistence, retrieval) and adaptive drafting.

The registry suite (tests/drafters/test_drafters.py) checks the 'cache' and
'combined' kinds' exactness like every kind; here:

- the store: build, save, reload, append, and a clear error for a corrupt,
  truncated, foreign or missing file;
- retrieval: a near-repeat of a cached request retrieves it, and the cache
  drafter then drafts the cached output from the first token on;
- adaptive draft lengths (q = 0 marks an undrafted position): greedy output
  unchanged, fewer drafts and fewer drafter calls, and the sampled law still
  the target's (chi-square, as tests/test_speculative.py);
- the combined drafter skips its model where every row copies.

Run alone: `python -m pytest -q tests/test_output_cache.py`.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import output_cache
from specdec_jax import partitioning
from specdec_jax import run_folder
from specdec_jax import speculative
from specdec_jax.sampling import SamplingConfig

from test_speculative import EOS
from test_speculative import MAX_LEN
from test_speculative import N_SAMPLES
from test_speculative import SAMPLING_CASES
from test_speculative import SEQ_LEN
from test_speculative import SMALL_EOS
from test_speculative import assert_matches
from test_speculative import exact_sequence_distribution
from test_speculative import perturbed
from test_speculative import sample_optimized
from test_speculative import tiny_target  # pylint: disable=unused-import

GAMMA = 3


@pytest.fixture(scope='module')
def store_setup(v11):
  """12 random requests with random outputs, in a store."""
  model, params = v11
  rng = np.random.default_rng(0)
  inputs = rng.integers(2, model.vocab_size, (12, 10)).astype(np.int32)
  outputs = [list(rng.integers(2, model.vocab_size, n)) + [EOS]
             for n in rng.integers(3, 9, 12)]
  store = output_cache.from_pairs(model, params, zip(inputs, outputs), 10,
                                  MAX_LEN)
  return model, params, inputs, outputs, store


def test_a_cache_is_seeded_from_the_train_data_there_is(v11, monkeypatch,
                                                       capsys):
  """A new cache is seeded with the task's train pairs where it has them;
  a task without a train split, or whose data dir lacks its file, starts
  it empty and says why; a train split that cannot be read as it should
  (a refused row) ends the job, not met as an empty cache."""
  import types  # pylint: disable=g-import-not-at-top
  from specdec_jax import data  # pylint: disable=g-import-not-at-top
  from specdec_jax import loading  # pylint: disable=g-import-not-at-top
  model, params = v11
  setup = types.SimpleNamespace(
      draft=loading.DrafterSpec(kind='cache'), data=types.SimpleNamespace(
          task_feature_lengths={'inputs': 10, 'targets': MAX_LEN}))

  def train_pairs(task, limit):
    del limit
    if isinstance(task.reads, Exception):
      raise task.reads
    return task.reads

  monkeypatch.setattr(data, 'train_pairs', train_pairs)

  def seeded(splits, reads):
    task = types.SimpleNamespace(splits=splits, reads=reads)
    return len(loading.load_store(setup, task, model, params))

  assert seeded(('train',), [([5, 6, EOS], [7, EOS])] * 3) == 3
  assert seeded(('test',), [([5, 6, EOS], [7, EOS])] * 3) == 0
  assert seeded(('train',), FileNotFoundError('train.jsonl is missing')) == 0
  assert capsys.readouterr().out.endswith(
      'no train pairs to seed it from (train.jsonl is missing)\n'
      'output cache: it starts empty and grows with the outputs.\n')
  with pytest.raises(checks.InputError, match='holds 3 rows'):
    seeded(('train',), checks.InputError('x.npz holds 3 rows of inputs'))


@pytest.mark.parametrize('where', ['local', 'gs'])
def test_store_saves_reloads_and_appends(store_setup, tmp_path, where,
                                         request):
  model, params, inputs, outputs, store = store_setup
  path = (str(tmp_path) if where == 'local' else
          request.getfixturevalue('gcs')) + '/sub/cache.npz'
  store.save(path)
  fp = output_cache.fingerprint(model.config, params)
  again = output_cache.OutputCache.open(path, model, params, MAX_LEN)
  np.testing.assert_array_equal(again.keys, store.keys)
  np.testing.assert_array_equal(again.outputs, store.outputs)
  assert again.embedder == fp and len(again) == 12
  assert list(again.outputs[3, :len(outputs[3])]) == outputs[3]
  again.add_requests(model, params, inputs[:2], [[5, 6, EOS], [7, EOS]])
  again.save()
  grown = output_cache.OutputCache.load(path)
  assert len(grown) == 14
  assert list(grown.outputs[13, :3]) == [7, EOS, 0]
  # The appended request's key is the one its near-twin (entry 1) has.
  np.testing.assert_allclose(grown.keys[13], grown.keys[1], atol=1e-6)
  if where == 'local':  # what would grow it wrong is refused, by name
    for call, said in (  # before: reshaped to fit; nothing added; clamped
        (lambda: grown.add(np.ones((2, 2 * grown.dim)), [[5, 1]] * 4),
         r'keys must be \[outputs, dim\] = \(4, '),
        (lambda: grown.add(np.full((1, grown.dim), np.nan), [[5, 1]]),
         'keys must be finite'),
        (lambda: grown.add_requests(model, params, inputs[:2], [[5]] * 2,
                                    batch_size=-1),
         'batch_size must be an int >= 1, got -1'),
        (lambda: grown.add_requests(model, params, inputs[:2] + 10**4,
                                    [[5]] * 2), 'inputs must be token ids')):
      with pytest.raises(checks.InputError, match=said):
        call()
    assert len(grown) == 14
    for call, said in (  # before: numpy's pad_width error; -805 bytes
        (lambda: grown.device_params(4.0), 'capacity must be an int >= 14'),
        (lambda: grown.nbytes(-5), 'capacity must be an int >= 14'),
        (lambda: output_cache.retrieve(grown.device_params(), jnp.zeros(
            (1, grown.dim)), 100), r'k must be an int in \[1, capacity=64\]'),
        (lambda: output_cache.OutputCache.for_model(model, params, -1),
         'output_length must be an int >= 1, got -1')):
      with pytest.raises(checks.InputError, match=said):
        call()


def test_a_commit_cut_short_at_gs_is_rolled_forward_or_discarded(
    store_setup, tmp_path, gcs):
  """`run_folder.CacheCommit` for a cache file at a gs:// address: a
  crash after the unit's records (all its indices recorded) moves the
  staged cache into place; one before them deletes it, the file as it
  was."""
  *_, store = store_setup
  path = f'{gcs}/cache.npz'
  store.save(path)
  commit = run_folder.CacheCommit(tmp_path, path)
  grown = dataclasses.replace(store, keys=store.keys[:5],
                              outputs=store.outputs[:5])
  commit.stage(grown, [7, 8])  # then the crash
  assert commit.recover({7}) == 'discarded'
  assert len(output_cache.OutputCache.load(path)) == 12
  assert not checkpoints.isfile(commit.staged)
  commit.stage(grown, [7, 8])
  assert commit.recover({7, 8, 9}) == 'rolled forward'
  assert len(output_cache.OutputCache.load(path)) == 5
  assert checkpoints.list_files(gcs) == ['cache.npz']
  assert not commit.intent.exists()


def test_bad_cache_files_are_named(store_setup, tmp_path):
  model, params, _, _, store = store_setup
  path = str(tmp_path / 'cache.npz')
  with pytest.raises(output_cache.OutputCacheError, match='does not exist'):
    output_cache.OutputCache.load(path)
  store.save(path)
  data = open(path, 'rb').read()
  with open(path, 'wb') as f:
    f.write(data[:len(data) // 2])  # truncated
  with pytest.raises(output_cache.OutputCacheError, match='corrupt'):
    output_cache.OutputCache.open(path, model, params, MAX_LEN)
  with open(path, 'wb') as f:
    f.write(b'not a zip at all')
  with pytest.raises(output_cache.OutputCacheError, match='corrupt'):
    output_cache.OutputCache.load(path)
  store.save(path)
  with pytest.raises(output_cache.OutputCacheError, match='vocab_size'):
    output_cache.OutputCache.load(path, vocab_size=model.vocab_size + 1)
  other = perturbed(params, 0.1, 1)
  with pytest.raises(output_cache.OutputCacheError, match='another model'):
    output_cache.OutputCache.open(path, model, other, MAX_LEN)
  with pytest.raises(output_cache.OutputCacheError, match='output_length'):
    output_cache.OutputCache.open(path, model, params, MAX_LEN + 1)
  # One array (.npy) and a meta without the vocabulary: named as not a
  # cache (before: a TypeError of np.load's, a KeyError).
  np.save(tmp_path / 'one.npy', np.zeros(3))
  with pytest.raises(output_cache.OutputCacheError, match='not a cache'):
    output_cache.OutputCache.load(str(tmp_path / 'one.npy'))
  with np.load(path) as f:
    arrays = dict(f)
  meta = json.loads(bytes(arrays['meta']).decode())
  del meta['vocab_size']
  arrays['meta'] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
  np.savez(tmp_path / 'lacks.npz', **arrays)
  with pytest.raises(output_cache.OutputCacheError, match=(
      r"its meta lacks \['vocab_size'\]")):
    output_cache.OutputCache.load(str(tmp_path / 'lacks.npz'))


def test_near_repeat_retrieves_the_planted_entry_and_drafts_its_output(
    store_setup):
  model, params, inputs, outputs, store = store_setup
  near = inputs[[5, 9]].copy()
  near[:, 4] = 3  # one token changed: a near-repeat
  queries = jax.jit(output_cache.embed, static_argnums=0)(model, params, near)
  index, ok = output_cache.retrieve(store.device_params(), queries, 4)
  assert ok.all() and list(np.asarray(index[:, 0])) == [5, 9]
  drafter = drafters.CacheDrafter(model.vocab_size, eos_id=EOS,
                                  embedder=model)
  dparams = store.device_params()  # the target's params: the loop's to give
  drafter.check_params(dparams)
  with pytest.raises(ValueError, match="embeds requests with the target's"):
    drafter.init(dparams, jnp.asarray(near), MAX_LEN)
  dparams = speculative.with_target(drafter, dparams, params)
  assert dparams['embedder'] is params
  state = jax.jit(drafter.init, static_argnums=2)(
      dparams, jnp.asarray(near), MAX_LEN)
  sequences = jnp.zeros((2, MAX_LEN), jnp.int32)  # BOS only
  drafts, q, _ = jax.jit(drafter.propose, static_argnums=(4, 5))(
      dparams, state, sequences, jnp.ones((2,), jnp.int32), GAMMA,
      SamplingConfig(), jax.random.key(0))
  for row, entry in enumerate([5, 9]):
    assert list(np.asarray(drafts[row])) == outputs[entry][:GAMMA]
  assert (np.asarray(q).max(-1) == 1).all()
  # Keys of another width are refused before anything is traced.
  bad = dict(dparams, keys=dparams['keys'][:, :4])
  with pytest.raises(ValueError, match='another model'):
    drafter.check_params(bad)


@pytest.fixture(scope='module')
def greedy_base(v11):
  model, params = v11
  enc = np.random.default_rng(3).integers(2, model.vocab_size, (4, 12))
  enc[1, 8:] = 0
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=MAX_LEN, eos_id=EOS)
  return model, params, enc, base


@pytest.mark.parametrize('drafter_name', ['t5', 'lookup'])
def test_adaptive_length_keeps_greedy_output_and_drafts_less(greedy_base,
                                                            drafter_name):
  model, params, enc, base = greedy_base
  dparams = perturbed(params, 0.3, 0)
  # (A drafter of fixed length drafts gamma a row iteration:
  # tests/test_streaming.py.)
  drafter = {
      't5': drafters.T5Drafter(model, confidence=0.6),
      'lookup': drafters.LookupDrafter(model.vocab_size, eos_id=EOS,
                                       adaptive=True),
  }[drafter_name]
  if drafter_name == 'lookup':
    dparams = ()
  out = speculative.speculative_sample(
      model, params, drafter, dparams, enc, gamma=GAMMA,
      max_decode_len=MAX_LEN, eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  drafted = int(jnp.sum(out.stats.drafted))
  row_iters = int(jnp.sum(out.stats.row_iterations))
  assert drafted < GAMMA * row_iters  # some iterations drafted less
  assert drafted >= row_iters  # draft 1 is always made


def test_adaptive_t5_sampled_sequences_follow_target_distribution(
    tiny_target):  # pylint: disable=redefined-outer-name
  """Chi-square vs the exact law, temperature 1 top-k 3, with a drafter
  whose stopping point varies (confidence between its typical maxima: it
  drafts about 3/4 of the gamma tokens it could)."""
  model, params, enc = tiny_target
  config = SAMPLING_CASES['topk3']
  dist = exact_sequence_distribution(model, params, enc, config)
  drafter = drafters.T5Drafter(model, confidence=0.96)
  out = sample_optimized(
      speculative.speculative_sample,
      model, params, drafter, perturbed(params, 1.0, 2),
      jnp.tile(enc, (N_SAMPLES, 1)), gamma=GAMMA, max_decode_len=SEQ_LEN,
      sampling=config, eos_id=SMALL_EOS, rng=jax.random.key(11))
  stats = out.stats
  assert 0 < int(jnp.sum(stats.drafted)) < GAMMA * int(
      jnp.sum(stats.row_iterations))
  assert_matches(np.asarray(out.tokens), dist)


def test_eval_job_seeds_grows_and_reloads_the_cache_file(tmp_path, gcs,
                                                         monkeypatch):
  """DRAFTER='combined' with OUTPUT_CACHE at a gs:// address (a local one:
  tests/test_eval.py): the file is created from the task's 100 train
  pairs, every finished output is appended (4, then 2 more on an extended
  rerun, which reloads it), outputs stay exact. (An object store renames
  nothing: the job's commit of the grown cache once failed there.)"""
  from specdec_jax import eval as eval_lib  # pylint: disable=g-import-not-at-top
  from test_eval import args  # pylint: disable=g-import-not-at-top

  out, path = tmp_path / 'run', f'{gcs}/cache/en_de.npz'
  flags = dict(DRAFTER="'combined'", OUTPUT_CACHE=f"'{path}'")
  summary = eval_lib.main(args(out, **flags))
  assert summary['differing_examples'] == 0 and summary['examples'] == 4
  store = output_cache.OutputCache.load(str(path))
  assert len(store) == 100 + 4
  summary = eval_lib.main(args(out, NUM_EXAMPLES='6', **flags))
  assert summary['differing_examples'] == 0 and summary['examples'] == 6
  assert len(output_cache.OutputCache.load(str(path))) == 100 + 6
  # The appended outputs are the job's speculative outputs (EOS-ended ids).
  grown = output_cache.OutputCache.load(str(path))
  assert (grown.outputs[100:, 0] > 0).all()
  assert checkpoints.list_files(f'{gcs}/cache') == ['en_de.npz']  # none staged
  # A drafter that reads no cache refuses the option.
  with pytest.raises(ValueError, match='does not use one'):
    eval_lib.main(args(tmp_path / 'x', OUTPUT_CACHE=f"'{path}'"))
  # Processes that each decode a share would each commit a cache of their
  # own over the one file: refused before any decode, its folder unwritten,
  # by every process alike, none waiting on another (process 1 here).
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  monkeypatch.setattr(partitioning, 'agree', None)  # no collective
  with pytest.raises(checks.InputError, match='with 2 processes decoding'):
    eval_lib.main(args(tmp_path / 'two', **flags))
  assert not (tmp_path / 'two' / 'run.json').exists()
