r"""A device run: a `DeviceSpec`'s phases on one accelerator, in a budget.

  python -m tools.accelerator --source shipped
  python -m tools.accelerator                                # SYNTHETIC
  python -m tools.accelerator --source shipped --project
  python -m tools.accelerator --smoke --out_dir /tmp/acc     # CPU

Needs jax, flax, numpy, matplotlib and this package importable (installed,
or the repository on PYTHONPATH); nothing on its path imports seqio,
TensorFlow, gin or rouge-score. What is measured is the spec's
(`spec`: its phases, sizes and result sections); how the plan is
projected is `plan`'s; the page and plots are `report`'s.

Fitting 9 minutes: every program is compiled ahead of time, once, in
`pool.Pool` threads: first all that need no gamma (beside the alpha
calibration), then, once c and the gammas are known, the speculative ones.
One program per (drafter, gamma, temperature, batch), shared by the tasks;
per example the baseline and every drafter of a temperature are timed in
alternating order (`measure.time_alternating`), so one baseline serves
every row and the sweep; caches are built by compiled programs.
`--compilation_cache` (jax's persistent cache, which also shares XLA's
autotuning results between programs) lets a second run read them from disk.

Executables compiled ahead of time (`aot`): `--aot_build gpu:h100`
compiles the run's cache, t(k), baseline and speculative programs here for
a compile-only H100 (with the device image's jax, jaxlib and plugin) into
`--aot_dir`/<target>/ with a manifest; a run loads each program from there
or, when it cannot (missing, corrupt, other versions or device, refused),
compiles it on the device and says why (`programs` in the json). Every
program is then run through its executable. The programs no build holds
compile beside the timing (`--compile_ahead`, `Runner.compile_ahead`):
once P1 has fixed the gammas, each phase from P2 on lowers as many of the
later phases' programs as its timing lets compile, and they compile in
threads of their own, the way the build compiles (no kernel timed on the
device), while it times; each phase waits only for what is not done yet.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import arrays
from specdec_jax import compiled
from specdec_jax import decoding
from specdec_jax import diagnostics
from specdec_jax import drafters as drafters_lib
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import paper
from specdec_jax import programs
from specdec_jax import scaffold
from specdec_jax import theory
from specdec_jax import widening
from specdec_jax import hardware
from specdec_jax.bench import budget
from specdec_jax.bench import report
from specdec_jax.bench import rows as rows_lib
from specdec_jax.checkpoints import hf as hf_lib
from specdec_jax.drafters.tree import shape as shape_lib
from specdec_jax.sampling import SamplingConfig
from tools.accelerator import aot
from tools.accelerator import plan as plan_lib
from tools.accelerator import pool as pool_lib
from tools.accelerator import report as run_report

# The command of a device run, before the spec's name (`main`'s header).
COMMAND = 'tools.accelerator'
SYNTHETIC_LABEL = (
    'SYNTHETIC: random T5 1.1-small widened to T5 1.1-XXL cost as the target, '
    'noisy copies of it as drafters (alpha set by the noise), not trained '
    'models')
# The context cache of the t(k) timings, compiled ahead of time like them.
CACHE = jax.jit(measure.context_cache, static_argnums=(0, 3, 4))
# measure.call_time's loop (lowered with arguments placed on a device).
CALLS = measure.repeated_calls
# The programs built ahead of time (`Runner.build`), and the order of the
# parts they are built in (what comes first survives a size limit). The
# others (the bandwidth copy, the diagnoses' teacher-forced pass) are
# compiled on the device. A drafter's timing loop ('draft') is small for its
# compile (about 20 thread-seconds each on the H100, like a loop's).
# The decode loops come before the cost curve beyond gamma + 1: a t(k)
# program is small and quick to compile on the device, a loop is not (the
# shipped run's 48 t(k) and cache programs alone weigh 60 MiB for an H100).
AOT_KINDS = ('cache', 'call', 'draft', 'base', 'spec', 'sbase', 'sspec')
PRIORITY = ('costs', 'table2@0', 'table2@1', 'trees', 'batches', 'hf',
            'cost_curve', 'sweep', 'numerics')


class Unavailable(Exception):
  """A phase cannot run here (e.g. a library it needs is missing)."""


def timed_compile(lower):
  """(lower().compile(), its seconds, the seconds of lower() alone)."""
  start = time.perf_counter()
  lowered = lower()
  lowered_at = time.perf_counter()
  return lowered.compile(), time.perf_counter() - start, lowered_at - start


def compiles_ahead(mode: str, platform: Optional[str], trusted: bool
                   ) -> bool:
  """Whether a run compiles programs beside the timing (--compile_ahead
  `mode`; `Runner.ahead_options`): 'auto' on a GPU or TPU whose build it
  trusts (`trusted`: it loads programs from one), never on a CPU."""
  return mode == 'on' or mode == 'auto' and trusted and platform not in (
      None, 'cpu')


def lower_or_error(lower):
  """lower(), or the exception it raised."""
  try:
    return lower()
  except Exception as e:  # pylint: disable=broad-except
    return e


def lowered_or_raise(lowered):
  """`lower_or_error`'s result, raised if an exception."""
  if isinstance(lowered, Exception):
    raise lowered
  return lowered


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


# The verdicts of the check of executables built ahead of time (`aot_check`).
TRUSTED, REFUSED = 'loaded programs used', 'every program compiled here'


