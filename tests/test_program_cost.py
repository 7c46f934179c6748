"""Tests of specdec_jax.program_cost: counts per loop iteration, parts, fit.

The GPU counts are checked on a committed fixture (tests/testdata/compiled:
a tiny loop compiled for a compile-only H100 by make_fixture.py there,
which needs the CUDA plugin the suite's python lacks), counted by hand.
"""

import importlib.util
import json
import logging
import pathlib

import pytest

from specdec_jax import checks
from specdec_jax import compiled
from specdec_jax import program_cost as pc

FIXTURE = pathlib.Path(__file__).resolve().parent / 'testdata' / 'compiled'
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def tiny():
  texts = pc.read_dump(FIXTURE)
  return pc.gpu_iteration(texts['thunks'], texts['hlo'], texts['metadata'])


def test_fixture_launches_kernels_command_buffers(tiny):
  """The launches of one iteration, counted by hand from the thunk dump:
  6 direct thunks (the counter copy, the row-store predicate, two
  cuBLAS-Lt GEMMs, the tanh, a copy), the nested 3-trip loop's 2 kernels
  x 3 (a known trip count runs no condition), one command buffer of 6
  kernels (5 row stores, the counter add) and the loop's condition: 14
  host launches, 19 kernels. A walk that missed nesting, trip counts or
  command buffers would count otherwise."""
  assert (tiny.total.launches, tiny.total.kernels) == (14, 19)
  assert (tiny.total.command_buffers, tiny.total.captured) == (1, 6)
  assert tiny.notes == []


def test_fixture_bytes(tiny):
  """Bytes by hand (bf16 [8, 256] = 4096 B): each GEMM reads x and a
  [256, 256] weight and writes [8, 256], its cuBLAS workspace excluded
  (139,264); the tanh and the copy 8,192 each; the nested loop 3 x
  (8 + 8,192); each in-place row store writes one [1, 256] row and reads
  a row of y and of its buffer (+ a pred and an index: 1,541), not its
  [10, 256] buffer; the scalars 8 + 13 + 8 + 5. An estimate that counted
  whole operands of slices or in-place buffers would be larger."""
  expected = (2 * 139264 + 8192 + 8192 + 3 * (8 + 8192) + 5 * 1541 +
              8 + 13 + 8 + 5)
  assert tiny.total.bytes == expected == 327251


def test_fixture_parts(tiny):
  """Parts: the GEMM reading the first argument's weight is the target
  call, the one reading the second's a drafter call; the tanh under
  'select_tokens' is selection, the row stores under 'cache' cache copies
  (with their command buffer's launch), the nested loop the draft steps.
  Attributing by op_name alone would put both GEMMs in one call."""
  parts = tiny.parts
  assert parts[pc.TARGET].bytes == parts[f'{pc.DRAFTER} 1'].bytes == 139264
  assert (parts['selection'].kernels, parts['selection'].bytes) == (1, 8192)
  cache = parts['cache copies']
  assert (cache.launches, cache.kernels, cache.command_buffers) == (2, 6, 1)
  assert (parts['draft steps'].launches, parts['loop condition'].launches
          ) == (6, 1)
  assert sorted(parts) == sorted([
      pc.TARGET, f'{pc.DRAFTER} 1', 'selection', 'cache copies',
      'draft steps', 'verify bookkeeping', 'loop condition'])


def test_hlo_iteration_counts_ops_not_launches():
  """The TPU path (HLO alone) counts the same ops and bytes as the thunk
  walk on the same program, and no launches: those are a GPU notion."""
  texts = pc.read_dump(FIXTURE)
  it = pc.hlo_iteration(texts['hlo'], 'tpu', program_bytes=1e6)
  assert (it.total.kernels, it.total.bytes, it.total.launches) == (
      19, 327251, 0)
  assert it.program_bytes == 1e6


