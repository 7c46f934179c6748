"""Batches: the speed-up per batch, fixed batches vs continuous batching.

At batch B a fixed batch runs until its slowest row ends; continuous
batching (streaming.py) refills an ended row inside the loop. Each cell is
the eval job at one (task, temperature, batch, batching) with gamma fixed;
at `COMPARE_AT` two more streamed cells: adaptive draft lengths (the T5
drafter's confidence) and the gamma the job chooses from the profile it
measures (`BatchSpec.gamma_rule = 'profile'`: possibly 0, no
speculation). Every cell also measures t(1), cost(k) and c at its batch,
the inputs of its prediction.
"""

from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

GAMMA = 4
BATCHES = (1, 4, 8, 16, 32)
TEMPERATURES = (0.0, 1.0)
COMPARE_AT = 8
CONFIDENCE = 0.4


def cells(options, tasks):
  batches, temperatures, compare_at = BATCHES, TEMPERATURES, COMPARE_AT
  gamma, top = GAMMA, {}
  if options.shrink:  # gamma 2, cost(k) timed for k <= 3 (a program each);
    # the job's own gamma choice is tested with the job (tests/test_eval.py)
    batches, temperatures, compare_at = (2,), (0.0,), None
    gamma, top = 2, {'max_gamma': 2}
  out, drafter = [], sweep.model_set(options).t5_drafters()[0]
  for task in tasks:
    for t in temperatures:
      for b in batches:
        common = dict(gamma=gamma, temperature=t, batch_size=b,
                      batch_gamma='config', **top)
        for batching in (('fixed',) if b == 1 else ('fixed', 'stream')):
          out.append(sweep.Cell(task, drafter, dict(common, batching=batching),
                                {'variant': f'gamma {gamma}'}, ('costs',)))
        if b == compare_at:
          stream = dict(common, batching='stream')
          if not options.shrink:
            out.append(sweep.Cell(
                task, drafter, dict(stream, draft_confidence=CONFIDENCE),
                {'variant': f'gamma {GAMMA}, confidence {CONFIDENCE:g}'},
                ('costs',)))
          out.append(sweep.Cell(
              task, drafter, dict(stream, batch_gamma='profile'),
              {'variant': 'gamma chosen by the profile'}, ('costs',)))
  return out


SPEC = sweep.Spec(
    name='batches',
    title='Batches: the speed-up per batch, fixed vs continuous batching',
    about=__doc__.split('\n\n', 1)[1] + (
        '\nSpeed-up = speculative tokens/s over baseline tokens/s (the '
        "job's throughput_speedup: sampled outputs differ in length). "
        'Predicted = Theorem 3.8 with the cell\'s alpha and gamma on its '
        'own cost(gamma + 1) and c measured at the batch: every row busy, '
        'no encoder / cache set-up.'),
    cells=cells,
    columns=(('task', 'task'), ('t', table.temperature),
             ('batch', 'batch_size'),
             ('batching', 'batching'), ('setting', 'variant'),
             ('gamma used', lambda r: ', '.join(r['gamma_used'] or {})),
             ('alpha', 'alpha'),
             ('baseline tok/s', lambda r: f"{r['baseline_tokens_per_s']:.0f}"),
             ('speculative tok/s',
              lambda r: f"{r['speculative_tokens_per_s']:.0f}"),
             ('measured speed-up', 'throughput_speedup'),
             ('predicted', 'predicted_speedup'),
             ('measured / predicted', 'measured_over_predicted'),
             ('predicted {profile}', table.on_profile),
             ('identical (greedy)', table.identical)),
    num_examples=64,
    timing_repeats=3,
)
