"""Measuring what decides a speculative speed-up: alpha, c and cost(k).

The paper's walltime improvement (Theorem 3.8, `theory.walltime_improvement`)
needs three numbers, all measured here on the models and inputs at hand:

- alpha, the expected acceptance rate E[sum_x min(p(x), q(x))] over prefixes
  drawn from the target: `alpha` decodes with the target (at the sampling
  mode under study), then scores every prefix of those outputs with the target
  and the drafter in one teacher-forced pass each, pooled over all output
  positions (EOS included), like the paper's "alpha over 10K tokens";
- c = t_draft / t_target(1): `drafter_token_time` times a drafter's `propose`
  (any drafter: T5, n-gram, ...) per drafted token, `call_time` one target
  decoder call;
- cost(k) = t_target(k) / t_target(1), the cost of verifying gamma + 1 = k
  tokens in one call (about 1 on a TPU/GPU, more on a CPU): `call_time`;
- a token tree's level (`drafters.tree`: the drafter's call on a level's
  nodes and the draw of their children), what a tree costs beside its one
  target call: `tree_level_time`.

Timings are of compiled code inside a compiled loop of n calls (no Python
dispatch; n grows until a loop takes >= 50 ms, so the one launch per loop is
negligible), the median over repeats of loop time / n. They belong in
benchmark scripts, never in unit tests.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import platform
import time
from typing import (Any, Callable, Dict, Iterable, Mapping, Optional, Sequence,
                    Tuple)

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import decoding
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import sampling as sampling_lib
from specdec_jax import scaffold
from specdec_jax import speculative

Array = jax.Array


def cpu_model() -> str:
  """The CPU model name from /proc/cpuinfo, else `platform.processor()`."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown'


def machine() -> str:
  """CPU model, core count and the JAX backend, for results files."""
  devices = ', '.join(sorted({d.device_kind for d in jax.devices()}))
  return (f'{cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__} '
          f'({jax.default_backend()}: {devices})')


# The cores other processes may keep busy, on average, while a job times
# before its summary warns (an idle machine's background is hundredths).
BUSY_CORES = 0.25


def _cpu_seconds() -> Optional[Tuple[float, float, float]]:
  """(wall s, CPU s of every process, CPU s of this one) now, from
  /proc/stat and `os.times`; None where /proc/stat is missing."""
  try:
    with open('/proc/stat') as f:
      fields = f.readline().split()
  except OSError:
    return None
  if len(fields) < 9 or fields[0] != 'cpu':
    return None
  # user nice system (idle iowait) irq softirq steal, in clock ticks
  ticks = [int(x) for x in fields[1:9]]
  busy = sum(ticks[:3]) + sum(ticks[5:8])
  own = os.times()
  return (time.perf_counter(), busy / os.sysconf('SC_CLK_TCK'),
          own.user + own.system)


def _process_cpu_seconds(pids: Sequence[int]) -> float:
  """CPU seconds (user + system) the processes `pids` have used so far,
  from /proc/<pid>/stat (0 for one that is gone)."""
  ticks = 0
  for pid in pids:
    try:
      with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
      continue
    ticks += int(fields[11]) + int(fields[12])  # utime, stime
  return ticks / os.sysconf('SC_CLK_TCK')


# The other processes of this job on this machine (`job_processes`): their
# CPU is the job's, not other work.
_JOB_PROCESSES: contextvars.ContextVar[Tuple[int, ...]] = (
    contextvars.ContextVar('job_processes', default=()))


@contextlib.contextmanager
def _set(var: contextvars.ContextVar, value):
  """`var` is `value` inside (this context's: a generator resumed in it
  reads it too)."""
  token = var.set(value)
  try:
    yield
  finally:
    var.reset(token)


def job_processes(pids: Sequence[int]):
  """Inside, `OtherLoad` counts the processes `pids` (the job's others on
  this machine: a jax.distributed run of several processes a host, e.g.
  one a GPU) as this one, not as other work."""
  return _set(_JOB_PROCESSES, tuple(int(p) for p in pids))