CONDITIONAL = """\
001: kCopy  [source       | next=002 (1)] kCopy
002: kWhile [prev=001 (1) | sink        ]
condition:
    003: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1]
  body:
    004: kCustomKernel [source       | next=009 (1)] loop_compare_fusion_1
    009: kConditional  [prev=004 (1) | sink        ]
      false_branch:
        005: kCublasLtMatmul [source       | next=006 (1)] kCublasLtMatmul
        006: kCopy           [prev=005 (1) | next=007 (1)] kCopy
        007: kCustomKernel   [prev=006 (1) | sink        ] sort_6_1
      true_branch:
        008: kCustomKernel [source | sink] loop_convert_fusion
"""


def test_parse_thunks_nesting_and_conditional():
  """A conditional (as XLA prints one) holds its branches; an iteration
  counts its largest branch (3 launches, not 1 + 3) and says so."""
  (copy, loop) = pc.parse_thunks(CONDITIONAL)
  assert (copy.kind, loop.kind) == ('kCopy', 'kWhile')
  assert [t.id for t in loop.groups['condition']] == [3]
  cond = loop.groups['body'][1]
  assert sorted(cond.groups) == ['false_branch', 'true_branch']
  assert [t.id for t in cond.groups['false_branch']] == [5, 6, 7]
  it = pc.gpu_iteration(CONDITIONAL, '')
  assert (it.total.launches, it.total.kernels) == (1 + 3 + 1, 5)
  assert any('largest of 2 branches' in n for n in it.notes)


@pytest.mark.parametrize('description, part', [
    ('jit(run)/while/body/while/body/eval_jaxpr/add | T5Drafter.step',
     'draft steps'),
    ('jit(run)/while/cond/lt | VerifyLoop.cond_fn', 'loop condition'),
    ('jit(run)/while/body/select_n | DecoderCache.move_slots', 'cache copies'),
    ('jit(run)/while/body/jit(take_along_axis)/gather | grow', 'selection'),
    ('jit(run)/while/body/argmax | body', 'selection'),
    ('jit(run)/while/body/sub | _walk_greedy', 'verify bookkeeping'),
])
def test_part_of(description, part):
  """Bookkeeping ops go to the part their op_name and functions name; a
  rule that matched too broadly would move them."""
  assert pc.part_of(description, 'jit(run)/while') == part


def test_model_call_is_in_the_body_not_a_nested_loop():
  """A model call in the loop body is one; in a nested loop it is the
  draft steps' (the chain's drafter loop), not a call of its own."""
  loop = 'jit(run)/while'
  assert pc.is_model_call(
      'jit(run)/while/body/Transformer.extend/decoder.extend/layers_0/mlp',
      loop)
  assert not pc.is_model_call(
      'jit(run)/while/body/while/body/eval_jaxpr/Transformer.extend/x', loop)
  assert not pc.is_model_call('jit(run)/while/body/sub', loop)


def _program(gb, launches, captured, big=14.0):
  return {pc.TARGET: pc.Counts(launches=800, kernels=800, bytes=big * 1e9),
          'drafter call 1': pc.Counts(launches=launches, kernels=launches +
                                      captured, captured=captured,
                                      bytes=gb * 1e9)}


def test_fit_recovers_known_parameters():
  """Times made by a known model (2.5 TB/s, 7 us a launch, 2 us a
  captured kernel; the target call bound by its bytes, the drafter's by
  its launches) give those parameters back."""
  true = pc.DeviceModel('t', 2.5e12, 7.0, 2.0)
  programs = [_program(0.01, 50, 300), _program(0.02, 400, 100, 15.0),
              _program(0.01, 700, 500, 16.0), _program(0.03, 100, 900, 17.0)]
  model = pc.fit([(p, true.ms(p)) for p in programs], 't')
  assert model.bandwidth == pytest.approx(2.5e12, rel=1e-6)
  assert model.launch_us == pytest.approx(7.0, rel=1e-6)
  assert model.captured_us == pytest.approx(2.0, rel=1e-6)


