"""The eval job's run folder: a rerun never mixes records of two
configurations, and a crash between any two writes resumes to what an
uninterrupted run writes.

A reproduction table whose rows silently come from two configurations (a
resumed run with another dtype, EOS id or data) is the worst failure a
research codebase can have; so is a figure inflated by a crash (a resumed
unit drafting from its own outputs). Random tiny T5s on the Debian slice in
tests/testdata/debian, through the job's flags as a user runs it
(tests/test_eval.py's `args`).
"""

import json
import os
import types

import jax
import pytest

from specdec_jax import drafters
from specdec_jax import eval as eval_lib
from specdec_jax import partitioning
from specdec_jax import run_folder
from conftest import numpy_params
from test_eval import args
from test_eval import check_summary_is_the_records
from test_eval import comparable
from test_eval import DATA


# -- A run's identity: nothing mixed ------------------------------------------


def test_any_error_of_process_0_first_is_said_to_every_process(
    monkeypatch):
  """`process_0_first`: whatever process 0's `make` raises (not only a
  run folder's own errors: a bucket it cannot copy, a refused value) is
  sent to the others, which raise it as theirs; before, they waited for it
  in a collective process 0 never made."""
  sent = []
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 0)
  monkeypatch.setattr(partitioning, 'agree', lambda v: sent.append(v) or v)

  def make():
    raise OSError('no such bucket')

  with pytest.raises(OSError):
    run_folder.process_0_first(make)
  assert sent == ['OSError: no such bucket']
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  monkeypatch.setattr(partitioning, 'agree', lambda v: sent[0])  # 0's word
  with pytest.raises(run_folder.RunFolderError, match='OSError: no such'):
    run_folder.process_0_first(lambda: None)
  # A step every process runs (`every_process`: the others' `make`, the
  # loads): one that fails raises its own error, and the others name it.
  words = []
  monkeypatch.setattr(partitioning, 'gather', lambda word: words.append(
      word) or [None, 'ValueError: a damaged cache'])
  with pytest.raises(run_folder.RunFolderError,
                     match='process 1 of 2 failed: ValueError: a damaged'):
    run_folder.every_process(lambda: 'made')
  with pytest.raises(ValueError, match='mine'):
    run_folder.every_process(lambda: (_ for _ in ()).throw(
        ValueError('mine')))
  assert words[-1] == 'ValueError: mine'
  monkeypatch.setattr(partitioning, 'gather', lambda word: [None, None])
  assert run_folder.every_process(lambda: 'made') == 'made'


def test_a_process_that_does_not_see_process_0s_folder_is_refused(
    tmp_path, monkeypatch):
  """Where each host of a jax.distributed run has its own disk, a local
  EVAL_OUTPUT_DIR is a folder per host: process 0 merged only its own
  records (the run 'unfinished' however often resumed), and on a mesh
  spanning the processes the others found none of its records and decoded
  other units. Process 0 writes the run's claim token into run.json; a
  process that reads another claim, or none, is refused by name."""
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(partitioning, 'agree', lambda v: 'cafe')  # 0's word
  monkeypatch.setattr(run_folder, 'SHARED_WAIT_S', 0.6)  # looks twice
  token = run_folder.claim_token()
  assert token == 'cafe'
  shared, own = tmp_path / 'shared', tmp_path / 'host1'
  run_folder.claim(shared, {'a': 1}, '', {}, token=token)
  assert json.loads((shared / 'run.json').read_text())['claim'] == 'cafe'
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  assert run_folder.claim(shared, {'a': 1}, '', {}, main_process=False,
                          token=token) == []
  with pytest.raises(run_folder.RunFolderError,
                     match=r'host1: process 1 of 2 does not see the run '
                     r'folder process 0 claimed there \(run.json missing\)'):
    run_folder.claim(own, {'a': 1}, '', {}, main_process=False, token=token)
  assert not own.exists()  # refused before making it
  # A run.json of its own disk's earlier run (another claim, or none).
  own.mkdir()
  for earlier in ({'claim': 'beef'}, {'format': 1}):
    (own / 'run.json').write_text(json.dumps(earlier))
    with pytest.raises(run_folder.RunFolderError, match="run.json another "
                       "run's.*EVAL_OUTPUT_DIR a path all hosts share"):
      run_folder.claim(own, {'a': 1}, '', {}, main_process=False,
                       token=token)
  monkeypatch.setattr(jax, 'process_count', lambda: 1)
  assert run_folder.claim_token() is None  # one process: nothing checked


