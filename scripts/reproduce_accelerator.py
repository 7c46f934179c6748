r"""Table 2 at T5-XXL cost on one accelerator, with bf16 numerics made explicit.

  python scripts/reproduce_accelerator.py --source shipped   # trained models
  python scripts/reproduce_accelerator.py                    # SYNTHETIC
  python scripts/reproduce_accelerator.py --source shipped --project
  python scripts/reproduce_accelerator.py --smoke --out_dir /tmp/acc  # CPU

Needs jax, flax, numpy, matplotlib and this package importable (installed,
or the repository on PYTHONPATH); nothing on its path imports seqio,
TensorFlow, gin or rouge-score. One process in a time budget
(`--max_minutes`, 9): the full run fits one 9-minute call on one H100; what
does not fit is skipped, in priority order, and listed.

Models. synthetic: a random T5 1.1-small S0 widened function-preservingly
to T5 1.1-XXL cost is the target; drafters are S0 plus sigma x std(leaf)
noise (sigma sets alpha) widened to T5 1.1-small / base / large cost, and
n-grams of S0's outputs; it measures the engine, not a drafter. shipped:
`specdec_jax.shipped`'s target widened to XXL cost, each drafter at its own
cost and (small / base / large) widened to that T5 1.1 cost, n-grams of the
test arrays' targets. --smoke: tiny models (S0 a one-layer T5 1.1-tiny, the
shipped target its smallest model), nothing widened, every phase: about a
minute and a half on two CPU cores, seconds with a warm compilation cache.

Phases (`results/<device>/accelerator_<source>.{md,json}`, written after
every step; the hardware profile of a full shipped run to bench/profiles/,
of any other run beside its results): costs (t(k) for k <= max_gamma + 1,
the floor, c of every drafter, alpha calibrated on the unwidened models);
Table 2 at batch 1 for both tasks and temperatures, every drafter, gamma by
the paper's rule (`bench.hardware.predict` maximised), measured against
`predict` on the profile of this run's own measurements, greedy rows
compared and every differing one diagnosed; the gamma sweep of the first
drafter (t = 0, first task); numerics (bfloat16 / float32 activations
against the 1-token and the same-shape baseline); batches 8 and 32; the
cost curve (t(k) at `curve_ks` at batch 1, up to k = 16 at larger batches).

Fitting 9 minutes: every program is compiled ahead of time, once, in
`bench.budget.Pool` threads: first all that need no gamma (beside the alpha
calibration), then, once c and the gammas are known, the speculative ones.
One program per (drafter, gamma, temperature, batch), shared by the tasks;
per example the baseline and every drafter of a temperature are timed in
alternating order (`measure.time_alternating`), so one baseline serves
every row and the sweep; caches are built by compiled programs.
`--compilation_cache` (jax's persistent cache, which also shares XLA's
autotuning results between programs) lets a second run read them from disk.

Projection (`projection` in the json; printed first; `--project` only
prints it): the full plan's units per kind (programs compiled, calibration
decodes, t(k) and drafter timings, decode calls of the table and sweep, of
the numerics, of the batches) times that kind's seconds per unit in a
measured run's time log (`--project_from`: the H100 run in results/),
`bench.budget.projected_seconds`: compiles and calibration as measured
thread-seconds over the threads (no more than the run had), the rest in
sequence. The number of speculative programs follows from the gammas the
rule picks on that run's calibrated alphas, c and costs (one per row for a
drafter it did not time). A smoke run projects the full run.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import pathlib
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import arrays
from specdec_jax import decoding
from specdec_jax import diagnostics
from specdec_jax import drafters as drafters_lib
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import speculative
from specdec_jax import widening
from specdec_jax.bench import budget
from specdec_jax.bench import hardware
from specdec_jax.bench import models
from specdec_jax.bench import report
from specdec_jax.bench import rows as rows_lib
from specdec_jax.experiments.reproduce import PAPER_TABLE2
from specdec_jax.experiments.reproduce import PAPER_TABLE3
from specdec_jax.sampling import SamplingConfig

SCRIPT = 'scripts/reproduce_accelerator.py'
ROOT = pathlib.Path(__file__).resolve().parents[1]
H100_RUN = f'results/{hardware.H100}/accelerator_shipped.json'
SYNTHETIC_LABEL = (
    'SYNTHETIC: random T5 1.1-small widened to T5 1.1-XXL cost as the target, '
    'noisy copies of it as drafters (alpha set by the noise), not trained '
    'models')
# sigma -> greedy alpha: 0.01 -> 0.90, 0.02 -> 0.76, 0.04 -> 0.57.
SIGMAS = {'small': 0.02, 'base': 0.016, 'large': 0.013}
PAPER_TASK = {'synthetic': 'EnDe', 'en_de': 'EnDe', 'synopsis': 'CNNDM'}
T5_SIZES, TEMPS, ACTS = ('small', 'base', 'large'), (0.0, 1.0), (
    'bfloat16', 'float32')
PHASES = ('table2', 'numerics', 'batches', 'sweep', 'cost_curve')
# The context cache of the t(k) timings, compiled ahead of time like them.
CACHE = jax.jit(measure.context_cache, static_argnums=(0, 3, 4))

# What differs between a full run and --smoke. costs: cost name -> the
# dimensions models are widened to, or None (nothing widened); target: the
# shipped model that is the target.
Sizes = collections.namedtuple('Sizes', (
    's0 costs target input_length output_length batches curve_ks sweep '
    'max_gamma examples repeats numerics_examples calib_examples '
    'ngram_examples context copy_mib cost_repeats ngram_orders'))
FULL = Sizes(
    s0=models.CONFIGS['t5_1_1_small'], costs=widening.PRESETS,
    target='target', input_length=64, output_length=128, batches=(1, 8, 32),
    curve_ks=(16, 32, 64), sweep=tuple(range(1, 9)), max_gamma=8,
    examples=16,
    repeats=1, numerics_examples=4, calib_examples=8, ngram_examples=64,
    context=64, copy_mib=2048, cost_repeats=5, ngram_orders=(1, 2))
# The cost curve at batch > 1 stops here (wide trees are a batch-1 tool).
BATCH_CURVE_MAX = 16
# Tiny models, nothing widened (the synthetic T5 drafters share S0's
# shapes: one program; the shipped target is the smallest shipped model);
# one example decodes for the calibration and the n-grams (the table's
# baseline program).
SMOKE = FULL._replace(
    s0=models.config('t5_1_1_tiny', vocab_size=256, num_encoder_layers=1,
                     num_decoder_layers=1), costs=None, target='small',
    input_length=8, output_length=10, batches=(1, 2), curve_ks=(2,),
    sweep=(1, 2), max_gamma=1, examples=2, numerics_examples=2,
    calib_examples=1, ngram_examples=1, context=4, copy_mib=4, cost_repeats=1,
    ngram_orders=(2,))


@dataclasses.dataclass
class Draft:
  """A drafter of the table. group 1: the paper's drafters at T5 1.1 cost
  (and the first shipped one), 2: own-cost T5s, 3: n-grams; `proxy`: the
  unwidened model its alpha is calibrated with (the same function)."""
  name: str
  cost: str
  proxy: str
  paper: Optional[str]
  group: int
  label: str = ''
  drafter: Any = None
  params: Dict[str, Any] = dataclasses.field(default_factory=dict)


def roster(source: str, names: Sequence[str], s: Sizes) -> List[Draft]:
  """The drafters of a run, before any model is loaded."""
  out = [Draft(n, f't5_1_1_{n}_cost', n, n, 1) for n in T5_SIZES
         ] if source == 'synthetic' else []
  for n in (n for n in names if n != 'target'):
    out.append(Draft(n, 'own', n, n if n in T5_SIZES else None,
                     2 if n in T5_SIZES else 1))
    if n in T5_SIZES:
      out.append(Draft(f'{n}@t5_1_1_{n}_cost', f't5_1_1_{n}_cost', n, n, 1))
  out += [Draft(n, 'own', n, n, 3, n) for order, n in (
      (1, 'unigram'), (2, 'bigram')) if order in s.ngram_orders]
  return sorted(out, key=lambda d: d.group)  # stable: the paper's first


def clip(alpha: float) -> float:
  return min(max(float(alpha), 0.0), 1.0)


def tasks_of(source: str) -> List[str]:
  return ['synthetic'] if source == 'synthetic' else ['en_de', 'synopsis']


def programs(s: Sizes, drafts, tasks, gammas, phases, act: str):
  """{part: (keys compiled before the gammas are known, keys after)}.

  Keys: ('copy',), ('reference',), ('cache', act, batch), ('call', act,
  batch, k), ('draft', name, batch), ('base', act, batch, temp, block),
  ('spec', act, name, batch, gamma, temp); `gammas` (task, name, temp) ->
  gamma, a row missing from it has a program of its own.
  """
  main, big = drafts[0].name, [b for b in s.batches if b > 1]
  g = lambda task, n, t: gammas.get((task, n, t)) or ('?', task, n, t)
  g0 = g(tasks[0], main, 0.0)
  k0 = g0 + 1 if isinstance(g0, int) else ('?', g0)
  out = {'costs': ([('copy',), ('reference',), ('cache', act, 1)] + [
      ('call', act, 1, k) for k in range(1, s.max_gamma + 2)] + [
          ('draft', d.name, 1) for d in drafts], [])}
  for t in TEMPS if 'table2' in phases else ():
    out[f'table2@{t:g}'] = ([('base', act, 1, t, 1)], [
        ('spec', act, d.name, 1, g(task, d.name, t), t)
        for task in tasks for d in drafts])
  if 'sweep' in phases:
    out['sweep'] = ([('base', act, 1, 0.0, 1)],
                    [('spec', act, main, 1, x, 0.0) for x in s.sweep])
  if 'numerics' in phases:
    out['numerics'] = ([x for a in ACTS for x in (
        ('base', a, 1, 0.0, 1), ('cache', a, 1), ('call', a, 1, 1))], [
            x for a in ACTS for x in (('base', a, 1, 0.0, k0), (
                'spec', a, main, 1, g0, 0.0), ('call', a, 1, k0))])
  if 'batches' in phases:
    out['batches'] = ([x for b in big for x in (
        ('base', act, b, 0.0, 1), ('cache', act, b), ('call', act, b, 1),
        ('draft', main, b))], [x for b in big for x in (
            ('spec', act, main, b, g0, 0.0), ('call', act, b, k0))])
  if 'cost_curve' in phases:
    out['cost_curve'] = ([('cache', act, b) for b in s.batches] + [
        ('call', act, b, k) for b in s.batches for k in curve(s, b)],
                         [])
  return out


def curve(s: Sizes, b: int) -> tuple:
  """The k of the cost curve at batch b: every `curve_ks` at batch 1 (the
  token trees' widths), those up to `BATCH_CURVE_MAX` at larger batches."""
  return (1, *(k for k in s.curve_ks if b == 1 or k <= BATCH_CURVE_MAX))


def plan_units(s: Sizes, drafts, tasks, gammas, phases, act: str):
  """The plan's units per kind of step (`budget.unit_seconds`' kinds)."""
  keys = {k for a, b in programs(s, drafts, tasks, gammas, phases,
                                 act).values() for k in a + b}
  table, g0 = 'table2' in phases, gammas.get((tasks[0], drafts[0].name, 0.0))
  calls = lambda n, decoders: (n * s.repeats + 1) * decoders
  sweep = 0 if 'sweep' not in phases else len(s.sweep) if not table else (
      len(set(s.sweep) - {g0}) - (g0 is None))  # beside the table's gamma
  decoders = [len(drafts) * table + sweep * (task == tasks[0] and t == 0)
              for task in tasks for t in TEMPS]
  count = lambda kind: sum(k[0] == kind for k in keys)
  return dict(
      setup=1, compile=len(keys), calibration=len(tasks) * len(TEMPS),
      bandwidth=1, calls=count('call'), drafters=count('draft'),
      decode=sum(calls(s.examples, 1 + n) for n in decoders if n),
      numerics=len(ACTS) * calls(s.numerics_examples, 3) * (
          'numerics' in phases),
      batch_decode=sum(calls(1, 2) for b in s.batches if b > 1) * (
          'batches' in phases))


def project(prev_path: str, s: Sizes, drafts, tasks, phases, act: str,
            workers: Optional[int], of: str) -> Dict[str, Any]:
  """The projected wall time of a plan (the module docstring)."""
  prev = report.read_json(ROOT / prev_path)  # an absolute path stays itself
  profile = hardware.from_accelerator_run(prev, prev_path)
  alphas = {(a['task'], a['drafter'], a['temperature']): a['alpha']
            for a in prev.get('alpha_calibration', [])}
  gammas = {(task, d.name, t): hardware.predict(
      profile, alpha=clip(alphas[task, d.proxy, t]), drafter=d.name,
      max_gamma=s.max_gamma).gamma for task in tasks for t in TEMPS
            for d in drafts if (task, d.proxy, t) in alphas and
            d.name in profile.drafters(1)}
  units = plan_units(s, drafts, tasks, gammas, phases, act)
  out = budget.projected_seconds(prev, units, workers, source=prev_path)
  out.update(of=of, gammas_from_previous_run=len(gammas), plan=units)
  print(f"projected wall time of {of} on {out['device']}: {out['seconds']:.0f}"
        f' s (from {prev_path}: ' + ', '.join(
            f"{k} {v['units']} x {v['unit_s']:g} s"
            for k, v in out['by_kind'].items()) + ')', flush=True)
  return out


def bf16(params):
  return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.bfloat16),
                                params)


