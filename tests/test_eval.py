"""The eval job runs end to end like a T5X job and fails clearly.

Random tiny T5s on the offline Debian translation task (a slice shipped in
tests/testdata/debian). The job must write every output, resume instead of
starting over, keep finished work when it crashes, and name the problem when
the configuration is wrong.
"""

import dataclasses
import itertools
import json
import pathlib

import pytest

from specdec_jax import checks
from specdec_jax import data
from specdec_jax import eval as eval_lib
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import run_folder
from specdec_jax import speculative
from specdec_jax import summary as summary_lib
from specdec_jax import unit_loop

DATA = pathlib.Path(__file__).resolve().parent / 'testdata' / 'debian'


# Continuous batching, as the job runs by default at batch > 1: chunks of 2
# batches of 2 (4 examples, 2 slots refilled). `args` decodes fixed batches
# unless given these (tests/test_diagnostics.py spies on the fixed-batch
# decoders through it).
STREAM = {'BATCHING': "'stream'", 'BatchSpec.chunk': '2'}
# gamma chosen for the batch by a profile the job measures (the default at
# batch > 1); `args` keeps GAMMA unless given this.
PROFILE = {'BatchSpec.gamma_rule': "'profile'", 'BatchSpec.max_gamma': '2'}


def args(out, **overrides):
  bindings = {
      'BATCHING': "'fixed'",
      'BatchSpec.gamma_rule': "'config'",
      'TARGET_MODEL': '%T5_1_1_TINY',
      'DRAFT_MODEL': '%T5_1_1_TINY',
      'TARGET_CHECKPOINT': 'None',
      'DRAFT_CHECKPOINT': 'None',
      'MIXTURE_OR_TASK_NAME': "'debian_desc_en_de'",
      'TASK_FEATURE_LENGTHS': "{'inputs': 512, 'targets': 12}",
      'GAMMA': '3',
      'NUM_EXAMPLES': '4',
      'BATCH_SIZE': '2',
      'EVAL_OUTPUT_DIR': f"'{out}'",
      'VOCAB_SIZE': '1024',
      'DTYPE': "'float32'",
      'DataSpec.data_dir': f"'{DATA}'",
  }
  bindings.update(overrides)
  return ['--gin_file=runs/eval.gin', '--gin_file=models/t5_1_1/tiny.gin'] + [
      f'--gin.{k}={v}' for k, v in bindings.items()]


def read_jsonl(path):
  return [json.loads(l) for l in path.read_text().splitlines() if l]


# A unit's times and what else ran while it was timed (never reproduced).
TIMING = ('baseline_batch_s', 'speculative_batch_s', 'other_load')


def check_summary_is_the_records(out, num_examples):
  """summary.json and summary.md say what the records say: every figure
  recomputed here from examples.jsonl (the first `num_examples` indices),
  independently of the job's summary code. Returns the summary."""
  summary = json.loads((out / 'summary.json').read_text())
  every = read_jsonl(out / 'examples.jsonl')
  records = [r for r in every if r['index'] < num_examples]
  total = lambda key: sum(r[key] for r in records)
  units = {(r.get('chunk'), r['batch'] if 'chunk' not in r else None):
           (r['baseline_batch_s'], r['speculative_batch_s'])
           for r in records}
  base_s = sum(b for b, _ in units.values())
  spec_s = sum(s for _, s in units.values())
  # What else ran while each unit was timed ([CPU s, wall s]; where
  # /proc/stat is missing, not known).
  loads = {(r.get('chunk'), r['batch'] if 'chunk' not in r else None):
           r.get('other_load') for r in records}
  known = measure._cpu_seconds() is not None  # pylint: disable=protected-access
  assert all(x is not None and x[1] > 0 <= x[0] if known else x is None
             for x in loads.values()), loads
  gammas = sorted({r['gamma'] for r in records})
  drafted = total('drafted')
  expected = {
      'examples': len(records), 'other_records': len(every) - len(records),
      'batches': len({r['batch'] for r in records}),
      'timed_calls': len(units),
      'gamma_used': {str(g): sum(r['gamma'] == g for r in records)
                     for g in gammas},
      'gamma': gammas[0] if len(gammas) == 1 else None,
      'alpha': total('beta_sum') / total('beta_count') if drafted else None,
      'acceptance_rate': total('accepted') / drafted if drafted else None,
      'mean_accepted_length': 1 + total('accepted') / total('iterations'),
      'target_calls_per_token': (total('iterations') /
                                 total('speculative_length')),
      'baseline_tokens': total('baseline_length'),
      'speculative_tokens': total('speculative_length'),
      'walltime_speedup': base_s / spec_s,
      'differing_examples': sum(not r['identical'] for r in records),
      'other_load_cores': (sum(c for c, _ in loads.values()) /
                           sum(w for _, w in loads.values())) if known
                          else None,
  }
  for key, value in expected.items():
    assert summary[key] == (pytest.approx(value) if isinstance(value, float)
                            else value), (key, summary[key], value)
  run = json.loads((out / 'run.json').read_text())
  assert summary['configured_gamma'] == run['identity']['gamma']
  # The gamma column says what decoded: one gamma, or examples per gamma;
  # 0 is no speculation (with the speed-up its choice predicted, when the
  # choice is there); '-' where nothing was verified.
  # summary.md: the status, what decoded, the row, the times, a warning.
  status, _, decoded, _, header, _, row, _, times, *warning = (
      out / 'summary.md').read_text().splitlines()
  assert status == f"**Status: {summary['status']}.**"
  assert decoded.startswith(f"{summary['task']} ({summary['split']} split):"
                            f" {len(records)} examples. Target ")
  assert f"drafter {summary['drafter']}" in decoded
  assert f"Gamma {summary['gamma_label']}; " in decoded
  assert times.startswith(f'Timed side by side: baseline {base_s:.3f} s ')
  assert f'speculative {spec_s:.3f} s ' in times
  assert f"{summary['walltime_speedup']:.2f}x walltime" in times
  # A job timed beside other work says so (the suite's workers may be).
  assert warning == ([] if summary['timing_warning'] is None else
                     ['', f"**Warning: {summary['timing_warning']}.**"])
  cells = dict(zip(header.strip('| ').split(' | '),
                   row.strip('| ').split(' | ')))
  assert cells['gamma'] == summary['gamma_label']
  for g in gammas:
    assert (('no speculation' if g == 0 else str(g)) in cells['gamma'])
    if len(gammas) > 1:
      assert f"({expected['gamma_used'][str(g)]} examples)" in cells['gamma']
  assert cells['alpha'] == ('-' if not drafted else
                            f"{expected['alpha']:.3f}")
  assert cells['examples'] == str(len(records))
  return summary


def test_the_first_line_says_when_the_split_holds_fewer_than_asked():
  """NUM_EXAMPLES above the split's size decodes the whole split (as T5X
  does), and the job's first line says how many it found of those asked."""
  out = pathlib.Path('/runs/x')
  short = '(the split holds 3 of the 5 examples asked for)'
  assert summary_lib.start_line(out, 3, 0, 5) == (
      f'decoding 3 examples into {out} {short}')
  assert summary_lib.start_line(out, 3, 1, 5).endswith(short)
  for asked in (3, None):  # all there, or the whole split asked for
    assert 'split holds' not in summary_lib.start_line(out, 3, 0, asked)
    assert 'split holds' not in summary_lib.start_line(out, 3, 1, asked)


