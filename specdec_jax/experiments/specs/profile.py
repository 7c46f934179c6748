"""Profile: this device's hardware profile for a model set, measured.

What every prediction rests on (`hardware.HardwareProfile`), as the
older device run's first phase measured it: t(1), a 1-token call of the
target at batch 1, and cost(k) = t(k) / t(1) for k in `KS` (a chain's
gamma + 1 up to 9, token trees' widths beyond); the bandwidth floor, the
decoder's step bytes over the bandwidth of a compiled copy loop (what
t(1) would be, were it bound by memory alone); c = t_draft / t(1) of every
drafter of the model set Table 3 offers (its T5 drafters and the
model-free kinds it can build: `measure.drafter_token_time`, per token at
gamma 4); and one level of the token trees `TREES` of its first T5
drafter (`measure.tree_level_time`: the mean over the levels). Each cell
measures one of these on its setup, built as the eval job builds it
(nothing decoded), after half the output length, each timing loop
compiled as the decode loops are. `--models xxl_cost`: at T5 1.1-XXL target cost.
"""

import jax

from specdec_jax import hardware
from specdec_jax import measure
from specdec_jax import speculative
from specdec_jax.bench import report
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.experiments import reproduce
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table
from specdec_jax.experiments.specs import table3

KS = tuple(range(1, 10)) + (17, 33, 61, 65)
TREES = ('beam:8,4,12/64', 'beam:4,2,8')
GAMMA = 4
SHRUNK = dict(top_k=3, trees=('beam:2,2,3',))


def cells(options, tasks):
  top, trees = (SHRUNK['top_k'], SHRUNK['trees']) if options.shrink else (
      KS[-1], TREES)
  first, task = sweep.model_set(options).t5_drafters()[0], tasks[0]
  cell = lambda name, what, measured, **changes: sweep.Cell(
      task, name, changes, {'measurement': what}, (measured,))
  return ([cell(first, 't(k)', 'target', max_gamma=top - 1)] +
          [cell(d, 'c', 'drafter', gamma=GAMMA)
           for d in table3.drafters(options)] +
          [cell(first, 'tree level', 'tree_level', drafter='tree', tree=t,
                gamma=shape_lib.parse(t).depth) for t in trees])