@jax.jit
def perturbed(params, sigma, seed):
  """Each leaf plus sigma x std(leaf) Gaussian noise (a synthetic drafter)."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree_util.tree_unflatten(tree, [
      x + sigma * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys)])


def random_inputs(rng, n: int, length: int, vocab: int) -> np.ndarray:
  """n rows of random ids in [2, vocab), EOS (1) last."""
  x = rng.integers(2, vocab, (n, length)).astype(np.int32)
  x[:, -1] = 1
  return x


def load_shipped():
  """The shipped models' module, or a clear exit."""
  try:
    from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit(f'--source shipped needs specdec_jax/shipped.py, which '
                     f'cannot be imported: {e}. Use --source synthetic.'
                     ) from None
  if not shipped.available():
    raise SystemExit('--source shipped: specdec_jax.shipped.available() is '
                     'False (no shipped models in this checkout). Use '
                     '--source synthetic.')
  return shipped


class Runner:
  """Builds the models, compiles, runs the phases in order, writes results."""

  def __init__(self, args, sizes: Sizes, clock: budget.Clock,
               pool: budget.Pool, out_dir: pathlib.Path, header):
    self.args, self.s, self.clock, self.pool = args, sizes, clock, pool
    self.act, self.synthetic = args.activation_dtype, (
        args.source == 'synthetic')
    self.out_dir, self.stem = out_dir, out_dir / f'accelerator_{args.source}'
    self.t_ms: Dict[Any, Dict[int, float]] = {}  # (act, batch) -> {k: ms}
    self.t_draft_ms: Dict[Any, float] = {}  # (name, batch) -> ms
    self.alpha_cal: Dict[Any, float] = {}  # (task, proxy, temp) -> alpha
    self.gamma: Dict[Any, int] = {}  # (task, name, temp) -> gamma
    self.caches, self.decode_s, self.profile = {}, {}, None
    self.result = dict(
        **header, source=args.source, synthetic=self.synthetic,
        label=SYNTHETIC_LABEL if self.synthetic else
        'shipped trained models (specdec_jax.shipped)',
        smoke=bool(args.smoke), status='running', setup={}, bandwidth={},
        floor={}, costs={}, drafters={}, table2=[], numerics=[], batches=[],
        sweep=[], skipped=clock.skipped, time_log=clock.log,
        compile_misses=[])

  # -- models ----------------------------------------------------------------

  def widen(self, model, params, cost: str):
    """(model, params) widened to `cost` (as they are without costs)."""
    cfg = self.s.costs and widening.widened_config(
        model.config, dict(self.s.costs[cost]))
    if not cfg or cfg == model.config:
      return model, params
    return network.T5Model(cfg), widening.widen(params, model.config, cfg)

  def setup(self) -> None:
    start, s = time.perf_counter(), self.s
    self.drafts = roster(self.args.source, [] if self.synthetic else
                         load_shipped().model_names(), s)
    self.tasks = tasks_of(self.args.source)
    n = max(max(s.batches), s.examples, s.numerics_examples)
    self.proxies = {}
    (self._synthetic if self.synthetic else self._shipped)(n)
    self.by_name = {d.name: d for d in self.drafts}
    model, params = self.target
    self.targets = {a: (network.T5Model(model.config.replace(
        activation_dtype=None if a == 'bfloat16' else a)), params)
                    for a in ACTS}
    if self.args.fused:  # q/k/v, cross k/v and the MLP inputs: one matmul
      self.targets = {a: network.for_decoding(*t)
                      for a, t in self.targets.items()}
      for d in self.drafts:
        if isinstance(d.drafter, drafters_lib.T5Drafter):
          cfg = d.drafter.model.config
          d.params = {t: network.fuse_params(p, cfg)
                      for t, p in d.params.items()}
          d.drafter = drafters_lib.T5Drafter(network.T5Model(
              cfg.replace(fused_projections=True)))
    self.main, (model, params) = self.drafts[0], self.targets[self.act]
    self.max_len = s.context + max(s.max_gamma + 1, *s.curve_ks) + 8
    self.result['main_drafter'] = self.main.name
    self.result['setup'].update(
        target_config=report.config_dict(model.config),
        target_params=widening.param_count(params),
        decoder_params=widening.param_count(params['decoder']),
        decoder_bytes=measure.tree_bytes(params['decoder']),
        weights_dtype='bfloat16', activation_dtype=self.act,
        input_length=self.Li, output_length=self.T, eos_id=self.eos,
        tasks=self.tasks, fused=bool(self.args.fused),
        sizes={k: v for k, v in s._asdict().items() if k not in (
            's0', 'costs')},
        drafters={d.name: dict(label=d.label, cost=d.cost, group=d.group,
                               paper=d.paper) for d in self.drafts})
    self.clock.note('setup: models, widening, inputs',
                    time.perf_counter() - start, kind='setup')

  def _synthetic(self, n: int) -> None:
    s, seed, v = self.s, self.args.seed, self.s.s0.vocab_size
    model = network.T5Model(s.s0)
    init = jax.jit(model.init_params)(jax.random.key(seed))
    self.small, self.eos = (model, bf16(init)), -1
    self.T = self.args.output_length or s.output_length
    self.Li = self.args.input_length or s.input_length
    rng = np.random.default_rng(seed)
    self.inputs = {'synthetic': random_inputs(rng, n, self.Li, v)}
    self.calib = {'synthetic': random_inputs(rng, s.calib_examples, self.Li,
                                             v)}
    self.target = self.widen(*self.small, 't5_1_1_xxl_cost')
    sigmas = self.result['setup']['sigmas'] = dict(SIGMAS, **self.args.sigma)
    for i, d in enumerate(x for x in self.drafts if x.group == 1):
      noisy = bf16(perturbed(init, sigmas[d.name], seed + 1 + i))
      self.proxies[d.name] = (drafters_lib.T5Drafter(model),
                              {'synthetic': noisy})
      dm, dp = self.widen(model, noisy, d.cost)
      d.label = f'{d.name} (sigma {sigmas[d.name]:g}) at T5 1.1-{d.name} cost'
      d.drafter, d.params = drafters_lib.T5Drafter(dm), {'synthetic': dp}
    out = decoding.temperature_sample(
        *self.small, random_inputs(rng, s.ngram_examples, self.Li, v),
        max_decode_len=self.T, eos_id=self.eos)
    self._ngrams({'synthetic': np.asarray(out.tokens)}, v)

  def _ngrams(self, targets: Dict[str, np.ndarray], vocab: int) -> None:
    for d in (d for d in self.drafts if d.group == 3):
      order = 1 if d.name == 'unigram' else 2
      d.drafter = drafters_lib.NgramDrafter(vocab, order)
      d.params = {task: drafters_lib.ngram_params(
          [row[row > 0] for row in rows], vocab, order)
                  for task, rows in targets.items()}
      self.proxies[d.name] = (d.drafter, d.params)

  def _shipped(self, n: int) -> None:
    shipped, s, smoke = load_shipped(), self.s, self.args.smoke

    def load(name):
      model, params = shipped.load_model(name, dtype=jnp.bfloat16)
      return network.T5Model(model.config.replace(
          dtype='bfloat16', dropout_rate=0.0)), bf16(params)

    self.small, self.eos = load(s.target), 1
    vocab = self.small[0].config.vocab_size
    data = {t: shipped.test_arrays(t) for t in self.tasks}
    widest = lambda key: max(a[key].shape[1] for a in data.values())
    self.Li = self.args.input_length or (
        s.input_length if smoke else widest('inputs'))
    self.T = self.args.output_length or (
        s.output_length if smoke else min(128, widest('targets')))
    self.inputs, self.calib, ngram_rows, notes = {}, {}, {}, []
    for task, a in data.items():
      x = arrays.fit(np.asarray(a['inputs']), self.Li)
      if x.shape[0] < n:  # repeat rows to fill the batches
        notes.append(f'{task}: {x.shape[0]} test rows, repeated to {n}')
        x = np.resize(x, (n, x.shape[1]))
      self.inputs[task], rest = x[:n], x[n:n + s.calib_examples]
      self.calib[task] = rest if len(rest) else x[:s.calib_examples]
      targets = np.asarray(a['targets'])
      if len(targets) - n - s.calib_examples >= 16:
        targets = targets[n + s.calib_examples:]
      else:
        notes.append(f'{task}: n-grams from all {len(targets)} target rows')
      ngram_rows[task] = targets
    self.result['setup']['notes'] = notes
    self.target = self.widen(*self.small, 't5_1_1_xxl_cost')
    own, skipped = {}, []
    for d in [d for d in self.drafts if d.group != 3]:
      dm, dp = own[d.proxy] = own.get(d.proxy) or load(d.proxy)
      if dm.config.vocab_size != vocab:
        skipped.append(f'{d.name}: vocab {dm.config.vocab_size} != {vocab}')
        self.drafts.remove(d)
        continue
      self.proxies[d.proxy] = (drafters_lib.T5Drafter(dm),
                               {t: dp for t in self.tasks})
      c = dm.config
      d.label = (f'{d.name} (own cost: emb {c.emb_dim}, {c.num_encoder_layers}'
                 f'+{c.num_decoder_layers} layers)' if d.cost == 'own' else
                 f'{d.proxy} -> T5 1.1-{d.proxy} cost')
      dm, dp = self.widen(dm, dp, d.cost) if d.cost != 'own' else (dm, dp)
      d.drafter, d.params = drafters_lib.T5Drafter(dm), {
          t: dp for t in self.tasks}
    self.result['setup']['skipped_drafters'] = skipped
    self._ngrams(ngram_rows, vocab)

  # -- programs --------------------------------------------------------------

  def shape(self, batch: int):
    return jax.ShapeDtypeStruct((batch, self.Li), jnp.int32)

  def x(self, task: str, batch: int, start: int = 0):
    return jnp.asarray(self.inputs[task][start:start + batch])

  def sample(self, key, task, x, rng, lower=False):
    """Runs (or lowers) the decoding program `key` ('base' / 'spec')."""
    kind, act, *rest = key
    head, temp = tuple(self.targets[act]), rest[-2 if kind == 'base' else -1]
    fn, extra = decoding.temperature_sample, dict(block_size=rest[-1])
    if kind == 'spec':
      d = self.by_name[rest[0]]
      head += (d.drafter, d.params[task])
      fn, extra = speculative.speculative_sample, dict(gamma=rest[2])
    if lower:
      fn, rng = fn.lower, (jax.random.key(0) if temp else None)
    return fn(*head, x, max_decode_len=self.T, sampling=SamplingConfig(temp),
              eos_id=self.eos, rng=rng, **extra)

  def lowering(self, key):
    """A call with no arguments that lowers the program `key`."""
    kind, task, ctx = key[0], self.tasks[0], self.s.context
    model, params = self.targets[key[1] if kind in (
        'cache', 'call', 'base', 'spec') else self.act]
    if kind == 'copy':
      x = jax.ShapeDtypeStruct(((self.s.copy_mib << 20) // 4,), jnp.float32)
      return lambda: measure.copy_passes.lower(x, 1)
    if kind == 'reference':
      tokens = jax.ShapeDtypeStruct((1, self.T), jnp.int32)
      return lambda: diagnostics.lower_reference(model, params,
                                                 self.shape(1), tokens)
    if kind == 'cache':
      return lambda: CACHE.lower(model, params, self.shape(key[2]), ctx,
                                 self.max_len)
    if kind == 'call':
      return lambda: measure.lower_call_time(
          model, params, self.shape(key[2]), key[3], context=ctx,
          max_length=self.max_len)
    if kind == 'draft':
      d = self.by_name[key[1]]
      return lambda: measure.lower_drafter_token_time(
          d.drafter, d.params[task], self.shape(key[2]), 4, context=ctx)
    batch = key[2 if kind == 'base' else 3]
    return lambda: self.sample(key, task, self.shape(batch), None, True)

  def ident(self, key):
    """The program of `key`: names as their drafters (equal ones share)."""
    at = {'draft': 1, 'spec': 2}.get(key[0])
    return tuple(self.by_name[x].drafter if i == at else x
                 for i, x in enumerate(key))

  def compile(self, what: str, keys) -> int:
    return self.pool.compile(what, {self.ident(k): self.lowering(k)
                                    for k in keys})

  # -- measurements ----------------------------------------------------------

  def measure_calls(self, act: str, batch: int, ks) -> None:
    times = self.t_ms.setdefault((act, batch), {})
    ks, (model, params) = sorted(set(ks) - set(times)), self.targets[act]
    x, start = self.x(self.tasks[0], batch), time.perf_counter()
    if not ks:
      return
    if (act, batch) not in self.caches:
      self.caches[act, batch] = CACHE(model, params, x, self.s.context,
                                      self.max_len)
    for k in ks:
      times[k] = 1e3 * measure.call_time(
          model, params, x, k, repeats=self.s.cost_repeats,
          context=self.s.context, cache=self.caches[act, batch])
    self.clock.note(f'time t(k), {act} activations, batch {batch}, k = {ks}',
                    time.perf_counter() - start, kind='calls', units=len(ks))
    self.record()

  def measure_drafters(self, drafts, batch: int) -> None:
    todo = [d for d in drafts if (d.name, batch) not in self.t_draft_ms]
    x, start = self.x(self.tasks[0], batch), time.perf_counter()
    for d in todo:
      self.t_draft_ms[d.name, batch] = 1e3 * measure.drafter_token_time(
          d.drafter, d.params[self.tasks[0]], x, 4, jit_setup=True,
          repeats=self.s.cost_repeats, context=self.s.context)
    self.clock.note(f'time drafters, batch {batch}', time.perf_counter() -
                    start, kind='drafters', units=len(todo))
    self.record()

  def record(self) -> None:
    """costs, drafters and floor from the timings; the profile they make."""
    r, t1 = self.result, lambda b: self.t_ms.get((self.act, b), {}).get(1)
    r['costs'] = {}
    for (act, b), t in sorted(self.t_ms.items()):
      r['costs'].setdefault(act, {})[str(b)] = dict(
          t_ms={str(k): t[k] for k in sorted(t)},
          cost={str(k): t[k] / t[1] for k in sorted(t)} if 1 in t else {})
    r['drafters'] = {d.name: dict(label=d.label, cost=d.cost, t_draft_ms={
        str(b): ms for (n, b), ms in self.t_draft_ms.items() if n == d.name
    }, c={str(b): ms / t1(b) for (n, b), ms in self.t_draft_ms.items()
          if n == d.name and t1(b)}) for d in self.drafts}
    if t1(1) and r['bandwidth']:
      step = measure.step_bytes(*self.targets[self.act], 1, self.s.context,
                                self.Li)
      floor_ms = 1e3 * step / r['bandwidth']['bytes_per_s']
      r['floor'] = dict(step_bytes=step, floor_ms=floor_ms, t1_ms=t1(1),
                        ratio=t1(1) / floor_ms)
      self.profile = hardware.from_accelerator_run(
          r, report.portable(str(self.stem.with_suffix('.json'))))

  def calibration(self):
    """Jobs: alpha of every drafter's proxy per task and temperature, on
    the unwidened target's outputs (`measure.betas_on_outputs`)."""
    def job(task, temp):
      sampling = SamplingConfig(temp)
      out = decoding.temperature_sample(
          *self.small, self.calib[task], max_decode_len=self.T,
          sampling=sampling, eos_id=self.eos,
          rng=jax.random.key(7) if temp else None)
      return {key: float(np.mean(measure.betas_on_outputs(
          *self.small, drafter, p[task], self.calib[task], out.tokens,
          out.lengths, sampling=sampling)))
              for key, (drafter, p) in self.proxies.items()}
    return {(task, t): functools.partial(job, task, t)
            for task in self.tasks for t in TEMPS}

  # -- decoding --------------------------------------------------------------

  def alternate(self, task, keys, batch: int, examples: int, temp: float
                ) -> Dict[Any, rows_lib.Decoded]:
    """Every example decoded by every program, in alternating order."""
    results, seconds = {k: [] for k in keys}, dict.fromkeys(keys, 0.0)
    for i in range(examples):
      x, rng = self.x(task, batch, i * batch), (
          jax.random.key(1000 + i) if temp else None)
      calls = {k: functools.partial(self.sample, k, task, x, rng)
               for k in keys}
      if i == 0:  # each program's first run, untimed
        jax.block_until_ready([f() for f in calls.values()])
      out, t = measure.time_alternating(calls, self.s.repeats, i % 2 == 1)
      for k in keys:
        results[k].append(out[k])
        seconds[k] += t[k]
    self.decode_s[batch] = seconds[keys[0]] / examples
    return {k: rows_lib.Decoded(results[k], seconds[k]) for k in keys}

  def estimate(self, batch: int, examples: int, programs: int) -> float:
    """Seconds of `examples` x `programs` decodes (at most a baseline's)."""
    one = self.decode_s.get(batch) or 1.2e-3 * self.T * (
        self.t_ms.get((self.act, batch), {}).get(1) or 10.0)
    return (examples * self.s.repeats + 1) * programs * one

  def diagnose(self, act, task, batch, base, other) -> List[Dict[str, Any]]:
    return [dict(example=i * batch + dv.row, **dv.to_dict())
            for i, (b, o) in enumerate(zip(base.results, other.results))
            for dv in diagnostics.diagnose(
                *self.targets[act], np.asarray(self.x(task, batch, i * batch)),
                np.asarray(b.tokens), np.asarray(o.tokens))]

  def row(self, task, d: Draft, temp, gamma, base, spec, batch=1):
    """A Table 2 / sweep / batch row: measured, and `predict`ed."""
    cmp = rows_lib.compare(base, spec, greedy=temp == 0)
    del cmp['per_position_acceptance']
    p = hardware.predict(self.profile, alpha=clip(cmp['alpha']), gamma=gamma,
                         drafter=d.name, batch=batch)
    divs = self.diagnose(self.act, task, batch, base, spec) if not temp else []
    kinds = [dv['kind'] for dv in divs]
    return dict(
        task=task, drafter=d.name, label=d.label, cost=d.cost,
        temperature=temp, batch=batch, gamma=gamma, **cmp, c=p.c,
        cost_gamma_plus_1=p.cost, predicted=p.speedup, prediction=p.label,
        ratio=cmp['measured'] / p.speedup, per_row_accepted_length=[
            a / max(n, 1) + 1 for r in spec.results for a, n in zip(
                np.asarray(r.stats.accepted),
                np.asarray(r.stats.row_iterations))],
        iterations=cmp['target_calls'] / len(spec.results),
        mean_row_iterations=cmp['row_iterations'] / cmp['rows'],
        near_ties=None if temp else kinds.count(diagnostics.NEAR_TIE),
        mismatches=None if temp else kinds.count(diagnostics.MISMATCH),
        divergences=divs, activation_dtype=self.act)

  def paper(self, task: str, d: Draft, temp: float):
    task = PAPER_TASK[task]
    if d.paper in T5_SIZES:
      g, a, s = PAPER_TABLE2[task, int(temp)][d.paper]
      return dict(task=task, gamma=g, alpha=a, speedup=s)
    if d.paper in ('unigram', 'bigram'):
      return dict(task=task, alpha=PAPER_TABLE3[task][d.paper][int(temp)])
    return None

  def table(self, temp: float) -> None:
    """Table 2 rows of every task at `temp` (and the sweep, at t = 0)."""
    s, main, act = self.s, self.main, self.act
    for task in self.tasks:
      drafts = self.drafts if 'table2' in self.args.phases else []
      sweep = s.sweep if (task == self.tasks[0] and temp == 0 and
                          'sweep' in self.args.phases) else ()
      keys = [('base', act, 1, temp, 1)] + list(dict.fromkeys(
          [('spec', act, d.name, 1, self.gamma[task, d.name, temp], temp)
           for d in drafts] + [('spec', act, main.name, 1, g, 0.0)
                               for g in sweep]))
      what = f'Table 2, t = {temp:g}: {task}' + ' + gamma sweep' * bool(sweep)
      if len(keys) < 2 or not self.clock.fits(
          self.estimate(1, s.examples, len(keys)), what):
        continue
      start = time.perf_counter()
      timed = self.alternate(task, keys, 1, s.examples, temp)
      rows = {k: self.row(task, self.by_name[k[2]], temp, k[4],
                          timed[keys[0]], timed[k]) for k in keys[1:]}
      for d, key in zip(drafts, keys[1:]):  # the sweep may share a row
        self.result['table2'].append(rows[key])
        rows[key].update(gamma_rule=True, group=d.group, paper=self.paper(
            task, d, temp), alpha_calibration=self.alpha_cal[
                task, d.proxy, temp])
      self.result['sweep'] += [rows['spec', act, main.name, 1, g, 0.0]
                               for g in sweep]
      self.clock.note(what, time.perf_counter() - start, kind='decode',
                      units=(s.examples * s.repeats + 1) * len(keys))
      self.write()

  def numerics(self) -> None:
    """Identical rows and costs: bf16 / f32 activations, 1-token / block."""
    s, task, d = self.s, self.tasks[0], self.main
    gamma = self.gamma[task, d.name, 0.0]
    n, k = s.numerics_examples, gamma + 1
    for act in ACTS:
      keys = [('base', act, 1, 0.0, 1), ('base', act, 1, 0.0, k),
              ('spec', act, d.name, 1, gamma, 0.0)]
      what = f'numerics, {act} activations ({n} rows)'
      if not self.clock.fits(self.estimate(1, n, 3), what):
        continue
      self.measure_calls(act, 1, [1, k])
      start = time.perf_counter()
      timed = self.alternate(task, keys, 1, n, 0.0)
      base, block, spec = (timed[key] for key in keys)
      divs = {'1token': self.diagnose(act, task, 1, base, spec),
              'block': self.diagnose(act, task, 1, block, spec)}
      count = lambda name, kind: sum(v['kind'] == kind for v in divs[name])
      self.result['numerics'].append(dict(
          activation_dtype=act, drafter=d.name, gamma=gamma, rows=n,
          identical_1token=rows_lib.identical(base.results, spec.results)[0],
          identical_block=rows_lib.identical(block.results, spec.results)[0],
          **{f'{kind}_{name}': count(name, diagnostics.NEAR_TIE if kind ==
                                     'near_ties' else diagnostics.MISMATCH)
             for name in divs for kind in ('near_ties', 'mismatches')},
          divergences_1token=divs['1token'], divergences_block=divs['block'],
          t1_ms=self.t_ms[act, 1][1], tk_ms=self.t_ms[act, 1][k],
          baseline_s=base.seconds / n, block_baseline_s=block.seconds / n,
          speculative_s=spec.seconds / n,
          block_cost=block.seconds / base.seconds - 1.0,
          speedup=base.seconds / spec.seconds,
          speedup_vs_block=block.seconds / spec.seconds))
      self.clock.note(what, time.perf_counter() - start, kind='numerics',
                      units=(n * s.repeats + 1) * 3)
      self.write()

  def batches(self) -> None:
    """Speed-ups at batch > 1 with the per-row spread of accepted lengths."""
    task, d = self.tasks[0], self.main
    gamma = self.gamma[task, d.name, 0.0]
    for b in (b for b in self.s.batches if b > 1):
      if not self.clock.fits(self.estimate(b, 1, 2), f'batch {b}'):
        continue
      self.measure_calls(self.act, b, [1, gamma + 1])
      self.measure_drafters([d], b)
      start = time.perf_counter()
      base, spec = self.alternate(task, [
          ('base', self.act, b, 0.0, 1),
          ('spec', self.act, d.name, b, gamma, 0.0)], b, 1, 0.0).values()
      self.result['batches'].append(self.row(task, d, 0.0, gamma, base, spec,
                                             batch=b))
      self.clock.note(f'batch {b}: decode', time.perf_counter() - start,
                      kind='batch_decode', units=(self.s.repeats + 1) * 2)
      self.write()

  def cost_curve(self) -> None:
    for b in self.s.batches:
      ks = curve(self.s, b)
      if self.clock.fits(len(ks) - 1, f'cost curve, batch {b}'):
        self.measure_calls(self.act, b, list(ks))

  # -- the run ---------------------------------------------------------------

  def run(self, watch: budget.CompileWatch) -> None:
    s = self.s
    self.setup()
    self.write()
    plan = lambda: programs(s, self.drafts, self.tasks, self.gamma,
                            self.args.phases, self.act)
    # Stage 1: every program that needs no gamma, the calibration beside.
    jobs = self.pool.submit(self.calibration())
    self.compile('programs without gamma', [
        k for first, _ in plan().values() for k in first])
    for (task, t), alphas in self.pool.collect(
        'alpha calibration (untimed)', jobs, 'calibration').items():
      self.alpha_cal.update({(task, key, t): a for key, a in alphas.items()})
    self.result['alpha_calibration'] = [
        dict(task=t, drafter=k, temperature=temp, alpha=a)
        for (t, k, temp), a in self.alpha_cal.items()]
    watch.install()  # from here on, every timed program is compiled
    start = time.perf_counter()
    self.result['bandwidth'] = measure.bandwidth(s.copy_mib, s.cost_repeats)
    self.clock.note('time device copy (bandwidth)',
                    time.perf_counter() - start, kind='bandwidth')
    self.measure_calls(self.act, 1, range(1, s.max_gamma + 2))
    self.measure_drafters(self.drafts, 1)
    self.gamma = {(task, d.name, t): hardware.predict(
        self.profile, alpha=clip(self.alpha_cal[task, d.proxy, t]),
        drafter=d.name, max_gamma=s.max_gamma).gamma
                  for task in self.tasks for t in TEMPS for d in self.drafts}
    self.write()
    # Stage 2: the programs with a gamma, for the phases in priority order;
    # the last are dropped while compiling them does not fit (rows check
    # again before they run, at the decode times measured by then).
    parts = plan()
    order = [(w, [k for p in ps if p in parts for k in parts[p][1]], fn)
             for w, ps, fn in [
                 ('Table 2, t = 0', ['table2@0', 'sweep'], functools.partial(
                     self.table, 0.0)),
                 ('Table 2, t = 1', ['table2@1'], functools.partial(
                     self.table, 1.0)),
                 ('numerics', ['numerics'], self.numerics),
                 ('batches', ['batches'], self.batches),
                 ('cost curve', ['cost_curve'], self.cost_curve)]
             if any(p in parts for p in ps)]
    keys = lambda: [k for _, ks, _ in order for k in ks]
    while order and not self.clock.fits(self.pool.estimate(
        {self.ident(k) for k in keys()}), order[-1][0]):
      order.pop()
    self.compile('programs with gamma', keys())
    for _, _, fn in order:
      fn()

  # -- output ----------------------------------------------------------------

  def mismatches(self) -> int:
    r = self.result
    rows = {id(x): x for x in r['table2'] + r['batches'] + r['sweep']}
    return sum(x['mismatches'] or 0 for x in rows.values()) + sum(
        x['mismatches_1token'] + x['mismatches_block'] for x in r['numerics'])

  def write(self, plots: bool = False) -> None:
    self.result['wall_s'] = round(self.clock.elapsed(), 1)
    try:
      if plots:
        self.result['plots'] = write_plots(self.result, self.out_dir,
                                           self.stem.name)
    except Exception as e:  # pylint: disable=broad-except
      self.result['plot_error'] = repr(e)  # the results are written anyway
    report.write_json(self.stem.with_suffix('.json'), self.result)
    report.write_md(self.stem.with_suffix('.md'), markdown(self.result))


# ---------------------------------------------------------------------------
# Markdown and plots.
# ---------------------------------------------------------------------------


def cell(value) -> str:
  """A table cell: floats to 3 significant digits, None as '-'."""
  if isinstance(value, float):
    return f'{value:.3g}'
  if isinstance(value, dict):  # the paper's figures
    return ' / '.join(f'{k} {cell(v)}' for k, v in value.items() if k != 'task')
  return '-' if value is None else str(value)


SPREAD = ('accepted length per row (min / median / max)', lambda x: ' / '.join(
    f"{f(x['per_row_accepted_length']):.2f}" for f in (min, np.median, max)))
# Each list of rows in the json: its title, a note, and its columns (keys
# of its rows, or (header, function)).
SECTIONS = (
    ('table2', 'Table 2: speculative vs baseline, T5 1.1-XXL-cost target',
     "gamma by the paper's rule; predicted: `bench.hardware.predict` with "
     "the row's alpha on this run's profile; measured: speculative over "
     "baseline tokens / s; identical: greedy rows equal to the baseline's, "
     'every differing one diagnosed (near tie: rounding; mismatch: a bug).',
     ('task', 'label', 'temperature', 'gamma', 'alpha_calibration', 'alpha',
      'c', 'cost_gamma_plus_1', 'predicted', 'measured', 'ratio',
      'identical', 'rows', 'near_ties', 'mismatches', 'paper')),
    ('numerics', 'Numerics: identical greedy rows, bfloat16 weights',
     '1token: the usual baseline; block: the same-shape baseline '
     '(`block_size=gamma + 1`); seconds per row.',
     ('activation_dtype', 'rows', 'identical_1token', 'near_ties_1token',
      'mismatches_1token', 'identical_block', 'near_ties_block',
      'mismatches_block', 't1_ms', 'baseline_s', 'block_baseline_s',
      'block_cost', 'speedup', 'speedup_vs_block')),
    ('batches', 'Batch 1, 8, 32 (greedy, one drafter, gamma of batch 1)',
     'iterations: target calls of the batch (its slowest row) per example; '
     "mean_row_iterations: the mean row's.",
     ('batch', 'gamma', 'alpha', 'c', 'cost_gamma_plus_1', 'predicted',
      'measured', 'ratio', SPREAD, 'iterations', 'mean_row_iterations',
      'identical', 'rows', 'near_ties', 'mismatches')),
    ('sweep', 'Gamma sweep (the first drafter, t = 0, batch 1, first task)',
     '', ('gamma', 'alpha', 'cost_gamma_plus_1', 'predicted', 'measured',
          'ratio', 'identical', 'rows')))


def markdown(r: Dict[str, Any]) -> str:
  """The results page: every table of the json."""
  setup, fl, bw, p = r['setup'], r['floor'], r['bandwidth'], r.get(
      'projection') or {}
  lines = [f"# Table 2 at T5 1.1-XXL cost on {r['device']}" +
           ' (SYNTHETIC)' * r['synthetic'], '']
  if r['synthetic']:
    lines += [f"> **{r['label']}.** Alphas are set by the noise, not earned "
              'by a drafter: these figures measure the engine.', '']
  if r['smoke']:
    lines += ['> **SMOKE RUN**: tiny models; the numbers mean nothing.', '']
  lines += [report.header_md(r), f"Status: {r['status']}; wall "
            f"{r.get('wall_s')} s of a {r['max_minutes']} min budget" + (
                f"; projected for {p['of']}: {p['seconds']:.0f} s on "
                f"{p['device']} (`{p['source']}`)" if 'seconds' in p else
                '') + '.', '',
            '## Setup', '', f"Target: {r['label']}; "
            f"{setup.get('target_params', 0) / 1e9:.2f} B parameters, "
            f"activations {setup.get('activation_dtype')}, "
            f"{setup.get('input_length')} input tokens, up to "
            f"{setup.get('output_length')} output tokens."] + [
                f'- {n}' for n in setup.get('notes', []) +
                setup.get('skipped_drafters', [])]
  if fl:
    lines += ['', '## Baseline step vs its floor', '', report.table(
        ['t(1) ms', 'GB per step', 'bandwidth (copy) GB/s', 'floor ms',
         't(1) / floor'], [[cell(fl['t1_ms']), cell(fl['step_bytes'] / 1e9),
                            cell(bw['bytes_per_s'] / 1e9),
                            cell(fl['floor_ms']), cell(fl['ratio'])]]), '',
              f"Bandwidth: {bw['how']}."]
  for act, by_b in r['costs'].items():
    ks = sorted({int(k) for v in by_b.values() for k in v['cost']})
    lines += ['', f'## cost(k) = t(k) / t(1) of one target call on k tokens, '
              f'{act} activations', '', report.table(
                  ['batch', 't(1) ms'] + [f'k={k}' for k in ks],
                  [[b, cell(v['t_ms'].get('1'))] + [
                      cell(v['cost'].get(str(k))) for k in ks]
                   for b, v in by_b.items()])]
  if r['drafters']:
    lines += ['', '## Drafters: t_draft per token and c = t_draft / t(1) by '
              'batch', '', report.table(
                  ['drafter', 'cost', 't_draft ms', 'c'],
                  [[d['label'], d['cost'], cell(d['t_draft_ms']),
                    cell(d['c'])] for d in r['drafters'].values()])]
  for key, title, note, columns in SECTIONS:
    rows = batch_rows(r) if key == 'batches' else r[key]
    if r[key]:
      lines += ['', f'## {title}', ''] + [note, ''] * bool(note) + [
          report.table([c if isinstance(c, str) else c[0] for c in columns],
                       [[cell(x.get(c)) if isinstance(c, str) else c[1](x)
                         for c in columns] for x in rows])]
  if r.get('plots'):
    lines += ['', '## Plots', ''] + [f'![{x}]({x})' for x in r['plots']]
  if r['skipped']:
    lines += ['', '## Skipped (time budget)', ''] + [
        f"- {x['what']}: needed ~{x['needed_s']} s, {x['left_s']} s left"
        for x in r['skipped']]
  return '\n'.join(lines + ['', '## Time log', '', report.table(
      ['at s', 'what', 's', 'kind', 'units'], [
          [e['at_s'], e['what'], e['seconds'], e.get('kind'), e.get('units')]
          for e in r['time_log']]), '', 'Compiles inside timed code (must be '
                            f"none): {r['compile_misses'] or 'none'}"]) + '\n'


def batch_rows(r):
  """Batch 1 (the main drafter's first greedy Table 2 row) and the rest."""
  return [x for x in r['table2'] if x['temperature'] == 0 and x[
      'drafter'] == r.get('main_drafter')][:1] + r['batches']


def write_plots(r: Dict[str, Any], out_dir: pathlib.Path, stem: str
                ) -> List[str]:
  """Cost curves, Table 2, the gamma sweep and the batches; file names."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  names, t2 = [], r['table2']
  for name, rows, title, xlabel, ylabel, size in [
      ('costs', r['costs'], f"Target call cost on {r['device']}",
       'k (tokens per call)', 'cost(k) = t(k) / t(1)', (6, 4)),
      ('table2', t2, 'Table 2 at T5-XXL cost', '', 'speed-up',
       (max(6, len(t2) / 2), 4)),
      ('sweep', r['sweep'], 'gamma sweep', 'gamma', 'speed-up', (5, 3.6)),
      ('batches', r['batches'], 'Per-row acceptance by batch', '',
       'mean accepted length per row', (5, 3.6))]:
    if not rows:
      continue
    fig, ax = plt.subplots(figsize=size)
    if name == 'costs':
      for act, by_b in rows.items():
        for b, v in by_b.items():
          ks = sorted(int(k) for k in v['cost'])
          ax.plot(ks, [v['cost'][str(k)] for k in ks], 'o-',
                  label=f'batch {b}, {act}')
    elif name == 'table2':
      x = np.arange(len(rows))
      ax.bar(x - 0.2, [y['predicted'] for y in rows], 0.4, label='predicted')
      ax.bar(x + 0.2, [y['measured'] for y in rows], 0.4, label='measured')
      ax.set_xticks(x, [f"{y['task'][:6]} {y['drafter'][:14]} t"
                        f"{y['temperature']:g}" for y in rows], rotation=70,
                    fontsize=6)
    elif name == 'sweep':
      for key, style in (('measured', 'o-'), ('predicted', 's--')):
        ax.plot([y['gamma'] for y in rows], [y[key] for y in rows], style,
                label=key)
    else:
      rows = batch_rows(r)
      ax.boxplot([y['per_row_accepted_length'] for y in rows])
      ax.set_xticks(range(1, len(rows) + 1),
                    [f"batch {y['batch']}" for y in rows])
    ax.set_title(title + ' (SYNTHETIC)' * r['synthetic'], fontsize=9)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
    report.save_plot(fig, out_dir / f'{stem}_{name}.png')
    names.append(f'{stem}_{name}.png')
  return names


# ---------------------------------------------------------------------------
# Entry point.
# ---------------------------------------------------------------------------


def parse_flags(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add = parser.add_argument
  add('--source', default='synthetic', choices=['synthetic', 'shipped'])
  add('--out_dir', default=None, help='default results/<device name>')
  add('--max_minutes', type=float, default=9.0,
      help='wall budget; what does not fit is skipped and listed')
  add('--smoke', action='store_true', help='tiny models, on a CPU in about '
      'a minute (needs --out_dir)')
  add('--project', action='store_true',
      help='only print the projected wall time of the full run')
  add('--project_from', default=H100_RUN,
      help='the measured run (json) whose time log the projection scales')
  add('--fused', action='store_true', help='q/k/v, cross k/v and the gated '
      'MLP inputs fused into one matmul each (network.for_decoding)')
  add('--activation_dtype', default='bfloat16', choices=list(ACTS),
      help="the target's activations everywhere but the numerics")
  add('--phases', default=','.join(PHASES),
      help='comma-separated subset (costs always run)')
  add('--compile_workers', type=int, default=None,
      help='compile threads (default min(8, cores); the projection: those '
      'of the measured run)')
  add('--compilation_cache', default=None, help="jax's persistent "
      "compilation cache ('' for none; default cache/jax, ignored by git)")
  for name in ('examples', 'repeats', 'input_length', 'output_length'):
    add(f'--{name}', type=int, default=None)
  add('--sigma', default='', help='synthetic noise, e.g. small=0.02,base=0.016')
  add('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  if args.smoke and not args.out_dir:
    parser.error('--smoke needs --out_dir (smoke results never go to '
                 'results/)')
  args.workers = args.compile_workers or min(8, os.cpu_count() or 1)
  for name in ('max_minutes', 'compile_workers', 'examples', 'repeats',
               'input_length', 'output_length'):
    value = getattr(args, name)
    if value is not None and value < (1 if name != 'max_minutes' else 1e-9):
      parser.error(f'--{name} must be > 0, got {value}')
  args.phases = set(filter(None, args.phases.split(',')))
  if args.phases - set(PHASES):
    parser.error(f'--phases: unknown {sorted(args.phases - set(PHASES))}; '
                 f'known: {list(PHASES)}')
  args.sigma = dict(x.partition('=')[::2]
                    for x in filter(None, args.sigma.split(',')))
  for name, value in args.sigma.items():
    if name not in SIGMAS or not value:
      parser.error(f'--sigma entries look like small=0.02 (names '
                   f'{list(SIGMAS)}), got {name}={value}')
    args.sigma[name] = float(value)
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_flags(argv)
  clock = budget.Clock(args.max_minutes)
  flags = os.environ.get('XLA_FLAGS', '')
  if args.smoke and 'optimization_level' not in flags:
    # Tiny programs: LLVM's optimisations cost more than they save (read
    # when the backend starts, in `report.header`).
    os.environ['XLA_FLAGS'] = f'{flags} --xla_backend_optimization_level=0'
  sizes = {k: getattr(args, k) for k in ('examples', 'repeats')
           if getattr(args, k) is not None}
  header = report.header(SCRIPT, argv, max_minutes=args.max_minutes)
  out_dir = pathlib.Path(args.out_dir or f"results/{header['device_name']}")
  if args.compilation_cache != '':
    jax.config.update('jax_compilation_cache_dir', args.compilation_cache or
                      str(ROOT / 'cache' / 'jax'))
  print(f"{header['command']}\n{header['machine']}", flush=True)
  full = FULL._replace(**sizes)
  try:
    projection = project(
        args.project_from, full, roster(args.source, [] if args.source == (
            'synthetic') else load_shipped().model_names(), full),
        tasks_of(args.source), args.phases, args.activation_dtype,
        None if args.smoke else args.compile_workers,
        f'the full {args.source} run')
  except (OSError, ValueError, KeyError) as e:  # no measured run to scale
    projection = dict(error=f'no projection from {args.project_from}: {e!r}')
    print(projection['error'], flush=True)
  if args.project:
    return 0 if 'seconds' in projection else 1
  pool = budget.Pool(args.workers, clock, 4.0 if args.smoke else 40.0)
  runner = Runner(args, (SMOKE if args.smoke else FULL)._replace(**sizes),
                  clock, pool, out_dir, header)
  runner.result['projection'] = projection
  watch = budget.CompileWatch()
  try:
    runner.run(watch)
    runner.result['status'] = 'complete' if not clock.skipped else (
        f'partial: {len(clock.skipped)} parts skipped for time')
  except BaseException as e:
    runner.result['status'] = f'failed: {e!r}'
    raise
  finally:
    watch.remove()
    runner.result['compile_misses'] = watch.misses
    mismatches = runner.mismatches()
    if mismatches:
      runner.result['status'] = (
          f'failed: {mismatches} greedy rows differ from the baseline beyond '
          'rounding (real mismatches; see "divergences")')
    start = time.perf_counter()
    runner.write(plots=True)
    clock.note('plots, md, json', time.perf_counter() - start, kind='write')
    if runner.profile is not None:  # bench/profiles/: complete shipped runs
      shared = not args.smoke and args.source == 'shipped' and (
          runner.result['status'] == 'complete')
      path = hardware.write(runner.profile, None if shared else (
          out_dir / f'{runner.profile.name}.json'))
      print(f'hardware profile: {report.portable(str(path))}')
    runner.write()
    pool.shutdown()
    print(f"{runner.result['status']}; wrote {runner.stem}.{{md,json}} in "
          f"{clock.elapsed():.1f} s (projected for the full run: "
          f"{projection.get('seconds')} s)", flush=True)
  return 1 if mismatches else 0


if __name__ == '__main__':
  sys.exit(main())