class Runner:
  """Builds the models, compiles, runs the phases in order, writes results."""

  def __init__(self, spec: plan_lib.DeviceSpec, args,
               sizes: plan_lib.Sizes, clock: budget.Clock,
               pool: pool_lib.Pool, out_dir: pathlib.Path, header,
               store: Optional[aot.Store] = None):
    self.spec, self.args, self.s = spec, args, sizes
    self.clock, self.pool = clock, pool
    self.act, self.synthetic = args.activation_dtype, (
        args.source == 'synthetic')
    self.out_dir, self.stem = out_dir, out_dir / f'{spec.name}_{args.source}'
    self.t_ms: Dict[Any, Dict[int, float]] = {}  # (act, batch) -> {k: ms}
    self.t_draft_ms: Dict[Any, float] = {}  # (name, batch) -> ms
    self.alpha_cal: Dict[Any, float] = {}  # (task, proxy, temp) -> alpha
    self.gamma: Dict[Any, int] = {}  # (task, name, temp) -> gamma
    self.caches, self.decode_s, self.profile = {}, {}, None
    self.device, self.store = None, store
    # Why the ahead-of-time build is not used (`aot_check`), once it is not.
    self.refused: Optional[str] = None
    self.rates_from = None  # a measured run (json) for `phase_estimate`
    self.result = dict(
        **header, source=args.source, synthetic=self.synthetic,
        label=SYNTHETIC_LABEL if self.synthetic else
        'shipped trained models (specdec_jax.shipped)',
        smoke=bool(args.smoke), status='running', setup={}, bandwidth={},
        floor={}, costs={}, drafters={}, table2=[], numerics=[], batches=[],
        sweep=[], trees=[], hf=[], skipped=clock.skipped, time_log=clock.log,
        phases={pid: dict(title=title, parts=list(parts), status='pending')
                for pid, title, parts in spec.phase_plan},
        compile_misses=[], programs={}, compile_s={},
        device_facts=aot.device_facts(),
        aot_dir=None if store is None else report.portable(str(store.dir)))

  # -- models ----------------------------------------------------------------

  def widen(self, model, params, cost: str):
    """(model, params) widened to `cost` (as they are without costs)."""
    cfg = self.s.costs and widening.widened_config(
        model.config, dict(self.s.costs[cost]))
    if not cfg or cfg == model.config:
      return model, params
    widen = functools.partial(widening.widen, config=model.config,
                              new_config=cfg)
    return network.T5Model(cfg), (jax.eval_shape(widen, params) if (
        self.device is not None) else widen(params))  # building: shapes

  def setup(self) -> None:
    start, s = time.perf_counter(), self.s
    self.drafts = self.drafts_before_setup()
    self.tasks = plan_lib.tasks_of(self.args.source)
    n = max(plan_lib.stream_rows(max(s.batches)), s.examples,
            s.numerics_examples)
    self.proxies = {}
    (self._synthetic if self.synthetic else self._shipped)(n)
    self.by_name = {d.name: d for d in self.drafts}
    model, params = self.target
    self.targets = {a: (network.T5Model(model.config.replace(
        activation_dtype=None if a == 'bfloat16' else a)), params)
                    for a in self.spec.acts}
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
    self.trees = [plan_lib.Draft(
        plan_lib.tree_name(self.main.name, t), self.main.cost,
        self.main.proxy, None, 4, f'{self.main.label}, tree {t}',
        drafters_lib.TreeDrafter(self.main.drafter, shape_lib.parse(t)),
        self.main.params, tree=t) for t in s.trees]
    self.by_name.update({d.name: d for d in self.trees})
    # P5: the target and the first drafter as trained (HF holds the same).
    self.targets[plan_lib.AS_TRAINED] = self.small
    peer, peer_params = self.proxies[self.main.proxy]
    self.peer = plan_lib.Draft(
        plan_lib.peer_name(self.main.proxy), 'own', self.main.proxy, None,
        5, f'{self.main.proxy} as trained', peer, dict(peer_params))
    self.by_name[self.peer.name] = self.peer
    self.max_len = s.context + max(
        s.max_gamma + 1, s.profile_ks[0], *plan_lib.tree_widths(s)) + 8
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

  def drafts_before_setup(self) -> List[plan_lib.Draft]:
    return plan_lib.roster(
        self.spec, self.args.source, [] if self.synthetic else
        load_shipped().model_names(), self.s)

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
    sigmas = self.result['setup']['sigmas'] = dict(self.spec.sigmas,
                                                   **self.args.sigma)
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

  def place(self, tree):
    """`tree` as it is, or (building for a compile-only device) its
    `ShapeDtypeStruct`s on that device."""
    if self.device is None:
      return tree
    sharding = jax.sharding.SingleDeviceSharding(self.device)
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(
        np.shape(x), x.dtype, sharding=sharding), tree)

  def shape(self, batch: int):
    return self.place(jax.ShapeDtypeStruct((batch, self.Li), jnp.int32))

  def x(self, task: str, batch: int, start: int = 0):
    return jnp.asarray(self.inputs[task][start:start + batch])

  def decode_fn(self, key, task):
    """The decoding program `key` ('base' / 'spec', streamed: 'sbase' /
    'sspec') as a function of its dynamic arguments (params, [draft
    params,] inputs, rng), and the first of them (the executable's
    arguments)."""
    kind, act, *rest = key
    model, params = self.targets[act]
    temp = {'base': rest[-2], 'spec': rest[-1]}.get(kind, 0.0)
    if kind in ('base', 'sbase'):  # (block), or streamed (slots, ...)
      fields = (dict(block_size=rest[-1]) if kind == 'base' else
                dict(batch_size=rest[0]))
    else:  # (drafter, batch or slots, gamma, ...)
      fields = dict(gamma=rest[2], batch_size=rest[1] if kind == 'sspec' else 0)
    spec = programs.ProgramSpec(
        'baseline' if kind in ('base', 'sbase') else 'speculative',
        'stream' if kind in ('sbase', 'sspec') else 'fixed',
        max_decode_len=self.T, sampling=SamplingConfig(temp), eos_id=self.eos,
        **fields)
    if spec.kind == 'baseline':
      return programs.Program(spec, model), (params,)
    d = self.by_name[rest[0]]
    return programs.Program(spec, model, d.drafter), (params, d.params[task])

  def sample(self, key, task, x, rng):
    """Runs the decoding program `key` (its executable)."""
    fn, head = self.decode_fn(key, task)
    return self.pool.executables.get(self.ident(key), fn)(*head, x, rng)

  def lowering(self, key):
    """A call with no arguments that lowers the program `key`."""
    kind, task, ctx = key[0], self.tasks[0], self.s.context
    model, params = self.targets[key[1] if kind in (
        'cache', 'call', 'base', 'spec', 'sbase', 'sspec') else self.act]
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
    if kind == 'call':  # measure.call_time's loop, its arguments placed
      return lambda: CALLS.lower(
          model, params, self.place(jax.ShapeDtypeStruct(
              (key[2], key[3]), jnp.int32)), self.place(measure.context_cache(
                  model, params, self.shape(key[2]), ctx, self.max_len)), 1)
    if kind == 'draft':
      d = self.by_name[key[1]]
      return lambda: measure.lower_drafter_token_time(
          d.drafter, d.params[task], self.shape(key[2]), 4, context=ctx,
          place=self.place, target_params=params)
    fn, head = self.decode_fn(key, task)
    temp = {'base': key[-2], 'spec': key[-1]}.get(kind, 0.0)
    rng = self.place(jax.eval_shape(lambda: jax.random.key(0))) if temp else (
        None)
    rows = {'base': key[2], 'spec': key[3]}.get(kind, key[-1])  # streams: N
    # The decoders' own options (a decode's entry takes none when traced
    # inside this jit): the dots smaller than the target's matmuls are
    # XLA's fusions on a GPU, as the eval job compiles them.
    options = dict(scaffold.compiler_options(head)) or None
    return lambda: jax.jit(fn, compiler_options=options).lower(
        *head, self.shape(rows), rng)

  def ident(self, key):
    """The program of `key`: names as their drafters (equal ones share)."""
    at = {'draft': 1, 'spec': 2, 'sspec': 2}.get(key[0])
    return tuple(self.by_name[x].drafter if i == at else x
                 for i, x in enumerate(key))

  def compile(self, what: str, keys) -> int:
    """Loads (`--aot_dir`) or compiles the programs `keys`."""
    names = {}
    for k in keys:
      names.setdefault(self.ident(k), aot.program_name(k))
    load = None if self.store is None or self.refused else (
        lambda ident: self.store.load(names[ident]))
    n = self.pool.compile(what, {self.ident(k): self.lowering(k)
                                 for k in keys}, load, self.refused or '')
    self.result['programs'].update(
        {names[i]: self.pool.sources[i] for i in names
         if i in self.pool.sources})
    self.result['compile_s'].update(
        {names[i]: round(self.pool.program_seconds[i], 2) for i in names
         if i in self.pool.program_seconds})
    return n

  # -- measurements ----------------------------------------------------------

  def measure_calls(self, act: str, batch: int, ks) -> None:
    times = self.t_ms.setdefault((act, batch), {})
    ks, (_, params) = sorted(set(ks) - set(times)), self.targets[act]
    start = time.perf_counter()
    if not ks:
      return
    exe, cache = self.pool.executables.get, self.cache(act, batch)
    for k in ks:  # measure.call_time's timing of its loop's executable
      run, block = exe(self.ident(('call', act, batch, k))), jnp.full(
          (batch, k), 7, jnp.int32)
      times[k] = 1e3 * measure.loop_time(
          lambda n, run=run, block=block: run(params, block, cache, n), 20,
          self.s.cost_repeats)
    self.clock.note(f'time t(k), {act} activations, batch {batch}, k = {ks}',
                    time.perf_counter() - start, kind='calls', units=len(ks))
    self.record()

  def cache(self, act: str, batch: int):
    """The target's cache of the first task's inputs at `batch`, built by
    its compiled program (what t(k) is timed on)."""
    if (act, batch) not in self.caches:
      self.caches[act, batch] = self.pool.executables[self.ident(
          ('cache', act, batch))](self.targets[act][1],
                                  self.x(self.tasks[0], batch))
    return self.caches[act, batch]

  def measure_drafters(self, drafts, batch: int) -> None:
    todo = [d for d in drafts if (d.name, batch) not in self.t_draft_ms]
    x, start = self.x(self.tasks[0], batch), time.perf_counter()
    for d in todo:
      self.t_draft_ms[d.name, batch] = 1e3 * measure.drafter_token_time(
          d.drafter, d.params[self.tasks[0]], x, 4, jit_setup=True,
          repeats=self.s.cost_repeats, context=self.s.context,
          executable=self.pool.executables.get(self.ident(
              ('draft', d.name, batch))),
          target_params=self.targets[self.act][1])
    self.clock.note(f'time drafters, batch {batch}', time.perf_counter() -
                    start, kind='drafters', units=len(todo))
    self.record()

  def aot_check(self, key, here, again: Sequence[str] = ('p1',)) -> None:
    """t(1) by the executable compiled ahead of time and by `here`, the
    same program compiled on this device (XLA autotunes only here), before
    anything is timed. A loaded one slower than `plan_lib.AOT_SLOWER`
    allows is not trusted: the programs loaded so far are dropped (those
    of the phases `again` compiled here at once), and the later ones are
    compiled here too (`refused`), so that no table sets loaded programs
    beside programs compiled here."""
    params, batch = self.targets[key[1]][1], key[2]
    block = jnp.full((batch, key[3]), 7, jnp.int32)
    cache = self.cache(key[1], batch)
    time_ms = lambda run: 1e3 * measure.loop_time(
        lambda n: run(params, block, cache, n), 20, self.s.cost_repeats)
    loaded = time_ms(self.pool.executables[self.ident(key)])
    ms = time_ms(here)
    trusted = loaded <= plan_lib.AOT_SLOWER * ms
    self.result['aot_check'] = dict(
        program=aot.program_name(key), loaded_ms=loaded, compiled_here_ms=ms,
        loaded_over_compiled_here=loaded / ms, limit=plan_lib.AOT_SLOWER,
        verdict=TRUSTED if trusted else REFUSED)
    print(f'ahead-of-time check, {aot.program_name(key)}: loaded {loaded:.3f}'
          f' ms, compiled here {ms:.3f} ms: '
          f"{self.result['aot_check']['verdict']}", flush=True)
    if not trusted:
      self.refuse_store(loaded / ms)
      self.pool.forget_loaded()
      self.pool.adopt(self.ident(key), here, f'compiled ({self.refused})')
      for pid in again:
        self.phase_programs(pid)

  def loadable(self) -> Dict[str, Any]:
    """The programs this run may load: those built ahead of time from this
    code (`aot.Store.usable`), none without a build or once its check
    refused it (`refused`)."""
    return {} if self.store is None or self.refused else self.store.usable()

  def refuse_store(self, ratio: float) -> None:
    self.refused = (f'the ahead-of-time build ran t(1) {ratio:.2f}x slower '
                    "than this device's compile")

  def check_store(self) -> None:
    """The check of a resumed run that takes P1 as an earlier run left it
    (`aot_check` runs in P1): that run's verdict, or else the check here,
    of the t(1) program and its cache loaded from the store."""
    earlier = self.result.get('aot_check') or {}
    if self.store is None or 'verdict' in earlier:
      if earlier.get('verdict') == REFUSED:
        self.refuse_store(earlier['loaded_over_compiled_here'])
      return
    key = ('call', self.act, 1, 1)
    if aot.program_name(key) not in self.loadable():
      return  # nothing to check: the phases left compile here
    self.compile('store check: load', [('cache', self.act, 1), key])
    if self.pool.sources.get(self.ident(key)) == 'loaded':
      here = self.pool.run('compile the t(1) program here (check)', {
          key: functools.partial(timed_compile, self.lowering(key))},
                           'compile')[key][0]
      self.aot_check(key, here, again=())

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
            for task in self.tasks for t in self.spec.temps}

  def calibration_key(self) -> Dict[str, Any]:
    """What the alpha calibration depends on: the package's code, the
    models (the shipped manifest's sha256, or the synthetic seed and
    noise) and the run's sizes, tasks and lengths."""
    setup = self.result['setup']
    if self.synthetic:
      models = dict(seed=self.args.seed, sigmas=setup.get('sigmas'))
    else:
      shipped = load_shipped()
      models = aot.sha256(pathlib.Path(shipped.asset_dir(),
                                       shipped.MANIFEST).read_bytes())
    return json.loads(json.dumps(dict(
        code=aot.code_fingerprint(), source=self.args.source,
        smoke=bool(self.args.smoke), models=models,
        **{k: setup[k] for k in ('sizes', 'tasks', 'input_length',
                                 'output_length')})))

  def carried_calibration(self) -> Optional[Dict[str, Any]]:
    """The alpha calibration the ahead-of-time build computed
    (`build`), if it was computed for this run (`calibration_key`): alpha
    is a property of the models and examples, not of the device, so the
    device need not compile its decodes."""
    carried = None if self.store is None else (
        self.store.manifest.get('alpha_calibration'))
    return carried if carried and carried.get(
        'key') == self.calibration_key() else None

  # -- decoding --------------------------------------------------------------

  def alternate(self, task, keys, batch: int, examples: int, temp: float
                ) -> Dict[Any, rows_lib.Decoded]:
    """Every example decoded by every program, in alternating order."""
    def calls_of(i):
      x, rng = self.x(task, batch, i * batch), (
          jax.random.key(1000 + i) if temp else None)
      return {k: functools.partial(self.sample, k, task, x, rng)
              for k in keys}
    results, seconds = self.timed_examples(calls_of, examples)
    self.decode_s[batch] = seconds[keys[0]] / examples
    return {k: rows_lib.Decoded(results[k], seconds[k]) for k in keys}

  def timed_examples(self, calls_of: Callable[[int], Dict[Any, Callable]],
                     examples: int):
    """({name: each example's output}, {name: seconds summed}) of the
    calls `calls_of(i)` ({name: callable}) of examples i < `examples`,
    timed in alternating order (`measure.time_alternating`), each one's
    first run untimed."""
    results, seconds = collections.defaultdict(list), collections.Counter()
    for i in range(examples):
      calls = calls_of(i)
      if i == 0:
        jax.block_until_ready([f() for f in calls.values()])
      out, t = measure.time_alternating(calls, self.s.repeats, i % 2 == 1)
      for k in calls:
        results[k].append(out[k])
        seconds[k] += t[k]
    return results, seconds

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

  def row(self, task, d: plan_lib.Draft, temp, gamma, base, spec, batch=1,
          slots=None):
    """A Table 2 / sweep / batch / tree row: measured, and `predict`ed
    (a chain's from its alpha; a tree's from its tokens per target call,
    at the first drafter's c per level). `batch`: rows per decode call;
    `slots`: a stream's slots (the batch its calls run at)."""
    rows_per_call, batch = batch, slots or batch
    cmp = rows_lib.compare(base, spec, greedy=temp == 0)
    del cmp['per_position_acceptance']
    if d.tree is None:
      p = hardware.predict(self.profile,
                           alpha=theory.clamp_alpha(cmp['alpha']),
                           gamma=gamma, drafter=d.name, batch=batch)
    else:
      p = hardware.predict(
          self.profile, tokens_per_call=cmp['tokens_per_call'],
          width=shape_lib.parse(d.tree).verified_width(temp == 0),
          drafter_calls_per_call=gamma, drafter=self.main.name, batch=batch)
    divs = self.diagnose(self.act, task, rows_per_call, base,
                         spec) if not temp else []
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

  def paper(self, task: str, d: plan_lib.Draft, temp: float):
    task = self.spec.paper_task[task]
    if d.paper in self.spec.t5_sizes:
      g, a, s = paper.TABLE2[task, int(temp)][d.paper]
      return dict(task=task, gamma=g, alpha=a, speedup=s)
    if d.paper in ('unigram', 'bigram'):
      return dict(task=task, alpha=paper.TABLE3[task][d.paper][int(temp)])
    return None

  def table(self, temp: float) -> None:
    """Table 2 rows of every task at `temp`: every drafter at the gamma of
    the profile's rule, the first one also at the paper's rule's."""
    s, main, act = self.s, self.main, self.act
    for task in self.tasks:
      rules = [(d, 'profile', self.gamma[task, d.name, temp])
               for d in self.drafts] + [
                   (main, 'paper', self.gamma[task, main.name, temp, 'paper'])]
      keys = [('base', act, 1, temp, 1)] + list(dict.fromkeys(
          ('spec', act, d.name, 1, g, temp) for d, _, g in rules))
      what = f'Table 2, t = {temp:g}: {task}'
      if not self.clock.fits(self.estimate(1, s.examples, len(keys)), what):
        continue
      start = time.perf_counter()
      timed = self.alternate(task, keys, 1, s.examples, temp)
      for d, rule, g in rules:  # the paper's rule may share a program
        key = ('spec', act, d.name, 1, g, temp)
        row = self.row(task, d, temp, g, timed[keys[0]], timed[key])
        row.update(gamma_rule=rule, group=d.group, paper=self.paper(
            task, d, temp), alpha_calibration=self.alpha_cal[
                task, d.proxy, temp])
        self.result['table2'].append(row)
      self.clock.note(what, time.perf_counter() - start, kind='decode',
                      units=(s.examples * s.repeats + 1) * len(keys))
      self.write()

  def tree_rows(self) -> None:
    """Every token tree of the first drafter against the baseline and the
    task's best greedy chain of Table 2 (t = 0, batch 1)."""
    s, act = self.s, self.act
    for task in self.tasks:
      keys = [('base', act, 1, 0.0, 1)] + plan_lib.tree_keys(
          s, self.main.name, act)
      what = f'token trees: {task}'
      if not self.clock.fits(self.estimate(1, s.examples, len(keys)), what):
        continue
      start = time.perf_counter()
      timed = self.alternate(task, keys, 1, s.examples, 0.0)
      chains = [x for x in self.result['table2']
                if x['task'] == task and x['temperature'] == 0]
      chain = max(chains, key=lambda x: x['measured'], default=None)
      for key in keys[1:]:
        d = self.by_name[key[2]]
        row = self.row(task, d, 0.0, key[4], timed[keys[0]], timed[key])
        row.update(tree=d.tree, nodes=shape_lib.parse(d.tree).verified_width(
            True) - 1, best_chain=chain and f"{chain['drafter']} gamma "
                   f"{chain['gamma']}", vs_best_chain=chain and (
                       row['measured'] / chain['measured']))
        self.result['trees'].append(row)
      self.clock.note(what, time.perf_counter() - start, kind='decode',
                      units=(s.examples * s.repeats + 1) * len(keys))
      self.write()

  def hf_rows(self, torch) -> None:
    """Per task, greedy, batch 1: our baseline and speculative loop against
    HF's `generate` and assisted generation (`checkpoints.hf.generate`) on
    the same models (the target and the first drafter as trained, no
    widening: HF cannot hold the widened ones beside ours), bfloat16, the
    same device and inputs, each example decoded by all four in
    alternating order; gamma: the first drafter's greedy gamma of P2."""
    s = self.s
    start = time.perf_counter()
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    f32 = lambda p: jax.tree_util.tree_map(
        lambda x: np.asarray(x, np.float32), p)
    convert = lambda p, cfg: hf_lib.to_hf_model(f32(p), cfg).to(
        device=dev, dtype=torch.bfloat16)
    model, params = self.targets[plan_lib.AS_TRAINED]
    hf_target, copies, drafts = convert(params, model.config), {}, {}
    for task in self.tasks:  # tasks that share the drafter share its copy
      p = self.peer.params[task]
      if id(p) not in copies:
        copies[id(p)] = convert(p, self.peer.drafter.model.config)
      drafts[task] = copies[id(p)]
    self.clock.note('P5: the models as HF transformers, on ' + dev,
                    time.perf_counter() - start, kind='setup')
    as_trained = plan_lib.AS_TRAINED
    for task in self.tasks:
      gamma = self.gamma[task, self.main.name, 0.0]
      keys = [('base', as_trained, 1, 0.0, 1),
              ('spec', as_trained, self.peer.name, 1, gamma, 0.0)]
      what = f'ours vs HF transformers: {task}'
      if not self.clock.fits(self.estimate(1, s.examples, 4), what):
        continue
      start = time.perf_counter()
      methods = ('ours baseline', 'ours speculative', 'HF greedy',
                 'HF assisted')
      def calls_of(i, task=task, keys=keys, gamma=gamma):
        x = self.x(task, 1, i)
        host = np.asarray(x)
        return {
            methods[0]: functools.partial(self.sample, keys[0], task, x, None),
            methods[1]: functools.partial(self.sample, keys[1], task, x, None),
            methods[2]: functools.partial(hf_lib.generate, hf_target, host,
                                          self.T, self.eos),
            methods[3]: functools.partial(hf_lib.generate, hf_target, host,
                                          self.T, self.eos, drafts[task],
                                          gamma)}
      outs, seconds = self.timed_examples(calls_of, s.examples)
      tokens, differ = dict.fromkeys(methods, 0), dict.fromkeys(methods, 0)
      for i in range(s.examples):
        rows = {m: np.asarray(outs[m][i].tokens)[0] if m.startswith('ours')
                else outs[m][i] for m in methods}
        for m in methods:
          tokens[m] += int(decoding.output_lengths(rows[m][None],
                                                   self.eos)[0])
          differ[m] += int(not np.array_equal(rows[m], rows[methods[0]]))
      tps = {m: tokens[m] / max(seconds[m], 1e-12) for m in methods}
      self.result['hf'].append(dict(
          task=task, gamma=gamma, rows=s.examples, device=dev,
          torch=torch.__version__, **{
              f'{m} tokens_per_s': tps[m] for m in methods}, **{
                  f'{m} differing': differ[m] for m in methods[1:]},
          baseline_vs_generate=tps[methods[0]] / tps[methods[2]],
          speculative_vs_assisted=tps[methods[1]] / tps[methods[3]],
          ours_gain=tps[methods[1]] / tps[methods[0]],
          hf_gain=tps[methods[3]] / tps[methods[2]]))
      self.clock.note(what, time.perf_counter() - start, kind='decode',
                      units=(s.examples * s.repeats + 1) * 4)
      self.write()

  def sweep(self) -> None:
    """The gamma sweep of the first drafter (t = 0, first task)."""
    s, main, act, task = self.s, self.main, self.act, self.tasks[0]
    keys = [('base', act, 1, 0.0, 1)] + [
        ('spec', act, main.name, 1, g, 0.0) for g in s.sweep]
    what = f'gamma sweep: {task}'
    if not self.clock.fits(self.estimate(1, s.examples, len(keys)), what):
      return
    start = time.perf_counter()
    timed = self.alternate(task, keys, 1, s.examples, 0.0)
    self.result['sweep'] += [self.row(task, main, 0.0, k[4], timed[keys[0]],
                                      timed[k]) for k in keys[1:]]
    self.clock.note(what, time.perf_counter() - start, kind='decode',
                    units=(s.examples * s.repeats + 1) * len(keys))
    self.write()

  def numerics(self) -> None:
    """Identical rows and costs: bf16 / f32 activations, 1-token / block."""
    s, task, d = self.s, self.tasks[0], self.main
    gamma = self.gamma[task, d.name, 0.0]
    n, k = s.numerics_examples, gamma + 1
    for act in self.spec.acts:
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
    """Speed-ups at batch > 1 with the per-row spread of accepted lengths:
    fixed batches at batch 1's gamma and at the profile's gamma for the
    batch (the eval job's rule), and the eval job's streamed loop (twice
    the batch's examples through its slots, refilled) at the latter,
    against the streamed baseline."""
    task, d, act = self.tasks[0], self.main, self.act
    gamma = self.gamma[task, d.name, 0.0]
    for b in (b for b in self.s.batches if b > 1):
      if not self.clock.fits(self.estimate(b, 1, 7), f'batch {b}'):
        continue
      own = self.gamma.get((task, d.name, 0.0, 'batch', b), gamma)
      self.measure_calls(act, b, [1, gamma + 1, own + 1])
      self.measure_drafters([d], b)
      start = time.perf_counter()
      fixed = [('base', act, b, 0.0, 1)] + list(dict.fromkeys(
          ('spec', act, d.name, b, g, 0.0) for g in (gamma, own)))
      timed = self.alternate(task, fixed, b, 1, 0.0)
      rules = [(gamma, 'batch 1' + f' (= profile at batch {b})' * (
          own == gamma))] + [(own, f'profile at batch {b}')] * (own != gamma)
      for g, rule in rules:
        key = ('spec', act, d.name, b, g, 0.0)
        row = self.row(task, d, 0.0, g, timed[fixed[0]], timed[key], batch=b)
        row.update(batching='fixed', gamma_rule=rule)
        self.result['batches'].append(row)
      n = plan_lib.stream_rows(b)
      stream = [('sbase', act, b, n), ('sspec', act, d.name, b, own, n)]
      base, spec = self.alternate(task, stream, n, 1, 0.0).values()
      row = self.row(task, d, 0.0, own, base, spec, batch=n, slots=b)
      row.update(batching='stream', gamma_rule=f'profile at batch {b}')
      self.result['batches'].append(row)
      self.clock.note(f'batch {b}: decode', time.perf_counter() - start,
                      kind='batch_decode',
                      units=(self.s.repeats + 1) * (len(fixed) + 4))
      self.write()

  def cost_curve(self) -> None:
    """The rest of the cost curve (`plan_lib.curve`: P1 timed the k the
    rows need, `plan_lib.needed_ks`), and c at each larger batch; a
    batch whose t(k) do not fit the time left (~1 s each) is skipped."""
    for b in self.s.batches:
      ks = plan_lib.curve(self.spec, self.s, b)
      if self.clock.fits(len(ks), f'cost curve, batch {b}'):
        self.measure_calls(self.act, b, list(ks))
        if b > 1:
          self.measure_drafters([self.main], b)

  # -- the run ---------------------------------------------------------------

  def run(self, watch: pool_lib.CompileWatch) -> None:
    """Setup, then the phases in priority order (the spec's `phase_plan`)."""
    self.setup()
    self.resume()
    if self.result['phases']['p1'].get('earlier_run'):
      self.check_store()
    self.write()
    for pid, _, parts in self.spec.phase_plan:
      self.phase(pid, parts)
      watch.install()  # from here on, every timed program is compiled

  def phase(self, pid: str, parts) -> None:
    """Runs phase `pid` if it is wanted, not done and fits the budget."""
    state = self.result['phases'][pid]
    name = f'{pid.upper()} {self.spec.titles[pid]}'
    if state['status'] == 'complete':
      print(f'{name}: complete in {self.stem}.json (an earlier run): not '
            'run again', flush=True)
      return
    if pid in self.spec.not_implemented:
      state.update(status='not implemented',
                   note=self.spec.not_implemented[pid])
      return
    if not self.requested(pid):
      state['status'] = 'not requested (--phases)'
      return
    if pid != 'p1' and self.result['phases']['p1']['status'] != 'complete':
      state['status'] = 'skipped: needs P1 (the hardware profile)'
      print(f'skipped: {name} ({state["status"]})', flush=True)
      return
    need = self.phase_estimate(pid)
    if not self.clock.fits(need, name):
      state['status'] = (f'skipped (time budget): needs ~{need:.0f} s, '
                         f'{max(self.clock.left(), 0):.0f} s left')
      return
    state.update(status='running', estimate_s=round(need, 1))
    self.result['status'] = f'partial: running {pid.upper()}'
    self.write()
    start, skipped = time.perf_counter(), len(self.clock.skipped)
    try:
      self.steps()[pid]()
    except Unavailable as e:  # nothing measured; the later phases run
      state.update(status=f'unavailable: {e}')
      print(f'{name}: unavailable ({e})', flush=True)
      self.write()
      return
    cut = [x['what'] for x in self.clock.skipped[skipped:]]
    state.update(seconds=round(time.perf_counter() - start, 1),
                 status='partial: skipped ' + '; '.join(cut) if cut else
                 'complete')
    self.write()

  def requested(self, pid: str) -> bool:
    """Whether phase `pid` measures a part --phases asks for (P1's
    profile always)."""
    return bool(set(self.result['phases'][pid]['parts']) & (
        self.args.phases | {'costs'}))

  def phase_estimate(self, pid: str) -> float:
    """Seconds of phase `pid`: its units at this run's rates so far, the
    kinds it has not timed yet at those of `rates_from` (the measured run
    of the projection; none in a smoke run). Programs compiled already
    cost nothing, those built ahead of time a load, those compiling beside
    the earlier phases (`compile_ahead`) the wait for them."""
    keys = self.phase_keys()[pid][0]
    units = plan_lib.plan_units(
        self.spec, self.s, self.drafts, self.tasks, self.gamma,
        self.args.phases, self.act,
        calibrated=self.carried_calibration() is not None)[pid]
    built, pending = self.loadable(), set(self.pool.pending)
    todo = collections.Counter(
        'ahead' if self.ident(k) in pending else
        'load' if aot.program_name(k) in built else 'compile'
        for k in {self.ident(k): k for k in keys
                  if self.ident(k) not in self.pool.compiled}.values())
    units.update({kind: todo[kind] for kind in ('compile', 'load', 'ahead')})
    own = pool_lib.projected_seconds(self.result, units, self.pool.workers)
    rest = {k: units[k] for k in own['unmeasured']}
    more = pool_lib.projected_seconds(self.rates_from, rest, self.pool.workers)[
        'seconds'] if rest and self.rates_from else 0.0
    return own['seconds'] + more

  def phase_programs(self, pid: str) -> int:
    """Loads or compiles the programs of phase `pid`; then starts the
    later phases' compiles (`compile_ahead`)."""
    n = self.compile(f'{pid.upper()} programs', self.phase_keys()[pid][0])
    self.compile_ahead(pid)
    return n

  def phase_keys(self):
    return plan_lib.phase_keys(self.spec, self.s, self.drafts, self.tasks,
                                  self.gamma, self.args.phases, self.act)

  def ahead_options(self) -> Optional[Dict[str, Any]]:
    """The compiler options of the programs compiled ahead
    (`aot.deviceless_options`: on a GPU, no kernel timed on it while the
    run times its own), or None: each phase compiles its programs when it
    starts. --compile_ahead auto: on a GPU or TPU whose build this run
    trusts (`loadable`: the check found the build's programs as fast as
    the device's own, so programs compiled the build's way are too); never
    on a CPU, where compiles take the cores that are timed."""
    platform = jax.devices()[0].platform
    if not compiles_ahead(self.args.compile_ahead, platform,
                          bool(self.loadable())):
      return None
    return aot.deviceless_options(platform, [] if self.store is None else (
        self.store.manifest.get('xla_flags') or []))

  def compile_ahead(self, pid: str) -> None:
    """Starts compiling, beside phase `pid`'s timing, programs of the later
    phases the budget reaches that no build holds, in phase order, as many
    as the compile threads can take in that timing
    (`plan_lib.ahead_count`, at this run's seconds per compile, else
    the projection's run's): lowered now in the pool's threads (nothing is
    timed meanwhile, so no timing waits for Python's lock), compiled in its
    ahead threads with `ahead_options`, each as soon as it is lowered;
    each phase takes its own when it starts. Not in P1: the later phases'
    gammas come from P1's profile."""
    options = self.ahead_options()
    plan = [p for p, _, _ in self.spec.phase_plan]
    if options is None or pid == plan[0]:
      return
    timing = self.phase_estimate(pid)  # its programs are ready
    job = next((x for x in (plan_lib.compile_seconds(run) for run in (
        self.result, self.rates_from) if run) if x), None)
    n = float('inf') if job is None else (  # no compile timed: all
        plan_lib.ahead_count(
            timing, self.pool.workers, job,
            sum(not f.done() for f, _ in self.pool.pending.values())))
    keys, built, todo = self.phase_keys(), self.loadable(), {}
    started = self.pool.compiled | set(self.pool.pending)
    left = self.clock.left() - timing
    for q in plan[plan.index(pid) + 1:]:
      if (self.result['phases'][q]['status'] == 'complete' or
          q in self.spec.not_implemented or not self.requested(q)):
        continue
      left -= self.phase_estimate(q)
      if left < 0:
        break
      for k in keys[q][0]:
        ident = self.ident(k)
        if len(todo) < n and aot.program_name(k) not in built and (
            ident not in started):
          todo.setdefault(ident, k)
    if not todo:
      return
    # Each compiles as soon as it is lowered; the phase's timing starts once
    # all are. A program that fails to lower or compile here is compiled
    # when its phase starts (and fails there, if it must).
    lowering = self.pool.submit({i: functools.partial(
        lower_or_error, self.lowering(k)) for i, k in todo.items()})
    self.pool.ahead({i: (lambda f=f: lowered_or_raise(f.result()[0]).compile(
        compiler_options=options or None)) for i, f in lowering[1].items()},
                    f'compiled ahead, beside {pid.upper()}' + (
                        f' ({", ".join(f"{k}={v}" for k, v in options.items())})'
                        if options else ''))
    self.pool.collect(f'{pid.upper()}: lower {len(todo)} programs of later '
                      'phases to compile beside it', lowering, 'lower')

  def set_gammas(self) -> None:
    """Each row's gamma from this run's profile and alphas
    (`plan_lib.rule_gammas`)."""
    self.gamma = plan_lib.rule_gammas(self.spec, self.profile,
                                         self.alpha_cal, self.s, self.drafts,
                                         self.tasks)

  def steps(self) -> Dict[str, Callable[[], None]]:
    """The body of each implemented phase, by phase id."""
    return {'p1': self.p1, 'p2': self.p2, 'p3': self.p3, 'p4': self.p4,
            'p5': self.p5, 'p6': self.p6}

  def p1(self) -> None:
    """The hardware profile: the floor, t(k) and cost(k), c of every
    drafter at batch 1, the alpha calibration (beside the compiles)."""
    s, act = self.s, self.act
    carried = self.carried_calibration()
    jobs = self.pool.submit({} if carried else self.calibration())
    # t(1), loaded and compiled here (`aot_check`): that compile runs beside
    # the loads and P1's other compiles when the build holds t(1).
    check = ('call', act, 1, 1)
    checks = self.pool.submit({check: functools.partial(
        timed_compile, self.lowering(check))} if aot.program_name(check) in (
            self.loadable()) else {})
    self.phase_programs('p1')
    check = check if self.pool.sources.get(self.ident(check)) == (
        'loaded') else None
    for (task, t), alphas in self.pool.collect(
        'alpha calibration (untimed)', jobs, 'calibration').items():
      self.alpha_cal.update({(task, key, t): a for key, a in alphas.items()})
    if carried:
      self.alpha_cal.update({(a['task'], a['drafter'], a['temperature']):
                             a['alpha'] for a in carried['rows']})
      self.result['alpha_calibration_from'] = (
          f"the ahead-of-time build, on {carried['machine']}")
    self.result['alpha_calibration'] = [
        dict(task=t, drafter=k, temperature=temp, alpha=a)
        for (t, k, temp), a in self.alpha_cal.items()]
    start = time.perf_counter()
    self.result['bandwidth'] = measure.bandwidth(s.copy_mib, s.cost_repeats)
    self.clock.note('time device copy (bandwidth)',
                    time.perf_counter() - start, kind='bandwidth')
    checks = self.pool.collect('compile the t(1) program here (check)',
                               checks, 'compile')
    if check:
      self.aot_check(check, checks[check][0])
    ks = lambda b: plan_lib.needed_ks(s, b, self.args.phases)
    self.measure_calls(act, 1, ks(1))
    self.measure_drafters(self.drafts, 1)
    for b in (b for b in s.batches if b > 1 and ks(b)):
      self.measure_calls(act, b, ks(b))
      self.measure_drafters([self.main], b)  # c at batch b
    self.tree_levels()
    self.set_gammas()
    self.dump_programs()
    self.result['phases']['p1']['not_measured'] = list(
        self.spec.profile_gaps)

  def tree_levels(self) -> None:
    """One level of the first drafter's token trees beam:8,4,12/64 and
    beam:4,2,8 at batch 1 (`measure.tree_level_time`: the mean over each
    tree's levels, compiled here), and over t(1): P1's `tree_levels`."""
    d, task, start = self.main, self.tasks[0], time.perf_counter()
    out = self.result['phases']['p1'].setdefault('tree_levels', {})
    if not isinstance(d.drafter, drafters_lib.T5Drafter):
      out['not_measured'] = f'the first drafter {d.name} is no T5 drafter'
      return
    t1 = self.t_ms[self.act, 1][1]
    for spec in ('beam:8,4,12/64', 'beam:4,2,8'):
      tree = drafters_lib.TreeDrafter(d.drafter, shape_lib.parse(spec))
      ms = 1e3 * measure.tree_level_time(
          tree, d.params[task], self.x(task, 1), repeats=self.s.cost_repeats,
          context=self.s.context, jit_setup=True,
          target_params=self.targets[self.act][1])
      out[spec] = dict(drafter=d.name, level_ms=ms, over_t1=ms / t1,
                       levels=tree.shape.depth - 1,
                       fed=[len(f) for f in tree.shape.fed])
    self.clock.note('time tree levels, batch 1', time.perf_counter() - start,
                    kind='tree_levels', units=2)

  def dump_programs(self) -> None:
    """XLA's dump of t(1), the chain (the first drafter at its greedy
    gamma) and a token tree (beam:8,4,12/64, or the run's first), each
    compiled again here with `--xla_dump_to`: per program the thunk
    sequence (`*thunk_sequence_after_thunk_passes.txt`, what the runtime
    launches; a GPU's only) and the optimized HLO, in one
    `<stem>_xla_dump.tar.xz` in the output folder (P1's `xla_dump` says
    what it holds, or why there is none)."""
    task, d, act = self.tasks[0], self.main, self.act
    keys = {'t1': ('call', act, 1, 1)}
    if self.gamma.get((task, d.name, 0.0)):
      keys['chain'] = ('spec', act, d.name, 1, self.gamma[task, d.name, 0.0],
                       0.0)
    trees = plan_lib.tree_keys(self.s, d.name, act)
    if trees:
      keys['tree'] = next((k for k in trees if k[2].endswith(
          'beam:8,4,12/64')), trees[0])
    record = self.result['phases']['p1']['xla_dump'] = dict(
        programs={n: aot.program_name(k) for n, k in keys.items()},
        file=None)
    per = max((x for x in (plan_lib.compile_seconds(r) for r in (
        self.result, self.rates_from) if r) if x), default=30.0)
    if not self.clock.fits(2 * per, 'XLA dump of t(1), the chain, a tree'):
      record['why_none'] = 'the time budget'
      return
    platform = jax.devices()[0].platform
    with tempfile.TemporaryDirectory() as tmp:
      tmp = pathlib.Path(tmp)

      def dump(name, key):
        # An option in jax's cache key (its dump options are not), so that
        # its persistent cache cannot serve a compile that dumps nothing;
        # it changes only how MLIR would be dumped.
        try:
          self.lowering(key)().compile(compiler_options=dict(
              xla_dump_to=str(tmp / 'xla' / name), xla_dump_hlo_as_text=True,
              xla_dump_enable_mlir_pretty_form=True))
        except Exception as e:  # pylint: disable=broad-except
          return f'{type(e).__name__}: {e}'
        return None

      errors = self.pool.run('XLA dump: compile t(1), the chain, a tree', {
          n: functools.partial(dump, n, k) for n, k in keys.items()}, 'dump')
      kept = tmp / 'kept'
      for name in keys:
        for f in sorted((tmp / 'xla' / name).glob('*.jit_*')):
          if f.name.endswith(('thunk_sequence_after_thunk_passes.txt',
                              'after_optimizations.txt')):
            (kept / name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, kept / name / f.name)
      record['files'] = {n: sorted(p.name for p in (kept / n).glob('*'))
                         for n in keys if (kept / n).is_dir()}
      record['errors'] = {n: e for n, e in errors.items() if e}
      if not any('thunk_sequence' in f for fs in record['files'].values()
                 for f in fs):
        record['note'] = (f'no thunk sequence: XLA writes one on a GPU; '
                          f'this run is on {platform}')
      if record['files']:
        archive = shutil.make_archive(
            str(self.out_dir / f'{self.stem.name}_xla_dump'), 'xztar', kept)
        record['file'] = pathlib.Path(archive).name

  def p2(self) -> None:
    """Table 2 at batch 1: both temperatures, every task and drafter."""
    self.phase_programs('p2')
    for t in self.spec.temps:
      self.table(t)

  def p3(self) -> None:
    self.phase_programs('p3')
    self.tree_rows()

  def p5(self) -> None:
    """Ours against HF transformers (`hf_rows`)."""
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise Unavailable(f'torch cannot be imported ({e})') from None
    if not isinstance(self.peer.drafter, drafters_lib.T5Drafter):
      raise Unavailable(f'the first drafter {self.main.name} is no T5')
    self.phase_programs('p5')
    self.hf_rows(torch)

  def p4(self) -> None:
    self.phase_programs('p4')
    self.batches()

  def p6(self) -> None:
    self.phase_programs('p6')
    if 'cost_curve' in self.args.phases:
      self.cost_curve()
    if 'sweep' in self.args.phases:
      self.sweep()
    if 'numerics' in self.args.phases:
      self.numerics()

  def resume(self) -> None:
    """Takes the phases complete in this run's results file (an earlier
    run with the same flags and sizes) as they are: they are not run
    again. Needs P1 complete (the later phases need its profile)."""
    path = self.stem.with_suffix('.json')
    if not path.exists():
      return
    try:
      prev = report.read_json(path)
    except (OSError, ValueError) as e:
      self.result['resumed'] = dict(used=False, why=repr(e))
      return
    same = lambda x: json.loads(json.dumps(x))
    setup = prev.get('setup', {})
    why = [k for k in ('source', 'smoke') if prev.get(k) != self.result[k]
           ] + [k for k in ('sizes', 'activation_dtype', 'fused', 'tasks',
                            'input_length', 'output_length')
                if same(setup.get(k)) != same(self.result['setup'][k])]
    done = [pid for pid, v in (prev.get('phases') or {}).items()
            if v.get('status') == 'complete' and pid in self.spec.titles]
    if 'p1' not in done:
      why.append('P1 not complete')
    if why:
      self.result['resumed'] = dict(used=False, why=f'differs: {why}')
      print(f'{path}: not resumed ({why})', flush=True)
      return
    self.result['bandwidth'] = prev['bandwidth']
    self.alpha_cal = {(a['task'], a['drafter'], a['temperature']): a['alpha']
                      for a in prev['alpha_calibration']}
    self.result['alpha_calibration'] = prev['alpha_calibration']
    if prev.get('alpha_calibration_from'):
      self.result['alpha_calibration_from'] = prev['alpha_calibration_from']
    self.result['programs'].update(prev.get('programs') or {})
    if prev.get('aot_check'):
      self.result['aot_check'] = dict(prev['aot_check'], earlier_run=True)
    for act, by_b in prev['costs'].items():
      for b, v in by_b.items():
        self.t_ms[act, int(b)] = {int(k): t for k, t in v['t_ms'].items()}
    for name, d in prev['drafters'].items():
      if name in self.by_name:
        self.t_draft_ms.update({(name, int(b)): ms
                                for b, ms in d['t_draft_ms'].items()})
    self.record()
    self.set_gammas()
    rows = {'p2': ('table2',), 'p3': ('trees',), 'p4': ('batches',),
            'p5': ('hf',), 'p6': ('sweep', 'numerics')}
    for pid in done:
      self.result['phases'][pid] = dict(prev['phases'][pid], earlier_run=True)
      for key in rows.get(pid, ()):
        self.result[key] = prev[key]
    self.result['resumed'] = dict(used=True, phases=done)

  # -- ahead of time --------------------------------------------------------

  def build(self, device, gammas, config: Optional[str] = None,
            autotune: Optional[pathlib.Path] = None) -> Dict[str, Any]:
    """Compiles the run's device programs for `device` (compile-only: the
    parameters are shapes on it) into `self.store`, in priority order.

    Args:
      device: the device the executables are for.
      gammas: (task, drafter, temperature) -> the gamma the run is expected
        to pick (`plan_lib.previous_gammas`); a run that picks another
        compiles that program on the device.
      config: the target config `device` is for (None: its default).
      autotune: the autotune results the build's backend started with.

    Returns:
      `aot.summary` of the store, plus what was left out for its size.
    """
    self.device = device
    self.setup()
    # The alpha calibration decodes here, before the parameters become
    # shapes on `device`; the run takes it (`carried_calibration`).
    calibration = [dict(task=task, drafter=key, temperature=t, alpha=a)
                   for (task, t), alphas in self.pool.run(
                       'alpha calibration, for the run', self.calibration(),
                       'calibration').items() for key, a in alphas.items()]
    self.targets = {a: (m, self.place(p)) for a, (m, p) in
                    self.targets.items()}
    for d in self.drafts + self.trees + [self.peer]:
      d.params = {t: self.place(p) for t, p in d.params.items()}
    parts = plan_lib.programs(self.spec, self.s, self.drafts, self.tasks,
                                 gammas, self.args.phases, self.act)
    names = {}
    for part in PRIORITY:
      for k in (k for half in parts.get(part, ([], [])) for k in half):
        if k[0] in AOT_KINDS and all(not isinstance(x, tuple) for x in k):
          names.setdefault(self.ident(k), (len(names), k))
    keys = [k for _, k in sorted(names.values())]
    self.store.describe(
        device, config or (
            f"specdec_jax.compiled's config of {self.args.aot_build}"),
        aot.build_flags(device.platform, autotune and pathlib.Path(
            report.portable(str(autotune)))),
        autotune=autotune and aot.autotune_record(
            autotune, report.portable(str(autotune))),
        target=self.args.aot_build, source=self.args.source,
        smoke=bool(self.args.smoke))
    self.store.manifest['alpha_calibration'] = dict(
        key=self.calibration_key(), rows=calibration,
        machine=self.result['machine'])
    limit, left_out = aot_limit(self.args), []
    # A rerun builds only what the folder lacks (an interrupted build goes
    # on); every PACK programs go into one xz pack as they come, and the
    # last ones are dropped if the packs weigh more than the limit.
    todo = [k for k in keys if not self.store.built(aot.program_name(k))]
    self.store.pack()
    for i in range(0, len(todo), self.pool.workers):  # batches of threads
      chunk = todo[i:i + self.pool.workers]
      if self.store.packed_bytes() >= limit:
        left_out += [aot.program_name(k) for k in chunk]
        continue
      done = self.pool.run(f'build {len(chunk)} programs', {
          k: (lambda k=k: timed_compile(self.lowering(k)))
          for k in chunk}, kind='compile')
      for k in chunk:
        exe, seconds, lower_s = done[k]
        entry = self.store.save(aot.program_name(k), exe, seconds,
                                priority=keys.index(k), lower_s=lower_s)
        print(f'  {aot.program_name(k)}: {entry["bytes"] / 2**20:.2f} MiB, '
              f'{seconds:.1f} s', flush=True)
      self.store.pack()
      self.store.write()
    left_out = self.store.fit(limit) + left_out
    self.store.manifest['left_out_for_size'] = left_out
    self.store.write()
    return dict(aot.summary(self.store), left_out_for_size=left_out)

  # -- output ----------------------------------------------------------------

  def mismatches(self) -> int:
    r = self.result
    rows = {id(x): x for x in r['table2'] + r['batches'] + r['sweep'] +
            r['trees']}
    return sum(x['mismatches'] or 0 for x in rows.values()) + sum(
        x['mismatches_1token'] + x['mismatches_block'] for x in r['numerics'])

  def write(self, plots: bool = False) -> None:
    self.result['wall_s'] = round(self.clock.elapsed(), 1)
    try:
      if plots:
        self.result['plots'] = run_report.write_plots(
            self.result, self.out_dir, self.stem.name)
    except Exception as e:  # pylint: disable=broad-except
      self.result['plot_error'] = repr(e)  # the results are written anyway
    report.write_json(self.stem.with_suffix('.json'), self.result)
    report.write_md(self.stem.with_suffix('.md'),
                    run_report.markdown(self.spec, self.result))


