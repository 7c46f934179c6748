r"""Table 2 at T5-XXL cost on one accelerator, with bf16 numerics made explicit.

  python scripts/reproduce_accelerator.py                    # synthetic
  python scripts/reproduce_accelerator.py --source shipped   # trained models
  python scripts/reproduce_accelerator.py --smoke --out_dir /tmp/acc  # CPU

Needs jax, flax, numpy, matplotlib and this package, nothing else on its path
(no seqio, TensorFlow, gin or rouge-score; the package need not be
installed). Everything runs in one process, in a time budget
(`--max_minutes`, 8 by default: under 9 minutes on one H100).

Sources of the models:
- synthetic (default): SYNTHETIC, labelled so in every output. A random
  T5 1.1-small S0 (bfloat16) widened function-preservingly to T5 1.1-XXL
  cost (`widening.widen_to`) is the target; drafters are S0 with relative
  Gaussian noise sigma x std(leaf) on every leaf (sigma sets alpha;
  ../shared/GPU.md), at T5 1.1-small cost and widened to base / large cost,
  and unigram / bigram drafters from S0's own outputs. This measures the
  engine, not a drafter.
- shipped (`--source shipped`): the trained models and pre-tokenized test
  arrays of `specdec_jax.shipped`: the target widened to XXL cost, each
  drafter at its own cost and (small / base / large) widened to T5 1.1
  small / base / large cost, n-gram drafters from the arrays' targets.

What one run measures (writing `results/<device>/accelerator_<source>.
{md,json}` and plots after every row, and printing a time log):
- cost(k) = t(k) / t(1) of the target's decoder call for k = 1..16 at batch
  1, 8, 32; t_draft and c = t_draft / t(1) per drafter; the baseline step
  against its floor (decoder bytes / the device bandwidth measured by timing
  a large on-device copy);
- Table 2 at batch 1: per task, drafter and temperature, gamma by the
  paper's rule (`theory.optimal_gamma` with alpha calibrated beforehand,
  measured c and cost(gamma + 1)), the measured speed-up against Theorem
  3.8's prediction with the run's alpha, identical greedy rows and the
  diagnosis of every differing one (`diagnostics`: rounding near-tie or
  real mismatch), the paper's numbers beside;
- numerics: rows identical to the speculative ones with bfloat16 and float32
  activations, with the 1-token baseline and with the same-shape baseline
  (`decoding.temperature_sample(block_size=gamma + 1)`), and their costs;
- speculative speed-ups at batch 1, 8, 32 with the per-row spread of
  accepted lengths (what a batch loses to its slowest row);
- a gamma sweep 1..8 for one drafter (the first of the table), t = 0.
Order (what does not fit the budget is skipped and listed): t(k) for k <=
9 and c at batch 1; then compiled together and run in this order, Table 2
t = 0 with the paper's drafters, numerics, batches; then Table 2 t = 0
n-grams, t = 1 paper's drafters, the sweep, own-cost drafters and the rest
of Table 2, and the rest of cost(k).

Timings: compiled code only (every program is compiled ahead of time, several
at once in threads, then timed alone), `block_until_ready`, medians of
repeats, baseline and speculative interleaved; `measure` helpers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import logging
import math
import os
import pathlib
import re
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

# pylint: disable=wrong-import-position
from specdec_jax import decoding
from specdec_jax import diagnostics
from specdec_jax import drafters as drafters_lib
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import speculative
from specdec_jax import theory
from specdec_jax import widening
from specdec_jax.experiments.reproduce import PAPER_TABLE2
from specdec_jax.experiments.reproduce import PAPER_TABLE3
from specdec_jax.experiments.reproduce import portable
from specdec_jax.sampling import SamplingConfig
# pylint: enable=wrong-import-position

SCRIPT = 'scripts/reproduce_accelerator.py'
SYNTHETIC_LABEL = (
    'SYNTHETIC: random T5 1.1-small widened to T5 1.1-XXL cost as the target, '
    'noisy copies of it as drafters (alpha set by the noise), not trained '
    'models')

# T5 1.1 small dimensions (t5x/examples/t5/t5_1_1/small.gin); base, large and
# XXL are widening.PRESETS.
T5_1_1_SMALL_COST = dict(emb_dim=512, num_heads=6, head_dim=64, mlp_dim=1024,
                         num_encoder_layers=8, num_decoder_layers=8)
S0 = network.T5Config(
    vocab_size=32128, dtype='bfloat16', emb_dim=512, num_heads=6, head_dim=64,
    mlp_dim=1024, num_encoder_layers=8, num_decoder_layers=8,
    mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
    logits_via_embedding=False)
# Tiny stand-ins for --smoke (CPU; every distinct program is a compile of
# seconds there, so the drafters share S0's shapes: one program each).
S0_SMOKE = S0.replace(vocab_size=256, emb_dim=16, num_heads=2, head_dim=8,
                      mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1)
_SMOKE_S0_DIMS = dict(emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                      num_encoder_layers=1, num_decoder_layers=1)
SMOKE_COSTS = {
    't5_1_1_small_cost': _SMOKE_S0_DIMS,
    't5_1_1_base_cost': _SMOKE_S0_DIMS,
    't5_1_1_large_cost': _SMOKE_S0_DIMS,
    't5_1_1_xxl_cost': dict(emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                            num_encoder_layers=2, num_decoder_layers=2),
}
FULL_COSTS = dict(t5_1_1_small_cost=T5_1_1_SMALL_COST,
                  **{k: dict(v) for k, v in widening.PRESETS.items()})
# Noise per synthetic drafter: GPU.md's sigma -> alpha (0.01 -> 0.90, 0.02 ->
# 0.76, 0.04 -> 0.57 greedy), chosen near the paper's EnDe alphas.
SIGMAS = {'small': 0.02, 'base': 0.016, 'large': 0.013}
PAPER_TASK = {'synthetic': 'EnDe', 'en_de': 'EnDe', 'synopsis': 'CNNDM'}
T5_SIZES = ('small', 'base', 'large')


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Everything that differs between a full run and --smoke."""
  s0: network.T5Config
  costs: Dict[str, Dict[str, int]]
  input_length: int
  output_length: int
  batches: Sequence[int]
  max_k: int
  sweep: Sequence[int]
  max_gamma: int
  examples: int
  repeats: int
  numerics_examples: int
  numerics_repeats: int
  sweep_examples: int
  calib_examples: int
  ngram_examples: int
  context: int
  copy_mib: int
  cost_repeats: int
  ngram_orders: Sequence[int] = (1, 2)
  # Untimed set-up (caches, drafter states) in one compiled call instead of
  # op by op: faster for tiny models on a CPU; op by op reuses each op's
  # compile across the 24 identical layers of an XXL-cost model.
  jit_setup: bool = False


FULL = Sizes(s0=S0, costs=FULL_COSTS, input_length=64, output_length=128,
             batches=(1, 8, 32), max_k=16, sweep=tuple(range(1, 9)),
             max_gamma=8, examples=2, repeats=3, numerics_examples=4,
             numerics_repeats=2, sweep_examples=1, calib_examples=8,
             ngram_examples=64, context=64, copy_mib=2048,
             cost_repeats=5)
# gamma 1 only and one n-gram order: every program of a full run, each once.
SMOKE = Sizes(s0=S0_SMOKE, costs=SMOKE_COSTS, input_length=8,
              output_length=10, batches=(1, 2), max_k=2, sweep=(1,),
              max_gamma=1, examples=1, repeats=1, numerics_examples=2,
              numerics_repeats=1, sweep_examples=1, calib_examples=2,
              ngram_examples=8, context=4, copy_mib=4,
              cost_repeats=1, ngram_orders=(2,), jit_setup=True)


# ---------------------------------------------------------------------------
# Time, compiles and the budget.
# ---------------------------------------------------------------------------


class Clock:
  """Wall time since start, the budget and a printed time log."""

  def __init__(self, max_minutes: float):
    self.start = time.perf_counter()
    self.deadline = self.start + 60.0 * max_minutes
    self.log: List[Dict[str, Any]] = []

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def left(self) -> float:
    return self.deadline - time.perf_counter()

  def note(self, what: str, seconds: float, **extra) -> None:
    self.log.append(dict(at_s=round(self.elapsed(), 2), what=what,
                         seconds=round(seconds, 3), **extra))
    print(f'[{self.elapsed():7.1f} s] {what}: {seconds:.2f} s', flush=True)


