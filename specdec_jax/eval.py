r"""Baseline vs speculative evaluation job, launched like a T5X job.

  python -m specdec_jax.eval \
    --gin_file=gin_configs/paper/ende_t0_small.gin \
    --gin.TARGET_CHECKPOINT="'/ckpts/t5_1_1_xxl_ende/checkpoint_1000000'" \
    --gin.DRAFT_CHECKPOINT="'/ckpts/t5_1_1_small_ende/checkpoint_1000000'" \
    --gin.EVAL_OUTPUT_DIR="'/tmp/ende_t0_small'"

Flags follow T5X: `--gin_file` (repeatable), `--gin_bindings` (repeatable),
`--gin.NAME=VALUE` (shorthand for a binding), `--gin_search_paths`
(comma-separated; the project's gin_configs/ is always searched).

For every batch the same inputs are decoded by the baseline and by
speculative decoding, both compiled, timed side by side (the order alternates
between batches). Outputs in EVAL_OUTPUT_DIR:
  examples.jsonl   one record per example, appended as batches finish;
  summary.json     walltime speedup, alpha, mean accepted length, target calls
                   per token, metrics of both outputs, differing examples
                   (greedy) split into rounding near-ties and real mismatches
                   (diagnostics.py);
  summary.md       the same as one markdown table row (with its header);
  config.gin       the operative gin config;
  run.json         the run's settings (a rerun with the same settings resumes).
A failure mid-run keeps every finished batch and writes the summary of what
finished, marked with the error. A greedy row that differs from the baseline
is diagnosed (`diagnostics.diagnose`: teacher-forced float32 logits at the
first difference): a numerical near-tie is counted and reported, a real
mismatch marks the summary failed and the job raises `MismatchError` (exit
status 1) after writing everything.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys
import time
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

GIN_DIR = pathlib.Path(__file__).resolve().parent.parent / 'gin_configs'


class MismatchError(RuntimeError):
  """Greedy speculative outputs differ from the baseline beyond rounding."""


def load_params(config, checkpoint: Optional[str], seed: int, what: str):
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from specdec_jax import network  # pylint: disable=g-import-not-at-top

  model = network.T5Model(config)
  if checkpoint is None:
    return model, model.init_params(jax.random.key(seed))
  if str(checkpoint).startswith('shipped:'):  # the package's own models
    from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
    checkpoint = shipped.resolve(str(checkpoint))
  path = pathlib.Path(str(checkpoint))
  if not str(checkpoint).startswith('gs://') and not path.exists():
    raise FileNotFoundError(f'{what} checkpoint not found: {checkpoint}')
  if path.is_dir() and (path / 'config.json').exists():
    params = checkpoints.load_hf_t5(path, config)
  else:
    params = checkpoints.load_t5x_params(checkpoint, config=config)
  return model, params


_NGRAM_PARAMS: Dict[Any, Any] = {}


def ngram_drafter_params(task, vocab_size: int, order: int,
                         max_examples: int = 20000):
  """n-gram drafter params from the task's train targets (cached per run)."""
  from specdec_jax import drafters  # pylint: disable=g-import-not-at-top

  key = (task.name, vocab_size, order, max_examples)
  if key not in _NGRAM_PARAMS:
    seqs = []
    for ex in task.get_dataset(split='train', shuffle=False).take(
        max_examples):
      seqs.append([int(t) for t in ex['targets'].numpy() if t != 0])
    _NGRAM_PARAMS[key] = drafters.ngram_params(seqs, vocab_size, order)
  return _NGRAM_PARAMS[key]


def make_drafter(kind, draft_config, draft_checkpoint, task, target_config,
                  seed):
  """Returns (drafter, params)."""
  from specdec_jax import drafters  # pylint: disable=g-import-not-at-top

  if kind == 't5':
    model, params = load_params(draft_config, draft_checkpoint, seed,
                                 'draft')
    return drafters.T5Drafter(model), params
  if kind in ('unigram', 'bigram'):
    order = 1 if kind == 'unigram' else 2
    return (drafters.NgramDrafter(target_config.vocab_size, order),
            ngram_drafter_params(task, target_config.vocab_size, order))
  raise ValueError(f"drafter must be 't5', 'unigram' or 'bigram', got {kind!r}")