# ---------------------------------------------------------------------------
# Entry point.
# ---------------------------------------------------------------------------


def aot_target(device) -> str:
  """The `--aot_dir` folder of executables for `device`: its compile-only
  target's name (`specdec_jax.compiled.TARGETS`), 'cpu', or its kind."""
  if device.platform == 'cpu':
    return 'cpu'
  for name, target in compiled.TARGETS.items():
    if target.chips == 1 and target.spec.name == device.device_kind:
      return name
  return device.device_kind


def build_platform(target: str) -> str:
  """'cpu', 'gpu' or 'tpu': the platform of a build's target."""
  return 'cpu' if target == 'cpu' else compiled.get_target(target).platform


def autotune_file(args) -> Optional[pathlib.Path]:
  """The autotune results the backend starts with: a GPU build's
  (`--autotune_results`; by default the file a run on the target's GPU
  left in results/<device>/, if any), or a run's: those an earlier run
  left in its `--out_dir`, so that the programs they cover compile without
  timing kernels again and the results it writes hold both."""
  has_results = lambda path: path.is_file() and bool(
      aot.autotune_device(path.read_text()))
  if args.aot_build:
    if build_platform(args.aot_build) != 'gpu' or args.autotune_results == '':
      return None
    if args.autotune_results:
      path = pathlib.Path(args.autotune_results)
      if not has_results(path):
        raise SystemExit(f'--autotune_results {path}: no file of XLA '
                         'autotune results there')
      return path
    path = target_results(args.aot_build) / aot.AUTOTUNE_FILE
    return path if has_results(path) else None
  path = pathlib.Path(args.out_dir or '.') / aot.AUTOTUNE_FILE
  return path if args.out_dir and not args.smoke and has_results(path) else (
      None)