class CompileWatch(logging.Handler):
  """Records the decoding programs lowered outside the compile pool.

  Every timed program is compiled ahead of time in the pool's threads; jax
  logs (at DEBUG) each program it lowers, so one lowered in the main thread
  is a program that was not prewarmed (a compile inside a timed section).
  """

  NAMES = ('_run', '_repeated_calls', '_repeated_proposals', '_reference',
           'copy_passes')
  LOGGER = 'jax._src.interpreters.pxla'

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.misses: List[str] = []
    self._parent = None

  def emit(self, record):
    if record.levelno >= logging.WARNING and self._parent is not None:
      self._parent.handle(record)  # what the logger would print anyway
    if threading.current_thread().name.startswith('compile'):
      return
    match = re.match(r'Compiling (?:jit\()?(\w+)', record.getMessage())
    if match and match.group(1) in self.NAMES:
      self.misses.append(match.group(1))

  def install(self) -> None:
    logger = logging.getLogger(self.LOGGER)
    self._parent = logger.parent
    logger.addHandler(self)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False

  def remove(self) -> None:
    logger = logging.getLogger(self.LOGGER)
    if self not in logger.handlers:
      return
    logger.removeHandler(self)
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


class Pool:
  """Runs compiles (and untimed work) several at once, timing nothing else.

  `.compile()` of a lowered program puts it in jax's cache, so the library
  call that runs it later (decoding.temperature_sample, measure.call_time,
  ...) starts at once. Keys name programs; each is compiled once per run.
  """

  # Seconds one compile takes before any is observed: whole decoding loops
  # at T5-XXL cost take 20-40 s on a GPU (GPU.md), single calls less.
  PRIOR = {'loop': 40.0, 'call': 10.0}
  LOOPS = ('baseline', 'speculative', 'reference')

  def __init__(self, workers: int, clock: Clock, prior_scale: float = 1.0):
    self.workers = workers
    self.clock = clock
    self.executor = concurrent.futures.ThreadPoolExecutor(
        workers, thread_name_prefix='compile')
    self.compiled = set()
    # Longest single compile seen per kind ('loop' / 'call').
    self.longest = {k: v * prior_scale for k, v in self.PRIOR.items()}
    self.seen = set()

  def kind(self, key) -> str:
    return 'loop' if key[0] in self.LOOPS else 'call'

  def run(self, what: str, jobs: Dict[Any, Callable[[], Any]]
          ) -> Dict[Any, Any]:
    start = time.perf_counter()
    futures = {key: self.executor.submit(fn) for key, fn in jobs.items()}
    out = {key: future.result() for key, future in futures.items()}
    if jobs:
      self.clock.note(f'{what} ({len(jobs)} jobs, {self.workers} threads)',
                      time.perf_counter() - start, jobs=len(jobs))
    return out

  def compile(self, what: str, lowerings: Dict[Any, Callable[[], Any]]
              ) -> int:
    new = {k: fn for k, fn in lowerings.items() if k not in self.compiled}

    def job(key, lower):
      start = time.perf_counter()
      lower().compile()
      return self.kind(key), time.perf_counter() - start

    done = self.run(f'{what}: compile', {
        k: functools.partial(job, k, fn) for k, fn in new.items()})
    for kind, seconds in done.values():
      # The first observation replaces the prior; later ones can only raise.
      self.longest[kind] = seconds if kind not in self.seen else max(
          seconds, self.longest[kind])
      self.seen.add(kind)
    self.compiled |= set(new)
    return len(new)

  def estimate(self, keys) -> float:
    """Seconds to compile these programs, about (longest x rounds)."""
    new = [k for k in keys if k not in self.compiled]
    total = 0.0
    for kind in ('loop', 'call'):
      n = sum(self.kind(k) == kind for k in new)
      total += math.ceil(n / self.workers) * self.longest[kind]
    return total

  def shutdown(self) -> None:
    self.executor.shutdown(wait=False, cancel_futures=True)


def time_interleaved(calls: Dict[str, Callable[[], Any]], repeats: int,
                     warm: bool = True):
  """Median seconds of each call, the calls alternating in order.

  Args:
    calls: name -> compiled call (returns arrays).
    repeats: timed runs of each.
    warm: run each once untimed first (a program's first execution).

  Returns:
    ({name: median seconds}, {name: last output}).
  """
  names = list(calls)
  out = {}
  if warm:
    for name in names:
      out[name] = jax.block_until_ready(calls[name]())
  times = {name: [] for name in names}
  for r in range(repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      start = time.perf_counter()
      out[name] = jax.block_until_ready(calls[name]())
      times[name].append(time.perf_counter() - start)
  return {k: statistics.median(v) for k, v in times.items()}, out


# ---------------------------------------------------------------------------
# Models.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
  """The target both decoders run (one model, one set of weights)."""
  model: network.T5Model
  params: Any = dataclasses.field(compare=False, hash=False)


@dataclasses.dataclass
class Draft:
  """One drafter of the table.

  Attributes:
    name: unique key, e.g. 'base@t5_1_1_base_cost'.
    label: how tables name it.
    cost: 'own', or the cost it is widened to (e.g. 't5_1_1_base_cost').
    drafter: a `drafters` drafter.
    params: task -> its parameters (T5 drafters: the same for every task).
    proxy: the unwidened model alpha is calibrated with (same function).
    paper: the paper's drafter to compare with (small / base / large /
      unigram / bigram) or None.
    group: 1 the paper's drafters at T5 1.1 cost (and the GPU drafter),
      2 own-cost T5 drafters, 3 n-grams: the order of the budget.
  """
  name: str
  label: str
  cost: str
  drafter: Any
  params: Dict[str, Any]
  proxy: str
  paper: Optional[str]
  group: int


@dataclasses.dataclass
class Plan:
  """A phase: its programs, an estimate of its rows' seconds, and its rows."""
  what: str
  lowerings: Dict[Any, Callable[[], Any]]
  rows_s: float
  run: Callable[[], None]


def bf16(params):
  return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.bfloat16),
                                params)


@jax.jit
def perturbed(params, sigma, seed):
  """Each leaf plus sigma x std(leaf) Gaussian noise (a synthetic drafter)."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + sigma * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
           for x, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(tree, noisy)


nbytes = measure.tree_bytes


def random_inputs(rng, n: int, length: int, vocab: int) -> np.ndarray:
  """n rows of random ids in [2, vocab), EOS (1) last."""
  x = rng.integers(2, vocab, (n, length)).astype(np.int32)
  x[:, -1] = 1
  return x


def fit_length(x: np.ndarray, length: int) -> np.ndarray:
  """0-pads or cuts rows to `length` (a cut row keeps its last token)."""
  out = np.zeros((x.shape[0], length), np.int32)
  for i, row in enumerate(x):
    ids = row[row > 0]
    if len(ids) > length:
      ids = np.concatenate([ids[:length - 1], ids[-1:]])
    out[i, :len(ids)] = ids
  return out


def widened_dims(config: network.T5Config, cost: Dict[str, int]):
  """cost's dimensions, never below config's (widening only grows)."""
  return {k: max(v, getattr(config, k)) for k, v in cost.items()}


def widen(params, config: network.T5Config, cost: Dict[str, int]):
  """(params, model) widened to at least `cost` (as they are if there)."""
  dims = widened_dims(config, cost)
  if all(getattr(config, k) == v for k, v in dims.items()):
    return params, network.T5Model(config)
  params, config = widening.widen_to(params, config, dims)
  return params, network.T5Model(config)


def load_shipped():
  """The shipped models' module, or a clear exit."""
  try:
    from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit(
        f'--source shipped needs specdec_jax/shipped.py (the trained models '
        f'shipped with the repository), which cannot be imported: {e}. Use '
        '--source synthetic.') from None
  if not shipped.available():
    raise SystemExit(
        '--source shipped: specdec_jax.shipped.available() is False (the '
        'shipped models and test arrays are not in this checkout). Use '
        '--source synthetic.')
  return shipped


def clip01(x: float) -> float:
  return min(max(float(x), 0.0), 1.0)


# ---------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------


