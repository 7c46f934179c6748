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

import functools
from typing import Any, Callable, Dict, Tuple

import jax

from specdec_jax import network


def _call(loop, *args):
  return loop(*network.decoding_layout(args))


# XLA's default `xla_gpu_gemm_rewrite_size_threshold`: below it XLA emits a
# dot itself whatever `compiler_options` says.
_XLA_SMALL_DOT_DEFAULT = 100


def compiler_options(args) -> Tuple[Tuple[str, Any], ...]:
  """The XLA options a loop's program compiles with, as sorted pairs.

  On a GPU, the dots smaller than the target's weight matmuls (a drafter's,
  the attention's) are emitted by XLA as fusions, which command buffers
  capture, instead of cuBLAS calls launched one by one
  (`network.small_dot_threshold`). Other backends ignore the option.

  Args:
    args: the loop's arguments (arrays or shape structs).
  """
  threshold = network.small_dot_threshold(args)
  if threshold <= _XLA_SMALL_DOT_DEFAULT:
    return ()
  return (('xla_gpu_gemm_rewrite_size_threshold', threshold),)


# compiler options -> the jitted entry compiled with them.
_ENTRIES: Dict[Tuple[Tuple[str, Any], ...], Any] = {}


def _compiled_entry(options: Tuple[Tuple[str, Any], ...]):
  """The jitted entry for one set of compiler options."""
  if options not in _ENTRIES:
    _ENTRIES[options] = jax.jit(_call, static_argnums=(0,),
                                compiler_options=dict(options) or None)
  return _ENTRIES[options]


def run(loop, *args):
  """`loop(*args)` compiled once per loop configuration and argument shapes.

  The loop runs on `network.decoding_layout(args)`: T5 params in the fused
  decoding layout, joined here, outside the loop (nothing to do for params
  laid out at load), so the loop's target and drafter calls read each
  weight as it is. It compiles with `compiler_options(args)`.

  Args:
    loop: a hashable loop object (a frozen dataclass): a static argument,
      so two equal loops share one compiled program.
    *args: its array arguments (pytrees).
  """
  return _compiled_entry(compiler_options(args))(loop, *args)


def cache_size() -> int:
  """Programs `run` holds compiled, over every set of options (what a
  no-recompilation check counts)."""
  return sum(entry._cache_size()  # pylint: disable=protected-access
             for entry in _ENTRIES.values())


def lower(loop, *args) -> jax.stages.Lowered:
  """`run`'s program for `(loop, *args)`, lowered but not run.

  `.compile()` on the result compiles it ahead of time (e.g. several at once
  in threads) into jax's cache: a later `run` with the same loop and the
  arguments' shapes runs without compiling. Arguments may be
  `jax.ShapeDtypeStruct`s.
  """
  return _compiled_entry(compiler_options(args)).lower(loop, *args)


Prepare = Callable[..., Tuple[Any, tuple]]


def decoder(prepare: Prepare):
  """A decode function from its prepare body (see the module docstring).

  Args:
    prepare: `(*args, **kwargs) -> (loop, loop_args)`; its name, signature
      and docstring become the decode function's.

  Returns:
    A function running `run(loop, *loop_args)`, with attributes `lower`
    (same arguments -> `jax.stages.Lowered`) and `prepare` (the body).
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
  decode.lower = lower_decode
  decode.prepare = prepare
  return decode
