r"""Measures trained mini models and ships the chosen ones as the default.

  # 1. measure every candidate (alpha on test inputs, the paper's Table 3
  #    protocol; the target's validation loss / accuracy and BLEU / ROUGE)
  python scripts/ship_models.py measure --export_dir ~/models/shipped/export \
      --arrays ~/.cache/specdec_jax/arrays --out results/drafters_alpha.json
  # 2. copy the chosen ones into specdec_jax/assets/mini (bf16 T5X
  #    checkpoints, vocabulary, test slices, models.json, MANIFEST.json)
  python scripts/ship_models.py ship --export_dir ~/models/shipped/export \
      --arrays ~/.cache/specdec_jax/arrays --models target,dec2_fkl,small_fkl \
      --measured results/drafters_alpha.json

`--export_dir` is the `export` folder of scripts/train_shipped_models.py.
Alpha is measured as in measure.alpha: the target decodes the test inputs
(greedy for t = 0, sampled for t = 1), and beta = sum_x min(p, q) is pooled
over every output position up to EOS. Runs on CPU in float32 (the bf16
weights are cast up).
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_DIRS = {'en_de': 'debian_desc_en_de', 'synopsis': 'debian_synopsis'}
DECODE_LEN = {'en_de': 64, 'synopsis': 32}
ROLES = {'xxl': 'target (mini T5-XXL role, multi-task)',
         'small': 'drafter, T5-small role (emb 64, 1+1 layers)',
         'base': 'drafter, T5-base role (emb 128, 2+2 layers)',
         'large': 'drafter, T5-large role (emb 192, 3+3 layers)',
         'dec1': 'GPU-shaped drafter cut from the target (2 encoder, 1 '
                 'decoder layer)',
         'dec2': 'GPU-shaped drafter cut from the target (2 encoder, 2 '
                 'decoder layers)'}


def _load(export_dir, name):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import checkpoints, network  # pylint: disable=g-import-not-at-top
  with open(os.path.join(export_dir, 'models.json')) as f:
    entry = json.load(f)['models'][name]
  fields = dict(entry['config'])
  fields['mlp_activations'] = tuple(fields['mlp_activations'])
  config = network.T5Config(dtype='float32', **fields)
  params = checkpoints.load_t5x_params(
      os.path.join(export_dir, entry['checkpoint']), config=config,
      dtype=jnp.float32)
  return network.T5Model(config), params, entry


def _batches(x, batch_size):
  for start in range(0, len(x), batch_size):
    chunk = x[start:start + batch_size]
    pad = batch_size - len(chunk)
    batch = np.pad(chunk, ((0, pad), (0, 0)))
    if pad:
      batch[len(chunk):, 0] = 1
    yield batch, len(chunk)


def measure_alpha(target, tparams, model, params, inputs, decode_len,
                  temperature, batch_size, seed=0):
  """Pooled alpha and its standard error over `inputs`."""
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import drafters, measure  # pylint: disable=g-import-not-at-top
  from specdec_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top
  betas = []
  for i, (batch, n) in enumerate(_batches(inputs, batch_size)):
    res = measure.alpha(target, tparams, drafters.T5Drafter(model), params,
                        batch, sampling=SamplingConfig(temperature=temperature),
                        max_decode_len=decode_len,
                        rng=jax.random.key(seed * 1000 + i))
    # Drop the padding rows' positions: they come last in row order.
    lengths = np.asarray(res['lengths'])
    keep = int(np.minimum(lengths[:n], decode_len).sum())
    betas.append(np.asarray(res['betas'])[:keep])
  b = np.concatenate(betas)
  return dict(alpha=float(b.mean()), se=float(b.std() / np.sqrt(len(b))),
              positions=int(len(b)))


def quality(target, tparams, inputs, refs, decode_len, task, batch_size):
  """Greedy BLEU (en_de) or ROUGE (synopsis) of the target."""
  from specdec_jax import decoding, tasks  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(
      model_file=os.path.join(tasks.resolve_data_dir(), 'sentencepiece.model'))
  outs = []
  for batch, n in _batches(inputs, batch_size):
    out = decoding.temperature_sample(target, tparams, batch,
                                      max_decode_len=decode_len)
    outs += [np.asarray(r) for r in np.asarray(out.tokens)[:n]]
  text = lambda ids: sp.decode([int(t) for t in ids if t > 1])
  preds = [text(o) for o in outs]
  targets = [text(r) for r in refs]
  return (tasks.bleu(targets, preds) if task == 'en_de'
          else tasks.rouge(targets, preds)), preds[:3]


def cmd_measure(args):
  from specdec_jax import arrays, training  # pylint: disable=g-import-not-at-top
  names = args.candidates.split(',')
  target, tparams, tentry = _load(args.export_dir, 'target')
  result = dict(command='python scripts/ship_models.py ' + ' '.join(
      sys.argv[1:]), num_examples=args.num_examples, target=tentry,
                tasks={})
  for task, task_dir in TASK_DIRS.items():
    test = arrays.load(os.path.join(args.arrays, task_dir), 'test')
    inputs = test['inputs'][:args.num_examples]
    row = {}
    val = arrays.load(os.path.join(args.arrays, task_dir), 'validation')
    row['target_validation'] = training.evaluate(
        target, tparams, arrays.eval_batches(val, 64, args.val_examples))
    row['target_quality'], row['samples'] = quality(
        target, tparams, inputs, test['targets'][:args.num_examples],
        DECODE_LEN[task], task, args.batch_size)
    print(task, row['target_validation'], row['target_quality'], flush=True)
    row['alpha'] = {}
    for name in names:
      model, params, _ = _load(args.export_dir, name)
      row['alpha'][name] = {}
      for temperature in (0.0, 1.0):
        tic = time.perf_counter()
        row['alpha'][name][f't{temperature:g}'] = measure_alpha(
            target, tparams, model, params, inputs, DECODE_LEN[task],
            temperature, args.batch_size)
        print(task, name, temperature, row['alpha'][name][f't{temperature:g}'],
              f'{time.perf_counter() - tic:.0f}s', flush=True)
    result['tasks'][task] = row
    with open(args.out, 'w') as f:
      json.dump(result, f, indent=1)
  print('wrote', args.out)


def cmd_ship(args):
  from specdec_jax import arrays, shipped, tasks  # pylint: disable=g-import-not-at-top
  out = args.assets or shipped.ASSETS_DIR
  if os.path.isdir(out):
    shutil.rmtree(out)
  os.makedirs(os.path.join(out, 'data', 'arrays'))
  with open(os.path.join(args.export_dir, 'models.json')) as f:
    exported = json.load(f)
  measured = {}
  if args.measured:
    with open(args.measured) as f:
      measured = json.load(f)
  models = {}
  for name in args.models.split(','):
    entry = exported['models'][name]
    ship_name = 'target' if name == 'target' else name.rsplit('_', 1)[0]
    src = os.path.join(args.export_dir, entry['checkpoint'])
    dst = os.path.join(out, ship_name, os.path.basename(src))
    shutil.copytree(src, dst)
    alpha = {task: row['alpha'].get(name) for task, row in
             measured.get('tasks', {}).items() if name in row['alpha']}
    models[ship_name] = dict(
        role=ROLES[entry['kind']], trained_as=name, config=entry['config'],
        checkpoint=f'{ship_name}/{os.path.basename(src)}', step=entry['step'],
        validation=entry['validation'], alpha=alpha or None)
  data_dir = tasks.resolve_data_dir()
  for task, task_dir in TASK_DIRS.items():
    test = arrays.load(os.path.join(args.arrays, task_dir), 'test')
    n = args.slice_examples
    arrays.save(os.path.join(out, 'data', 'arrays', f'{task}_test.npz'),
                {'inputs': test['inputs'][:n], 'targets': test['targets'][:n]})
    os.makedirs(os.path.join(out, 'data', task_dir))
    with open(os.path.join(data_dir, task_dir, 'test.jsonl'),
              encoding='utf-8') as f, open(
                  os.path.join(out, 'data', task_dir, 'test.jsonl'), 'w',
                  encoding='utf-8') as g:
      g.writelines(line for _, line in zip(range(n), f))
  shutil.copy(os.path.join(data_dir, 'sentencepiece.model'),
              os.path.join(out, 'data'))
  with open(os.path.join(out, shipped.MODELS), 'w') as f:
    json.dump(dict(models=models, target_training=exported.get('target'),
                   produced_by=exported.get('command')), f, indent=1)
    f.write('\n')
  shipped.write_manifest(out)
  total = sum(e['bytes'] for e in shipped.manifest_entries(out).values())
  print(f'shipped {list(models)} to {out}: {total / 1e6:.1f} MB')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('command', choices=('measure', 'ship'))
  parser.add_argument('--export_dir', required=True)
  parser.add_argument('--arrays', required=True)
  parser.add_argument('--candidates',
                      default='small_fkl,large_fkl,dec1_fkl,dec2_fkl')
  parser.add_argument('--num_examples', type=int, default=256)
  parser.add_argument('--val_examples', type=int, default=1024)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--out', default='results/drafters_alpha.json')
  parser.add_argument('--models', default='target,dec2_fkl,small_fkl')
  parser.add_argument('--measured', default=None)
  parser.add_argument('--assets', default=None,
                      help='default specdec_jax/assets/mini')
  parser.add_argument('--slice_examples', type=int, default=256)
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  {'measure': cmd_measure, 'ship': cmd_ship}[args.command](args)


if __name__ == '__main__':
  main()
