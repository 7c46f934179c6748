"""Ours vs HF transformers: the same weights, greedy, batch 1.

Each cell is the eval job on a task at batch 1, greedy, with the model
set's target and its first T5 drafter as trained (a model set's widenings
undone: HF holds its own copy of both beside ours) at gamma `GAMMA`
(Table 2's setting, as the numerics spec) with bfloat16 activations
(shrunk: float32, where HF's greedy rows are ours token for token): our
baseline's and speculative decoding's tokens/s are the job's own. Beside
the decode, the measurement 'hf' converts both models to HF
`T5ForConditionalGeneration` (`checkpoints.hf.to_hf_model`, in our
target's activation dtype, on the GPU when torch sees one) and decodes the
examples the cell decoded (checked against its records) with HF's
`generate` and its assisted generation (`assistant_model`, gamma drafts
a step), the two timed alternately on each example
(`measure.time_alternating`: the run's timing repeats, medians, the order
flipped every example) after one untimed warm-up. A differing HF row is
one whose text or length is not our baseline's record of the example.
"""

import jax.numpy as jnp
import numpy as np

from specdec_jax import data
from specdec_jax import decoding
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import partitioning
from specdec_jax import run_folder
from specdec_jax.checkpoints import hf as hf_lib
from specdec_jax.experiments import sweep
from specdec_jax.experiments.specs import numerics

GAMMA = numerics.GAMMA
ACTIVATIONS = 'bfloat16'
# Shrunk: float32, where HF's greedy rows are ours token for token.
SHRUNK = dict(gamma=2, activations='float32')
METHODS = ('generate', 'assisted')


def cells(options, tasks):
  models = sweep.model_set(options)
  drafter = models.t5_drafters()[0]
  gamma, act = (SHRUNK['gamma'], SHRUNK['activations']) if options.shrink else (
      GAMMA, ACTIVATIONS)
  as_trained = {f'{k}_widen_to': None for k, name in (
      ('target', 'target'), ('draft', drafter)) if models.widening.get(name)}
  return [sweep.Cell(task, drafter, dict(
      gamma=gamma, max_gamma=gamma, temperature=0.0, batch_size=1,
      activation_dtype=act, **as_trained), measure=('hf',))
          for task in tasks]


