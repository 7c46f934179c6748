"""Exactness at random points: what the suite checks at chosen ones.

  python tests/fuzz_exactness.py [--greedy 400] [--law 120] [--mesh 0]
      [--mesh_law 0] [--seed 0] [--out results/fuzz_exactness] [--kinds t5,tree] [--jobs 2]

Greedy cases. A random tiny T5 (1.1 or 1.0; vocabulary 12-301, widths,
1-3 layers a side; float32 or bfloat16; T5X's parameter layout or the fused
decoding one, `network.for_decoding`), random 0-padded inputs (a row may be
all padding), an output length and an EOS the target emits mid-row; a
random drafter kind of `drafters.KINDS`, built from a random source (the
target's weights plus noise of a random scale, or a smaller model of its
own; adaptive lengths; a random tree), a random gamma, loop (the drafter's
own or the ordinary one) and slot batch with random refill sizes. The
fixed and the streamed speculative decodes and the streamed baseline must
equal the fixed baseline token for token; in bfloat16 every differing row
must be a certified near tie (`diagnostics.diagnose`), else it is a
mismatch.

Law cases. A random one- or two-layer target over 6 tokens (its logits
scaled so that its law is not flat), a random kind, source, gamma, loop
and sampling setting (a temperature, and top-k or top-p or neither); the
speculative decode (fixed, or streamed through fewer slots) of 20,000
rows of one input. Its 3-token sequences must not include one the target
cannot emit, and their counts must fit the exact law (teacher-forced and
standardized independently, tests/reference.py) by a chi-square test at
p > 1e-5: with ~100 law cases a run, a false alarm once in ~1,000 runs.

Mesh cases (`mesh_case`). Greedy cases on a random ('data', 'model') mesh
of 2, 4 or 8 of the 8 simulated CPU devices this script asks XLA for: the
target sharded by T5X's rules, every drafter kind, the streams' default
refill sizes; float32 exact against the mesh's own baseline, which may
differ from one device's only by a certified near tie. Mesh law cases
(`--mesh_law`): a law case decoded on a random mesh (its rows over 'data',
a two-head target split over a 'model' axis of 1 or 2), tested against
one device's exact law.

Each case goes to <out>.jsonl as it ends (a rerun with the same --kinds
skips the seeds there: a seed's draw depends on the kinds it draws from;
`--jobs N`: N processes run cases at once);
<out>.json and <out>.md summarize the file. Exit status 1 if any case
failed. With the suite's XLA flags (tests/conftest.py), a case takes ~3-10
s of one core.
"""

import argparse
import collections
import contextlib
from concurrent import futures
import json
import multiprocessing
import os
import pathlib
import platform
import sys
import time
import traceback

if __name__ == '__main__':  # run as a program (imported: jax's devices)
  # 8 simulated CPU devices for the mesh cases (the others use the first);
  # --jobs' processes inherit it.
  os.environ['XLA_FLAGS'] = ' '.join(filter(None, [
      os.environ.get('XLA_FLAGS'),
      '--xla_force_host_platform_device_count=8']))
import conftest  # the suite's XLA flags, before jax starts its backend
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import diagnostics
from specdec_jax import drafters
from specdec_jax import interfaces
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import speculative
from specdec_jax import streaming
from specdec_jax import synthetic
from specdec_jax.sampling import SamplingConfig
from test_speculative import SEQ_LEN
from test_speculative import SMALL_EOS
from test_speculative import VOCAB
from test_speculative import exact_sequence_distribution
from test_speculative import law_fit
from test_speculative import total_variation

KINDS = sorted(drafters.KINDS)
LAW_ROWS, LAW_P = 20_000, 1e-5


def _tree(r, depth):
  """A random tree spec of depth <= `depth`."""
  form = r.integers(4)
  if form == 0:
    spec = f'chain:{r.integers(1, depth + 1)}'
  else:
    k, b, d = r.integers(1, 4), r.integers(1, 4), r.integers(1, depth + 1)
    spec = f"{'static-beam' if form == 1 else 'beam'}:{k},{b},{d}"
  return spec + (f'/{r.integers(1, 12)}' if r.random() < 0.3 else '')