def test_end_to_end_resume_and_extend(tmp_path, capsys, monkeypatch):
  """Streamed with gamma chosen by the measured profile (the defaults at
  batch > 1); then fixed batches at GAMMA on the same examples give the
  same greedy records; a resumed run reuses the gamma chosen."""
  from specdec_jax import hardware  # pylint: disable=g-import-not-at-top
  out = tmp_path / 'run'
  summary = eval_lib.main(args(out, **STREAM, **PROFILE))
  console = capsys.readouterr().out
  assert console.startswith(f'decoding 4 examples into {out}')
  # gamma for batch 2: the argmax of Theorem 3.8 on the cost(k) the job
  # measured (k = 1 .. max_gamma + 1) and the warm-up's alpha.
  choice = json.loads((out / 'gamma_choice.json').read_text())
  profile = hardware.HardwareProfile.from_json(choice['profile'])
  assert choice['rule'] == 'profile' and choice['configured_gamma'] == 3
  assert sorted(profile.cost[2]) == [1, 2, 3]
  best = hardware.predict(profile, alpha=choice['alpha'], drafter='t5',
                          batch=2, max_gamma=2)
  # 0 (no speculation) where even the best gamma is predicted slower.
  assert choice['gamma'] == (best.gamma if best.speedup >= 1 else 0)
  assert f"gamma {choice['gamma']} for batch 2 (configured 3)" in console
  # The last line says what the job did: its status and headline figures.
  last = console.splitlines()[-1]
  assert last.startswith(f"{out}: complete (4 examples, walltime speed-up "
                         f"{summary['walltime_speedup']:.2f}x"), last
  assert last.endswith(" 0 greedy outputs differ from the baseline's); "
                       'summary.json, summary.md'), last
  assert summary['gamma_choices'] == [choice]
  assert summary['gamma_used'] == {str(choice['gamma']): 4}
  assert summary['reused_records'] == 0
  check_summary_is_the_records(out, 4)
  for name in ('examples.jsonl', 'summary.json', 'summary.md', 'config.gin',
               'run.json'):
    assert (out / name).exists(), name
  records = read_jsonl(out / 'examples.jsonl')
  assert sorted(r['index'] for r in records) == [0, 1, 2, 3]
  assert all(r['identical'] for r in records)  # greedy: exact
  assert all(r['input'].startswith('translate English to German: ')
             for r in records)
  assert summary['differing_examples'] == 0
  assert summary['status'] == 'complete'
  assert summary['walltime_speedup'] > 0
  # Greedy: identical outputs, so tokens/s and walltime ratios agree.
  assert summary['throughput_speedup'] == pytest.approx(
      summary['walltime_speedup'])
  # alpha where drafts were verified (gamma 0: none, so no alpha).
  assert (summary['alpha'] is None if choice['gamma'] == 0 else
          0.0 <= summary['alpha'] <= 1.0)
  assert summary['target_calls_per_token'] > 0
  assert 'bleu' in summary['baseline_metrics']
  assert json.loads((out / 'summary.json').read_text())['examples'] == 4
  assert 'GAMMA = 3' in (out / 'config.gin').read_text()
  assert (out / 'summary.md').read_text().count('\n|') == 3  # one row
  # The mode is recorded: 4 examples = one chunk of 2 batches, timed once.
  assert summary['batching'] == 'stream' and summary['stream_chunk'] == 2
  assert summary['timed_calls'] == 1 and summary['batches'] == 2
  assert {(r['batching'], r['chunk']) for r in records} == {('stream', 0)}
  assert [r['batch'] for r in sorted(records, key=lambda r: r['index'])] == [
      0, 0, 1, 1]
  assert {r['gamma'] for r in records} == {choice['gamma']}
  # Fixed batches at GAMMA: the same greedy records but for the mode, the
  # timings, the gamma and the counters that depend on it (at one gamma a
  # stream counts as the fixed loop does: tests/test_streaming.py).
  # Timed on a machine other processes keep busy (scripted: 2 cores a
  # second of a unit): the summary, summary.md and stderr say so.
  real, clock = measure._cpu_seconds, itertools.count()  # pylint: disable=protected-access
  monkeypatch.setattr(measure, '_cpu_seconds', lambda: (lambda t: (
      t, 3.0 * t, t))(float(next(clock))))
  capsys.readouterr()
  fixed = eval_lib.main(args(tmp_path / 'fixed'))
  monkeypatch.setattr(measure, '_cpu_seconds', real)
  assert fixed['other_load_cores'] == pytest.approx(2.0)
  assert 'timed beside other work' in fixed['timing_warning']
  assert fixed['timing_warning'] in (tmp_path / 'fixed' / 'summary.md'
                                     ).read_text()
  assert f"warning: {fixed['timing_warning']}" in capsys.readouterr().err
  assert fixed['batching'] == 'fixed' and fixed['timed_calls'] == 2
  assert fixed['gamma_used'] == {'3': 4} and fixed['gamma_choices'] == []
  assert json.loads((tmp_path / 'fixed' / 'run.json').read_text())[
      'identity']['batching'] == 'fixed'
  mode = TIMING + ('batching', 'chunk', 'gamma', 'iterations', 'drafted',
                   'accepted', 'beta_sum', 'beta_count')
  strip = lambda rs: sorted(({k: v for k, v in r.items() if k not in mode}
                             for r in rs), key=lambda r: r['index'])
  assert strip(read_jsonl(tmp_path / 'fixed' / 'examples.jsonl')) == strip(
      records)
  # A fixed run's folder is not resumed streamed (other settings).
  with pytest.raises(ValueError, match='other settings'):
    eval_lib.main(args(tmp_path / 'fixed', **STREAM))
  # A rerun resumes: nothing is decoded twice, and its first line says so;
  # the gamma chosen is read back, not measured again.
  capsys.readouterr()
  monkeypatch.setattr(unit_loop, 'choose_gamma', None)
  summary = eval_lib.main(args(out, **STREAM, **PROFILE))
  assert len(read_jsonl(out / 'examples.jsonl')) == 4
  first = capsys.readouterr().out.splitlines()[0]
  assert first.startswith(f'4 of 4 examples found in {out}')
  assert 'reusing them, nothing to decode' in first
  assert 'fresh EVAL_OUTPUT_DIR' in first
  assert summary['reused_records'] == 4
  # Asking for more examples decodes only the new ones.
  summary = eval_lib.main(args(out, NUM_EXAMPLES='6', **STREAM, **PROFILE))
  assert sorted(r['index'] for r in read_jsonl(out / 'examples.jsonl')) == (
      list(range(6)))
  assert summary['gamma_used'] == {str(choice['gamma']): 6}
  assert summary['timed_calls'] == 2  # chunk 1: examples 4, 5 (filled)
  assert summary['examples'] == 6
  console = capsys.readouterr().out
  assert 'chosen by the profile of the run being resumed' in console
  first = console.splitlines()[0]
  assert first.startswith(f'4 of 6 examples found in {out}')
  assert 'decoding the other 2' in first
  assert summary['reused_records'] == 4
  assert json.loads((out / 'summary.json').read_text())[
      'reused_records'] == 4
  check_summary_is_the_records(out, 6)


