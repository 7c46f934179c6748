"""Drafting without a draft model: lookup, the output cache, combined
drafters and adaptive draft lengths vs a T5 drafter, on any target.

  python scripts/benchmark_draft_free.py --out_dir results/draft_free
  python scripts/benchmark_draft_free.py --target ~/t5/checkpoint_1000 \
    --target_config t5_1_1_small --draft ~/t5_dec2/checkpoint_500 \
    --draft_config 't5_1_1_small,num_decoder_layers=2' --arrays ~/arrays \
    --workloads my_task,stream --stream_task my_task --out_dir /tmp/df

--target / --draft are `shipped:<name>` or T5X checkpoints with
--target_config / --draft_config (`bench.models.config` specs); a
checkpoint target needs --arrays: rows from <arrays>/<task>/test.npz (the
`specdec_jax.arrays` format), else the shipped test slices; 'dec2' and
'dec2_adaptive' in --drafters are --draft (the shipped dec2 by default) in
the T5 drafter. Batch 1, one request after another as a service sees
them, for each workload:

- a task (en_de, synopsis, ...): its first --num_examples test rows. The
  output cache starts with the target's own greedy outputs for other rows
  (--seed_from.., never the evaluated ones).
- stream (the agentic workload): --stream_length requests of --stream_task
  with repeats and near-repeats (`make_stream`); the cache starts EMPTY and
  every finished output is appended, as the eval job does.

Each request is decoded by the baseline and speculatively, compiled, timed
side by side (`measure.time_alternating`, median of --repeats); greedy
outputs must be identical. Reported: alpha, mean accepted length, target
calls per token, draft-model calls per token (counted in an untimed pass
with a counting model), measured CPU speed-up, and "predicted <profile>":
`bench.hardware.predict` on --profile from the counters, tokens per target
call / (cost(gamma + 1) + draft-model calls per target call x c), c the
profile's measured c of --draft_as (0 without draft-model calls); copying
is taken as free (its CPU cost is measured below the tables).
`--repredict OUT/draft_free.json` recomputes that column (nothing
measured) and rewrites the .json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import output_cache
from specdec_jax import spec_stats
from specdec_jax import speculative
from specdec_jax.bench import flags
from specdec_jax.bench import hardware
from specdec_jax.bench import models
from specdec_jax.bench import report
from specdec_jax.sampling import SamplingConfig

SCRIPT = 'scripts/benchmark_draft_free.py'
EOS = 1
DRAFTERS = ('dec2', 'lookup', 'cache', 'combined', 'dec2_adaptive',
            'combined_adaptive')

CALLS = []


@dataclasses.dataclass(frozen=True)
class CountingT5(network.T5Model):
  """A T5Model that counts its decoder calls (host callback; untimed runs)."""

  def extend(self, params, tokens, cache):
    jax.debug.callback(lambda: CALLS.append(1))
    return super().extend(params, tokens, cache)


def make_stream(inputs, n_rows: int, length: int, vocab: int, seed: int = 0,
                p_repeat: float = 0.3, p_near: float = 0.3):
  """An agentic request stream: `(inputs [length, input_length], kinds)`.

  Each request is, with these probabilities once one has been sent: an
  exact 'repeat' of an earlier request; a 'near' repeat (an earlier request
  with one input token, not its EOS, replaced by a random one); else a
  'new' row of `inputs[:n_rows]` never sent before.
  """
  rng = np.random.default_rng(seed)
  unused = [int(r) for r in rng.permutation(n_rows)]
  sent, kinds = [], []
  for _ in range(length):
    u = rng.random()
    if sent and u < p_repeat + p_near:
      x = sent[int(rng.integers(len(sent)))].copy()
      kind = 'repeat'
      if u >= p_repeat:
        kind = 'near'
        n = int(np.sum(x > 0))
        x[int(rng.integers(max(n - 1, 1)))] = int(rng.integers(3, vocab))
    else:
      x, kind = inputs[unused.pop()].copy(), 'new'
    sent.append(x)
    kinds.append(kind)
  return np.stack(sent), kinds


def build(name, vocab, target, target_params, dec2, dec2_params, store,
          gamma_conf, counting=False):
  """(drafter, params) of a benchmark drafter name: the registered kind
  ('t5', 'lookup', 'cache', 'combined') as the eval job builds it, with the
  draft model optionally counting its calls."""
  kind = name.replace('dec2', 't5').replace('_adaptive', '')
  if kind not in ('t5', 'lookup', 'cache', 'combined'):
    raise ValueError(f'unknown drafter {name!r}; known: {DRAFTERS}')
  source = drafters.DraftSource(
      vocab_size=vocab, draft_model=CountingT5(dec2.config) if counting
      else dec2, draft_params=dec2_params, target_model=target,
      target_params=target_params, output_cache=store,
      output_length=store.output_length,
      confidence=gamma_conf if name.endswith('_adaptive') else 0.0)
  return drafters.get_kind(kind).build(source)


def run_workload(args, name, inputs, seed_inputs, target, target_params, dec2,
                 dec2_params, temperature, max_len, kinds=None):
  """Rows of one workload and temperature, one per drafter."""
  sampling = SamplingConfig(temperature=temperature)
  vocab = target.vocab_size
  rows = []
  base_fn = lambda x, rng: decoding.temperature_sample(
      target, target_params, x, max_decode_len=max_len, sampling=sampling,
      eos_id=EOS, rng=rng)
  for dname in args.drafters.split(','):
    uses_cache = dname in ('cache', 'combined', 'combined_adaptive')
    record = dict(workload=name, temperature=temperature, drafter=dname,
                  gamma=args.gamma, requests=len(inputs))
    counts = {}
    for counting in ((False, True) if dname != 'lookup' and dname != 'cache'
                     else (False,)):
      store = output_cache.OutputCache.for_model(target, target_params,
                                                 max_len)
      if seed_inputs is not None and uses_cache:
        seed_out = base_fn(seed_inputs, jax.random.key(0))
        store.add_requests(target, target_params, seed_inputs,
                           [np.asarray(t)[:int(n)] for t, n in zip(
                               seed_out.tokens, seed_out.lengths)])
      drafter, dparams = build(dname, vocab, target, target_params, dec2,
                               dec2_params, store, args.confidence, counting)
      tot = dict(iterations=0, drafted=0, accepted=0, beta_sum=0.0,
                 beta_count=0, tokens=0, base_tokens=0, base_s=0.0,
                 spec_s=0.0, identical=0, model_calls=0)
      windows = []
      warm_shape = None
      for i, x in enumerate(inputs):
        x = jnp.asarray(x[None])
        rng = jax.random.key(1000 + i)
        calls = {
            'baseline': lambda: base_fn(x, rng),
            'speculative': lambda: speculative.speculative_sample(
                target, target_params, drafter, dparams, x, gamma=args.gamma,
                max_decode_len=max_len, sampling=sampling, eos_id=EOS,
                rng=rng)}
        if counting:
          del CALLS[:]
          spec = calls['speculative']()
          jax.effects_barrier()
          tot['model_calls'] += len(CALLS)
        else:
          shape = jax.tree_util.tree_map(np.shape, dparams)
          if shape != warm_shape:
            measure.time_alternating(calls)  # compile outside the timings
            warm_shape = shape
          res, times = measure.time_alternating(calls, args.repeats,
                                                reverse=i % 2 == 1)
          base, spec = res['baseline'], res['speculative']
          st = spec.stats
          n = int(spec.lengths[0])
          tot['iterations'] += int(st.row_iterations[0])
          tot['drafted'] += int(st.drafted[0])
          tot['accepted'] += int(st.accepted[0])
          tot['beta_sum'] += float(st.beta_sum[0])
          tot['beta_count'] += int(st.beta_count[0])
          tot['tokens'] += n
          tot['base_tokens'] += int(base.lengths[0])
          tot['base_s'] += times['baseline']
          tot['spec_s'] += times['speculative']
          tot['identical'] += int(np.array_equal(base.tokens, spec.tokens))
          windows.append(dict(cache_entries=len(store), tokens=n,
                              kind=kinds[i] if kinds else 'row',
                              iterations=int(st.row_iterations[0]),
                              beta_sum=float(st.beta_sum[0]),
                              beta_count=int(st.beta_count[0]),
                              accepted=int(st.accepted[0])))
        if uses_cache:
          store.add_requests(target, target_params, np.asarray(x),
                             [np.asarray(spec.tokens[0])[
                                 :int(spec.lengths[0])]])
          dparams = drafter.with_store(dparams, store)
      if counting:
        counts['model_calls'] = tot['model_calls']
      else:
        record.update(tot)
        record['windows'] = windows
    if dname.startswith('dec2') or dname.startswith('combined'):
      record['model_calls'] = counts.get('model_calls')
    else:
      record['model_calls'] = 0
    r = spec_stats.rates(record['iterations'], record['drafted'],
                         record['accepted'], record['beta_sum'],
                         record['beta_count'], record['tokens'])
    record.update(r)
    record['model_calls_per_token'] = record['model_calls'] / max(
        record['tokens'], 1)
    record['measured_speedup'] = ((record['tokens'] / record['spec_s']) /
                                  (record['base_tokens'] / record['base_s']))
    predict_row(record, args.profile_obj, args.draft_as)
    print(json.dumps({k: v for k, v in record.items()
                      if k not in ('windows', 'predicted')}), flush=True)
    rows.append(record)
  return rows


def predict_row(row, profile, draft_as):
  """The row's predicted column from its counters (batch 1)."""
  row.pop('predicted_h100', None)
  iters, calls = max(row['iterations'], 1), row['model_calls'] or 0
  row['predicted'] = hardware.predict(
      profile, tokens_per_call=row['tokens'] / iters, gamma=row['gamma'],
      drafter_calls_per_call=calls / iters,
      drafter=draft_as if calls else None).to_json()
  return row


