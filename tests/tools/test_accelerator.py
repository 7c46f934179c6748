"""The accelerator run (tools/accelerator) runs with only what an
accelerator host has.

The GPU machine has jax, flax, numpy, matplotlib and this package, but no
seqio, TensorFlow, gin or rouge-score. `python -m tools.accelerator
--smoke` runs here in a subprocess where those cannot be
imported (a sitecustomize meta-path finder raises ImportError for them), so
an import of any of them anywhere on its path (the command line, the specs,
the device runner) fails this test; its outputs must hold every table of a
full run. The shipped-models source is checked against a stand-in
`specdec_jax.shipped` (its setup only: the phases are the synthetic ones).

The full measurement is `python -m tools.accelerator`
(tools/accelerator/README.md): one command of at most 8 minutes that runs its
phases in priority order, writes each phase's rows when it ends, skips the
phases an earlier run completed and starts none it cannot finish; its
projection, per phase, comes from the measured H100 run's time log.
"""

import argparse
import base64
import collections
import json
import os
import pathlib
import runpy
import shutil
import subprocess
import sys
import tarfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax
from specdec_jax import compiled
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax.bench import budget
from specdec_jax import models
from specdec_jax.bench import report
from specdec_jax.experiments import __main__ as cli
from tools.accelerator import aot
from tools.accelerator import plan as plan_lib
from tools.accelerator import pool as pool_lib
from tools.accelerator import run as run_lib
from tools.accelerator import spec as spec_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = spec_lib.SPEC
BLOCKED = ('seqio', 'tensorflow', 'tensorflow_datasets', 'tensorflow_text',
           'gin', 'rouge_score')
SITECUSTOMIZE = f'''
import importlib.util
import sys

BLOCKED = {BLOCKED!r}


def _blocked(name):
  return name.split('.')[0] in BLOCKED


class _Blocked:
  """Not installed on the accelerator host: imports fail."""

  def find_spec(self, name, path=None, target=None):
    if _blocked(name):
      raise ModuleNotFoundError(
          name + ' is blocked: not on the accelerator host', name=name)
    return None


_find_spec = importlib.util.find_spec


def find_spec(name, package=None):
  """Probes (`find_spec(name) is None`) see it missing, as it would be."""
  if _blocked(name):
    return None
  return _find_spec(name, package)


importlib.util.find_spec = find_spec
sys.meta_path.insert(0, _Blocked())
'''


def blocked_env(tmp_path):
  site = tmp_path / 'site'
  site.mkdir(exist_ok=True)
  (site / 'sitecustomize.py').write_text(SITECUSTOMIZE)
  env = dict(os.environ)
  # The package is installed (development mode); the repository on the
  # path too, for a checkout that is not.
  env['PYTHONPATH'] = os.pathsep.join(
      [str(site), str(ROOT)] + [p for p in [env.get('PYTHONPATH')] if p])
  env['JAX_PLATFORMS'] = 'cpu'  # XLA_FLAGS: the suite's (tests/conftest.py)
  return env


def run_smoke(tmp, out, *flags):
  """The command line's device run, in a folder without aot/."""
  return subprocess.run(
      [sys.executable, '-m', 'tools.accelerator', '--smoke', '--out_dir', str(out), '--compile_workers', '2', *flags],
      env=blocked_env(tmp), cwd=str(tmp), capture_output=True, text=True,
      timeout=1200)


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('accelerator')
  out = tmp / 'out'
  # As a GPU run with a trusted build: programs of later phases compile
  # beside the earlier phases' timing ('auto' does not on a CPU).
  proc = run_smoke(tmp, out, '--compile_ahead', 'on')
  result = None
  if (out / 'accelerator_synthetic.json').exists():
    result = json.loads((out / 'accelerator_synthetic.json').read_text())
  return proc, out, result


