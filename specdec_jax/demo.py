"""Decode with a random tiny T5, plainly and speculatively; print what happened.

  python -m specdec_jax.demo [--batch 3] [--max_decode_len 16] [--gamma 4]
                             [--temperature 0]

A sanity check that installation worked: builds a T5 1.1-shaped target with
random weights and a drafter (the target's weights plus noise, standing in for
a trained small model), decodes a batch of inputs of different lengths with
the jitted baseline and with speculative decoding, and prints the tokens,
whether they are identical (greedy), the acceptance statistics and timings.
"""

import argparse
import time

import jax
import numpy as np

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import speculative
from specdec_jax.sampling import SamplingConfig

DEMO_CONFIG = network.T5Config(
    vocab_size=512, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=128,
    num_encoder_layers=2, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batch', type=int, default=3)
  parser.add_argument('--max_decode_len', type=int, default=16)
  parser.add_argument('--gamma', type=int, default=4)
  parser.add_argument('--draft_noise', type=float, default=0.1)
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)

  model = network.T5Model(DEMO_CONFIG)
  params = model.init_params(jax.random.key(args.seed))
  rng = np.random.default_rng(args.seed)
  inputs = rng.integers(2, DEMO_CONFIG.vocab_size, (args.batch, 12))
  for b in range(args.batch):  # rows of different lengths, 0-padded
    inputs[b, 12 - 3 * (b % 4):] = 0
  sampling = SamplingConfig(temperature=args.temperature)
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(args.seed + 1), len(leaves))
  draft_params = jax.tree_util.tree_unflatten(tree, [
      x + args.draft_noise * x.std() * jax.random.normal(k, x.shape)
      for x, k in zip(leaves, keys)])
  decode = lambda: decoding.temperature_sample(
      model, params, inputs, max_decode_len=args.max_decode_len,
      sampling=sampling, rng=jax.random.key(args.seed))
  spec_decode = lambda: speculative.speculative_sample(
      model, params, drafters.T5Drafter(model), draft_params, inputs,
      gamma=args.gamma, max_decode_len=args.max_decode_len,
      sampling=sampling, rng=jax.random.key(args.seed))

  timings = {}
  for name, fn in (('baseline', decode), ('speculative', spec_decode)):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    timings[name] = (first, time.perf_counter() - start, out)
  result, spec = timings['baseline'][2], timings['speculative'][2]

  n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
  print(f'model: random T5 1.1-shaped, {n_params:,} parameters, '
        f'backend {jax.default_backend()}')
  print(f'sampling: {sampling}')
  for b in range(args.batch):
    print(f'input  {b} ({int((inputs[b] > 0).sum())} tokens): '
          f'{inputs[b][inputs[b] > 0].tolist()}')
    n = int(result.lengths[b])
    print(f'output {b} ({n} tokens): {np.asarray(result.tokens[b, :n]).tolist()}')
  same = bool(np.array_equal(result.tokens, spec.tokens))
  print(f'speculative (gamma={args.gamma}) output identical to baseline: '
        f'{same}' + ('' if sampling.greedy else ' (sampling: equal in '
                     'distribution, not per draw)'))
  for key, value in speculative.summarize(spec.stats).items():
    print(f'  {key}: {np.round(value, 3).tolist()}')
  for name, (first, run, _) in timings.items():
    print(f'{name}: first call (compile + run) {first:.2f} s; '
          f'compiled call {run * 1e3:.1f} ms')
  return result, spec


if __name__ == '__main__':
  main()
