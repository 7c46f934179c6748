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
`ship` replaces the shipped T5s and data slices and keeps the method
weights already shipped (heads/, lookahead/: the 'methods' of models.json,
from scripts/train_heads.py and scripts/train_pass.py); MANIFEST.json
covers both.
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
import tempfile
import time

import numpy as np

from specdec_jax import checks
from specdec_jax import data
from specdec_jax import task_table
from specdec_jax.bench import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# short name -> its data folder, and the output length the per-task mini
# models are trained and evaluated at (the task table's).
TASK_DIRS = {name: entry.task['mini']
             for name, entry in task_table.TASKS.items()}
DECODE_LEN = {name: entry.lengths['mini']['targets']
              for name, entry in task_table.TASKS.items()}
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
  from specdec_jax import checkpoints, network, shipped  # pylint: disable=g-import-not-at-top
  with open(os.path.join(export_dir, 'models.json')) as f:
    entry = json.load(f)['models'][name]
  config = shipped.t5_config(entry['config'])
  params = checkpoints.load_t5x_params(
      os.path.join(export_dir, entry['checkpoint']), config=config,
      dtype=jnp.float32)
  return network.T5Model(config), params, entry


def measure_alpha(target, tparams, model, params, inputs, decode_len,
                  temperature, batch_size, seed=0):
  """Pooled alpha and its standard error over `inputs`."""
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import drafters, measure  # pylint: disable=g-import-not-at-top
  from specdec_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top
  betas = []
  for i, (_, n, batch) in enumerate(data.batches(inputs, batch_size, 'eos')):
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
  """Greedy BLEU (en_de) or ROUGE (synopsis) of the target.

  `refs` are the reference texts as written (not tokenized and decoded
  back: pieces outside the vocabulary would then match in both)."""
  from specdec_jax import decoding, tasks  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(
      model_file=os.path.join(tasks.resolve_data_dir(), 'sentencepiece.model'))
  outs = []
  for _, n, batch in data.batches(inputs, batch_size, 'eos'):
    out = decoding.temperature_sample(target, tparams, batch,
                                      max_decode_len=decode_len)
    outs += [np.asarray(r) for r in np.asarray(out.tokens)[:n]]
  text = lambda ids: sp.decode([int(t) for t in ids if t > 1])
  preds = [text(o) for o in outs]
  targets = list(refs)
  return (tasks.bleu(targets, preds) if task == 'en_de'
          else tasks.rouge(targets, preds)), preds[:3]


def _reference_texts(task_dir, n):
  """The first n references of the test split, as written (its jsonl)."""
  from specdec_jax import tasks  # pylint: disable=g-import-not-at-top
  key = 'de' if task_dir == TASK_DIRS['en_de'] else 'synopsis'
  with open(os.path.join(tasks.resolve_data_dir(), task_dir, 'test.jsonl'),
            encoding='utf-8') as f:
    return [json.loads(line)[key] for _, line in zip(range(n), f)]


# What the files read are, as their refusals say.
EXPORTED = ('the models.json of scripts/train_shipped_models.py (an object '
            'whose "models" maps a name to its kind, config, checkpoint, '
            'step and validation)')
MEASURED = ('the json of `ship_models.py measure` (an object of its '
            '"command", "num_examples" and "tasks": en_de and synopsis, '
            'each with the target\'s validation and the alpha by drafter)')
SHIPPED_SET = ('a shipped models.json (an object whose "methods" maps a '
               'name to its checkpoint)')


def _read_json(flag, path, what):
  """The JSON of the file `path` of `flag`; InputError naming it and `what`
  it should be where it is a folder or not JSON (not there: the
  FileNotFoundError)."""
  if os.path.isdir(path):
    raise checks.InputError(f'{flag}: {path} is a folder, not {what}.')
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except ValueError as e:  # not JSON, or not text
    raise checks.InputError(f'{flag}: {path} is not {what}: {e}') from None


