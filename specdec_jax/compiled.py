r"""Every decode program compiled for a TPU or GPU this machine does not have.

XLA compiles for *compile-only* devices: libtpu (`pip install
"jax[tpu]==<jax version>"`) describes any Cloud TPU slice and the CUDA plugin
any GPU, without the chips (`jax.experimental.topologies`). The decode
programs are compiled from model configs alone: the parameters are
`jax.eval_shape` of the init, placed by T5X's partitioning rules as the eval
job places them (`partitioning.Partitioner`), so no weight is read. Per
program the compiler says: compiled or its error; bytes per device
(`memory_analysis()`) against what a device may use; flops and bytes
accessed per call (`cost_analysis()`; the CUDA compiler reports none); the
HLO's while loops, host transfers and collectives. It counts a while loop's
body once: per-step figures come from step programs (`T5Model.extend`).

  facts = compiled.compile_program('t5', compiled.Setup(  # speculative, t5
      target=models.config('t5_1_1_xxl'), draft=models.config('t5_1_1_small'),
      batch=8), compiled.get_target('tpu:v4:2x2x1'))  # ['memory'], ['fits']

Programs (`program_names()`): 'baseline', one per drafter kind of
`drafters.KINDS` (the chain loop, or the kind's merged or tree loop),
'stream_baseline' and 'stream:<kind>' (`streaming`); and 'widen', the
drafter's config widened to the target's straight into its shardings
(`widening.into`: what a device holds of an XXL-cost target). A TPU v4
chip's two TensorCores are two compile-only devices (a TPU VM runs them as
one), so a program spans both ('model' axis) and is held against one
core's HBM.

`python -m specdec_jax.compiled --target=<target> [flags]` prints each
program's bytes per device and fit; `--iterations`, the per-iteration cost
model (`program_cost`). The estimates built on these counts (roofline,
hardware profile, Table 2) are in `specdec_jax.estimates`; docs/tpu.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import json
import logging
import math
import os
import pathlib
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specdec_jax import checks
from specdec_jax import drafters
from specdec_jax import interfaces
from specdec_jax import kernels
from specdec_jax import loading
from specdec_jax import models
from specdec_jax import network
from specdec_jax import output_cache
from specdec_jax import partitioning
from specdec_jax import program_cost
from specdec_jax import programs
from specdec_jax import speculative
from specdec_jax import widening
from specdec_jax.bench import report
from specdec_jax.sampling import SamplingConfig

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's published figures.

  Attributes:
    name: e.g. 'TPU v4'.
    peak_flops: dense bfloat16 flops / s per chip.
    hbm_bandwidth: HBM bytes / s per chip.
    hbm_bytes: HBM per chip.
    cores: devices per chip in a compile-only topology: 2 for a TPU v4
      chip's TensorCores (15.25 GiB usable of a core's 16); 1 elsewhere.
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
  """XLA's GpuTargetConfigProto text of a GPU in `CHIPS` (memory, bandwidth,
  name) for a CUDA version, runtime and driver (XLA captures cuBLAS / cuDNN
  calls only on a driver >= 12.3): what a compile-only GPU compiles for."""
  spec = CHIPS[chip]
  return _CHIP_DATA['gpu_target_config'].format(
      bandwidth=int(spec.hbm_bandwidth), memory=spec.hbm_bytes,
      cuda=cuda[0], cuda_minor=cuda[1], name=spec.name)


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
    _tpu('v6e', '2x4'), Target('gpu:h100', 'gpu', 'h100', '1x1x1', 1),
    Target('gpu:h100x8', 'gpu', 'h100', '1x1x8', 8),
    Target('gpu:h200', 'gpu', 'h200', '1x1x1', 1),
)}


def get_target(name: str) -> Target:
  """The target `name`; InputError listing the known ones."""
  if name not in TARGETS:
    raise checks.InputError(f'unknown compile-only target {name!r}; known '
                            f'targets: {", ".join(TARGETS)}')
  return TARGETS[name]


class BackendMissing(RuntimeError):
  """The compiler plugin of a target is not installed (named, with the fix)."""


@functools.lru_cache(maxsize=None)
def devices(name: str, target_config: Optional[str] = None
            ) -> Tuple[Any, ...]:
  """The compile-only devices of target `name` (`Chip.cores` per chip).

  A GPU target compiles for `gpu_target_config` of its chip, or for
  `target_config` (a `GpuTargetConfigProto` in text form) when given.

  Raises:
    ValueError: an unknown target.
    BackendMissing: libtpu / the CUDA plugin is not installed.
  """
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  target = get_target(name)
  # Compile-only use owns no chip: any process may load libtpu (no lock
  # file); the CUDA plugin skips its driver check (else it stays
  # unregistered; jax reads it at its backends' start: `main` sets it first).
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  config = None if target.platform == 'tpu' else (
      target_config or default_target_config(name))
  try:
    if config is None:
      kw = ({'chips_per_host_bounds': (1, 1, 1)} if target.chips == 1 else {})
      topo = topologies.get_topology_desc(
          platform='tpu', topology_name=target.topology, **kw)
    else:
      topo = topologies.get_topology_desc(
          'compile-only', 'cuda', target_config=config,
          topology=target.topology)
  except Exception as e:  # pylint: disable=broad-except
    package = ('"jax[tpu]==%s"' if target.platform == 'tpu' else
               '"jax[cuda13]==%s"') % jax.__version__
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
      'no CUDA plugin: to compile for a GPU without one, pip install '
      '--target=<folder> "jax-cuda13-plugin[with-cuda]==%s" (or cuda12) '
      'and put PYTHONPATH=<folder> before the command (docs/tpu.md)'
      % jax.__version__)


def partitioner(target: Target, num_partitions: Optional[int] = None,
                one_device: bool = False) -> partitioning.Partitioner:
  """T5X's partitioner on the target's devices (default: all
  model-parallel, the T5X choice for decoding a model that one chip cannot
  hold); `one_device`: the first device alone."""
  devs = list(devices(target.name))[:1 if one_device else None]
  n = len(devs) if num_partitions is None or one_device else num_partitions
  return partitioning.Partitioner(num_partitions=n, devices=devs)


# --- Abstract arguments. ---------------------------------------------------


def abstract(tree, shardings):
  """`jax.ShapeDtypeStruct`s of `tree`'s leaves carrying `shardings`."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, shardings)