def test_fit_leaves_out_a_negative_term():
  """A term the data would fit negative (here captured kernels that come
  with faster times) is left out, never negative."""
  rows = [(_program(0.01, 100, 0), 6.3), (_program(0.01, 100, 500), 6.0),
          (_program(0.01, 300, 0), 7.6)]
  model = pc.fit(rows, 't')
  assert model.captured_us == 0 and model.launch_us > 0


def test_stored_h100_model_reproduces_the_measured_iterations():
  """The stored H100 model is the fit of its stored programs and
  estimates each measured per-iteration time within 10% (the model's
  goal); a change of counts, times or the fit that broke either fails."""
  data = pc.load_model('nvidia-h100-80gb-hbm3')
  model = data['model']
  refit = pc.refit(data)
  assert refit.bandwidth == pytest.approx(model.bandwidth, rel=1e-6)
  assert refit.launch_us == pytest.approx(model.launch_us, abs=1e-3)
  assert refit.captured_us == pytest.approx(model.captured_us, abs=1e-3)
  labels = [p['label'] for p in data['programs']]
  assert labels == ['baseline', 'chain dec2 gamma 6', 'tree beam:4,2,8',
                    'tree beam:8,4,12/64', 'tree beam:16,4,16/64']
  for p in data['programs']:
    ratio = model.ms(pc.parts_of(p['parts'])) / pc.measured_ms(p)
    assert 0.9 <= ratio <= 1.1, (p['label'], ratio)


def test_stored_times_are_the_runs_own():
  """Each stored program's time is its run's (the files named in it): a
  figure typed or rounded differently from the run fails."""
  data = pc.load_model('nvidia-h100-80gb-hbm3')
  for p in data['programs']:
    run = json.loads((ROOT / p['source']).read_text())
    if 't_ms' in p:
      assert p['t_ms'] == run['costs']['bfloat16']['1']['t_ms']['1']
      continue
    rows = run['trees'] if p['program'] == 'tree' else run['table2']
    (row,) = [r for r in rows if r['task'] == 'en_de' and r['gamma'] == p[
        'setup']['gamma'] and r['temperature'] == 0 and r.get('tree') == p[
            'setup'].get('tree') and r['drafter'].startswith('dec2')]
    assert (p['seconds'], p['target_calls'], p['rows']) == (
        row['speculative_s'], row['target_calls'], row['rows'])
    assert pc.measured_ms(p) == pytest.approx(p['measured_ms'], abs=1e-3)


def test_table_labels_estimates(tiny):
  """Every table with times says they are estimates, and the ratio column
  is estimated / measured."""
  model = pc.DeviceModel('t', 1e9, 10.0, 1.0)
  rows = pc.rows([('tiny', tiny, 1.0)], model)
  assert rows[0]['part'] == 'all'
  assert rows[0]['estimated_ms'] == pytest.approx(model.ms(tiny.parts))
  assert rows[0]['ratio'] == pytest.approx(rows[0]['estimated_ms'])
  text = pc.markdown(rows, 'gpu', model)
  assert 'ESTIMATE' in text and 'not measured' in text
  assert 'assumed' not in text and 'assumed' not in pc.markdown(
      rows, 'gpu', model, fitted=1.0)
  # --captured_us: a cost the fit did not give is said to be assumed.
  assert ("captured kernels' 1 us is assumed (--captured_us), not fitted "
          '(the fit: 0 us)') in pc.markdown(rows, 'gpu', model, fitted=0.0)
  assert 'GPU notion' in pc.markdown(rows, 'tpu')


