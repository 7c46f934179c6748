"""The eval job across processes (jax.distributed) equals one process's.

Two local CPU processes, each with 2 simulated devices and a 1 x 2 mesh
(gin_configs/mesh/partitioner.gin, NUM_PARTITIONS=2), split the batches of
a tiny eval; process 0 merges their records. The merged examples.jsonl must
hold every example once, with the outputs and counters of a single-process
run without a mesh (timings aside), and a rerun must resume from every
record file. ~1-2 min on 2 cores (marked slow): two fresh processes import
the task stack and compile. The decoders on one mesh spanning two
processes (tests/global_mesh_checks.py, ~20 s), the eval job on such a
mesh (GLOBAL_MESH; ~3 min), a benchmark spec on one (~40 s), a process
dying mid-run (~15 s, or ~2 min where jax's heartbeat ends the other), and
two processes given folders of their own or data of their own (refused,
~20 s each).
"""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import jax
import pytest

from specdec_jax import checkpoints
from specdec_jax import eval as eval_lib
from specdec_jax import network
from specdec_jax.experiments import __main__ as cli

from test_eval import args
from test_eval import DATA
from test_eval import read_jsonl
from test_eval import STREAM
from tests.mesh_checks import CONFIG

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMINGS = ('baseline_batch_s', 'speculative_batch_s', 'other_load')


def _free_port():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _run_processes(out, count=2, mesh=('--gin.NUM_PARTITIONS=2',), ok=True,
                   each=lambda i: {}, **overrides):
  """The eval job on `mesh` (default 1 x 2 a process), as processes 0 ..
  count - 1 of a jax.distributed run of 2 devices each (count 1: one
  process, no coordinator), process i with `each(i)`'s bindings too:
  their logs (`ok`: each exited with 0)."""
  common = ['--gin_file=mesh/partitioner.gin', *mesh]
  if count > 1:
    common += [f'--coordinator_address=localhost:{_free_port()}',
               f'--num_processes={count}']
  return _run([[sys.executable, '-m', 'specdec_jax.eval'] +
               args(out, **overrides, **each(i)) + common +
               ([f'--process_id={i}'] if count > 1 else [])
               for i in range(count)], devices=2, ok=ok)


def _run(commands, devices, ok=True):
  """The commands at once, each a process of `devices` simulated CPU
  devices: their logs (`ok`: each exited with 0)."""
  env = dict(os.environ)
  env['XLA_FLAGS'] = (
      env.get('XLA_FLAGS', '') +
      f' --xla_force_host_platform_device_count={devices}').strip()
  env['JAX_PLATFORMS'] = 'cpu'
  procs = [subprocess.Popen(command, cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True) for command in commands]
  try:
    logs = [p.communicate(timeout=600)[0] for p in procs]
  finally:  # a process left waiting on a collective ends with the test
    for p in procs:
      p.kill()
  for p, log in zip(procs, logs):
    assert (p.returncode == 0) == ok, log[-4000:]
  return logs


def _without_timings(records):
  return sorted(({k: v for k, v in r.items() if k not in TIMINGS}
                 for r in records), key=lambda r: r['index'])


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
  """Data parallel over processes, model parallel within: same records."""
  single = tmp_path / 'single'
  eval_lib.main(args(single, NUM_EXAMPLES='6'))
  alone = read_jsonl(single / 'examples.jsonl')
  expected = _without_timings(alone)[:4]

  multi = tmp_path / 'multi'
  logs = _run_processes(multi)
  # Each process ends saying the job's summary (process 0's), not its share.
  said = [[l for l in log.splitlines() if l.startswith(f'{multi}: ')]
          for log in logs]
  assert said[0] == said[1] and len(said[0]) == 1, said
  assert said[0][0].startswith(f'{multi}: complete (4 examples, '), said
  records = read_jsonl(multi / 'examples.jsonl')
  assert sorted(r['index'] for r in records) == list(range(4))  # once each
  assert _without_timings(records) == expected
  # Two batches: process 0 decoded batch 0, process 1 batch 1.
  assert {r['batch'] for r in records} == {0, 1}
  assert not list(multi.glob('examples.process-*.jsonl'))  # merged
  summary = json.loads((multi / 'summary.json').read_text())
  assert summary['status'] == 'complete'
  assert summary['examples'] == 4
  assert summary['differing_examples'] == 0

  # Resumable with any process count: a crashed multi-process run's
  # leftover file (one record already merged, one new) is read, nothing is
  # decoded twice or lost, and the merge leaves one examples.jsonl.
  leftover = multi / 'examples.process-00001-of-00002.jsonl'
  # Example 4 as process 1 of a crashed run recorded it (not merged yet).
  [extra] = [r for r in alone if r['index'] == 4]
  leftover.write_text(json.dumps(records[0]) + '\n' + json.dumps(extra) +
                      '\n')
  _run_processes(multi, 1, NUM_EXAMPLES='6')  # the same mesh, one process
  records = read_jsonl(multi / 'examples.jsonl')
  assert sorted(r['index'] for r in records) == list(range(6))
  assert [r for r in records if r['index'] == 4] == [extra]  # not redone
  assert not list(multi.glob('examples.process-*.jsonl'))