def abstract_params(model, part: partitioning.Partitioner, dtype: Any = None):
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
  shapes = lambda t: [tuple(x.shape) for x in jax.tree.leaves(t)]
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


# --- Programs. -------------------------------------------------------------


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

  def __post_init__(self):  # the flags' values, refused before compiling
    checks.check_ints(batch=self.batch, input_length=self.input_length,
                      max_decode_len=self.max_decode_len, gamma=self.gamma)
    if self.tree is not None:
      drafters.tree.shape.parse(self.tree)
    SamplingConfig(self.temperature, self.topk, self.topp)  # its checks

  @property
  def sampling(self) -> SamplingConfig:
    return SamplingConfig(self.temperature, self.topk, self.topp)


def program_names() -> Tuple[str, ...]:
  """Every decode program: the baselines, each kind, the streaming loops."""
  return (('baseline',) + tuple(drafters.KINDS) +
          ('stream_baseline', 'stream:t5'))


def _check_program(name: str) -> None:
  kind = name.split(':', 1)[1] if name.startswith('stream:') else name
  if name not in ('baseline', 'stream_baseline', 'widen') and (
      kind not in drafters.KINDS):
    raise ValueError(f'unknown program {name!r}; programs: baseline, '
                     f'stream_baseline, a drafter kind '
                     f'({", ".join(drafters.KINDS)}), stream:<kind> or widen')