def task_examples(task, split, lengths, num_examples, truncate_inputs):
  """Yields (index, inputs ids, input text, target text) of the split."""
  ds = task.get_dataset(sequence_length=None, split=split, shuffle=False,
                        trim_output_features=False)
  max_in = lengths['inputs']
  for i, ex in enumerate(ds.as_numpy_iterator()):
    if num_examples is not None and i >= num_examples:
      return
    ids = [int(t) for t in ex['inputs']]
    if len(ids) > max_in:
      if not truncate_inputs:
        raise ValueError(
            f'Example {i} of {task.name}/{split} has {len(ids)} input tokens, '
            f"more than TASK_FEATURE_LENGTHS['inputs'] = {max_in}. Raise the "
            'length or set evaluate.truncate_inputs = True.')
      ids = ids[:max_in - 1] + [ids[-1]]
    text = lambda key: ex.get(key, b'').decode('utf-8') if isinstance(
        ex.get(key, b''), bytes) else str(ex.get(key, ''))
    yield i, ids, text('inputs_pretokenized'), text('targets_pretokenized')


def _decode_text(vocab, tokens, length, eos_id=1):
  ids = [int(t) for t in tokens[:length] if int(t) != eos_id]
  return vocab.decode(ids)


def _metrics(task, targets, predictions) -> Dict[str, float]:
  out = {}
  for fn in task.predict_metric_fns:
    for k, v in fn(targets, predictions).items():
      out[k] = float(getattr(v, 'value', v))
  return out


def _summary(records, settings) -> Dict[str, Any]:
  if not records:
    return {'examples': 0}
  sum_ = lambda k: float(sum(r[k] for r in records))
  batch_times = {}
  for r in records:
    batch_times[r['batch']] = (r['baseline_batch_s'], r['speculative_batch_s'])
  base_s = sum(b for b, _ in batch_times.values())
  spec_s = sum(s for _, s in batch_times.values())
  tokens = sum_('speculative_length')
  summary = {
      'examples': len(records),
      'batches': len(batch_times),
      'baseline_s': base_s,
      'speculative_s': spec_s,
      'walltime_speedup': base_s / spec_s if spec_s else None,
      'alpha': sum_('beta_sum') / max(sum_('beta_count'), 1.0),
      'acceptance_rate': sum_('accepted') / max(sum_('drafted'), 1.0),
      'mean_accepted_length': 1.0 + sum_('accepted') / max(
          sum_('iterations'), 1.0),
      'target_calls_per_token': sum_('iterations') / max(tokens, 1.0),
      'baseline_tokens': sum_('baseline_length'),
      'speculative_tokens': tokens,
      # Sampled outputs differ in length between the two decoders; tokens/s
      # compares them fairly (for greedy it equals walltime_speedup).
      'baseline_tokens_per_s': sum_('baseline_length') / base_s
                               if base_s else None,
      'speculative_tokens_per_s': tokens / spec_s if spec_s else None,
      'throughput_speedup': (tokens / spec_s) / (sum_('baseline_length') /
                                                 base_s)
                            if spec_s and base_s and sum_('baseline_length')
                            else None,
      # Only greedy outputs must be identical; sampled ones match in law.
      'differing_examples': int(sum(not r['identical'] for r in records))
                            if settings['temperature'] == 0 else None,
  }
  if settings['temperature'] == 0:
    kinds = [(r.get('divergence') or {}).get('kind') for r in records
             if not r['identical']]
    summary['near_ties'] = kinds.count('near_tie')
    summary['mismatches'] = kinds.count('mismatch')
    # Rows from a run before diagnostics existed.
    summary['undiagnosed'] = kinds.count(None)
  summary.update(settings)
  return summary


