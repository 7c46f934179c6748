"""Table 2 at T5-XXL cost on one accelerator, with bf16 numerics made explicit.

A device run (`run`: `python -m tools.accelerator`), not a sweep of the
eval job: one process in a time budget (`--max_minutes`, 8) runs the
phases of `PHASE_PLAN` in priority order (P1 the hardware profile, P2
Table 2, P3 token trees of the first drafter against the best chain, P4
batches, P5 against HF
transformers on the unwidened models (torch on the same device), P6 the
sweep and numerics); it starts no phase whose projected seconds do not
fit the time left, and lists it. Each phase's status is in the json's
`phases`; a rerun with the same flags takes the phases complete in its
results file and runs only the others.

Models. synthetic: a random T5 1.1-small S0 widened function-preservingly
to T5 1.1-XXL cost is the target; drafters are S0 plus sigma x std(leaf)
noise (sigma sets alpha) widened to T5 1.1-small / base / large cost, and
n-grams of S0's outputs; it measures the engine, not a drafter. shipped:
`specdec_jax.shipped`'s target widened to XXL cost, each drafter at its own
cost and (small / base / large) widened to that T5 1.1 cost, n-grams of the
test arrays' targets. --smoke: tiny models (S0 a one-layer T5 1.1-tiny, the
shipped target its smallest model), nothing widened, every phase: about a
minute and a half on two CPU cores, seconds with a warm compilation cache.

Phases (`results/<device>/accelerator_<source>.{md,json}`, written after
every step; the hardware profile of a full shipped run to profiles/,
of any other run beside its results): costs (what the later rows need:
t(k) for k <= max_gamma + 1 and at the token trees' widths at batch 1, for
k <= max_gamma + 1 at batches 8 and 32, `plan.needed_ks`; the
floor, c of every drafter, alpha calibrated on the unwidened models);
Table 2 at batch 1 for both tasks and temperatures, every drafter, gamma by
the paper's rule (`hardware.predict` maximised), measured against
`predict` on the profile of this run's own measurements, greedy rows
compared and every differing one diagnosed; the gamma sweep of the first
drafter (t = 0, first task); numerics (bfloat16 / float32 activations
against the 1-token and the same-shape baseline); batches 8 and 32; the
rest of the cost curve, in the last phase (t(k) for k = 1..17 and
`SPARSE_KS` at batch 1, 1..17 at larger batches: each k a program of its
own, which the device compiles when the executables a command carries
cannot hold them).
"""

import numpy as np

from specdec_jax import widening
from specdec_jax import hardware
from specdec_jax import models
from specdec_jax import task_table
from specdec_jax.drafters.tree.drafter import DEFAULT_TREE
from tools.accelerator import plan

# sigma -> greedy alpha: 0.01 -> 0.90, 0.02 -> 0.76, 0.04 -> 0.57.
SIGMAS = {'small': 0.02, 'base': 0.016, 'large': 0.013}
PAPER_TASK = {'synthetic': 'EnDe', **{
    name: entry.paper for name, entry in task_table.TASKS.items()}}
T5_SIZES, TEMPS, ACTS = ('small', 'base', 'large'), (0.0, 1.0), (
    'bfloat16', 'float32')
# The parts `--phases` names (costs always run).
PHASES = ('table2', 'numerics', 'batches', 'sweep', 'cost_curve', 'trees',
          'hf')
# The run's phases in priority order: (id, title, the parts it runs).
PHASE_PLAN = (
    ('p1', 'hardware profile', ('costs',)),
    ('p2', 'Table 2', ('table2',)),
    ('p3', 'token trees vs the best chain', ('trees',)),
    ('p4', 'batches 8 and 32', ('batches',)),
    ('p5', 'ours vs HF transformers', ('hf',)),
    ('p6', 'the rest: cost curve, gamma sweep, numerics',
     ('cost_curve', 'sweep', 'numerics')))
# Phases written down but not measured yet: what each would measure.
NOT_IMPLEMENTED = {}
# What the hardware profile does not measure yet.
PROFILE_GAPS = ['the heads drafters (specdec_jax.drafters.heads): not in '
                "the run's roster, not measured"]
# Beyond k = 17 the batch-1 curve is timed at these k only (the token
# trees' widths and points between; `plan.curve`).
SPARSE_KS = (24, 32, 48, 64, 65)
# P3's token trees of the first drafter (`shape.parse`: EAGLE-2 beams,
# '/N' verifies the N most probable nodes; the default tree), greedy, each
# against the best chain of Table 2.
TREES = ('beam:16,4,16/64', 'beam:8,4,12/64', DEFAULT_TREE)
FULL = plan.Sizes(
    s0=models.CONFIGS['t5_1_1_small'], costs=widening.PRESETS,
    target='target', input_length=64, output_length=128, batches=(1, 8, 32),
    profile_ks=(65, 17), sweep=tuple(range(1, 9)), max_gamma=8,
    examples=16,
    repeats=1, numerics_examples=4, calib_examples=8, ngram_examples=64,
    context=64, copy_mib=2048, cost_repeats=5, ngram_orders=(1, 2),
    trees=TREES)
