"""Times our jitted greedy baseline against HF transformers' greedy `generate`.

Both decode the same random-weight T5 1.1 small (float32, CPU) from the same
random input (ids in [2, vocab), fixed seed) and produce exactly
`--decode_len` tokens: ours with `eos_id=-1` (never matches), HF with no EOS
token at all, `do_sample=False`, `num_beams=1`, `use_cache=True`. Each side is
warmed up once (JAX compilation excluded), then the repeats are interleaved
(ours, HF, ours, HF, ...) so machine-load drift hits both alike; we report
medians of wall time, tokens/s (`decode_len * batch / median`) and the ratio.
All per-repeat times are kept in the JSON. On a machine with few or busy cores
torch's multi-threaded kernels can be very erratic; `--torch_threads 1` pins
torch to one thread (the count used is recorded either way).
The greedy sequences are compared and mismatching positions counted.

  python scripts/benchmark_baseline.py --repeats 10
"""

import argparse
import json
import os
import platform
import statistics
import sys

import jax
import numpy as np
import torch
import transformers

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import models
from specdec_jax.checkpoints import hf as hf_lib


def main(argv=None):
  """Parses flags, runs the interleaved benchmark and writes results."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeats', type=checks.count, default=10)
  parser.add_argument('--batch', type=checks.count, default=1)
  parser.add_argument('--input_len', type=checks.count, default=64)
  parser.add_argument('--decode_len', type=checks.count, default=64)
  parser.add_argument('--seed', type=checks.natural, default=0)
  parser.add_argument('--out_dir', type=checks.local_path, default='results')
  parser.add_argument('--torch_threads', type=int, default=0,
                      help='torch.set_num_threads; 0 keeps the default.')
  args = parser.parse_args(argv)
  checks.check_local_folder('--out_dir', args.out_dir)  # before measuring
  if args.torch_threads > 0:
    torch.set_num_threads(args.torch_threads)
  command = 'python scripts/benchmark_baseline.py ' + ' '.join(
      f'--{k} {v}' for k, v in vars(args).items())

  config = models.CONFIGS['t5_1_1_small'].replace(
      vocab_size=models.VOCAB_SIZE, dtype='float32')
  model = network.T5Model(config)
  params = model.init_params(jax.random.key(args.seed))
  hf_model = hf_lib.to_hf_model(params, config)
  hf_model.generation_config.eos_token_id = None  # never stop early
  inputs = np.random.default_rng(args.seed).integers(
      2, config.vocab_size, (args.batch, args.input_len), dtype=np.int32)
  hf_inputs = torch.from_numpy(inputs.astype(np.int64))
  n = args.decode_len

  def ours():
    return jax.block_until_ready(decoding.temperature_sample(
        model, params, inputs, max_decode_len=n, eos_id=-1).tokens)

  def hf():
    with torch.inference_mode():
      return hf_model.generate(
          input_ids=hf_inputs, attention_mask=torch.ones_like(hf_inputs),
          max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1,
          use_cache=True, eos_token_id=None)

  ours_tokens = np.asarray(ours())  # warm-up (includes compilation)
  hf_tokens = hf()[:, 1:].numpy()  # drop the decoder start token
  times = {'ours': [], 'hf': []}
  for r in range(args.repeats):
    _, t = measure.time_alternating({'ours': ours, 'hf': hf})
    for name in times:
      times[name].append(t[name])
    print(f'repeat {r + 1}/{args.repeats}: ours {times["ours"][-1]:.3f}s '
          f'hf {times["hf"][-1]:.3f}s', file=sys.stderr)

  shapes_ok = ours_tokens.shape == hf_tokens.shape == (args.batch, n)
  mismatches = (int(np.sum(ours_tokens != hf_tokens)) if shapes_ok
                else None)
  machine = {
      'cpu': measure.cpu_model(), 'processor': platform.processor(),
      'nproc': os.cpu_count(), 'torch_num_threads': torch.get_num_threads(),
      'jax_devices': [str(d) for d in jax.devices()],
      'python': platform.python_version(), 'jax': jax.__version__,
      'torch': torch.__version__, 'transformers': transformers.__version__,
  }
  medians = {k: statistics.median(v) for k, v in times.items()}
  tok_s = {k: n * args.batch / v for k, v in medians.items()}
  result = {
      'command': command, 'args': vars(args), 'machine': machine,
      'output_shapes': {'ours': list(ours_tokens.shape),
                        'hf': list(hf_tokens.shape)},
      'generated_tokens_ok': shapes_ok,
      'greedy_token_mismatches': mismatches,
      'times_s': times, 'median_s': medians, 'tokens_per_s': tok_s,
      'speed_ours_vs_hf': tok_s['ours'] / tok_s['hf'],
  }

  rows = [('ours (JAX, jitted while_loop)', 'ours'),
          ('HF transformers generate (torch)', 'hf')]
  table = ['| implementation | median s | tokens/s | speed vs HF |',
           '|---|---|---|---|']
  for name, key in rows:
    table.append(f'| {name} | {medians[key]:.4f} | {tok_s[key]:.1f} | '
                 f'{tok_s[key] / tok_s["hf"]:.2f}x |')
  md = '\n'.join([
      '# Greedy baseline vs HF transformers (T5 1.1 small, random weights)',
      '', 'Rerun with:', '', '```', command, '```', '',
      f'Machine: {machine["cpu"]}, nproc {machine["nproc"]}, torch threads '
      f'{machine["torch_num_threads"]}, JAX devices '
      f'{", ".join(machine["jax_devices"])}; python {machine["python"]}, '
      f'jax {machine["jax"]}, torch {machine["torch"]}, transformers '
      f'{machine["transformers"]}.', '',
      f'float32, batch {args.batch}, {args.input_len} input tokens, exactly '
      f'{n} generated tokens, median of {args.repeats} interleaved repeats '
      '(compilation and warm-up excluded).', '', *table, '',
      f'Generated {n} tokens on both sides: {shapes_ok}; greedy token '
      f'mismatches: {mismatches} of {args.batch * n}.', ''])

  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, 'baseline_vs_hf.json'), 'w') as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(args.out_dir, 'baseline_vs_hf.md'), 'w') as f:
    f.write(md)
  print(md)


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