def _markdown(summary, base_metrics, spec_metrics) -> str:
  cols = ['task', 'drafter', 'temperature', 'gamma', 'examples', 'alpha',
          'walltime_speedup', 'mean_accepted_length', 'target_calls_per_token',
          'differing_examples', 'near_ties', 'mismatches']
  cells = []
  for c in cols:
    v = summary.get(c)
    cells.append(f'{v:.3f}' if isinstance(v, float) else str(v))
  metric_names = sorted(base_metrics)
  header = cols + [f'baseline {m}' for m in metric_names] + [
      f'speculative {m}' for m in metric_names]
  cells += [f'{base_metrics[m]:.2f}' for m in metric_names]
  cells += [f'{spec_metrics.get(m, float("nan")):.2f}' for m in metric_names]
  return ('| ' + ' | '.join(header) + ' |\n|' + '---|' * len(header) +
          '\n| ' + ' | '.join(cells) + ' |\n')


def evaluate(
    *,
    target_config,
    target_checkpoint: Optional[str],
    draft_config=None,
    draft_checkpoint: Optional[str] = None,
    drafter: str = 't5',
    mixture_or_task_name: str,
    task_feature_lengths: Mapping[str, int],
    split: str = 'validation',
    gamma: int,
    temperature: float = 0.0,
    topk: int = 0,
    topp: float = 1.0,
    batch_size: int = 1,
    num_examples: Optional[int] = None,
    output_dir: str,
    seed: int = 0,
    truncate_inputs: bool = False,
    eos_id: int = 1,
    data_dir: Optional[str] = None,
    target_widen_to: Optional[Any] = None,
    timing_repeats: int = 1,
    activation_dtype: Optional[str] = None,
    same_shape_baseline: bool = False,
    config_str: str = '',
    dry_run: bool = False,
) -> Dict[str, Any]:
  """Runs baseline and speculative decoding on a task; writes the results.

  Args:
    target_config: `network.T5Config` of the target.
    target_checkpoint: T5X checkpoint path, HF T5 folder, or None (random).
    draft_config: `T5Config` of the drafter (drafter='t5').
    draft_checkpoint: as target_checkpoint, for the drafter.
    drafter: 't5', 'unigram' or 'bigram' (n-grams from the task's train
      targets).
    mixture_or_task_name: a registered seqio task (see tasks.py).
    task_feature_lengths: {'inputs': N, 'targets': M}; M is the output length.
    split: the split to decode.
    gamma: drafts per iteration.
    temperature: 0 for greedy.
    topk: 0 = off.
    topp: 1.0 = off.
    batch_size: examples per decode call.
    num_examples: first N examples of the split (None = all).
    output_dir: where results go; a rerun with the same settings resumes.
    seed: PRNG seed (random weights and sampling).
    truncate_inputs: cut inputs longer than allowed instead of failing.
    eos_id: end-of-sequence id.
    data_dir: data folder of the offline Debian tasks (default:
      $SPECDEC_DATA_DIR or ~/.cache/specdec_jax/debian).
    target_widen_to: None, or a `widening.PRESETS` name (e.g.
      't5_1_1_base_cost') or a dict of dimensions: the loaded target is
      widened function-preservingly to that size before decoding (same
      outputs and alpha, the cost of the bigger model; see widening.py).
    timing_repeats: each batch is decoded this many times by each method
      (alternating) and the median time is reported.
    activation_dtype: None (activations in the target config's dtype, as in
      T5X) or e.g. 'float32': the target (used by both decoders) runs its
      weights, rounded to its dtype, with activations in this dtype
      (`network.T5Config.activation_dtype`).
    same_shape_baseline: the baseline computes each step with the shapes of
      the speculative verification (`decoding.temperature_sample`
      block_size=gamma+1): the same kernels, so greedy outputs can be equal
      bit for bit in bfloat16 too; the baseline then pays cost(gamma+1) per
      token instead of cost(1).
    config_str: the gin config to save as config.gin.
    dry_run: only validate and return the resolved arguments (--dry_run).

  Returns:
    The summary dict (also written to summary.json).
  """
  if dry_run:
    return {k: v for k, v in locals().items() if k != 'dry_run'}
  import jax  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax import diagnostics  # pylint: disable=g-import-not-at-top
  from specdec_jax import speculative  # pylint: disable=g-import-not-at-top
  from specdec_jax import tasks  # pylint: disable=g-import-not-at-top
  from specdec_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top

  # Everything that can be checked cheaply is checked before any work.
  sampling = SamplingConfig(temperature, topk, topp)
  if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
    raise ValueError(f'gamma must be an int >= 1, got {gamma!r}.')
  if not isinstance(timing_repeats, int) or timing_repeats < 1:
    raise ValueError(
        f'timing_repeats must be an int >= 1, got {timing_repeats!r}.')
  if activation_dtype is not None:
    try:
      name = jax.numpy.dtype(activation_dtype).name
    except TypeError:
      name = None
    if name not in ('bfloat16', 'float16', 'float32'):
      raise ValueError('activation_dtype must be None, bfloat16, float16 or '
                       f'float32, got {activation_dtype!r}.')
    activation_dtype = name
    target_config = target_config.replace(activation_dtype=activation_dtype)
  if target_widen_to is not None:
    from specdec_jax import widening  # pylint: disable=g-import-not-at-top
    widened_config = (
        widening.preset_config(target_config, target_widen_to)
        if isinstance(target_widen_to, str) else
        target_config.replace(**dict(target_widen_to)))
    widening.check_growth(target_config, widened_config)
  if set(task_feature_lengths) < {'inputs', 'targets'}:
    raise ValueError('TASK_FEATURE_LENGTHS needs "inputs" and "targets", got '
                     f'{dict(task_feature_lengths)}.')
  if drafter == 't5' and draft_config is None:
    raise ValueError("drafter='t5' needs DRAFT_MODEL (a T5Config).")
  if drafter == 't5' and draft_config.vocab_size != target_config.vocab_size:
    raise ValueError(
        f'Draft and target vocabularies differ: DRAFT_MODEL has vocab_size '
        f'{draft_config.vocab_size}, TARGET_MODEL {target_config.vocab_size}.')
  if data_dir is not None:
    tasks.register_tasks(data_dir=data_dir)
  task = tasks.get_task(mixture_or_task_name)
  vocab = task.output_features['targets'].vocabulary
  if vocab.vocab_size > target_config.vocab_size:
    raise ValueError(
        f'Task {mixture_or_task_name} uses a vocabulary of {vocab.vocab_size} '
        f'tokens but TARGET_MODEL has vocab_size {target_config.vocab_size}.')

  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  settings = dict(
      task=mixture_or_task_name, split=split, drafter=drafter,
      gamma=gamma, temperature=float(temperature), topk=topk, topp=float(topp),
      batch_size=batch_size, num_examples=num_examples, seed=seed,
      target_checkpoint=str(target_checkpoint),
      draft_checkpoint=str(draft_checkpoint),
      target_widen_to=(target_widen_to if target_widen_to is None or
                       isinstance(target_widen_to, str)
                       else dict(target_widen_to)),
      task_feature_lengths=dict(task_feature_lengths))
  # Only when set, so that runs from before these options still resume.
  if activation_dtype is not None:
    settings['activation_dtype'] = activation_dtype
  if same_shape_baseline:
    settings['same_shape_baseline'] = True
  run_file = out / 'run.json'
  if run_file.exists():  # resume; asking for more examples is fine
    previous = json.loads(run_file.read_text())
    now = json.loads(json.dumps(settings))
    previous.pop('num_examples', None)
    now.pop('num_examples', None)
    if previous != now:
      raise ValueError(
          f'{out} holds a run with other settings ({run_file}); use another '
          'EVAL_OUTPUT_DIR or delete it.')
  run_file.write_text(json.dumps(settings, indent=1))
  if config_str:
    (out / 'config.gin').write_text(config_str)
  records_path = out / 'examples.jsonl'
  records = []
  if records_path.exists():
    records = [json.loads(l) for l in records_path.read_text().splitlines()
               if l.strip()]
  done = {r['index'] for r in records}

  target, target_params = load_params(target_config, target_checkpoint, seed,
                                       'target')
  if target_widen_to is not None:
    from specdec_jax import network  # pylint: disable=g-import-not-at-top
    target_params = widening.widen(target_params, target_config,
                                   widened_config)
    target = network.T5Model(widened_config)
  draft, draft_params = make_drafter(drafter, draft_config, draft_checkpoint,
                                      task, target_config, seed + 1)
  max_in = task_feature_lengths['inputs']
  max_out = task_feature_lengths['targets']

  def run_both(inputs, rng, baseline_first, repeats=timing_repeats):
    calls = {
        'baseline': lambda: decoding.temperature_sample(
            target, target_params, inputs, max_decode_len=max_out,
            sampling=sampling, eos_id=eos_id, rng=rng,
            block_size=gamma + 1 if same_shape_baseline else 1),
        'speculative': lambda: speculative.speculative_sample(
            target, target_params, draft, draft_params, inputs, gamma=gamma,
            max_decode_len=max_out, sampling=sampling, eos_id=eos_id,
            rng=rng),
    }
    order = ['baseline', 'speculative'] if baseline_first else [
        'speculative', 'baseline']
    results, times = {}, {name: [] for name in order}
    for _ in range(repeats):
      for name in order:
        start = time.perf_counter()
        results[name] = jax.block_until_ready(calls[name]())
        times[name].append(time.perf_counter() - start)
      order = order[::-1]
    return results, {k: float(np.median(v)) for k, v in times.items()}

  error = None
  batches = []
  batch = []
  for item in task_examples(task, split, task_feature_lengths, num_examples,
                        truncate_inputs):
    batch.append(item)
    if len(batch) == batch_size:
      batches.append(batch)
      batch = []
  if batch:
    batches.append(batch)
  warm = False
  try:
    with records_path.open('a') as sink:
      for b, batch in enumerate(tqdm(batches, desc='eval', unit='batch')):
        if all(i in done for i, *_ in batch):
          continue
        inputs = np.zeros((batch_size, max_in), np.int32)
        for row, (_, ids, _, _) in enumerate(batch):
          inputs[row, :len(ids)] = ids
        for row in range(len(batch), batch_size):  # pad the last batch
          inputs[row] = inputs[0]
        rng = jax.random.fold_in(jax.random.key(seed), b)
        if not warm:  # compile both outside the timings
          run_both(inputs, rng, True, 1)
          warm = True
        res, times = run_both(inputs, rng, b % 2 == 0)
        base, spec = res['baseline'], res['speculative']
        st = spec.stats
        divergences = {}
        if sampling.greedy:  # why a greedy row differs: rounding or a bug
          n = len(batch)
          divergences = {d.row: d.to_dict() for d in diagnostics.diagnose(
              target, target_params, inputs[:n], np.asarray(base.tokens)[:n],
              np.asarray(spec.tokens)[:n])}
        for row, (i, ids, in_text, tgt_text) in enumerate(batch):
          b_len, s_len = int(base.lengths[row]), int(spec.lengths[row])
          rec = dict(
              index=i, batch=b, input=in_text, target=tgt_text,
              baseline=_decode_text(vocab, base.tokens[row], b_len, eos_id),
              speculative=_decode_text(vocab, spec.tokens[row], s_len,
                                       eos_id),
              baseline_length=b_len, speculative_length=s_len,
              identical=bool(np.array_equal(base.tokens[row],
                                            spec.tokens[row])),
              iterations=int(st.row_iterations[row]),
              drafted=int(st.drafted[row]), accepted=int(st.accepted[row]),
              beta_sum=float(st.beta_sum[row]),
              beta_count=int(st.beta_count[row]),
              baseline_batch_s=times['baseline'],
              speculative_batch_s=times['speculative'],
              divergence=divergences.get(row))
          sink.write(json.dumps(rec) + '\n')
          records.append(rec)
        sink.flush()
  except Exception as e:  # keep what finished, then re-raise
    error = e
    raise
  finally:
    records.sort(key=lambda r: r['index'])
    summary = _summary(records, settings)
    base_m = spec_m = {}
    if records:
      targets = [r['target'] for r in records]
      base_m = _metrics(task, targets, [r['baseline'] for r in records])
      spec_m = _metrics(task, targets, [r['speculative'] for r in records])
    summary['baseline_metrics'] = base_m
    summary['speculative_metrics'] = spec_m
    summary['status'] = 'complete' if error is None else (
        f'failed after {len(records)} examples: {error!r}')
    if error is None and summary.get('mismatches'):
      summary['status'] = (
          f"failed: {summary['mismatches']} of "
          f"{summary['differing_examples']} differing greedy rows differ "
          'beyond rounding (real mismatches; see "divergence" in '
          'examples.jsonl)')
    (out / 'summary.json').write_text(json.dumps(summary, indent=1))
    (out / 'summary.md').write_text(_markdown(summary, base_m, spec_m))
  if summary.get('mismatches'):
    raise MismatchError(summary['status'])
  return summary


