r"""Every decode program compiled for a TPU or GPU this machine does not have.

XLA compiles for *compile-only* devices: libtpu (`pip install
"jax[tpu]==<jax version>"`) describes any Cloud TPU slice and the CUDA plugin
any GPU, without the chips (`jax.experimental.topologies`). The decode
programs of the package are compiled from model configs alone: the
parameters are `jax.eval_shape` of the init, placed by T5X's partitioning
rules as the eval job places them (`partitioning.Partitioner`:
`param_shardings`, `sharded_model`, batch over 'data'), so no weight is
read. What the compiler says is reported per program:

- compiled, or the compiler's error, named with the program;
- bytes per device (`memory_analysis()`: arguments = parameters and inputs,
  outputs, temporaries = caches and activations) against the chip's HBM;
- flops and bytes accessed per call (`cost_analysis()`; TPU only: the CUDA
  compiler reports none), and from them a roofline time with the chip's
  published peak flops and HBM bandwidth, plus `ops x overhead_s` when an
  overhead per executed op is given. ESTIMATED from the compiler's counts,
  never measured. The compiler counts a while loop's body once, so a whole
  decode loop's counts are one pass, not one decode: per-step figures come
  from the step programs (`step_facts`: `T5Model.extend` with k tokens).

  target = compiled.get_target('tpu:v4:2x2x1')
  setup = compiled.Setup(target=models.config('t5_1_1_xxl'),
                         draft=models.config('t5_1_1_small'), batch=8)
  facts = compiled.compile_program('t5', setup, target)  # speculative, t5
  facts['memory']['peak_bytes'], facts['fits'], facts['cost']

Programs (`program_names()`): 'baseline' (`decoding.temperature_sample`),
one per drafter kind of `drafters.KINDS` (`speculative.speculative_sample`:
the chain loop, or the kind's merged loop: 'pass', 'heads'; token trees:
'tree', 'heads_tree'), 'stream_baseline' (`streaming.sample_stream`) and
'stream:<kind>' (`streaming.speculative_stream`).

A TPU v4 or v5p chip has two TensorCores, which a TPU VM's jax runs as one
device (megacore); the compile-only topology lists each core as a device
with half the chip's HBM (the compiler allows 15.25 GiB of a v4 core), so
a program is compiled over both cores of each chip (the 'model' axis spans
them) and its bytes per device are compared with half the chip's HBM; the
roofline uses half the chip's peak and bandwidth per device. The command
(`python -m specdec_jax.compiled`, `main`) writes
results/compiled/<target>.{json,md}; docs/tpu.md explains it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import logging
import math
import os
import pathlib
import re
import shlex
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specdec_jax import drafters
from specdec_jax import interfaces
from specdec_jax import loading
from specdec_jax import network
from specdec_jax import output_cache
from specdec_jax import paper as paper_lib
from specdec_jax import partitioning
from specdec_jax import programs
from specdec_jax import speculative
from specdec_jax import theory
from specdec_jax.bench import aot
from specdec_jax import hardware
from specdec_jax import models
from specdec_jax.bench import report
from specdec_jax.sampling import SamplingConfig

ESTIMATED = "estimated from the compiler's counts, not measured"
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's published figures.

  Attributes:
    name: e.g. 'TPU v4'.
    peak_flops: dense bfloat16 flops / s per chip.
    hbm_bandwidth: HBM bytes / s per chip.
    hbm_bytes: HBM per chip.
    cores: devices per chip in a compile-only topology: a TPU v4 chip's
      two TensorCores are two devices of half the chip's HBM to the
      compiler (15.25 GiB usable of a core's 16); the others (v5p too:
      one megacore device per chip) one.
    usable_bytes: HBM a program may use on one device, as the compiler's
      out-of-memory error states it (None: not seen; the HBM's share).
  """
  name: str
  peak_flops: float
  hbm_bandwidth: float
  hbm_bytes: int
  cores: int = 1
  usable_bytes: Optional[int] = None

  @property
  def device_hbm_bytes(self) -> int:
    """What a program may use on one device: `usable_bytes` where the
    compiler said it (its out-of-memory error), else the HBM's share."""
    return self.usable_bytes or self.hbm_bytes // self.cores


# Published per-chip figures and the GPUs' XLA target configs: one data
# file (bench/chips.json), beside the measured profiles (profiles/).
_CHIP_FILE = pathlib.Path(__file__).resolve().parent / 'bench' / 'chips.json'
_CHIP_DATA = json.loads(_CHIP_FILE.read_text())
CHIPS: Dict[str, Chip] = {key: Chip(**fields) for key, fields in
                          _CHIP_DATA['chips'].items()}


def gpu_target_config(chip: str, cuda: Tuple[int, int] = (13, 0)) -> str:
  """XLA's GpuTargetConfigProto text of a GPU in `CHIPS` (its memory,
  bandwidth and name) for a CUDA runtime version: what a compile-only GPU
  device compiles for."""
  spec = CHIPS[chip]
  return _CHIP_DATA['gpu_target_config'].format(
      bandwidth=int(spec.hbm_bandwidth), memory=spec.hbm_bytes,
      cuda=cuda[0], cuda_minor=cuda[1], name=spec.name)


# XLA's key for a device in autotune results (`AutotuneCacheKey`), e.g.
# "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 3352 GB/s,
# L2 cache: 52 MB, DNN version: 9.14.0".
_AUTOTUNE_DEVICE = re.compile(
    r'CUDA: (?P<cc_major>\d+)\.(?P<cc_minor>\d+), Cores: (?P<cores>\d+), '
    r'GPU clock: (?P<clock>[\d.]+) GHz, Memory bandwidth: (?P<gbs>\d+) GB/s, '
    r'L2 cache: (?P<l2_mb>\d+) MB(?:, DNN version: (?P<dnn>[\d.]+))?')


def match_autotune_device(config: str, device: str) -> str:
  """`config` (a `GpuTargetConfigProto` text) with the fields XLA keys
  autotune results by set to those of `device` (the device string of a
  results file a GPU wrote, `bench.aot.autotune_device`): a compile-only
  device described otherwise finds none of them and takes its defaults.

  Raises:
    ValueError: `device` is not in XLA's form.
  """
  m = _AUTOTUNE_DEVICE.fullmatch(device.strip())
  if m is None:
    raise ValueError(f'not an XLA autotune device key: {device!r}')
  l2 = re.search(r'l2_cache_size: (\d+)', config)
  l2_bytes = int(l2.group(1)) if l2 else 0
  if l2_bytes // 10**6 != int(m['l2_mb']):  # keep an exact size that fits
    l2_bytes = int(m['l2_mb']) * 10**6
  dnn = [int(x) for x in (m['dnn'] or '0.0.0').split('.')] + [0, 0]
  fields = {
      r'core_count: \d+': f"core_count: {m['cores']}",
      r'clock_rate_ghz: [\d.]+': f"clock_rate_ghz: {m['clock']}",
      r'memory_bandwidth: \d+': f"memory_bandwidth: {int(m['gbs']) * 10**9}",
      r'l2_cache_size: \d+': f'l2_cache_size: {l2_bytes}',
      r'cuda_compute_capability \{[^}]*\}': (
          f"cuda_compute_capability {{ major: {m['cc_major']} minor: "
          f"{m['cc_minor']} }}"),
      r'dnn_version_info \{[^}]*\}': (
          f'dnn_version_info {{ major: {dnn[0]} minor: {dnn[1]} patch: '
          f'{dnn[2]} }}'),
  }
  for pattern, value in fields.items():
    config, n = re.subn(pattern, value, config)
    if n != 1:
      raise ValueError(f'the target config has no single {pattern!r}')
  return config