@pytest.mark.slow
def test_two_processes_into_a_bucket_equal_one_process(tmp_path, gcs):
  """At a gs:// EVAL_OUTPUT_DIR (the suite's local GCS) each process
  keeps a local copy; process 0 takes the other's records from the bucket
  and merges them: the bucket holds the records of one process's run."""
  single = tmp_path / 'single'
  eval_lib.main(args(single))
  expected = _without_timings(read_jsonl(single / 'examples.jsonl'))
  url = f'{gcs}/multi'
  logs = _run_processes(url)
  said = [[l for l in log.splitlines() if l.startswith(f'{url}: ')]
          for log in logs]
  assert said[0] == said[1] and said[0][0].startswith(
      f'{url}: complete (4 examples, '), said
  assert not [n for n in checkpoints.list_files(url) if 'process' in n]
  merged = tmp_path / 'merged.jsonl'
  merged.write_bytes(checkpoints.read_bytes(f'{url}/examples.jsonl'))
  records = read_jsonl(merged)
  assert {r['batch'] for r in records} == {0, 1}  # each process's batch
  assert _without_timings(records) == expected


@pytest.mark.slow
def test_processes_that_see_different_folders_are_refused(tmp_path):
  """Two hosts, each with its own disk, given one local EVAL_OUTPUT_DIR
  (here: a folder each): process 1 does not find the run process 0
  claimed, and both end with that line, before decoding, each writing no
  record (before: process 0 merged its own records only, the run
  'unfinished' however often resumed)."""
  logs = _run_processes(tmp_path / 'host0', ok=False, each=lambda i: {
      'EVAL_OUTPUT_DIR': f"'{tmp_path / f'host{i}'}'"})
  said = (f"{tmp_path / 'host1'}: process 1 of 2 does not see the run "
          'folder process 0 claimed there (run.json missing)')
  assert said in logs[1], logs[1][-3000:]
  assert f'process 1 of 2 failed: {said}' in logs[0], logs[0][-3000:]
  for i in range(2):
    assert not list((tmp_path / f'host{i}').glob('examples*.jsonl'))


@pytest.mark.slow
def test_processes_that_read_other_data_are_refused(tmp_path):
  """Process 1's data_dir holds one example edited (another dataset
  version): both processes end naming process 1, before the folder is
  claimed (before, each would decode its share of its own examples into
  the one run, the merged records of two data sets under one index)."""
  other = tmp_path / 'data'
  shutil.copytree(DATA, other)
  split = other / 'debian_desc_en_de' / 'validation.jsonl'
  first, *rest = split.read_text().splitlines(True)
  row = json.loads(first)
  row['de'] += ' (bearbeitet)'
  split.write_text(json.dumps(row, ensure_ascii=False) + '\n' + ''.join(rest))
  logs = _run_processes(tmp_path / 'run', ok=False, each=lambda i: (
      {'DataSpec.data_dir': f"'{other}'"} if i else {}))
  for log in logs:
    assert 'process 1 of 2 read other examples than process 0' in log, (
        log[-3000:])
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_one_mesh_spanning_two_processes(tmp_path, fixtures_dir):
  """The decoders on one mesh over both processes' devices (4 each): the
  'model' axis across them (1 x 8) or the 'data' axis (4 x 2), greedy
  baseline and speculative tokens equal to one device's, and so is the
  diagnosis of a planted divergence on the sharded target; a value both
  offer, process 0's on both; T5X's legacy fixture and an orbax checkpoint
  of ours restored straight into the meshes' shardings; each process
  finds the other as its job's on this machine."""
  # The reference model's params (tests/global_mesh_checks.py's), in an
  # orbax checkpoint of ours that both processes restore.
  params = network.T5Model(CONFIG).init_params(jax.random.key(1))
  orbax = checkpoints.save_t5x_params(params, str(tmp_path / 'orbax'), 3)
  port = _free_port()
  _run([[sys.executable, '-m', 'tests.global_mesh_checks',
         str(tmp_path / f'{i}.json'), f'localhost:{port}', str(i),
         str(fixtures_dir), orbax] for i in range(2)], devices=4)
  both = [json.loads((tmp_path / f'{i}.json').read_text()) for i in range(2)]
  # Each finds the other as its job's process on this machine.
  assert [g['peers'] for g in both] == [[both[1]['pid']], [both[0]['pid']]]
  for i in range(2):
    got = json.loads((tmp_path / f'{i}.json').read_text())
    assert (got['devices'], got['local']) == (8, 4)
    assert got['agreed'] == repr({'process': 0, 1: (2, 3)})  # 0's, as is
    # Restored into the shardings: equal to the whole load; a process holds
    # every slice of a 'model'-split weight on 2 x 4, half of them on 1 x 8.
    assert got['restored'] == {'legacy': [True, 4, 4], 'orbax': [True, 4, 8]}
    assert set(got['meshes']) == {'1x8', '4x2'}
    for name, mesh in got['meshes'].items():
      assert mesh['processes'] == [0, 1]
      assert mesh['model_axis_processes'] == ([0, 1] if name == '1x8'
                                              else [0])
      assert mesh['baseline'] == got['single']
      assert mesh['speculative'] == got['single']
      assert 0 < mesh['accepted'] < mesh['drafted']
      # The planted divergence: the speculative side's token, rounding far.
      [(*facts, gap)] = mesh['diagnosis']
      assert [*facts, gap] == [*got['diagnosis'][0][:4], pytest.approx(
          got['diagnosis'][0][4], rel=1e-5)]
      assert [d[:4] for d in got['diagnosis']] == [
          [0, 2, 'mismatch', 'speculative']]