def test_iterations_flag_without_cuda_plugin():
  """`--iterations` for a GPU target says the CUDA plugin is missing where
  it is (the suite's python), instead of a traceback."""
  args = compiled.parse_flags(['--target=gpu:h100', '--iterations',
                               '--programs=baseline', '--captured_us=2.4',
                               '--xla_option=xla_gpu_enable_triton_gemm=True'])
  assert args.iterations == 'programs' and args.captured_us == 2.4
  assert args.xla_option == [('xla_gpu_enable_triton_gemm', True)]
  with pytest.raises(SystemExit):
    compiled.parse_flags(['--target=gpu:h100', '--xla_option=triton'])
  if any(importlib.util.find_spec(p) for p in ('jax_cuda13_plugin',
                                               'jax_cuda12_plugin')):
    pytest.skip('the CUDA plugin is installed here, so the missing-plugin '
                'error this test checks cannot occur (the flags were '
                'checked above; run it where the plugin is absent)')
  with pytest.raises(SystemExit, match=r'^error: no CUDA plugin: .*pip '
                     r'install --target=<folder> .*PYTHONPATH=<folder>'):
    compiled.main(['--target=gpu:h100', '--iterations', '--programs=baseline'])


def test_an_option_the_compiler_refuses_is_one_line_before_compiling(
    monkeypatch):
  """--xla_option the TPU compiler does not know: one line naming it,
  tried on a program of one addition before the decode programs compile
  (a JaxRuntimeError's traceback after compiling them, before)."""
  def report_iterations(*args, **kwargs):
    raise AssertionError('the programs compiled with a refused option')
  monkeypatch.setattr(pc, 'report_iterations', report_iterations)
  spec = 't5_1_1_small,num_decoder_layers=1,num_encoder_layers=1'
  level = logging.getLogger().level
  with pytest.raises(SystemExit) as e:
    checks.run_main(compiled.main, [
        '--target=tpu:v5e:1x1', '--iterations', '--programs=baseline',
        f'--model={spec}', f'--drafts={spec}', '--batches=1',
        '--input_length=8', '--max_decode_len=8',
        '--xla_option=xla_nonexistent_flag=1'])
  assert e.value.code == ('error: --xla_option: INVALID_ARGUMENT: No such '
                          "compile option: 'xla_nonexistent_flag'")
  # The command's quiet root logger is its own: an in-process caller's
  # level is back after it.
  assert logging.getLogger().level == level
  # An option it knows passes.
  pc.check_options(compiled.devices('tpu:v5e:1x1')[0], 'tpu',
                   {'xla_gpu_enable_triton_gemm': False})


@pytest.mark.parametrize('argv', [[], ['--target=tpu:v5e:1x1']])
def test_the_module_has_no_command_line(capsys, argv):
  """`python -m specdec_jax.program_cost [flags]` is refused in one line
  naming the command that prints its table (it printed nothing and exited
  0, before)."""
  with pytest.raises(SystemExit) as e:
    pc.main(argv)
  assert e.value.code == 2
  assert ('no command line of its own: the table is python -m '
          'specdec_jax.compiled --target=<target> --iterations') in (
              capsys.readouterr().err)


def test_xla_options_reach_the_compiler_and_the_note(monkeypatch):
  """`report_iterations(options=...)` compiles every program with them (on
  a GPU over the cuBLAS default, which they may override) and says so."""
  seen = []

  def compile_iteration(lowered, platform, options=None):
    seen.append((lowered, platform, options))
    return pc.hlo_iteration(TPU_LOOP, 'tpu')
  monkeypatch.setattr(pc, 'compile_iteration', compile_iteration)
  lower = lambda name, **setup: f'lowered {name}'
  options = {'xla_gpu_enable_triton_gemm': True}
  text = pc.report_iterations(lower, 'gpu', ['baseline', 'tree'], 'no-gpu',
                              options=options)
  assert seen == [('lowered baseline', 'gpu', options),
                  ('lowered tree', 'gpu', options)]
  assert ("every program compiled with the XLA options "
          "{'xla_gpu_enable_triton_gemm': True}") in text
  assert 'XLA options' not in pc.report_iterations(lower, 'tpu', ['t5'],
                                                    'no-tpu')