# Tiny models, nothing widened (the synthetic T5 drafters share S0's
# shapes: one program; the shipped target is the smallest shipped model);
# one example decodes for the calibration and the n-grams (the table's
# baseline program).
SMOKE = FULL._replace(
    s0=models.config('t5_1_1_tiny', vocab_size=256, num_encoder_layers=1,
                     num_decoder_layers=1), costs=None, target='small',
    input_length=8, output_length=10, batches=(1, 2), profile_ks=(2, 2),
    sweep=(1, 2), max_gamma=1, examples=2, numerics_examples=2,
    calib_examples=1, ngram_examples=1, context=4, copy_mib=4, cost_repeats=1,
    ngram_orders=(2,), trees=('beam:2,2,2/4',))

SPREAD = ('accepted length per row (min / median / max)', lambda x: ' / '.join(
    f"{f(x['per_row_accepted_length']):.2f}" for f in (min, np.median, max)))
# Each list of rows in the json: its title, a note, and its columns (keys
# of its rows, or (header, function)).
SECTIONS = (
    ('table2', 'Table 2: speculative vs baseline, T5 1.1-XXL-cost target',
     "gamma by the paper's rule; predicted: `hardware.predict` with "
     "the row's alpha on this run's profile; measured: speculative over "
     "baseline tokens / s; identical: greedy rows equal to the baseline's, "
     'every differing one diagnosed (near tie: rounding; mismatch: a bug).',
     ('task', 'label', 'temperature', 'gamma_rule', 'gamma',
      'alpha_calibration', 'alpha',
      'c', 'cost_gamma_plus_1', 'predicted', 'measured', 'ratio',
      'identical', 'rows', 'near_ties', 'mismatches', 'paper')),
    ('numerics', 'Numerics: identical greedy rows, bfloat16 weights',
     '1token: the usual baseline; block: the same-shape baseline '
     '(`block_size=gamma + 1`); seconds per row.',
     ('activation_dtype', 'rows', 'identical_1token', 'near_ties_1token',
      'mismatches_1token', 'identical_block', 'near_ties_block',
      'mismatches_block', 't1_ms', 'baseline_s', 'block_baseline_s',
      'block_cost', 'speedup', 'speedup_vs_block')),
    ('batches', 'Batch 1, 8, 32 (greedy, the first drafter)',
     'fixed: one batch of that many rows, at batch 1\'s gamma and at the '
     "profile's gamma for the batch (the eval job's rule); stream: twice "
     "the batch's rows through its slots, refilled as rows finish (the eval "
     "job's streamed loop), against the streamed baseline. iterations: "
     "target calls per decode call; mean_row_iterations: the mean row's.",
     ('batch', 'batching', 'gamma_rule', 'gamma', 'alpha', 'c',
      'cost_gamma_plus_1', 'predicted',
      'measured', 'ratio', SPREAD, 'iterations', 'mean_row_iterations',
      'identical', 'rows', 'near_ties', 'mismatches')),
    ('trees', 'Token trees vs the best chain (the first drafter, t = 0, '
     'batch 1)', "predicted: `hardware.predict` from the row's "
     'tokens per target call / (cost(nodes + 1) + depth x c), c the first '
     "drafter's per token (a level's call on many nodes costs more: a lower "
     'bound); vs chain: measured over the best greedy Table 2 row of the '
     'task (same baseline program).',
     ('task', 'tree', 'nodes', 'gamma', 'tokens_per_call', 'c',
      'cost_gamma_plus_1', 'predicted', 'measured', 'ratio', 'best_chain',
      'vs_best_chain', 'identical', 'rows', 'near_ties', 'mismatches')),
    ('hf', 'Ours vs HF transformers (the target and the first drafter as '
     'trained, bfloat16, greedy, batch 1)', 'tokens / s of each, every '
     "example decoded by all four in alternating order; HF's assisted "
     "generation drafts gamma tokens a step (the first drafter's greedy "
     'gamma); differing: rows not equal to our baseline\'s (HF runs other '
     'kernels: bfloat16 rounding differs).',
     ('task', 'gamma', 'rows', 'ours baseline tokens_per_s',
      'HF greedy tokens_per_s', 'baseline_vs_generate',
      'ours speculative tokens_per_s', 'HF assisted tokens_per_s',
      'speculative_vs_assisted', 'ours_gain', 'hf_gain',
      'ours speculative differing', 'HF greedy differing',
      'HF assisted differing')),
    ('sweep', 'Gamma sweep (the first drafter, t = 0, batch 1, first task)',
     '', ('gamma', 'alpha', 'cost_gamma_plus_1', 'predicted', 'measured',
          'ratio', 'identical', 'rows')))

SPEC = plan.DeviceSpec(
    name='accelerator',
    title='Table 2 at T5 1.1-XXL cost',
    about=__doc__,
    phase_plan=PHASE_PLAN, phases=PHASES, not_implemented=NOT_IMPLEMENTED,
    profile_gaps=PROFILE_GAPS, full=FULL, smoke=SMOKE, sigmas=SIGMAS,
    t5_sizes=T5_SIZES, temps=TEMPS, acts=ACTS, sparse_ks=SPARSE_KS,
    paper_task=PAPER_TASK, sections=SECTIONS,
    project_from=f'results/{hardware.H100}/accelerator_shipped.json')