def _models(setup: Setup, part):
  return (part.sharded_model(network.T5Model(setup.target)),
          part.sharded_model(network.T5Model(setup.draft),
                             partitioning.data_parallel_rules()))


def tokens(part, rows: int, length: int):
  """Abstract int32 tokens [rows, length], the batch over 'data'."""
  return jax.ShapeDtypeStruct(
      (rows, length), jnp.int32,
      sharding=partitioning.batch_sharding(part.mesh, part.rules))


def _rng(part):
  return _replicated(part, jax.eval_shape(lambda: jax.random.key(0)))


def lower_program(name: str, setup: Setup, part) -> Tuple[
    jax.stages.Lowered, Dict[str, Any]]:
  """(the lowered program `name`, what it was lowered with: gamma used),
  lowered as for the mesh's GPU (`kernels.abstract_gpu`).

  Raises:
    ValueError: an unknown program, or a bad argument the decoder names.
  """
  _check_program(name)
  with kernels.abstract_gpu(part.mesh.devices.flat[0]):
    return _lower(name, setup, part)


def _lower(name: str, setup: Setup, part):
  target, draft = _models(setup, part)
  if name == 'widen':  # the draft's config widened into the target's
    key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    return widening.into(part.param_shardings(target)).lower(  # shardings,
        abstract_params(draft, part, setup.param_dtype), key,  # as a job's
        jax.ShapeDtypeStruct((), jnp.float32),  # (no noise: `load_target`)
        *widening.statics(setup.draft, setup.target, 0.0)), {}
  params = abstract_params(target, part, setup.param_dtype)
  stream = name.startswith('stream')
  inputs = tokens(part, 2 * setup.batch if stream else setup.batch,
                   setup.input_length)
  spec = programs.ProgramSpec(
      'baseline', 'stream' if stream else 'fixed',
      max_decode_len=setup.max_decode_len, sampling=setup.sampling, eos_id=1,
      batch_size=setup.batch if stream else 0)
  if name in ('baseline', 'stream_baseline'):
    return programs.Program(spec, target).lower(params, inputs, _rng(part)), {}
  kind = name.split(':', 1)[1] if name.startswith('stream:') else name
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


# --- What the compiler says. -----------------------------------------------


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
  cost = program_cost.cost_analysis(compiled)
  return {k: float(cost[key]) for k, key in (
      ('flops', 'flops'), ('bytes_accessed', 'bytes accessed'))
          if key in cost}


def compile_lowered(lowered, target: Target, what: str) -> Dict[str, Any]:
  """Compile facts of one lowered program (the compiler's error, named).
  jax's caches are the caller's: a command compiling program after program
  clears them after each (`main`)."""
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
         'hlo': program_cost.hlo_facts(compiled.as_text())}
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


# --- The command. -----------------------------------------------------------

DRAFTS = ('small', 'base', 'large')  # T5 1.1 sizes: --drafts' default
PROGRAM_COLUMNS = ['program', 'batch', 'gamma', 'compiled', 'args GiB',
                   'temp GiB', 'peak GiB', 'fits', 'while loops / host ops',
                   'compile s']


def add_flags(parser: argparse.ArgumentParser) -> None:
  """The flags of what a command compiles (`setup`, `plan`)."""
  parser.add_argument('--target',
                      help=f'compile-only target: {", ".join(TARGETS)}')
  parser.add_argument('--model', default='t5_1_1_xxl',
                      help="the target's specdec_jax.models.config spec")
  parser.add_argument('--drafts', default=','.join(
      f't5_1_1_{d}' for d in DRAFTS),
                      help="draft model config specs, comma separated, a "
                      "spec's FIELD=VALUEs with it (the first: the drafter)")
  parser.add_argument('--batches', default='1,8,32', type=checks.counts)
  parser.add_argument('--input_length', type=int, default=512)
  parser.add_argument('--max_decode_len', type=int, default=256)
  parser.add_argument('--gamma', type=int, default=7)
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--programs', default='all',
                      help="comma separated (program_names(), 'widen'), "
                      "'none', or 'all': every program at the first batch, "
                      'baseline and t5 at every batch')
  parser.add_argument('--num_partitions', type=checks.count, default=None,
                      help="size of the 'model' axis (default: every chip)")
  parser.add_argument('--tree', default=None, help="the tree kinds' shape")
  parser.add_argument('--model_fields', action='append', default=[],
                      help='FIELD=VALUE of every model\'s T5Config, e.g. '
                      'attention_kernel=cudnn')


