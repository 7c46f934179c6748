"""One entry scaffold for every decoding loop: prepare, run, lower.

A loop (the baseline `decoding.SampleLoop`, `speculative.SpecLoop`, a
drafter's `speculative.MergedLoop`, the streaming loops) is a frozen,
hashable dataclass whose `__call__(*args)` runs the whole decode in one
`lax.while_loop`. A decode function is written as its *prepare* body:
validate the arguments (named errors before anything is traced), build the
loop, return `(loop, args)`. `decoder` turns that body into the public
function:

    @scaffold.decoder
    def temperature_sample(model, params, inputs, *, max_decode_len, ...):
      '''Docstring of the decode (what the call returns).'''
      ...checks...
      return SampleLoop(...), (params, inputs, rng, max_steps)

    temperature_sample(...)          # compiled once per loop and shapes, run
    temperature_sample.lower(...)    # `jax.stages.Lowered`, not run
    temperature_sample.prepare(...)  # `(loop, args)`, e.g. to wrap the loop

So a new loop writes its body and its prepare; the compiled entry, the
ahead-of-time lowering and the cache of compiled programs are shared, and
so is the weights' layout: `run` lays out every T5 params tree among the
loop's arguments for decoding (`network.decoding_layout`) before the loop
starts, once per call, so no loop body joins or converts a weight.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import jax
import numpy as np

from specdec_jax import kernels
from specdec_jax import network


def _call(loop, *args):
  return loop(*network.decoding_layout(args))


def _traced(args) -> bool:
  """Whether `args` are being traced by an outer transformation (a decode
  called inside the caller's own `jax.jit`)."""
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args))


# Gives a program's executable from its trace, `fingerprint`, a function
# lowering it for another device and its name: see `programs_from`.
Provider = Callable[[jax.stages.Traced, str, Callable[[Any], Any], str],
                    jax.stages.Compiled]
_PROVIDER: Dict[str, Optional[Provider]] = {'now': None}


@contextlib.contextmanager
def programs_from(provider: Provider) -> Iterator[None]:
  """Within the block, each program `run` (every decode loop, and the
  timing loops built on `ProvidedJit`) needs is taken from `provider`
  instead of jax's own compile.

  `provider(traced, fingerprint, lower_on, name)` returns the executable of a
  traced program (`jax.stages.Traced`: `.lower().compile()` compiles it
  here): e.g. one deserialized from a store of programs compiled ahead of
  time for this device, found by `fingerprint`. `lower_on(device)` lowers
  the same program for another device (its arguments as shape structs
  placed there): what a build for a compile-only twin compiles. `name`
  says what the program is: its function's name, and its static
  arguments' types but numbers' and strings' (`_call[TreeLoop]`: a decode
  loop of token trees). It is asked once per program and
  argument signature; the executable is kept and called with the
  program's dynamic arguments. A decode traced inside a caller's own jit
  is part of the caller's program and asks nothing.
  """
  before, _PROVIDER['now'] = _PROVIDER['now'], provider
  try:
    yield
  finally:
    _PROVIDER['now'] = before


def providing() -> bool:
  """Whether programs now come from a provider (`programs_from`): then a
  program may be called on shape structs (a build recording what runs)."""
  return _PROVIDER['now'] is not None


def fingerprint(traced: jax.stages.Traced) -> str:
  """A traced program's identity across processes and machines: the
  sha256 of its jaxpr (the computation and its argument types, not where
  the arguments live: the same for a program traced on a device's arrays
  and on shape structs of a compile-only device), its arguments' and
  results' pytree structures and its constants (`identity` gives it). A
  store's executable found by it is that program, whatever else changed in
  the code. Programs compile with XLA's default options (a build for
  another device records its own XLA flags beside its executables)."""
  digest = hashlib.sha256(str(traced.jaxpr).encode())
  # The pytrees it takes and gives (a result's type and fields), which the
  # jaxpr's flat values do not show.
  digest.update(str(jax.tree.structure((traced.args_info,
                                        traced.out_info))).encode())
  for const in traced.jaxpr.consts:
    value = np.asarray(const)
    digest.update(f'{value.dtype}{value.shape}'.encode() + value.tobytes())
  return 'sha256:' + digest.hexdigest()


def _aval(x):
  """An argument's abstract value (a shape struct is its own)."""
  return x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)


def _signature(x) -> Tuple[Any, ...]:
  """What an executable's argument is compiled for: shape, dtype, weak
  type, and an array's sharding."""
  aval = _aval(x)
  return (aval.shape, str(aval.dtype), aval.weak_type,
          x.sharding if isinstance(x, jax.Array) else None)


