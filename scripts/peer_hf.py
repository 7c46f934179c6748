r"""Ours vs HF transformers: greedy and speculative/assisted, same weights.

  python scripts/peer_hf.py --gin_file=<eval run, e.g. a trained target and
      drafter on debian_desc_en_de> [--gin.NAME=VALUE ...] \
      [--num_examples 50] [--out results/peer_hf]

Takes the same gin files and bindings as the eval job (target, drafter,
checkpoints, task, TASK_FEATURE_LENGTHS; drafter must be 't5'), converts both
models to HF `T5ForConditionalGeneration` (float32, torch CPU) and decodes the
first examples of the split, batch 1, greedy, four ways:
  ours baseline     decoding.temperature_sample (jitted while_loop)
  ours speculative  speculative.speculative_sample (gamma = GAMMA)
  HF greedy         model.generate(do_sample=False)
  HF assisted       model.generate(assistant_model=draft, do_sample=False)
Each example is decoded by all four, interleaved, after one warm-up example;
tokens/s = generated tokens / total seconds. Greedy outputs must agree token
for token; mismatches are counted and reported, not hidden. Writes <out>.md
and <out>.json.
"""

import argparse
import sys
import time

import jax
import numpy as np

from specdec_jax import data
from specdec_jax import decoding
from specdec_jax import gin_utils
from specdec_jax import loading
from specdec_jax import speculative
from specdec_jax import widening
from specdec_jax.bench import report
from specdec_jax.checkpoints import hf as hf_lib


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--num_examples', type=int, default=50)
  parser.add_argument('--out', default='results/peer_hf')
  own, rest = parser.parse_known_args(argv)
  setup = loading.setup_from_flags(
      gin_utils.parse_flags(rest, 'python scripts/peer_hf.py'))
  if not setup.draft.drafter_kind.needs_model:
    raise SystemExit('peer_hf compares T5 drafters only (DRAFTER = "t5").')
  loaded = loading.build(setup)  # target widened if asked: bigger cost
  task, target, t_params = loaded.task, loaded.target, loaded.target_params
  drafter, d_params = loaded.drafter, loaded.draft_params
  hf_target = hf_lib.to_hf_model(t_params, target.config)
  hf_draft = hf_lib.to_hf_model(d_params, drafter.model.config)
  max_in = setup.task_feature_lengths['inputs']
  max_out = setup.task_feature_lengths['targets']
  gamma = setup.gamma

  def ours_base(x):
    r = decoding.temperature_sample(target, t_params, x,
                                    max_decode_len=max_out)
    return np.asarray(jax.block_until_ready(r).tokens[0])

  def ours_spec(x):
    r = speculative.speculative_sample(target, t_params, drafter, d_params, x,
                                       gamma=gamma, max_decode_len=max_out)
    return np.asarray(jax.block_until_ready(r).tokens[0])

  methods = {
      'ours baseline': ours_base,
      'ours speculative': ours_spec,
      'HF greedy': lambda x: hf_lib.generate(hf_target, x, max_out, 1),
      'HF assisted': lambda x: hf_lib.generate(hf_target, x, max_out, 1,
                                               hf_draft, gamma),
  }
  seconds = {k: 0.0 for k in methods}
  tokens = {k: 0 for k in methods}
  mismatches = {k: 0 for k in methods}
  examples = list(data.task_examples(
      task, setup.split, setup.task_feature_lengths, own.num_examples + 1,
      setup.truncate_inputs))
  for n, (_, ids, _, _) in enumerate(examples):
    x = data.pad_rows([ids], max_in)
    outs = {}
    for name, fn in methods.items():
      start = time.perf_counter()
      outs[name] = fn(x)
      elapsed = time.perf_counter() - start
      if n > 0:  # example 0 is the warm-up (compilation)
        seconds[name] += elapsed
        tokens[name] += int(decoding.output_lengths(outs[name][None], 1)[0])
    if n > 0:
      for name in methods:
        mismatches[name] += int(not np.array_equal(outs[name],
                                                   outs['ours baseline']))
  rows = []
  hf_greedy_tps = tokens['HF greedy'] / seconds['HF greedy']
  for name in methods:
    tps = tokens[name] / seconds[name]
    rows.append(dict(method=name, seconds=seconds[name], tokens=tokens[name],
                     tokens_per_s=tps, vs_hf_greedy=tps / hf_greedy_tps,
                     examples_differing_from_ours_baseline=mismatches[name]))
  ours_gain = rows[1]['tokens_per_s'] / rows[0]['tokens_per_s']
  hf_gain = rows[3]['tokens_per_s'] / rows[2]['tokens_per_s']
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  head = report.header('scripts/peer_hf.py', argv)
  lines = [
      '# Ours vs HF transformers (greedy, batch 1, same weights)', '',
      f"Command: `{head['command']}`  ",
      f"Machine: {head['machine']}; torch {torch.__version__} "
      f'({torch.get_num_threads()} threads), transformers '
      f'{transformers.__version__}', '',
      f"Task {setup.mixture_or_task_name} ({setup.split}), "
      f"{own.num_examples} examples after one warm-up, gamma {gamma}; "
      f"target widened to {setup.target_widen_to or 'nothing (as trained)'}"
      f" ({widening.param_count(t_params):,} parameters).", '',
      '| method | tokens/s | vs HF greedy | examples differing from ours '
      'baseline |', '|---|---|---|---|']
  for r in rows:
    lines.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | "
                 f"{r['vs_hf_greedy']:.2f}x | "
                 f"{r['examples_differing_from_ours_baseline']} |")
  lines += ['', f'Speculative gain: ours {ours_gain:.2f}x over our baseline; '
            f'HF assisted {hf_gain:.2f}x over HF greedy.']
  report.write_md(own.out + '.md', '\n'.join(lines) + '\n')
  report.write_json(own.out + '.json', dict(
      head, torch=torch.__version__, transformers=transformers.__version__,
      rows=rows, ours_gain=ours_gain, hf_gain=hf_gain))
  print('\n'.join(lines))


if __name__ == '__main__':
  main()