def target_results(target: str) -> pathlib.Path:
  """results/<device>/ of compile-only target `target`: where runs on its
  device write, and a build for it looks for what they recorded."""
  return plan_lib.ROOT / 'results' / report.device_name(
      compiled.get_target(target).spec.name)


def recorded_topology(args, stem: str
                      ) -> Optional[Tuple[pathlib.Path, bytes]]:
  """(run json, topology) of the device a GPU or TPU build compiles for:
  the topology a run on it recorded in its `device_facts`
  (`aot.device_topology`), from `--device_topology` or by default from
  results/<device>/<stem>.json; None without one (or for a CPU build)."""
  if build_platform(args.aot_build) == 'cpu' or args.device_topology == '' or (
      args.target_config and not args.device_topology):
    return None
  given = bool(args.device_topology)
  path = pathlib.Path(args.device_topology) if given else (
      target_results(args.aot_build) / f'{stem}.json')
  try:
    topology = aot.device_topology(
        report.read_json(path).get('device_facts') or {})
  except (OSError, ValueError) as e:
    if given:
      raise SystemExit(f'--device_topology {path}: {e}') from e
    return None
  if topology is None and given:
    raise SystemExit(f'--device_topology {path}: its device_facts hold no '
                     'topology (a run with jax >= 0.11 on the device '
                     'records one)')
  return (path, topology) if topology is not None else None