def _exported(export_dir):
  """The export folder's models.json, checked (InputError naming it)."""
  if os.path.exists(export_dir) and not os.path.isdir(export_dir):
    raise checks.InputError(f'--export_dir {export_dir} is a file, not the '
                            'export folder of scripts/train_shipped_models.py.')
  path = os.path.join(export_dir, 'models.json')
  exported = _read_json('--export_dir', path, EXPORTED)
  models = exported.get('models') if isinstance(exported, dict) else None
  if not isinstance(models, dict) or not all(
      isinstance(e, dict) and {'kind', 'config', 'checkpoint', 'step',
                               'validation'} <= set(e)
      and isinstance(e['config'], dict) and isinstance(e['checkpoint'], str)
      for e in models.values()):
    raise checks.InputError(f'--export_dir: {path} is not {EXPORTED}.')
  return exported


def _measured(path, report=False):
  """The --measured file, checked (InputError naming it): its "tasks" of
  alpha by drafter; for `report`, all the report reads."""
  measured = _read_json('--measured', path, MEASURED)
  tasks = measured.get('tasks') if isinstance(measured, dict) else None
  good = isinstance(tasks, dict) and all(
      isinstance(row, dict) and isinstance(row.get('alpha', {}), dict)
      for row in tasks.values())
  figures = lambda x, keys: isinstance(x, dict) and all(
      isinstance(x.get(k), (int, float)) for k in keys)
  if good and report:
    good = {'command', 'num_examples'} <= set(measured) and set(
        tasks) <= set(PAPER_T0) and all(
            figures(row.get('target_validation'), ('loss', 'accuracy'))
            and all(isinstance(by_t, dict) and all(
                figures(by_t.get(t), ('alpha', 'se')) for t in ('t0', 't1'))
                    for by_t in row.get('alpha', {}).values())
            for row in tasks.values())
  if not good:
    raise checks.InputError(f'--measured: {path} is not {MEASURED}.')
  return measured


def _check_names(flag, names, exported):
  """Raises InputError unless every name of `flag` is an exported model."""
  unknown = [n for n in names if n not in exported['models']]
  if unknown or not names:
    raise checks.InputError(
        f'{flag}: {unknown or "no name"} of the exported models '
        f"{sorted(exported['models'])} expected.")


def _check_vocabulary(exported, names):
  """Raises InputError unless the data dir's SentencePiece model is the
  models' vocabulary (its pieces, padded to a multiple of 128 at most): a
  data dir of another vocabulary fails only when its text is decoded."""
  from specdec_jax import tasks  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  path = os.path.join(tasks.resolve_data_dir(), 'sentencepiece.model')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'No SentencePiece model {path} in the data dir.')
  pieces = spm.SentencePieceProcessor(model_file=path).get_piece_size()
  for name in names:
    size = exported['models'][name]['config']['vocab_size']
    if not pieces <= size < pieces + 128:
      raise checks.InputError(
          f'{path} has {pieces} pieces, but model {name} has vocab_size '
          f'{size}: the data dir is of another vocabulary (set '
          'SPECDEC_DATA_DIR to the data the models were trained on).')


def _check_out_file(flag, path):
  """Makes the folder of the output file `path`, or raises InputError."""
  if os.path.isdir(path):
    raise checks.InputError(f'{flag} {path!r} is a folder, not a file.')
  folder = os.path.dirname(os.path.abspath(path))
  checks.check_no_file_in_the_way(flag, folder)
  os.makedirs(folder, exist_ok=True)


def _need_arrays(args):
  """Raises InputError without --arrays, FileNotFoundError without a test
  split of each task."""
  from specdec_jax import arrays  # pylint: disable=g-import-not-at-top
  if not args.arrays:
    raise checks.InputError(f'{args.command} needs --arrays (the folder of '
                            'scripts/export_arrays.py).')
  for task_dir in TASK_DIRS.values():
    arrays.split_files(os.path.join(args.arrays, task_dir), 'test')