# The job on one mesh over both processes' 4 devices (GLOBAL_MESH).
GLOBAL_2X2 = ('--gin.GLOBAL_MESH=True', '--gin.NUM_PARTITIONS=2')  # data
GLOBAL_1X4 = ('--gin.GLOBAL_MESH=True', '--gin.NUM_PARTITIONS=4')  # model


@pytest.mark.slow
def test_the_job_on_one_mesh_spanning_two_processes(tmp_path):
  """GLOBAL_MESH: both processes decode every unit on one mesh of their 4
  devices (the 'model' axis across them, then the 'data' axis), and
  process 0 alone writes the run, as one process would:

  - streamed with the output cache drafting (learned after each chunk,
    kept in one file that both read on resume), run for 4 examples then
    resumed to 8: every record equal to one process's without a mesh,
    timings aside;
  - a tree chosen by the costs the job times (its seconds and the choice
    process 0's: each process's clock would choose its own and the two
    would call different programs), then resumed with the choice kept:
    one gamma_choice.json, every record decoded with it, the tokens one
    process's."""
  cached = dict(DRAFTER="'combined'", **STREAM)
  single = tmp_path / 'single'
  eval_lib.main(args(single, NUM_EXAMPLES='8', **cached))
  alone = _without_timings(read_jsonl(single / 'examples.jsonl'))
  assert {r['chunk'] for r in alone} == {0, 1}  # the cache learns between

  multi = tmp_path / 'cached'
  for n in ('4', '8'):
    _run_processes(multi, mesh=GLOBAL_1X4, NUM_EXAMPLES=n, **cached)
  assert _without_timings(read_jsonl(multi / 'examples.jsonl')) == alone
  run = json.loads((multi / 'run.json').read_text())
  assert run['identity']['mesh']['axes'] == {'data': 1, 'model': 4}
  files = sorted(p.name for p in multi.iterdir())
  assert files == ['config.gin', 'examples.jsonl', 'output_cache.npz',
                   'run.json', 'run.lock', 'summary.json', 'summary.md'], files

  tree = tmp_path / 'tree'
  chosen = dict(DRAFTER="'tree'", TREE="'choose:6'",
                DRAFT_CHECKPOINT="'synthetic:seed=0,noise=0.05'")
  logs = _run_processes(tree, mesh=GLOBAL_2X2, NUM_EXAMPLES='2', **chosen)
  said = [[l for l in log.splitlines() if l.startswith('tree ')]
          for log in logs]
  assert said[0] and said[0] == said[1]  # one choice, said by both
  logs = _run_processes(tree, mesh=GLOBAL_2X2, NUM_EXAMPLES='4', **chosen)
  assert 'chosen by the profile of the run being resumed' in logs[0]
  choice = json.loads((tree / 'gamma_choice.json').read_text())
  records = sorted(read_jsonl(tree / 'examples.jsonl'),
                   key=lambda r: r['index'])
  assert [r['index'] for r in records] == [0, 1, 2, 3]
  assert {r['gamma'] for r in records[2:]} == {choice['gamma']}
  assert not list(tree.glob('*.process-*'))
  for mine, theirs in zip(records, alone):
    assert (mine['baseline'], mine['speculative']) == (
        theirs['baseline'], theirs['baseline'])
  # Other settings in the same folder: process 0's refusal is said by
  # both, each exiting with it at once (none left waiting for the other).
  logs = _run_processes(tree, mesh=GLOBAL_2X2, ok=False, NUM_EXAMPLES='4',
                        GAMMA='2', **chosen)
  said = [[l for l in log.splitlines() if l.startswith('error: ')]
          for log in logs]
  assert said[0] == said[1] and len(said[0]) == 1, said
  assert 'holds a run with other settings' in said[0][0]