def build_target(args, autotune: Optional[pathlib.Path], stem: str
                 ) -> Tuple[Any, Optional[str]]:
  """(device, config) a build compiles for: the compile-only twin of the
  device a run recorded (`recorded_topology`; config: what names it in the
  store's manifest), which XLA describes exactly as it did there (and its
  autotune results, keyed by that description, match), else the
  compile-only device of `build_config`; this CPU for 'cpu'."""
  if args.aot_build == 'cpu':
    return jax.devices('cpu')[0], None
  recorded = recorded_topology(args, stem)
  if recorded is not None:
    path, topology = recorded
    try:
      device = aot.twin_devices(compiled.TARGETS[args.aot_build], topology)[0]
      aot.check_compiles(device)
      return device, (f'the device topology in {report.portable(str(path))} '
                      f'(sha256 {aot.sha256(topology)[:16]})')
    except Exception as e:  # pylint: disable=broad-except
      print(f'{report.portable(str(path))}: its device topology builds '
            f'nothing here ({e!r:.300}); building for the target config',
            flush=True)
  config = build_config(args, autotune)
  return compiled.devices(args.aot_build, config)[0], config


def build_config(args, autotune: Optional[pathlib.Path]) -> Optional[str]:
  """The `GpuTargetConfigProto` text a GPU build compiles for: the chip's
  (`compiled.default_target_config`) or `--target_config`'s, matched to the device
  its autotune results were timed on where their key is XLA's "CUDA: ..."
  form; None: the target's own."""
  if build_platform(args.aot_build) != 'gpu':
    return None
  config = (pathlib.Path(args.target_config).read_text()
            if args.target_config else None)
  device = autotune and aot.autotune_device(autotune.read_text())
  if device:
    try:
      config = aot.match_autotune_device(
          config or compiled.default_target_config(args.aot_build), device)
    except ValueError as e:  # XLA's newer cache may key devices otherwise
      print(f'{autotune}: {e}; the target config is left as it was (the '
            'results may match none of its programs: the run checks)',
            flush=True)
  return config