class ProvidedJit:
  """`jax.jit(fun, static_argnums)` whose executables a provider gives
  within `programs_from` (a call inside an outer trace is part of the
  caller's program and asks nothing)."""

  def __init__(self, fun: Callable[..., Any], static_argnums=()):
    self.static_argnums = static_argnums
    self.jitted = jax.jit(fun, static_argnums=static_argnums)
    self._provided: Dict[Tuple[Any, ...], jax.stages.Compiled] = {}

  def entry(self, args):
    """What runs calls on `args` (arrays or shape structs; a timing loop
    picks it once, outside the timed calls): the jitted function, or
    within `programs_from` the provider's programs."""
    if _PROVIDER['now'] is None or _traced(args):
      return self.jitted
    return self._provided_call

  def __call__(self, *args):
    return self.entry(args)(*args)

  def _provided_call(self, *args):
    """A call through the provider's executable of its program."""
    provider = _PROVIDER['now']
    if provider is None or _traced(args):
      return self.jitted(*args)
    static = tuple(args[i] for i in self.static_argnums)
    dynamic = [a for i, a in enumerate(args) if i not in self.static_argnums]
    leaves, tree = jax.tree.flatten(dynamic)
    key = (provider, static, tree, tuple(map(_signature, leaves)))
    if key not in self._provided:
      traced = self.jitted.trace(*args)
      name = traced.fun_name + ''.join(
          f'[{type(s).__name__}]' for s in static
          if not isinstance(s, (int, float, str, type(None))))
      self._provided[key] = provider(
          traced, fingerprint(traced),
          functools.partial(self._lower_on, args), name)
    return self._provided[key](*dynamic)

  def _lower_on(self, args, device) -> jax.stages.Lowered:
    """The program of a call on `args`, lowered for `device` (e.g. a
    compile-only twin of the device it will run on): its dynamic
    arguments as shape structs placed there."""
    placed = jax.sharding.SingleDeviceSharding(device)
    shaped = lambda x: jax.ShapeDtypeStruct(
        np.shape(x), _aval(x).dtype, weak_type=_aval(x).weak_type,
        sharding=placed)
    with kernels.abstract_gpu(device):  # a Pallas kernel's GPU, named
      return self.jitted.lower(*(
          a if i in self.static_argnums else jax.tree.map(shaped, a)
          for i, a in enumerate(args)))

  def lower(self, *args) -> jax.stages.Lowered:
    return self.jitted.lower(*args)

  def identity(self, *args) -> str:
    """The fingerprint a provider is asked for this call's program."""
    return fingerprint(self.jitted.trace(*args))

  def cache_size(self) -> int:
    """Programs compiled or provided so far."""
    return len(self._provided) + (
        self.jitted._cache_size())  # pylint: disable=protected-access


run = ProvidedJit(_call, static_argnums=(0,))
run.__doc__ = """`run(loop, *args)`: `loop(*args)` compiled once per loop
configuration and argument shapes.

The loop runs on `network.decoding_layout(args)`: T5 params in the fused
decoding layout, joined inside the program, outside the loop (nothing to do
for params laid out at load), so the loop's target and drafter calls read
each weight as it is. `loop` is a hashable loop object (a frozen
dataclass): a static argument, so two equal loops share one program."""


def cache_size() -> int:
  """Programs `run` holds compiled (what a no-recompilation check counts)."""
  return run.cache_size()


def lower(loop, *args) -> jax.stages.Lowered:
  """`run`'s program for `(loop, *args)`, lowered but not run.

  `.compile()` on the result compiles it ahead of time (e.g. several at once
  in threads) into jax's cache: a later `run` with the same loop and the
  arguments' shapes runs without compiling. Arguments may be
  `jax.ShapeDtypeStruct`s.
  """
  return run.lower(loop, *args)


def identity(loop, *args) -> str:
  """The fingerprint `run`'s program for `(loop, *args)` is asked for
  (`programs_from`); arguments may be `jax.ShapeDtypeStruct`s."""
  return run.identity(loop, *args)


Prepare = Callable[..., Tuple[Any, tuple]]


def decoder(prepare: Prepare):
  """A decode function from its prepare body (see the module docstring).

  Args:
    prepare: `(*args, **kwargs) -> (loop, loop_args)`; its name, signature
      and docstring become the decode function's.

  Returns:
    A function running `run(loop, *loop_args)`, with attributes `lower`
    (same arguments -> `jax.stages.Lowered`), `identity` (same arguments
    -> the program's fingerprint) and `prepare` (the body).
  """

  @functools.wraps(prepare)
  def decode(*args, **kwargs):
    loop, loop_args = prepare(*args, **kwargs)
    return run(loop, *loop_args)

  def lower_decode(*args, **kwargs) -> jax.stages.Lowered:
    loop, loop_args = prepare(*args, **kwargs)
    return lower(loop, *loop_args)

  lower_decode.__doc__ = (f'`{prepare.__name__}`\'s compiled program, '
                          'lowered but not run (`scaffold.lower`).')
  def identity_decode(*args, **kwargs) -> str:
    loop, loop_args = prepare(*args, **kwargs)
    return identity(loop, *loop_args)

  identity_decode.__doc__ = (f'`{prepare.__name__}`\'s program identity '
                             '(`scaffold.identity`).')
  decode.lower = lower_decode
  decode.identity = identity_decode
  decode.prepare = prepare
  return decode