def repredict(result, profile, command=None):
  for row in result['rows']:
    predict_row(row, profile, result.get('draft_as', 'dec2'))
  result['profile'] = profile.name
  if command:
    result['predicted_by'] = command
  return result


def copy_costs(target, target_params, inputs, max_len, gamma):
  """CPU seconds: a target 1-token call, the cache drafter's retrieval (per
  request) and its drafting (per drafted token) at 10k entries."""
  vocab = target.vocab_size
  x = jnp.asarray(inputs[:1])
  t1 = measure.call_time(target, target_params, x, 1, repeats=5)
  store = output_cache.OutputCache.for_model(target, target_params, max_len)
  rng = np.random.default_rng(0)
  keys = rng.normal(size=(10240, store.dim)).astype(np.float32)
  keys /= np.linalg.norm(keys, axis=1, keepdims=True)
  store.add(keys, [list(rng.integers(2, vocab, max_len - 1)) + [EOS]
                   for _ in range(10240)])
  cache_drafter = drafters.CacheDrafter(vocab, eos_id=EOS, embedder=target)
  params = dict({'embedder': target_params}, **store.device_params())
  init = jax.jit(lambda p, x: cache_drafter.init(p, x, max_len + gamma + 1))
  retrieval = measure.median_time(lambda: init(params, x), 5)
  per_token = measure.drafter_token_time(cache_drafter, params, x,
                                         gamma=gamma)
  lookup_token = measure.drafter_token_time(
      drafters.LookupDrafter(vocab, eos_id=EOS), (), x, gamma=gamma)
  return dict(target_step_s=t1, cache_entries=10240,
              cache_bytes=store.nbytes(10240),
              retrieval_s=retrieval, cache_draft_token_s=per_token,
              lookup_draft_token_s=lookup_token)