def aot_limit(args) -> int:
  """The bytes a build's executables may weigh: `--aot_max_mib`, or what
  a device command carries beside this checkout's working tree
  (`plan_lib.aot_budget`)."""
  if args.aot_max_mib is not None:
    return int(args.aot_max_mib * 2 ** 20)
  try:
    return plan_lib.aot_budget()
  except (OSError, subprocess.CalledProcessError) as e:
    raise SystemExit(
        f'--aot_max_mib is needed: the working tree a device command '
        f'carries beside the executables is unknown ({e!r})') from e


def travel_line(store: aot.Store) -> str:
  """What a device command would carry: the working tree and the store's
  folder, against `plan_lib.TRAVEL_LIMIT`."""
  try:
    tree = plan_lib.working_tree_bytes()
  except (OSError, subprocess.CalledProcessError) as e:
    return f'  a device command carries: working tree unknown ({e!r})'
  total, mib = tree + store.total_bytes(), 2 ** 20
  return (f'  a device command carries {total / mib:.1f} MiB: the working '
          f'tree {tree / mib:.1f} MiB and {store.dir} '
          f'{store.total_bytes() / mib:.1f} MiB, of '
          f'{plan_lib.TRAVEL_LIMIT / mib:.0f} MiB' + (
              '' if total <= plan_lib.TRAVEL_LIMIT else
              ': OVER the limit, the command would be refused (rebuild '
              'with the default --aot_max_mib)'))