@pytest.mark.parametrize('batching', ['fixed', 'stream'])
def test_failure_keeps_finished_batches(tmp_path, monkeypatch, batching):
  """Fixed: batch 1 of 2 fails; streamed: chunk 1 of 2 (4 examples each)."""
  from specdec_jax import streaming  # pylint: disable=g-import-not-at-top
  out = tmp_path / 'crash'
  module, name = ((speculative, 'speculative_sample') if batching == 'fixed'
                  else (streaming, 'speculative_stream'))
  real = getattr(module, name)
  calls = []

  def flaky(*a, **k):
    calls.append(1)
    if len(calls) == 3:  # warm-up, unit 0, then unit 1 fails
      raise RuntimeError('device lost')
    return real(*a, **k)

  monkeypatch.setattr(module, name, flaky)
  flags = {} if batching == 'fixed' else dict(STREAM, NUM_EXAMPLES='8')
  n = 2 if batching == 'fixed' else 4
  with pytest.raises(RuntimeError, match='device lost'):
    eval_lib.main(args(out, **flags))
  assert [r['index'] for r in read_jsonl(out / 'examples.jsonl')] == list(
      range(n))
  summary = json.loads((out / 'summary.json').read_text())
  assert summary['examples'] == n
  assert summary['status'].startswith(f'failed with {n} of {2 * n} examples '
                                      'left')
  assert summary['status'].endswith("'device lost'); rerun the same command "
                                    'to resume')


@pytest.mark.parametrize('override,error,message', [
    ({'MIXTURE_OR_TASK_NAME': "'wmt_ende_typo'"}, ValueError,
     'Unknown task .*debian_desc_en_de'),
    ({'TARGET_CHECKPOINT': "'/nonexistent/checkpoint_1'"}, FileNotFoundError,
     '/nonexistent/checkpoint_1'),
    ({'DRAFT_MODEL': '%T5_1_1_TINY_DRAFT'}, ValueError,
     'vocabularies differ'),
    ({'EvalSetup.gama': '3'}, SystemExit, 'gama'),
    ({'TASK_FEATURE_LENGTHS': "{'inputs': 4, 'targets': 12}"}, ValueError,
     "TASK_FEATURE_LENGTHS\\['inputs'\\] = 4"),
    ({'TASK_FEATURE_LENGTHS': "{'inputs': 16, 'target': 8}"}, ValueError,
     'TASK_FEATURE_LENGTHS needs "inputs" and "targets"'),
    ({'TASK_FEATURE_LENGTHS': "{'inputs': 16, 'targets': 0}"}, ValueError,
     'TASK_FEATURE_LENGTHS\\["targets"\\] must be an int >= 1, got 0'),
    ({'GAMMA': '0'}, ValueError, 'gamma'),
    ({'GAMMA': '1.5'}, ValueError, 'gamma must be an int'),
    ({'TEMPERATUR': '0.7'}, SystemExit,
     'nothing in the configuration reads.*TEMPERATUR .did you mean '
     'TEMPERATURE'),
    ({'TEMPERATURE': '-1.0'}, ValueError, 'temperature must be'),
    ({'TOPK': '3', 'TOPP': '0.9'}, ValueError, 'At most one of topk'),
    ({'TOPK': '40'}, ValueError,  # before: greedy, said as "greedy, top-k 40"
     r'topk 40 has no effect when greedy \(temperature 0\): set a '
     'temperature > 0 to sample, or leave topk off'),
    ({'TOPP': '0.9'}, ValueError, 'topp 0.9 has no effect when greedy'),
    ({'DRAFTER': "'trigram'"}, ValueError,
     "Unknown drafter kind 'trigram'.*bigram"),
    ({'BATCH_SIZE': '0'}, ValueError, 'batch_size must be an int >= 1'),
    ({'NUM_EXAMPLES': '0'}, ValueError,
     'num_examples must be an int >= 1 .or None: all., got 0'),
    ({'DTYPE': "'float16x'"}, ValueError,
     "draft_config.dtype must be a float dtype .*got 'float16x'"),
    ({'BatchSpec.gamma_rule': "'auto'"}, ValueError,
     "batch_gamma must be one of .'profile', 'always', 'config'.*got 'auto'"),
    ({'BatchSpec.max_gamma': '0'}, ValueError, 'max_gamma must be an int'),
    ({'DRAFTER': "'pass'", 'GAMMA': '5'}, ValueError,
     'gamma=5 > 4: the PassDrafter drafts at most 4'),
    ({'evaluate.timing_repeats': '0'}, ValueError, 'timing_repeats'),
    ({'BATCHING': "'streamed'"}, ValueError,
     "batching must be one of \\('stream', 'fixed'\\)"),
    ({'BatchSpec.chunk': '0'}, ValueError,
     'stream_chunk must be an int >= 1'),
    ({'BATCHING': "'stream'", 'EvalSetup.same_shape_baseline': 'True'},
     ValueError, "same_shape_baseline needs batching='fixed'"),
    ({'DRAFTER': "'tree'", 'TREE': "'choose:0'"}, ValueError,
     "'choose:N' takes N, the most nodes"),
    ({'DRAFTER': "'tree'", 'TREE': "'choose:8'", 'TEMPERATURE': '1.0'},
     ValueError, 'rank probabilities of greedy outputs: set temperature 0'),
    # Each a traceback, or found after the models loaded, before.
    ({'DRAFTER': "'tree'", 'TREE': '5'}, ValueError,
     'tree must be a string .or None., got 5'),
    ({'TASK_FEATURE_LENGTHS': "'x'"}, ValueError,
     'TASK_FEATURE_LENGTHS needs "inputs" and "targets", got .x.'),
    ({'TOPK': '100000', 'TEMPERATURE': '1.0'}, ValueError,
     r'topk=100000 is larger than the vocabulary \(1024\)'),
    ({'evaluate.if_settings_differ': "'bogus'"}, ValueError,
     "if_settings_differ must be one of .'refuse', 'restart'., got 'bogus'"),
    ({'DRAFTER': "'cache'", 'OUTPUT_CACHE': "'/tmp'"}, ValueError,
     "output_cache '/tmp' is a folder: name the cache's file"),
    # Each found only as the job ran (the models loaded, the run folder
    # made), before.
    ({'loading.EvalSetup.seed': '1.5'}, ValueError,
     'seed must be an int >= 0, got 1.5'),
    ({'loading.DataSpec.truncate_inputs': "'no'"}, ValueError,
     "truncate_inputs must be True or False, got 'no'"),
])
def test_clear_errors(tmp_path, override, error, message):
  argv = args(tmp_path / 'err', **override)
  if 'DRAFT_MODEL' in override:  # a drafter with another vocabulary size
    argv += ['--gin.T5_1_1_TINY_DRAFT = @draft/network.T5Config()',
             '--gin.draft/network.T5Config.vocab_size = 2048',
             "--gin.draft/network.T5Config.dtype = 'float32'"]
  with pytest.raises(error, match=message):
    eval_lib.main(argv)