def test_the_reference_programs_compile_for_a_device_with_no_model(
    monkeypatch):
  """`--iterations=reference` on a device with no fitted model of its own
  (an H200, a TPU) compiles the programs the H100's model was fitted to,
  each with its own setup, and shows no measured ms (those were the
  H100's) and no estimate."""
  seen = []

  def compile_iteration(lowered, platform, options=None):
    del platform, options
    seen.append(lowered)
    return pc.hlo_iteration(TPU_LOOP, 'tpu')
  monkeypatch.setattr(pc, 'compile_iteration', compile_iteration)
  lower = lambda name, **setup: (name, setup)
  fitted = pc.load_model()['programs']
  text = pc.report_iterations(lower, 'gpu', None, 'NVIDIA H200')
  assert seen == [(p['program'], p['setup']) for p in fitted]
  rows = [line.split(' | ') for line in text.splitlines()
          if line.startswith('| ') and ' | all | ' in line]
  assert [r[0][2:] for r in rows] == [p['label'] for p in fitted]
  assert all(r[-3:] == ['-', '-', '- |'] for r in rows), rows
  h100 = pc.report_iterations(lower, 'gpu', None, 'NVIDIA H100 80GB HBM3')
  assert f"{pc.measured_ms(fitted[0]):.2f}" in h100


# A loop body as XLA's TPU compiler writes one (memory spaces in the
# layouts: S(1) VMEM, S(2) SMEM, none HBM): w1 prefetched into VMEM by an
# async copy, w2 by two async slices joined by a ConcatBitcast, w3 read
# from HBM by its GEMM; x is loop state, y1 and y2 values of the iteration.
TPU_LOOP = """HloModule tiny_tpu, is_scheduled=true

%fdot (p0: bf16[1,64], p1: bf16[64,64]) -> bf16[1,64] {
  %p0 = bf16[1,64]{1,0:T(2,128)(2,1)} parameter(0)
  %p1 = bf16[64,64]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %d = bf16[1,64]{1,0:T(2,128)(2,1)} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (s: (s32[], bf16[1,64], bf16[64,64], bf16[64,64], bf16[64,64])) -> (s32[], bf16[1,64], bf16[64,64], bf16[64,64], bf16[64,64]) {
  %s = (s32[], bf16[1,64], bf16[64,64], bf16[64,64], bf16[64,64]) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%s), index=0
  %x = bf16[1,64]{1,0:T(2,128)(2,1)} get-tuple-element(%s), index=1
  %w1 = bf16[64,64]{1,0:T(8,128)(2,1)} get-tuple-element(%s), index=2
  %w2 = bf16[64,64]{1,0:T(8,128)(2,1)} get-tuple-element(%s), index=3
  %w3 = bf16[64,64]{1,0:T(8,128)(2,1)} get-tuple-element(%s), index=4
  %cs = (bf16[64,64]{1,0:T(8,128)(2,1)S(1)}, bf16[64,64]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%w1)
  %cd = bf16[64,64]{1,0:T(8,128)(2,1)S(1)} copy-done(%cs)
  %y1 = bf16[1,64]{1,0:T(2,128)(2,1)} fusion(%x, %cd), kind=kOutput, calls=%fdot
  %ss0 = ((bf16[64,64]{1,0:T(8,128)(2,1)}), bf16[32,64]{1,0:T(8,128)(2,1)S(1)}, s32[]{:S(2)}) slice-start(%w2), slice={[0:32], [0:64]}
  %ss1 = ((bf16[64,64]{1,0:T(8,128)(2,1)}), bf16[32,64]{1,0:T(8,128)(2,1)S(1)}, s32[]{:S(2)}) slice-start(%w2), slice={[32:64], [0:64]}
  %sd0 = bf16[32,64]{1,0:T(8,128)(2,1)S(1)} slice-done(%ss0)
  %sd1 = bf16[32,64]{1,0:T(8,128)(2,1)S(1)} slice-done(%ss1)
  %cat = bf16[64,64]{1,0:T(8,128)(2,1)S(1)} custom-call(%sd0, %sd1), custom_call_target="ConcatBitcast"
  %y2 = bf16[1,64]{1,0:T(2,128)(2,1)} fusion(%y1, %cat), kind=kOutput, calls=%fdot
  %y3 = bf16[1,64]{1,0:T(2,128)(2,1)} fusion(%y2, %w3), kind=kOutput, calls=%fdot
  %i1 = s32[]{:T(128)} add(%i, %i)
  ROOT %out = (s32[], bf16[1,64], bf16[64,64], bf16[64,64], bf16[64,64]) tuple(%i1, %y3, %w1, %w2, %w3)
}

%cond (c: (s32[], bf16[1,64], bf16[64,64], bf16[64,64], bf16[64,64])) -> pred[] {
  %c = (s32[], bf16[1,64], bf16[64,64], bf16[64,64], bf16[64,64]) parameter(0)
  %ci = s32[]{:T(128)} get-tuple-element(%c), index=0
  %k = s32[]{:T(128)} constant(10)
  ROOT %lt = pred[]{:T(1024)} compare(%ci, %k), direction=LT
}

ENTRY %main (a: bf16[1,64], b: bf16[64,64], e: bf16[64,64], f: bf16[64,64]) -> bf16[1,64] {
  %a = bf16[1,64]{1,0:T(2,128)(2,1)} parameter(0)
  %b = bf16[64,64]{1,0:T(8,128)(2,1)} parameter(1)
  %e = bf16[64,64]{1,0:T(8,128)(2,1)} parameter(2)
  %f = bf16[64,64]{1,0:T(8,128)(2,1)} parameter(3)
  %zero = s32[]{:T(128)} constant(0)
  %init = (s32[], bf16[1,64], bf16[64,64], bf16[64,64], bf16[64,64]) tuple(%zero, %a, %b, %e, %f)
  %loop = (s32[], bf16[1,64], bf16[64,64], bf16[64,64], bf16[64,64]) while(%init), condition=%cond, body=%body
  ROOT %r = bf16[1,64]{1,0:T(2,128)(2,1)} get-tuple-element(%loop), index=1
}
"""


