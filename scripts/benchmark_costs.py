"""Measures the costs that decide speculative speed-up, and the loop overhead.

  python scripts/benchmark_costs.py [--repeats 7] [--out_dir results]

On random weights (float32, batch 1) of a T5 1.1-small-size target and a much
smaller T5 drafter (`bench.costs.TARGET`, `DRAFT`):
  * t_target(k): one target decoder call on k = 1..9 tokens, as it runs inside
    the decoding loop (timed in a compiled fori_loop of calls, so no Python
    dispatch is counted), and cost(k) = t_target(k) / t_target(1);
  * c = t_draft(1) / t_target(1), and t_draft(2) (the drafter's catch-up call);
  * the memory floor: the machine's read bandwidth (`measure.read_bandwidth`,
    a vector-matrix product streaming 256 MiB, and `measure.bandwidth`, an
    elementwise pass) and, per model (T5 1.1 small and base decoder sizes,
    the drafter), the bytes one decoder call must read
    (`measure.step_bytes`), the floor = bytes / bandwidth, t(1) / floor and
    cost(k) for k = 1..9;
  * decoding layouts: a stack of 8 ReLU MLP blocks at T5 1.1-base
    widths (`x @ W` with W stored [in, out] as in T5X, against W stored
    [out, in] and computed as `W @ x.T`, as `einsum('ki,oi->ko')`, or with
    the activations kept transposed), cost(k) of each;
  * loop overhead: speculative decoding with the target as its own drafter
    (alpha = 1, every iteration yields gamma + 1 tokens) for gamma = 1..8. The
    measured time per iteration is compared with the sum of its parts,
    t_draft(2) + (gamma - 1) t_draft(1) + t_target(gamma + 1) (what our
    drafter runs: one 2-token catch-up call then gamma - 1 one-token calls)
    and with the paper's gamma * t_draft(1) + t_target(gamma + 1).
Medians of `--repeats` runs; baseline and speculative runs interleaved
(`measure.time_alternating`: the order flips after every repeat).
Writes results/costs.md and results/costs.json, and this machine's hardware
profile (`bench.costs.write_results`, through
`hardware.from_costs_run`: t(k), c of the drafter, the floor) into
specdec_jax/profiles/<name>.json (`--profile_dir`).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import network
from specdec_jax import speculative
from specdec_jax import measure
from specdec_jax.bench import costs
from specdec_jax import models
from specdec_jax.bench import report
from specdec_jax.measure import median_time

# T5 1.1-base dimensions (the decoder is what a step reads; 2 encoder layers
# keep the set-up short).
BASE = models.CONFIGS['t5_1_1_base'].replace(
    vocab_size=models.VOCAB_SIZE, dtype='float32', num_encoder_layers=2)
FLOOR_MODELS = {'T5 1.1-base decoder': BASE, 'T5 1.1-small': costs.TARGET,
                'drafter (emb 128, 2+2)': costs.DRAFT}
KS = tuple(range(1, 10))


def floors(inputs, repeats):
  """Bandwidths, and per model: bytes per step, floor, t(k), cost(k)."""
  read = measure.read_bandwidth(repeats=repeats)
  copy = measure.bandwidth(repeats=repeats)
  best = max(read['bytes_per_s'], copy['bytes_per_s'])
  models = {}
  for name, config in FLOOR_MODELS.items():
    model = network.T5Model(config)
    params = model.init_params(jax.random.key(0))
    t = measure.cost_curve(model, params, inputs, KS, repeats=repeats,
                           context=32)
    step = measure.step_bytes(model, params, 1, 32, inputs.shape[1])
    models[name] = dict(
        step_bytes=step, floor_ms=1e3 * step / best,
        t_ms={k: v * 1e3 for k, v in t.items()},
        cost={k: v / t[1] for k, v in t.items()},
        t1_over_floor=t[1] / (step / best))
    print(name, models[name], flush=True)
    del params
  return dict(read_bandwidth=read, copy_bandwidth=copy, models=models)


def layouts(repeats, blocks=8, emb=768, mlp=2048):
  """cost(k) of a ReLU MLP stack at T5 1.1-base widths in four layouts."""
  rng = np.random.default_rng(0)
  w1 = [rng.standard_normal((emb, mlp), np.float32) * .02
        for _ in range(blocks)]
  w2 = [rng.standard_normal((mlp, emb), np.float32) * .02
        for _ in range(blocks)]
  in_out = ([jnp.asarray(w) for w in w1], [jnp.asarray(w) for w in w2])
  out_in = ([jnp.asarray(np.ascontiguousarray(w.T)) for w in w1],
            [jnp.asarray(np.ascontiguousarray(w.T)) for w in w2])

  def x_w(x, a, b):
    for u, v in zip(a, b):
      x = x + jax.nn.relu(x @ u) @ v
    return x

  def w_xt(x, a, b):
    for u, v in zip(a, b):
      x = x + (v @ jax.nn.relu(u @ x.T)).T
    return x

  def einsum(x, a, b):
    for u, v in zip(a, b):
      x = x + jnp.einsum('ki,oi->ko',
                         jax.nn.relu(jnp.einsum('ki,oi->ko', x, u)), v)
    return x

  def transposed(x, a, b):
    xt = x.T
    for u, v in zip(a, b):
      xt = xt + v @ jax.nn.relu(u @ xt)
    return xt.T

  variants = {'x @ W, W [in, out] (T5X, ours)': (x_w, in_out),
              'W @ x.T, W [out, in]': (w_xt, out_in),
              "einsum('ki,oi'), W [out, in]": (einsum, out_in),
              'activations [feature, k], W [out, in]': (transposed, out_in)}
  result = {}
  for name, (fn, (a, b)) in variants.items():
    f = jax.jit(fn)
    t = {}
    for k in (1, 2, 4, 8):
      x = jnp.asarray(rng.standard_normal((k, emb), np.float32))
      t[k] = median_time(lambda f=f, x=x: f(x, a, b), 4 * repeats)
    result[name] = dict(t1_ms=t[1] * 1e3, cost={k: t[k] / t[1] for k in t})
    print(name, result[name], flush=True)
  return dict(bytes=2 * blocks * emb * mlp * 4, variants=result)


INPUT_LEN = 64
DECODE_LEN = 64


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=checks.count, default=7)
  parser.add_argument('--out_dir', type=checks.local_path, default='results')
  parser.add_argument('--profile_dir', type=checks.local_path, default=None,
                      help='where the profile goes (default: '
                      'specdec_jax/profiles)')
  args = parser.parse_args(argv)
  costs.check_folders(args.out_dir, args.profile_dir)  # before measuring

  target = network.T5Model(costs.TARGET)
  draft = network.T5Model(costs.DRAFT)
  t_params = target.init_params(jax.random.key(0))
  d_params = draft.init_params(jax.random.key(1))
  inputs = jnp.asarray(
      np.random.default_rng(0).integers(2, 32128, (1, INPUT_LEN)), jnp.int32)

  call_time = lambda model, params, k: measure.call_time(
      model, params, inputs, k, repeats=args.repeats, n_calls=60,
      max_length=DECODE_LEN + 10)
  t_target = {k: call_time(target, t_params, k) for k in range(1, 10)}
  t_draft = {k: call_time(draft, d_params, k) for k in (1, 2)}
  c = t_draft[1] / t_target[1]
  floor = floors(inputs, args.repeats)
  layout = layouts(args.repeats)
  print(f't_target(1) = {t_target[1]*1e3:.2f} ms, t_draft(1) = '
        f'{t_draft[1]*1e3:.2f} ms, c = {c:.3f}')

  # Encoder + cache set-up, paid once per decode (subtracted below).
  init = jax.jit(target.init_cache, static_argnums=2)
  t_init = median_time(lambda: init(t_params, inputs, DECODE_LEN + 10),
                       args.repeats)
  t_tt1 = t_target[1]
  rows = []
  self_drafter = drafters.T5Drafter(target)
  for gamma in range(1, 9):
    spec = lambda: speculative.speculative_sample(
        target, t_params, self_drafter, t_params, inputs, gamma=gamma,
        max_decode_len=DECODE_LEN, eos_id=-1)
    base = lambda: decoding.temperature_sample(
        target, t_params, inputs, max_decode_len=DECODE_LEN, eos_id=-1)
    out = jax.block_until_ready(spec())
    jax.block_until_ready(base())
    iters = int(out.stats.iterations)
    assert iters == -(-DECODE_LEN // (gamma + 1)), iters
    _, times = measure.time_alternating({'spec': spec, 'base': base},
                                        args.repeats)
    spec_s, base_s = times['spec'], times['base']
    # Self-drafting: the drafter is the target (t_draft = t_target).
    per_iter = (spec_s - 2 * t_init) / iters
    parts = t_target[2] + (gamma - 1) * t_tt1 + t_target[gamma + 1]
    paper = gamma * t_tt1 + t_target[gamma + 1]
    rows.append(dict(
        gamma=gamma, cost=t_target[gamma + 1] / t_tt1, iterations=iters,
        per_iter_ms=per_iter * 1e3, parts_ms=parts * 1e3, paper_ms=paper * 1e3,
        overhead_vs_parts=per_iter / parts - 1,
        overhead_vs_paper=per_iter / paper - 1,
        baseline_per_token_ms=(base_s - t_init) / DECODE_LEN * 1e3,
        spec_s=spec_s, baseline_s=base_s))
    print(rows[-1])

  head = report.header('scripts/benchmark_costs.py', argv)
  lines = [
      '# Decoder call costs and speculative loop overhead (CPU, float32)', '',
      f"Command: `{head['command']}`  ", f"Machine: {head['machine']}", '',
      f'Target: T5 1.1-small size (random weights, {INPUT_LEN} input tokens, '
      f'context 32); drafter: emb 128, 2+2 layers. Batch 1, medians of '
      f'{args.repeats}. Each call is timed inside a compiled loop.', '',
      f'- t_target(1) = {t_tt1*1e3:.2f} ms, t_draft(1) = '
      f'{t_draft[1]*1e3:.2f} ms, t_draft(2) = {t_draft[2]*1e3:.2f} ms',
      f'- **c = t_draft(1) / t_target(1) = {c:.3f}**', '',
      '## Cost of one target call on k tokens relative to one token', '',
      '| k | ' + ' | '.join(str(k) for k in t_target) + ' |',
      '|---|' + '---|' * len(t_target),
      '| cost(k) | ' + ' | '.join(f'{t_target[k]/t_tt1:.2f}'
                                  for k in t_target) + ' |', '',
      '## The memory floor', '',
      'A decoder call on k tokens reads the decoder weights and caches once: '
      'its floor is bytes / bandwidth, the same for every k at batch 1. '
      f"Read bandwidth {floor['read_bandwidth']['bytes_per_s'] / 1e9:.1f} "
      f"GB/s ({floor['read_bandwidth']['how']}); elementwise pass "
      f"{floor['copy_bandwidth']['bytes_per_s'] / 1e9:.1f} GB/s "
      f"({floor['copy_bandwidth']['how']}); the floor uses the larger. "
      'Random weights, float32, 64 input tokens, 32 cached tokens.', '',
      '| model | bytes per step | floor ms | t(1) ms | t(1) / floor | '
      + ' | '.join(f'cost({k})' for k in KS[1:]) + ' |',
      '|---|---|---|---|---|' + '---|' * (len(KS) - 1)] + [
      f"| {name} | {m['step_bytes'] / 1e6:.1f} MB | {m['floor_ms']:.2f} | "
      f"{m['t_ms'][1]:.2f} | **{m['t1_over_floor']:.2f}** | "
      + ' | '.join(f"{m['cost'][k]:.2f}" for k in KS[1:]) + ' |'
      for name, m in floor['models'].items()] + [
      '', '## Decoding layouts (XLA:CPU)', '',
      f"8 ReLU MLP blocks at T5 1.1-base widths ({layout['bytes'] / 1e6:.0f} "
      'MB float32), one call on k rows, medians of '
      f'{4 * args.repeats}.', '',
      '| layout | t(1) ms | cost(2) | cost(4) | cost(8) |',
      '|---|---|---|---|---|'] + [
      f"| {name} | {v['t1_ms']:.2f} | " + ' | '.join(
          f"{v['cost'][k]:.2f}" for k in (2, 4, 8)) + ' |'
      for name, v in layout['variants'].items()] + [
      '', '## Loop overhead: target as its own drafter (alpha = 1)', '',
      'Per iteration: (speculative decode time - encoder/cache set-up of both '
      'models) / iterations. "parts" = t(2-token catch-up) + (gamma-1) '
      't(1) + t_target(gamma+1), what one iteration runs; "paper" = '
      'gamma t(1) + t_target(gamma+1).', '',
      '| gamma | cost(gamma+1) | iterations | measured ms/iter | parts ms | '
      'vs parts | paper ms | vs paper |',
      '|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    lines.append(
        f"| {r['gamma']} | {r['cost']:.2f} | {r['iterations']} | "
        f"{r['per_iter_ms']:.2f} | {r['parts_ms']:.2f} | "
        f"{r['overhead_vs_parts']:+.1%} | {r['paper_ms']:.2f} | "
        f"{r['overhead_vs_paper']:+.1%} |")
  lines += ['', f'Encoder + cache set-up (once per decode, per model): '
            f'{t_init*1e3:.2f} ms. Baseline greedy per token: '
            f"{rows[0]['baseline_per_token_ms']:.2f} ms."]
  result = dict(head, target=costs.TARGET_DESCRIPTION,
                drafter=costs.DRAFTER_NAME,
                t_target_ms={k: v * 1e3 for k, v in t_target.items()},
                t_draft_ms={k: v * 1e3 for k, v in t_draft.items()},
                c=c, t_init_ms=t_init * 1e3, loop=rows, floor=floor,
                layouts=layout)
  profile, path = costs.write_results(
      args.out_dir, result, '\n'.join(lines) + '\n', args.profile_dir)
  print('\n'.join(lines))
  print(f'profile {profile.name}: {path}')


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