class OtherLoad:
  """What other processes ran while a block did: `with OtherLoad() as
  load: <timing>`, then `load.seconds` (the block's wall seconds) and
  `load.cpu_s` (CPU seconds every process used but this one and the job's
  others on this machine, `job_processes`; None where /proc/stat is
  missing, e.g. not Linux).

  A timing beside other work is slower by an amount no repeat removes
  (the loop's host thread and XLA's threads share the cores), and the
  baseline and the speculative decode lose different shares of it; the
  job's summary says how busy the machine was (`summary.timing_load`).
  Clock ticks are 10 ms: pool spans of seconds, not one short one.
  """

  def __init__(self):
    self._start = self._job = None
    self.seconds: Optional[float] = None
    self.cpu_s: Optional[float] = None

  def __enter__(self) -> 'OtherLoad':
    self._job = _JOB_PROCESSES.get()
    self._start = _cpu_seconds(), _process_cpu_seconds(self._job)
    return self

  def __exit__(self, *exc) -> bool:
    end = _cpu_seconds()
    if self._start[0] is not None and end is not None:
      wall, every, own = (b - a for a, b in zip(self._start[0], end))
      job = _process_cpu_seconds(self._job) - self._start[1]
      self.seconds, self.cpu_s = wall, max(0.0, every - own - job)
    return False


def time_alternating(calls: Mapping[str, Callable[[], Any]],
                     repeats: int = 1, reverse: bool = False
                     ) -> Tuple[Dict[str, Any], Dict[str, float]]:
  """Times several calls in turn, the order flipped after every repeat.

  Alternating spreads machine-load drift over all calls alike (A B, B A,
  ...). Nothing is warmed up: call it once first to compile.

  Args:
    calls: name -> a call with no arguments; run in the mapping's order.
    repeats: rounds (each call runs once per round).
    reverse: start with the mapping's order reversed (e.g. on every other
      batch).

  Returns:
    `(results, seconds)`: each call's last result (through
    `jax.block_until_ready`) and its median seconds
    (`time.perf_counter`).
  """
  checks.check_int('repeats', repeats)
  order = list(calls)[::-1] if reverse else list(calls)
  results, times = {}, {name: [] for name in calls}
  for _ in range(repeats):
    for name in order:
      start = time.perf_counter()
      results[name] = jax.block_until_ready(calls[name]())
      times[name].append(time.perf_counter() - start)
    order = order[::-1]
  return results, {k: float(np.median(v)) for k, v in times.items()}


def median_time(fn: Callable[[], object], repeats: int) -> float:
  """Median seconds of `fn()` (blocked until ready) after one warm-up call."""
  jax.block_until_ready(fn())
  return time_alternating({'fn': fn}, repeats)[1]['fn']


# Who decides what a timing runs next from a clock (`loop_time`'s
# doubling): this process (the default) or, inside `decided_by`, a function
# every process calls alike (a mesh spanning processes: process 0's clock,
# `partitioning.Partitioner.agree`).
_DECIDE: contextvars.ContextVar[Callable[[bool], bool]] = (
    contextvars.ContextVar('decide', default=lambda stop: stop))


def decided_by(agree: Callable[[Any], Any]):
  """Inside, every choice of how long to time (`loop_time`'s doubling)
  is `agree`'s: on a mesh spanning processes, where every process runs
  the same calls and each clock would stop the doubling at its own n."""
  return _set(_DECIDE, agree)


def loop_time(run: Callable[[int], object], n: int, repeats: int,
              min_seconds: float = 0.05) -> float:
  """Median seconds per call of `run(count)`, which executes count calls.

  `count` is a traced loop bound (one compilation for every count); n is
  doubled until n calls take at least `min_seconds`, so that the one launch
  per loop (tens of microseconds) is negligible next to the calls and timer
  noise does not matter. The check that ends the doubling is the timed
  repeats' warm-up: the same program at the same n (`decided_by`: whose
  clock decides).
  """
  jax.block_until_ready(run(n))  # compile
  while True:
    start = time.perf_counter()
    jax.block_until_ready(run(n))
    if _DECIDE.get()(bool(time.perf_counter() - start >= min_seconds or
                          n >= 1 << 16)):
      break
    n *= 2
  return time_alternating({'loop': lambda: run(n)}, repeats)[1]['loop'] / n


def _copy_passes(x, n_copies):
  """n_copies passes over x, each reading and writing every byte once."""
  return jax.lax.fori_loop(0, n_copies, lambda _, y: y + 1.0, x)


copy_passes = scaffold.ProvidedJit(_copy_passes)