def cmd_measure(args):
  from specdec_jax import arrays, training  # pylint: disable=g-import-not-at-top
  names = [n for n in args.candidates.split(',') if n]
  exported = _exported(args.export_dir)
  _check_names('--candidates', names, exported)
  _need_arrays(args)
  _check_vocabulary(exported, ['target'] + names)
  _check_out_file('--out', args.out)
  target, tparams, tentry = _load(args.export_dir, 'target')
  from specdec_jax.bench import report  # pylint: disable=g-import-not-at-top
  result = dict(command=report.portable(
      'python scripts/ship_models.py ' + ' '.join(sys.argv[1:])),
                num_examples=args.num_examples, target=tentry,
                tasks={})
  for task, task_dir in TASK_DIRS.items():
    test = arrays.load(os.path.join(args.arrays, task_dir), 'test')
    inputs = test['inputs'][:args.num_examples]
    row = {}
    val = arrays.load(os.path.join(args.arrays, task_dir), 'validation')
    row['target_validation'] = training.eval_loss(
        target, tparams, arrays.array_eval_batches(val, 64, args.val_examples))
    row['target_quality'], row['samples'] = quality(
        target, tparams, inputs, _reference_texts(task_dir,
                                                  args.num_examples),
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


def shipped_methods(out):
  """The method weights shipped in `out`: (models.json 'methods', their
  top folders). Shipping keeps both.

  Raises:
    InputError: its models.json is not one, or a listed method's
      checkpoint folder is missing.
  """
  from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  path = os.path.join(out, shipped.MODELS)
  if not os.path.isfile(path):
    return {}, set()
  index = _read_json('--assets', path, SHIPPED_SET)
  methods = index.get('methods', {}) if isinstance(index, dict) else None
  if not isinstance(methods, dict) or not all(
      isinstance(e, dict) and isinstance(e.get('checkpoint'), str)
      for e in methods.values()):
    raise checks.InputError(f'--assets: {path} is not {SHIPPED_SET}.')
  missing = [e['checkpoint'] for e in methods.values()
             if not os.path.isdir(os.path.join(out, e['checkpoint']))]
  if missing:
    raise checks.InputError(
        f'{path} lists method weights that are not there: {missing}; '
        'restore them before shipping.')
  return methods, {e['checkpoint'].split('/')[0] for e in methods.values()}


def check_assets(out):
  """Raises InputError unless `out` is missing, empty or a shipped set
  (models.json or MANIFEST.json): shipping replaces the folder whole."""
  from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  checks.check_no_file_in_the_way('--assets', out)
  names = set(os.listdir(out)) if os.path.isdir(out) else set()
  if names and not names & {shipped.MODELS, shipped.MANIFEST}:
    raise checks.InputError(
        f'--assets {out!r} holds files but no shipped set ({shipped.MODELS} '
        f'or {shipped.MANIFEST}): shipping would replace them; give an '
        'empty or new folder, or a shipped one.')
  if names & {'heads', 'lookahead'} and shipped.MODELS not in names:
    raise checks.InputError(
        f'--assets {out!r} holds method weights (heads/, lookahead/) but no '
        f'{shipped.MODELS} listing them: restore it (git checkout) before '
        'shipping, or they would be dropped.')


def swap_in(new, out):
  """Puts the complete folder `new` where `out` is; the old one is removed
  only once `new` is in place."""
  old = None
  if os.path.lexists(out):
    old = new + '.old'
    os.rename(out, old)
  os.rename(new, out)
  if old:
    shutil.rmtree(old)


def write_index(out, models, methods, exported):
  """models.json ('models', the kept 'methods', provenance) and
  MANIFEST.json of every file under `out` (method weights included)."""
  from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  from specdec_jax.bench import report  # pylint: disable=g-import-not-at-top
  index = dict(models=models)
  if methods:
    index['methods'] = methods
  index.update(target_training=exported.get('target'),
               produced_by=exported.get('command'))
  with open(os.path.join(out, shipped.MODELS), 'w') as f:
    f.write(report.portable(json.dumps(index, indent=1)) + '\n')
  shipped.write_manifest(out)


def cmd_ship(args):
  from specdec_jax import arrays, shipped, tasks  # pylint: disable=g-import-not-at-top
  out = os.path.abspath(args.assets or shipped.ASSETS_DIR)
  # Every input is checked (and read) before the folder is touched.
  check_assets(out)
  methods, keep = shipped_methods(out)
  exported = _exported(args.export_dir)
  names = [n for n in args.models.split(',') if n]
  _check_names('--models', names, exported)
  ship_name = lambda n: 'target' if n == 'target' else n.rsplit('_', 1)[0]
  if len({ship_name(n) for n in names}) < len(names):
    raise checks.InputError(f'--models {args.models!r}: two of one kind '
                            '(each ships as its kind, e.g. dec2).')
  clash = sorted({ship_name(n) for n in names} & (keep | {'data'}))
  if clash:
    raise checks.InputError(
        f'cannot ship models named {clash}: the folder holds shipped method '
        'weights or the data')
  sources = {n: os.path.join(args.export_dir,
                             exported['models'][n]['checkpoint'])
             for n in names}
  for src in sources.values():
    if not os.path.isdir(src):
      raise FileNotFoundError(f'No exported checkpoint {src}.')
  measured = {'tasks': {}}
  if args.measured:
    measured = _measured(args.measured)
  models = {}
  for name in names:
    entry = exported['models'][name]
    if entry['kind'] not in ROLES:
      raise checks.InputError(f'--models: {name} is of kind '
                              f"{entry['kind']!r}, none of {sorted(ROLES)}.")
    alpha = {task: row['alpha'].get(name) for task, row in
             measured['tasks'].items() if name in row.get('alpha', {})}
    models[ship_name(name)] = dict(
        role=ROLES[entry['kind']], trained_as=name, config=entry['config'],
        checkpoint=f'{ship_name(name)}/{os.path.basename(sources[name])}',
        step=entry['step'], validation=entry['validation'],
        alpha=alpha or None)
  _need_arrays(args)
  n = args.slice_examples
  tests = {task: arrays.load(os.path.join(args.arrays, task_dir), 'test')
           for task, task_dir in TASK_DIRS.items()}
  data_dir = tasks.resolve_data_dir()
  data_files = [os.path.join(data_dir, 'sentencepiece.model')] + [
      os.path.join(data_dir, task_dir, 'test.jsonl')
      for task_dir in TASK_DIRS.values()]
  for path in data_files:
    if not os.path.isfile(path):
      raise FileNotFoundError(f'No {path} in the data dir (SPECDEC_DATA_DIR '
                              'or ~/.cache/specdec_jax/debian).')

  # Built beside `out` and swapped in whole: a failure leaves `out` as it was.
  os.makedirs(os.path.dirname(out), exist_ok=True)
  new = tempfile.mkdtemp(prefix=f'.{os.path.basename(out)}-',
                         dir=os.path.dirname(out))
  try:
    if os.path.isdir(out):
      shutil.copymode(out, new)
    else:
      os.chmod(new, 0o755)
    for name in keep:
      shutil.copytree(os.path.join(out, name), os.path.join(new, name))
    os.makedirs(os.path.join(new, 'data', 'arrays'))
    for name, src in sources.items():
      shutil.copytree(src, os.path.join(new, models[ship_name(name)][
          'checkpoint']))
    for task, task_dir in TASK_DIRS.items():
      test = tests[task]
      arrays.save(os.path.join(new, 'data', 'arrays', f'{task}_test.npz'),
                  {'inputs': test['inputs'][:n],
                   'targets': test['targets'][:n]})
      os.makedirs(os.path.join(new, 'data', task_dir))
      with open(os.path.join(data_dir, task_dir, 'test.jsonl'),
                encoding='utf-8') as f, open(
                    os.path.join(new, 'data', task_dir, 'test.jsonl'), 'w',
                    encoding='utf-8') as g:
        g.writelines(line for _, line in zip(range(n), f))
    shutil.copy(data_files[0], os.path.join(new, 'data'))
    write_index(new, models, methods, exported)
    swap_in(new, out)
  finally:
    if os.path.isdir(new):
      shutil.rmtree(new)
  total = sum(e['bytes'] for e in shipped.manifest_entries(out).values())
  print(f'shipped {list(models)} (kept methods {list(methods)}) to {out}: '
        f'{total / 1e6:.1f} MB')


PAPER_T0 = {'en_de': {'small': .75, 'base': .80, 'large': .82},
            'synopsis': {'small': .65, 'base': .73, 'large': .74}}
GOALS = 'best drafter alpha(t=0) >= 0.70 (en_de), >= 0.65 (synopsis); a ' \
        'GPU-shaped drafter >= 0.6'


def cmd_report(args):
  """The --out file's .md (default results/drafters_alpha.md: before /
  after) and, with --export_dir, the training report beside it
  (training_shipped.{md,png})."""
  from specdec_jax.bench import report  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiments import plots  # pylint: disable=g-import-not-at-top
  from specdec_jax.bench import at_xxl_cost  # pylint: disable=g-import-not-at-top
  profile = flags.profile_of(args)
  after = _measured(args.measured, report=True)
  # The training report's models.json, read before anything is written.
  exported = _exported(args.export_dir) if args.export_dir else None
  md = os.path.splitext(args.out)[0] + '.md'
  folder = os.path.dirname(md)
  _check_out_file('--out', md)
  # Before: the record of the retired reproduce_table3 script (the table3
  # spec, python -m specdec_jax.experiments run table3 --models mini, now
  # measures that table in its own format).
  with open(os.path.join(REPO, 'results', 'retired', 'table3_mini.json')) as f:
    before = json.load(f)
  lines = ['# Drafter agreement before and after distillation', '',
           f"After: `{after['command']}` (results/drafters_alpha.json), "
           f"{after['num_examples']} test inputs per task, float32 on CPU "
           '(bf16 weights cast up).  ',
           'Before: results/retired/table3_mini.json (written by the retired '
           'reproduce_table3 script; per-task mini models trained '
           'on 2 CPU cores for 500-2000 steps on the references), same '
           'protocol (measure.alpha: the target decodes the test inputs, '
           'beta = sum_x min(p, q) pooled over every output position).', '',
           f'Goals (issue): {GOALS}.', '',
           '| task | drafter | before t=0 | before t=1 | after t=0 | after '
           f't=1 | paper t=0 | predicted {profile.name} speed-up, t=0 '
           '(gamma) |',
           '|---|---|---|---|---|---|---|---|']
  for task, row in after['tasks'].items():
    old = before['alpha'][task]
    for name, by_t in row['alpha'].items():
      kind = name.rsplit('_', 1)[0]
      b0 = old['0'].get(kind, [None])[0]
      b1 = old['1'].get(kind, [None])[0]
      fmt = lambda v: '-' if v is None else f'{v:.3f}'
      a0, a1 = by_t['t0'], by_t['t1']
      pred = at_xxl_cost.predict(profile, a0['alpha'], kind)
      lines.append(
          f"| {task} | {name} | {fmt(b0)} | {fmt(b1)} | {a0['alpha']:.3f} "
          f"+- {a0['se']:.3f} | {a1['alpha']:.3f} +- {a1['se']:.3f} | "
          f"{PAPER_T0[task].get(kind, '-')} | "
          f'{at_xxl_cost.cell(pred)} |')
  lines += ['', 'The last column is the speed-up at t=0 with the after t=0 '
            'alpha (drafter <kind>_fkl taken as <kind>). '
            + at_xxl_cost.note(profile), '',
            '## The target, before and after', '',
            '| task | model | validation loss | validation accuracy | greedy '
            'quality (first 256 test inputs, results/retired/table3_*.json) |',
            '|---|---|---|---|---|']
  table3 = {}  # the same quality protocol as before: Table 3's
  path = os.path.join(REPO, 'results', 'retired', 'table3_shipped.json')
  if os.path.isfile(path):
    with open(path) as f:
      table3 = json.load(f)
  old_training = {}
  path = os.path.join(REPO, 'results', 'training.json')
  if os.path.isfile(path):
    with open(path) as f:
      old_training = json.load(f)
  for task, row in after['tasks'].items():
    old_q = before.get('quality', {}).get(task, {})
    old_q = next((v for k, v in old_q.items() if k.startswith('target')),
                 {})
    old_v = _old_validation(old_training, task)
    lines.append(f"| {task} | before: per-task mini-XXL | "
                 f"{old_v.get('loss', float('nan')):.3f} | "
                 f"{old_v.get('accuracy', float('nan')):.3f} | "
                 + ', '.join(f'{k} {v:.1f}' for k, v in old_q.items()) + ' |')
    v = row['target_validation']
    new_q = next((q for k, q in table3.get('quality', {}).get(task, {})
                  .items() if k.startswith('target')), None)
    lines.append(f"| {task} | after: shipped multi-task target | "
                 f"{v['loss']:.3f} | {v['accuracy']:.3f} | "
                 + (', '.join(f'{k} {x:.1f}' for k, x in new_q.items())
                    if new_q else 'not in results/retired/table3_shipped.json; '
                    '`python -m specdec_jax.experiments run table3 '
                    '--num_examples 256` gives it '
                    '(baseline_metrics of its t = 0 rows)') + ' |')
  report.write_md(md, '\n'.join(lines) + '\n')
  if not args.export_dir:
    print(f'wrote {md} (no --export_dir: no training report)')
    return
  # Training report of the runs behind the shipped models.
  runs = list(exported['models'])
  png = os.path.join(folder, 'training_shipped.png')
  plots.plot_losses([os.path.join(args.export_dir, n, 'log.jsonl')
                     for n in runs], png, labels=runs)
  lines = ['# Training and distillation of the shipped models', '',
           'Trained on one H100 by scripts/train_shipped_models.py from the '
           'pre-tokenized arrays of scripts/export_arrays.py (batch 128, '
           'Adafactor, rsqrt schedule; see gin_configs/train/'
           'shipped_recipe.gin). Commands and what each run did: README '
           '"Shipped models". Curves: training_shipped.png (validation of the '
           'drafters is on the target\'s greedy outputs of the validation '
           'inputs, so their validation accuracy is a teacher-forced greedy '
           'alpha).', '',
           '| run | steps | validation loss | validation accuracy | last '
           'train beta (t=1 alpha on train batches) | steps/s |',
           '|---|---|---|---|---|---|']
  for name in runs:
    m = exported['models'][name]
    v, t = m['validation'] or {}, m.get('train') or {}
    beta = f"{t['beta']:.3f}" if t.get('beta') is not None else '-'
    lines.append(f"| {name} | {m['step']} | {v.get('loss', 0):.3f} | "
                 f"{v.get('accuracy', 0):.3f} | {beta} | "
                 f"{t.get('steps_per_sec', 0):.1f} |")
  lines += ['', '## Commands', '',
            'Both calls ran on one H100 (scripts/train_shipped_models.py; '
            'arrays from `python scripts/export_arrays.py --out_dir ARRAYS`).',
            '', '1. `python scripts/train_shipped_models.py --arrays ARRAYS '
            '--work_dir W --target_seconds 180 --drafter_seconds 120 '
            '--gen_batch 1024` (target lr sweep 0.003 / 0.01 / 0.03 side by '
            'side; of its drafters only small_ce was used, as the seed of '
            'small_fkl below)',
            '2. `' + report.portable(exported.get('command') or '?') +
            '` (the seeds are call 1\'s lr-0.03 target at step 2575 and its '
            'small_ce at step 2080)', '',
            'Then `python scripts/ship_models.py measure / ship / report` '
            '(README "Shipped models").']
  with open(os.path.join(folder, 'training_shipped.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
  print(f'wrote {md}, ' + os.path.join(folder, 'training_shipped.{md,png}'))


def _old_validation(old_training, task):
  """The per-task mini-XXL's validation of results/training.json."""
  for row in old_training.get('rows', []):
    if row.get('model') == f'{task}_mini_xxl':
      return {'loss': row['val_loss'], 'accuracy': row['val_accuracy']}
  return {}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('command', choices=('measure', 'ship', 'report'))
  parser.add_argument('--export_dir', type=checks.local_path, default=None,
                      help='the export folder of '
                      'scripts/train_shipped_models.py (measure, ship; '
                      'report: for the training report)')
  parser.add_argument('--arrays', default=None)
  parser.add_argument('--candidates',
                      default='small_fkl,large_fkl,dec1_fkl,dec2_fkl')
  parser.add_argument('--num_examples', type=checks.count, default=256)
  parser.add_argument('--val_examples', type=checks.count, default=1024)
  parser.add_argument('--batch_size', type=checks.count, default=32)
  parser.add_argument('--out', type=checks.local_path,
                      default='results/drafters_alpha.json',
                      help='measure: its json; report: its .md, and the '
                      'training report beside it')
  parser.add_argument('--models', default='target,dec2_fkl,small_fkl')
  parser.add_argument('--measured', default=None,
                      help='the json of measure (ship: optional; report)')
  parser.add_argument('--assets', default=None,
                      help='default specdec_jax/assets/mini')
  parser.add_argument('--slice_examples', type=checks.count, default=256)
  flags.add_prediction_flags(parser, repredict=False)
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  if args.command != 'report' and not args.export_dir:
    parser.error(f'{args.command} needs --export_dir')
  if args.command == 'report' and not args.measured:
    parser.error('report needs --measured (the json of measure)')
  {'measure': cmd_measure, 'ship': cmd_ship,
   'report': cmd_report}[args.command](args)


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
