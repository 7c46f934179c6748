"""Drafting without a draft model: lookup, the output cache, combined.

Each cell is the eval job at batch 1, t = 0 and 1, gamma 6, one request
after another as a service sees them, with: prompt lookup ('lookup':
copies what followed the latest match of the last 1-3 tokens in the input
or the output); the output cache ('cache': copies from the outputs of the
most similar earlier requests; the job's cache in its run folder, empty
at the start, or the task's train pairs where the model set has a train
split, then every finished output); 'combined' (the cache's copy where it
matches and the T5 drafter is unsure or the match is long, the T5
drafter's draft elsewhere: no model call in an iteration that starts with
such a copy); and the T5 drafter (dec2 for the shipped models, else
small) alone, also with adaptive draft lengths (draft_confidence 0.5:
it stops where its top token is less likely; the combined drafter's
copying always stops where nothing matches, and it takes no confidence).
The table shows alpha, the mean accepted length, tokens per target call,
draft-model calls per target call, the measured speed-up and the speed-up
these counters predict on a measured hardware profile.
"""

import dataclasses

import jax
import numpy as np

from specdec_jax import data
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import speculative
from specdec_jax.bench import at_xxl_cost
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

GAMMA = 6
CONFIDENCE = 0.5
TEMPERATURES = (0.0, 1.0)
# (name, drafter kind, draft confidence); 't5' is the model set's T5.
DRAFTINGS = (('t5', 't5', 0.0), ('lookup', 'lookup', 0.0),
             ('cache', 'cache', 0.0), ('combined', 'combined', 0.0),
             ('t5 adaptive', 't5', CONFIDENCE))
SHRUNK = ('lookup', 'combined')  # copying alone; a cache and a model


def cells(options, tasks):
  t5 = sweep.model_set(options).t5_drafters()[0]  # dec2 on the shipped set
  gamma, temperatures = (3, (0.0,)) if options.shrink else (GAMMA, TEMPERATURES)
  out = []
  for task in tasks:
    for t in temperatures:
      for name, kind, confidence in DRAFTINGS:
        if options.shrink and name not in SHRUNK:
          continue
        model = drafters.KINDS[kind].needs_model
        changes = dict(gamma=gamma, temperature=t)
        if model and kind != 't5':
          changes['drafter'] = kind
        if confidence:
          changes['draft_confidence'] = confidence
        out.append(sweep.Cell(
            task, t5 if model else kind, changes,
            {'drafting': name.replace('t5', t5)},
            ('draft_calls',) if model else ()))
  return out


_CALLS = []


@dataclasses.dataclass(frozen=True)
class _CountingT5(network.T5Model):
  """A T5Model counting its decoder calls (a host callback: untimed)."""

  def extend(self, params, tokens, cache, *args, **kwargs):
    jax.debug.callback(lambda: _CALLS.append(1))
    return super().extend(params, tokens, cache, *args, **kwargs)


def _counting(drafter):
  """The drafter with its draft model counting (a T5's, a combined's)."""
  if isinstance(drafter, drafters.T5Drafter):
    return dataclasses.replace(drafter, model=_CountingT5(drafter.model.config))
  return dataclasses.replace(drafter, model=_counting(drafter.model))


def draft_calls(loaded, inputs):
  """Draft-model calls and target calls of the cell's decodes: the job's
  speculative decodes replayed untimed (its examples in order, its rng
  per unit, its output cache learning each output) with the draft model
  counting its calls."""
  del inputs  # the first batch; this replays every example
  setup, lengths = loaded.setup, loaded.setup.data.task_feature_lengths
  rows = data.pad_rows([ids for _, ids, _, _ in data.task_examples(
      loaded.task, setup.data.split, lengths, setup.data.num_examples,
      setup.data.truncate_inputs)], lengths['inputs'])
  drafter, params = _counting(loaded.drafter), loaded.draft_params
  calls = target_calls = 0
  for u, x in enumerate(rows):
    del _CALLS[:]
    out = speculative.speculative_sample(
        loaded.target, loaded.target_params, drafter, params, x[None],
        gamma=setup.gamma, max_decode_len=lengths['targets'],
        sampling=setup.sampling, eos_id=setup.data.eos_id,
        rng=jax.random.fold_in(jax.random.key(setup.seed), u))
    jax.effects_barrier()
    calls += len(_CALLS)
    target_calls += int(out.stats.row_iterations[0])
    if loaded.store is not None:
      loaded.store.add_requests(loaded.target, loaded.target_params, x[None],
                                [np.asarray(out.tokens[0])[:int(
                                    out.lengths[0])]])
      params = drafter.with_store(params, loaded.store)
  return {'draft_model_calls': calls, 'target_calls': target_calls}


def model_calls_per_call(row):
  counted = row['measured'].get('draft_calls')
  if counted is None:
    return 0.0
  return counted['draft_model_calls'] / max(counted['target_calls'], 1)


def predict(row, profile):
  """PREDICTED on the profile from the counters: tokens per target call /
  (cost(gamma + 1) + draft-model calls per target call x c), c the
  profile's measured c of the T5 drafter (copying taken as free)."""
  table.predict_counters(
      row, profile, width=row['gamma'] + 1,
      drafter_calls=model_calls_per_call(row),
      drafter=at_xxl_cost.STAND_INS.get(row['drafter']))


SPEC = sweep.Spec(
    name='draft_free',
    title='Drafting without a draft model: lookup, output cache, combined',
    about=__doc__.split('\n\n', 1)[1] + (
        "\nTokens / call = 1 / the job's target_calls_per_token. Draft-model "
        'calls / call: counted in an untimed replay of the cell\'s decodes '
        '(`draft_calls`). Measured speed-up: tokens/s over the baseline\'s '
        'on this machine. Predicted (counters) is PREDICTED through '
        'hardware.predict: tokens / call / (cost(gamma + 1) + '
        "draft-model calls / call x c) on the profile's measured cost(k) "
        "and its measured c of the T5 drafter; copying is taken as free. "
        'Not here: the earlier agentic request stream (repeats and near '
        'repeats of requests), which is no task of the eval job.'),
    cells=cells,
    columns=(('task', 'task'), ('t', table.temperature),
             ('drafting', 'drafting'), ('alpha', 'alpha'),
             ('mean accepted length', 'mean_accepted_length'),
             ('tokens / call', table.tokens_per_call),
             ('draft-model calls / call',
              lambda r: f'{model_calls_per_call(r):.2f}'),
             ('identical (greedy)', table.identical),
             ('measured speed-up', 'throughput_speedup'),
             ('predicted (counters) on {profile}',
              table.counters_cell)),
    num_examples=24, timing_repeats=3, predict=predict,
    measurements={'draft_calls': (draft_calls, sweep.EXAMPLE_FIELDS + (
        'target_widen_to', 'gamma', 'drafter', 'draft_config',
        'draft_checkpoint', 'draft_confidence', 'output_cache'))},
)