@dataclasses.dataclass(frozen=True)
class Target:
  """A named compile-only target: a TPU slice or GPUs.

  Attributes:
    name: 'tpu:v4:2x2x1', 'gpu:h100', ...
    platform: 'tpu' or 'gpu'.
    chip: the chip's key in `CHIPS`.
    topology: the topology name ('v4:2x2x1'; GPUs: '1x1x<n>').
    chips: number of chips.
  """
  name: str
  platform: str
  chip: str
  topology: str
  chips: int

  @property
  def spec(self) -> Chip:
    return CHIPS[self.chip]

  @property
  def devices(self) -> int:
    """Compile-only devices: `Chip.cores` per chip."""
    return self.chips * self.spec.cores


def _tpu(generation: str, shape: str) -> Target:
  dims = [int(d) for d in shape.split('x')]
  return Target(f'tpu:{generation}:{shape}', 'tpu', generation,
                f'{generation}:{shape}', math.prod(dims))


TARGETS: Dict[str, Target] = {t.name: t for t in (
    _tpu('v4', '1x1x1'), _tpu('v4', '2x2x1'), _tpu('v4', '2x2x2'),
    _tpu('v5e', '1x1'), _tpu('v5e', '2x2'), _tpu('v5e', '2x4'),
    _tpu('v5p', '2x2x1'), _tpu('v6e', '1x1'), _tpu('v6e', '2x2'),
    _tpu('v6e', '2x4'),
    Target('gpu:h100', 'gpu', 'h100', '1x1x1', 1),
    Target('gpu:h100x8', 'gpu', 'h100', '1x1x8', 8),
    Target('gpu:h200', 'gpu', 'h200', '1x1x1', 1),
)}


def get_target(name: str) -> Target:
  """The target `name`; ValueError listing the known ones."""
  if name not in TARGETS:
    raise ValueError(f'unknown compile-only target {name!r}; known targets: '
                     f'{", ".join(TARGETS)}')
  return TARGETS[name]


class BackendMissing(RuntimeError):
  """The compiler plugin of a target is not installed (named, with the fix)."""


@functools.lru_cache(maxsize=None)
def devices(name: str, target_config: Optional[str] = None,
            topology: Optional[bytes] = None) -> Tuple[Any, ...]:
  """The compile-only devices of target `name` (`Chip.cores` per chip).

  A GPU target compiles for `gpu_target_config` of its chip, or for
  `target_config` (a `GpuTargetConfigProto` in text form) when given.
  `topology`, the serialized topology of the devices a run had
  (`bench.aot.device_topology`), gives the compile-only twins of those
  very devices instead (XLA's own description of them, every field).

  Raises:
    ValueError: an unknown target, or a `topology` that this jax cannot
      read or that is not the target's.
    BackendMissing: libtpu / the CUDA plugin is not installed.
  """
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  target = get_target(name)
  # Compile-only use never owns a chip: let several processes (the suite's
  # workers, parallel compiles) load libtpu without its lock file.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  # Nor a GPU: the CUDA plugin's start-up check of the driver would fail and
  # leave the plugin unregistered (read when jax first looks for backends,
  # so `main` sets it before anything else).
  os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  if topology is not None:
    return _recorded_devices(target, topology)
  try:
    if target.platform == 'tpu':
      kw = ({'chips_per_host_bounds': (1, 1, 1)} if target.chips == 1 else {})
      topo = topologies.get_topology_desc(
          platform='tpu', topology_name=target.topology, **kw)
    else:
      config = target_config or default_target_config(name)
      topo = topologies.get_topology_desc(
          'compile-only', 'cuda', target_config=config,
          topology=target.topology)
  except BackendMissing:
    raise
  except Exception as e:  # pylint: disable=broad-except
    package = ('"jax[tpu]==%s"' if target.platform == 'tpu' else
               '"jax[cuda12]==%s"') % jax.__version__
    raise BackendMissing(
        f'target {name!r}: no compile-only {target.platform} devices ({e}). '
        f'Install the compiler at this jax version: pip install {package}'
        ) from e
  out = tuple(topo.devices)
  if len(out) != target.devices:
    raise BackendMissing(f'target {name!r}: expected {target.chips} chips x '
                         f'{target.spec.cores} cores, the topology has '
                         f'{len(out)} devices')
  return out


def _recorded_devices(target: Target, topology: bytes) -> Tuple[Any, ...]:
  """`devices` from a serialized topology, checked against `target`."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:  # (`devices` has set the environment the plugins start in)
    jax.devices()  # starts the plugins, whose API reads the topology
    out = tuple(topologies.TopologyDescription.deserialize(topology).devices)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'target {target.name!r}: jax {jax.__version__} cannot '
                     f'read the recorded device topology ({e!r:.200})') from e
  platform = {'cuda': 'gpu'}.get(out[0].platform, out[0].platform) if (
      out) else None
  if platform != target.platform or len(out) != target.devices:
    raise ValueError(f'target {target.name!r} ({target.devices} '
                     f'{target.platform} devices): the recorded topology has '
                     f'{len(out)} {platform} devices')
  return out


def check_compiles(device) -> None:
  """Compiles a tiny program for `device`: raises what the compiler says
  if it cannot compile for it at all."""
  x = jax.ShapeDtypeStruct((8,), jnp.float32,
                           sharding=jax.sharding.SingleDeviceSharding(device))
  jax.jit(lambda a: a + 1.0).lower(x).compile()


def default_target_config(name: str) -> str:
  """The `GpuTargetConfigProto` text GPU target `name` compiles for by
  default: its chip's, for the installed CUDA plugin's CUDA version."""
  return gpu_target_config(get_target(name).chip, _cuda_version())


def _cuda_version() -> Tuple[int, int]:
  """(major, minor) of the installed CUDA plugin's CUDA; 12.8 / 13.0."""
  for name, version in (('jax_cuda13_plugin', (13, 0)),
                        ('jax_cuda12_plugin', (12, 8))):
    if importlib.util.find_spec(name) is not None:
      return version
  raise BackendMissing(
      'no CUDA plugin: pip install "jax[cuda12]==%s" (or cuda13) to '
      'compile for a GPU without one' % jax.__version__)


def partitioner(target: Target, num_partitions: Optional[int] = None,
                one_device: bool = False) -> partitioning.Partitioner:
  """T5X's partitioner on the target's devices (default: all
  model-parallel, the T5X choice for decoding a model that one chip cannot
  hold); `one_device`: the first device alone."""
  devs = list(devices(target.name))[:1 if one_device else None]
  n = len(devs) if num_partitions is None or one_device else num_partitions
  return partitioning.Partitioner(num_partitions=n, devices=devs)


# ---------------------------------------------------------------------------
# Abstract arguments.
# ---------------------------------------------------------------------------