def _emb_scale(v11):
  return 1.0 if v11 else 0.1  # tied logits: conftest's v10


def _t5(r, vocab_sizes, heads, max_layers):
  """A random tiny T5 1.1 or 1.0, float32 or bfloat16, of a vocabulary and
  heads drawn from these: (model, params, v11, bf16)."""
  v11 = r.random() < 0.7
  config = conftest.TINY_V11.replace(
      vocab_size=int(r.choice(vocab_sizes)), emb_dim=int(r.choice([16, 32])),
      num_heads=int(r.choice(heads)), head_dim=int(r.choice([4, 8])),
      mlp_dim=int(r.choice([32, 64])),
      num_encoder_layers=int(r.integers(1, max_layers + 1)),
      num_decoder_layers=int(r.integers(1, max_layers + 1)))
  if not v11:
    config = config.replace(mlp_activations=('relu',),
                            logits_via_embedding=True)
  bf16 = r.random() < 0.35
  if bf16:
    config = config.replace(dtype=jnp.bfloat16,
                            activation_dtype=jnp.bfloat16)
  model = network.T5Model(config)
  return (model, conftest.numpy_params(config, int(r.integers(1 << 30)),
                                       _emb_scale(v11)), v11, bf16)


def _drafter(r, kind, source, max_gamma):
  """(drafter, params, gamma, merged) of `kind` from `source`."""
  drafter, params = drafters.get_kind(kind).build(source)
  gamma, merged = int(r.integers(1, max_gamma + 1)), None
  if isinstance(drafter, interfaces.MergedDrafter):
    merged = None if r.random() < 0.7 else False
    top = drafter.max_gamma(speculative.decodes_merged(drafter, merged))
    if top is not None and gamma > top:
      gamma = int(r.integers(1, top + 1))
  return drafter, params, gamma, merged


def _same(result, tokens, lengths):
  return (np.array_equal(np.asarray(result.tokens), tokens) and
          np.array_equal(np.asarray(result.lengths), lengths))


def greedy_case(seed, kinds=KINDS):
  """One random greedy case of a kind of `kinds`: a dict of what it drew
  and its status."""
  r = np.random.default_rng(seed)
  model, params, v11, bf16 = _t5(r, [12, 40, 128, 301], [1, 2, 4], 3)
  config, emb_scale = model.config, _emb_scale(v11)
  fused = r.random() < 0.5
  if fused:
    model, params = network.for_decoding(model, params)
  batch, width = int(r.integers(1, 5)), int(r.integers(1, 14))
  enc = r.integers(2, config.vocab_size, (batch, width))
  for row in range(batch):
    enc[row, int(r.integers(0 if r.random() < 0.1 else 1, width + 1)):] = 0
  max_len = int(r.integers(1, 22))
  probe = np.asarray(decoding.temperature_sample(
      model, params, enc, max_decode_len=max_len, eos_id=1).tokens)
  mid = probe[:, max_len // 3]
  eos = int(mid[0]) if r.random() < 0.7 and mid[0] > 0 else 1
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=max_len, eos_id=eos)
  tokens, lengths = np.asarray(base.tokens), np.asarray(base.lengths)
  outputs = [row[:n].tolist() for row, n in zip(tokens, lengths)]
  draft_model, draft_params = model, params
  if r.random() < 0.5:
    small = config.replace(num_encoder_layers=1,
                           num_decoder_layers=int(r.integers(1, 3)),
                           num_heads=int(r.choice([1, 2])))
    draft_model = network.T5Model(small)
    draft_params = conftest.numpy_params(small, int(r.integers(1 << 30)),
                                         emb_scale)
  scale = float(r.choice([0.0, 0.05, 0.3, 1.0]))
  if scale:
    draft_params = synthetic.perturbed(draft_params, scale,
                                       jax.random.key(seed % 1000))
  pairs = [(list(i), t) for i, t in zip(enc, outputs[1:] + outputs[:1])]
  source = drafters.DraftSource(
      vocab_size=config.vocab_size, draft_model=draft_model,
      draft_params=draft_params, train_targets=lambda: outputs,
      target_model=model, target_params=params, train_pairs=lambda: pairs,
      output_length=max_len, confidence=float(r.choice([0, 0, 0.3, 0.8])),
      tree=_tree(r, 5))
  kind = kinds[int(r.integers(len(kinds)))]
  drafter, dparams, gamma, merged = _drafter(r, kind, source, 8)
  slots = int(r.integers(1, batch + 1))
  refill = None
  if slots > 1 and r.random() < 0.4:
    refill = tuple(sorted({int(x) for x in r.integers(1, slots + 1, 2)} |
                          {slots}))
  case = dict(seed=seed, mode='greedy', kind=kind, gamma=gamma,
              merged=merged, t5=('1.1' if v11 else '1.0'),
              dtype='bfloat16' if bf16 else 'float32', fused=fused,
              vocab=config.vocab_size,
              layers=[config.num_encoder_layers, config.num_decoder_layers],
              batch=batch, input_length=width, max_decode_len=max_len,
              eos=eos, noise=scale, own_draft_model=draft_model is not model,
              confidence=source.confidence, tree=source.tree, slots=slots,
              refill_sizes=refill)
  decodes = _decodes(model, params, drafter, dparams, enc, slots, refill,
                     gamma=gamma, max_decode_len=max_len, eos_id=eos,
                     merged=merged)
  # float32 on a CPU is bit for bit: any difference is a failure.
  return _judge(case, model, params, enc, tokens, lengths, decodes, bf16)