def test_a_setup_refuses_a_group_of_another_type(tmp_path):
  """A setup built in Python with a group given as what it holds (a batch
  size for the `BatchSpec`, a dict for the `DataSpec`) is refused by name
  as it is made (before: an AttributeError as the job ran, after the
  models loaded); so is an EOS id outside the target's vocabulary (before:
  found by the first decode, the models loaded and the run folder made)."""
  setup = eval_lib.configured(args(tmp_path / 'g'))[1]
  for field, value, said in (
      ('batch', 8, 'batch must be a BatchSpec, got 8'),
      ('data', {'split': 'test'}, 'data must be a DataSpec, got a dict'),
      ('draft', 'bigram', "draft must be a DrafterSpec, got 'bigram'"),
      ('sampling', {'temperature': 1.0}, 'sampling must be a SamplingConfig'),
      ('same_shape_baseline', 'no', 'same_shape_baseline must be True or'),
      ('target_config', network.T5Model(setup.target_config),
       'target_config must be a network.T5Config, got a T5Model')):
    with pytest.raises(checks.InputError, match=said):
      dataclasses.replace(setup, **{field: value})
  with pytest.raises(checks.InputError, match='split must be a split'):
    dataclasses.replace(setup.data, split=5)
  with pytest.raises(checks.InputError, match=(  # the target's vocabulary
      r'eos_id must be an int in \[0, vocab_size=1024\) \(or -1: no EOS\), '
      'got 99999')):
    setup.replace(eos_id=99999)

def test_a_missing_draft_checkpoint_is_found_before_the_target_loads(
    tmp_path, monkeypatch):
  """A draft model's checkpoint that is not there is said before the
  target loads (an XXL target's minutes, before)."""
  setup = eval_lib.configured(args(tmp_path / 'd', DRAFT_CHECKPOINT=(
      "'/nonexistent/draft'")))[1]
  monkeypatch.setattr(loading, 'load_target', lambda *_, **__: pytest.fail(
      'the target loaded first'))
  with pytest.raises(FileNotFoundError, match='draft checkpoint not found: '
                     '/nonexistent/draft'):
    loading.build(setup)


def test_a_dry_run_checks_what_the_job_checks_first_and_writes_nothing(
    tmp_path, capsys):
  """`--dry_run` prints the setup, then what the job checks before its
  first example (`preflight`: the folder, the checkpoints, the task and
  its vocabulary); a task or checkpoint that is not there is its one
  line, as in the job (before: the dry run printed such a setup)."""
  out = tmp_path / 'run'
  setup = eval_lib.cli(args(out) + ['--dry_run'])
  assert isinstance(setup, loading.EvalSetup)
  printed = capsys.readouterr().out.splitlines()
  assert printed[-2:] == [
      f'checked: output_dir {out} (to be made, writable)',
      'checked: task debian_desc_en_de (validation): a vocabulary of 1000 '
      'tokens, TARGET_MODEL 1024'], printed
  assert not out.exists()
  for flag, said in (
      (dict(MIXTURE_OR_TASK_NAME="'debian_nope'"), "Unknown task 'debian_no"),
      (dict(DRAFT_CHECKPOINT=f"'{tmp_path / 'none'}'"),
       'draft checkpoint not found')):
    with pytest.raises(SystemExit) as e:
      eval_lib.cli(args(out, **flag) + ['--dry_run'])
    assert str(e.value.code).startswith(f'error: {said}'), e.value.code
  assert not out.exists()


def test_the_command_says_a_configuration_error_in_one_line(
    tmp_path, monkeypatch):
  """`python -m specdec_jax.eval` (`cli`): a value its configuration
  refuses (here gamma 0, found as the setup is built) ends the command with
  that error's line(s) (gin's context after it), not a traceback, before a
  run folder is made; so do a missing checkpoint (`preflight`) and an
  input longer than the model takes (an `InputError`), found as it reads
  the data; a checkpoint that does not load, found as the job loads,
  after the summary says the job failed. A ValueError of the code's own
  (no `InputError`) keeps its traceback."""
  with pytest.raises(SystemExit) as e:
    eval_lib.cli(args(tmp_path / 'err', GAMMA='0'))
  assert str(e.value.code).startswith(
      'error: gamma must be an int >= 1, got 0.'), e.value.code
  assert not (tmp_path / 'err').exists()
  with pytest.raises(SystemExit) as e:
    eval_lib.cli(args(tmp_path / 'none', TARGET_CHECKPOINT=(
        "'/nonexistent/checkpoint_1'")))
  assert str(e.value.code).startswith(
      'error: target checkpoint not found: /nonexistent/checkpoint_1')
  assert not (tmp_path / 'none').exists()
  (tmp_path / 'x' / 'checkpoint_1').mkdir(parents=True)  # no '~' here
  with pytest.raises(SystemExit) as e:  # found as it loads: its line too
    monkeypatch.setenv('HOME', str(tmp_path))  # '~' is the home folder
    monkeypatch.chdir(tmp_path / 'x')
    eval_lib.cli(args('~/missing', TARGET_CHECKPOINT=(
        f"'{tmp_path / 'x' / 'checkpoint_1'}'")))
  assert str(e.value.code).startswith('error: '), e.value.code
  assert 'checkpoint_1' in str(e.value.code), e.value.code
  # The status says why, and that this rerun needs the input corrected
  # (any other error says to rerun as it was: test_failure_keeps_finished_
  # batches).
  assert _status(tmp_path / 'missing').startswith('failed')
  assert _status(tmp_path / 'missing').endswith(
      "checkpoint_<step> folders).'); correct it and rerun to resume"), (
          _status(tmp_path / 'missing'))
  # Nothing decoded, and still what it was to decode, in both files.
  failed = json.loads((tmp_path / 'missing' / 'summary.json').read_text())
  assert failed['examples'] == 0 and failed['task'] == 'debian_desc_en_de'
  checkpoint = str(tmp_path / 'x' / 'checkpoint_1')
  assert failed['target_checkpoint'] == checkpoint
  assert (tmp_path / 'missing' / 'summary.md').read_text().startswith(
      f"**Status: {failed['status']}.**\n\ndebian_desc_en_de (validation "
      f'split): 0 examples. Target {checkpoint}; drafter t5.')
  with pytest.raises(SystemExit) as e:  # found as it reads the data
    eval_lib.cli(args(tmp_path / 'long', TASK_FEATURE_LENGTHS=(
        "{'inputs': 4, 'targets': 12}")))
  assert str(e.value.code).startswith('error: Example 0 of debian_desc_en_de/'
                                      'validation has 52 input tokens')
  assert not (tmp_path / 'long').exists()  # read before the folder is made

  def fault(*_):
    raise ValueError('a fault of the code')

  monkeypatch.setattr(eval_lib, '_run', fault)
  with pytest.raises(ValueError, match='a fault of the code'):
    eval_lib.cli(args(tmp_path / 'fault'))


def test_a_failure_keeps_the_traceback_of_a_fault_only(capsys):
  """A caller that goes on after a job fails (a sweep's next cell) gets
  its one line; a fault of the code also prints its traceback, a refused
  value or a missing file (`checks.REFUSED`) none."""
  for error, traced in ((ValueError('a fault'), True),
                        (checks.InputError('Unknown task'), False),
                        (FileNotFoundError('no checkpoint'), False),
                        (PermissionError('a folder it may not write'), False),
                        (IsADirectoryError('a folder for a file'), False)):
    try:
      raise error
    except Exception as e:  # pylint: disable=broad-except
      line = checks.failure(e)
    assert line == f'{type(error).__name__}: {error}'
    assert ('Traceback' in capsys.readouterr().err) == traced, error


