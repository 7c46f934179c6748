"""A setup's decode programs: each of the four entry points, written once.

A program is one of four decoders, (baseline | speculative) x (fixed
batches | stream), with its static settings: a `ProgramSpec`, the
program's identity. `Program` binds a spec to the target (and the drafter)
and runs it as a function of its dynamic arguments, `(params,
[draft_params,] inputs, rng)`; `Program.lower` lowers the same call (arrays
or `jax.ShapeDtypeStruct`s) without running it.

  spec = ProgramSpec('speculative', 'fixed', max_decode_len=64, gamma=4)
  result = Program(spec, target, drafter)(params, draft_params, inputs, rng)

The eval job's unit loop (`unit_loop.decode_units`, through `calls`) and the
compile-only targets (`compiled.lower_program`) build their programs here.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any, Callable, Dict, Optional, Tuple

import jax

from specdec_jax import decoding
from specdec_jax import spec_stats
from specdec_jax import speculative
from specdec_jax import streaming
from specdec_jax.sampling import SamplingConfig

KINDS = ('baseline', 'speculative')
MODES = ('fixed', 'stream')


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
  """Which decoder, with its static settings: a program's identity.

  Attributes:
    kind: 'baseline' (the target alone) or 'speculative'.
    mode: 'fixed' (a batch decoded to its end: `decoding.temperature_sample`
      / `speculative.speculative_sample`) or 'stream' (`batch_size` slots,
      an ended row refilled with the next example: `streaming.sample_stream`
      / `streaming.speculative_stream`).
    max_decode_len: output length.
    sampling: greedy / temperature / top-k / top-p.
    eos_id: end-of-sequence id (-1: none).
    gamma: tokens drafted an iteration (speculative only; >= 1).
    block_size: tokens per target call of a fixed baseline: 1, or gamma + 1
      for the speculative verification's shapes (`EvalSetup
      .same_shape_baseline`).
    batch_size: a stream's slots (stream only; a fixed program's batch is
      its inputs' rows).
    refill_sizes: a stream's refill sub-batch sizes (None: the decoder's).
  """

  kind: str
  mode: str
  max_decode_len: int
  sampling: SamplingConfig = SamplingConfig()
  eos_id: int = 1
  gamma: int = 0
  block_size: int = 1
  batch_size: int = 0
  refill_sizes: Optional[Tuple[int, ...]] = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f'kind must be one of {KINDS}, got {self.kind!r}.')
    if self.mode not in MODES:
      raise ValueError(f'mode must be one of {MODES}, got {self.mode!r}.')
    if self.kind == 'speculative' and self.gamma < 1:
      raise ValueError(f'a speculative program drafts gamma >= 1 tokens, '
                       f'got gamma={self.gamma} (no speculation: run the '
                       'baseline, `calls` with no speculative program).')


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
  """A `ProgramSpec` bound to its models: call it, or lower it.

  Attributes:
    spec: the program.
    target: the target, an `interfaces.DecodingModel`.
    drafter: an `interfaces.Drafter` (speculative programs only).
  """

  spec: ProgramSpec
  target: Any
  drafter: Any = None

  @property
  def decoder(self):
    """The decoder the program runs (a `scaffold.decoder`)."""
    s = self.spec
    if s.kind == 'baseline':
      return (streaming.sample_stream if s.mode == 'stream' else
              decoding.temperature_sample)
    return (streaming.speculative_stream if s.mode == 'stream' else
            speculative.speculative_sample)

  @property
  def __name__(self) -> str:
    """The decoder's name: a program jitted whole (`jax.jit(program)`) is
    named after it."""
    return self.decoder.__name__

  def _bound(self, args) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """(positional arguments, keyword arguments) of the decoder on `args`."""
    s = self.spec
    n = 2 if s.kind == 'baseline' else 3
    if len(args) != n + 1:
      names = ('params, inputs, rng' if n == 2 else
               'params, draft_params, inputs, rng')
      raise TypeError(f'a {s.kind} program takes ({names}), got '
                      f'{len(args)} arguments.')
    *params, inputs, rng = args
    kwargs = dict(max_decode_len=s.max_decode_len, sampling=s.sampling,
                  eos_id=s.eos_id, rng=rng)
    if s.mode == 'stream':
      kwargs.update(batch_size=s.batch_size, refill_sizes=s.refill_sizes)
    if s.kind == 'baseline':
      if s.mode == 'fixed':
        kwargs['block_size'] = s.block_size
      return (self.target, *params, inputs), kwargs
    return ((self.target, params[0], self.drafter, params[1], inputs),
            dict(gamma=s.gamma, **kwargs))

  def __call__(self, *args):
    """Runs the program on `(params, [draft_params,] inputs, rng)`.

    Returns:
      The decoder's result (`decoding.DecodeResult`,
      `spec_stats.SpecResult` or the stream's).
    """
    positional, kwargs = self._bound(args)
    return self.decoder(*positional, **kwargs)

  def lower(self, *args) -> jax.stages.Lowered:
    """The program on `(params, [draft_params,] inputs, rng)`, lowered."""
    positional, kwargs = self._bound(args)
    return self.decoder.lower(*positional, **kwargs)

  def identity(self, *args) -> str:
    """The program's fingerprint on `(params, [draft_params,] inputs,
    rng)`: what a provider of stored programs is asked for
    (`scaffold.programs_from`)."""
    positional, kwargs = self._bound(args)
    return self.decoder.identity(*positional, **kwargs)


def baseline_as_speculative(result) -> spec_stats.SpecResult:
  """A baseline decode as the result of a speculative one that drafted
  nothing: one target call per token, no drafts (no speculation, gamma 0)."""
  lengths = jax.numpy.asarray(result.lengths, jax.numpy.int32)
  stats = spec_stats.SpecStats.zeros(lengths.shape[0], 1).replace(
      iterations=jax.numpy.max(lengths), row_iterations=lengths)
  return spec_stats.SpecResult(result.tokens, result.lengths, stats)


def calls(baseline: Program, spec: Optional[Program], params, draft_params,
          inputs, rng) -> Dict[str, Callable[[], Any]]:
  """A unit's two decodes on the same inputs and rng, as calls of nothing
  (what `measure.time_alternating` times).

  Args:
    baseline: the baseline program.
    spec: the speculative program, or None for no speculation (gamma 0):
      the baseline both ways, its result as a speculative one that drafted
      nothing (`baseline_as_speculative`).
    params: the target's parameters.
    draft_params: the drafter's (unused without `spec`).
    inputs: the unit's inputs.
    rng: the unit's PRNG key.

  Returns:
    {'baseline': call, 'speculative': call}.
  """
  base = lambda: baseline(params, inputs, rng)
  if spec is None:
    return {'baseline': base,
            'speculative': lambda: baseline_as_speculative(base())}
  return {'baseline': base,
          'speculative': lambda: spec(params, draft_params, inputs, rng)}


# Every program a process keeps holds its machine code in memory mappings:
# on CPU ~150 per tiny decode loop with jax 0.10.2 and ~545 with jax 0.11 and
# later (their fusion emitters); the table2 spec's first group of cells on
# the shipped models (18 decode loops) leaves ~13,400 with jax 0.12. Linux
# allows a process `vm.max_map_count` (65,530 by default), and a process
# past it segfaults in XLA's next compile. Releasing past half of it leaves
# the other half for the next piece of work's programs.
CROWDED_SHARE = 0.5


def _read(path: str) -> Optional[bytes]:
  try:
    with open(path, 'rb') as f:
      return f.read()
  except OSError:  # not Linux
    return None


def release_if_crowded(share: float = CROWDED_SHARE) -> bool:
  """Drops the programs jax keeps compiled (`jax.clear_caches()`) when this
  process holds more than `share` of the memory mappings the OS allows one;
  a program needed again is compiled again. Call it between pieces of work
  that compile many programs (a sweep's groups of cells), never inside a
  timed region (counting reads /proc/self/maps: ~16 ms at 20,000
  mappings).

  Returns:
    Whether it released them (False off Linux).
  """
  held = _read('/proc/self/maps')
  allowed = _read('/proc/sys/vm/max_map_count')
  if held is None or not allowed:
    return False
  if held.count(b'\n') <= share * int(allowed):
    return False
  jax.clear_caches()
  gc.collect()  # the executables' last references may sit in cycles
  return True