def check_flags(parser: argparse.ArgumentParser,
                args: argparse.Namespace) -> argparse.Namespace:
  """`args`, with a known --target, a --num_partitions that divides its
  devices, models no T5 refuses, known --programs (else the parser's error
  naming the flag; the targets or programs listed)."""
  try:
    if not args.target:
      raise ValueError('--target is required; known targets: '
                       f'{", ".join(TARGETS)}')
    target = get_target(args.target)
    if args.num_partitions and target.devices % args.num_partitions:
      raise ValueError(f'--num_partitions={args.num_partitions} does not '
                       f'divide the {target.devices} devices of {target.name}')
    if not args.batches:
      raise ValueError('--batches names no batch')
    dataclasses.replace(setup(args), batch=min(args.batches))  # its values
    if args.programs not in ('all', 'none'):
      for name in args.programs.split(','):
        _check_program(name.strip())
  except ValueError as e:
    parser.error(str(e))
  return args


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
  """The command's flags (see `main`)."""
  parser = argparse.ArgumentParser(prog='python -m specdec_jax.compiled',
                                   description=__doc__.split('\n')[0])
  add_flags(parser)
  parser.add_argument('--iterations', nargs='?', const='programs',
                      choices=('programs', 'reference'), help='counts, GB, '
                      'ESTIMATED ms per loop iteration of --programs '
                      "(program_cost), or 'reference': those its (else the "
                      "H100's) model was fitted to, with the measured ms")
  parser.add_argument('--captured_us', type=checks.non_negative, help=(
      'with --iterations: ESTIMATES at this cost of a captured kernel (us)'))
  parser.add_argument('--xla_option', action='append', default=[], type=(
      models.assignment), help='with --iterations: KEY=VALUE, an XLA option, '
                      "e.g. xla_gpu_enable_triton_gemm=True (XLA's GEMMs)")
  args = parser.parse_args(argv)
  if not args.iterations and (args.captured_us is not None or args.xla_option):
    parser.error('--captured_us and --xla_option are options of --iterations')
  return check_flags(parser, args)


def configs(args: argparse.Namespace
            ) -> Tuple[network.T5Config, Dict[str, network.T5Config]]:
  """(the target's config, {drafter name: config}) of --model, --drafts."""
  drafts = {s.replace('t5_1_1_', ''): _config(s, args, '--drafts')
            for s in models.specs(args.drafts)}
  return _config(args.model, args, '--model'), drafts


def _config(spec: str, args: argparse.Namespace,
            flag: str) -> network.T5Config:
  return models.with_fields(models.config(spec, flag), args.model_fields,
                            '--model_fields')


def setup(args: argparse.Namespace) -> Setup:
  """The `Setup` of the flags at the first batch (the first drafter's)."""
  model, drafts = configs(args)
  if not drafts:  # the programs are compiled for a target and a drafter
    raise ValueError('--drafts names no model')
  return Setup(target=model, draft=next(iter(drafts.values())),
               batch=args.batches[0], input_length=args.input_length,
               max_decode_len=args.max_decode_len, gamma=args.gamma,
               temperature=args.temperature, tree=args.tree)