def test_an_output_dir_at_a_url_but_gs_is_refused(tmp_path, monkeypatch):
  """pathlib would write 's3://b/run' to a local folder 's3:/b/run' (a
  gs:// one is kept in a local copy: tests/test_bucket_folder.py); a
  negative sync_every_s and a file in the folder's way are refused too,
  before anything is written."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match="output_dir 's3://b/run' is neither a "
                     'local path nor a gs:// address'):
    eval_lib.main(args('s3://b/run'))
  with pytest.raises(ValueError, match='sync_every_s must be a number of '
                     "seconds >= 0, got -1"):
    eval_lib.main(args(tmp_path / 'run', **{'evaluate.sync_every_s': '-1'}))
  assert not list(tmp_path.iterdir())
  # A file where the folder, or a folder above it, would be: named, not
  # mkdir's FileExistsError / NotADirectoryError from inside the job.
  (tmp_path / 'a_file').write_text('')
  for out in (tmp_path / 'a_file', tmp_path / 'a_file' / 'run'):
    with pytest.raises(checks.InputError, match=(
        f"output_dir '{out}' cannot be a folder: {tmp_path / 'a_file'} is a "
        'file')):
      eval_lib.main(args(out))


def test_widened_target_decodes_the_same(tmp_path):
  """EvalSetup.target_widen_to: same outputs and alpha, a bigger target."""
  few = dict(NUM_EXAMPLES='2')
  plain = eval_lib.main(args(tmp_path / 'plain', **few))
  wide = eval_lib.main(args(
      tmp_path / 'wide', **few, **{
          'EvalSetup.target_widen_to':
              "{'emb_dim': 16, 'mlp_dim': 24, 'num_decoder_layers': 3}"}))
  a = read_jsonl(tmp_path / 'plain' / 'examples.jsonl')
  b = read_jsonl(tmp_path / 'wide' / 'examples.jsonl')
  assert [r['baseline'] for r in a] == [r['baseline'] for r in b]
  assert [r['speculative'] for r in a] == [r['speculative'] for r in b]
  assert wide['differing_examples'] == 0
  assert wide['alpha'] == pytest.approx(plain['alpha'], abs=1e-6)
  run = json.loads((tmp_path / 'wide' / 'run.json').read_text())
  assert run['identity']['target_widen_to']['num_decoder_layers'] == 3
  with pytest.raises(ValueError, match='cannot shrink emb_dim'):
    eval_lib.main(args(tmp_path / 'bad', **few, **{
        'EvalSetup.target_widen_to': "{'emb_dim': 4}"}))


# -- Crash consistency: interrupted any way, resumed, the same outputs --------


def comparable(out):
  """examples.jsonl without timings, checked for one record per index."""
  records = read_jsonl(out / 'examples.jsonl')
  indices = [r['index'] for r in records]
  assert len(indices) == len(set(indices)), f'duplicated index: {indices}'
  return sorted(({k: v for k, v in r.items() if k not in TIMING}
                 for r in records), key=lambda r: r['index'])


def _status(out):
  return json.loads((out / 'summary.json').read_text())['status']


# The job as `python -m specdec_jax.eval` runs it, held after its first
# append of records (a marker file says so) until it is killed: the kill
# lands mid-run whatever the machine's load (a kill timed from the outside
# raced the job's next unit).
_HELD_AFTER_FIRST_APPEND = """
import os, runpy, sys, time
from specdec_jax import run_folder
real_append = run_folder.append
def append(*args, **kwargs):
  real_append(*args, **kwargs)
  open(os.environ['SPECDEC_TEST_APPENDED'], 'w').close()
  time.sleep(600)
run_folder.append = append
sys.argv[0] = 'specdec_jax.eval'
runpy.run_module('specdec_jax.eval', run_name='__main__', alter_sys=True)
"""


def _kill_subprocess(argv, out, sig):
  """Runs the job in a subprocess and sends `sig` once its first records
  are written (it waits for the signal then). Returns the process."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  appended = out.parent / f'{out.name}.appended'
  env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parents[1]),
             SPECDEC_TEST_APPENDED=str(appended))
  with open(out.parent / f'{out.name}.stderr', 'w') as stderr:
    proc = subprocess.Popen(
        [sys.executable, '-c', _HELD_AFTER_FIRST_APPEND] + argv, env=env,
        stdout=subprocess.DEVNULL, stderr=stderr)
  deadline = time.time() + 300
  while proc.poll() is None and time.time() < deadline:
    if appended.exists():
      proc.send_signal(sig)
      break
    time.sleep(0.02)
  else:
    proc.kill()  # no append in time (or the job ended): no orphan left
  return proc