def markdown(result) -> str:
  rows, costs = result['rows'], result['costs']
  profile = hardware.load(result['profile'])
  name, draft_as = profile.name, result.get('draft_as', 'dec2')
  lines = ['# Drafting without a draft model, '
           f"{result.get('target', 'shipped:target')}, batch 1", '',
           report.header_md(result)]
  if result.get('predicted_by'):
    lines += ['Predicted column recomputed from the measured values by '
              f"`{result['predicted_by']}`.", '']
  lines += [
      'measured = speculative tokens/s over baseline tokens/s on this CPU, '
      f'same requests, side by side. "predicted {name}" is PREDICTED, not '
      f'measured: predicted on profile {name} (specdec_jax/bench/profiles, '
      f'read from {profile.source}; target {profile.target}) through '
      "bench.hardware.predict from this run's counters: tokens per target "
      'call / (cost(gamma + 1) + draft-model calls per target call x c), '
      f"with the profile's measured cost(k) and its measured c of {draft_as}"
      ' for the draft model; no draft-model call: c = 0 (copying taken as '
      'free; its CPU cost is below).', '', report.table(
          ['workload', 'temp', 'drafter', 'requests', 'alpha',
           'mean accepted length', 'target calls / token',
           'draft-model calls / token', 'identical', 'measured (CPU)',
           f'predicted {name}'],
          [[r['workload'], f"{r['temperature']:g}", r['drafter'],
            r['requests'], f"{r['alpha']:.3f}",
            f"{r['mean_accepted_length']:.2f}",
            f"{r['target_calls_per_token']:.3f}",
            f"{r['model_calls_per_token']:.3f}",
            f"{r['identical']}/{r['requests']}" if r['temperature'] == 0
            else 'n/a', f"{r['measured_speedup']:.2f}x",
            f"**{r['predicted']['speedup']:.2f}x**"] for r in rows])]
  lines += ['', '## Alpha as the stream goes on (the cache grows)', '',
            '| temp | drafter | requests | cache entries at start | alpha | '
            'tokens per iteration |', '|---|---|---|---|---|---|']
  for r in rows:
    if r['workload'] != 'stream' or not r['drafter'].startswith(
        ('cache', 'combined')):
      continue
    w = r['windows']
    q = max(len(w) // 4, 1)
    for s in range(0, len(w), q):
      part = w[s:s + q]
      a = sum(x['beta_sum'] for x in part) / max(
          sum(x['beta_count'] for x in part), 1)
      tpi = sum(x['tokens'] for x in part) / max(
          sum(x['iterations'] for x in part), 1)
      lines.append(f'| {r["temperature"]:g} | {r["drafter"]} | '
                   f'{s + 1}-{s + len(part)} | {part[0]["cache_entries"]} | '
                   f'{a:.3f} | {tpi:.2f} |')
  lines += ['', '## The stream by kind of request (alpha, tokens per '
            'iteration)', '', '| temp | drafter | new | repeat | near |',
            '|---|---|---|---|---|']
  for r in rows:
    if r['workload'] != 'stream':
      continue
    cells = []
    for kind in ('new', 'repeat', 'near'):
      part = [x for x in r['windows'] if x['kind'] == kind]
      a = sum(x['beta_sum'] for x in part) / max(
          sum(x['beta_count'] for x in part), 1)
      tpi = sum(x['tokens'] for x in part) / max(
          sum(x['iterations'] for x in part), 1)
      cells.append(f'{a:.2f} / {tpi:.2f} ({len(part)})')
    lines.append(f'| {r["temperature"]:g} | {r["drafter"]} | ' +
                 ' | '.join(cells) + ' |')
  if costs:
    lines += ['', '## What copying costs on this CPU', '',
              f'- target step t(1): {costs["target_step_s"] * 1e3:.3f} ms',
              f'- output cache of {costs["cache_entries"]} entries: '
              f'{costs["cache_bytes"] / 2**20:.1f} MiB on device; retrieval '
              f'(encode the request, top-k) {costs["retrieval_s"] * 1e3:.2f}'
              ' ms per request',
              f'- drafting per token: cache (10k entries, 4 neighbours) '
              f'{costs["cache_draft_token_s"] * 1e3:.3f} ms, lookup '
              f'{costs["lookup_draft_token_s"] * 1e3:.3f} ms, i.e. c = '
              f'{costs["cache_draft_token_s"] / costs["target_step_s"]:.3f}'
              f' / {costs["lookup_draft_token_s"] / costs["target_step_s"]:.3f}'
              ' against this small target']
  return '\n'.join(lines) + '\n'


def parse_flags(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  flags.add_model_flags(p, target='shipped:target', draft='shipped:dec2')
  p.add_argument('--draft_as', default='dec2',
                 help="the profile's drafter whose measured c is --draft's")
  p.add_argument('--workloads', default='synopsis,en_de,stream')
  p.add_argument('--stream_task', default='synopsis')
  p.add_argument('--drafters', default=','.join(DRAFTERS))
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--gamma', type=int, default=6)
  p.add_argument('--confidence', type=float, default=0.5)
  p.add_argument('--num_examples', type=int, default=24)
  p.add_argument('--seed_from', type=int, default=64)
  p.add_argument('--stream_length', type=int, default=64)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--out_dir', default='results/draft_free')
  flags.add_prediction_flags(p)
  args = p.parse_args(argv)
  if not args.repredict:
    flags.check_model_flags(p, args, 'target', 'draft')
  return args




def main(argv=None):
  args = parse_flags(argv)
  args.profile_obj = profile = flags.profile_of(args)
  if args.repredict:
    path = pathlib.Path(args.repredict)
    result = report.read_json(path)
    if 'date' not in result and path.with_suffix('.md').is_file():
      dates = re.findall(r'^Date: (\S+)', path.with_suffix('.md').read_text(),
                         re.M)
      result['date'] = dates[0] if dates else 'not recorded'
    repredict(result, profile, report.portable(' '.join(
        ['python', SCRIPT] + list(sys.argv[1:] if argv is None else argv))))
    report.write_json(path, result)
    report.write_md(path.with_suffix('.md'), markdown(result))
    return result
  target, target_params = models.load(args.target, args.target_config)
  draft, draft_params = models.load(args.draft, args.draft_config)
  rows, costs = [], None
  for workload in args.workloads.split(','):
    task = args.stream_task if workload == 'stream' else workload
    data = flags.task_arrays(args.arrays, task, target.vocab_size)
    max_len, kinds = data['targets'].shape[1], None
    if workload == 'stream':
      inputs, kinds = make_stream(data['inputs'], args.seed_from,
                                  args.stream_length, target.vocab_size)
      seed = None
      print('stream:', {k: kinds.count(k) for k in ('new', 'repeat', 'near')})
    else:
      inputs = data['inputs'][:args.num_examples]
      seed = data['inputs'][args.seed_from:]
    for t in map(float, args.temperatures.split(',')):
      rows += run_workload(args, workload, inputs, seed, target,
                           target_params, draft, draft_params, t, max_len,
                           kinds)
    if costs is None:
      costs = copy_costs(target, target_params, data['inputs'], max_len,
                         args.gamma)
  result = dict(report.header(SCRIPT, argv),
                target=report.portable(args.target),
                target_config=report.config_dict(target.config),
                draft=report.portable(args.draft), draft_as=args.draft_as,
                arrays=args.arrays and report.portable(args.arrays),
                profile=profile.name, rows=rows, costs=costs)
  out = pathlib.Path(args.out_dir)
  report.write_json(out / 'draft_free.json', result)
  report.write_md(out / 'draft_free.md', markdown(result))
  print(markdown(result))
  return result


if __name__ == '__main__':
  main()