def _at(loaded, inputs, repeats):
  """Rows and timing keywords: batch 1 at `unit_loop.call_times`' point."""
  context = max(loaded.setup.data.task_feature_lengths['targets'] // 2, 1)
  return inputs[:1], dict(context=context, repeats=repeats, jit_setup=True)


def target(loaded, inputs, timing_repeats):
  """t(k) for the `KS` up to max_gamma + 1, the bandwidth and floor."""
  rows, kw = _at(loaded, inputs, timing_repeats)
  ks = [k for k in KS if k <= loaded.setup.batch.max_gamma + 1]
  t = measure.cost_curve(loaded.target, loaded.target_params, rows, ks, **kw)
  step = measure.step_bytes(loaded.target, loaded.target_params, 1,
                            kw['context'], rows.shape[1])
  # 4 steps' bytes, above an H100's L2 and a CPU core's L3, at most 2 GiB.
  bandwidth = measure.bandwidth(int(min(2048, max(128, 4 * step / 2**20))),
                                repeats=timing_repeats)
  floor_ms = 1e3 * step / bandwidth['bytes_per_s']
  cfg = loaded.target.config
  return dict(
      context=kw['context'], t_ms={str(k): 1e3 * s for k, s in t.items()},
      cost={str(k): s / t[1] for k, s in t.items()}, bandwidth=bandwidth,
      floor=dict(step_bytes=step, floor_ms=floor_ms,
                 ratio=1e3 * t[1] / floor_ms),
      target=(f'emb {cfg.emb_dim}, {cfg.num_encoder_layers}+'
              f'{cfg.num_decoder_layers} layers, {cfg.dtype} weights, '
              f'{cfg.activation_dtype or cfg.dtype} activations, input '
              f'{rows.shape[1]}, batch 1'))


def drafter(loaded, inputs, timing_repeats):
  """The drafter's seconds per drafted token at its gamma."""
  rows, kw = _at(loaded, inputs, timing_repeats)
  return dict(context=kw['context'], ms=1e3 * measure.drafter_token_time(
      loaded.drafter, speculative.with_target(
          loaded.drafter, loaded.draft_params, loaded.target_params),
      rows, loaded.setup.gamma, **kw))


def tree_level(loaded, inputs, timing_repeats):
  """One level of the drafter's tree, the mean over its levels."""
  rows, kw = _at(loaded, inputs, timing_repeats)
  shape = loaded.drafter.shape
  return dict(context=kw['context'], levels=shape.depth - 1,
              fed=[len(f) for f in shape.fed], ms=1e3 * measure.tree_level_time(
                  loaded.drafter, loaded.draft_params, rows, **kw))


DRAFTER = sweep.DRAFT_FIELDS + ('gamma',)
MEASUREMENTS = {'target': (target, sweep.TARGET_FIELDS),
                'drafter': (drafter, DRAFTER),
                'tree_level': (tree_level, DRAFTER)}


def _ms(row):
  """The row's figure: t(1), a drafted token's or a tree level's ms."""
  m = row['measured']
  return m['target']['t_ms']['1'] if 'target' in m else (
      next(iter(m.values()))['ms'])


def details(row):
  """The cost curve and floor, or what a drafter's figure is of."""
  m = row['measured']
  if 'target' in m:
    t = m['target']
    return (', '.join(f'{k}: {c:.2f}' for k, c in t['cost'].items()) +
            f"; floor {t['floor']['floor_ms']:.3f} ms (t(1) / floor "
            f"{t['floor']['ratio']:.2f})")
  if 'tree_level' in m:
    return (f"mean of {m['tree_level']['levels']} levels, fed nodes "
            f"{sorted(set(m['tree_level']['fed']))}")
  return f"per drafted token, gamma {row['gamma']}"


def path_of(result, out):
  """Where the profile goes: beside shrunk results; a complete xxl_cost run
  on an accelerator, specdec_jax/profiles/; else results/<device>/."""
  name = report.device_name()
  if result['shrunk']:
    return out.parent / f'{out.name}.profile.json'
  if (result['models'] == 'xxl_cost' and jax.default_backend() != 'cpu'
      and not result['failed'] and not result['skipped']):
    return hardware.path_of(name)
  return table.RESULTS / name / f"profile_{result['models']}.json"


def finish(result, out):
  """Each row's figure over t(1); the profile, written (`path_of`)."""
  rows = result['rows']
  t = next((r['measured']['target'] for r in rows
            if 'target' in r['measured']), None)
  if t is None:
    result['hardware_profile'] = None  # the failed cell says why
    return
  t1 = t['t_ms']['1']
  for r in rows:
    r['over_t1'] = _ms(r) / t1
  c = {reproduce.profile_name(result['models'], r['drafter'],
                              result['shrunk']): r['over_t1']
       for r in rows if 'drafter' in r['measured']}
  profile = hardware.HardwareProfile(
      name=report.device_name(), device=jax.devices()[0].device_kind,
      target=f"{result['models']} target: {t['target']}", t1_ms=t1,
      floor_ms=t['floor']['floor_ms'], bandwidth=t['bandwidth']['bytes_per_s'],
      launch_ms=min((r['measured']['drafter']['ms'] for r in rows
                     if 'drafter' in r['measured']), default=None),
      cost={1: {int(k): v for k, v in t['cost'].items()}}, c={1: c},
      source=f"{result.get('out', out)}.json", command=result['command'],
      date=result['date'])
  path = report.write_json(path_of(result, out), dict(
      profile.to_json(), tree_level_ms={r['tree']: _ms(r) for r in rows
                                        if 'tree_level' in r['measured']}))
  result['hardware_profile'] = report.portable(str(path)).replace(
      str(out), result.get('out', str(out)))  # beside gs:// results: there


SPEC = sweep.Spec(
    name='profile',
    title="Profile: this device's t(1), cost(k), floor, c and tree levels",
    about=__doc__.split('\n\n', 1)[1] + (
        '\nms: t(1), a drafted token, or a tree level; / t(1): c for a '
        "drafter. The profile (json, `hardware.load`) is the results' "
        '`hardware_profile`; its `tree_level_ms` holds the tree levels.'),
    cells=cells,
    columns=(('measured', 'measurement'),
             ('drafter', lambda r: '-' if 'target' in r['measured'] else
              r['drafter']),
             ('tree', 'tree'), ('ms', lambda r: f'{_ms(r):.4g}'),
             ('/ t(1)', 'over_t1'),
             ('cost(k) / what', details)),
    timing_repeats=5,  # each figure a median of 5 timed loops
    shrunk=dict(num_examples=1, timing_repeats=1, tasks=('en_de',)),
    measurements=MEASUREMENTS,
    decode=False,
    finish=finish,
)