def test_interrupted_any_way_resumes_to_the_same_outputs(tmp_path,
                                                         monkeypatch, capsys):
  """SIGKILL in a subprocess (after its first records), then in-process
  Ctrl-C (SIGINT), SIGTERM and a torn write at random records, streamed:
  after each the files hold no duplicate and the status says why; the
  resumed run's records equal an uninterrupted run's. (An exception after
  every write of a unit, for every drafter kind: tests/test_run_folder.py.)
  """
  import random  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  from specdec_jax import data  # pylint: disable=g-import-not-at-top
  rng = random.Random(0)
  # Streamed: 2 chunks of 4 examples (2 slots).
  few = dict(NUM_EXAMPLES='8', BATCH_SIZE='2', **STREAM)
  killed, stopped = tmp_path / 'killed', tmp_path / 'stopped'
  proc = _kill_subprocess(args(killed, **few), killed, signal.SIGKILL)
  reference = tmp_path / 'reference'
  eval_lib.main(args(reference, **few))  # meanwhile, uninterrupted
  expected = comparable(reference)
  assert len(expected) == 8
  proc.wait(timeout=120)
  assert (killed / 'examples.jsonl').exists(), (
      tmp_path / 'killed.stderr').read_text()[-3000:]
  assert 0 < len(read_jsonl(killed / 'examples.jsonl')) < 8, (
      'SIGKILL did not land mid-run')
  comparable(killed)  # no duplicates so far
  # No Python ran after SIGKILL: the summary is the one written at start.
  assert _status(killed).startswith('unfinished: started '), _status(killed)
  assert 'to decode 8 of 8 examples' in _status(killed)

  real_decode, real_append = data.decode_text, run_folder.append
  # Each fault once; each strikes within the first chunk left (a chunk = 4
  # records = 8 decode_text calls, one append). The stopped folder starts
  # with Ctrl-C.
  faults = ['sigterm', 'torn']
  rng.shuffle(faults)
  plan = {killed: faults[:1], stopped: ['sigint'] + faults[1:]}
  fired = []
  for out, folder_faults in plan.items():
    for fault in folder_faults:
      calls, at = [0], rng.randint(1, 8)

      def decode(*a, fault=fault, calls=calls, at=at, **k):
        calls[0] += 1
        if calls[0] == at and fault.startswith('sig'):
          signal.raise_signal(signal.SIGINT if fault == 'sigint' else
                              signal.SIGTERM)
        return real_decode(*a, **k)

      appends = [0]

      def torn(sink, records, appends=appends):
        appends[0] += 1
        if appends[0] == 1:
          text = ''.join(json.dumps(r) + '\n' for r in records)
          sink.write(text[:len(text) // 2])
          sink.flush()
          raise RuntimeError('injected torn write')
        real_append(sink, records)

      monkeypatch.setattr(data, 'decode_text', decode)
      monkeypatch.setattr(run_folder, 'append',
                          torn if fault == 'torn' else real_append)
      # Ctrl-C through the command: its status line, no traceback.
      run = eval_lib.cli if fault == 'sigint' else eval_lib.main
      capsys.readouterr()
      try:
        run(args(out, **few))
      except (RuntimeError, KeyboardInterrupt, SystemExit) as e:
        fired.append(fault)
        status = _status(out)
        if fault == 'sigint':
          assert isinstance(e, SystemExit) and e.code == 130, e
          said = capsys.readouterr()
          assert said.out.splitlines()[-1].startswith(f'{out}: {status} ('
                                                    ), said.out
          assert 'Traceback' not in said.err
        assert status.startswith(
            'interrupted (SIGINT' if fault == 'sigint' else 'interrupted'
            if fault == 'sigterm' else 'failed'), (fault, status)
        assert 'examples left' in status
      if fault != 'torn':  # a torn file is repaired by the next run
        comparable(out)
      monkeypatch.setattr(data, 'decode_text', real_decode)
      monkeypatch.setattr(run_folder, 'append', real_append)
    summary = eval_lib.main(args(out, **few))
    assert summary['status'] == 'complete' and summary['examples'] == 8
    assert comparable(out) == expected
  assert sorted(fired) == sorted(faults + ['sigint']), fired  # all struck


@pytest.mark.parametrize('kind', ['heads', 'pass'])
def test_self_drafting_kinds_decode_with_their_merged_loop(
    tmp_path, monkeypatch, kind):
  """The eval job decodes a `MergedDrafter` with its merged loop (one target
  call per iteration), not with the ordinary `SpecLoop`."""
  from specdec_jax import drafters  # pylint: disable=g-import-not-at-top
  cls = {'heads': drafters.HeadDrafter, 'pass': drafters.PassDrafter}[kind]
  real, loops = cls.merged_loop, []

  def counted(self, *a, **k):
    loops.append(real(self, *a, **k))
    return loops[-1]

  monkeypatch.setattr(cls, 'merged_loop', counted)
  summary = eval_lib.main(args(tmp_path / kind, DRAFTER=f"'{kind}'",
                               DRAFT_MODEL='None', **STREAM, **PROFILE))
  assert summary['batching'] == 'stream'
  # Its drafting rides on the target call: GAMMA kept, nothing measured.
  assert [c['rule'] for c in summary['gamma_choices']] == ['config']
  assert summary['gamma_used'] == {'3': 4}
  assert len(loops) >= 2  # warm-up + 1 chunk (4 examples, 2 slots)
  assert all(isinstance(x, speculative.MergedLoop) for x in loops)
  assert summary['differing_examples'] == 0
  assert summary['status'] == 'complete'


def test_streamed_output_cache_learns_after_each_chunk(tmp_path):
  """DRAFTER='cache' streamed: the store learns every output after its
  chunk (2 chunks of 4 here), outputs stay exact."""
  from specdec_jax import output_cache  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'cache.npz'
  seen = []
  real = output_cache.OutputCache.add_requests

  def add(self, *a, **k):
    seen.append(len(a[-1]))
    return real(self, *a, **k)

  import unittest.mock  # pylint: disable=g-import-not-at-top
  with unittest.mock.patch.object(output_cache.OutputCache, 'add_requests',
                                  add):
    # Inputs cut to 64 tokens: the store embeds its 100 train pairs.
    summary = eval_lib.main(args(
        tmp_path / 'run', DRAFTER="'cache'", DRAFT_MODEL='None',
        NUM_EXAMPLES='8', OUTPUT_CACHE=f"'{path}'", **STREAM,
        TASK_FEATURE_LENGTHS="{'inputs': 64, 'targets': 12}",
        **{'DataSpec.truncate_inputs': 'True'}))
  assert summary['differing_examples'] == 0 and summary['examples'] == 8
  # Seeded with the 100 train pairs, then once per chunk, its new outputs.
  assert seen == [100, 4, 4]
  assert len(output_cache.OutputCache.load(str(path))) == 100 + 8


def test_batch_decodes_without_speculation_where_the_profile_says_slower(
    tmp_path, capsys, monkeypatch):
  """At batch > 1 the job's choice includes no speculation: where the
  profile it measures predicts even the best gamma slower than the
  baseline (here a target whose k-token call costs k one-token calls, as
  no accelerator has it), it decodes with the baseline and says why."""
  real = measure.cost_curve

  def linear(*a, **k):
    seconds = real(*a, **k)
    return {n: seconds[1] * n for n in seconds}

  monkeypatch.setattr(measure, 'cost_curve', linear)
  summary = eval_lib.main(args(tmp_path / 'off', **STREAM, **PROFILE))
  choice = summary['gamma_choices'][0]
  assert choice['gamma'] == 0 and choice['configured_gamma'] == 3
  assert choice['prediction']['speedup'] < 1
  assert 'no speculation' in choice['why']
  assert choice['why'] in capsys.readouterr().out
  assert summary['gamma_used'] == {'0': 4}
  out = tmp_path / 'off'
  records = read_jsonl(out / 'examples.jsonl')
  assert all(r['speculative'] == r['baseline'] and r['drafted'] == 0
             for r in records)
  assert summary['target_calls_per_token'] == pytest.approx(1.0)
  # No draft was verified: no alpha; the gamma says why none was drafted.
  check_summary_is_the_records(out, 4)
  assert summary['alpha'] is None and summary['gamma'] == 0
  assert summary['configured_gamma'] == 3
  prediction = choice['prediction']
  assert summary['gamma_label'] == (
      f"0: no speculation (predicted {prediction['speedup']:.2f}x < 1 at "
      f"gamma {prediction['gamma']}, on this run, batch 2)")
  assert prediction['label'].count('batch') == 1
  # Its choice deleted, a rerun for more examples chooses again (here
  # gamma 3, the warm-up's, so nothing new compiles): units that differ
  # in gamma, each counted.
  (out / 'gamma_choice.json').unlink()
  monkeypatch.setattr(unit_loop, 'choose_gamma', lambda *_: {
      'gamma': 3, 'rule': 'profile', 'configured_gamma': 3, 'alpha': 0.5,
      'prediction': dict(prediction, gamma=3, speedup=1.5)})
  mixed = eval_lib.main(args(out, NUM_EXAMPLES='8', **STREAM, **PROFILE))
  assert mixed['gamma_used'] == {'0': 4, '3': 4} and mixed['gamma'] is None
  assert check_summary_is_the_records(out, 8)['alpha'] is not None
  # Fewer examples than the folder holds: the summary is of the examples
  # asked for; the other records stay for a later run and are counted.
  fewer = eval_lib.main(args(out, NUM_EXAMPLES='3', **STREAM, **PROFILE))
  assert fewer['examples'] == 3 and fewer['other_records'] == 5
  assert fewer['status'] == 'complete' and fewer['num_examples'] == 3
  check_summary_is_the_records(out, 3)
  assert len(read_jsonl(out / 'examples.jsonl')) == 8


def test_the_job_chooses_the_tree_this_machines_costs_favour(
    tmp_path, capsys, monkeypatch):
  """TREE='choose:N': the job chooses the tree before its first unit:
  the static tree `drafters.tree.shape.choose` prefers on the rank
  probabilities and call costs it records (stubbed here: a drafter with
  these ranks, a target whose calls cost the same at any width, as on an
  accelerator) and the dynamic beam that fills a level are decoded on the
  run's examples (a noisy copy of the target drafts), and the job decodes
  the unit, exactly, with the one that, cut to its best depth, has the
  most tokens per second by those decodes' counts; then chooses again
  with the iteration's fixed work priced from that decode's time
  (`refine_tree`: here the CPU's, far above the stubbed costs); levels
  dearer than the baseline's token give no speculation and decode
  nothing; a cut chosen is decoded whole before it is taken (counts
  scripted). A rerun for more examples decodes with the choice kept. (How
  costs shape the tree: tests/drafters/test_trees.py's `choose` tests.)"""
  from specdec_jax import drafters  # pylint: disable=g-import-not-at-top
  from specdec_jax import hardware  # pylint: disable=g-import-not-at-top
  from specdec_jax.drafters.tree import shape as shape_lib  # pylint: disable=g-import-not-at-top
  import collections  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  probs = [0.3, 0.1, 0.05, 0.02, 0.01, 0.0, 0.0, 0.0]
  monkeypatch.setattr(measure, 'rank_probs', lambda *a, **k: np.array(probs))
  levels, level_s = [], [1e-6]  # a level timed alone: the drafter's call
  monkeypatch.setattr(measure, 'tree_level_time', lambda drafter, *a, **k: (
      levels.append(drafter) or level_s[0]))
  real_loop = drafters.TreeDrafter.merged_loop
  decoded = []

  def spied(self, *a, **k):
    decoded.append(self.shape)
    return real_loop(self, *a, **k)

  monkeypatch.setattr(drafters.TreeDrafter, 'merged_loop', spied)
  tree = dict(DRAFTER="'tree'", TREE="'choose:6'", NUM_EXAMPLES='2',
              DRAFT_CHECKPOINT="'synthetic:seed=0,noise=0.05'")
  # A target whose calls cost t(1) = 1 ms at any width, as on an
  # accelerator, and a drafter step of 0.1 ms (the measurements' own
  # tests are tests/test_measure.py's).
  monkeypatch.setattr(measure, 'cost_curve', lambda model, params, rows, ks,
                      **k: dict.fromkeys(sorted(set(ks) | {1}), 1e-3))
  monkeypatch.setattr(measure, 'drafter_token_time', lambda *a, **k: 1e-4)
  summary = eval_lib.main(args(tmp_path / 'flat', **tree))
  choice, = summary['gamma_choices']
  profile = hardware.HardwareProfile.from_json(choice['profile'])
  costs = shape_lib.TreeCosts.of_profile(profile, level_ms=choice['level_ms'],
                                         batch=2)
  # Decoded: the rank probabilities' static tree, then the beam that
  # fills a level (K and B at most the budget; gamma levels).
  static, beam = choice['trees']
  want_static, _ = shape_lib.choose(choice['rank_probs'], costs, max_nodes=6,
                                    max_depth=3)
  assert static['spec'] == want_static.spec
  assert beam['spec'] == 'beam:6,6,3/6' and beam['level_ms'] == 1e-3

  def best(costs):  # the best of both, each cut to its best depth
    def rate(tree, d):  # its tokens a call, cut to d levels, over its time
      cut = shape_lib.parse(tree['spec']).truncate(d)
      moved = lambda d: tree['iterations'] + sum(tree['accepted_at'][:d])
      tokens = tree['tokens'] / tree['iterations'] * moved(d) / moved(None)
      return 1e3 * tokens / (costs.target_ms(cut.verified_width(True)) +
                             d * tree['level_ms'] + costs.fixed_ms)
    return max((rate(t, d), -i, d) for i, t in enumerate((static, beam))
               for d in range(1, len(t['accepted_at']) + 1))

  rate, i, depth = best(costs)
  picked = (static, beam)[-i]
  want = shape_lib.parse(picked['spec']).truncate(depth)
  assert shape_lib.parse(choice['first_tree']) == want
  # The tiny models' flat laws put the beam's 6 first-level nodes above any
  # second-level path, so it accepts one draft an iteration; the static
  # tree verifies deeper nodes, and wins.
  assert beam['accepted_at'] == [beam['iterations'], 0, 0] and i == 0
  assert choice['rank_probs'] == probs
  assert choice['examples'] == 2  # the run's examples (< CHOICE_EXAMPLES)
  assert choice['level_ms'] == pytest.approx(1e-3)
  assert isinstance(levels[-1], drafters.TreeDrafter)
  assert decoded[:2] == [want_static, shape_lib.parse(beam['spec'])]
  assert decoded[2:] and all(s == want for s in decoded[2:])
  # The unit's decode with that tree, uncut: the tokens and calls the
  # choice's decode counted.
  records = read_jsonl(tmp_path / 'flat' / 'examples.jsonl')
  assert depth == len(picked['accepted_at'])
  assert sum(r['speculative_length'] for r in records) == picked['tokens']
  assert sum(r['iterations'] for r in records) == picked['iterations']
  assert summary['gamma_used'] == {str(want.depth): 2}
  assert summary['differing_examples'] == 0
  # Chosen again with the fixed work an iteration of that decode took.
  assert choice['fixed_ms'] == pytest.approx(
      choice['measured_iteration_ms'] - costs.iteration_ms(want))
  assert choice['fixed_ms'] > 0
  rate, i, depth = best(dataclasses.replace(costs,
                                            fixed_ms=choice['fixed_ms']))
  again = shape_lib.parse((static, beam)[-i]['spec']).truncate(depth)
  assert choice['predicted_tokens_per_s'] == pytest.approx(rate)
  assert choice['gamma'] == (again.depth if rate * 1e-3 >= 1 else 0)
  # The choice a device of these costs would make, made here from its
  # profile (`predicted_choice`: the tokens decoded here, nothing timed;
  # a level priced at the drafter's step, as timed for this run): the
  # same costs, the same trees decoded, the same tree taken.
  level_s[0] = 1e-4
  device = eval_lib.main(args(tmp_path / 'device', **tree))['gamma_choices']
  setup = eval_lib.main(args(tmp_path / 'device', **tree) + ['--dry_run'])
  loaded = loading.build(setup)
  examples = loading.read_examples(setup, loaded.task, 2)
  profile = hardware.HardwareProfile.of_run(
      'a device', 2, 1e-3, dict.fromkeys(range(1, 8), 1.0), {'tree': 0.1})
  with monkeypatch.context() as patch:  # nothing timed
    for timer in ('cost_curve', 'tree_level_time', 'drafter_token_time'):
      patch.setattr(measure, timer, None)
    predicted = unit_loop.predicted_choice(loaded, data.pad_rows(
        [ids for _, ids, _, _ in examples], 512), profile, 'tree')
  assert predicted['profile']['cost'] == device[0]['profile']['cost']
  assert predicted['profile']['c'] == device[0]['profile']['c']
  assert predicted['level_ms'] == pytest.approx(device[0]['level_ms'])
  assert [t['spec'] for t in predicted['trees']] == [
      t['spec'] for t in device[0]['trees']] and len(predicted['trees']) > 1
  assert predicted['tree'] == device[0]['first_tree']
  # Levels so dear that every tree is slower than the baseline: no
  # speculation, no beam decoded, and the choice says why.
  level_s[0], decoded[:] = 10.0, []
  summary = eval_lib.main(args(tmp_path / 'dear', **tree))
  dear, = summary['gamma_choices']
  assert dear['gamma'] == 0 and dear['predicted_speedup'] < 1
  assert 'no speculation' in dear['why'] and 'fixed_ms' not in dear
  assert summary['gamma_used'] == {'0': 2} and not decoded
  assert dear['trees'] == []
  # A cut chosen is decoded whole before it is taken, and a tree chosen
  # whole has its cut two levels up decoded while that wins (the counts
  # scripted, 5 levels: beam:6,6,5/6 accepts at most 2 drafts, so its
  # cut to 2 levels is estimated as many tokens for 3 levels less, but
  # decoded whole yields fewer; its cut to 3, decoded whole, more; its
  # cut to 1 less: the 3 levels stand).
  level_s[0] = 1e-6
  counts = {'beam:6,6,5/6': ([12, 10, 0, 0, 0], 12, 34),
            'beam:6,6,2/6': ([12, 6], 12, 30),
            'beam:6,6,3/6': ([12, 10, 2], 12, 36)}
  scripted = []

  def measured_tree(loaded, spec, inputs, place, level_ms):
    del loaded, inputs, place
    scripted.append(spec)
    depth = shape_lib.parse(spec).depth
    return shape_lib.MeasuredTree(
        spec, *counts.get(spec, ([1] * depth, 12, 14)), level_ms)

  real_measured = unit_loop._measured_tree  # pylint: disable=protected-access
  monkeypatch.setattr(unit_loop, '_measured_tree', measured_tree)
  summary = eval_lib.main(args(tmp_path / 'cut', **tree, GAMMA='5'))
  cut, = summary['gamma_choices']
  assert scripted[1:] == ['beam:6,6,5/6', 'beam:6,6,2/6', 'beam:6,6,3/6',
                          'beam:6,6,1/6']
  assert cut['first_tree'] == 'beam:6,6,3/6'
  assert [t['spec'] for t in cut['trees']] == scripted
  monkeypatch.setattr(unit_loop, '_measured_tree', real_measured)
  capsys.readouterr()
  decoded.clear()
  summary = eval_lib.main(args(tmp_path / 'flat', **dict(tree,
                                                         NUM_EXAMPLES='4')))
  assert 'chosen by the profile of the run being resumed' in (
      capsys.readouterr().out)
  used = collections.Counter({str(want.depth): 2})
  used[str(choice['gamma'])] += 2  # the second unit: the choice kept
  assert summary['gamma_used'] == dict(used)
  assert all(s == again for s in decoded) and bool(
      decoded) == bool(choice['gamma'])


def test_drafters_share_one_baseline_decode(tmp_path, monkeypatch):
  """`evaluate_together`: two drafters against one baseline decode a
  unit, timed alternately with both speculative decodes: each folder is
  the complete run `evaluate` writes (exact outputs), with the very same
  baseline outputs and times, and the baseline decoded N + 1 times where
  two runs decode it 2N; a setup with another baseline is refused."""
  from specdec_jax import programs  # pylint: disable=g-import-not-at-top
  setup = lambda **o: eval_lib.main(args(tmp_path / 'x', **o) + ['--dry_run'])
  t5, bigram = setup(), setup(DRAFTER="'bigram'", DRAFT_MODEL='None')
  real, decodes = programs.Program.__call__, []

  def counted(self, *a):
    decodes.append(self.spec.kind)
    return real(self, *a)

  monkeypatch.setattr(programs.Program, '__call__', counted)
  outs = [tmp_path / 't5', tmp_path / 'bigram']
  summaries = eval_lib.evaluate_together(
      [(t5, str(outs[0]), ''), (bigram, str(outs[1]), '')], timing_repeats=2)
  # 2 units (4 examples, batch 2): a warm-up, then 2 timed repeats each.
  assert decodes.count('baseline') == 1 + 2 * 2
  assert decodes.count('speculative') == 2 * (1 + 2 * 2)
  records = [read_jsonl(out / 'examples.jsonl') for out in outs]
  for summary, out in zip(summaries, outs):
    assert summary['status'] == 'complete' and summary['examples'] == 4
    assert summary['differing_examples'] == 0
    check_summary_is_the_records(out, 4)
  assert summaries[1]['drafter'] == 'bigram'
  for a, b in zip(*records):
    assert a['baseline'] == b['baseline'] and a['index'] == b['index']
    assert a['baseline_batch_s'] == b['baseline_batch_s']
  hot = setup(TEMPERATURE='1.0')
  with pytest.raises(ValueError, match='does not share the baseline.*'
                     'temperature: 0.0 vs 1.0'):
    eval_lib.evaluate_together([(t5, str(outs[0]), ''),
                                (hot, str(tmp_path / 'hot'), '')])
  # Two runs in one folder (or one in another's) would mix their records
  # (before: both "complete", one examples.jsonl of two gammas); refused
  # before anything is written, as is an empty folder name (the cwd).
  inner = outs[1] / 'in'
  for first, second in ((outs[1], outs[1]), (outs[1], f'{outs[1]}/'),
                        (outs[1], inner), (inner, outs[1])):
    with pytest.raises(checks.InputError,
                       match='its own, or their records would mix'):
      eval_lib.evaluate_together([(t5, str(first), ''),
                                  (bigram, str(second), '')])
  assert not inner.exists()
  with pytest.raises(checks.InputError, match="output_dir must be a path"):
    eval_lib.evaluate(t5, '')
  for runs, said in (([(t5, str(inner))], r'\(setup, output_dir, config_str\)'
                      ' triples, got a tuple'),
                     ([(t5, str(inner), 5)], 'config_str must be'),
                     ([(t5.flat(), str(inner), '')], 'setup must be an')):
    with pytest.raises(checks.InputError, match=said):  # not after run.json
      eval_lib.evaluate_together(runs)
  for wrong, said in (({'partitioner': 'mesh'}, 'partitioner must be a '),
                      ({'cache': 'x'}, 'cache must be a loading.LoadCache')):
    with pytest.raises(checks.InputError, match=said):
      eval_lib.evaluate(t5, str(inner), **wrong)
  assert not inner.exists()


def test_the_gamma_choice_measures_alpha_on_the_first_examples(tmp_path):
  """A gamma choice's alpha is of the decodes at GAMMA of the first
  `CHOICE_EXAMPLES` examples (here all 4), not of its first unit alone (a
  batch of 2; at batch 1 one example, whose alpha may be 1.0): the records
  of a run at GAMMA pool to it. The drafter is a noisy copy of the target
  (`synthetic`), so that alpha differs between examples."""
  noisy = {'TARGET_CHECKPOINT': "'synthetic:seed=0'",
           'DRAFT_CHECKPOINT': "'synthetic:seed=0,noise=0.5'"}
  eval_lib.main(args(tmp_path / 'fixed', **noisy))
  records = sorted(read_jsonl(tmp_path / 'fixed' / 'examples.jsonl'),
                   key=lambda r: r['index'])
  pooled = lambda rs: sum(r['beta_sum'] for r in rs) / sum(
      r['beta_count'] for r in rs)
  assert pooled(records[:2]) != pytest.approx(pooled(records))
  eval_lib.main(args(tmp_path / 'profile', **noisy, **PROFILE))
  choice = json.loads((tmp_path / 'profile' / 'gamma_choice.json'
                       ).read_text())
  assert choice['alpha_examples'] == 4
  assert choice['alpha'] == pytest.approx(pooled(records), rel=1e-5)