@pytest.mark.slow
def test_a_benchmark_spec_on_one_mesh_spanning_two_processes(tmp_path, gcs):
  """`python -m specdec_jax.experiments run ... --global_mesh`, started
  once per process, its work folder in a bucket (the suite's local GCS;
  the hosts of a TPU pod share no disk): each runs the cell on the mesh of
  both processes' devices (its drafter widened to T5-small cost), process
  0 writes its results there; the records are one process's without a
  mesh and on disk, timings aside."""
  cell = 'task=en_de,drafter=small,gamma=1,temperature=0.0,max_gamma=2'
  spec = ['run', 'table2', '--models', 'xxl_cost', '--shrink', '--only',
          cell]
  alone = cli.main(spec + ['--work_dir', str(tmp_path)])
  port, work = _free_port(), f'{gcs}/work'
  _run([[sys.executable, '-m', 'specdec_jax.experiments', *spec,
         '--work_dir', work, '--num_partitions=4', '--global_mesh',
         f'--coordinator_address=localhost:{port}', '--num_processes=2',
         f'--process_id={i}'] for i in range(2)], devices=2)
  folder = f'{work}/table2/xxl_cost_partitions-4-global'
  result = json.loads(checkpoints.read_bytes(f'{folder}/results.json'))
  assert result['out'] == f'{folder}/results'
  assert result['mesh'] == {'data': 1, 'model': 4, 'processes': 2,
                            'shard_drafter': False}
  [row], [theirs] = result['rows'], alone['rows']
  assert row['status'] == 'complete' and row['differing_examples'] == 0
  assert row['speculative_tokens'] == theirs['speculative_tokens']
  ours = tmp_path / 'ours.jsonl'
  ours.write_bytes(checkpoints.read_bytes(
      f'{folder}/cells/{cell}/examples.jsonl'))
  records = [_without_timings(read_jsonl(path)) for path in (
      ours, tmp_path / 'table2' / 'xxl_cost' / 'cells' / cell /
      'examples.jsonl')]
  assert records[0] == records[1]
  assert not [n for n in checkpoints.list_files(folder) if '.process-' in n]


@pytest.mark.slow
def test_a_process_that_dies_leaves_the_other_to_end_with_its_records(
    tmp_path):
  """One mesh over two processes, process 1 killed once process 0 wrote
  records. Where process 0's next collective fails (gloo, at once), it
  writes what finished (its summary says how to resume) and exits with
  status 1 at once (`eval.exits_at_once`), not at exit, where
  jax.distributed's shutdown barrier waits out the dead peer's heartbeat
  and aborts; where the collective waits instead, jax's heartbeat ends it
  (an abort, ~100 s), its records flushed. Either way it ends, and keeps
  every record it wrote."""
  out = tmp_path / 'run'
  argv = args(out, NUM_EXAMPLES='40') + [
      '--gin_file=mesh/partitioner.gin', *GLOBAL_1X4,
      f'--coordinator_address=localhost:{_free_port()}', '--num_processes=2']
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=(
      os.environ.get('XLA_FLAGS', '') +
      ' --xla_force_host_platform_device_count=2').strip())
  procs = [subprocess.Popen(
      [sys.executable, '-m', 'specdec_jax.eval', *argv, f'--process_id={i}'],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True) for i in range(2)]
  try:
    records = out / 'examples.jsonl'
    deadline = time.monotonic() + 300
    while not (records.exists() and records.stat().st_size):
      assert time.monotonic() < deadline and procs[0].poll() is None
      time.sleep(0.2)
    procs[1].kill()
    written = read_jsonl(records)
    killed = time.monotonic()
    log = procs[0].communicate(timeout=300)[0]
    waited = time.monotonic() - killed
  finally:
    for p in procs:
      p.kill()
  kept = read_jsonl(records)
  assert kept[:len(written)] == written and len(kept) < 40
  if procs[0].returncode == 1:  # its collective failed
    assert waited < 30, waited
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['examples'] == len(kept)
    assert 'rerun the same command to resume' in summary['status']
  else:  # jax's heartbeat ended it
    assert procs[0].returncode == -6, log[-3000:]
    assert 'JAX distributed service detected fatal errors' in log
    # No Python ran after the abort: the summary written at the start.
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['status'].startswith('unfinished: started '), summary