def plan(args: argparse.Namespace) -> List[Tuple[int, str]]:
  """(batch, program) of every program --programs names at each batch."""
  names = (program_names() if args.programs == 'all' else () if (
      args.programs == 'none') else tuple(
          p.strip() for p in args.programs.split(',')))
  return [(batch, name) for batch in args.batches for name in (
      names if batch == args.batches[0] or args.programs != 'all' else
      ('baseline', 't5'))]


def program_row(f: Mapping[str, Any]) -> List[Any]:
  """One program's facts (named, with its batch) as a `PROGRAM_COLUMNS`
  row: bytes per device, fits, the HLO's loops, or the compiler's error."""
  if not f['compiled']:
    return [f['name'], f['batch'], f.get('gamma', '-'),
            '**no**: ' + f['error'][:200].replace('|', '/')] + [None] * 6
  m = f['memory']
  return [f['name'], f['batch'], f.get('gamma', '-'), 'yes',
          f"{m['argument_bytes'] / GIB:.2f}", f"{m['temp_bytes'] / GIB:.2f}",
          f"{m['peak_bytes'] / GIB:.2f}", 'yes' if f['fits'] else '**no**',
          f"{f['hlo']['entry_while_loops']} / "
          f"{f['hlo']['host_transfers']}", f['compile_s']]


def iterations(args: argparse.Namespace) -> str:
  """`--iterations`: `program_cost.report_iterations` of the programs."""
  target, base = get_target(args.target), setup(args)
  program_cost.check_options(devices(target.name)[0], target.platform,
                             dict(args.xla_option))  # before the long ones

  def lower(name, model=None, draft=None, **fields):
    fields.update({k: _config(v, args, f'the {k} of {name}') for k, v in (
        ('target', model), ('draft', draft)) if v}, **(
            {} if 'tree' in name else {'tree': None}))
    return lower_program(name, dataclasses.replace(base, **fields),
                         partitioner(target, args.num_partitions))[0]
  names = None if args.iterations == 'reference' else program_names() if (
      args.programs == 'all') else [p.strip() for p in args.programs.split(',')]
  return program_cost.report_iterations(
      lower, target.platform, names, target.spec.name, args.captured_us,
      dict(args.xla_option))


def main(argv: Optional[Sequence[str]] = None) -> None:
  """`python -m specdec_jax.compiled --target=tpu:v4:2x2x1 [flags]`: prints
  every program of `plan` compiled for the target (`PROGRAM_COLUMNS`: bytes
  per device against what a device may use); with --iterations the
  per-iteration cost model of the programs instead."""
  os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  args = parse_flags(sys.argv[1:] if argv is None else list(argv))
  rows = []
  table = lambda: report.table(PROGRAM_COLUMNS, rows)
  with checks.one_line(BackendMissing), checks.root_logger_at(
      logging.ERROR), ends_on_ctrl_c(lambda: (
      f'{table()}\n' if rows else '') + 'stopped by SIGINT'):
    if args.iterations:
      return print(iterations(args))
    target, base = get_target(args.target), setup(args)
    print(f'{target.name}: {target.chips} x {target.spec.name}, '
          f'{target.spec.device_hbm_bytes / GIB:.2f} GiB per device')
    for batch, name in plan(args):
      facts = compile_program(name, dataclasses.replace(base, batch=batch),
                              target, args.num_partitions)
      rows.append(program_row(dict(facts, name=name, batch=batch)))
      jax.clear_caches()  # never run; an XXL loop's program holds GBs
    print(table())


@contextlib.contextmanager
def ends_on_ctrl_c(said: Callable[[], str]):
  """Ctrl-C ends a command with `said()` (what finished) and SIGINT's exit
  status, which `checks.run_main` leaves at once (no traceback)."""
  try:
    yield
  except KeyboardInterrupt:
    print(said(), flush=True)
    raise SystemExit(checks.SIGNAL_EXITS[0]) from None


if __name__ == '__main__':
  checks.run_main(main)