# ---------------------------------------------------------------------------
# Entry point: flags and gin, T5X style.
# ---------------------------------------------------------------------------


def rewrite_gin_args(argv: Sequence[str]) -> list:
  """`--gin.NAME=VALUE` -> `--gin_bindings=NAME = VALUE` (as T5X does)."""
  out = []
  for arg in argv:
    if arg.startswith('--gin.'):
      if '=' not in arg:
        raise ValueError(
            f"Gin bindings must look like '--gin.NAME=VALUE', got {arg!r}.")
      name, value = arg[len('--gin.'):].split('=', 1)
      arg = f'--gin_bindings={name} = {value}'
    out.append(arg)
  return out


def parse_flags(argv: Sequence[str]):
  parser = argparse.ArgumentParser(
      prog='python -m specdec_jax.eval', description=__doc__.splitlines()[0])
  parser.add_argument('--gin_file', action='append', default=[])
  parser.add_argument('--gin_bindings', action='append', default=[])
  parser.add_argument('--gin_search_paths', default='')
  parser.add_argument('--dry_run', action='store_true',
                      help='print the resolved arguments and exit')
  return parser.parse_args(rewrite_gin_args(argv))


def configure(args, fn, example_gin_file: str):
  """Parses `args.gin_file`/`gin_bindings` (T5X style); returns fn with them.

  Args:
    args: flags from `parse_flags` (or anything with gin_file, gin_bindings,
      gin_search_paths).
    fn: the function the gin files configure (dynamic registration).
    example_gin_file: named in the error when no --gin_file is given.

  Returns:
    `gin.get_configurable(fn)`.
  """
  import gin  # pylint: disable=g-import-not-at-top

  if not args.gin_file:
    raise SystemExit('error: at least one --gin_file is required, e.g. '
                     f'--gin_file={example_gin_file}')
  gin.clear_config(clear_constants=True)
  for path in [p for p in args.gin_search_paths.split(',') if p] + [
      str(GIN_DIR), str(GIN_DIR.parent)]:
    gin.add_config_file_search_path(path)
  # gin logs an ERROR for every search-path miss before it finds an include;
  # only its exceptions matter here.
  root = logging.getLogger()
  level = root.level
  root.setLevel(logging.CRITICAL)
  try:
    gin.parse_config_files_and_bindings(args.gin_file, args.gin_bindings)
    return gin.get_configurable(fn)
  except Exception as e:  # gin's messages name the file and the binding
    raise SystemExit(f'gin configuration error: {e}') from None
  finally:
    root.setLevel(level)


def configured_evaluate(argv: Sequence[str]):
  """Parses T5X-style flags and gin files; returns (flags, configured fn)."""
  # The module gin files import (`from specdec_jax import eval`); under
  # `python -m` this file is __main__, a different module object.
  from specdec_jax import eval as eval_lib  # pylint: disable=g-import-not-at-top

  args = parse_flags(argv)
  return args, configure(args, eval_lib.evaluate,
                         'gin_configs/paper/ende_t0_small.gin')


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """Parses T5X-style flags and gin files, then runs `evaluate`."""
  import gin  # pylint: disable=g-import-not-at-top

  args, run = configured_evaluate(sys.argv[1:] if argv is None else argv)
  if args.dry_run:
    resolved = run(dry_run=True)
    for key, value in resolved.items():
      print(f'{key} = {value!r}')
    return resolved
  return run(config_str=gin.config_str())


if __name__ == '__main__':
  main()