class Runner:
  """Builds the models, runs the phases in budget order, writes results."""

  def __init__(self, args, sizes: Sizes, clock: Clock, pool: Pool,
               out_dir: pathlib.Path, header: Dict[str, Any]):
    self.args, self.sizes, self.clock, self.pool = args, sizes, clock, pool
    self.out_dir = out_dir
    self.synthetic = args.source == 'synthetic'
    self.T = sizes.output_length
    self.ctx = sizes.context
    self.t_ms: Dict[Any, Dict[int, float]] = {}  # (act, batch) -> {k: ms}
    self.t_draft_ms: Dict[Any, float] = {}  # (name, batch) -> ms
    self.alpha_cal: Dict[Any, float] = {}  # (task, proxy, temp) -> alpha
    self.caches: Dict[Any, Any] = {}
    self.decode_s: Dict[Any, float] = {}  # (act, batch, temp) -> seconds
    self.result = dict(
        **header, source=args.source, synthetic=self.synthetic,
        label=SYNTHETIC_LABEL if self.synthetic else
        'shipped trained models (specdec_jax.shipped)',
        smoke=bool(args.smoke), status='running', setup={}, bandwidth={},
        floor={}, costs={}, drafters={}, table2=[], numerics=[], batches=[],
        sweep=[], skipped=[], time_log=clock.log, compile_misses=[])

  # -- setup -----------------------------------------------------------------

  def _fuse(self) -> None:
    """Targets and T5 drafters in the fused decoding layout
    (`network.for_decoding`: q/k/v, cross-attention k/v and the gated MLP's
    two input kernels one matmul each; same function)."""
    self.targets = {k: Target(*network.for_decoding(t.model, t.params))
                    for k, t in self.targets.items()}
    for d in self.drafts:
      if isinstance(d.drafter, drafters_lib.T5Drafter):
        config = d.drafter.model.config
        d.params = {task: network.fuse_params(p, config)
                    for task, p in d.params.items()}
        d.drafter = drafters_lib.T5Drafter(network.T5Model(
            config.replace(fused_projections=True)))

  def setup(self) -> None:
    start = time.perf_counter()
    if self.synthetic:
      self._setup_synthetic()
    else:
      self._setup_shipped()
    # bfloat16 weights; activations bfloat16 (T5X's: activation_dtype None)
    # or float32. One set of weights for both.
    base, params = self.target.model.config, self.target.params
    self.targets = {
        'bfloat16': Target(network.T5Model(base), params),
        'float32': Target(network.T5Model(base.replace(
            activation_dtype='float32')), params)}
    if self.args.fused:  # fewer matmuls per step
      self._fuse()
    main = self.main_act = self.args.activation_dtype
    self.target = self.targets[main]
    cfg = self.target.model.config
    dec = self.target.params['decoder']
    self.result['setup'].update(
        target_config=_config_dict(cfg),
        target_params=widening.param_count(self.target.params),
        decoder_params=widening.param_count(dec),
        decoder_bytes=nbytes(dec), weights_dtype='bfloat16',
        activation_dtype=main, input_length=self.Li, output_length=self.T,
        eos_id=self.eos, tasks=self.tasks, fused=bool(self.args.fused),
        drafters={d.name: dict(label=d.label, cost=d.cost, group=d.group,
                               paper=d.paper) for d in self.drafts})
    self.main = next(d for d in self.drafts if d.group == 1 and
                     isinstance(d.drafter, drafters_lib.T5Drafter))
    self.result['main_drafter'] = self.main.name
    self.clock.note('setup: models, widening, inputs',
                    time.perf_counter() - start)
    self.write()

  def _setup_synthetic(self) -> None:
    s, seed = self.sizes, self.args.seed
    cfg = s.s0
    model = network.T5Model(cfg)
    init = jax.jit(model.init_params)(jax.random.key(seed))
    params = bf16(init)
    self.small_target = Target(model, params)
    self.tasks = ['synthetic']
    self.Li, self.eos = s.input_length, -1  # fixed-length outputs (GPU.md)
    rng = np.random.default_rng(seed)
    n = max(max(s.batches), s.examples, s.numerics_examples)
    v = cfg.vocab_size
    self.inputs = {'synthetic': random_inputs(rng, n, self.Li, v)}
    self.calib = {'synthetic': random_inputs(rng, s.calib_examples, self.Li,
                                             v)}
    tp, tm = widen(params, cfg, s.costs['t5_1_1_xxl_cost'])
    self.target = Target(tm, tp)
    self.proxies, self.drafts = {}, []
    sigmas = dict(SIGMAS, **self.args.sigma)
    self.result['setup']['sigmas'] = sigmas
    for i, size in enumerate(T5_SIZES):
      noisy = bf16(perturbed(init, sigmas[size], seed + 1 + i))
      self.proxies[size] = (drafters_lib.T5Drafter(model), {'synthetic':
                                                            noisy})
      cost = f't5_1_1_{size}_cost'
      dp, dm = widen(noisy, cfg, s.costs[cost])
      self.drafts.append(Draft(
          size, f'{size} (sigma {sigmas[size]:g}) at T5 1.1-{size} cost',
          cost, drafters_lib.T5Drafter(dm), {'synthetic': dp}, size, size,
          1))
    # n-grams from the target's own (S0's: the same function) outputs.
    ng_inputs = random_inputs(rng, s.ngram_examples, self.Li, v)
    out = decoding.temperature_sample(model, params, ng_inputs,
                                      max_decode_len=self.T, eos_id=self.eos)
    self._add_ngrams({'synthetic': np.asarray(out.tokens)}, v)

  def _add_ngrams(self, targets: Dict[str, np.ndarray], vocab: int) -> None:
    for order in self.sizes.ngram_orders:
      name = {1: 'unigram', 2: 'bigram'}[order]
      params = {task: drafters_lib.ngram_params(
          [row[row > 0] for row in rows], vocab, order)
                for task, rows in targets.items()}
      drafter = drafters_lib.NgramDrafter(vocab, order)
      self.proxies[name] = (drafter, params)
      self.drafts.append(Draft(name, name, 'own', drafter, params, name, name,
                               3))

  def _setup_shipped(self) -> None:
    shipped = load_shipped()
    s = self.sizes
    names = list(shipped.model_names())
    if 'target' not in names:
      raise SystemExit(f'specdec_jax.shipped has no target model: {names}.')
    tm, tp = shipped.load_model('target', dtype=jnp.bfloat16)
    cfg = tm.config.replace(dtype='bfloat16', dropout_rate=0.0)
    self.small_target = Target(network.T5Model(cfg), bf16(tp))
    self.tasks = ['en_de', 'synopsis']
    self.eos = 1
    arrays = {t: shipped.test_arrays(t) for t in self.tasks}
    self.Li = self.args.input_length or max(
        a['inputs'].shape[1] for a in arrays.values())
    if not self.args.output_length:
      self.T = min(128, max(a['targets'].shape[1] for a in arrays.values()))
    n_eval = max(max(s.batches), s.examples, s.numerics_examples)
    self.inputs, self.calib, ngram_rows = {}, {}, {}
    notes = []
    for task, a in arrays.items():
      x = fit_length(np.asarray(a['inputs']), self.Li)
      if x.shape[0] < n_eval:  # repeat rows to fill the batches
        notes.append(f'{task}: {x.shape[0]} test rows, repeated to {n_eval}')
        x = np.resize(x, (n_eval, x.shape[1]))
      self.inputs[task] = x[:n_eval]
      rest = slice(n_eval, n_eval + s.calib_examples)
      self.calib[task] = x[rest] if x[rest].shape[0] else x[:s.calib_examples]
      targets = np.asarray(a['targets'])
      used = n_eval + s.calib_examples
      if targets.shape[0] - used >= 16:
        ngram_rows[task] = targets[used:]
      else:
        notes.append(f'{task}: n-grams from all {targets.shape[0]} target '
                     'rows (too few beyond the evaluated ones)')
        ngram_rows[task] = targets
    self.result['setup']['notes'] = notes
    tpw, tmw = widen(self.small_target.params, cfg,
                     s.costs['t5_1_1_xxl_cost'])
    self.target = Target(tmw, tpw)
    self.proxies, self.drafts = {}, []
    skipped = []
    for name in names:
      if name == 'target':
        continue
      dm, dp = shipped.load_model(name, dtype=jnp.bfloat16)
      dcfg = dm.config.replace(dtype='bfloat16', dropout_rate=0.0)
      if dcfg.vocab_size != cfg.vocab_size:
        skipped.append(f'{name}: vocab {dcfg.vocab_size} != target '
                       f'{cfg.vocab_size}')
        continue
      dm, dp = network.T5Model(dcfg), bf16(dp)
      own = {t: dp for t in self.tasks}
      self.proxies[name] = (drafters_lib.T5Drafter(dm), own)
      sized = name in T5_SIZES
      self.drafts.append(Draft(
          name, f'{name} (own cost: emb {dcfg.emb_dim}, '
          f'{dcfg.num_encoder_layers}+{dcfg.num_decoder_layers} layers)',
          'own', drafters_lib.T5Drafter(dm), own, name,
          name if sized else None, 2 if sized else 1))
      if sized:
        cost = f't5_1_1_{name}_cost'
        wp, wm = widen(dp, dcfg, s.costs[cost])
        self.drafts.append(Draft(
            f'{name}@{cost}', f'{name} -> T5 1.1-{name} cost', cost,
            drafters_lib.T5Drafter(wm), {t: wp for t in self.tasks}, name,
            name, 1))
    if skipped:
      self.result['setup']['skipped_drafters'] = skipped
    self._add_ngrams(ngram_rows, cfg.vocab_size)
    self.drafts.sort(key=lambda d: d.group)  # stable: the paper's first

  # -- helpers ---------------------------------------------------------------

  def fits(self, seconds: float) -> bool:
    return self.clock.left() > seconds

  def skip(self, what: str, needed: float) -> None:
    self.result['skipped'].append(dict(
        what=what, needed_s=round(needed, 1),
        left_s=round(self.clock.left(), 1)))
    print(f'skipped (time budget): {what}', flush=True)
    self.write()

  def shape(self, batch: int):
    return jax.ShapeDtypeStruct((batch, self.Li), jnp.int32)

  def x(self, task: str, batch: int, start: int = 0):
    return jnp.asarray(self.inputs[task][start:start + batch])

  @staticmethod
  def rng(temp: float, i: int):
    return None if temp == 0 else jax.random.key(1000 + i)

  def baseline(self, tgt: Target, x, temp: float, rng, block: int = 1,
               lower: bool = False):
    fn = (decoding.temperature_sample.lower if lower else
          decoding.temperature_sample)
    if lower and temp != 0:
      rng = jax.random.key(0)
    return fn(tgt.model, tgt.params, x, max_decode_len=self.T,
              sampling=SamplingConfig(temp), eos_id=self.eos, rng=rng,
              block_size=block)

  def spec(self, tgt: Target, d: Draft, task: str, x, gamma: int,
           temp: float, rng, lower: bool = False):
    fn = (speculative.speculative_sample.lower if lower else
          speculative.speculative_sample)
    if lower and temp != 0:
      rng = jax.random.key(0)
    return fn(tgt.model, tgt.params, d.drafter, d.params[task], x,
              gamma=gamma, max_decode_len=self.T,
              sampling=SamplingConfig(temp), eos_id=self.eos, rng=rng)

  def base_key(self, tgt, batch, temp, block=1):
    return ('baseline', tgt.model, batch, temp, block)

  def spec_key(self, tgt, d, batch, gamma, temp):
    return ('speculative', tgt.model, d.drafter, batch, gamma, temp)

  def lower_base(self, tgt, batch, temp, block=1):
    return {self.base_key(tgt, batch, temp, block): lambda: self.baseline(
        tgt, self.shape(batch), temp, None, block, lower=True)}

  def lower_spec(self, tgt, d, batch, gamma, temp):
    task = self.tasks[0]
    return {self.spec_key(tgt, d, batch, gamma, temp): lambda: self.spec(
        tgt, d, task, self.shape(batch), gamma, temp, None, lower=True)}

  def lower_reference(self):
    tokens = jax.ShapeDtypeStruct((1, self.T), jnp.int32)
    key = ('reference', diagnostics.reference_model(self.target.model))
    return {key: lambda: diagnostics.lower_reference(
        self.target.model, self.target.params, self.shape(1), tokens)}

  def max_length(self) -> int:
    return self.ctx + self.sizes.max_k + 8

  def lower_calls(self, act: str, batch: int, ks):
    tgt = self.targets[act]
    x = self.shape(batch)
    return {('call', tgt.model, batch, k): (
        lambda k=k: measure.lower_call_time(
            tgt.model, tgt.params, x, k, context=self.ctx,
            max_length=self.max_length())) for k in ks
            if k not in self.t_ms.get((act, batch), {})}

  def lower_drafters(self, drafts: Sequence[Draft], batch: int):
    x = self.shape(batch)
    task = self.tasks[0]
    return {('draft', d.drafter, batch): (
        lambda d=d: measure.lower_drafter_token_time(
            d.drafter, d.params[task], x, 4, context=self.ctx))
            for d in drafts if (d.name, batch) not in self.t_draft_ms}

  def measure_calls(self, act: str, batch: int, ks) -> None:
    tgt = self.targets[act]
    x = self.x(self.tasks[0], batch)
    if (act, batch) not in self.caches:
      self.caches[act, batch] = measure.context_cache(
          tgt.model, tgt.params, x, self.ctx, self.max_length(),
          jit_setup=self.sizes.jit_setup)
    times = self.t_ms.setdefault((act, batch), {})
    start = time.perf_counter()
    for k in sorted(ks):
      if k in times:
        continue
      times[k] = 1e3 * measure.call_time(
          tgt.model, tgt.params, x, k, repeats=self.sizes.cost_repeats,
          context=self.ctx, cache=self.caches[act, batch])
    self.clock.note(f'time t(k), {act} activations, batch {batch}, '
                    f'k = {sorted(ks)}', time.perf_counter() - start)
    self._record_costs()

  def measure_drafters(self, drafts: Sequence[Draft], batch: int) -> None:
    x = self.x(self.tasks[0], batch)
    task = self.tasks[0]
    start = time.perf_counter()
    for d in drafts:
      if (d.name, batch) not in self.t_draft_ms:
        self.t_draft_ms[d.name, batch] = 1e3 * measure.drafter_token_time(
            d.drafter, d.params[task], x, 4, repeats=self.sizes.cost_repeats,
            context=self.ctx, jit_setup=self.sizes.jit_setup)
    self.clock.note(f'time drafters, batch {batch}',
                    time.perf_counter() - start)
    self._record_costs()

  def _record_costs(self) -> None:
    costs = {}
    for (act, batch), times in sorted(self.t_ms.items(),
                                      key=lambda kv: (kv[0][0], kv[0][1])):
      t1 = times.get(1)
      costs.setdefault(act, {})[str(batch)] = dict(
          t_ms={str(k): v for k, v in sorted(times.items())},
          cost={str(k): v / t1 for k, v in sorted(times.items())} if t1
          else {})
    self.result['costs'] = costs
    main = self.t_ms.get((self.main_act, 1), {})
    self.result['drafters'] = {
        d.name: dict(label=d.label, cost=d.cost, t_draft_ms={
            str(b): self.t_draft_ms[d.name, b] for b in self.sizes.batches
            if (d.name, b) in self.t_draft_ms}, c={
                str(b): self.c(d, b) for b in self.sizes.batches
                if (d.name, b) in self.t_draft_ms and
                1 in self.t_ms.get((self.main_act, b), {})})
        for d in self.drafts}
    if 1 in main and self.result['bandwidth']:
      floor_ms = 1e3 * self.step_bytes(1) / self.result['bandwidth'][
          'bytes_per_s']
      self.result['floor'] = dict(
          step_bytes=self.step_bytes(1), floor_ms=floor_ms,
          t1_ms=main[1], ratio=main[1] / floor_ms)

  def step_bytes(self, batch: int) -> int:
    """Bytes a 1-token decoder step reads: decoder weights and the caches."""
    return measure.step_bytes(self.target.model, self.target.params, batch,
                              self.ctx, self.Li)

  def c(self, d: Draft, batch: int) -> float:
    return self.t_draft_ms[d.name, batch] / self.t_ms[self.main_act, batch][1]

  def cost_map(self, batch: int, act: Optional[str] = None
               ) -> Dict[int, float]:
    times = self.t_ms.get((act or self.main_act, batch), {})
    return {k - 1: v / times[1] for k, v in times.items() if k > 1}

  def rule_gamma(self, task: str, d: Draft, temp: float) -> int:
    costs = self.cost_map(1)
    return theory.optimal_gamma(
        clip01(self.alpha_cal[task, d.proxy, temp]), self.c(d, 1), costs,
        max_gamma=min(self.sizes.max_gamma, max(costs)))

  def decode_estimate(self, batch: int) -> float:
    """Seconds of one baseline decode (a guess until one is measured)."""
    known = [v for (_, b, _), v in self.decode_s.items() if b == batch]
    if known:
      return max(known)
    t1 = self.t_ms.get((self.main_act, batch), {}).get(1)
    if t1 is None:
      t1 = self.t_ms.get((self.main_act, 1), {}).get(1, 10.0)
    return 1.2 * self.T * t1 / 1e3

  def row_estimate(self, batch: int, examples: int, calls: int = 2) -> float:
    # A speculative decode costs at most about a baseline one.
    return examples * (self.sizes.repeats + 1) * calls * self.decode_estimate(
        batch)

  def stage(self, plans: Sequence[Optional['Plan']]) -> None:
    """Compiles the plans' programs together, then runs them in order.

    One compile batch for several phases keeps the pool busy (fewer rounds
    of the slowest compile). Plans at the end are dropped while the stage
    does not fit the time left; rows inside a plan check again.
    """
    plans = [plan for plan in plans if plan is not None]
    while plans:
      lowerings = {}
      for plan in plans:
        lowerings.update(plan.lowerings)
      needed = self.pool.estimate(lowerings) + sum(p.rows_s for p in plans)
      if self.fits(needed):
        break
      dropped = plans.pop()
      self.skip(dropped.what, needed)
    if not plans:
      return
    self.pool.compile(' + '.join(p.what for p in plans), lowerings)
    for plan in plans:
      plan.run()

  # -- phases ----------------------------------------------------------------

  def phase_costs(self) -> None:
    """t(k) for k = 1..max_gamma+1 at batch 1, c, bandwidth, calibration."""
    s = self.sizes
    ks = range(1, min(s.max_gamma + 1, s.max_k) + 1)
    copy = jnp.zeros((s.copy_mib << 20) // 4, jnp.float32)
    lowerings = dict(self.lower_calls(self.main_act, 1, ks))
    lowerings.update(self.lower_drafters(self.drafts, 1))
    lowerings[('copies', copy.size)] = (
        lambda: measure.copy_passes.lower(copy, 1))
    self.pool.compile('costs at batch 1', lowerings)
    self.calibrate()
    start = time.perf_counter()
    per_pass = measure.loop_time(lambda n: measure.copy_passes(copy, n), 2,
                                 s.cost_repeats)
    self.result['bandwidth'] = dict(
        bytes=2 * copy.nbytes, seconds_per_pass=per_pass,
        bytes_per_s=2 * copy.nbytes / per_pass,
        how=f'{s.copy_mib} MiB float32 array, y = y + 1 in a compiled loop '
        '(each pass reads and writes it once)')
    del copy
    self.clock.note('time device copy (bandwidth)', time.perf_counter() - start)
    self.measure_calls(self.main_act, 1, ks)
    self.measure_drafters(self.drafts, 1)
    self.write()

  def calibrate(self) -> None:
    """alpha of every drafter (its unwidened proxy) on calibration inputs.

    The unwidened target decodes the calibration inputs once per task and
    temperature; every proxy scores those outputs (`measure`'s alpha: the
    same function as the widened models, at a fraction of the cost).
    """
    tgt = self.small_target

    def job(task, temp):
      sampling = SamplingConfig(temp)
      out = decoding.temperature_sample(
          tgt.model, tgt.params, self.calib[task], max_decode_len=self.T,
          sampling=sampling, eos_id=self.eos, rng=jax.random.key(7))
      return {key: float(np.mean(measure.betas_on_outputs(
          tgt.model, tgt.params, drafter, params[task], self.calib[task],
          out.tokens, out.lengths, sampling=sampling)))
              for key, (drafter, params) in self.proxies.items()}

    done = self.pool.run('alpha calibration (untimed)', {
        (task, temp): functools.partial(job, task, temp)
        for task in self.tasks for temp in self.temps})
    for (task, temp), alphas in done.items():
      for key, alpha in alphas.items():
        self.alpha_cal[task, key, temp] = alpha
    self.result['alpha_calibration'] = [
        dict(task=t, drafter=k, temperature=temp, alpha=a)
        for (t, k, temp), a in self.alpha_cal.items()]

  def plan_table2(self, temp: float, group: int) -> Optional['Plan']:
    drafts = [d for d in self.drafts if d.group == group]
    if not drafts:
      return None
    what = f'Table 2, t = {temp:g}, ' + {
        1: "the paper's drafters", 2: 'own-cost drafters',
        3: 'n-gram drafters'}[group]
    tgt = self.target
    rows = [(task, d, self.rule_gamma(task, d, temp)) for task in self.tasks
            for d in drafts]
    lowerings = dict(self.lower_base(tgt, 1, temp))
    for _, d, gamma in rows:
      lowerings.update(self.lower_spec(tgt, d, 1, gamma, temp))
    if temp == 0:
      lowerings.update(self.lower_reference())
    n = self.sizes.examples

    def run():
      for task, d, gamma in rows:
        needed = self.row_estimate(1, n)
        if not self.fits(needed):
          self.skip(f'{what}: {task} {d.name}', needed)
          continue
        start = time.perf_counter()
        row = self.decode_rows(tgt, task, d, temp, gamma, n)
        row.update(gamma_rule=True, group=group,
                   alpha_calibration=self.alpha_cal[task, d.proxy, temp],
                   paper=self.paper(task, d, temp))
        self.result['table2'].append(row)
        self.clock.note(f'{what}: {task} {d.name} gamma {gamma}',
                        time.perf_counter() - start)
        self.write()

    return Plan(what, lowerings, len(rows) * self.row_estimate(1, n), run)

  def paper(self, task: str, d: Draft, temp: float):
    paper_task = PAPER_TASK[task]
    if d.paper in T5_SIZES:
      g, a, s = PAPER_TABLE2[paper_task, int(temp)][d.paper]
      return dict(task=paper_task, gamma=g, alpha=a, speedup=s)
    if d.paper in ('unigram', 'bigram'):
      return dict(task=paper_task,
                  alpha=PAPER_TABLE3[paper_task][d.paper][int(temp)])
    return None

  def decode_rows(self, tgt: Target, task: str, d: Draft, temp: float,
                  gamma: int, examples: int, batch: int = 1,
                  act: Optional[str] = None) -> Dict[str, Any]:
    """Baseline and speculative decodes of `examples` x `batch` rows.

    Interleaved, medians of `repeats`; greedy rows are compared and each
    differing one diagnosed.
    """
    act = act or self.main_act
    rep = self.sizes.repeats
    base_s = spec_s = 0.0
    base_tok = spec_tok = 0
    sums = dict(beta_sum=0.0, beta_count=0, accepted=0, row_iterations=0,
                iterations=0)
    per_row_accepted, row_iters, identical, divergences = [], [], 0, []
    for i in range(examples):
      x = self.x(task, batch, i * batch)
      rng = self.rng(temp, i)
      med, out = time_interleaved({
          'baseline': lambda: self.baseline(tgt, x, temp, rng),
          'speculative': lambda: self.spec(tgt, d, task, x, gamma, temp, rng),
      }, rep, warm=i == 0)
      b, sp = out['baseline'], out['speculative']
      base_s += med['baseline']
      spec_s += med['speculative']
      base_tok += int(np.sum(b.lengths))
      spec_tok += int(np.sum(sp.lengths))
      st = sp.stats
      for k in sums:
        sums[k] += float(np.sum(getattr(st, k)))
      acc = np.asarray(st.accepted) / np.maximum(
          np.asarray(st.row_iterations), 1) + 1
      per_row_accepted += acc.tolist()
      row_iters += np.asarray(st.row_iterations).tolist()
      if temp == 0:
        bt, stok = np.asarray(b.tokens), np.asarray(sp.tokens)
        identical += int(np.sum(np.all(bt == stok, axis=1)))
        for dv in diagnostics.diagnose(tgt.model, tgt.params, np.asarray(x),
                                       bt, stok):
          divergences.append(dict(example=i * batch + dv.row, **dv.to_dict()))
    self.decode_s[act, batch, temp] = base_s / examples
    alpha = sums['beta_sum'] / max(sums['beta_count'], 1.0)
    c = self.t_draft_ms[d.name, batch] / self.t_ms[act, batch][1]
    cost = self.cost_map(batch, act)
    predicted = theory.walltime_improvement(clip01(alpha), gamma, c, cost)
    measured = (spec_tok / spec_s) / (base_tok / base_s)
    rows = examples * batch
    kinds = [dv['kind'] for dv in divergences]
    return dict(
        task=task, drafter=d.name, label=d.label, cost=d.cost,
        temperature=temp, batch=batch, rows=rows, gamma=gamma, alpha=alpha,
        c=c, cost_gamma_plus_1=cost[gamma], predicted=predicted,
        measured=measured, ratio=measured / predicted,
        baseline_s=base_s / examples, speculative_s=spec_s / examples,
        baseline_tokens=base_tok, speculative_tokens=spec_tok,
        mean_accepted_length=1 + sums['accepted'] / max(
            sums['row_iterations'], 1.0),
        per_row_accepted_length=per_row_accepted,
        iterations=sums['iterations'] / examples,
        mean_row_iterations=float(np.mean(row_iters)),
        identical=identical if temp == 0 else None,
        near_ties=kinds.count(diagnostics.NEAR_TIE) if temp == 0 else None,
        mismatches=kinds.count(diagnostics.MISMATCH) if temp == 0 else None,
        divergences=divergences, activation_dtype=act)

  def plan_numerics(self) -> 'Plan':
    """Identical rows and costs: bf16 / f32 activations, 1-token / block."""
    task, d, s = self.tasks[0], self.main, self.sizes
    gamma = self.rule_gamma(task, d, 0.0)
    k = gamma + 1
    lowerings = dict(self.lower_reference())
    for act, tgt in self.targets.items():
      lowerings.update(self.lower_base(tgt, 1, 0.0))
      lowerings.update(self.lower_base(tgt, 1, 0.0, k))
      lowerings.update(self.lower_spec(tgt, d, 1, gamma, 0.0))
      lowerings.update(self.lower_calls(act, 1, [1, k]))
    n = s.numerics_examples
    rows_s = len(self.targets) * n * (s.numerics_repeats + 1) * 3 * (
        self.decode_estimate(1))
    return Plan('numerics (bf16 / f32 activations, same-shape baseline)',
                lowerings, rows_s, functools.partial(
                    self.run_numerics, task, d, gamma, n))

  def run_numerics(self, task: str, d: Draft, gamma: int, n: int) -> None:
    s, k = self.sizes, gamma + 1
    for act, tgt in self.targets.items():
      needed = n * (s.numerics_repeats + 1) * 3 * self.decode_estimate(1)
      if not self.fits(needed):
        self.skip(f'numerics, {act} activations', needed)
        continue
      self.measure_calls(act, 1, [1, k])
      start = time.perf_counter()
      times = {'baseline': [], 'block': [], 'speculative': []}
      same = {'baseline': 0, 'block': 0}
      divs = {'baseline': [], 'block': []}
      for i in range(n):
        x = self.x(task, 1, i)
        med, out = time_interleaved({
            'baseline': lambda: self.baseline(tgt, x, 0.0, None),
            'block': lambda: self.baseline(tgt, x, 0.0, None, k),
            'speculative': lambda: self.spec(tgt, d, task, x, gamma, 0.0,
                                             None)}, s.numerics_repeats,
                                     warm=i == 0)
        for name in times:
          times[name].append(med[name])
        spec_tokens = np.asarray(out['speculative'].tokens)
        for name in same:
          tokens = np.asarray(out[name].tokens)
          same[name] += int(np.array_equal(tokens, spec_tokens))
          for dv in diagnostics.diagnose(tgt.model, tgt.params,
                                         np.asarray(x), tokens, spec_tokens):
            divs[name].append(dict(example=i, **dv.to_dict()))
      mean = {name: float(np.mean(v)) for name, v in times.items()}
      t = self.t_ms[act, 1]
      kinds = lambda name, kind: sum(dv['kind'] == kind for dv in divs[name])
      self.result['numerics'].append(dict(
          activation_dtype=act, drafter=d.name, gamma=gamma, rows=n,
          identical_1token=same['baseline'], identical_block=same['block'],
          near_ties_1token=kinds('baseline', diagnostics.NEAR_TIE),
          mismatches_1token=kinds('baseline', diagnostics.MISMATCH),
          near_ties_block=kinds('block', diagnostics.NEAR_TIE),
          mismatches_block=kinds('block', diagnostics.MISMATCH),
          divergences_1token=divs['baseline'], divergences_block=divs['block'],
          t1_ms=t[1], tk_ms=t[k], baseline_s=mean['baseline'],
          block_baseline_s=mean['block'], speculative_s=mean['speculative'],
          block_cost=mean['block'] / mean['baseline'] - 1.0,
          speedup=mean['baseline'] / mean['speculative'],
          speedup_vs_block=mean['block'] / mean['speculative']))
      self.clock.note(f'numerics, {act} activations ({n} rows)',
                      time.perf_counter() - start)
      self.write()

  def plan_batches(self) -> 'Plan':
    """Speed-ups at batch > 1 with the per-row spread of accepted lengths."""
    task, d, tgt = self.tasks[0], self.main, self.target
    gamma = self.rule_gamma(task, d, 0.0)
    batches = [b for b in self.sizes.batches if b > 1]
    lowerings = {}
    for b in batches:
      lowerings.update(self.lower_calls(self.main_act, b, [1, gamma + 1]))
      lowerings.update(self.lower_drafters([d], b))
      lowerings.update(self.lower_base(tgt, b, 0.0))
      lowerings.update(self.lower_spec(tgt, d, b, gamma, 0.0))
    lowerings.update(self.lower_reference())

    def run():
      for b in batches:
        if not self.fits(self.row_estimate(b, 1)):
          self.skip(f'batch {b}', self.row_estimate(b, 1))
          continue
        self.measure_calls(self.main_act, b, [1, gamma + 1])
        self.measure_drafters([d], b)
        start = time.perf_counter()
        row = self.decode_rows(tgt, task, d, 0.0, gamma, 1, batch=b)
        self.result['batches'].append(row)
        self.clock.note(f'batch {b}: decode', time.perf_counter() - start)
        self.write()

    return Plan('batches ' + ', '.join(map(str, batches)), lowerings,
                sum(self.row_estimate(b, 1) for b in batches), run)

  def plan_sweep(self) -> 'Plan':
    task, d, tgt = self.tasks[0], self.main, self.target
    known = self.cost_map(1)
    gammas = [g for g in self.sizes.sweep if g in known]
    lowerings = dict(self.lower_base(tgt, 1, 0.0))
    for g in gammas:
      lowerings.update(self.lower_spec(tgt, d, 1, g, 0.0))
    n = self.sizes.sweep_examples

    def run():
      for g in gammas:
        needed = self.row_estimate(1, n)
        if not self.fits(needed):
          self.skip(f'gamma sweep: gamma {g}', needed)
          continue
        start = time.perf_counter()
        self.result['sweep'].append(self.decode_rows(tgt, task, d, 0.0, g,
                                                     n))
        self.clock.note(f'gamma sweep: gamma {g}',
                        time.perf_counter() - start)
        self.write()

    return Plan(f'gamma sweep ({d.name}, t = 0)', lowerings,
                len(gammas) * self.row_estimate(1, n), run)

  def plan_cost_curve(self) -> 'Plan':
    ks = range(1, self.sizes.max_k + 1)
    lowerings = {}
    for b in self.sizes.batches:
      lowerings.update(self.lower_calls(self.main_act, b, ks))

    def run():
      for b in self.sizes.batches:
        self.measure_calls(self.main_act, b, ks)
        self.write()

    return Plan('cost(k) for every k and batch', lowerings,
                1.0 * len(lowerings), run)

  def run(self, watch: Optional['CompileWatch'] = None) -> None:
    self.temps = (0.0, 1.0)
    self.setup()
    if watch is not None:  # from here on, every timed program is prewarmed
      watch.install()
    self.phase_costs()
    chosen = self.args.phases
    when = lambda name, plan: plan() if name in chosen else None
    # Two compile batches, each in priority order (the last plans are
    # dropped first when a batch does not fit the time left).
    self.stage([when('table2', lambda: self.plan_table2(0.0, 1)),
                when('numerics', self.plan_numerics),
                when('batches', self.plan_batches)])
    self.stage([when('table2', lambda: self.plan_table2(0.0, 3)),
                when('table2', lambda: self.plan_table2(1.0, 1)),
                when('sweep', self.plan_sweep),
                when('table2', lambda: self.plan_table2(0.0, 2)),
                when('table2', lambda: self.plan_table2(1.0, 3)),
                when('table2', lambda: self.plan_table2(1.0, 2)),
                when('cost_curve', self.plan_cost_curve)])

  # -- output ----------------------------------------------------------------

  def mismatches(self) -> int:
    rows = self.result['table2'] + self.result['batches'] + self.result[
        'sweep']
    n = sum(r.get('mismatches') or 0 for r in rows)
    return n + sum(r['mismatches_1token'] + r['mismatches_block']
                   for r in self.result['numerics'])

  def write(self, plots: bool = False) -> None:
    self.result['wall_s'] = round(self.clock.elapsed(), 1)
    self.out_dir.mkdir(parents=True, exist_ok=True)
    stem = self.out_dir / f'accelerator_{self.args.source}'
    stem.with_suffix('.json').write_text(json.dumps(
        self.result, indent=1, default=_json_default))
    stem.with_suffix('.md').write_text(markdown(self.result))
    if plots:
      try:
        self.result['plots'] = write_plots(self.result, self.out_dir,
                                           stem.name)
      except Exception as e:  # pylint: disable=broad-except
        self.result['plots'] = []
        self.result['plot_error'] = repr(e)
      stem.with_suffix('.md').write_text(markdown(self.result))
      stem.with_suffix('.json').write_text(json.dumps(
          self.result, indent=1, default=_json_default))


def _json_default(x):
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  return str(x)


def _config_dict(cfg: network.T5Config) -> Dict[str, Any]:
  out = {}
  for f in dataclasses.fields(cfg):
    v = getattr(cfg, f.name)
    out[f.name] = v if isinstance(v, (int, float, str, bool, type(None))) else (
        list(v) if isinstance(v, (tuple, list)) else jnp.dtype(v).name)
  return out


# ---------------------------------------------------------------------------
# Markdown and plots.
# ---------------------------------------------------------------------------


def fmt(x, spec='.2f') -> str:
  return '-' if x is None else format(x, spec)


def markdown(r: Dict[str, Any]) -> str:
  title = ('Table 2 at T5 1.1-XXL cost on ' + r['device'] +
           (' (SYNTHETIC)' if r['synthetic'] else ''))
  lines = [f'# {title}', '']
  if r['synthetic']:
    lines += [f"> **{r['label']}.** Alphas are set by the noise, not earned by "
              'a drafter: these figures measure the engine (decoding loop, '
              'costs, numerics), not a model.', '']
  if r['smoke']:
    lines += ['> **SMOKE RUN**: tiny models on whatever device; the numbers '
              'mean nothing.', '']
  setup = r['setup']
  lines += [
      f"Command: `{r['command']}`  ", f"Device: {r['device']} "
      f"({r['backend']}), jax {r['jax_version']}  ",
      f"Machine: {r['machine']}  ", f"Date: {r['date']}  ",
      f"Status: {r['status']}; wall {r['wall_s']} s of a "
      f"{r['max_minutes']} min budget", '', '## Setup', '',
      f"Target: {r['label']}; {fmt(setup.get('target_params', 0) / 1e9)} B "
      f"parameters, {fmt(setup.get('decoder_params', 0) / 1e9)} B in the "
      'decoder, bfloat16 weights, activations '
      f"{setup.get('activation_dtype')}; batch 1 unless stated, "
      f"{setup.get('input_length')} input tokens, up to "
      f"{setup.get('output_length')} output tokens "
      f"(eos_id {setup.get('eos_id')}).", '']
  if setup.get('sigmas'):
    lines += ['Synthetic drafters: S0 + sigma x std(leaf) noise, sigma ' +
              ', '.join(f'{k} {v:g}' for k, v in setup['sigmas'].items()) +
              '; n-grams from S0\'s own greedy outputs.', '']
  for note in setup.get('notes', []) + setup.get('skipped_drafters', []):
    lines.append(f'- {note}')
  fl, bw = r['floor'], r['bandwidth']
  if fl:
    lines += ['', '## Baseline step vs its floor', '',
              '| t(1) ms | bytes read per step | device bandwidth (copy) | '
              'floor ms | t(1) / floor |', '|---|---|---|---|---|',
              f"| {fmt(fl['t1_ms'], '.3f')} | {fl['step_bytes'] / 1e9:.3f} GB "
              f"| {bw['bytes_per_s'] / 1e9:.0f} GB/s | "
              f"{fmt(fl['floor_ms'], '.3f')} | **{fmt(fl['ratio'])}** |", '',
              f"Bandwidth: {bw['how']}. Bytes per step: decoder weights plus "
              'the self- and cross-attention caches at the timed position.']
  if r['costs']:
    lines += ['', '## cost(k) = t(k) / t(1) of one target call on k tokens',
              '']
    for act, by_batch in r['costs'].items():
      ks = sorted({int(k) for v in by_batch.values() for k in v['cost']})
      lines += [f'Activations {act}:', '',
                '| batch | t(1) ms | ' + ' | '.join(f'k={k}' for k in ks) +
                ' |', '|' + '---|' * (len(ks) + 2)]
      for b, v in by_batch.items():
        cells = ' | '.join(fmt(v['cost'].get(str(k))) for k in ks)
        lines.append(f"| {b} | {fmt(v['t_ms'].get('1'), '.3f')} | {cells} |")
      lines.append('')
  if r['drafters']:
    lines += ['## Drafters: time per drafted token and c = t_draft / t(1)', '',
              '| drafter | cost | t_draft ms (batch 1) | c by batch |',
              '|---|---|---|---|']
    for name, d in r['drafters'].items():
      lines.append(
          f"| {d['label']} | {d['cost']} | "
          f"{fmt(d['t_draft_ms'].get('1'), '.3f')} | " + ', '.join(
              f'{b}: {v:.3f}' for b, v in d['c'].items()) + ' |')
    lines.append('')
  if r['table2']:
    lines += [
        '## Table 2: speculative vs baseline, T5 1.1-XXL-cost target', '',
        'gamma by the paper\'s rule (Theorem 3.8 maximised with the '
        'calibrated alpha, measured c and cost(gamma + 1)); predicted = '
        'Theorem 3.8 with the run\'s alpha; measured = speculative over '
        'baseline tokens/s (medians of interleaved repeats); identical: '
        'greedy rows equal to the baseline\'s (each differing one '
        'diagnosed, diagnostics.py).', '',
        '| task | drafter | t | gamma | alpha (calib / run) | c | '
        'cost(g+1) | predicted | measured | measured / predicted | '
        'identical | near ties / mismatches | paper gamma / alpha / speed-up |',
        '|' + '---|' * 13]
    order = lambda row: (row['temperature'], row['task'],
                         row.get('group', 9))
    for row in sorted(r['table2'], key=order):
      p = row.get('paper') or {}
      paper = ' / '.join(fmt(p.get(k), '') if k == 'gamma' else fmt(p.get(k))
                         for k in ('gamma', 'alpha', 'speedup')) if p else '-'
      lines.append(
          f"| {row['task']} | {row['label']} | {row['temperature']:g} | "
          f"{row['gamma']} | {fmt(row['alpha_calibration'])} / "
          f"{fmt(row['alpha'])} | {fmt(row['c'], '.3f')} | "
          f"{fmt(row['cost_gamma_plus_1'])} | {fmt(row['predicted'])} | "
          f"**{fmt(row['measured'])}** | {fmt(row['ratio'])} | "
          + _identical(row) + f' | {paper} |')
    lines.append('')
  if r['numerics']:
    lines += [
        '## Numerics: identical greedy rows, bfloat16 weights', '',
        'Rows: greedy outputs of the baseline compared with the speculative '
        'ones (same drafter and gamma). 1-token: the usual baseline; block: '
        'the same-shape baseline (`decoding.temperature_sample('
        'block_size=gamma + 1)`, each step computed with the verification\'s '
        'shapes). Every differing row is diagnosed: a near tie is rounding, '
        'a mismatch a bug.', '',
        '| activations | rows | identical (1-token) | near ties / mismatches '
        '| identical (block) | near ties / mismatches | t(1) ms | baseline s '
        '| block baseline s | block cost | speed-up (vs block) |',
        '|' + '---|' * 11]
    for n in r['numerics']:
      lines.append(
          f"| {n['activation_dtype']} | {n['rows']} | "
          f"{n['identical_1token']}/{n['rows']} | {n['near_ties_1token']} / "
          f"{n['mismatches_1token']} | {n['identical_block']}/{n['rows']} | "
          f"{n['near_ties_block']} / {n['mismatches_block']} | "
          f"{fmt(n['t1_ms'], '.3f')} | {fmt(n['baseline_s'], '.3f')} | "
          f"{fmt(n['block_baseline_s'], '.3f')} | "
          f"{100 * n['block_cost']:+.1f}% | {fmt(n['speedup'])} "
          f"({fmt(n['speedup_vs_block'])}) |")
    lines.append('')
  batch_rows = [row for row in r['table2'] if row['temperature'] == 0 and
                row['drafter'] == r.get('main_drafter')][:1] + r['batches']
  if r['batches']:
    lines += [
        '## Batch 1, 8, 32 (greedy, one drafter, gamma of batch 1)', '',
        'c and cost(gamma + 1) measured at each batch; iterations: target '
        'calls of the batch (its slowest row) against the mean row\'s.', '',
        '| batch | gamma | alpha | c | cost(g+1) | predicted | measured | '
        'measured / predicted | accepted length per row: min / median / max '
        '| iterations (batch / mean row) | identical | near ties / '
        'mismatches |', '|' + '---|' * 12]
    for row in batch_rows:
      acc = row['per_row_accepted_length']
      lines.append(
          f"| {row['batch']} | {row['gamma']} | {fmt(row['alpha'])} | "
          f"{fmt(row['c'], '.3f')} | {fmt(row['cost_gamma_plus_1'])} | "
          f"{fmt(row['predicted'])} | **{fmt(row['measured'])}** | "
          f"{fmt(row['ratio'])} | {min(acc):.2f} / {np.median(acc):.2f} / "
          f"{max(acc):.2f} | {row['iterations']:.1f} / "
          f"{row['mean_row_iterations']:.1f} | " + _identical(row) + ' |')
    lines.append('')
  if r['sweep']:
    lines += [f"## Gamma sweep ({r['sweep'][0]['label']}, t = 0, batch 1; "
              'one drafter only)', '',
              '| gamma | alpha | cost(g+1) | predicted | measured | '
              'measured / predicted | identical |', '|' + '---|' * 7]
    for row in r['sweep']:
      lines.append(
          f"| {row['gamma']} | {fmt(row['alpha'])} | "
          f"{fmt(row['cost_gamma_plus_1'])} | {fmt(row['predicted'])} | "
          f"**{fmt(row['measured'])}** | {fmt(row['ratio'])} | "
          f"{row['identical']}/{row['rows']} |")
    lines.append('')
  if r.get('plots'):
    lines += ['## Plots', ''] + [f'![{p}]({p})' for p in r['plots']] + ['']
  if r['skipped']:
    lines += ['## Skipped (time budget)', ''] + [
        f"- {s['what']}: needed ~{s['needed_s']} s, {s['left_s']} s left"
        for s in r['skipped']] + ['']
  lines += ['## Time log', '', '| at s | what | s |', '|---|---|---|'] + [
      f"| {e['at_s']} | {e['what']} | {e['seconds']} |" for e in r['time_log']]
  lines += ['', f"Compiles inside timed code (must be none): "
            f"{r['compile_misses'] or 'none'}"]
  return '\n'.join(lines) + '\n'


def _identical(row) -> str:
  if row.get('identical') is None:
    return 'n/a | n/a'
  return (f"{row['identical']}/{row['rows']} | {row['near_ties']} / "
          f"{row['mismatches']}")


def write_plots(r: Dict[str, Any], out_dir: pathlib.Path, stem: str
                ) -> List[str]:
  """Cost curves, Table 2, the gamma sweep and the batches; file names."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    return []
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  tag = ' (SYNTHETIC)' if r['synthetic'] else ''
  names = []

  def save(fig, name):
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    names.append(name)

  if r['costs']:
    fig, ax = plt.subplots(figsize=(6, 4))
    for act, by_batch in r['costs'].items():
      for b, v in by_batch.items():
        ks = sorted(int(k) for k in v['cost'])
        ax.plot(ks, [v['cost'][str(k)] for k in ks], 'o-',
                label=f'batch {b}, {act}')
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set_xlabel('k (tokens per target call)')
    ax.set_ylabel('cost(k) = t(k) / t(1)')
    ax.set_title(f"Target call cost on {r['device']}{tag}", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, f'{stem}_costs.png')
  if r['table2']:
    rows = r['table2']
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows)), 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [row['predicted'] for row in rows], 0.4,
           label='predicted (Thm 3.8)')
    ax.bar(x + 0.2, [row['measured'] for row in rows], 0.4, label='measured')
    ax.set_xticks(x, [f"{row['task'][:6]} {row['drafter'][:14]} "
                      f"t{row['temperature']:g}" for row in rows],
                  rotation=70, fontsize=6)
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set_ylabel('speed-up over the baseline')
    ax.set_title(f'Table 2 at T5-XXL cost{tag}', fontsize=9)
    ax.legend(fontsize=7)
    save(fig, f'{stem}_table2.png')
  if r['sweep']:
    rows = r['sweep']
    fig, ax = plt.subplots(figsize=(5, 3.6))
    g = [row['gamma'] for row in rows]
    ax.plot(g, [row['measured'] for row in rows], 'o-', label='measured')
    ax.plot(g, [row['predicted'] for row in rows], 's--', label='predicted')
    ax.set_xlabel('gamma')
    ax.set_ylabel('speed-up')
    ax.set_title(f"gamma sweep, {rows[0]['drafter']}{tag}", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, f'{stem}_sweep.png')
  if r['batches']:
    rows = [row for row in r['table2'] if row['temperature'] == 0 and
            row['drafter'] == r.get('main_drafter')][:1] + r['batches']
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.boxplot([row['per_row_accepted_length'] for row in rows])
    ax.set_xticks(range(1, len(rows) + 1),
                  [f"batch {row['batch']}" for row in rows])
    ax.set_ylabel('mean accepted length per row')
    ax.set_title(f'Per-row acceptance at batch 1, 8, 32{tag}', fontsize=9)
    save(fig, f'{stem}_batches.png')
  return names


# ---------------------------------------------------------------------------
# Entry point.
# ---------------------------------------------------------------------------


def device_name(kind: str) -> str:
  """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
  return re.sub(r'[^a-z0-9]+', '-', kind.lower()).strip('-') or 'device'


def run_header(argv: Sequence[str], max_minutes: float) -> Dict[str, Any]:
  """The command (home as ~), device, jax version, machine and date."""
  kind = jax.devices()[0].device_kind
  return dict(
      command=portable(' '.join(['python', SCRIPT] + list(argv))),
      device=kind, device_name=device_name(kind),
      backend=jax.default_backend(), jax_version=jax.__version__,
      machine=measure.machine(), date=time.strftime('%Y-%m-%d'),
      max_minutes=max_minutes)


def parse_flags(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--source', default='synthetic',
                      choices=['synthetic', 'shipped'])
  parser.add_argument('--out_dir', default=None,
                      help='default results/<device name>')
  parser.add_argument('--max_minutes', type=float, default=8.0,
                      help='wall budget; phases that do not fit are skipped')
  parser.add_argument('--smoke', action='store_true',
                      help='tiny models, seconds on a CPU (needs --out_dir)')
  parser.add_argument('--fused', action='store_true',
                      help='decode with q/k/v, cross k/v and the gated MLP '
                      'inputs fused into one matmul each '
                      '(network.for_decoding; issue 14)')
  parser.add_argument('--activation_dtype', default='bfloat16',
                      choices=['bfloat16', 'float32'],
                      help="the target's activations everywhere but the "
                      'numerics section (which runs both)')
  parser.add_argument('--phases',
                      default='table2,numerics,batches,sweep,cost_curve',
                      help='comma-separated subset (costs always run)')
  parser.add_argument('--compile_workers', type=int,
                      default=min(8, os.cpu_count() or 1))
  parser.add_argument('--examples', type=int, default=None,
                      help='batch-1 inputs per Table 2 / sweep row')
  parser.add_argument('--repeats', type=int, default=None)
  parser.add_argument('--input_length', type=int, default=None)
  parser.add_argument('--output_length', type=int, default=None)
  parser.add_argument('--sigma', default='',
                      help='synthetic noise, e.g. small=0.02,base=0.016')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  if args.smoke and not args.out_dir:
    parser.error('--smoke needs --out_dir (smoke results never go to '
                 'results/)')
  if args.max_minutes <= 0:
    parser.error(f'--max_minutes must be > 0, got {args.max_minutes}')
  if args.compile_workers < 1:
    parser.error(f'--compile_workers must be >= 1, got '
                 f'{args.compile_workers}')
  phases = set(filter(None, args.phases.split(',')))
  known = {'table2', 'numerics', 'batches', 'sweep', 'cost_curve'}
  if phases - known:
    parser.error(f'--phases: unknown {sorted(phases - known)}; known: '
                 f'{sorted(known)}')
  args.phases = phases
  sigma = {}
  for item in filter(None, args.sigma.split(',')):
    name, _, value = item.partition('=')
    if name not in SIGMAS or not value:
      parser.error(f'--sigma entries look like small=0.02 (names '
                   f'{list(SIGMAS)}), got {item!r}')
    sigma[name] = float(value)
  args.sigma = sigma
  for name in ('examples', 'repeats', 'input_length', 'output_length'):
    value = getattr(args, name)
    if value is not None and value < 1:
      parser.error(f'--{name} must be >= 1, got {value}')
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_flags(argv)
  sizes = SMOKE if args.smoke else FULL
  overrides = {k: getattr(args, k) for k in (
      'examples', 'repeats', 'input_length', 'output_length')
               if getattr(args, k) is not None}
  sizes = dataclasses.replace(sizes, **overrides)
  header = run_header(argv, args.max_minutes)
  out_dir = pathlib.Path(args.out_dir or os.path.join(
      'results', header['device_name']))
  clock = Clock(args.max_minutes)
  print(f"{header['command']}\n{header['machine']}", flush=True)
  pool = Pool(args.compile_workers, clock, 0.1 if args.smoke else 1.0)
  runner = Runner(args, sizes, clock, pool, out_dir, header)
  watch = CompileWatch()
  try:
    runner.run(watch)
    skipped = runner.result['skipped']
    runner.result['status'] = 'complete' if not skipped else (
        f'partial: {len(skipped)} parts skipped for time')
  except BaseException as e:
    runner.result['status'] = f'failed: {e!r}'
    raise
  finally:
    watch.remove()
    runner.result['compile_misses'] = watch.misses
    runner.result['main_drafter'] = getattr(getattr(runner, 'main', None),
                                            'name', None)
    mismatches = runner.mismatches()
    if mismatches:
      runner.result['status'] = (
          f'failed: {mismatches} greedy rows differ from the baseline beyond '
          'rounding (real mismatches; see "divergences")')
    runner.write(plots=True)
    pool.shutdown()
    print(f"{runner.result['status']}; wrote "
          f"{out_dir}/accelerator_{args.source}.{{md,json}} in "
          f'{clock.elapsed():.1f} s', flush=True)
  return 1 if mismatches else 0


if __name__ == '__main__':
  sys.exit(main())