def _decodes(model, params, drafter, dparams, enc, slots, refill, **common):
  """What a greedy case checks against the fixed baseline: the fixed and
  streamed speculative decodes and the streamed baseline."""
  base = dict(max_decode_len=common['max_decode_len'],
              eos_id=common['eos_id'])
  return {
      'fixed': speculative.speculative_sample(
          model, params, drafter, dparams, enc, **common),
      'stream': streaming.speculative_stream(
          model, params, drafter, dparams, enc, batch_size=slots,
          refill_sizes=refill, **common),
      'baseline_stream': streaming.sample_stream(
          model, params, enc, batch_size=slots, refill_sizes=refill,
          **base)}


def _judge(case, model, params, enc, tokens, lengths, decodes, ties):
  """`case` with the decodes differing from `tokens` / `lengths` and its
  status: 'ok'; 'near_tie' when `ties` allows them and each differing row
  is a certified near tie of `model` (a decode whose lengths differ but not
  its tokens has none); else 'FAILED'."""
  differing = [n for n, d in decodes.items() if not _same(d, tokens, lengths)]
  case['differing'] = differing
  case['status'] = 'ok'
  if differing:
    verdicts = {n: [d.kind for d in diagnostics.diagnose(
        model, params, enc, tokens, np.asarray(decodes[n].tokens))]
                for n in differing}
    case['diagnosed'] = verdicts
    tie = ties and all(v and all(k == diagnostics.NEAR_TIE for k in v)
                       for v in verdicts.values())
    case['status'] = 'near_tie' if tie else 'FAILED'
  return case