def _torch():
  """torch and transformers, or an error naming them (optional extras)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        'the hf spec decodes with HF transformers: it needs the packages '
        "torch and transformers (pip install -e '.[test]'): " + str(e)
    ) from e
  return torch, transformers


def hf(loaded, inputs, *, records=None, timing_repeats=1):
  """HF `generate` and assisted generation on the cell's examples.

  Args:
    loaded: the cell's setup, built.
    inputs: its first batch's inputs (unused: every example is decoded).
    records: the cell's records (the eval job's), in index order.
    timing_repeats: timed decodes of an example by each method (medians).

  Returns:
    Per method ('generate', 'assisted'): tokens (`decoding.output_lengths`
    of each row, summed), seconds (the examples' medians, summed),
    tokens_per_s, lengths (per example) and differing (rows not equal to
    our baseline's record); the device, dtype, versions and gamma.
  """
  del inputs
  if not records:
    raise ValueError("the 'hf' measurement reads the cell's decoded records")
  torch, transformers = _torch()
  setup = loaded.setup
  examples = loading.read_examples(setup, loaded.task, len(records))
  for r, (i, ids, in_text, tgt_text) in zip(records, examples):
    if (r['index'], r['example']) != (i, run_folder.example_fingerprint(
        ids, in_text, tgt_text)):
      raise ValueError(f"record {r['index']} is not the split's example {i}")
  dtype = jnp.dtype(setup.decoding_config.compute_dtype).name
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  convert = lambda model, params: hf_lib.to_hf_model(partitioning.to_host(
      params), model.config).to(device=device, dtype=getattr(torch, dtype))
  target = convert(partitioning.unwrap(loaded.target), loaded.target_params)
  draft = convert(loaded.drafter.model, loaded.draft_params)
  length, eos = setup.data.task_feature_lengths['targets'], setup.data.eos_id
  calls = lambda x: {
      'generate': lambda: hf_lib.generate(target, x, length, eos),
      'assisted': lambda: hf_lib.generate(target, x, length, eos, draft,
                                          setup.gamma)}
  rows = [data.pad_rows([ids], setup.data.task_feature_lengths['inputs'])
          for _, ids, _, _ in examples]
  measure.time_alternating(calls(rows[0]))  # warm-up
  out = {m: dict(tokens=0, s=0.0, lengths=[], differing=0) for m in METHODS}
  for n, (x, r) in enumerate(zip(rows, records)):
    tokens, seconds = measure.time_alternating(calls(x), timing_repeats,
                                               reverse=n % 2 == 1)
    for m in METHODS:
      size, differs = compare(tokens[m], r, loaded.vocabulary, eos)
      out[m]['lengths'].append(size)
      out[m]['tokens'] += size
      out[m]['s'] += seconds[m]
      out[m]['differing'] += int(differs)
  for m in METHODS:
    out[m]['tokens_per_s'] = out[m]['tokens'] / max(out[m]['s'], 1e-12)
  return dict(out, examples=len(rows), repeats=timing_repeats, device=device,
              dtype=dtype, gamma=setup.gamma, torch=torch.__version__,
              transformers=transformers.__version__)


def compare(tokens, record, vocabulary, eos_id):
  """An HF row's length (`decoding.output_lengths`: up to and including
  the end token) and whether it differs from our baseline's record of the
  example: its text (`data.decode_text`, as the job writes it) or length."""
  size = int(decoding.output_lengths(np.asarray(tokens)[None], eos_id)[0])
  text = data.decode_text(vocabulary, tokens, size, eos_id)
  return size, (text, size) != (record['baseline'], record['baseline_length'])


MEASUREMENTS = {'hf': (hf, sweep.EXAMPLE_FIELDS + (
    'target_widen_to', 'batch_size', 'drafter', 'draft_config',
    'draft_checkpoint', 'draft_widen_to', 'gamma'))}


def finish(result, out):
  """Each row's ratios: ours over HF, and each side's speculative gain."""
  del out
  for row in result['rows']:
    h = row['measured']['hf']
    gen, assisted = (h[m]['tokens_per_s'] for m in METHODS)
    base, spec = row['baseline_tokens_per_s'], row['speculative_tokens_per_s']
    row.update(baseline_vs_generate=base / gen,
               speculative_vs_assisted=spec / assisted,
               ours_gain=spec / base, hf_gain=assisted / gen)


tok_s = lambda field: lambda r: f'{r[field]:.1f}'
hf_s = lambda m: lambda r: f"{r['measured']['hf'][m]['tokens_per_s']:.1f}"
differing = lambda m: lambda r: f"{r['measured']['hf'][m]['differing']}"

SPEC = sweep.Spec(
    name='hf',
    title='Ours vs HF transformers: the same weights, greedy, batch 1',
    about=__doc__.split('\n\n', 1)[1] + (
        '\ntok/s: generated tokens (up to and including the end token) '
        'over the summed medians. Baseline vs generate, speculative vs '
        "assisted: ours over HF's; gains: speculative over greedy on each "
        "side. Differing: rows not equal to our baseline's (ours: the "
        "job's greedy check; HF's kernels round otherwise in bfloat16)."),
    cells=cells,
    columns=(('task', 'task'), ('drafter', 'drafter'), ('gamma', 'gamma'),
             ('activations', 'activation_dtype'), ('rows', 'examples'),
             ('ours baseline tok/s', tok_s('baseline_tokens_per_s')),
             ('HF generate tok/s', hf_s('generate')),
             ('baseline vs generate', 'baseline_vs_generate'),
             ('ours speculative tok/s', tok_s('speculative_tokens_per_s')),
             ('HF assisted tok/s', hf_s('assisted')),
             ('speculative vs assisted', 'speculative_vs_assisted'),
             ('ours gain', 'ours_gain'), ('HF gain', 'hf_gain'),
             ('ours speculative differing', 'differing_examples'),
             ('HF generate differing', differing('generate')),
             ('HF assisted differing', differing('assisted'))),
    num_examples=16,
    timing_repeats=3,
    shrunk=dict(num_examples=1, timing_repeats=1, tasks=('en_de',)),
    measurements=MEASUREMENTS,
    finish=finish,
)