def parse_flags(spec: plan_lib.DeviceSpec, argv):
  parser = argparse.ArgumentParser(
      prog=f'python -m {COMMAND}',
      description=spec.about.splitlines()[0])
  add = parser.add_argument
  add('--source', default='synthetic', choices=['synthetic', 'shipped'])
  add('--out_dir', default=None, help='default results/<device name>')
  add('--max_minutes', type=float, default=8.0,
      help='wall budget; a phase that does not fit is not started, and '
      'listed')
  add('--smoke', action='store_true', help='tiny models, on a CPU in about '
      'a minute (needs --out_dir)')
  add('--project', action='store_true',
      help='only print the projected wall time of the full run')
  add('--project_from', default=spec.project_from,
      help='the measured run (json) whose time log the projection scales')
  add('--fused', action='store_true', help='q/k/v, cross k/v and the gated '
      'MLP inputs fused into one matmul each (network.for_decoding)')
  add('--activation_dtype', default='bfloat16', choices=list(spec.acts),
      help="the target's activations everywhere but the numerics")
  add('--phases', default=','.join(spec.phases),
      help='comma-separated subset (costs always run)')
  add('--compile_workers', type=int, default=None,
      help='compile threads (default min(8, cores); the projection: those '
      'of the measured run)')
  add('--compile_ahead', choices=('auto', 'on', 'off'), default='auto',
      help="compile each phase's programs that no build holds beside the "
      "earlier phases' timing ('auto': on a GPU or TPU that loads a build "
      'it trusts; never on a CPU, whose cores are the ones timed)')
  add('--compilation_cache', default=None, help="jax's persistent "
      "compilation cache ('' for none; default cache/jax, ignored by git; "
      'never with --aot_build)')
  for name in ('examples', 'repeats', 'input_length', 'output_length'):
    add(f'--{name}', type=int, default=None)
  add('--aot_dir', default='aot', help='executables compiled ahead of time '
      "(`--aot_build`), loaded from <aot_dir>/<target>/ ('' for none)")
  add('--aot_target', default=None, help='the folder of --aot_dir to load '
      "(default: the device's target, e.g. gpu:h100; a CPU's: cpu)")
  add('--aot_build', default=None, help='compile the run for this target '
      "(specdec_jax.compiled's, e.g. gpu:h100, or cpu) into --aot_dir, and "
      'exit; with the device image\'s jax, jaxlib and plugin versions')
  add('--aot_max_mib', type=float, default=None,
      help='the most the executables may weigh (default: what a device '
      'command carries, 64 MiB, less the working tree and 2 MiB)')
  add('--autotune_results', default=None, help='a GPU build: the autotune '
      f'results a run on that GPU wrote ({aot.AUTOTUNE_FILE}; default the '
      "one in results/<its device>/ if there is one, '' for none)")
  add('--device_topology', default=None, help='a GPU or TPU build: the '
      "json of a run on the device, whose device_facts hold its topology as "
      'XLA serializes it, to build for exactly that device (default: '
      "results/<its device>/<spec>_<source>.json if it holds one; '' for "
      'none)')
  add('--target_config', default=None, help='a GpuTargetConfigProto (text) '
      'file to build for without a recorded topology (default: '
      "specdec_jax.compiled's for the target)")
  add('--sigma', default='', help='synthetic noise, e.g. small=0.02,base=0.016')
  add('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  if args.device_topology and args.target_config:
    parser.error('--device_topology and --target_config each name the '
                 'device to build for: give one')
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
  if args.phases - set(spec.phases):
    parser.error(f'--phases: unknown {sorted(args.phases - set(spec.phases))}'
                 f'; known: {list(spec.phases)}')
  args.sigma = dict(x.partition('=')[::2]
                    for x in filter(None, args.sigma.split(',')))
  for name, value in args.sigma.items():
    if name not in spec.sigmas or not value:
      parser.error(f'--sigma entries look like small=0.02 (names '
                   f'{list(spec.sigmas)}), got {name}={value}')
    args.sigma[name] = float(value)
  return args


def run_status(phases: Dict[str, Dict[str, Any]]) -> str:
  """'complete' when every phase asked for and implemented is, else
  'partial: ' and the phases that are not, with why."""
  open_ = [f"{pid.upper()} {v['status']}" for pid, v in phases.items()
           if v['status'] != 'complete' and not v['status'].startswith(
               ('not implemented', 'not requested'))]
  return 'partial: ' + '; '.join(open_) if open_ else 'complete'


def main(spec: plan_lib.DeviceSpec, argv: Sequence[str]) -> int:
  """Runs (or projects, or builds the programs of) the device run `spec`
  with the command-line flags `argv`; the exit status: 1 when greedy rows
  differ from the baseline beyond rounding."""
  argv = list(argv)
  args = parse_flags(spec, argv)
  if args.aot_build not in (None, 'cpu'):
    # No GPU here: the CUDA plugin's start-up check of the driver would
    # leave it unregistered (read when jax first looks for backends).
    os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  clock = budget.Clock(args.max_minutes)
  flags = os.environ.get('XLA_FLAGS', '')
  if args.smoke and 'optimization_level' not in flags:
    # Tiny programs: LLVM's optimisations cost more than they save (read
    # when the backend starts, in `report.header`).
    flags = f'{flags} --xla_backend_optimization_level=0'
  # Read when the backend starts too: a GPU build's autotune results (or
  # its flags without them); a run's autotune results written for the next
  # build, after those an earlier run left in --out_dir.
  autotune = autotune_file(args)
  dump = None if args.aot_build or args.project else pathlib.Path(
      tempfile.mkdtemp(prefix='specdec-autotune-')) / aot.AUTOTUNE_FILE
  if args.aot_build:
    xla = aot.build_flags(build_platform(args.aot_build), autotune)
  else:
    xla = (aot.load_flags(autotune) if autotune else []) + (
        aot.dump_flags(dump) if dump else [])
  os.environ['XLA_FLAGS'] = ' '.join([flags] + xla).strip()
  sizes = {k: getattr(args, k) for k in ('examples', 'repeats')
           if getattr(args, k) is not None}
  header = report.header(f'-m {COMMAND}', argv,
                         max_minutes=args.max_minutes)
  out_dir = pathlib.Path(args.out_dir or f"results/{header['device_name']}")
  if args.aot_build:
    # Never while building (not even a cache the environment names): an
    # executable that jax took from its persistent cache serializes
    # without all of its code (on a CPU it loads, then fails at its first
    # call: "Function ... not found").
    jax.config.update('jax_enable_compilation_cache', False)
  elif args.compilation_cache != '':
    jax.config.update('jax_compilation_cache_dir', args.compilation_cache or
                      str(plan_lib.ROOT / 'cache' / 'jax'))
  print(f"{header['command']}\n{header['machine']}", flush=True)
  full = spec.full._replace(**sizes)
  store = None if not args.aot_dir else aot.Store(
      pathlib.Path(args.aot_dir), args.aot_build or args.aot_target or
      aot_target(jax.devices()[0]))
  usable = {} if store is None or args.aot_build else store.usable()
  try:
    projection = plan_lib.project(
        spec, args.project_from, full, plan_lib.roster(
            spec, args.source, [] if args.source == 'synthetic' else
            load_shipped().model_names(), full),
        plan_lib.tasks_of(args.source), args.phases, args.activation_dtype,
        None if args.smoke else args.compile_workers,
        f'the full {args.source} run',
        usable,
        # a build of this code for this source computed the calibration
        bool(usable) and store.manifest.get('source') == args.source and
        'alpha_calibration' in store.manifest,
        # as `Runner.ahead_options` will, its build taken as trusted
        compiles_ahead(args.compile_ahead, store and store.manifest.get(
            'platform'), bool(usable)),
        None if store is None else store.lower_seconds())
  except (OSError, ValueError, KeyError) as e:  # no measured run to scale
    projection = dict(error=f'no projection from {args.project_from}: {e!r}')
    print(projection['error'], flush=True)
  if store is not None and not args.aot_build and not args.smoke:
    print(travel_line(store), flush=True)
  if args.project:
    return 0 if 'seconds' in projection else 1
  pool = pool_lib.Pool(args.workers, clock)
  runner = Runner(spec, args, (spec.smoke if args.smoke else spec.full
                               )._replace(**sizes),
                  clock, pool, out_dir, header, store)
  if args.aot_build:
    if store is None:
      raise SystemExit('--aot_build needs --aot_dir')
    try:
      prev = report.read_json(plan_lib.ROOT / args.project_from)
      gammas = plan_lib.previous_gammas(
          spec, prev, args.project_from, runner.s,
          runner.drafts_before_setup(), plan_lib.tasks_of(args.source))
    except (OSError, ValueError, KeyError) as e:
      print(f'no gammas from {args.project_from} ({e!r}): building the '
            'programs that need none', flush=True)
      gammas = {}
    device, config = build_target(args, autotune, runner.stem.name)
    built = runner.build(device, gammas, config, autotune)
    pool.shutdown()
    print(f"built {built['programs']} programs for {args.aot_build}: "
          f"{built['bytes'] / 2**20:.1f} MiB, {built['compile_s']:.0f} s of "
          f"compiling, in {clock.elapsed():.0f} s; {built['dir']}" + (
              f"; left out for size: {built['left_out_for_size']}"
              if built['left_out_for_size'] else ''), flush=True)
    return 0
  runner.result['projection'] = projection
  if not args.smoke and 'seconds' in projection:  # rates for the phases
    runner.rates_from = report.read_json(plan_lib.ROOT / args.project_from)
  watch = pool_lib.CompileWatch()
  try:
    runner.run(watch)
    runner.result['status'] = run_status(runner.result['phases'])
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
    if runner.profile is not None:  # profiles/: complete shipped runs
      shared = not args.smoke and args.source == 'shipped' and (
          runner.result['status'] == 'complete')
      path = hardware.write(runner.profile, None if shared else (
          out_dir / f'{runner.profile.name}.json'))
      print(f'hardware profile: {report.portable(str(path))}')
    runner.write()
    if dump is not None and dump.is_file():  # only a GPU writes them
      aot.rewrite_autotune_results()
      if aot.autotune_device(dump.read_text()):  # for the next build
        shutil.copyfile(dump, out_dir / aot.AUTOTUNE_FILE)
        print(f'autotune results: {report.portable(str(out_dir))}/'
              f'{aot.AUTOTUNE_FILE}', flush=True)
    if dump is not None:
      shutil.rmtree(dump.parent, ignore_errors=True)
    pool.shutdown()
    print(f"{runner.result['status']}; wrote {runner.stem}.{{md,json}} in "
          f"{clock.elapsed():.1f} s (projected for the full run: "
          f"{projection.get('seconds')} s)", flush=True)
  return 1 if mismatches else 0