def mesh_case(seed, kinds=KINDS):
  """One random greedy case on a random mesh of the 8 simulated devices:
  a dict of what it drew and its status.

  A tiny T5 whose heads, mlp and vocabulary the 'model' axis divides, its
  batch a multiple of 'data'; the target sharded by T5X's rules, a T5 draft
  model sharded by them or replicated, any other drafter's params as built
  from the sharded target's. The sharded speculative decodes (fixed and
  streamed through slots of a multiple of 'data', default refill sizes) and
  the sharded streamed baseline must equal the sharded fixed baseline token
  for token (float32: exactly; bfloat16: or a certified near tie), and the
  sharded fixed baseline one device's (a certified near tie allowed in
  both: a mesh sums a sharded product in another order).
  """
  r = np.random.default_rng(seed)
  devices = int(r.choice([2, 4, 8]))
  part = partitioning.Partitioner(
      num_partitions=int(r.choice([m for m in (1, 2, 4, 8) if devices % m
                                   == 0])), devices=jax.devices()[:devices])
  m, d = part.model_size, part.data_size
  model, params, v11, bf16 = _t5(r, [m * 5, m * 16, m * 37],
                                 [m, 2 * m] if m > 1 else [1, 2, 4], 2)
  config = model.config
  batch, width = d * int(r.integers(1, 3)), int(r.integers(1, 12))
  enc = r.integers(2, config.vocab_size, (batch, width)).astype(np.int32)
  for row in range(batch):
    enc[row, int(r.integers(1, width + 1)):] = 0
  max_len = int(r.integers(1, 16))
  base = decoding.temperature_sample(model, params, enc,
                                     max_decode_len=max_len, eos_id=1)
  tokens, lengths = np.asarray(base.tokens), np.asarray(base.lengths)
  outputs = [row[:n].tolist() for row, n in zip(tokens, lengths)]
  target = part.sharded_model(model)
  s_params, s_enc = part.shard_params(params, target), part.shard_batch(enc)
  own = r.random() < 0.5
  draft_model, draft_params = model, params
  if own:
    small = config.replace(num_decoder_layers=1)
    draft_model = network.T5Model(small)
    draft_params = conftest.numpy_params(small, int(r.integers(1 << 30)),
                                         _emb_scale(v11))
  scale = float(r.choice([0.0, 0.05, 0.3]))
  if scale:
    draft_params = synthetic.perturbed(draft_params, scale,
                                       jax.random.key(seed % 1000))
  replicated = r.random() < 0.5
  draft_model = part.sharded_model(
      draft_model, partitioning.data_parallel_rules() if replicated else None)
  source = drafters.DraftSource(
      vocab_size=config.vocab_size, draft_model=draft_model,
      draft_params=part.shard_params(draft_params, draft_model),
      train_targets=lambda: outputs, target_model=target,
      target_params=s_params,
      train_pairs=lambda: [(list(i), t) for i, t in zip(enc, outputs)],
      output_length=max_len, confidence=float(r.choice([0, 0, 0.5])),
      tree=_tree(r, 4))
  kind = kinds[int(r.integers(len(kinds)))]
  drafter, dparams, gamma, merged = _drafter(r, kind, source, 6)
  slots = d * int(r.integers(1, batch // d + 1))
  case = dict(seed=seed, mode='mesh', kind=kind, gamma=gamma, merged=merged,
              mesh=f'{d}x{m}', t5=('1.1' if v11 else '1.0'),
              dtype='bfloat16' if bf16 else 'float32',
              vocab=config.vocab_size, heads=config.num_heads,
              layers=[config.num_encoder_layers, config.num_decoder_layers],
              batch=batch, input_length=width, max_decode_len=max_len,
              noise=scale, own_draft_model=own,
              draft_replicated=replicated, confidence=source.confidence,
              tree=source.tree, slots=slots)
  mesh_base = decoding.temperature_sample(target, s_params, s_enc,
                                          max_decode_len=max_len, eos_id=1)
  case['single_device'] = single = _judge(
      {}, model, params, enc, tokens, lengths, {'mesh_baseline': mesh_base},
      True)
  if single['status'] == 'FAILED':
    return dict(case, status='FAILED')
  decodes = _decodes(target, s_params, drafter, dparams, s_enc, slots, None,
                     gamma=gamma, max_decode_len=max_len, eos_id=1,
                     merged=merged)
  case = _judge(case, model, params, enc, np.asarray(mesh_base.tokens),
                np.asarray(mesh_base.lengths), decodes, bf16)
  if case['status'] == 'ok' and single['status'] == 'near_tie':
    case['status'] = 'near_tie'
  return case


def mesh_law_case(seed, kinds=KINDS):
  """`law_case` on a random mesh (`mesh_case`'s): the 20,000 rows over
  'data', the target (two heads) split over a 'model' axis of 1 or 2."""
  return law_case(seed, kinds, mesh=True)


def law_case(seed, kinds=KINDS, mesh=False):
  """One random law case of a kind of `kinds`: a dict of what it drew and
  its status."""
  r = np.random.default_rng(seed)
  part = None
  if mesh:
    devices = int(r.choice([2, 4, 8]))
    part = partitioning.Partitioner(num_partitions=int(r.choice([1, 2])),
                                    devices=jax.devices()[:devices])
  config = conftest.TINY_V11.replace(
      vocab_size=VOCAB, num_heads=2 if mesh else 1,
      head_dim=8 if mesh else 16, num_encoder_layers=1,
      num_decoder_layers=int(r.integers(1, 3)))
  model = network.T5Model(config)
  params = conftest.numpy_params(config, int(r.integers(1 << 30)), 1.0)
  logit_scale = float(r.uniform(1.5, 4))
  dense = params['decoder']['logits_dense']
  params['decoder']['logits_dense'] = {
      'kernel': logit_scale * dense['kernel']}
  enc = jnp.array([[3, 4, 5, 2, 1]])
  form = r.integers(3)
  sampling = SamplingConfig(
      temperature=float(r.uniform(0.5, 1.5)),
      topk=int(r.integers(2, 5)) if form == 1 else 0,
      topp=float(r.uniform(0.6, 0.95)) if form == 2 else 1.0)
  law = exact_sequence_distribution(model, params, enc, sampling)
  scale = float(r.choice([0.0, 0.3, 1.0, 3.0]))
  dparams = params
  if scale:
    dparams = synthetic.perturbed(params, scale, jax.random.key(seed % 997))
  if part:  # the law is one device's; the decode the mesh's
    model = part.sharded_model(model)
    params, dparams = (part.shard_params(x, model) for x in (params,
                                                             dparams))
  trains = [[2, 3, 1], [4, 4, 5, 1], [3, 5, 2, 1],
            [int(x) for x in r.integers(2, VOCAB, 4)] + [1]]
  pairs = [([3, 4, 5, 2, 1], t) for t in trains]
  source = drafters.DraftSource(
      vocab_size=VOCAB, draft_model=model, draft_params=dparams,
      train_targets=lambda: trains, target_model=model, target_params=params,
      train_pairs=lambda: pairs, output_length=SEQ_LEN,
      confidence=float(r.choice([0, 0, 0.5])), tree=_tree(r, 3))
  kind = kinds[int(r.integers(len(kinds)))]
  drafter, dparams, gamma, merged = _drafter(r, kind, source, 5)
  slots = int(r.choice([LAW_ROWS // 4, LAW_ROWS // 2])) if (
      r.random() < 0.3) else None
  case = dict(seed=seed, mode='mesh_law' if mesh else 'law', kind=kind,
              gamma=gamma, merged=merged,
              layers=config.num_decoder_layers, logit_scale=logit_scale,
              temperature=sampling.temperature, topk=sampling.topk,
              topp=sampling.topp, noise=scale, confidence=source.confidence,
              tree=source.tree, slots=slots)
  if part:
    case['mesh'] = f'{part.data_size}x{part.model_size}'
  common = dict(gamma=gamma, max_decode_len=SEQ_LEN, sampling=sampling,
                eos_id=SMALL_EOS, rng=jax.random.key(seed), merged=merged)
  inputs = jnp.tile(enc, (LAW_ROWS, 1))
  if part:
    inputs = part.shard_batch(inputs)
  if slots:
    out = streaming.speculative_stream(model, params, drafter, dparams,
                                       inputs, batch_size=slots, **common)
  else:
    out = speculative.speculative_sample(model, params, drafter, dparams,
                                         inputs, **common)
  samples = np.asarray(out.tokens)
  impossible, p, cells = law_fit(samples, law)
  case.update(impossible=len(impossible), p=p, cells=cells,
              support=int(sum(v > 0 for v in law.values())),
              tv=total_variation(samples, law))
  case['status'] = 'ok' if not impossible and p > LAW_P else 'FAILED'
  return case


def summarize(cases, command):
  """The run's summary: counts by mode, kind and status, the failures."""
  by = collections.defaultdict(collections.Counter)
  for c in cases:
    by[f"{c['mode']} {c.get('kind', '?')}"][c['status']] += 1
  # A law on one sequence (top-p, a confident target) tests the support
  # alone; under a wider law p is uniform: its spread checks the test.
  laws = {m: [c for c in cases if c['mode'] == m and 'p' in c]
          for m in ('law', 'mesh_law')}
  tested = {m: [c['p'] for c in v if c['support'] > 1]
            for m, v in laws.items()}
  quartiles = lambda ps: [round(float(q), 3) for q in np.quantile(
      ps, [0.25, 0.5, 0.75])] if ps else None
  return dict(
      command=command, jax=jax.__version__, machine=(
          f'{platform.machine()}, {os.cpu_count()} CPUs, jax backend '
          f'{jax.default_backend()}'),
      cases=len(cases),
      statuses=dict(collections.Counter(c['status'] for c in cases)),
      by_kind={k: dict(v) for k, v in sorted(by.items())},
      greedy_dtypes=dict(collections.Counter(
          c['dtype'] for c in cases if c['mode'] == 'greedy' and
          'dtype' in c)),
      meshes=dict(sorted(collections.Counter(
          f"{c['mesh']} {c['dtype']}" for c in cases
          if c['mode'] == 'mesh' and 'mesh' in c).items())),
      law_point_masses=len(laws['law']) - len(tested['law']),
      law_p_quartiles=quartiles(tested['law']),
      mesh_laws=len(laws['mesh_law']),
      mesh_law_point_masses=len(laws['mesh_law']) - len(
          tested['mesh_law']),
      mesh_law_p_quartiles=quartiles(tested['mesh_law']),
      failed=[c for c in cases if c['status'] not in ('ok', 'near_tie')])


def markdown(summary):
  lines = ['# Exactness at random points', '',
           f"Command: `{summary['command']}`  ",
           f"jax {summary['jax']}, {summary['machine']}. "
           f"{summary['cases']} cases: {summary['statuses']}. "
           'Greedy: fixed and streamed speculative decoding and the streamed '
           'baseline against the fixed baseline, token for token (bfloat16: '
           'a differing row must be a certified near tie); activations '
           f"{summary['greedy_dtypes']}. Law: 20,000 sampled rows against "
           'the exact law of 3 tokens: no sequence outside its support, '
           f'chi-square p > {LAW_P:g} ({summary["law_point_masses"]} laws on '
           'one sequence, their support alone); the p-values\' quartiles '
           f"over the others {summary['law_p_quartiles']} (uniform under "
           'the law: 0.25, 0.5, 0.75). Mesh: greedy on a sharded target '
           '(data x model devices, activations: cases '
           f"{summary['meshes']}), the fixed and streamed speculative "
           'decodes and the streamed baseline against the fixed baseline '
           'on the mesh (as greedy), that against one device\'s (a '
           'certified near tie allowed). Mesh law: '
           f"{summary['mesh_laws']} law cases decoded on a mesh, tested as "
           f"above ({summary['mesh_law_point_masses']} on one sequence; "
           f"the p-values' quartiles {summary['mesh_law_p_quartiles']}). "
           'What each case draws: tests/fuzz_exactness.py.', '',
           '| cases | ok | near tie | failed |', '|---|---:|---:|---:|']
  for name, counts in summary['by_kind'].items():
    lines.append(f"| {name} | {counts.get('ok', 0)} | "
                 f"{counts.get('near_tie', 0)} | "
                 f"{sum(v for k, v in counts.items() if k not in ('ok', 'near_tie'))} |")
  for c in summary['failed']:
    lines += ['', f"Failed: `{json.dumps(c)[:2000]}`"]
  return '\n'.join(lines) + '\n'


def run_case(mode, seed, kinds):
  """`greedy_case` or `law_case`, timed; an exception is a failed case."""
  start = time.time()
  try:
    case = {'greedy': greedy_case, 'law': law_case,
            'mesh': mesh_case, 'mesh_law': mesh_law_case}[mode](seed, kinds)
  except Exception:  # pylint: disable=broad-except
    case = dict(seed=seed, mode=mode, status='FAILED',
                error=traceback.format_exc()[-2000:])
  case['seconds'] = round(time.time() - start, 1)
  jax.clear_caches()  # a case's programs are not used again
  return case


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--greedy', type=checks.natural, default=400)
  parser.add_argument('--law', type=checks.natural, default=120)
  parser.add_argument('--mesh', type=checks.natural, default=0,
                      help='greedy cases on a random mesh of 8 simulated '
                      'devices (XLA_FLAGS set before jax starts: run this '
                      'script as a program)')
  parser.add_argument('--mesh_law', type=checks.natural, default=0,
                      help='law cases on a random mesh (as --mesh)')
  parser.add_argument('--seed', type=checks.natural, default=0)
  parser.add_argument('--out', type=checks.local_path,
                      default='results/fuzz_exactness')
  parser.add_argument('--jobs', type=checks.count, default=1,
                      help='processes running cases at once')
  parser.add_argument('--kinds', default=','.join(KINDS),
                      help='drafter kinds to draw from (comma-separated)')
  args = parser.parse_args(argv)
  if not args.greedy + args.law + args.mesh + args.mesh_law:
    parser.error('no case to run: --greedy, --law, --mesh and --mesh_law '
                 'are all 0')
  kinds = args.kinds.split(',')
  for kind in kinds:
    try:
      drafters.get_kind(kind)  # an unknown kind: the known ones named
    except ValueError as e:
      parser.error(f'--kinds: {e}')
  out = pathlib.Path(args.out)
  checks.check_no_file_in_the_way(f'--out {args.out}: its folder', out.parent)
  out.parent.mkdir(parents=True, exist_ok=True)
  log = out.with_suffix('.jsonl')
  done = {}
  if log.exists():
    for i, line in enumerate(log.read_text().splitlines(), 1):
      try:
        case = json.loads(line)
      except ValueError:
        case = None
      if not isinstance(case, dict) or not isinstance(
          case.get('mode'), str) or not checks.is_int(
              case.get('seed')) or 'status' not in case:
        raise checks.InputError(
            f'{log} line {i} is not a case of this script (a JSON object '
            'of its "mode", "seed" and "status"): move the file away or '
            'give another --out.')
      done[(case['mode'], case['seed'])] = case
  todo = [('greedy', args.seed + i) for i in range(args.greedy)] + [
      ('law', args.seed + 1_000_000 + i) for i in range(args.law)] + [
          ('mesh', args.seed + 2_000_000 + i) for i in range(args.mesh)] + [
              ('mesh_law', args.seed + 3_000_000 + i)
              for i in range(args.mesh_law)]
  if (args.mesh or args.mesh_law) and jax.device_count() < 8:
    parser.error(f'--mesh and --mesh_law need 8 devices, jax has {jax.device_count()} '
                 '(XLA_FLAGS was read before this script set it: run it as '
                 'a program, not imported after jax started).')
  left = [t for t in todo if t not in done]
  with log.open('a') as f, contextlib.ExitStack() as stack:
    if args.jobs == 1:  # in this process (a test's patches hold)
      cases = (run_case(mode, seed, kinds) for mode, seed in left)
    else:
      pool = stack.enter_context(futures.ProcessPoolExecutor(
          args.jobs, multiprocessing.get_context('spawn')))
      cases = (c.result() for c in futures.as_completed(
          [pool.submit(run_case, mode, seed, kinds) for mode, seed in left]))
    for case in tqdm.tqdm(cases, total=len(left), desc='cases'):
      done[(case['mode'], case['seed'])] = case
      f.write(json.dumps(case) + '\n')
      f.flush()
  command = ' '.join(['python tests/fuzz_exactness.py'] + (
      sys.argv[1:] if argv is None else list(argv)))
  summary = summarize([done[t] for t in todo], command)
  out.with_suffix('.json').write_text(json.dumps(summary, indent=1) + '\n')
  out.with_suffix('.md').write_text(markdown(summary))
  print(markdown(summary))
  return 1 if summary['failed'] else 0


if __name__ == '__main__':
  sys.exit(checks.run_main(main))  # a refused value or file: its line