def test_blocked_modules_cannot_be_imported(tmp_path):
  """The block is real: otherwise the smoke run would prove nothing."""
  for name in ('seqio', 'gin', 'tensorflow', 'rouge_score'):
    proc = subprocess.run([sys.executable, '-c', f'import {name}'],
                          env=blocked_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and 'blocked' in proc.stderr, name


def test_smoke_runs_without_seqio_tensorflow_gin(smoke):
  proc, out, result = smoke
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert result['status'] == 'complete'
  assert result['skipped'] == []
  # Every phase, in priority order: done, or a named stub.
  phases = result['phases']
  assert list(phases) == ['p1', 'p2', 'p3', 'p4', 'p5', 'p6']
  assert {k: v['status'] for k, v in phases.items()} == dict(
      p1='complete', p2='complete', p3='complete', p4='complete',
      p5='complete', p6='complete')
  assert all(phases[k]['seconds'] > 0 for k in phases)
  md = (out / 'accelerator_synthetic.md').read_text()
  assert '## Phases (priority order)' in md and '| P3 | token trees' in md
  # Every timed program was compiled ahead of time, none inside a timing.
  assert result['compile_misses'] == []
  # No executables built for it (its cwd has no aot/): each program says
  # it was compiled here, and why; the device is described for a build.
  assert result['programs'] and all(
      v == 'compiled (not built)' or v.startswith('compiled ahead, beside P')
      for v in result['programs'].values())
  assert result['device_facts']['device_kind'] == jax.devices()[0].device_kind
  for name in ('accelerator_synthetic.md', 'accelerator_synthetic.json',
               'accelerator_synthetic_plots.png'):
    assert (out / name).is_file(), name
  # What a lent device machine sends back: at most 8 files.
  assert len([f for f in out.iterdir() if f.is_file()]) <= 8


def test_smoke_is_labelled_synthetic(smoke):
  _, out, result = smoke
  assert result['synthetic'] and result['source'] == 'synthetic'
  assert 'SYNTHETIC' in result['label']
  md = (out / 'accelerator_synthetic.md').read_text()
  assert md.startswith('# ') and 'SYNTHETIC' in md.splitlines()[0]
  assert '--smoke' in result['command'] and result['jax_version']
  assert result['command'].startswith(
      'python -m tools.accelerator --smoke')
  assert result['device'] == jax.devices()[0].device_kind


def test_smoke_costs_floor_and_drafters(smoke):
  _, _, result = smoke
  costs = result['costs']['bfloat16']
  assert sorted(costs) == ['1', '2']  # batches 1 and 2
  # k = 1..max_gamma + 1 (and the curve's 1..2); at batch 1 also the smoke
  # tree's greedy verified width, timed in P1 for P3's prediction.
  widths = {'1': ['1', '2', '5'], '2': ['1', '2']}
  for b, by_k in costs.items():
    assert sorted(by_k['t_ms'], key=int) == widths[b]
    assert by_k['cost']['1'] == 1.0
    assert all(t > 0 for t in by_k['t_ms'].values())
  assert set(result['costs']['float32']['1']['t_ms']) >= {'1'}
  floor = result['floor']
  assert floor['step_bytes'] > 0 and floor['floor_ms'] > 0
  assert floor['ratio'] == pytest.approx(floor['t1_ms'] / floor['floor_ms'])
  assert result['bandwidth']['bytes_per_s'] > 0
  names = {'small', 'base', 'large', 'bigram'}  # smoke: one n-gram
  assert set(result['drafters']) == names
  for d in result['drafters'].values():
    assert d['c']['1'] >= 0 and d['t_draft_ms']['1'] >= 0


def test_smoke_p1_times_tree_levels_and_keeps_the_xla_dump(smoke):
  """P1 times one level of two token trees (`measure.tree_level_time`,
  the mean over their levels) and keeps XLA's dump of t(1), the chain and
  a tree as compiled here, in one file; a CPU writes no thunk sequence,
  and the record says so."""
  _, out, result = smoke
  p1 = result['phases']['p1']
  t1 = result['costs']['bfloat16']['1']['t_ms']['1']
  levels = p1['tree_levels']
  assert sorted(levels) == ['beam:4,2,8', 'beam:8,4,12/64']
  for spec, n, fed in (('beam:8,4,12/64', 11, 4), ('beam:4,2,8', 7, 2)):
    x = levels[spec]
    assert x['drafter'] == result['main_drafter'] and x['levels'] == n
    assert x['fed'] == [fed] * n and x['level_ms'] > 0
    assert x['over_t1'] == pytest.approx(x['level_ms'] / t1)
  dump = p1['xla_dump']
  assert dump['errors'] == {}
  assert dump['programs']['t1'] == aot.program_name(('call', 'bfloat16', 1, 1))
  assert dump['programs']['tree'] == aot.program_name(plan_lib.tree_keys(
      spec_lib.SMOKE, result['main_drafter'], 'bfloat16')[0])
  assert sorted(dump['files']) == ['chain', 't1', 'tree']
  assert all(len(files) == 1 and files[0].endswith('after_optimizations.txt')
             for files in dump['files'].values())
  assert dump['note'].startswith('no thunk sequence')  # on a CPU
  with tarfile.open(out / dump['file']) as tar:
    assert sorted(os.path.normpath(n) for n in tar.getnames()) == sorted(
        ['.'] + list(dump['files']) + [f'{n}/{f}' for n, files in
                                       dump['files'].items() for f in files])
  # What a lent device machine sends back: at most 8 files.
  assert len(list(out.iterdir())) <= 8


def test_smoke_table2_rows(smoke):
  _, out, result = smoke
  rows = result['table2']
  assert {(r['drafter'], r['temperature']) for r in rows} == {
      (d, t) for d in ('small', 'base', 'large', 'bigram')
      for t in (0.0, 1.0)}
  for r in rows:
    assert r['gamma'] == 1 and r['gamma_rule']  # smoke: max_gamma 1
    assert r['predicted'] > 0 and r['measured'] > 0
    assert r['ratio'] == pytest.approx(r['measured'] / r['predicted'])
    assert 0 <= r['alpha'] <= 1 and 0 <= r['alpha_calibration'] <= 1
    assert r['paper'] is not None and 'alpha' in r['paper']
    if r['temperature'] == 0:
      # Greedy: every row identical or a diagnosed rounding near tie.
      assert r['mismatches'] == 0
      assert r['identical'] + r['near_ties'] == r['rows']
    else:
      assert r['identical'] is None
  md = (out / 'accelerator_synthetic.md').read_text()
  for section in ('## Baseline step vs its floor', '## cost(k)',
                  '## Drafters', '## Table 2', '## Numerics',
                  '## Batch 1, 8, 32', '## Gamma sweep', '## Time log'):
    assert section in md, section
  assert md.count('| synthetic | ') == len(rows) + len(result['trees']) + len(
      result['hf'])


def test_smoke_ours_against_hf_transformers(smoke):
  """P5: our loops and HF's on the same models, inputs and device."""
  _, out, result = smoke
  [row] = result['hf']
  assert row['task'] == 'synthetic' and row['rows'] == 2
  assert row['device'] == 'cpu'
  speed = lambda m: row[f'{m} tokens_per_s']
  for m in ('ours baseline', 'ours speculative', 'HF greedy', 'HF assisted'):
    assert speed(m) > 0, m
  assert row['baseline_vs_generate'] == pytest.approx(
      speed('ours baseline') / speed('HF greedy'))
  assert row['speculative_vs_assisted'] == pytest.approx(
      speed('ours speculative') / speed('HF assisted'))
  # Greedy on the same weights: HF's tokens are ours (tiny float32-free
  # models in bfloat16: a differing row would be a rounding near tie).
  assert row['ours speculative differing'] == 0
  assert row['HF greedy differing'] == row['HF assisted differing'] == 0
  assert '## Ours vs HF transformers' in (
      out / 'accelerator_synthetic.md').read_text()


def test_smoke_token_trees_against_the_best_chain(smoke):
  """P3: the first drafter's trees, greedy, each predicted from its own
  tokens per call at its verified width and set beside the best chain."""
  _, out, result = smoke
  [row] = result['trees']  # smoke: one tree, one task
  assert row['tree'] == 'beam:2,2,2/4' and row['gamma'] == 2
  assert row['drafter'] == 'small tree beam:2,2,2/4'
  assert row['nodes'] == 4  # '/4': the 4 most probable nodes verified
  assert row['mismatches'] == 0
  assert row['identical'] + row['near_ties'] == row['rows'] == 2
  assert row['tokens_per_call'] > 1  # more than the bonus token
  chains = [r for r in result['table2']
            if r['task'] == 'synthetic' and r['temperature'] == 0]
  best = max(chains, key=lambda r: r['measured'])
  assert row['best_chain'] == f"{best['drafter']} gamma {best['gamma']}"
  assert row['vs_best_chain'] == pytest.approx(
      row['measured'] / best['measured'])
  # The counters' prediction on this run's profile: tokens per call over
  # cost(nodes + 1) + depth x c (no chain's Theorem 3.8).
  assert row['predicted'] == pytest.approx(row['tokens_per_call'] / (
      row['cost_gamma_plus_1'] + row['gamma'] * row['c']))
  assert '## Token trees vs the best chain' in (
      out / 'accelerator_synthetic.md').read_text()


def test_smoke_every_phase_has_rows_and_the_projection(smoke):
  _, _, result = smoke
  assert result['alpha_calibration'] and result['drafters']
  assert {r['temperature'] for r in result['table2']} == {0.0, 1.0}
  for phase in ('table2', 'numerics', 'batches', 'sweep'):
    assert result[phase], phase
  assert set(result['costs']['bfloat16']['2']['t_ms']) >= {'1', '2'}  # curve
  # Each program compiled here, with its compile's thread-seconds.
  compiled_here = {k for k, v in result['programs'].items()
                   if v.startswith('compiled')}
  assert compiled_here and set(result['compile_s']) == compiled_here
  assert all(s > 0 for s in result['compile_s'].values())
  kinds = {e['kind'] for e in result['time_log']}
  assert kinds >= {'setup', 'compile', 'calibration', 'bandwidth', 'calls',
                   'drafters', 'decode', 'numerics', 'batch_decode', 'lower',
                   'ahead'}
  # From P2 on, a phase lowers programs of later phases to compile beside
  # its timing (here, where the phases time next to nothing, at least one
  # at a time); each is waited for by its phase, none compiled again, none
  # outside the pool.
  sources = collections.Counter(v.split(' (')[0]
                                for v in result['programs'].values())
  ahead = {k: v for k, v in sources.items() if k != 'compiled'}
  assert sources['compiled'] and ahead and all(
      k in [f'compiled ahead, beside P{i}' for i in range(2, 6)] for k in ahead)
  assert sum(ahead.values()) == sum(
      e['units'] for e in result['time_log'] if e['kind'] == 'ahead') == sum(
          e['units'] for e in result['time_log'] if e['kind'] == 'lower')
  assert not result['compile_misses']
  # The smoke run projects the full run from the measured H100 run.
  projection = result['projection']
  assert projection['of'] == 'the full synthetic run'
  assert projection['device'] == 'NVIDIA H100 80GB HBM3'
  assert projection['seconds'] > 0
  # Per phase, in priority order; the stubs cost nothing.
  by_phase = projection['phases']
  assert list(by_phase) == ['p1', 'p2', 'p3', 'p4', 'p5', 'p6']
  assert all(v['seconds'] > 0 for v in by_phase.values())
  assert sum(v['seconds'] for v in by_phase.values()) == pytest.approx(
      projection['seconds'] - projection['by_kind']['setup']['seconds'],
      abs=1)
  assert projection['by_kind']['compile']['units'] == projection['plan'][
      'compile'] > 40
  # The smoke run's own time log projects too (its kinds and units).
  own = pool_lib.projected_seconds(result, projection['plan'])
  assert own['seconds'] > 0 and not own['unmeasured']


def test_full_shipped_run_is_projected_by_phase(capsys):
  """The plan of the full shipped run, at the H100 run's measured rates."""
  full = SPEC.full
  drafts = plan_lib.roster(SPEC, 'shipped', ['target', 'dec2', 'small'],
                              full)
  projection = plan_lib.project(
      SPEC, SPEC.project_from, full, drafts, ['en_de', 'synopsis'],
      set(SPEC.phases), 'bfloat16', None, 'the full shipped run')
  assert projection['gammas_from_previous_run'] == 20  # every row's gamma
  plan, by_phase = projection['plan'], projection['phases']
  assert plan['calibration'] == 4
  # P1: the t(k) the later rows need: k = 1..max_gamma + 1 and the token
  # trees' greedy widths at batch 1, 1..max_gamma + 1 at batches 8 and 32.
  # P6: the rest of the curve (1..17 and the sparse k up to 65 at batch 1,
  # 1..17 at 8 and 32), beside the numerics' float32 t(1) and t(gamma + 1).
  phases, gammas = set(SPEC.phases), range(1, full.max_gamma + 2)
  assert plan_lib.needed_ks(full, 1, phases) == (*gammas, 61, 65)
  assert plan_lib.needed_ks(full, 8, phases) == tuple(gammas)
  assert plan_lib.needed_ks(full, 8, phases - {'batches'}) == ()
  assert by_phase['p1']['units']['calls'] == 11 + 2 * len(gammas)
  assert plan_lib.curve(SPEC, full, 1)[-1] == 65
  assert by_phase['p6']['units']['calls'] == 2 + sum(
      len(set(plan_lib.curve(SPEC, full, b)) -
          set(plan_lib.needed_ks(full, b, phases))) for b in full.batches)
  # P2 fits a command beside P1's measurements.
  assert 0 < by_phase['p2']['seconds'] < 240
  # >= 16 examples per row: the table's decode calls of both temperatures.
  assert plan['decode'] >= 2 * 2 * (16 + 1) * (1 + len(drafts))
  out = capsys.readouterr().out
  assert 'projected wall time' in out and 'P2 Table 2: ' in out
  # Programs compiled ahead of time are loads, not compiles: with P2's
  # built, P2 compiles nothing on the device and P1 is unchanged.
  gammas = plan_lib.previous_gammas(
      SPEC, report.read_json(plan_lib.ROOT / SPEC.project_from),
      SPEC.project_from, full, drafts, ['en_de', 'synopsis'])
  p2 = plan_lib.phase_keys(SPEC, full, drafts, ['en_de', 'synopsis'],
                              gammas, set(SPEC.phases), 'bfloat16')['p2'][1]
  again = plan_lib.project(
      SPEC, SPEC.project_from, full, drafts, ['en_de', 'synopsis'],
      set(SPEC.phases), 'bfloat16', None, 'the full shipped run',
      built={aot.program_name(k) for k in p2})
  units = again['phases']['p2']['units']
  assert 'compile' not in units and units['load'] == len(p2) > 10
  assert again['phases']['p1'] == by_phase['p1']
  assert again['phases']['p2']['seconds'] < by_phase['p2']['seconds']
  assert 'programs loaded from the ahead-of-time build' in (
      capsys.readouterr().out)
  # Compiled ahead: from P2 on, a phase lowers as many of the later
  # phases' programs as its timing lets compile beside it; fewer compile
  # as their phase starts, none twice.
  ahead = plan_lib.project(
      SPEC, SPEC.project_from, full, drafts, ['en_de', 'synopsis'],
      set(SPEC.phases), 'bfloat16', None, 'the full shipped run',
      built={aot.program_name(k) for k in p2}, ahead=True, lower_s=1.0)
  phases, plan = ahead['phases'], ahead['plan']
  assert 'lower' not in phases['p1']['units'] and phases['p2']['units'][
      'lower'] > 0
  assert plan['ahead'] == plan['lower'] > 0
  assert plan['compile'] + plan['ahead'] == again['plan']['compile']
  assert phases['p2']['ahead_s'] >= phases['p2']['units']['lower'] * 1.0
  assert ahead['seconds'] < again['seconds']
  assert "beside the earlier phases' timing" in capsys.readouterr().out


def test_the_wait_for_programs_compiled_ahead_is_projected():
  """From the second phase on, a phase lowers (one at a time) as many of
  the later phases' programs as keep the compile threads busy through its
  timing; they compile in order on the run's threads, and a phase waits
  for its last one beyond the phases before it."""
  prev = dict(time_log=[
      dict(what='compile (4 jobs, 2 threads)', seconds=20.0, at_s=20.0,
           kind='compile', units=4, jobs=4, workers=2, thread_seconds=40.0),
      dict(what='decode', seconds=30.0, at_s=50.0, kind='decode',
           units=10)])  # a compile 10 thread-seconds, a decode 3 s
  units = {'p1': {'decode': 1}, 'p2': {'decode': 5},
           'p3': {'compile': 3, 'decode': 1},
           'p4': {'compile': 2, 'decode': 1}}
  # P2 starts at 3 s, its 15 s keep 2 threads busy for 3 compiles: it
  # lowers P3's three (1.5 s); they compile on two threads from 4.5 s,
  # ready at 14.5, 14.5 and 24.5 s. P2 ends at 19.5 s; P3 waits 5 s,
  # lowers one of P4's (ceil(3 s x 2 / 10 s)), ready at 35 s, and ends at
  # 28 s; P4 waits 7 s, then compiles its other one as it starts.
  planned, extra = plan_lib.ahead_plan(prev, units, None, 0.5)
  assert planned == {
      'p1': {'decode': 1}, 'p2': {'decode': 5, 'lower': 3},
      'p3': {'decode': 1, 'ahead': 3, 'lower': 1},
      'p4': {'compile': 1, 'decode': 1, 'ahead': 1}}
  assert extra == pytest.approx({'p2': 1.5, 'p3': 5.5, 'p4': 7.0})
  assert plan_lib.ahead_plan(prev, units, None, None) == (units, {})
  # 90 s keep 8 threads busy for 16 compiles of 45 s, 3 already running;
  # a phase that times (next to) nothing still keeps one in flight.
  assert plan_lib.ahead_count(90.0, 8, 45.0, 3) == 13
  assert plan_lib.ahead_count(0.0, 8, 45.0, 0) == 1
  assert plan_lib.ahead_count(0.0, 8, 45.0, 1) == 0


def test_pooled_work_is_projected_in_waves_of_the_threads():
  """8 compiles of 10 thread-seconds each on 8 threads: 3 more take one
  more compile's time (a wave), 9 take two; a sequential kind its seconds
  per unit; fewer threads than the measured run, more waves."""
  run = dict(time_log=[
      dict(what='compile (8 jobs, 8 threads)', at_s=12.0, seconds=12.0,
           kind='compile', units=8, jobs=8, workers=8, thread_seconds=80.0),
      dict(what='decode', at_s=13.0, seconds=1.0, kind='decode', units=2)])
  seconds = lambda plan, workers=None: pool_lib.projected_seconds(
      run, plan, workers)['seconds']
  assert seconds({'compile': 3}) == 10.0
  assert seconds({'compile': 9}) == 20.0
  assert seconds({'compile': 9}, workers=16) == 20.0  # at most the run's 8
  assert seconds({'compile': 3}, workers=2) == 20.0
  assert seconds({'decode': 3, 'compile': 1}) == 1.5 + 10.0



def test_projection_reads_a_time_log_before_kinds_were_logged():
  run = json.loads((ROOT / SPEC.project_from).read_text())
  rates = pool_lib.unit_seconds(run)
  assert rates['compile']['units'] == 37 and rates['compile']['workers'] == 8
  assert rates['calls']['units'] == 15 and rates['drafters']['units'] == 7
  assert rates['decode']['units'] == 4 * (2 * 2 * 3 + 2)
  one = pool_lib.projected_seconds(run, {'compile': 8, 'bandwidth': 1}, 8)
  assert one['seconds'] == pytest.approx(
      rates['compile']['thread_seconds'] / 37 + 0.77, abs=0.1)
  slow = pool_lib.projected_seconds(run, {'compile': 8}, 2)  # fewer threads
  assert slow['seconds'] == pytest.approx(4 * (one['seconds'] - 0.77), 0.01)
  assert pool_lib.projected_seconds(run, {'nothing': 1})['unmeasured'] == [
      'nothing']


def test_smoke_numerics_batches_and_sweep(smoke):
  _, _, result = smoke
  numerics = {n['activation_dtype']: n for n in result['numerics']}
  assert set(numerics) == {'bfloat16', 'float32'}
  for n in numerics.values():
    # The same-shape baseline gives the speculative tokens bit for bit.
    assert n['identical_block'] == n['rows'] == 2
    assert n['mismatches_1token'] == n['mismatches_block'] == 0
    assert n['block_baseline_s'] > 0 and n['t1_ms'] > 0
  # Batch 2: fixed at batch 1's gamma (and, if it differs, at the
  # profile's gamma for batch 2), and streamed: 4 rows through 2 slots.
  *fixed, stream = result['batches']
  assert [r['batching'] for r in fixed] == ['fixed'] * len(fixed)
  assert fixed[0]['gamma_rule'].startswith('batch 1')
  assert stream['batching'] == 'stream'
  assert stream['gamma_rule'] == 'profile at batch 2'
  assert stream['gamma'] == fixed[-1]['gamma']
  for batch in result['batches']:
    assert batch['batch'] == 2 and batch['mismatches'] == 0
    assert batch['rows'] == (4 if batch is stream else 2)
    assert len(batch['per_row_accepted_length']) == batch['rows']
    assert all(1 <= a <= batch['gamma'] + 1
               for a in batch['per_row_accepted_length'])
    assert batch['iterations'] >= batch['mean_row_iterations']
  # Batch 2's gamma is the profile's rule on batch 2's cost curve and c.
  assert 'small' in result['drafters'] and '2' in result['drafters'][
      'small']['c']
  assert [r['gamma'] for r in result['sweep']] == [1, 2]
  # Table 2 has the first drafter also at the paper's gamma rule.
  rules = [r['gamma_rule'] for r in result['table2']
           if r['drafter'] == 'small' and r['temperature'] == 0]
  assert sorted(rules) == ['paper', 'profile']


def test_a_second_run_skips_the_complete_phases(smoke, tmp_path):
  _, out, first = smoke
  again = tmp_path / 'out'
  shutil.copytree(out, again)
  proc = run_smoke(tmp_path, again)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads((again / 'accelerator_synthetic.json').read_text())
  assert result['status'] == 'complete' and result['resumed']['used']
  for pid in ('p1', 'p2', 'p4', 'p6'):
    assert result['phases'][pid]['earlier_run'], pid
    assert f'{pid.upper()} ' in proc.stdout and 'not run again' in proc.stdout
  assert not [e for e in result['time_log'] if e['kind'] == 'compile']
  for key in ('table2', 'batches', 'sweep', 'numerics', 'costs'):
    assert result[key] == first[key], key


def test_a_phase_cut_short_reruns_or_is_skipped_for_time(smoke, tmp_path):
  """A run cut in P4 left it 'running' (results labelled partial); the
  rerun keeps P1, P2, P6 and, with no time left, skips P4 by name."""
  _, out, _ = smoke
  cut = tmp_path / 'out'
  shutil.copytree(out, cut)
  path = cut / 'accelerator_synthetic.json'
  result = json.loads(path.read_text())
  result['phases']['p4']['status'] = 'running'
  result['status'], result['batches'] = 'partial: running P4', []
  path.write_text(json.dumps(result))
  proc = run_smoke(tmp_path, cut, '--max_minutes', '0.001')
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads(path.read_text())
  assert result['phases']['p4']['status'].startswith(
      'skipped (time budget)')
  assert [x['what'] for x in result['skipped']] == ['P4 batches 8 and 32']
  assert result['status'].startswith('partial: P4 skipped (time budget)')
  assert all(result['phases'][p]['status'] == 'complete'
             for p in ('p1', 'p2', 'p6'))
  assert result['table2'] and not result['batches']
  assert '| P4 | batches 8 and 32 | skipped (time budget)' in (
      cut / 'accelerator_synthetic.md').read_text()


def test_shipped_models_load_without_tensorflow(tmp_path):
  """The shipped checkpoints and arrays load on a host without TF / seqio.

  (orbax / etils probe for TensorFlow; they must fall back, not fail.)
  """
  from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  # The shipped folder is committed: a checkout without it is broken.
  assert shipped.available(), shipped.asset_dir()
  code = (
      'import sys\n'
      'from tools.accelerator import run as run_lib\n'
      'shipped = run_lib.load_shipped()\n'
      'for name in shipped.model_names():\n'
      '  model, params = shipped.load_model(name, dtype="bfloat16")\n'
      'for task in ("en_de", "synopsis"):\n'
      '  assert shipped.test_arrays(task)["inputs"].ndim == 2\n'
      f'bad = [k for k in sys.modules if k.split(".")[0] in {BLOCKED!r}]\n'
      'print("loaded", len(shipped.model_names()), bad)\n')
  proc = subprocess.run([sys.executable, '-c', code],
                        env=blocked_env(tmp_path), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().endswith('[]')


class FakeShipped:
  """A stand-in for specdec_jax.shipped: tiny random models and arrays."""

  def __init__(self, available=True):
    self._available = available
    base = network.T5Config(
        vocab_size=256, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
        num_encoder_layers=1, num_decoder_layers=1,
        mlp_activations=('gelu', 'linear'), dropout_rate=0.0)
    # The target has the XXL-cost shapes of COSTS already (no widening to
    # compile); 'small' is widened to their small cost.
    self.configs = {'target': base.replace(
        emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
        num_encoder_layers=2, num_decoder_layers=2),
                    'small': base, 'gpu': base.replace(num_decoder_layers=1,
                                                       num_encoder_layers=2)}

  def available(self):
    return self._available

  def model_names(self):
    return list(self.configs)

  def load_model(self, name, dtype=None):
    model = network.T5Model(self.configs[name])
    # Random weights without compiling an initializer.
    rng = np.random.default_rng(len(name))
    shapes = jax.eval_shape(model.init_params, jax.random.key(0))
    return model, jax.tree_util.tree_map(
        lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32),
        shapes)

  def test_arrays(self, task):
    rng = np.random.default_rng(0 if task == 'en_de' else 1)
    length = 6 if task == 'en_de' else 9
    inputs = rng.integers(2, 256, (40, length)).astype(np.int32)
    inputs[:, -1] = 1
    targets = rng.integers(2, 256, (40, 7)).astype(np.int32)
    targets[:, -1] = 1
    return {'inputs': inputs, 'targets': targets}

  def sentencepiece_path(self):
    return '/nonexistent.model'


def use_fake(monkeypatch, fake):
  """Makes `from specdec_jax import shipped` give `fake` (None: fail)."""
  monkeypatch.setitem(sys.modules, 'specdec_jax.shipped', fake)
  if fake is None:  # a None entry in sys.modules makes the import fail
    monkeypatch.delattr(specdec_jax, 'shipped', raising=False)
  else:
    monkeypatch.setattr(specdec_jax, 'shipped', fake, raising=False)


# Tiny stand-ins for widening.PRESETS: the fake target's shapes, and twice
# the fake 'small' for the small cost.
COSTS = {
    't5_1_1_small_cost': dict(emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                              num_encoder_layers=1, num_decoder_layers=1),
    't5_1_1_xxl_cost': dict(emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                            num_encoder_layers=2, num_decoder_layers=2)}


def test_shipped_setup_with_a_stand_in_module(tmp_path, monkeypatch):
  """Drafters at own cost and widened to T5 1.1 cost; n-grams per task."""
  use_fake(monkeypatch, FakeShipped())
  argv = ['--smoke', '--source', 'shipped', '--out_dir', str(tmp_path)]
  args = run_lib.parse_flags(SPEC, argv)
  clock = budget.Clock(5)
  runner = run_lib.Runner(
      SPEC, args, SPEC.smoke._replace(costs=COSTS, target='target'), clock,
      pool_lib.Pool(1, clock), tmp_path,
      report.header(f'-m {run_lib.COMMAND}', argv,
                    max_minutes=5))
  runner.setup()
  assert runner.tasks == ['en_de', 'synopsis'] and runner.eos == 1
  # Smoke lengths (a full run takes the widest inputs / targets).
  assert (runner.Li, runner.T) == (SPEC.smoke.input_length,
                                   SPEC.smoke.output_length)
  assert all(x.shape[1] == runner.Li for x in runner.inputs.values())
  names = {d.name: d for d in runner.drafts}
  assert set(names) == {'small', 'small@t5_1_1_small_cost', 'gpu',
                        'bigram'}  # smoke: one n-gram order
  assert [d.group for d in runner.drafts] == sorted(
      d.group for d in runner.drafts)  # the paper's drafters first
  assert names['small@t5_1_1_small_cost'].group == 1
  assert names['small'].group == 2 and names['gpu'].group == 1
  assert runner.main.name == 'small@t5_1_1_small_cost'
  widened = names['small@t5_1_1_small_cost'].drafter.model.config
  for k, v in COSTS['t5_1_1_small_cost'].items():
    assert getattr(widened, k) == v, k
  assert widened.dtype == 'bfloat16'
  model, params = runner.target
  assert model.config.emb_dim == COSTS['t5_1_1_xxl_cost']['emb_dim']
  leaves = jax.tree_util.tree_leaves(params)
  assert all(x.dtype == jnp.bfloat16 for x in leaves)
  bigram = names['bigram']
  assert isinstance(bigram.drafter, drafters.NgramDrafter)
  assert not np.array_equal(bigram.params['en_de']['log_unigram'],
                            bigram.params['synopsis']['log_unigram'])
  # Widening preserves the function: the widened drafter scores like its
  # own-cost self (alpha is calibrated on the latter).
  x = jnp.asarray(runner.inputs['en_de'][:2])
  dec = jnp.ones((2, 4), jnp.int32)
  score = lambda d: np.asarray(jax.jit(d.drafter.score)(
      d.params['en_de'], x, dec))
  np.testing.assert_allclose(score(names['small@t5_1_1_small_cost']),
                             score(names['small']), atol=0.1)


@pytest.mark.parametrize('fake,message', [
    (FakeShipped(available=False), 'available'),
    (None, 'shipped.py'),
])
def test_shipped_source_fails_clearly(monkeypatch, fake, message):
  use_fake(monkeypatch, fake)
  with pytest.raises(SystemExit, match=message):
    run_lib.load_shipped()


@pytest.mark.parametrize('argv,message', [
    (['--smoke'], 'needs --out_dir'),
    (['--phases', 'table2,tabel3'], 'tabel3'),
    (['--sigma', 'tiny=0.1'], 'sigma'),
    (['--max_minutes', '0'], 'max_minutes'),
    (['--examples', '0'], 'examples'),
])
def test_bad_flags_are_named(argv, message, capsys):
  with pytest.raises(SystemExit):
    run_lib.parse_flags(SPEC, argv)
  assert message in capsys.readouterr().err


def test_the_command_line_runs_the_device_spec(monkeypatch, capsys):
  """`python -m tools.accelerator` takes the device run's flags; the
  package's own command line knows no device spec."""
  monkeypatch.setattr(sys, 'argv', ['tools.accelerator', '--phases',
                                    'tabel3'])
  with pytest.raises(SystemExit) as exit_:
    runpy.run_module('tools.accelerator', run_name='__main__',
                     alter_sys=True)
  assert exit_.value.code == 2
  assert "--phases: unknown ['tabel3']" in capsys.readouterr().err
  with pytest.raises(SystemExit) as exit_:
    cli.main(['run', 'accelerator'])
  assert exit_.value.code == 2
  assert "invalid choice: 'accelerator'" in capsys.readouterr().err


def test_device_names_are_folder_names():
  assert report.device_name('NVIDIA H100 80GB HBM3') == (
      'nvidia-h100-80gb-hbm3')
  assert report.device_name('TPU v5 lite') == 'tpu-v5-lite'
  assert report.device_name('cpu') == 'cpu'


def tiny_decode_program():
  """A tiny T5's greedy decode as a function of its dynamic arguments (as
  `run_lib.Runner.decode_fn` builds them), its params and inputs."""
  model = network.T5Model(models.config(
      't5_1_1_tiny', vocab_size=64, num_encoder_layers=1,
      num_decoder_layers=1))
  params = model.init_params(jax.random.key(0))
  x = jnp.asarray(np.random.default_rng(0).integers(2, 64, (2, 6)),
                  jnp.int32)

  def base(params, x, rng):
    return decoding.temperature_sample(model, params, x, max_decode_len=5,
                                       eos_id=-1, rng=rng)
  return base, params, x


def compile_fresh(lowered):
  """`lowered.compile()` past jax's persistent cache (the suite's): an
  executable read from that cache serializes without its code, as an
  ahead-of-time build never does (`--aot_build` turns the cache off)."""
  before = jax.config.jax_enable_compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  try:
    return lowered.compile()
  finally:
    jax.config.update('jax_enable_compilation_cache', before)


def test_executable_round_trip_on_cpu(tmp_path):
  """The path a GPU run takes with executables built elsewhere, on a CPU:
  compile, serialize, write, load with the run's loader (a new `Store` on
  the folder, through `Pool.compile`), run: the jitted program's tokens."""
  fn, params, x = tiny_decode_program()
  store = aot.Store(tmp_path, 'cpu')
  store.describe(jax.devices()[0])
  lowered = jax.jit(fn).lower(params, x, None)
  entry = store.save('base', compile_fresh(lowered), 1.0)
  store.write()
  assert entry['bytes'] > 0 and len(entry['sha256']) == 64
  manifest = json.loads((tmp_path / 'cpu' / aot.MANIFEST).read_text())
  assert manifest['versions']['jax'] == jax.__version__
  assert manifest['device_kind'] == jax.devices()[0].device_kind
  clock = budget.Clock(5)
  pool = pool_lib.Pool(1, clock)
  again = aot.Store(tmp_path, 'cpu')
  pool.compile('round trip', {'base': lambda: lowered},
               lambda key: again.load(key))
  assert pool.sources == {'base': 'loaded'}
  out = pool.executables['base'](params, x, None)
  np.testing.assert_array_equal(out.tokens, fn(params, x, None).tokens)


def test_packed_executables_load_and_a_corrupt_pack_is_named(tmp_path):
  """`Store.pack`: programs in one xz pack (their own files removed, the
  folder's bytes the pack's), loaded by a new `Store` on the folder and
  run; a damaged pack is named and its programs compiled instead."""
  fn, params, x = tiny_decode_program()
  x = x[:1]  # a program no other test compiles (none cached in-process)
  store = aot.Store(tmp_path, 'cpu')
  store.describe(jax.devices()[0])
  lowered = jax.jit(fn).lower(params, x, None)
  compiled = compile_fresh(lowered)
  for i, name in enumerate(('a', 'b', 'c')):
    store.save(name, compiled, priority=i)
  alone = store.total_bytes()
  store.pack()  # fewer than aot.PACK: nothing packed yet
  assert all('pack' not in e for e in store.manifest['programs'].values())
  store.pack(final=True)
  files = sorted(p.name for p in (tmp_path / 'cpu').iterdir())
  assert files == ['manifest.json', 'pack-0.xz']
  assert store.total_bytes() == (tmp_path / 'cpu' / 'pack-0.xz').stat(
      ).st_size < alone
  again = aot.Store(tmp_path, 'cpu')
  assert again.built('b')
  for name in ('a', 'c'):
    exe, why = again.load(name)
    assert why == ''
    np.testing.assert_array_equal(exe(params, x, None).tokens,
                                  fn(params, x, None).tokens)
  pack = tmp_path / 'cpu' / 'pack-0.xz'
  pack.write_bytes(pack.read_bytes()[:-20] + bytes(20))
  exe, why = aot.Store(tmp_path, 'cpu').load('b')
  assert exe is None and 'pack-0.xz is corrupt' in why


def test_a_store_fits_a_limit_by_dropping_its_last_programs(tmp_path):
  """`Store.fit`: the programs of lowest priority go until the folder
  weighs at most the limit (what a device command carries beside the
  working tree); the pack the limit falls in is packed again with those
  that fit, and they load and run; a limit below any program empties it.
  `packed_bytes` estimates unpacked programs at the packs' ratio."""
  fn, params, x = tiny_decode_program()
  x = x[:1, :4]  # a program no other test compiles (none cached in-process)
  compiled = compile_fresh(jax.jit(fn).lower(params, x, None))
  store = aot.Store(tmp_path, 'cpu')
  store.describe(jax.devices()[0])
  names = [f'p{i}' for i in range(aot.PACK + 2)]  # two packs
  for i, name in enumerate(names):
    store.save(name, compiled, priority=i)
  store.pack()  # the first PACK packed, two alone
  assert store.manifest['packs'] and store.packed_bytes() < store.total_bytes()
  store.pack(final=True)
  full = store.total_bytes()
  assert store.fit(full) == [] and store.total_bytes() == full
  dropped = store.fit(full - 1)
  kept = names[:len(names) - len(dropped)]
  assert dropped == names[len(kept):] and kept
  assert store.total_bytes() <= full - 1
  again = aot.Store(tmp_path, 'cpu')
  assert sorted(again.manifest['programs']) == sorted(kept)
  assert sorted(p.name for p in (tmp_path / 'cpu').iterdir()) == sorted(
      ['manifest.json', *again.manifest['packs']])
  assert again.total_bytes() == sum(
      (tmp_path / 'cpu' / f).stat().st_size for f in again.manifest['packs'])
  exe, why = again.load(kept[-1])
  assert why == ''
  np.testing.assert_array_equal(exe(params, x, None).tokens,
                                fn(params, x, None).tokens)
  assert again.fit(0) == kept
  assert [p.name for p in (tmp_path / 'cpu').iterdir()] == ['manifest.json']


def test_the_executables_get_what_a_device_command_leaves(tmp_path,
                                                          monkeypatch):
  """A device command carries 64 MiB in all: the files git tracks and the
  untracked ones it does not ignore, and the carried executables. The
  build's default limit is what the working tree leaves (less a margin);
  `--aot_max_mib` sets it."""
  subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
  (tmp_path / 'tracked').write_bytes(bytes(100))
  subprocess.run(['git', '-C', str(tmp_path), 'add', 'tracked'], check=True)
  (tmp_path / 'untracked').write_bytes(bytes(50))
  (tmp_path / '.gitignore').write_text('/aot/\n')
  (tmp_path / 'aot').mkdir()
  (tmp_path / 'aot' / 'pack-0.xz').write_bytes(bytes(1000))
  tree = 100 + 50 + len('/aot/\n')
  assert plan_lib.working_tree_bytes(tmp_path) == tree
  assert plan_lib.aot_budget(tmp_path) == (
      plan_lib.TRAVEL_LIMIT - plan_lib.TRAVEL_MARGIN - tree)
  (tmp_path / 'tracked').unlink()  # deleted: not sent
  assert plan_lib.working_tree_bytes(tmp_path) == tree - 100
  with pytest.raises(subprocess.CalledProcessError):
    plan_lib.working_tree_bytes(tmp_path / 'aot' / 'none')
  # This repository leaves room for executables beside its tree.
  assert 0 < plan_lib.aot_budget() < (
      plan_lib.TRAVEL_LIMIT - plan_lib.TRAVEL_MARGIN)
  flags = lambda mib: argparse.Namespace(aot_max_mib=mib)
  assert run_lib.aot_limit(flags(1.5)) == int(1.5 * 2 ** 20)
  monkeypatch.setattr(plan_lib, 'aot_budget', lambda: 12345)
  assert run_lib.aot_limit(flags(None)) == 12345


# XLA's autotune results in text form as a GPU run writes them (one result;
# the HLO shortened): what a GPU build reads its device from.
AUTOTUNE_TEXT = """version: 3
results {
  device: "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 3352 GB/s, L2 cache: 52 MB, DNN version: 9.14.0"
  hlo: "(bf16[1,4096]{1,0}, bf16[4096,4096]{1,0}) -> bf16[1,4096]{1,0}"
  result {
    run_time { nanos: 5120 }
    gemm { algorithm: -1 }
  }
}
"""


def test_a_gpu_build_takes_the_devices_autotune_results(tmp_path):
  """Without the device's autotune results a GPU build leaves GEMMs to
  cuBLAS; with them it loads them and compiles for the device they were
  timed on (XLA keys them by it); other flags, results or configs make a
  build start afresh; a run writes its results beside its own."""
  assert aot.build_flags('gpu') == list(aot.UNTUNED_FLAGS)
  assert aot.build_flags('tpu') == aot.build_flags('cpu') == []
  results = tmp_path / aot.AUTOTUNE_FILE
  results.write_text(AUTOTUNE_TEXT)
  assert aot.build_flags('gpu', results) == [
      f'--xla_gpu_load_autotune_results_from={results}']
  device = aot.autotune_device(AUTOTUNE_TEXT)
  assert device.startswith('CUDA: 9.0, Cores: 132,') and aot.autotune_device(
      'version: 3\n') is None
  config = aot.match_autotune_device(
      compiled.gpu_target_config('h100'), device)
  assert 'memory_bandwidth: 3352000000000 ' in config  # the chip: 3.35e12
  assert 'dnn_version_info { major: 9 minor: 14 patch: 0 }' in config
  assert 'l2_cache_size: 52428800 ' in config  # 50 MiB: "52 MB" kept
  assert 'cuda_compute_capability { major: 9 minor: 0 }' in config
  with pytest.raises(ValueError, match='not an XLA autotune device key'):
    aot.match_autotune_device(config, 'H100')
  # Which results a build or a run starts with.
  flags = lambda **kw: argparse.Namespace(**{
      **dict(aot_build=None, autotune_results=None, out_dir=None,
             smoke=False, target_config=None), **kw})
  assert run_lib.autotune_file(flags(aot_build='gpu:h100',
                                        autotune_results=str(results))) == (
                                            results)
  with pytest.raises(SystemExit, match='no file of XLA autotune results'):
    run_lib.autotune_file(flags(aot_build='gpu:h100',
                                   autotune_results=str(tmp_path / 'no')))
  assert run_lib.autotune_file(flags(aot_build='gpu:h100',
                                        autotune_results='')) is None
  assert run_lib.autotune_file(flags(aot_build='cpu')) is None
  assert run_lib.autotune_file(flags(out_dir=str(tmp_path))) == results
  assert run_lib.autotune_file(flags(out_dir=str(tmp_path),
                                        smoke=True)) is None
  assert run_lib.build_config(flags(aot_build='cpu'), results) is None
  chip = tmp_path / 'h100.textproto'
  chip.write_text(compiled.gpu_target_config('h100'))
  gpu = flags(aot_build='gpu:h100', target_config=str(chip))
  assert run_lib.build_config(gpu, results) == config
  other = tmp_path / 'other.textproto'  # a key in no form it knows: kept
  other.write_text(AUTOTUNE_TEXT.replace(device, 'sm_90'))
  assert run_lib.build_config(gpu, other) == chip.read_text()
  # A store built otherwise is dropped by the next build's describe.
  store = aot.Store(tmp_path, 'cpu')
  cpu = jax.devices()[0]
  store.describe(cpu)
  store.dir.mkdir(parents=True)
  (store.dir / 'p.xla.zz').write_bytes(b'x')
  store.manifest['programs']['p'] = dict(file='p.xla.zz')
  store.describe(cpu)
  assert store.built('p')
  store.describe(cpu, xla_flags=aot.build_flags('gpu'))
  assert not store.built('p') and not (store.dir / 'p.xla.zz').exists()


def test_a_build_compiles_for_the_topology_a_run_recorded(tmp_path,
                                                          monkeypatch):
  """A run on a GPU or TPU records its devices' topology as XLA serializes
  it; a build for that device compiles for the compile-only twin of it
  (from the default results json or --device_topology), names it by its
  sha in the store's manifest, and falls back to the target config when
  the topology builds nothing here."""
  gpu = argparse.Namespace(platform='gpu', device_kind='NVIDIA H100',
                           client=None, memory_stats=dict)
  served = []

  class Topology:
    def serialize(self):
      served.append(1)
      return b'\x08\x01topology'

  monkeypatch.setattr(aot.topologies, 'get_attached_topology',
                      lambda platform: Topology() if platform == 'gpu' else
                      None)
  facts = aot.device_facts(gpu)
  assert served and aot.device_topology(facts) == b'\x08\x01topology'
  assert 'topology' not in aot.device_facts(jax.devices('cpu')[0])
  monkeypatch.setattr(aot.topologies, 'get_attached_topology',
                      lambda platform: 1 / 0)
  failed = aot.device_facts(gpu)
  assert aot.device_topology(failed) is None
  assert 'ZeroDivisionError' in failed['topology_error']
  # Which run's topology a build takes.
  run = tmp_path / 'run.json'
  run.write_text(json.dumps(dict(device_facts=facts)))
  bare = tmp_path / 'bare.json'
  bare.write_text(json.dumps(dict(device_facts=failed)))
  flags = lambda **kw: argparse.Namespace(**{
      **dict(aot_build='gpu:h100', device_topology=None, target_config=None,
             autotune_results=''), **kw})
  assert run_lib.recorded_topology(flags(device_topology=str(run)),
                                      'x') == (run, b'\x08\x01topology')
  with pytest.raises(SystemExit, match='hold no topology'):
    run_lib.recorded_topology(flags(device_topology=str(bare)), 'x')
  with pytest.raises(SystemExit, match='--device_topology'):
    run_lib.recorded_topology(flags(device_topology=str(tmp_path / 'no')),
                                 'x')
  assert run_lib.recorded_topology(flags(device_topology=''), 'x') is None
  assert run_lib.recorded_topology(flags(aot_build='cpu'), 'x') is None
  assert run_lib.recorded_topology(flags(target_config='c.txt'),
                                      'x') is None
  monkeypatch.setattr(run_lib, 'target_results', lambda target: tmp_path)
  assert run_lib.recorded_topology(flags(), 'run')[1] == (
      b'\x08\x01topology')
  assert run_lib.recorded_topology(flags(), 'bare') is None
  assert run_lib.recorded_topology(flags(), 'absent') is None
  # The device built for: the recorded one, else the target config's.
  asked = []

  def devices(name, target_config=None, topology=None):
    asked.append((name, target_config, topology))
    if topology == b'\x08\x01topology':
      return ('twin',)
    if topology is not None:
      raise ValueError('cannot read the recorded device topology')
    return ('configured',)

  monkeypatch.setattr(compiled, 'devices', devices)
  monkeypatch.setattr(aot, 'twin_devices', lambda target, topology: devices(
      target.name, topology=topology))
  monkeypatch.setattr(aot, 'check_compiles', lambda device: None)
  device, config = run_lib.build_target(flags(), None, 'run')
  assert device == 'twin' and asked == [('gpu:h100', None,
                                         b'\x08\x01topology')]
  assert 'sha256 ' + aot.sha256(b'\x08\x01topology')[:16] in config
  odd = tmp_path / 'odd.json'
  odd.write_text(json.dumps(dict(device_facts=dict(
      topology=base64.b64encode(b'odd').decode()))))
  asked.clear()
  assert run_lib.build_target(flags(), None, 'odd') == ('configured', None)
  assert asked[-1] == ('gpu:h100', None, None)
  with pytest.raises(SystemExit):  # one of the two names the device
    run_lib.parse_flags(spec_lib.SPEC, [
        '--aot_build', 'gpu:h100', '--device_topology', str(run),
        '--target_config', 'c.txt'])


def test_a_recorded_topology_must_be_the_targets(monkeypatch):
  """The twins of a run's devices are only those of the build's target:
  a topology this jax cannot read, or of another platform or size, is a
  named error (the build then compiles for the target config instead)."""
  twins = aot.twin_devices.__wrapped__  # uncached: the class is patched
  gpu = argparse.Namespace(platform='cuda')

  class Description:
    devices = (gpu,)

    @staticmethod
    def deserialize(data):
      if data != b'one gpu':
        raise RuntimeError('unreadable')
      return Description

  monkeypatch.setattr(aot.topologies, 'TopologyDescription', Description)
  assert twins(compiled.get_target('gpu:h100'), b'one gpu') == (gpu,)
  with pytest.raises(ValueError, match="'gpu:h100x8' .*has 1 gpu devices"):
    twins(compiled.get_target('gpu:h100x8'), b'one gpu')
  with pytest.raises(ValueError, match="'tpu:v5e:1x1' .*has 1 gpu devices"):
    twins(compiled.get_target('tpu:v5e:1x1'), b'one gpu')
  with pytest.raises(ValueError, match='cannot read the recorded device'):
    twins(compiled.get_target('gpu:h100'), b'odd')


def test_the_run_takes_the_alpha_calibration_its_build_computed(tmp_path):
  """The build decodes the alpha calibration (a property of the models and
  examples, not of the device) and the run takes it instead of compiling
  its decodes on the device, only when it was computed for this run: the
  same code, models, sizes and lengths."""
  r = run_lib.Runner.__new__(run_lib.Runner)
  r.args = argparse.Namespace(source='synthetic', smoke=True, seed=0)
  r.synthetic, r.refused = True, None
  r.result = {'setup': dict(sigmas={'small': 0.02}, sizes={'examples': 2},
                            tasks=['synthetic'], input_length=8,
                            output_length=10)}
  r.store = aot.Store(tmp_path, 'cpu')
  assert r.carried_calibration() is None  # the build computed none
  rows = [dict(task='synthetic', drafter='small', temperature=0.0,
               alpha=0.75)]
  r.store.manifest['alpha_calibration'] = dict(
      key=r.calibration_key(), rows=rows, machine='here')
  assert r.carried_calibration()['rows'] == rows
  r.args.seed = 1  # other models
  assert r.carried_calibration() is None
  r.args.seed = 0
  r.result['setup']['output_length'] = 11
  assert r.carried_calibration() is None
  r.result['setup']['output_length'] = 10
  r.refused = 'slower'  # a slow build's alphas are as good
  assert r.carried_calibration()['rows'] == rows
  r.store = None
  assert r.carried_calibration() is None


def test_a_slower_ahead_of_time_build_is_not_used():
  """Before anything is timed, a loaded t(1) is timed against the same
  program compiled on the device: within `AOT_SLOWER` the loaded programs
  stay; slower, every loaded one is dropped and compiled again, the check's
  own compile serves t(1), and later phases compile (saying why)."""
  key = ('call', 'bfloat16', 1, 1)

  def runner(loaded_s, here_s):
    r = run_lib.Runner.__new__(run_lib.Runner)
    r.targets, r.caches = {'bfloat16': (None, 'params')}, {
        ('bfloat16', 1): 'cache'}
    r.s, r.result, r.refused = spec_lib.SPEC.smoke._replace(
        cost_repeats=3), {}, None
    r.pool, r.phases_compiled = pool_lib.Pool(1, budget.Clock(5)), []
    r.phase_programs = r.phases_compiled.append
    r.pool.adopt(key, lambda p, b, c, n: time.sleep(n * loaded_s), 'loaded')
    r.pool.adopt(('cache', 'bfloat16', 1), None, 'loaded')
    r.pool.adopt(('draft', 'dec2', 1), None, 'compiled (not built)')
    here = lambda p, b, c, n: time.sleep(n * here_s)
    r.aot_check(key, here)
    return r, here

  r, _ = runner(1e-4, 1.5e-4)  # loaded faster
  assert r.refused is None and r.phases_compiled == []
  assert r.result['aot_check']['verdict'] == 'loaded programs used'
  assert set(r.pool.sources.values()) == {'loaded', 'compiled (not built)'}
  r, here = runner(3e-4, 1e-4)
  check = r.result['aot_check']
  assert check['loaded_over_compiled_here'] > plan_lib.AOT_SLOWER
  assert check['verdict'] == 'every program compiled here'
  assert r.refused.startswith('the ahead-of-time build ran t(1)')
  assert r.phases_compiled == ['p1'] and r.pool.executables[key] is here
  assert r.pool.sources == {key: f'compiled ({r.refused})',
                            ('draft', 'dec2', 1): 'compiled (not built)'}
  assert ('cache', 'bfloat16', 1) not in r.pool.compiled
  # A resumed run (P1 from an earlier one) takes that run's verdict.
  for verdict, refused in (('loaded programs used', False),
                           ('every program compiled here', True)):
    r = run_lib.Runner.__new__(run_lib.Runner)
    r.store, r.refused = object(), None
    r.result = {'aot_check': dict(verdict=verdict,
                                  loaded_over_compiled_here=2.5)}
    r.check_store()
    assert (r.refused is not None) == refused
    assert not refused or r.refused.startswith(
        'the ahead-of-time build ran t(1) 2.50x slower')


def test_programs_compiled_ahead_are_taken_when_their_step_comes():
  """`Pool.ahead` compiles in threads of its own (the pool's jobs never
  queue behind them); the step that needs a program waits for it instead
  of compiling it again, and compiles one whose compile ahead failed,
  saying why."""
  fn, params, x = tiny_decode_program()
  lowered = jax.jit(fn).lower(params, x, None)
  pool, gate, threads = pool_lib.Pool(1, budget.Clock(5)), threading.Event(), []

  def compile_after_the_gate():
    threads.append(threading.current_thread().name)
    assert gate.wait(30)
    return lowered.compile()

  def fails():
    raise RuntimeError('no autotune result for a fusion')

  # As the run hands them over: a lowering that raised raises in the
  # compile ahead, not in the phase that lowered it.
  failed = run_lib.lower_or_error(fails)
  assert pool.ahead({'base': compile_after_the_gate,
                     'bad': lambda: run_lib.lowered_or_raise(failed)},
                    'compiled ahead, beside P2') == ['base', 'bad']
  assert pool.ahead({'base': lowered.compile}, 'again') == []
  start = time.perf_counter()  # the pool's one thread is free meanwhile
  assert pool.run('untimed', {'job': lambda: 7}) == {'job': 7}
  assert time.perf_counter() - start < 10 and not gate.is_set()
  gate.set()
  twice = lambda: pytest.fail('compiled again')
  pool.compile('P3 programs', {'base': twice, 'bad': lambda: lowered},
               None, 'not built')
  assert threads[0].startswith(f'{pool_lib.Pool.THREADS}-ahead')
  assert pool.sources == {
      'base': 'compiled ahead, beside P2',
      'bad': "compiled (its compile ahead failed: RuntimeError('no autotune "
             "result for a fusion'))"}
  assert pool.program_seconds['base'] > 0 and not pool.pending
  assert [(e['kind'], e['units']) for e in pool.clock.log] == [
      ('untimed', 1), ('ahead', 2), ('compile', 1)]
  np.testing.assert_array_equal(
      pool.executables['base'](params, x, None).tokens,
      fn(params, x, None).tokens)


def test_programs_compiled_beside_the_timing_run_no_kernel():
  """On a GPU a compile beside the timing times no kernel (autotuning):
  without autotune results, cuBLAS's heuristics as in an untuned build;
  with them, every choice from them. Each option is one XLA knows (a
  misspelt one is refused by name)."""
  untuned = aot.deviceless_options('gpu', aot.build_flags('gpu'))
  assert untuned['xla_gpu_autotune_level'] == 0
  assert aot.build_flags('gpu') == [
      f'--{k}={str(v).lower()}' for k, v in untuned.items()
      if k != 'xla_gpu_autotune_level']
  tuned = aot.deviceless_options('gpu', aot.build_flags(
      'gpu', pathlib.Path('autotune.textproto')))
  assert tuned == {'xla_gpu_require_complete_aot_autotune_results': True}
  assert aot.deviceless_options('tpu', []) == aot.deviceless_options(
      'cpu', []) == {}
  lowered = jax.jit(lambda a: a @ a).lower(jnp.ones((4, 4)))
  for options in (untuned, tuned):
    lowered.compile(compiler_options=options)
  with pytest.raises(Exception, match='No such compile option'):
    lowered.compile(compiler_options={'xla_gpu_autotune_levle': 0})


@pytest.mark.parametrize('damage, why', [
    ('corrupt', 'checksum mismatch'), ('versions', 'versions differ'),
    ('code', 'built from other code'), ('device', 'built for'),
    ('missing', 'missing file')])
def test_unloadable_executable_is_compiled_instead(tmp_path, damage, why):
  """A corrupt, version-mismatched, other-code, other-device or missing
  executable is compiled here instead, and the run's record says which and
  why."""
  fn, params, x = tiny_decode_program()
  store = aot.Store(tmp_path, 'cpu')
  store.describe(jax.devices()[0])
  lowered = jax.jit(fn).lower(params, x, None)
  path = tmp_path / 'cpu' / store.save('base',
                                       compile_fresh(lowered))['file']
  if damage == 'corrupt':
    path.write_bytes(path.read_bytes()[:-10] + b'0123456789')
  elif damage == 'versions':
    store.manifest['versions']['jaxlib'] = '0.0.1'
  elif damage == 'code':  # built before the package's code changed
    store.manifest['code'] = aot.sha256(b'the code as it was')
  elif damage == 'device':
    store.manifest['device_kind'] = 'NVIDIA H100 80GB HBM3'
  else:
    path.unlink()
  store.write()
  again = aot.Store(tmp_path, 'cpu')
  assert again.load('base')[0] is None and why in again.load('base')[1]
  pool = pool_lib.Pool(1, budget.Clock(5))
  pool.compile('fallback', {'base': lambda: lowered}, again.load)
  assert pool.sources['base'].startswith('compiled (' + why)
  if damage == 'missing':  # a refused build: nothing loads, each says why
    refused = pool_lib.Pool(1, budget.Clock(5))
    refused.compile('refused', {'base': lambda: lowered}, None, 'slower')
    assert refused.sources['base'] == 'compiled (slower)'
  out = pool.executables['base'](params, x, None)
  np.testing.assert_array_equal(out.tokens, fn(params, x, None).tokens)
  if damage in ('code', 'versions', 'device'):
    # A build into this folder now starts afresh: the stale program (and
    # its file) is dropped, so it is built again, not skipped as built.
    assert again.built('base') and again.usable() == (
        {} if damage == 'code' else again.manifest['programs'])
    again.describe(jax.devices()[0])
    assert not again.built('base') and not path.exists()