def bandwidth(mib: int = 256, repeats: int = 5) -> Dict[str, float]:
  """The device's memory bandwidth, measured: passes over a large array.

  `y = y + 1` over a `mib` MiB float32 array in a compiled loop: each pass
  reads and writes every byte once (2 x mib MiB moved), so bytes / second
  is what a memory-bound kernel can stream. Pick `mib` well above the
  last-level cache.

  Returns:
    {'bytes_per_s', 'seconds_per_pass', 'bytes_per_pass', 'how'}.
  """
  x = jnp.zeros((mib << 20) // 4, jnp.float32)
  per_pass = loop_time(lambda n: copy_passes(x, n), 2, repeats)
  moved = 2 * x.nbytes
  return dict(bytes_per_s=moved / per_pass, seconds_per_pass=per_pass,
              bytes_per_pass=moved,
              how=f'{mib} MiB float32 array, y = y + 1 in a compiled loop '
              '(each pass reads and writes it once)')


def _products(w, v, n_products):
  """n_products vector-matrix products `(v + i) @ w`: each reads all of w."""
  def body(i, acc):
    return acc + (v + i.astype(v.dtype)) @ w  # depends on i: not hoisted
  return jax.lax.fori_loop(0, n_products, body,
                           jnp.zeros((1, w.shape[1]), v.dtype))


_streamed_products = scaffold.ProvidedJit(_products)


def read_bandwidth(mib: int = 256, repeats: int = 5) -> Dict[str, float]:
  """How fast a decoder-like kernel streams weights: vector @ big matrix.

  A 1-token decoder step is vector-matrix products over its weights; this
  times `[1, 8192] @ [8192, n]` over a `mib` MiB float32 matrix in a
  compiled loop (the vector changes every pass, so nothing is hoisted), with
  the backend's own matmul and threads. On a CPU it streams 3-7x faster
  than the elementwise pass of `bandwidth`, which XLA:CPU runs on one
  thread; the decoder's floor divides by the larger of the two.

  Returns:
    {'bytes_per_s', 'seconds_per_pass', 'bytes_per_pass', 'how'}.
  """
  rows = 8192
  w = jnp.ones((rows, (mib << 20) // 4 // rows), jnp.float32)
  v = jnp.ones((1, rows), jnp.float32)
  per_pass = loop_time(lambda n: _streamed_products(w, v, n), 2, repeats)
  return dict(bytes_per_s=w.nbytes / per_pass, seconds_per_pass=per_pass,
              bytes_per_pass=w.nbytes,
              how=f'[1, {rows}] @ [{rows}, {w.shape[1]}] float32 ({mib} MiB) '
              'in a compiled loop (each pass reads the matrix once)')


def tree_bytes(tree) -> int:
  """Bytes of the arrays (or ShapeDtypeStructs) in a pytree."""
  return int(sum(x.size * jnp.dtype(x.dtype).itemsize
                 for x in jax.tree_util.tree_leaves(tree)))


def step_bytes(model, params, batch: int, cache_length: int,
               input_length: int) -> int:
  """Bytes one decoder call must read at least: the floor's numerator.

  The decoder's weights (the logits layer included; one embedding row per
  token is negligible) plus the self-attention cache of `cache_length`
  tokens and the cross-attention keys / values of `input_length` encoder
  positions, in the compute dtype. A k-token call reads the same weights,
  so at batch 1 its floor is the 1-token floor.

  Args:
    model: a `network.T5Model`.
    params: its parameters (arrays or ShapeDtypeStructs).
    batch: rows.
    cache_length: decoder tokens already cached.
    input_length: encoder positions.
  """
  cfg = model.config
  per_position = cfg.num_heads * cfg.head_dim * 2 * cfg.num_decoder_layers
  itemsize = jnp.dtype(cfg.compute_dtype).itemsize
  cache = batch * (cache_length + input_length) * per_position * itemsize
  return tree_bytes(params['decoder']) + cache


def _rewound_calls(call, cache, n_calls: int, batch: int):
  """n_calls of `call(cache) -> (value [batch], cache)`, each from the
  cache's position (rewound after every call), their values summed (so no
  call is dead code); the timing loop of `call_time` and
  `tree_level_time`."""
  position = cache.position

  def body(_, carry):
    cache, acc = carry
    value, cache = call(cache.rewind(position))
    return cache, acc + value

  return jax.lax.fori_loop(0, n_calls, body,
                           (cache, jnp.zeros((batch,))))[1]


def _repeated_calls(model, params, tokens, cache, n_calls):
  """n_calls decoder calls on `tokens`, each from the same position.

  The params are laid out for decoding before the loop, as every decode
  loop's are (`scaffold.run`): the calls timed read the weights as the
  decoders' calls do, with nothing joined inside the loop.
  """
  params = network.decoding_layout(params)

  def call(cache):
    logits, cache = model.extend(params, tokens, cache)
    return logits[:, -1].sum(-1), cache  # all of the logits

  return _rewound_calls(call, cache, n_calls, tokens.shape[0])


repeated_calls = scaffold.ProvidedJit(_repeated_calls, static_argnums=(0,))


def _repeated_levels(model, params, tokens, cache, tree, k, n_calls):
  """n_calls of one token-tree level, each from the same position: the
  drafter's call on the level's fed nodes `tokens` `[batch, n]` under the
  tree mask `tree` (`grow.grow`'s expand) and the greedy draw of their
  children (the top k of each node's logits and their log-softmax there,
  as `grow.grow` draws them). Params laid out as in `_repeated_calls`."""
  params = network.decoding_layout(params)

  def call(cache):
    logits, cache = model.extend(params, tokens, cache, tree=tree)
    x = logits.astype(jnp.float32)  # [batch, n, vocab]
    values, _ = jax.lax.top_k(x, k)  # [batch, n, k]
    logp = values - jax.nn.logsumexp(x, -1, keepdims=True)
    return logp.sum((1, 2)), cache

  return _rewound_calls(call, cache, n_calls, tokens.shape[0])


repeated_levels = scaffold.ProvidedJit(_repeated_levels,
                                       static_argnums=(0, 5))


def context_cache(model, params, encoder_input_tokens, context: int,
                  max_length: int, jit_setup: bool = False):
  """The cache `call_time` times calls from: `context` tokens already in.

  Args:
    model: an `interfaces.DecodingModel`, e.g. a `network.T5Model`.
    params: its parameters (arrays, or `jax.ShapeDtypeStruct`s: then the
      cache's shapes, at no cost).
    encoder_input_tokens: `[batch, input_length]` (or its shape struct).
    context: decoder tokens written before the timed calls.
    max_length: cache length.
    jit_setup: build it in one compiled call instead of op by op.

  Returns:
    The model's cache after `context` tokens (its `ShapeDtypeStruct`s when
    given shapes).
  """
  if _abstract(params, encoder_input_tokens) and not (
      jit_setup and scaffold.providing()):
    return jax.eval_shape(
        lambda p, e: _context_cache(model, p, e, context, max_length), params,
        encoder_input_tokens)
  return (_CONTEXT_CACHE if jit_setup else _context_cache)(
      model, params, jnp.asarray(encoder_input_tokens, jnp.int32), context,
      max_length)


def _context_cache(model, params, encoder_input_tokens, context: int,
                   max_length: int):
  """`context_cache`'s body."""
  batch = encoder_input_tokens.shape[0]
  cache = model.init_cache(params, encoder_input_tokens, max_length)
  return model.extend(params, jnp.full((batch, context), 5, jnp.int32),
                      cache)[1]


_CONTEXT_CACHE = scaffold.ProvidedJit(_context_cache,
                                      static_argnums=(0, 3, 4))


def _abstract(*trees) -> bool:
  return any(isinstance(x, jax.ShapeDtypeStruct)
             for x in jax.tree_util.tree_leaves(trees))


def call_time(model, params, encoder_input_tokens, k: int, *,
              repeats: int = 5, n_calls: int = 20, context: int = 32,
              max_length: Optional[int] = None, cache=None) -> float:
  """Seconds per decoder call on k tokens after `context` cached tokens.

  Args:
    model: an `interfaces.DecodingModel`, e.g. a `network.T5Model`.
    params: its parameters.
    encoder_input_tokens: `[batch, input_length]`.
    k: tokens per call (1 = one autoregressive step; gamma + 1 = one
      speculative verification).
    repeats: timing repeats (the median is returned).
    n_calls: calls per timed loop, at first (raised until a loop takes
      50 ms).
    context: decoder tokens already in the cache (the call's position).
    max_length: cache length (default context + k + 8).
    cache: optional `context_cache(...)` to reuse (e.g. for several k; its
      length must hold context + k).
  """
  encoder_input_tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
  batch = encoder_input_tokens.shape[0]
  if cache is None:
    cache = context_cache(model, params, encoder_input_tokens, context,
                          max_length or context + k + 8)
  block = jnp.full((batch, k), 7, jnp.int32)
  # Its compiled entry chosen once, outside the timed calls.
  entry = repeated_calls.entry((model, params, block, cache))
  return loop_time(lambda n: entry(model, params, block, cache, n), n_calls,
                   repeats)


def _repeated_proposals(drafter, params, state, sequences, gamma, n_calls,
                        lengths, rng):
  """n_calls proposals from the same position.

  Each call's first draft is written back as the last committed token and the
  drafter state is carried, so no call is loop-invariant (XLA would hoist a
  greedy proposal out of the loop otherwise). The params are laid out for
  decoding before the loop, as the decode loops' are (`scaffold.run`).
  """
  params = network.decoding_layout(params)
  rows = jnp.arange(sequences.shape[0])

  def body(i, carry):
    state, sequences = carry
    drafts, _, state = drafter.propose(
        params, state, sequences, lengths, gamma,
        sampling_lib.SamplingConfig(), jax.random.fold_in(rng, i))
    return state, sequences.at[rows, lengths - 1].set(drafts[:, 0])

  return jax.lax.fori_loop(0, n_calls, body, (state, sequences))[1]


_PROPOSALS = scaffold.ProvidedJit(_repeated_proposals, static_argnums=(0, 4))


def drafter_token_time(drafter, params, encoder_input_tokens, gamma: int = 4,
                       *, repeats: int = 5, n_calls: int = 10,
                       context: int = 32, jit_setup: bool = False) -> float:
  """Seconds per drafted token of `drafter.propose(gamma)` (greedy).

  The drafter state is the one after `context` committed tokens
  (`drafter.prefill`), so a T5 drafter makes its catch-up call (2 tokens)
  and gamma - 1 one-token calls, as in the loop: the result is about
  t_draft(1) plus the drafter's per-token sampling work, for any drafter.
  `jit_setup` builds that state in one compiled call instead of op by op
  (faster where op-by-op dispatch compiles slowly, e.g. tiny models on a
  CPU); the timed loop is the same.
  """
  encoder_input_tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
  state, sequences, lengths, rng = _proposal_inputs(
      drafter, params, encoder_input_tokens, gamma, context, jit_setup)
  entry = _PROPOSALS.entry((params,))
  run = lambda n: entry(drafter, params, state, sequences, gamma, n,
                        lengths, rng)
  return loop_time(run, n_calls, repeats) / gamma


def _proposal_inputs(drafter, params, encoder_input_tokens, gamma, context,
                     jit_setup=False):
  """(state, sequences, lengths, rng) of `drafter_token_time`."""
  batch = encoder_input_tokens.shape[0]
  buffer = context + gamma + 8
  if _abstract(params, encoder_input_tokens) and not (
      jit_setup and scaffold.providing()):
    state, sequences = jax.eval_shape(
        lambda p, e: _proposal_state(drafter, p, e, context, buffer), params,
        encoder_input_tokens)
  else:
    state, sequences = (_PROPOSAL_STATE if jit_setup else _proposal_state)(
        drafter, params, encoder_input_tokens, context, buffer)
  lengths = jnp.full((batch,), context, jnp.int32)
  return state, sequences, lengths, jax.random.key(0)


def _proposal_state(drafter, params, encoder_input_tokens, context: int,
                    buffer: int):
  """The drafter's state after `context` committed tokens, all but the
  last consumed (as after an iteration with a rejection: propose then
  feeds the last one), and the sequences."""
  batch = encoder_input_tokens.shape[0]
  state = drafter.init(params, encoder_input_tokens, buffer)
  sequences = jnp.zeros((batch, buffer), jnp.int32).at[:, 1:context].set(5)
  state = drafter.prefill(params, state, sequences[:, :context],
                          jnp.full((batch,), context, jnp.int32))
  return state, sequences


_PROPOSAL_STATE = scaffold.ProvidedJit(_proposal_state,
                                       static_argnums=(0, 3, 4))


def fed_tree(shape) -> Tuple[np.ndarray, np.ndarray]:
  """Depth `[F]` and visibility `[F, F]` of the nodes a tree drafter is
  called on (`TreeShape.fed` in `grow.Fed`'s order: the root, then each
  level's fed nodes), each node seeing itself and its ancestors, as
  `grow.grow` builds them. A dynamic shape's parents are taken in slot
  order: its run-time ranking gives other nodes, the same shapes."""
  depth, parent = [0], [0]
  for d, feeds in enumerate(shape.fed, 1):
    above = (0,) if d == 1 else shape.fed[d - 2]  # level d - 1's fed nodes
    for p in feeds:
      depth.append(d)
      parent.append(shape.fed_offsets[d - 1] +
                    above.index(shape.levels[d - 1][p][0]))
  visible = np.eye(len(depth), dtype=bool)
  for i in range(1, len(depth)):
    visible[i] |= visible[parent[i]]
  return np.asarray(depth, np.int32), visible


def tree_level_call(drafter, params, encoder_input_tokens, level: int, *,
                    context: int = 32, jit_setup: bool = False, cache=None):
  """The arguments of one tree level's call (`repeated_levels`).

  Level d (1 .. depth - 1) is the call `grow.grow` makes once level d is
  drawn: the drafter on level d's fed nodes (`TreeShape.fed[d - 1]`, the
  nodes that get children), under the mask of every node called so far.
  The tree's root sits at cache slot `context`, and level d's nodes after
  the root's and the earlier levels' (`TreeShape.fed_offsets`), as in the
  tree loop.

  Args:
    drafter: a `drafters.TreeDrafter`: its T5 drafter (`base`) and `shape`.
    params: the T5 drafter's params (arrays, or `jax.ShapeDtypeStruct`s).
    encoder_input_tokens: `[batch, input_length]` (or its shape struct).
    level: 1 .. depth - 1.
    context: committed tokens before the root.
    jit_setup: build the cache in one compiled call.
    cache: the drafter's cache with the root's and every fed node's slot
      written (`context + fed_width` tokens; one for every level), or None
      (built here).

  Returns:
    `(tokens [batch, n], cache, mask)`: the level's n fed nodes, the cache
    at their first slot, the called nodes' `network.TreeMask`.
  """
  shape = drafter.shape
  if not 1 <= level < shape.depth:
    raise ValueError(f'tree {shape.spec!r}: level {level} outside 1..'
                     f'{shape.depth - 1} (the levels with a drafter call)')
  batch = encoder_input_tokens.shape[0]
  depth, visible = fed_tree(shape)
  width, n = len(depth), len(shape.fed[level - 1])
  # The rows of nodes not called yet: themselves only, as in `grow.grow`.
  end = shape.fed_offsets[level] + n
  visible = np.where(np.arange(width)[:, None] < end, visible,
                     np.eye(width, dtype=bool))
  if cache is None:
    cache = context_cache(drafter.base.model, params, encoder_input_tokens,
                          context + width, context + width + 8, jit_setup)
  cache = cache.rewind(jnp.full((batch,), context + shape.fed_offsets[level],
                                jnp.int32))
  mask = network.TreeMask(
      base=jnp.full((batch,), context, jnp.int32),
      depth=jnp.broadcast_to(jnp.asarray(depth), (batch, width)),
      visible=jnp.broadcast_to(jnp.asarray(visible), (batch, width, width)))
  return jnp.full((batch, n), 7, jnp.int32), cache, mask


def tree_level_time(drafter, params, encoder_input_tokens,
                    level: Optional[int] = None, *, repeats: int = 5,
                    n_calls: int = 10, context: int = 32,
                    jit_setup: bool = False) -> float:
  """Seconds of one level of a token tree drafted by `drafter` (greedy).

  A level is the drafter's call on the level's fed nodes under the tree
  mask and the draw of their children (`repeated_levels`; the arguments:
  `tree_level_call`), timed alone in a compiled loop as
  `drafter_token_time` times a drafter step: what `shape.TreeCosts`
  calls `level_ms`. The root's call (the catch-up of two tokens) is no
  level: `drafter_token_time` times it.

  Args:
    drafter: a `drafters.TreeDrafter` of the tree's shape, e.g.
      `TreeDrafter(t5_drafter, shape.parse('beam:8,4,12/64'))`.
    params: the T5 drafter's params.
    encoder_input_tokens: `[batch, input_length]`.
    level: 1 .. depth - 1, or None: the mean over those levels (each timed).
    repeats, n_calls, context, jit_setup: as `drafter_token_time`'s.

  Raises:
    ValueError: a tree of one level (no level call), a level outside it.
  """
  shape = drafter.shape
  levels = range(1, shape.depth) if level is None else (level,)
  if not levels:
    raise ValueError(f'tree {shape.spec!r} has one level: its only drafter '
                     'call is the root\'s (drafter_token_time)')
  encoder_input_tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
  width = shape.fed_width
  cache = context_cache(drafter.base.model, params, encoder_input_tokens,
                        context + width, context + width + 8, jit_setup)
  model, k = drafter.base.model, shape.max_children
  entry = repeated_levels.entry((params,))
  seconds = []
  for d in levels:
    tokens, at, mask = tree_level_call(drafter, params, encoder_input_tokens,
                                       d, context=context, cache=cache)
    seconds.append(loop_time(
        lambda n, tokens=tokens, at=at, mask=mask: entry(
            model, params, tokens, at, mask, k, n), n_calls, repeats))
  return float(np.mean(seconds))


def cost_curve(model, params, encoder_input_tokens, ks: Iterable[int], *,
               repeats: int = 5, n_calls: int = 20, context: int = 32,
               jit_setup: bool = False) -> Dict[int, float]:
  """{k: seconds per k-token decoder call} for each k (1 is always added).

  Every k is timed from one cache of `context` tokens (`context_cache`,
  built once; `jit_setup`: in one compiled call).
  """
  ks = sorted(set(ks) | {1})
  encoder_input_tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
  cache = context_cache(model, params, encoder_input_tokens, context,
                        context + max(ks) + 8, jit_setup=jit_setup)
  return {k: call_time(model, params, encoder_input_tokens, k,
                       repeats=repeats, n_calls=n_calls, context=context,
                       cache=cache) for k in ks}


def alpha(target, target_params, drafter, draft_params, encoder_input_tokens,
          *, sampling: sampling_lib.SamplingConfig, max_decode_len: int,
          rng: Optional[Array] = None, eos_id: int = 1
          ) -> Dict[str, object]:
  """Measures alpha = E[sum_x min(p(x), q(x))] on target-decoded outputs.

  Decodes `encoder_input_tokens` with the target (`decoding.
  temperature_sample` under `sampling`), then scores every prefix of the
  outputs with the target (p) and the drafter (q, via `drafter.score`), both
  adjusted by the same sampling mode, and takes beta = sum_x min(p, q) at
  every output position up to and including EOS.

  Args:
    target: the target model (`T5Model`).
    target_params: its parameters.
    drafter: an `interfaces.Drafter` (`T5Drafter`, `NgramDrafter`).
    draft_params: its parameters.
    encoder_input_tokens: `[batch, input_length]`.
    sampling: the sampling mode (temperature 0 = greedy: beta is 1 where the
      two argmaxes agree, else 0).
    max_decode_len: output length.
    rng: PRNG key (required unless greedy).
    eos_id: end-of-sequence id.

  Returns:
    {'alpha': pooled mean of beta, 'betas': 1-D array of every position's
     beta, 'positions': how many, 'lengths': output lengths}.
  """
  out = decoding.temperature_sample(
      target, target_params, encoder_input_tokens,
      max_decode_len=max_decode_len, sampling=sampling, eos_id=eos_id,
      rng=rng)
  values = betas_on_outputs(target, target_params, drafter, draft_params,
                            encoder_input_tokens, out.tokens, out.lengths,
                            sampling=sampling)
  return {'alpha': float(values.mean()) if values.size else float('nan'),
          'betas': values, 'positions': int(values.size),
          'lengths': np.asarray(out.lengths)}


def betas_on_outputs(target, target_params, drafter, draft_params,
                     encoder_input_tokens, tokens, lengths, *,
                     sampling: sampling_lib.SamplingConfig) -> np.ndarray:
  """beta = sum_x min(p, q) at every position of given target outputs.

  Args:
    target, target_params, drafter, draft_params: as in `alpha`.
    encoder_input_tokens: `[batch, input_length]`.
    tokens: `[batch, length]` outputs of the target for those inputs.
    lengths: `[batch]` output lengths (positions past them are ignored).
    sampling: the sampling mode both distributions are adjusted by.

  Returns:
    1-D array of beta, row by row, the first lengths[i] positions of row i.
  """
  betas = partitioning.to_host(_betas(
      target, drafter, target_params, draft_params,
      jnp.asarray(encoder_input_tokens, jnp.int32),
      jnp.asarray(tokens, jnp.int32), sampling))
  lengths = np.asarray(lengths)
  mask = np.arange(betas.shape[1])[None, :] < lengths[:, None]
  return betas[mask]


def _betas_of(target, drafter, target_params, draft_params,
              encoder_input_tokens, tokens, sampling):
  decoder_inputs = jnp.pad(tokens, ((0, 0), (1, 0)))[:, :-1]  # BOS = 0
  p = sampling_lib.probabilities(
      target.logits(target_params, encoder_input_tokens, decoder_inputs),
      sampling)
  draft_params = speculative.with_target(drafter, draft_params, target_params)
  q = sampling_lib.probabilities(
      drafter.score(draft_params, encoder_input_tokens, decoder_inputs),
      sampling)
  return jnp.minimum(p, q).sum(axis=-1)


# A program of its own, through `scaffold` like the decode loops: a build
# ahead of time records it (the shape structs a provider's stand-in takes).
_betas = scaffold.ProvidedJit(_betas_of, static_argnums=(0, 1, 6))


def rank_probs(drafter, draft_params, encoder_input_tokens, tokens, lengths,
               *, max_rank: int = 8, batch_size: int = 16) -> np.ndarray:
  """How often each output token is the drafter's rank-r candidate.

  Teacher-forced on `tokens` (e.g. the target's greedy outputs): at every
  output position up to and including EOS, the rank of the output token in
  the drafter's logits (`drafter.score`) after the true prefix, 0 = its
  most likely token. A token tree's greedy acceptance rests on these
  (`drafters.tree.shape.best`): rank_probs[0] is the greedy alpha.

  Returns:
    `[max_rank]` shares of the positions (ranks >= max_rank not counted).
  """
  return rank_shares(functools.partial(_score_ranks, drafter), draft_params,
                     encoder_input_tokens, tokens, lengths,
                     max_rank=max_rank, batch_size=batch_size)


def _score_ranks_of(drafter, params, enc, dec_out):
  """`rank_probs`' ranks, compiled once per drafter and shapes."""
  dec_in = jnp.pad(dec_out, ((0, 0), (1, 0)))[:, :-1]
  logits = drafter.score(params, enc, dec_in).astype(jnp.float32)
  mine = jnp.take_along_axis(logits, dec_out[..., None], -1)
  return jnp.sum(logits > mine, axis=-1)


_score_ranks = scaffold.ProvidedJit(_score_ranks_of, static_argnums=(0,))


def rank_shares(ranks: Callable[..., Array], params, encoder_input_tokens,
                tokens, lengths, *, first: int = 0, max_rank: int = 8,
                batch_size: int = 16) -> np.ndarray:
  """`[max_rank]` shares of the output positions at each rank.

  Args:
    ranks: `(params, encoder rows, token rows) -> [rows, n]` the rank of
      output position `first + i`'s token in a drafter's logits (0 = its
      most likely), compiled; called on `batch_size` rows at a time.
    params: its params.
    encoder_input_tokens: `[batch, input_length]`.
    tokens: `[batch, length]` the outputs (e.g. the target's greedy ones).
    lengths: `[batch]` output lengths: positions up to and including EOS
      count.
    first: the output position of `ranks`' column 0.
    max_rank: ranks >= this are not counted.
    batch_size: rows per call.
  """
  tokens = np.asarray(tokens)
  lengths = np.asarray(lengths)
  counts = np.zeros(max_rank, np.int64)
  positions = 0
  for start in range(0, tokens.shape[0], batch_size):
    stop = start + batch_size
    r = partitioning.to_host(ranks(
        params, jnp.asarray(encoder_input_tokens[start:stop]),
        jnp.asarray(tokens[start:stop])))
    at = np.arange(first, first + r.shape[1])[None]
    r = r[at < lengths[start:stop, None]]
    positions += r.size
    counts += np.bincount(r[r < max_rank], minlength=max_rank)[:max_rank]
  return counts / max(positions, 1)