def test_processes_that_read_other_examples_are_refused(monkeypatch):
  """A host with another data_dir or dataset version would decode other
  examples under the same indices into the one run: every process
  compares the digest of the examples it read (gathered) and all refuse
  alike, naming the first process that differs."""
  examples = [(0, [5, 6, 1], 'a b', 'c'), (1, [7, 1], 'd', 'e')]
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  said = []
  monkeypatch.setattr(partitioning, 'gather',
                      lambda digest: said.append(digest) or [digest] * 2)
  got = run_folder.same_examples(examples)  # the same on both: its own
  assert got == {i: run_folder.example_fingerprint(*e) for i, *e in examples}
  edited = [examples[0], (1, [7, 1], 'd', 'E')]
  run_folder.same_examples(edited)
  assert said[0] != said[1]  # a target text changed: another digest
  monkeypatch.setattr(partitioning, 'gather', lambda digest: said[:2])
  with pytest.raises(run_folder.RunFolderError,
                     match=r'process 1 of 2 read other examples than process '
                     r'0 \(1 process\(es\) differ\)'):
    run_folder.same_examples(examples)


def test_a_choice_file_one_process_cannot_read_is_said_to_all(
    tmp_path, monkeypatch):
  """A lane's start (`unit_loop.Lane.start`) reads the choice of the run
  being resumed: where process 1's is damaged, process 0 (whose reads
  fine) is told and ends too, not left in the next collective."""
  from specdec_jax import unit_loop  # pylint: disable=g-import-not-at-top
  setup = types.SimpleNamespace(
      gamma=3, batch=types.SimpleNamespace(profile_gamma=True, size=2),
      draft=types.SimpleNamespace(chooses_tree=False))
  loaded = types.SimpleNamespace(setup=setup, draft_params=None,
                                 drafter=drafters.NgramDrafter(8, order=1))
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(partitioning, 'gather', lambda word: [
      word, 'RunFolderError: gamma_choice.process-00001-of-00002.json is '
      'damaged'])
  with pytest.raises(run_folder.RunFolderError,
                     match='process 1 of 2 failed: .*is damaged'):
    unit_loop.Lane(loaded, choice_file=tmp_path / 'none.json').start(
        partitioning.OneDevice())