def test_tpu_hbm_bytes_and_counted_excess():
  """By hand (a [64, 64] bf16 weight: 8,192 B; a [1, 64] row: 128 B).
  HBM: each weight read once, 24,576 (the copy and the two slices read
  from HBM into VMEM, y3's GEMM from HBM); loop state x and the counter
  read by y1, the add and the compare, 140; y1 and y2 read back, and the
  condition's constant, 260; three rows, the counter and the predicate
  written, 389: 25,365. XLA's cost analysis counts 82,721 for the same
  ops: the copy's start 24,580 (its operand, destination and source) and
  done 8,192; each slice's start 8,196 (read and written) and done 4,096;
  the ConcatBitcast nothing; each GEMM its weight, VMEM or not. An
  attribution that counted VMEM as HBM, or a copy at both its start and
  its done, would not give these."""
  it = pc.hlo_iteration(TPU_LOOP, 'tpu')
  b = it.breakdown
  assert {k: b[k] for k in pc.HBM_KINDS} == dict(
      invariant=24576, state=140, temporary=260, written=389)
  assert it.total.bytes == 25365
  assert sum(it.counted.values()) == pc.program_counted(
      pc.Module(TPU_LOOP)) == 82721
  assert b['excess: async copies HBM<->VMEM'] == (
      24580 - 8192) + 8192 + 2 * (8196 - 4096) + 2 * 4096 == 40972
  assert b['excess: VMEM operands'] == 2 * 8192
  text = pc.breakdown_markdown([('tiny', it)])
  assert '| HBM: all (floor-relevant) | 0.000 |' in text
  kinds = it.kinds
  assert kinds['copy-start'] == [1, 8192, 24580]
  assert kinds['slice-done'] == [2, 0, 8192]
  assert kinds['custom-call:ConcatBitcast'] == [1, 0, 0]
  assert kinds['fusion:kOutput'] == [3, 256 + 256 + 8448, 3 * 8448]