def abstract(tree, shardings):
  """`jax.ShapeDtypeStruct`s of `tree`'s leaves carrying `shardings`."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, shardings)


def abstract_params(model, part: partitioning.Partitioner,
                    dtype: Any = None):
  """`model`'s parameters as sharded `ShapeDtypeStruct`s (no weights):
  `jax.eval_shape` of its init (in `dtype` if given, e.g. bfloat16 as
  a bf16 checkpoint loads), with `part.param_shardings(model)`."""
  shapes = partitioning.unwrap(model).param_shapes()
  if dtype is not None:
    shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype)), shapes)
  return abstract(shapes, part.param_shardings(model))


def _replicated(part, tree):
  return abstract(tree, jax.tree.map(
      lambda _: NamedSharding(part.mesh, P()), tree))


def _like(tree, known: Sequence[Any], part):
  """Shardings for `tree` (a drafter's params): a subtree with the structure
  and shapes of one of `known` (e.g. the target's params inside PaSS's) takes
  its shardings; every other leaf is replicated."""
  def shapes(t):
    return [tuple(x.shape) for x in jax.tree.leaves(t)]
  for ref in known:
    if (jax.tree.structure(tree) == jax.tree.structure(ref) and
        shapes(tree) == shapes(ref)):
      return abstract(tree, jax.tree.map(lambda r: r.sharding, ref))
  if isinstance(tree, Mapping):
    return type(tree)({k: _like(v, known, part) for k, v in tree.items()})
  if isinstance(tree, (tuple, list)) and not hasattr(tree, 'shape'):
    return type(tree)(_like(v, known, part) for v in tree)
  return _replicated(part, tree)


def build_drafter(kind: str, target, target_params, draft_model,
                  draft_params, part, *, output_length: int,
                  tree: Optional[str] = None):
  """`(drafter, abstract params)` of a drafter kind, built as a job builds it
  (`drafters.KINDS[kind].build`) inside `jax.eval_shape`: no weights.

  n-gram tables come from a one-sentence corpus (their shapes are fixed by
  the vocabulary), the output cache is an empty store, 'pass' and 'heads'
  get untrained parameters of their default shapes.
  """
  draft = loading.DrafterSpec(
      kind, config=partitioning.unwrap(draft_model).config, tree=tree)
  made = {}
  store = output_cache.OutputCache.empty(
      partitioning.unwrap(target).config.emb_dim, output_length,
      target.vocab_size, 'compile-only')

  def build(tp, dp):
    source = draft.source(
        vocab_size=target.vocab_size, output_length=output_length,
        draft_model=draft_model, draft_params=dp, target=target,
        target_params=tp, train_targets=lambda: [[2, 3, 4, 1]],
        train_pairs=lambda: [], store=store)
    made['drafter'], params = draft.drafter_kind.build(source)
    return params

  shapes = jax.eval_shape(build, target_params, draft_params)
  # A draft model of the target's own config: its params are the draft's.
  known = ((draft_params, target_params) if draft.drafter_kind.needs_model else
           (target_params, draft_params))
  return made['drafter'], _like(shapes, known, part)


# ---------------------------------------------------------------------------
# Programs.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setup:
  """What one decode program decodes (static shapes and options).

  Attributes:
    target: the target's `network.T5Config`.
    draft: the draft model's config (kinds with a separate T5).
    batch: rows decoded at once (streaming: slots; 2 x batch examples).
    input_length: encoder input tokens.
    max_decode_len: output tokens.
    gamma: drafts per iteration (clamped to a merged drafter's max_gamma).
    temperature: 0 greedy, else sampled (topk / topp as given).
    topk: 0 = off.
    topp: 1.0 = off.
    tree: the tree kinds' shape (`drafters.tree.shape.parse`), None: default.
    param_dtype: the parameters' dtype (a bf16 checkpoint: 'bfloat16').
  """
  target: network.T5Config
  draft: network.T5Config
  batch: int = 1
  input_length: int = 512
  max_decode_len: int = 256
  gamma: int = 7
  temperature: float = 0.0
  topk: int = 0
  topp: float = 1.0
  tree: Optional[str] = None
  param_dtype: str = 'bfloat16'

  @property
  def sampling(self) -> SamplingConfig:
    return SamplingConfig(temperature=self.temperature, topk=self.topk,
                          topp=self.topp)


def program_names() -> Tuple[str, ...]:
  """Every decode program: the baselines, each kind, the streaming loops."""
  return (('baseline',) + tuple(drafters.KINDS) +
          ('stream_baseline', 'stream:t5'))


def _check_program(name: str) -> None:
  kind = name.split(':', 1)[1] if name.startswith('stream:') else name
  if name not in ('baseline', 'stream_baseline') and (
      kind not in drafters.KINDS):
    raise ValueError(f'unknown program {name!r}; programs: baseline, '
                     f'stream_baseline, a drafter kind '
                     f'({", ".join(drafters.KINDS)}) or stream:<kind>')


# Kinds whose merged loop drafts with the target's own forward (look-ahead
# slots, heads on its final states): their loops take the plain
# `network.T5Model` (they refuse a `partitioning.ShardedModel`, whose `extend`
# has no look-ahead slots or final states), so the target's parameters keep
# the rules' shardings and GSPMD places the rest.
SELF_DRAFTING = ('pass', 'heads', 'heads_tree')


def _models(setup: Setup, part):
  target = part.sharded_model(network.T5Model(setup.target))
  draft = part.sharded_model(network.T5Model(setup.draft),
                             partitioning.data_parallel_rules())
  return target, draft


def _tokens(part, rows: int, length: int):
  return jax.ShapeDtypeStruct(
      (rows, length), jnp.int32,
      sharding=partitioning.batch_sharding(part.mesh, part.rules))


def _rng(part):
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.ShapeDtypeStruct(key.shape, key.dtype,
                              sharding=NamedSharding(part.mesh, P()))


def lower_program(name: str, setup: Setup, part) -> Tuple[
    jax.stages.Lowered, Dict[str, Any]]:
  """(the lowered program `name`, what it was lowered with: gamma used).

  Raises:
    ValueError: an unknown program, or a bad argument the decoder names.
  """
  _check_program(name)
  target, draft = _models(setup, part)
  params = abstract_params(target, part, setup.param_dtype)
  stream = name.startswith('stream')
  inputs = _tokens(part, 2 * setup.batch if stream else setup.batch,
                   setup.input_length)
  # On a mesh the eval job refills the whole slot batch (a sub-batch of one
  # row does not divide the 'data' axis).
  spec = programs.ProgramSpec(
      'baseline', 'stream' if stream else 'fixed',
      max_decode_len=setup.max_decode_len, sampling=setup.sampling, eos_id=1,
      batch_size=setup.batch if stream else 0,
      refill_sizes=(setup.batch,) if stream and part.data_size > 1 else None)
  if name in ('baseline', 'stream_baseline'):
    return programs.Program(spec, target).lower(params, inputs,
                                                _rng(part)), {}
  kind = name.split(':', 1)[1] if name.startswith('stream:') else name
  if kind in SELF_DRAFTING:
    target = partitioning.unwrap(target)
  drafter, draft_params = build_drafter(
      kind, target, params, draft,
      abstract_params(draft, part, setup.param_dtype), part,
      output_length=setup.max_decode_len, tree=setup.tree)
  merged = speculative.decodes_merged(drafter, None)
  top = (drafter.max_gamma(merged)
         if isinstance(drafter, interfaces.MergedDrafter) else None)
  gamma = setup.gamma if not top else min(setup.gamma, top)
  used = {'gamma': gamma, 'loop': type(drafter).__name__ + (
      ' (merged)' if merged else ''), 'target_model': type(target).__name__}
  program = programs.Program(
      dataclasses.replace(spec, kind='speculative', gamma=gamma), target,
      drafter)
  return program.lower(params, draft_params, inputs, _rng(part)), used


# ---------------------------------------------------------------------------
# What the compiler says.
# ---------------------------------------------------------------------------

_HOST = (' outfeed(', ' infeed(', ' send(', ' recv(', 'callback',
         'host_compute')
_ENTRY = re.compile(r'^ENTRY .*\{$')
_NOT_OPS = ('parameter(', 'constant(', 'get-tuple-element(', 'tuple(',
            'bitcast(', 'after-all(', 'partition-id(', 'replica-id(')


def hlo_facts(text: str) -> Dict[str, Any]:
  """While loops, host transfers and collectives of a compiled HLO text.

  `while_loops`: while instructions anywhere; `entry_while_loops`: those
  the program itself runs (not nested); `host_transfers`: infeed / outfeed
  / send / recv / host callbacks (0: the decode never waits on the host);
  `entry_ops`: instructions of the entry computation that do work (not
  parameters, constants, tuples, bitcasts): a step program's op count.
  """
  entry, inside = [], False
  for line in text.splitlines():
    if _ENTRY.match(line):
      inside = True
    elif inside and line.startswith('}'):
      inside = False
    elif inside:
      entry.append(line)
  ops = [l for l in entry if '=' in l and not any(
      f' {op}' in l.split('=', 1)[1] for op in _NOT_OPS)]
  return {'while_loops': text.count(' while('),
          'entry_while_loops': sum(' while(' in l for l in entry),
          'host_transfers': sum(text.count(op) for op in _HOST),
          'entry_ops': len(ops),
          'collectives': partitioning.count_collectives(text)}


def memory_facts(compiled) -> Dict[str, int]:
  """Bytes per device from `compiled.memory_analysis()`.

  peak_bytes = arguments + outputs - aliased + temporaries (the arguments
  are the parameters and inputs; temporaries the caches and activations).
  """
  m = compiled.memory_analysis()
  get = lambda k: int(getattr(m, k, 0) or 0)
  out = {'argument_bytes': get('argument_size_in_bytes'),
         'output_bytes': get('output_size_in_bytes'),
         'alias_bytes': get('alias_size_in_bytes'),
         'temp_bytes': get('temp_size_in_bytes'),
         'code_bytes': get('generated_code_size_in_bytes')}
  out['peak_bytes'] = (out['argument_bytes'] + out['output_bytes'] -
                       out['alias_bytes'] + out['temp_bytes'])
  return out


def cost_facts(compiled) -> Dict[str, float]:
  """flops and bytes accessed per call (`cost_analysis()`; {} if none)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  cost = cost or {}
  return {k: float(cost[key]) for k, key in (
      ('flops', 'flops'), ('bytes_accessed', 'bytes accessed'))
          if key in cost}


def roofline_s(flops: float, bytes_accessed: float, chip: Chip,
               ops: int = 0, overhead_s: float = 0.0,
               whole_chip: bool = False) -> float:
  """max(flops / peak, bytes / bandwidth) + ops x overhead: ESTIMATED.

  `flops` and `bytes_accessed` are one device's: a TensorCore's (the chip's
  figures divided by `chip.cores`), or with `whole_chip` the chip's (a
  program a TPU VM runs on one megacore device, e.g. a replicated drafter).
  """
  share = 1 if whole_chip else chip.cores
  return max(flops * share / chip.peak_flops,
             bytes_accessed * share / chip.hbm_bandwidth
             ) + ops * overhead_s


def compile_lowered(lowered, target: Target, what: str) -> Dict[str, Any]:
  """Compile facts of one lowered program (the compiler's error, named)."""
  t0 = time.perf_counter()
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    # The TPU compiler refuses a program that does not fit a device's HBM.
    oom = 'RESOURCE_EXHAUSTED' in str(e) or 'Ran out of memory' in str(e)
    return {'program': what, 'compiled': False,
            'error': f'{what}: {type(e).__name__}: {str(e)[:2000]}',
            **({'fits': False} if oom else {})}
  out = {'program': what, 'compiled': True,
         'compile_s': round(time.perf_counter() - t0, 1),
         'memory': memory_facts(compiled), 'cost': cost_facts(compiled),
         'hlo': hlo_facts(compiled.as_text())}
  # A compile-only executable is never run: keep no cache of programs (an
  # XXL loop's holds GBs of host memory).
  del compiled, lowered
  jax.clear_caches()
  out['fits'] = out['memory']['peak_bytes'] <= target.spec.device_hbm_bytes
  return out


def compile_program(name: str, setup: Setup, target: Target,
                    num_partitions: Optional[int] = None) -> Dict[str, Any]:
  """Compile facts of decode program `name` for `target` (see module doc).

  Never raises for a program the compiler rejects: the result has
  `compiled: False` and the error, named with the program.
  """
  part = partitioner(target, num_partitions)
  what = f'{name} on {target.name}, batch {setup.batch}'
  try:
    lowered, used = lower_program(name, setup, part)
  except Exception as e:  # pylint: disable=broad-except
    return {'program': what, 'compiled': False,
            'error': f'{what}: lowering: {type(e).__name__}: {e}'}
  return dict(compile_lowered(lowered, target, what), **used)


def step_facts(config: network.T5Config, target: Target, *, batch: int,
               tokens: int, input_length: int, cache_length: int,
               num_partitions: Optional[int] = None,
               replicated: bool = False,
               param_dtype: str = 'bfloat16',
               one_device: bool = False) -> Dict[str, Any]:
  """Compile facts of one decoder step: `T5Model.extend` of `tokens` tokens
  on a cache of `cache_length` slots, batch `batch` (the step of every
  loop; a drafter: `replicated`, data-parallel rules as the loops use;
  `one_device`: on one device, e.g. a TPU v4 core standing for the
  megacore device of a TPU VM)."""
  part = partitioner(target, num_partitions, one_device)
  model = part.sharded_model(network.T5Model(config), (
      partitioning.data_parallel_rules() if replicated else None))
  params = abstract_params(model, part, param_dtype)
  inputs = _tokens(part, batch, input_length)
  cache = jax.eval_shape(lambda p, t: model.init_cache(p, t, cache_length),
                         params, inputs)
  cache = abstract(cache, model.cache_shardings(cache))
  block = _tokens(part, batch, tokens)
  return compile_lowered(jax.jit(model.extend).lower(params, block, cache),
                         target, f'extend({tokens} tokens) batch {batch}')


# ---------------------------------------------------------------------------
# Estimated hardware profile and Table 2.
# ---------------------------------------------------------------------------


def step_seconds(facts: Mapping[str, Any], chip: Chip,
                 overhead_s: float = 0.0, whole_chip: bool = False) -> float:
  """The roofline time of a step program's facts (ESTIMATED)."""
  return roofline_s(facts['cost']['flops'], facts['cost']['bytes_accessed'],
                    chip, facts['hlo']['entry_ops'], overhead_s, whole_chip)


def draft_seconds(facts: Mapping[str, Any], chip: Chip,
                  overhead_s: float = 0.0) -> float:
  """A replicated drafter's step: every core computes the whole step here,
  where a TPU VM runs it on one device per chip, both cores (megacore), so
  it is timed with the whole chip's figures (ESTIMATED)."""
  return step_seconds(facts, chip, overhead_s, whole_chip=True)


def estimated_profile(target: Target, steps: Mapping[int, Mapping[int, Any]],
                      draft_steps: Mapping[int, Mapping[str, Any]], *,
                      overhead_s: float = 0.0, label: str = '',
                      megacore: bool = False) -> hardware.HardwareProfile:
  """A `hardware.HardwareProfile` built from the compiler's counts.

  Args:
    target: the compile-only target.
    steps: batch -> k -> `step_facts` of the target's k-token step.
    draft_steps: batch -> drafter name -> `step_facts` of its 1-token step.
    overhead_s: seconds per executed op (0: a pure roofline).
    megacore: the target's steps were compiled on one device and stand for
      a whole chip (`one_device` steps): timed with the chip's figures.
    label: what the target is (dimensions).

  Returns:
    The profile; its name says ESTIMATED, its source the compiler.
  """
  chip = target.spec
  t = {b: {k: step_seconds(f, chip, overhead_s, megacore)
           for k, f in curve.items()}
       for b, curve in steps.items()}
  t1 = t[min(t)][1]
  c = {b: {name: draft_seconds(f, chip, overhead_s) / t[b][1]
           for name, f in ds.items()}
       for b, ds in draft_steps.items() if 1 in t.get(b, {})}
  return hardware.HardwareProfile(
      name=(f'{target.name} ({ESTIMATED}; overhead '
            f'{overhead_s * 1e6:g} us per op)'),
      device=chip.name, target=label, t1_ms=t1 * 1e3,
      floor_ms=None, bandwidth=chip.hbm_bandwidth,
      launch_ms=overhead_s * 1e3,
      cost={b: {k: v / curve[1] for k, v in curve.items()}
            for b, curve in t.items()},
      c=c, source='the XLA compiler for ' + target.name, command='', date='')


GOAL = {'small': 0.10, 'base': 0.10, 'large': 0.15}


def table2(profile: hardware.HardwareProfile) -> List[Dict[str, Any]]:
  """The paper's Table 2 rows predicted on `profile` (`hardware.predict`,
  Theorem 3.8 with cost(gamma + 1)) from the paper's alpha and gamma, with
  the profile's c and with the paper's c, beside the paper's measured
  speed-up: the ratio per row; `bound_c0`, the expected tokens per
  iteration (Theorem 3.8 with c = 0 and cost 1), bounds every profile's
  prediction from the paper's alpha."""
  rows = []
  cells = [(column, temp, size, values)
           for (column, temp), row in paper_lib.TABLE2.items()
           for size, values in row.items()]
  for column, temp, size, (gamma, alpha, paper) in cells:
    ours = hardware.predict(profile, alpha=alpha, gamma=gamma, drafter=size)
    paper_c = paper_lib.TABLE4_C[size]
    with_paper_c = hardware.predict(profile, alpha=alpha, gamma=gamma,
                                    c=paper_c)
    rows.append({
        'task': {'EnDe': 'ende', 'CNNDM': 'cnndm'}[column],
        'temperature': temp, 'drafter': size, 'gamma': gamma,
        'alpha': alpha, 'c_estimated': round(ours.c, 4),
        'c_paper': paper_c, 'cost_gamma_plus_1': round(ours.cost, 3),
        'speedup_estimated': round(ours.speedup, 2),
        'speedup_with_paper_c': round(with_paper_c.speedup, 2),
        'speedup_paper_measured': paper,
        # Free drafts and a free wider call: no profile predicts more.
        'bound_c0': round(theory.expected_tokens_per_iteration(alpha, gamma),
                          2),
        'ratio': round(ours.speedup / paper, 3),
        'within_goal': abs(ours.speedup / paper - 1) <= GOAL[size]})
  return rows


def fit_overhead(target: Target, steps, draft_steps,
                 grid_us: Sequence[float] = tuple(
                     x / 10 for x in range(0, 201)),
                 megacore: bool = False) -> float:
  """The ONE per-op overhead (seconds) whose profile's Table 2 is closest to
  the paper's measured speed-ups (least squares of log ratios, on a grid)."""
  def loss(us):
    prof = estimated_profile(target, steps, draft_steps,
                             overhead_s=us * 1e-6, megacore=megacore)
    return sum(math.log(r['ratio']) ** 2 for r in table2(prof))
  return min(grid_us, key=loss) * 1e-6


def shipped_alpha_rows(profile: hardware.HardwareProfile,
                       alphas: Mapping[str, Mapping[str, float]]
                       ) -> List[Dict[str, Any]]:
  """Predicted speed-ups (`hardware.predict`, the best gamma within the
  profile's k) of our shipped drafters' measured alpha, with the c of the
  T5 1.1 size of their role ('small_fkl' -> small)."""
  rows = []
  for task, per in alphas.items():
    for name, temps in per.items():
      size = name.split('_')[0]
      if size not in profile.drafters(1):
        continue
      for temp, alpha in temps.items():
        p = hardware.predict(profile, alpha=alpha, drafter=size)
        rows.append({'task': task, 'drafter': name, 'temperature': temp,
                     'alpha': round(alpha, 3), 'c_estimated': round(p.c, 4),
                     'gamma': p.gamma, 'speedup_estimated':
                         round(p.speedup, 2)})
  return rows


def largest_batch(bytes_at: Mapping[int, int], capacity: int,
                  multiple: int = 1) -> Optional[int]:
  """The largest batch (a multiple of `multiple`) whose peak bytes fit in
  `capacity`, by the line through the two largest compiled batches (bytes
  grow linearly with the batch: caches, activations); None if none fits or
  fewer than two batches were compiled."""
  bs = sorted(bytes_at)
  if len(bs) < 2:
    return None
  b0, b1 = bs[-2], bs[-1]
  slope = (bytes_at[b1] - bytes_at[b0]) / (b1 - b0)
  base = bytes_at[b1] - slope * b1
  if base > capacity:
    return None
  if slope <= 0:
    return None
  best = int((capacity - base) // slope)
  best -= best % multiple
  return best if best >= 1 else None


# ---------------------------------------------------------------------------
# The command: python -m specdec_jax.compiled --target=tpu:v4:1x1x1 ...
# ---------------------------------------------------------------------------

DRAFTS = ('small', 'base', 'large')
FULL_KS = tuple(range(1, 17)) + (24, 32, 64)
BATCH_KS = (1, 2, 4, 8, 16)


def _ints(text: str) -> Tuple[int, ...]:
  return tuple(int(x) for x in text.split(',') if x.strip())


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
  """The command's flags (see `main`)."""
  parser = argparse.ArgumentParser(
      prog='python -m specdec_jax.compiled',
      description=__doc__.split('\n')[0])
  parser.add_argument('--target',
                      help=f'compile-only target: {", ".join(TARGETS)}')
  parser.add_argument('--reestimate', default=None,
                      help='a results json of this command: recompute its '
                      'estimates (profiles, Table 2) from the compiler '
                      'counts it holds, compiling nothing, and rewrite it')
  parser.add_argument('--model', default='t5_1_1_xxl',
                      help="the target's specdec_jax.models.config spec")
  parser.add_argument('--drafts', default=','.join(
      f't5_1_1_{d}' for d in DRAFTS),
                      help='draft model config specs, comma separated (the '
                      "first is the 't5' kinds' drafter)")
  parser.add_argument('--batches', default='1,8,32', type=_ints)
  parser.add_argument('--input_length', type=int, default=512)
  parser.add_argument('--max_decode_len', type=int, default=256)
  parser.add_argument('--gamma', type=int, default=7)
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--programs', default='all',
                      help="comma separated (program_names()), 'none', or "
                      "'all': every program at the first batch, baseline "
                      'and t5 at every batch')
  parser.add_argument('--num_partitions', type=int, default=None,
                      help="size of the 'model' axis (default: every chip)")
  parser.add_argument('--ks', default=','.join(map(str, FULL_KS)),
                      type=_ints, help='k of the target steps at batch 1 '
                      '(empty: compile the programs only)')
  parser.add_argument('--batch_ks', default=','.join(map(str, BATCH_KS)),
                      type=_ints, help='k of the target steps at the '
                      'other batches')
  parser.add_argument('--megacore_steps', action='store_true',
                      help='compile the step programs on one device (a v4 '
                      "/ v5p core) and time them with the whole chip's "
                      'figures: the megacore device a TPU VM runs (the '
                      "paper's one TPU v4)")
  parser.add_argument('--paper_table', action='store_true',
                      help="the paper's Table 2 on the estimated profile "
                      '(the paper ran on one TPU v4 chip)')
  parser.add_argument('--alphas', default='results/drafters_alpha.json',
                      help="our shipped drafters' measured alpha (a "
                      'results json with tasks/<task>/alpha)')
  parser.add_argument('--out_dir', default='results/compiled')
  parser.add_argument('--iterations', nargs='?', const='programs',
                      choices=('programs', 'reference'),
                      help='counts, GB, ESTIMATED ms per loop iteration of '
                      "--programs (program_cost), or 'reference': those "
                      'the device model was fitted to, with measured ms')
  parser.add_argument('--tree', default=None, help="the tree kinds' shape")
  args = parser.parse_args(argv)
  if args.reestimate:
    return args
  try:
    if not args.target:
      raise ValueError('--target is required; known targets: '
                       f'{", ".join(TARGETS)}')
    get_target(args.target)
    if args.programs not in ('all', 'none'):
      for name in args.programs.split(','):
        _check_program(name.strip())
  except ValueError as e:
    parser.error(str(e))
  return args


def _log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def _configs(args):
  model = models.config(args.model)
  drafts = {}
  for spec in args.drafts.split(','):
    cfg = models.config(spec.strip())
    name = spec.strip().split(',')[0].replace('t5_1_1_', '')
    drafts[name] = cfg
  return model, drafts


def run(args: argparse.Namespace, argv: Sequence[str]) -> Dict[str, Any]:
  """Everything the command reports for one target (see `main`)."""
  target = get_target(args.target)
  model, drafts = _configs(args)
  first = next(iter(drafts.values()))
  setup = Setup(target=model, draft=first, batch=args.batches[0],
                input_length=args.input_length,
                max_decode_len=args.max_decode_len, gamma=args.gamma,
                temperature=args.temperature)
  out = {
      'command': report.portable(' '.join(
          ['python -m specdec_jax.compiled'] + list(argv))),
      'date': time.strftime('%Y-%m-%d'), 'versions': aot.versions(),
      'target': dataclasses.asdict(target),
      'chip': dataclasses.asdict(target.spec),
      'label': ESTIMATED,
      'setup': {'target': report.config_dict(model),
                'drafts': {n: report.config_dict(c)
                           for n, c in drafts.items()},
                'input_length': args.input_length,
                'max_decode_len': args.max_decode_len, 'gamma': args.gamma,
                'temperature': args.temperature,
                'devices': target.devices,
                'num_partitions': args.num_partitions or target.devices},
      'programs': []}
  names = (program_names() if args.programs == 'all' else () if (
      args.programs == 'none') else tuple(
          p.strip() for p in args.programs.split(',')))
  for batch in args.batches:
    todo = names if (batch == args.batches[0] or args.programs != 'all'
                     ) else ('baseline', 't5')
    for name in todo:
      facts = compile_program(name, dataclasses.replace(setup, batch=batch),
                              target, args.num_partitions)
      facts.update(name=name, batch=batch)
      out['programs'].append(facts)
      _log(f"{facts['program']}: " + (
          f"{facts['memory']['peak_bytes'] / GIB:.2f} GiB, "
          f"{facts['compile_s']} s" if facts['compiled'] else
          facts['error'][:300]))
  out['memory'] = memory_summary(out['programs'], target, args)
  if not args.ks:  # --ks=: the programs only.
    return out
  cache_length = args.max_decode_len + max(args.ks) + 1
  steps, draft_steps = {}, {}
  for batch in args.batches:
    ks = args.ks if batch == args.batches[0] else args.batch_ks
    for k in ks:
      f = step_facts(model, target, batch=batch, tokens=k,
                     input_length=args.input_length,
                     cache_length=cache_length,
                     num_partitions=args.num_partitions,
                     one_device=args.megacore_steps)
      _log(f"{target.name} {f['program']}: {f.get('cost')}")
      if f['compiled']:
        steps.setdefault(batch, {})[k] = f
    for name, cfg in drafts.items():
      f = step_facts(cfg, target, batch=batch, tokens=1,
                     input_length=args.input_length,
                     cache_length=cache_length,
                     num_partitions=args.num_partitions, replicated=True,
                     one_device=args.megacore_steps)
      _log(f"{target.name} draft {name} {f['program']}: {f.get('cost')}")
      if f['compiled']:
        draft_steps.setdefault(batch, {})[name] = f
  out['steps'] = {str(b): {str(k): _slim(f) for k, f in curve.items()}
                  for b, curve in steps.items()}
  out['draft_steps'] = {str(b): {n: _slim(f) for n, f in ds.items()}
                        for b, ds in draft_steps.items()}
  # A batch whose 1-token step did not compile (e.g. does not fit) has no
  # t(1) to divide by: its steps stay in the results, out of the estimates.
  steps = {b: c for b, c in steps.items() if 1 in c}
  if all(f['cost'] for c in steps.values() for f in c.values()) and steps:
    try:
      out.update(estimates(target, steps, draft_steps, model, args))
    except (KeyError, ValueError, ZeroDivisionError) as e:
      out['estimates_error'] = f'{type(e).__name__}: {e}'
  return out


def _slim(f: Mapping[str, Any]) -> Dict[str, Any]:
  return {k: f[k] for k in ('compiled', 'compile_s', 'memory', 'cost',
                            'hlo', 'error') if k in f}


def memory_summary(programs, target: Target, args) -> Dict[str, Any]:
  """Per program: peak bytes per device at each compiled batch, fits
  (False also where the compiler refused the program for want of HBM),
  and the largest batch that fits (`largest_batch`, a multiple of the data
  axis, below the smallest batch the compiler refused)."""
  n = target.devices
  data = n // (args.num_partitions or n)
  out = {}
  for f in programs:
    if 'fits' not in f:
      continue
    row = out.setdefault(f['name'], {'peak_bytes': {}, 'fits': {}})
    row['fits'][str(f['batch'])] = f['fits']
    if f['compiled']:
      row['peak_bytes'][str(f['batch'])] = f['memory']['peak_bytes']
  for row in out.values():
    bytes_at = {int(b): v for b, v in row['peak_bytes'].items()}
    refused = [int(b) for b, ok in row['fits'].items() if not ok]
    best = largest_batch(bytes_at, target.spec.device_hbm_bytes, data)
    if best is not None and refused:
      best = min(best, min(refused) - data)
    row['largest_batch'] = best if best and best >= 1 else None
    row['largest_batch_how'] = (
        'linear in the batch through the two largest compiled batches'
        if len(bytes_at) > 1 else 'one batch compiled: not estimated')
  return out


def estimates(target: Target, steps, draft_steps, model, args
              ) -> Dict[str, Any]:
  """t(1), cost(k), c per batch from the compiler's counts (ESTIMATED), the
  hardware profiles (pure roofline; with the one fitted per-op overhead)
  and, with --paper_table, Table 2 on them."""
  label = (f"T5 1.1 {args.model}: emb {model.emb_dim}, "
           f"{model.num_encoder_layers}+{model.num_decoder_layers} layers, "
           f"bf16, input {args.input_length}, cache "
           f"{args.max_decode_len + max(args.ks) + 1}")
  chip = target.spec
  mega = bool(getattr(args, 'megacore_steps', False))
  out = {'per_step': {}, 'megacore_steps': mega}
  for b, curve in steps.items():
    t1 = step_seconds(curve[1], chip, whole_chip=mega)
    out['per_step'][str(b)] = {
        't1_ms': round(t1 * 1e3, 4),
        'bytes_bound_ms': round(roofline_s(
            0, curve[1]['cost']['bytes_accessed'], chip,
            whole_chip=mega) * 1e3, 4),
        'cost': {str(k): round(step_seconds(f, chip, whole_chip=mega) / t1,
                               4)
                 for k, f in curve.items()},
        'c': {n: round(draft_seconds(f, chip) / t1, 4)
              for n, f in draft_steps.get(b, {}).items()},
        'ops_per_step': curve[1]['hlo']['entry_ops'],
        'draft_ops_per_step': {n: f['hlo']['entry_ops'] for n, f in
                               draft_steps.get(b, {}).items()}}
  pure = estimated_profile(target, steps, draft_steps, label=label,
                           megacore=mega)
  out['profile'] = pure.to_json()
  if args.paper_table and not set(DRAFTS) <= set(draft_steps.get(1, {})):
    out['table2_error'] = ('--paper_table needs batch 1 and the drafters '
                           f'{", ".join(DRAFTS)} (T5 1.1 configs)')
  elif args.paper_table:
    out['table2'] = table2(pure)
    overhead = fit_overhead(target, steps, draft_steps, megacore=mega)
    fitted = estimated_profile(target, steps, draft_steps, megacore=mega,
                               overhead_s=overhead, label=label)
    out['overhead_us_per_op'] = round(overhead * 1e6, 2)
    out['profile_fitted'] = fitted.to_json()
    out['table2_fitted'] = table2(fitted)
    try:
      alphas = {task: v['alpha'] for task, v in report.read_json(
          args.alphas)['tasks'].items()}
      alphas = {t: {n: {k: x['alpha'] for k, x in temps.items()}
                    for n, temps in a.items()} for t, a in alphas.items()}
      out['shipped_alpha'] = {
          'source': args.alphas,
          'rows': shipped_alpha_rows(pure, alphas),
          'rows_fitted': shipped_alpha_rows(fitted, alphas)}
    except (OSError, KeyError, ValueError) as e:
      out['shipped_alpha'] = {'source': args.alphas, 'error': str(e)}
  return out


def markdown(r: Mapping[str, Any]) -> str:
  """The results .md of one target."""
  t, chip = r['target'], r['chip']
  versions = ', '.join(f'{k} {v}' for k, v in r['versions'].items())
  usable = (f" ({chip['usable_bytes'] / GIB:.2f} GiB usable per device, as "
            'the compiler says)' if chip.get('usable_bytes') else '')
  lines = [f"# Compiled for {t['name']} without one ({ESTIMATED})", '',
           f"Command: `{r['command']}`  ", f"Date: {r['date']}; {versions}",
           '',
           f"{t['chips']} x {chip['name']}, {chip.get('cores', 1)} "
           f"device(s) per chip: {chip['hbm_bytes'] / GIB:.1f} GiB HBM "
           f'per chip{usable}, '
           f"{chip['hbm_bandwidth'] / 1e9:.0f} GB/s, "
           f"{chip['peak_flops'] / 1e12:.0f} TFLOP/s bf16 (published). "
           f"Target {r['setup']['target']['emb_dim']}-wide "
           f"({r['setup']['target']['num_decoder_layers']} decoder layers), "
           f"drafters {', '.join(r['setup']['drafts'])}; bf16; input "
           f"{r['setup']['input_length']}, output "
           f"{r['setup']['max_decode_len']}, gamma {r['setup']['gamma']}, "
           f"temperature {r['setup']['temperature']}; 'model' axis "
           f"{r['setup']['num_partitions']}.", '',
           '## Every decode program', '',
           'Bytes per device from `memory_analysis()` (parameters + inputs, '
           'outputs, temporaries); one while loop, no host transfer: read '
           'from the compiled HLO.', '']
  rows = []
  for f in r['programs']:
    if f['compiled']:
      m = f['memory']
      rows.append([f['name'], f['batch'], f.get('gamma', '-'), 'yes',
                   f"{m['argument_bytes'] / GIB:.2f}",
                   f"{m['temp_bytes'] / GIB:.2f}",
                   f"{m['peak_bytes'] / GIB:.2f}",
                   'yes' if f['fits'] else '**no**',
                   f"{f['hlo']['entry_while_loops']} / "
                   f"{f['hlo']['host_transfers']}", f['compile_s']])
    else:
      rows.append([f['name'], f['batch'], f.get('gamma', '-'),
                   '**no**: ' + f['error'][:200].replace('|', '/'),
                   None, None, None, None, None, None])
  lines.append(report.table(
      ['program', 'batch', 'gamma', 'compiled', 'args GiB', 'temp GiB',
       'peak GiB', 'fits', 'while loops / host ops', 'compile s'], rows))
  lines += ['', 'Notes: the merged self-drafting loops (' +
            ', '.join(SELF_DRAFTING) + ') take the plain `network.T5Model` '
            'target with its sharded parameters (they refuse a '
            '`partitioning.ShardedModel`). The parameters of the kinds that '
            "draft or embed with the target ('cache', 'combined', 'pass', "
            "'heads', 'heads_tree') hold the target's parameters again: the "
            'same arrays when run, but counted again in the argument bytes '
            '(of what the program reads: e.g. the encoder for an output '
            'cache\'s embedder), so their peak bytes are an upper bound.']
  lines += ['', '## Largest batch that fits (per device)', '']
  lines.append(report.table(
      ['program', 'peak GiB per compiled batch', 'largest batch', 'how'],
      [[n, ', '.join(f'{b}: {v / GIB:.2f}' for b, v in
                     m['peak_bytes'].items()), m['largest_batch'],
        m['largest_batch_how']] for n, m in r['memory'].items()]))
  if 'per_step' in r:
    how = ('compiled on one device standing for the whole chip (the '
           "megacore device of a TPU VM), timed with the chip's figures"
           if r.get('megacore_steps') else
           "compiled on every device, timed with one device's share of the "
           "chip's figures; a replicated drafter with the whole chip's "
           '(one megacore device per chip on a TPU VM)')
    lines += ['', f'## Per step ({ESTIMATED})', '',
              "A roofline of one `T5Model.extend` call: max(flops / peak, "
              "bytes accessed / HBM bandwidth), from the compiler's "
              'counts. cost(k) = t(k) / t(1); c = drafter step / target '
              f'step. Steps {how}.', '']
    rows = []
    for b, s in r['per_step'].items():
      costs = ', '.join(f'{k}: {v:.3f}' for k, v in s['cost'].items())
      cs = ', '.join(f'{n} {v:.3f}' for n, v in s['c'].items())
      rows.append([b, s['t1_ms'], costs, cs, s['ops_per_step']])
    lines.append(report.table(['batch', 't(1) ms', 'cost(k)', 'c',
                               'ops per target step'], rows))
  for key, title in (('table2', 'pure roofline'),
                     ('table2_fitted', 'roofline + '
                      f"{r.get('overhead_us_per_op')} us per op (fitted)")):
    if key not in r:
      continue
    if key == 'table2_fitted' and not r.get('overhead_us_per_op'):
      lines += ['', '## One fitted per-op overhead', '',
                'Fitted (least squares of the log ratios over the 12 rows, '
                'grid 0-20 us per executed op): 0 us. Any overhead raises '
                'every c and lowers every estimate, and the rows are '
                'mostly below the paper already: the pure roofline stands.']
      continue
    lines += ['', f"## The paper's Table 2 on this profile: {title}", '',
              f'{ESTIMATED.capitalize()}: Theorem 3.8 with cost(gamma + 1) '
              '(`hardware.predict`), the paper\'s alpha and gamma, our '
              "c beside the paper's c (Table 4), against the paper's "
              'measured TPU v4 speed-up. Goal: within 10% (small, base), '
              '15% (large).', '']
    lines.append(report.table(
        ['task', 't', 'drafter', 'gamma', 'alpha', 'c est.', 'c paper',
         'cost(g+1)', 'est.', 'with paper c', 'bound (c = 0)',
         'paper measured', 'ratio', 'in goal'],
        [[x['task'], x['temperature'], x['drafter'], x['gamma'], x['alpha'],
          x['c_estimated'], x['c_paper'], x['cost_gamma_plus_1'],
          f"{x['speedup_estimated']}x", f"{x['speedup_with_paper_c']}x",
          f"{x.get('bound_c0', '-')}x", f"{x['speedup_paper_measured']}x",
          x['ratio'], 'yes' if x['within_goal'] else 'no']
         for x in r[key]]))
    if key == 'table2':
      lines += ['', "'bound (c = 0)': the expected tokens per iteration, "
                'Theorem 3.8 with free drafts and cost(gamma + 1) = 1: no '
                "hardware profile predicts more from the paper's alpha and "
                'gamma; where the paper measured more, the i.i.d. '
                'acceptance of Theorem 3.8 underestimates it.']
  if 'shipped_alpha' in r and 'rows' in r['shipped_alpha']:
    lines += ['', "## Our shipped drafters' measured alpha on this profile",
              '', f"alpha from `{r['shipped_alpha']['source']}`; c of the "
              'T5 1.1 size of the role; best gamma. '
              f'{ESTIMATED.capitalize()}.', '']
    key = lambda x: (x['task'], x['drafter'], x['temperature'])
    fitted = {key(x): x for x in r['shipped_alpha']['rows_fitted']}
    columns = ['task', 'drafter', 't', 'alpha', 'c est.', 'gamma',
               'estimated']
    if r.get('overhead_us_per_op'):
      columns += ['gamma / est. (fitted overhead)']
    rows = []
    for x in r['shipped_alpha']['rows']:
      row = [x['task'], x['drafter'], x['temperature'], x['alpha'],
             x['c_estimated'], x['gamma'], f"{x['speedup_estimated']}x"]
      if r.get('overhead_us_per_op'):
        y = fitted[key(x)]
        row.append(f"{y['gamma']} / {y['speedup_estimated']}x")
      rows.append(row)
    lines.append(report.table(columns, rows))
  return '\n'.join(lines) + '\n'


def reestimate(path: str):
  """Recomputes a results json's verdicts and estimates (fits, largest
  batch, profiles, Table 2) from the compiler's counts it holds (with its
  own command's flags and this module's chip figures), compiling nothing,
  and rewrites its .json and .md."""
  r = report.read_json(path)
  args = parse_flags(shlex.split(r['command'])[3:])
  target = get_target(args.target)
  steps = {int(b): {int(k): f for k, f in curve.items()}
           for b, curve in r.get('steps', {}).items() if '1' in curve}
  draft_steps = {int(b): ds for b, ds in r.get('draft_steps', {}).items()}
  model, _ = _configs(args)
  r['chip'] = dataclasses.asdict(target.spec)
  r['reestimated_by'] = report.portable(
      f'python -m specdec_jax.compiled --reestimate={path}')
  for f in r['programs']:
    if f['compiled']:
      f['fits'] = f['memory']['peak_bytes'] <= target.spec.device_hbm_bytes
  r['memory'] = memory_summary(r['programs'], target, args)
  if steps:
    r.update(estimates(target, steps, draft_steps, model, args))
  out = report.write_json(path, r)
  report.write_md(out.with_suffix('.md'), markdown(r))
  return out


def iterations(args: argparse.Namespace) -> str:
  """`--iterations`: `program_cost.report_iterations` of the programs."""
  from specdec_jax import program_cost  # pylint: disable=g-import-not-at-top
  target, (model, drafts) = get_target(args.target), _configs(args)
  base = Setup(target=model, draft=next(iter(drafts.values())),
               batch=args.batches[0], input_length=args.input_length,
               max_decode_len=args.max_decode_len, gamma=args.gamma,
               temperature=args.temperature, tree=args.tree)

  def lower(name, model=None, draft=None, **fields):
    fields.update({k: models.config(v) for k, v in (
        ('target', model), ('draft', draft)) if v}, **(
            {} if 'tree' in name else {'tree': None}))
    return lower_program(name, dataclasses.replace(base, **fields),
                         partitioner(target, args.num_partitions))[0]
  names = None if args.iterations == 'reference' else program_names() if (
      args.programs == 'all') else [p.strip() for p in args.programs.split(',')]
  try:
    return program_cost.report_iterations(lower, target.platform, names,
                                          target.spec.name)
  except BackendMissing as e:
    raise SystemExit(str(e)) from e


def main(argv: Optional[Sequence[str]] = None) -> None:
  """`python -m specdec_jax.compiled --target=tpu:v4:1x1x1 [flags]`: writes
  OUT_DIR/<target>.json and .md (every program, memory per chip, per-step
  estimates; with --paper_table the paper's Table 2 on them)."""
  logging.getLogger().setLevel(logging.ERROR)  # Untrained drafter warnings.
  os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_flags(argv)
  if args.reestimate:
    print(reestimate(args.reestimate))
    return
  if args.iterations:
    print(iterations(args))
    return
  result = run(args, argv)
  stem = args.target.replace(':', '_') + (
      '_megacore' if args.megacore_steps else '')
  path = report.write_json(f'{args.out_dir}/{stem}.json', result)
  report.write_md(path.with_suffix('.md'), markdown(result))
  print(path)


if __name__ == '__main__':
  main()