def test_every_setting_is_compared_or_named_free(tmp_path):
  """run.json holds every EvalSetup field but the free ones, derived from
  the dataclass: a field added later is compared without anyone listing it
  (here: a copy of the setup with one more field). The free settings are
  named: num_examples (a rerun may ask for more), and evaluate's timing
  and plumbing parameters; every evaluate parameter is classified."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  from specdec_jax import loading  # pylint: disable=g-import-not-at-top
  assert set(run_folder.FREE_FIELDS) == {'num_examples'}
  assert set(run_folder.EVALUATE_PARAMETERS) == set(
      inspect.signature(eval_lib.evaluate).parameters)
  free = {k for k, v in run_folder.EVALUATE_PARAMETERS.items()
          if v.startswith('free')}
  assert free == {'timing_repeats', 'output_dir', 'config_str',
                  'if_settings_differ', 'cache', 'sync_every_s', 'dry_run'}
  setup = eval_lib.configured(args(tmp_path / 'x'))[1]
  settings = run_folder.identity(setup)
  assert set(setup.flat()) - set(settings) == {'num_examples'}
  assert {'target_checkpoint_content', 'draft_checkpoint_content', 'mesh',
          'device'} <= set(settings)

  @dataclasses.dataclass(frozen=True)
  class Grown(loading.EvalSetup):
    new_knob: int = 0

  grown = Grown(**{f.name: getattr(setup, f.name)
                   for f in dataclasses.fields(setup)})
  out = tmp_path / 'grown'
  run_folder.claim(out, run_folder.identity(grown), '', {})
  run_folder.claim(out, run_folder.identity(grown), '', {})  # same: resumes
  # A run that finished no example (it failed on a value it refused) gives
  # way to the rerun that corrects it: its files moved aside, not mixed.
  (out / 'choice.json').write_text('{}')
  run_folder.claim(out, run_folder.identity(grown.replace(new_knob=2)), '',
                   {})
  aside, = out.glob('replaced-*')
  assert (aside / 'choice.json').exists() and not (out / 'choice.json'
                                                   ).exists()
  # A damaged records file counts as finished examples (it may hold
  # some), and 'restart' moves it aside unread.
  (out / run_folder.RECORDS).write_text('{"index": 0}\n{}\n')
  with pytest.raises(run_folder.RunFolderError, match='other settings'):
    run_folder.claim(out, run_folder.identity(grown), '', {})
  run_folder.claim(out, run_folder.identity(grown), '', {},
                   if_settings_differ='restart')
  assert not (out / run_folder.RECORDS).exists()
  (out / run_folder.RECORDS).write_text(json.dumps(  # one finished
      dict.fromkeys(run_folder.RECORD_FIELDS, 0)) + '\n')
  with pytest.raises(ValueError, match=r'new_knob: 0 -> 1'):
    run_folder.claim(out, run_folder.identity(grown.replace(new_knob=1)),
                     '', {})
  with pytest.raises(ValueError, match=r'new_knob: 0 -> "\(not set\)"'):
    run_folder.claim(out, run_folder.identity(setup), '', {})


def test_a_folder_another_job_is_writing_is_refused(tmp_path, monkeypatch):
  """Two jobs started on one folder would each decode every example and
  append them twice: the second is refused while the first holds it
  (run.lock, an fcntl lock: here a process that holds it as a job does),
  naming it; once that process is gone, however it ended, the folder is
  free. A process holds its folders until it lets them go."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  out = tmp_path / 'run'
  out.mkdir()
  job = subprocess.Popen([sys.executable, '-c', (
      'import fcntl, sys\n'
      f'f = open({str(out / run_folder.LOCK)!r}, "a+")\n'
      'fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n'
      'f.write("started then on there (pid 7)"); f.flush()\n'
      'print("held", flush=True); sys.stdin.read()\n')],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
  try:
    assert job.stdout.readline() == 'held\n'
    with pytest.raises(run_folder.RunFolderError, match=(
        'another job is writing this run folder now .started then on '
        r'there \(pid 7\);')):
      run_folder.claim(out, {'a': 1}, '', {})
    assert not (out / run_folder.RUN).exists()
  finally:
    job.communicate('')  # it ends
  run_folder.claim(out, {'a': 1}, '', {})
  run_folder.claim(out, {'a': 1}, '', {})  # this process holds it
  assert f'(pid {os.getpid()})' in (out / run_folder.LOCK).read_text()
  run_folder.release(out)
  # A disk that takes no locks (NFS without its lock service) runs the
  # job unlocked rather than refuse every run.
  import errno  # pylint: disable=g-import-not-at-top
  import fcntl  # pylint: disable=g-import-not-at-top

  def no_locks(*_):
    raise OSError(errno.ENOLCK, 'No locks available')

  monkeypatch.setattr(fcntl, 'lockf', no_locks)
  run_folder.claim(out, {'a': 1}, '', {})
  run_folder.release(out)


def test_a_rerun_that_would_mix_records_is_refused(tmp_path, capsys):
  """The dtype, the EOS id, the data folder, the examples in it, the
  vocabulary's content at the same path, the checkpoint's content: each
  changed is refused before anything is decoded, with the setting named;
  'restart' moves the old run aside instead."""
  import shutil  # pylint: disable=g-import-not-at-top
  data = tmp_path / 'data'
  shutil.copytree(DATA, data)
  out = tmp_path / 'run'
  base = dict(NUM_EXAMPLES='2', **{'DataSpec.data_dir': f"'{data}'"})
  first = eval_lib.main(args(out, **base))
  assert first['examples'] == 2
  before = (out / 'examples.jsonl').read_text()
  for change, named in [
      ({'DTYPE': "'bfloat16'"},
       r'draft_config.dtype: "float32" -> "bfloat16"; target_config.dtype: '
       r'"float32" -> "bfloat16"\)'),
      ({'DataSpec.eos_id': '2'}, 'eos_id: 1 -> 2'),
      ({'DataSpec.data_dir': f"'{DATA}'"}, 'data_dir: '),
      ({'EvalSetup.seed': '1'}, 'seed: 0 -> 1')]:
    with pytest.raises(ValueError, match=named):
      eval_lib.main(args(out, **dict(base, NUM_EXAMPLES='4', **change)))
  # Another vocabulary at the same path (a piece's score changed: it
  # tokenizes, and decodes outputs, otherwise): the records were decoded
  # with the old one.
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  vocab = data / 'sentencepiece.model'
  model = sentencepiece_model_pb2.ModelProto()
  model.ParseFromString(vocab.read_bytes())
  model.pieces[10].score += 1.0
  original = vocab.read_bytes()
  vocab.write_bytes(model.SerializeToString())
  with pytest.raises(ValueError, match=r'data_content.vocabulary: "sha256:'):
    eval_lib.main(args(out, **dict(base, NUM_EXAMPLES='4')))
  vocab.write_bytes(original)
  # Other examples under the same indices (the same data_dir).
  path = data / 'debian_desc_en_de' / 'validation.jsonl'
  rows = path.read_text().splitlines()
  path.write_text('\n'.join([rows[1], rows[0]] + rows[2:]) + '\n')
  with pytest.raises(ValueError, match=r'other examples .*\(2 of them: 0, 1'):
    eval_lib.main(args(out, **dict(base, NUM_EXAMPLES='4')))
  assert (out / 'examples.jsonl').read_text() == before  # untouched
  capsys.readouterr()
  again = eval_lib.main(args(out, **dict(
      base, **{'evaluate.if_settings_differ': "'restart'"})))
  assert 'starting afresh' in capsys.readouterr().out
  assert again['reused_records'] == 0 and again['examples'] == 2
  aside = list(out.glob('replaced-*'))
  assert len(aside) == 1 and (aside[0] / 'examples.jsonl').read_text() == (
      before)
  # A checkpoint's content is part of the identity (same path).
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  setup = eval_lib.configured(args(tmp_path / 'c'))[1]
  contents = []
  for seed in (0, 1):  # other weights at the same path
    shutil.rmtree(tmp_path / 'ckpt', ignore_errors=True)
    params = numpy_params(setup.target_config, seed, 1.0)
    path = checkpoints.save_t5x_params(params, str(tmp_path / 'ckpt'), 1)
    contents.append(run_folder.identity(setup.replace(
        target_checkpoint=path))['target_checkpoint_content'])
  assert contents[0].startswith('manifest:') and contents[0] != contents[1]


# -- Crash consistency: a failure after every write of a unit -----------------

# What decides a resumed unit's records beyond the records themselves: the
# output cache of the kinds that draft from one (committed with the unit's
# records: five writes). Any other kind's first unit writes its records
# only, the same one write for every kind (greedy: nothing else carries
# over), so t5 stands for them; a new kind with a cache joins by itself.
RESUMED_KINDS = ['t5'] + sorted(k for k, v in drafters.KINDS.items()
                                if v.uses_cache)
KIND_FLAGS = {'cache': {'DRAFT_MODEL': 'None'}}


# Inputs cut to 64 tokens: the output cache embeds its 100 train pairs in
# every run (a quarter of the time at 512).
SHORT = {'TASK_FEATURE_LENGTHS': "{'inputs': 64, 'targets': 12}",
         'DataSpec.truncate_inputs': 'True'}


class Injected(RuntimeError):
  pass


def _cache_content(out):
  path = out / 'output_cache.npz'
  return path.read_bytes() if path.exists() else None


def _state(out):
  summary = json.loads((out / 'summary.json').read_text())
  counters = {k: summary[k] for k in (
      'examples', 'alpha', 'mean_accepted_length', 'target_calls_per_token',
      'speculative_tokens', 'baseline_tokens', 'differing_examples')}
  return comparable(out), counters, _cache_content(out)


def _fail_after_then_resume(monkeypatch, out, flags, at,
                            before_resume=lambda: None):
  """Runs the job into `out`, failing it right after its write number `at`
  (counted from 0); then resumes it unhindered. Returns the summary."""
  count = [0]

  def fail(label):
    del label
    count[0] += 1
    if count[0] == at + 1:
      raise Injected(f'after write {at}')

  monkeypatch.setattr(run_folder, 'after_write', [fail])
  with pytest.raises(Injected):
    eval_lib.main(args(out, **flags))
  monkeypatch.setattr(run_folder, 'after_write', [])
  before_resume()
  return eval_lib.main(args(out, **flags))


@pytest.mark.parametrize('kind', RESUMED_KINDS)
def test_a_failure_after_any_write_resumes_as_if_uninterrupted(
    tmp_path, monkeypatch, kind):
  """Fixed batches of 1, 2 examples: the job is failed right after each
  write of its first unit (the output cache staged, its intent, the
  records, the cache put in place, the intent removed), then resumed:
  records (but timings), the summary's counters and the output cache
  (its file, byte for byte) equal an uninterrupted run's, for t5 and every
  kind whose state outlives a unit (`RESUMED_KINDS`). Before the cache was
  committed with the records, a crash between its save and the records let
  the resumed unit draft from its own outputs."""
  flags = dict(dict(BATCH_SIZE='1', NUM_EXAMPLES='2', GAMMA='3',
                    DRAFTER=f"'{kind}'", **SHORT), **KIND_FLAGS.get(kind, {}))
  writes = []
  monkeypatch.setattr(run_folder, 'after_write', [writes.append])
  reference = tmp_path / 'reference'
  eval_lib.main(args(reference, **flags))
  expected = _state(reference)
  assert len(expected[0]) == 2
  check_summary_is_the_records(reference, 2)  # batch 1
  if drafters.get_kind(kind).uses_cache:
    assert expected[2] is not None
  # The first unit's writes: after run.json, config.gin and the summary of
  # a job under way, up to its records (and the output cache's commit
  # around them).
  assert writes[:4] == ['run.json', 'config.gin', 'summary.json',
                        'summary.md'], writes
  first_unit = writes.index('output cache intent removed' if
                            drafters.get_kind(kind).uses_cache else
                            'examples.jsonl')
  points = range(4, first_unit + 1)
  assert len(points) == (5 if drafters.get_kind(kind).uses_cache else 1), (
      writes)
  for at in points:
    out = tmp_path / f'after-{at}'
    summary = _fail_after_then_resume(monkeypatch, out, flags, at)
    assert summary['status'] == 'complete'
    got = _state(out)
    assert got == expected, (kind, writes[at])


def test_a_failure_after_the_gamma_choice_resumes_with_it(tmp_path,
                                                          monkeypatch):
  """At batch > 1 the first unit also writes the gamma chosen for the batch
  (gamma_choice.json, before its records): failed after either write and
  resumed, the run decodes with the same gamma as an uninterrupted one (the
  choice, timing-dependent, is made deterministic here)."""
  from specdec_jax import unit_loop  # pylint: disable=g-import-not-at-top
  from test_eval import PROFILE  # pylint: disable=g-import-not-at-top
  made = []

  def choose(loaded, inputs, first):
    del inputs, first
    made.append(1)
    return {'gamma': 1, 'rule': 'profile', 'alpha': 0.5,
            'configured_gamma': loaded.setup.gamma,
            'prediction': {'cost': 1.0, 'c': 0.0, 'speedup': 1.5}}

  monkeypatch.setattr(unit_loop, 'choose_gamma', choose)
  flags = dict(DRAFTER="'lookup'", DRAFT_MODEL='None', NUM_EXAMPLES='4',
               **SHORT, **PROFILE)  # fixed batches of 2
  writes = []
  monkeypatch.setattr(run_folder, 'after_write', [writes.append])
  reference = tmp_path / 'reference'
  eval_lib.main(args(reference, **flags))
  expected = _state(reference)
  assert {r['gamma'] for r in expected[0]} == {1}
  points = [i for i, w in enumerate(writes)
            if w in ('gamma_choice.json', 'examples.jsonl')][:2]
  assert [writes[i] for i in points] == ['gamma_choice.json',
                                         'examples.jsonl'], writes
  for at in points:
    out = tmp_path / f'after-{at}'
    summary = _fail_after_then_resume(monkeypatch, out, flags, at,
                                      before_resume=made.clear)
    assert summary['status'] == 'complete'
    assert not made  # read back, not chosen again
    assert _state(out) == expected, writes[at]


# -- Damaged files: one line naming the file, never a traceback ---------------


def _truncated(data):
  return data[:len(data) // 2]


DAMAGES = {
    'truncated': _truncated,
    'empty': lambda data: b'',
    'wrong type': None,  # per file: valid JSON / npz of something else
    'garbage': lambda data: b'\x00\xff\xfe garbage \x01\n' * 4,
}
# A JSON file of another type, an .npz of other arrays, a line that is JSON
# but not a record.
WRONG_TYPE = {'.json': b'[]', '.npz': None, '.jsonl': b'[]\n'}
# The files the job reads back; a damaged one stops it with one line naming
# it. summary.json is never read (rewritten from the records): any damage
# is repaired. A records file cut off or empty is a crash's torn write
# (resumed by decoding again: tests/test_eval.py), not damage.
READ_BACK = ['run.json', 'examples.jsonl', 'gamma_choice.json',
             'output_cache.npz', 'output_cache.npz.pending',
             'output_cache.pending.json', 'summary.json']
RESUMED = {('examples.jsonl', 'truncated'), ('examples.jsonl', 'empty')}


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  """A finished run of the 'cache' drafter at batch 2 (gamma chosen for the
  batch: gamma_choice.json; its output cache in the folder)."""
  from specdec_jax import unit_loop  # pylint: disable=g-import-not-at-top
  out = tmp_path_factory.mktemp('finished') / 'run'
  flags = dict(DRAFTER="'cache'", DRAFT_MODEL='None', NUM_EXAMPLES='2',
               GAMMA='2', **SHORT, **{'BatchSpec.gamma_rule': "'profile'"})
  real = unit_loop.choose_gamma
  unit_loop.choose_gamma = lambda *_: {
      'gamma': 2, 'rule': 'profile', 'alpha': 0.5,
      'prediction': {'cost': 1.0, 'c': 0.1, 'speedup': 1.5}}
  try:
    eval_lib.main(args(out, **flags))
  finally:
    unit_loop.choose_gamma = real
  return out, flags


def _stage_commit(out):
  """A commit of the output cache staged, as a crash right after the
  unit's records leaves it: rolled forward on resume."""
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copy(out / 'output_cache.npz', out / 'output_cache.npz.pending')
  (out / 'output_cache.pending.json').write_text(json.dumps(
      {'cache': str(out / 'output_cache.npz'),
       'staged': str(out / 'output_cache.npz.pending'), 'indices': [0, 1]}))


@pytest.mark.parametrize('name', READ_BACK)
def test_a_damaged_file_is_named_in_one_line(finished_run, tmp_path, name):
  """Each file the job reads back, cut off, emptied, holding JSON (or
  arrays) of another type, or garbage: the job ends with one line naming
  the file, what is wrong and what to do (exit status 1), before
  decoding anything; never a JSONDecodeError or AttributeError from deep
  inside. Before, a damaged run.json or gamma choice gave a bare
  traceback naming no file."""
  import io  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  pristine, flags = finished_run
  for damage, make in DAMAGES.items():
    out = tmp_path / damage.replace(' ', '_')
    shutil.copytree(pristine, out)
    if '.pending' in name:
      _stage_commit(out)
    path = out / name
    suffix = path.suffix if path.suffix != '.pending' else '.npz'
    if make is not None:
      path.write_bytes(make(path.read_bytes()))
    elif WRONG_TYPE[suffix] is not None:
      path.write_bytes(WRONG_TYPE[suffix])
    else:
      buffer = io.BytesIO()
      np.savez(buffer, weights=np.zeros(3))
      path.write_bytes(buffer.getvalue())
    if name == 'summary.json' or (name, damage) in RESUMED:
      if (name, damage) in RESUMED:
        continue  # decodes again: tests/test_eval.py
      summary = eval_lib.cli(args(out, **flags))
      assert summary['status'] == 'complete' and summary['examples'] == 2
      continue
    with pytest.raises(SystemExit) as stop:
      eval_lib.cli(args(out, **flags))
    message = str(stop.value.code)
    assert message.startswith('error: ') and '\n' not in message, message
    assert str(path) in message, (damage, message)
    assert 'delete' in message.lower(), (damage, message)
  if name == 'run.json':  # what the line says works: the run moved aside
    assert run_folder.claim(out, {}, '', {},
                            if_settings_differ='restart') == []
    assert (next(out.glob('replaced-*')) / name).read_bytes() == (
        DAMAGES['garbage'](b''))