# A loop body whose top-k custom call has no op_name (XLA's TopK rewrite
# keeps none), read by a log-sum-exp that tree growth's draw made (on
# logits made before the loop: no model's weights).
GPU_TOPK_LOOP = """\
HloModule topk

%lse (p: f32[4,32], k: f32[4,2]) -> f32[4] {
  %p = f32[4,32]{1,0} parameter(0)
  %k = f32[4,2]{1,0} parameter(1)
  %z = f32[] constant(0)
  ROOT %r = f32[4]{0} reduce(%p, %z), dimensions={1}, to_apply=%add, metadata={op_name="jit(run)/while/body/log"}
}

%cond (c: (s32[], f32[4,32])) -> pred[] {
  %c = (s32[], f32[4,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT, metadata={op_name="jit(run)/while/cond/lt"}
}

%body (s: (s32[], f32[4,32])) -> (s32[], f32[4,32]) {
  %s = (s32[], f32[4,32]{1,0}) parameter(0)
  %x = f32[4,32]{1,0} get-tuple-element(%s), index=1
  %tk = (f32[4,2]{1,0}, s32[4,2]{1,0}) custom-call(%x), custom_call_target="__gpu$TopK"
  %f = f32[4]{0} fusion(%x, %tk#0), kind=kInput, calls=%lse
  %i = s32[] get-tuple-element(%s), index=0
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one), metadata={op_name="jit(run)/while/body/add"}
  ROOT %t = (s32[], f32[4,32]{1,0}) tuple(%j, %x)
}

ENTRY %main (a: s32[4,32]) -> f32[4,32] {
  %a = s32[4,32]{1,0} parameter(0)
  %logits = f32[4,32]{1,0} convert(%a)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,32]{1,0}) tuple(%zero, %logits)
  %loop = (s32[], f32[4,32]{1,0}) while(%init), condition=%cond, body=%body, metadata={op_name="jit(run)/while"}
  ROOT %r = f32[4,32]{1,0} get-tuple-element(%loop), index=1
}
"""
GPU_TOPK_THUNKS = """\
001: kWhile [source | sink]
condition:
    002: kCustomKernel [source | sink] lt
  body:
    003: kCustomKernel [source       | next=004 (1)] topk
    004: kCustomKernel [prev=003 (1) | next=005 (1)] input_reduce_fusion
    005: kCustomKernel [prev=004 (1) | sink        ] add
"""
GPU_TOPK_METADATA = ''.join(
    f'profile_annotation: "{name}" thunk_id: {i}\n'
    for i, name in ((1, 'loop'), (2, 'lt'), (3, 'tk'), (4, 'f'), (5, 'j')))


@pytest.mark.parametrize('functions', ['', '_Levels.draw'])
def test_an_op_without_op_name_joins_the_part_of_what_reads_it(functions):
  """The top-k kernel (no op_name) goes where the op that reads its
  output goes: a draw of tree growth is selection (by its op_name, top_k,
  or by `_Levels`, the level-by-level growth, among its functions). Left
  to the rest, it would be counted as verify bookkeeping, and so would
  the per-level draws."""
  hlo = GPU_TOPK_LOOP
  if functions:  # the stack frames' tables, as XLA prints them
    hlo = hlo.replace('body/log"}', 'body/log" stack_frame_id=1}').replace(
        'HloModule topk\n', 'HloModule topk\n\nFileNames\n1 "grow.py"\n\n'
        f'FunctionNames\n1 "{functions}"\n\nFileLocations\n'
        '1 {file_name_id=1 function_name_id=1 line=1}\n\nStackFrames\n'
        '1 {file_location_id=1 parent_frame_id=1}\n')
  else:  # named by its op_name alone
    hlo = hlo.replace('body/log', 'body/top_k')
  it = pc.gpu_iteration(GPU_TOPK_THUNKS, hlo, GPU_TOPK_METADATA)
  assert it.parts['selection'].kernels == 2
  assert it.parts['verify bookkeeping'].kernels == 1  # the counter's add
