"""Numerics: identical greedy outputs across activation dtypes.

Speculative decoding is exact, but a chain's verification call computes
gamma + 1 tokens at once where the baseline computes one, so in bfloat16
the two sums round differently and a greedy row may differ where two
tokens' logits (nearly) tie. Each cell is the eval job in Table 2's
setting (batch 1, t = 0, the model set's first T5 drafter at gamma
`GAMMA`) with the target's activations in float32 or bfloat16
(`EvalSetup.activation_dtype`), and a baseline that steps one token at a
time or with the verification's shapes (`same_shape_baseline`: gamma + 1
tokens a call, so the two decoders' sums are alike, at cost(gamma + 1) per
token). The table shows the rows identical to the baseline and the job's
diagnosis of each that differs (`diagnostics`): a near tie (rounding) or a
mismatch (a bug: the cell fails), and the baseline's tokens/s either way.
"""

from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

DTYPES = ('float32', 'bfloat16')
GAMMA = 4


def cells(options, tasks):
  drafter = sweep.model_set(options).t5_drafters()[0]
  gamma = 2 if options.shrink else GAMMA
  return [sweep.Cell(task, drafter, dict(
      gamma=gamma, max_gamma=gamma, temperature=0.0, activation_dtype=act,
      same_shape_baseline=same))
          for task in tasks for act in DTYPES for same in (False, True)]


SPEC = sweep.Spec(
    name='numerics',
    title='Numerics: identical greedy rows in float32 and bfloat16',
    about=__doc__.split('\n\n', 1)[1] + (
        '\nIdentical: greedy rows equal to the baseline; near ties / '
        'mismatches: the diagnoses of the others. Speed-up: speculative '
        "over baseline tokens/s (the same-shape baseline's is slower)."),
    cells=cells,
    columns=(('task', 'task'), ('drafter', 'drafter'), ('gamma', 'gamma'),
             ('activations', 'activation_dtype'),
             ('baseline', lambda r: f"{r['gamma'] + 1} tokens a call"
              if r['same_shape_baseline'] else '1 token a call'),
             ('identical (greedy)', table.identical),
             ('near ties', 'near_ties'), ('mismatches', 'mismatches'),
             ('baseline tok/s', lambda r: f"{r['baseline_tokens_per_s']:.0f}"),
             ('measured speed-up', 'throughput_speedup')),
    num_examples=16,
    timing_repeats=1,
)
