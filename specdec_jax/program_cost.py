r"""The compiled program as a cost model, per while-loop iteration.

A decode loop's time is set by what each iteration of its `lax.while_loop`
makes the device do. This module reads that from what XLA compiled, for a
compile-only target (`specdec_jax.compiled`), and turns it into counts and
an ESTIMATED time:

- GPU: the runtime's thunk sequence (`*thunk_sequence_after_thunk_passes.txt`
  of an `xla_dump_to` folder: what the host launches, one thunk a line) and
  the optimized HLO (`*after_optimizations.txt`: each thunk's instruction,
  its shapes and its `metadata={op_name=...}`). Per iteration of the
  program's main loop (the entry-level while loop with the most thunks):
  host launches (kernels, cuBLAS(-Lt) GEMMs and copies launched one by one,
  each command buffer counting as one launch), kernels (every kernel, GEMM
  or copy, those inside command buffers counted one by one), command
  buffers, and bytes: each thunk's instruction's operand and output bytes
  (a fusion's operand that is only sliced counts its slices, an in-place
  dynamic-update-slice its update). A nested loop counts its body times its
  known trip count; a conditional its largest branch (an upper bound).
- TPU: launches are a GPU notion, so none are counted: per iteration, the
  HLO ops of the loop body (fusions, copies, custom calls) and the bytes
  they move to or from HBM (`Module.hbm_traffic`: memory spaces read from
  the layouts; operands in VMEM stay on chip, memory space assignment's
  async copies into VMEM move their bytes once), the floor-relevant figure;
  beside them what XLA's TPU cost analysis counts for the same ops
  (`Module.counted_bytes`: VMEM operands and each async copy's start and
  done too, 4-5x a prefetched weight) and the difference, labelled a
  counting artefact (`EXCESS`), by cause and by op kind; and the
  compiler's `cost_analysis()` bytes accessed of the whole program (which
  counts a loop body once) beside the same count rebuilt op by op.

Every op is attributed to a part of the iteration from its instruction's
`metadata={op_name=...}` (the path of JAX functions and Flax modules that
made it), the Python functions of its stack frames and the weights it
reads: the target call (a model call reading the program's first
argument's weights), each drafter call (another argument's; numbered in
launch order: a tree's levels), the draft steps (a nested loop: the
chain's drafter steps), selection, cache copies, verify bookkeeping and the
loop condition (`part_of`, `is_model_call`). A heuristic, not a profile.

The device model (`DeviceModel`) is fitted (`fit`, least squares) to the
per-iteration times measured on an H100 (`profiles/iterations/*.json`, with
the runs named); per part of an iteration
  ms = max(GB / bandwidth, host launches x launch_us + captured kernels x
           captured_us),
summed over the parts: an ESTIMATE, never a measurement. `python -m
specdec_jax.compiled --target=gpu:h100 --iterations` prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import pathlib
import re
import tempfile
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional,
                    Sequence, Tuple)

import jax
import numpy as np

from specdec_jax import checks
from specdec_jax import partitioning
from specdec_jax.bench import report

ESTIMATE = 'ESTIMATE (device model fitted to measured iterations)'
# XLA picks a GPU's GEMM kernels by timing candidates on the device
# (autotuning); a compile-only device cannot, and takes XLA's defaults: for
# the T5 1.1-XXL-cost decoder step Triton GEMM fusions at one small tile,
# which ran t(1) 2.5x slower on an H100 than the program compiled there.
# So a GPU program compiled without the device's autotune results leaves
# its GEMMs to cuBLAS, whose own heuristic picks each kernel when it runs.
UNTUNED_OPTIONS = {'xla_gpu_enable_triton_gemm': False}
MODEL_DIR = pathlib.Path(__file__).resolve().parent / 'profiles' / (
    'iterations')

_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 'f8e4m3fn': 1, 'f8e5m2': 1,
          's4': 0.5, 'u4': 0.5, 'bf16': 2, 'f16': 2, 's16': 2, 'u16': 2,
          'f32': 4, 's32': 4, 'u32': 4, 'f64': 8, 's64': 8, 'u64': 8,
          'c64': 8, 'c128': 16, 'token': 0}
_ARRAY = re.compile(r'([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?')
_COMMENT = re.compile(r'/\*.*?\*/')
_INSTRUCTION = re.compile(r'^\s+(?:ROOT )?%?([\w.\-]+) = (.*)$')
_COMPUTATION = re.compile(r'^(ENTRY )?%?([\w.\-]+) .*\{\s*$')
_OPERAND = re.compile(r'%([\w.\-]+)(?:#(\d+))?')
_CALLED = re.compile(r'\b(?:calls|to_apply|condition|body|true_computation|'
                     r'false_computation)=%([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
# Instructions that launch nothing and move no bytes of their own.
_FREE = ('parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast',
         'after-all', 'partition-id', 'replica-id', 'opt-barrier')
_SLICING = ('dynamic-slice', 'slice', 'gather')
# What an op moves to or from HBM (`Module.hbm_traffic`): reads of loop
# invariants, of loop state, of values made in the iteration, and writes.
HBM_KINDS = ('invariant', 'state', 'temporary', 'written')
# Why XLA's TPU cost analysis counts more than moves to or from HBM
# (`Module.counted_bytes` less `Module.hbm_traffic`): an asynchronous copy
# or slice between HBM and VMEM (memory space assignment's prefetch or
# eviction) counted as a read and a write at its start and its result again
# at its done; other ops' operands and results in VMEM (on chip: chiefly
# the GEMMs' reads of weights prefetched there).
_ASYNC, _ON_CHIP = 'excess: async copies HBM<->VMEM', 'excess: VMEM operands'
EXCESS = (_ASYNC, _ON_CHIP)
# An entry parameter of these is a weight (a model's), not tokens or a key.
_FLOATS = ('bf16', 'f16', 'f32', 'f64', 'f8e4m3fn', 'f8e5m2')


# ---------------------------------------------------------------------------
# Optimized HLO.
# ---------------------------------------------------------------------------


def _parse_shape(text: str, i: int = 0, spaces: bool = False
                 ) -> Tuple[Any, int]:
  """(shape, end) of the shape at `text[i:]`: ('bf16', (8, 256)) for an
  array, a list of shapes for a tuple; with `spaces`, each array's memory
  space instead (its layout's `S(n)`: 0, HBM, where none is written; on a
  TPU 1 is VMEM, 2 SMEM)."""
  while text[i] == ' ':
    i += 1
  if text[i] == '(':
    i += 1
    items = []
    while True:
      while text[i] in ' ,':
        i += 1
      if text[i] == ')':
        return items, i + 1
      item, i = _parse_shape(text, i, spaces)
      items.append(item)
  m = _ARRAY.match(text, i)
  if m is None:
    raise ValueError(f'no HLO shape at {text[i:i + 40]!r}')
  if spaces:
    space = re.search(r'S\((\d+)\)', m.group(3) or '')
    return int(space.group(1)) if space else 0, m.end()
  dims = tuple(int(d.lstrip('<=')) for d in m.group(2).split(',') if d)
  return (m.group(1), dims), m.end()


def _hbm_bytes(shape, spaces) -> float:
  """Bytes of the arrays of `shape` whose memory space (`spaces`,
  `_parse_shape`'s) is HBM's, 0."""
  if isinstance(shape, list):
    return sum(_hbm_bytes(s, p) for s, p in zip(shape, spaces))
  return shape_bytes(shape) if spaces == 0 else 0.0


def shape_bytes(shape) -> float:
  """Bytes of an HLO shape (`_parse_shape`'s form): a tuple's elements'."""
  if isinstance(shape, list):
    return sum(shape_bytes(s) for s in shape)
  dtype, dims = shape
  return _BYTES.get(dtype, 4) * math.prod(dims)


@dataclasses.dataclass
class Instruction:
  """One instruction of an optimized HLO module.

  Attributes:
    name: its name (unique in the module; a thunk's profile annotation).
    shape: its output shape (`_parse_shape`'s form).
    opcode: e.g. 'fusion', 'custom-call', 'while'.
    operands: (name, tuple index or None) of each operand.
    attrs: the rest of the line (called computations, metadata, config).
    computation: the computation it is in.
    args: the text between its parentheses (a parameter's number).
    spaces: its output's memory spaces (`_parse_shape` with `spaces`).
  """
  name: str
  shape: Any
  opcode: str
  operands: Tuple[Tuple[str, Optional[int]], ...]
  attrs: str
  computation: str
  args: str = ''
  spaces: Any = 0

  @property
  def op_name(self) -> str:
    m = re.search(r'op_name="([^"]*)"', self.attrs)
    return m.group(1) if m else ''

  @property
  def called(self) -> List[str]:
    """The computations it calls (fused computation, loop body, branches)."""
    out = _CALLED.findall(self.attrs)
    for group in _BRANCHES.findall(self.attrs):
      out += [c.strip().lstrip('%') for c in group.split(',')]
    return out

  @property
  def trip_count(self) -> Optional[int]:
    """A while loop's trip count, where the compiler knows it."""
    m = _TRIP.search(self.attrs)
    return int(m.group(1)) if m else None


class Module:
  """An optimized HLO module's text, parsed into computations.

  Attributes:
    computations: name -> its instructions, in order (the last is ROOT).
    instructions: name -> `Instruction`.
    roots: computation name -> its ROOT instruction's name.
    entry: the entry computation's name.
  """

  def __init__(self, text: str):
    self.computations: Dict[str, List[Instruction]] = {}
    self.instructions: Dict[str, Instruction] = {}
    self.roots: Dict[str, str] = {}
    self.entry = ''
    self._frames = _stack_frames(text)
    self._caller_map: Optional[Dict[str, Instruction]] = None
    self._branch_map: Optional[Dict[str, Tuple[Instruction, int]]] = None
    self._users: Dict[str, Dict[str, List[Instruction]]] = {}
    current = None
    for line in text.splitlines():
      m = _INSTRUCTION.match(line)
      if current is not None and m:
        instr = _instruction(m.group(1), m.group(2), current)
        if instr is not None:
          self.computations[current].append(instr)
          self.instructions[instr.name] = instr
          if line.lstrip().startswith('ROOT '):
            self.roots[current] = instr.name
        continue
      m = _COMPUTATION.match(line)
      if m and '->' in line:
        current = m.group(2)
        self.computations[current] = []
        if m.group(1):
          self.entry = current
      elif line.startswith('}'):
        current = None

  def operand_shape(self, operand: Tuple[str, Optional[int]]):
    name, index = operand
    shape = self.instructions[name].shape
    return shape[index] if index is not None else shape

  def users(self, computation: str, name: str) -> List[Instruction]:
    if computation not in self._users:
      users: Dict[str, List[Instruction]] = {}
      for i in self.computations[computation]:
        for o in dict.fromkeys(o[0] for o in i.operands):
          users.setdefault(o, []).append(i)
      self._users[computation] = users
    return self._users[computation].get(name, [])

  def root(self, computation: str) -> Instruction:
    return self.instructions[self.roots[computation]]

  def op_name(self, instr: Instruction) -> str:
    """`instr`'s op_name, or (a fusion without one) its fused ops' first."""
    if instr.op_name:
      return instr.op_name
    for comp in instr.called:
      for inner in self.computations.get(comp, ()):
        if '/' in inner.op_name:
          return inner.op_name
    return ''

  def functions(self, instr: Instruction) -> List[str]:
    """The Python functions (innermost last) that made `instr`, as far as
    the module's stack frames go (a fusion: its fused ops' first)."""
    for i in [instr] + [x for c in instr.called
                        for x in self.computations.get(c, ())]:
      m = re.search(r'stack_frame_id=(\d+)', i.attrs)
      if m:
        return self._frames.get(int(m.group(1)), [])
    return []

  def describe(self, instr: Instruction) -> str:
    """op_name | the functions that made it: what `part_of` reads."""
    return self.op_name(instr) + ' | ' + ' > '.join(self.functions(instr))

  def is_gemm(self, instr: Instruction) -> bool:
    """A matrix multiply: a GEMM custom call (cuBLAS), a dot, or a fusion
    holding one (a Triton GEMM, a TPU convolution fusion)."""
    if instr.opcode in ('custom-call', 'dot', 'convolution'):
      return instr.opcode != 'custom-call' or 'matmul' in instr.attrs or (
          'gemm' in instr.attrs)
    return instr.opcode == 'fusion' and any(
        i.opcode in ('dot', 'convolution') for c in instr.called
        for i in self.computations.get(c, ()))

  def weights(self, instr: Instruction) -> List[Tuple[int, str]]:
    """(argument, entry parameter) of each weight `instr` reads directly
    (through loop state, copies and bitcasts): the argument is N of an
    entry parameter named 'args_N_...' or whose op_name starts 'args[N]'
    (jax's names for the N-th argument of a jitted function), else that
    parameter's number. A weight is a
    floating-point entry parameter (not tokens, lengths or keys)."""
    out = []
    for operand in instr.operands:
      param = self._source(operand, 0)
      if param is not None and not isinstance(param.shape, list) and (
          param.shape[0] in _FLOATS):
        m = re.match(r'args_(\d+)_', param.name) or re.match(
            r'args\[(\d+)\]', param.op_name)
        out.append((int(m.group(1)) if m else int(param.args), param.name))
    return out

  def _source(self, operand: Tuple[str, Optional[int]], depth: int
              ) -> Optional[Instruction]:
    instr, index = self._follow(operand, ('bitcast', 'copy', 'reshape'))
    if instr is None or depth > 64 or instr.opcode != 'parameter':
      return None
    if instr.computation == self.entry:
      return instr
    loop = self._callers().get(instr.computation)
    if loop is None or index is None or not loop.operands or not (
        self._invariant(loop, index)):
      return None
    return self._source((loop.operands[0][0], index), depth + 1)

  def _follow(self, operand: Tuple[str, Optional[int]],
              passing: Tuple[str, ...]
              ) -> Tuple[Optional[Instruction], Optional[int]]:
    """(instruction, tuple index) that `operand` is, through the ops of
    `passing` (their first operand), tuples and their elements."""
    name, index = operand
    for _ in range(256):
      instr = self.instructions.get(name)
      if instr is None:
        break
      if instr.opcode in passing and instr.operands:
        name, index = instr.operands[0]
      elif instr.opcode == 'get-tuple-element' and instr.operands:
        name, index = instr.operands[0][0], int(
            re.search(r'index=(\d+)', instr.attrs).group(1))
      elif instr.opcode == 'tuple' and index is not None:
        name, index = instr.operands[index]
      else:
        return instr, index
    return None, None

  def _invariant(self, loop: Instruction, index: int) -> bool:
    """Whether element `index` of `loop`'s state is passed on unchanged
    by its body (a weight; not tokens, caches or rows it updates)."""
    body = loop.called[1] if len(loop.called) > 1 else ''
    if body not in self.roots:
      return False
    root = self.root(body)
    if root.opcode != 'tuple' or index >= len(root.operands):
      return False
    name, k = root.operands[index]
    instr = self.instructions[name]
    if instr.opcode == 'get-tuple-element':
      name, k = instr.operands[0][0], int(
          re.search(r'index=(\d+)', instr.attrs).group(1))
    return k == index and self.instructions[name].opcode == 'parameter'

  def _callers(self) -> Dict[str, Instruction]:
    """Loop body / condition -> the while instruction that runs it."""
    if self._caller_map is None:
      self._caller_map = {c: i for i in self.instructions.values()
                          if i.opcode == 'while' for c in i.called}
    return self._caller_map

  def bytes(self, instr: Instruction) -> float:
    """Estimated bytes one execution of `instr` moves: its operands' and
    output's (a fusion: its parameters' reads, only the slices of an
    operand it only slices, and an in-place update's bytes, not its
    buffer's; a GEMM: not its workspace)."""
    if instr.opcode == 'fusion' and instr.called:
      return self._fusion_bytes(instr, instr.called[0])
    out = instr.shape
    if instr.opcode == 'custom-call' and isinstance(out, list):
      out = [s for s in out if isinstance(s, list) or s[0] not in ('s8', 'u8')]
    return sum(shape_bytes(self.operand_shape(o)) for o in instr.operands
               if o[0] in self.instructions) + shape_bytes(out)

  def _fusion_bytes(self, instr: Instruction, comp: str) -> float:
    params = {int(i.args): i for i in self.computations[comp]
              if i.opcode == 'parameter'}
    written, in_place = self._written(comp, self.root(comp))
    total = written
    for k, operand in enumerate(instr.operands):
      full = shape_bytes(self.operand_shape(operand))
      param = params.get(k)
      total += full if param is None else self._read(comp, param.name, full,
                                                     in_place)
    return total

  def _written(self, comp: str, root: Instruction) -> Tuple[float, set]:
    """(bytes a fused computation's root writes, the parameters it updates
    in place)."""
    if root.opcode == 'tuple':
      out, updated = 0.0, set()
      for o in root.operands:
        b, u = self._written(comp, self.instructions[o[0]])
        out, updated = out + b, updated | u
      return out, updated
    if root.opcode == 'dynamic-update-slice':
      buffer = self._through_bitcasts(root.operands[0][0])
      return shape_bytes(self.operand_shape(root.operands[1])), {buffer}
    return shape_bytes(root.shape), set()

  def _through_bitcasts(self, name: str) -> str:
    instr = self.instructions[name]
    while instr.opcode in ('bitcast', 'reshape') and instr.operands:
      instr = self.instructions[instr.operands[0][0]]
    return instr.name

  def _read(self, comp: str, name: str, full: float, in_place: set) -> float:
    """Bytes a fused computation reads of value `name` (`full`: all of it):
    the slices where it only slices it, none of a buffer updated in place."""
    users = self.users(comp, name)
    if not users:
      return full
    total = 0.0
    for u in users:
      if u.opcode == 'dynamic-update-slice' and u.operands[0][0] == name and (
          name in in_place):
        continue  # the buffer it updates in place: only the update moves
      if u.opcode in _SLICING and u.operands[0][0] == name:
        total += shape_bytes(u.shape)
      elif u.opcode in ('bitcast', 'reshape'):
        total += self._read(comp, u.name, full, in_place | (
            {u.name} if name in in_place else set()))
      else:
        return full
    return min(total, full)

  # What an op moves to or from HBM (a TPU's layouts name memory spaces).

  def hbm_traffic(self, instr: Instruction) -> Dict[str, float]:
    """Bytes one execution of `instr` moves to or from HBM (memory space
    0; a TPU op's operands and results in VMEM, space 1, stay on chip), by
    kind (`HBM_KINDS`): reads of a loop invariant (the weights, the
    cross-attention K/V: what every iteration reads alike, or anything made
    before the loop), of loop state (the K/V caches, tokens), of a value
    made in the iteration (spilled, evicted), and writes. Reads of an
    operand it only slices count the slices (`bytes`' rules). An
    asynchronous copy or slice (memory space assignment's prefetch into
    VMEM, or eviction to HBM) moves its bytes once, at its start; its done,
    and a ConcatBitcast (VMEM slices seen as one array), move none."""
    out = dict.fromkeys(HBM_KINDS, 0.0)
    op = instr.opcode
    collective = op.startswith(('all-', 'collective-'))
    if (op.endswith('-done') and not collective) or (
        op == 'custom-call' and 'custom_call_target="ConcatBitcast"' in
        instr.attrs):
      return out
    if op.endswith('-start') and not collective:
      # copy-start: (destination, source, context); async-start, or its
      # short form '<op>-start': ((operands), result, context).
      result = 0 if op == 'copy-start' else 1
      size = shape_bytes(instr.shape[result])
      sliced = op == 'copy-start' or (
          self.root(instr.called[0]).opcode if op == 'async-start' else
          op[:-len('-start')]) in _SLICING
      for o in instr.operands:
        self._hbm_read(out, o, size if sliced else self._hbm_size(o))
      out['written'] += size * (instr.spaces[result] == 0)
      return out
    if op == 'fusion' and instr.called:
      comp = instr.called[0]
      params = {int(i.args): i for i in self.computations[comp]
                if i.opcode == 'parameter'}
      root = self.root(comp)
      _, in_place = self._written(comp, root)
      outputs = list(zip(root.operands, instr.spaces)) if (
          root.opcode == 'tuple' and isinstance(instr.spaces, list)) else [
              ((root.name, None), instr.spaces)]
      out['written'] = sum(self._written(comp, self.instructions[o[0]])[0]
                           for o, space in outputs if space == 0)
      for k, o in enumerate(instr.operands):
        full = self._hbm_size(o)
        self._hbm_read(out, o, self._read(
            comp, params[k].name, full, in_place) if k in params and full
                       else full)
      return out
    operands = instr.operands
    if op == 'dynamic-update-slice':  # in place: only the update moves
      operands = operands[1:2]
      out['written'] = self._hbm_size(operands[0]) * (instr.spaces == 0)
    else:
      shape, spaces = instr.shape, instr.spaces
      if op == 'custom-call' and isinstance(shape, list):  # no workspace
        kept = [k for k, x in enumerate(shape) if isinstance(x, list) or
                x[0] not in ('s8', 'u8')]
        shape, spaces = [shape[k] for k in kept], [spaces[k] for k in kept]
      out['written'] = _hbm_bytes(shape, spaces)
    for o in operands:
      self._hbm_read(out, o, self._hbm_size(o))
    return out

  def counted_bytes(self, instr: Instruction) -> float:
    """Bytes XLA's TPU cost analysis (`cost_analysis()`) counts for one
    execution of `instr`, as read off small programs compiled for a TPU
    v5e: every operand and result in whatever memory space (VMEM too),
    `bytes`' rules; an asynchronous copy's start its operand and its
    (destination, source) result, its done its result; an asynchronous
    slice's start its slice read and written, its done its result; a
    ConcatBitcast nothing. A weight prefetched into VMEM and then read
    from there is counted 5 times (copy) or 4 times (slices), read once
    from HBM."""
    op = instr.opcode
    if op == 'custom-call' and 'custom_call_target="ConcatBitcast"' in (
        instr.attrs):
      return 0.0
    if op.startswith(('all-', 'collective-')) or op == 'copy-start':
      return self.bytes(instr)
    if op.endswith('-done'):
      return shape_bytes(instr.shape)
    if op.endswith('-start'):
      return 2 * shape_bytes(instr.shape[1]) + shape_bytes(instr.shape[2:])
    return self.bytes(instr)

  def _hbm_size(self, operand: Tuple[str, Optional[int]]) -> float:
    """Bytes of `operand` that live in HBM."""
    name, index = operand
    if name not in self.instructions:
      return 0.0
    instr = self.instructions[name]
    shape, spaces = instr.shape, instr.spaces
    if index is not None and isinstance(shape, list):
      shape, spaces = shape[index], spaces[index]
    return _hbm_bytes(shape, spaces)

  def _hbm_read(self, out: Dict[str, float],
                operand: Tuple[str, Optional[int]], size: float) -> None:
    if size:
      out[self.origin(operand)] += size

  def origin(self, operand: Tuple[str, Optional[int]], depth: int = 0
             ) -> str:
    """What a value read in a loop is ('invariant', 'state' or
    'temporary', `hbm_traffic`'s kinds): followed through bitcasts,
    copies, tuples and loop state to an entry parameter or a value made
    before the loop (invariant), an element of a loop's state that its
    body changes (state), or a value made in the loop (temporary)."""
    instr, index = self._follow(operand, ('bitcast', 'copy', 'reshape',
                                          'copy-done', 'copy-start'))
    if instr is None or depth > 64:
      return 'temporary'
    if instr.computation == self.entry:
      return 'invariant'
    if instr.opcode != 'parameter':
      return 'temporary'
    loop = self._callers().get(instr.computation)
    if loop is not None and index is not None and loop.operands:
      if not self._invariant(loop, index):
        return 'state'
      return self.origin((loop.operands[0][0], index), depth + 1)
    caller = self._branch_callers().get(instr.computation)
    if caller is not None:
      instr_, k = caller
      return self.origin(instr_.operands[k], depth + 1)
    return 'temporary'

  def _branch_callers(self) -> Dict[str, Tuple[Instruction, int]]:
    """A conditional's branch -> (the conditional, the operand its
    parameter is)."""
    if self._branch_map is None:
      self._branch_map = {
          comp: (i, b + 1) for i in self.instructions.values()
          if i.opcode == 'conditional' for b, comp in enumerate(i.called)}
    return self._branch_map


def _stack_frames(text: str) -> Dict[int, List[str]]:
  """Stack frame id -> function names (outermost first) from an HLO
  text's FunctionNames / FileLocations / StackFrames tables."""
  def table(title):
    m = re.search(r'^' + title + r'\n(.*?)(?:\n\n|\Z)', text, re.S | re.M)
    return m.group(1).splitlines() if m else []
  names = {int(l.split(' ', 1)[0]): l.split(' ', 1)[1].strip('"')
           for l in table('FunctionNames') if ' ' in l}
  where = {int(l.split(' ', 1)[0]): int(
      re.search(r'function_name_id=(\d+)', l).group(1))
           for l in table('FileLocations') if 'function_name_id' in l}
  parent = {}
  for l in table('StackFrames'):
    m = re.match(r'(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)', l)
    if m:
      parent[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
  out = {}
  for frame in parent:
    stack, f, seen = [], frame, set()
    while f in parent and f not in seen:
      seen.add(f)
      loc, up = parent[f]
      stack.append(names.get(where.get(loc, -1), ''))
      f = up
    out[frame] = stack[::-1]
  return out


def _instruction(name: str, rest: str, computation: str
                 ) -> Optional[Instruction]:
  rest = _COMMENT.sub('', rest)
  try:
    shape, i = _parse_shape(rest)
  except (ValueError, IndexError):
    return None
  m = re.compile(r'\s*([\w\-]+)\(').match(rest, i)
  if m is None:
    return None
  depth, j = 1, m.end()
  while depth and j < len(rest):
    depth += {'(': 1, ')': -1}.get(rest[j], 0)
    j += 1
  operands = tuple((n, int(k) if k else None)
                   for n, k in _OPERAND.findall(rest[m.end():j - 1]))
  return Instruction(name, shape, m.group(1), operands, rest[j:],
                     computation, rest[m.end():j - 1],
                     _parse_shape(rest, spaces=True)[0])


# ---------------------------------------------------------------------------
# The GPU runtime's thunk sequence.
# ---------------------------------------------------------------------------

_THUNK = re.compile(r'^( *)(\d+): (k\w+)\s*(.*)$')
_HEADER = re.compile(r'^( *)(\w+):\s*$')
# Thunks that hold others (run what they hold); thunks that launch nothing.
CONTAINERS = ('kWhile', 'kConditional', 'kCommandBuffer', 'kAsyncStart',
              'kDynamicSliceFusion', 'kSequential')
NO_LAUNCH = ('kAsyncDone', 'kWaitForStreams', 'kRecordEvent', 'kWaitEvent')


@dataclasses.dataclass
class Thunk:
  """One line of a thunk sequence.

  Attributes:
    id: its thunk id (0: a command buffer).
    kind: e.g. 'kCustomKernel', 'kCublasLtMatmul', 'kCopy', 'kWhile'.
    text: the rest of its line (a kernel's name, grid).
    indent: its line's indentation.
    groups: what it holds: '' (a command buffer's or async thunk's
      thunks), 'condition' / 'body' (a while loop), '<name>_branch' or
      'branch_<n>' (a conditional).
    instruction: the HLO instruction it runs (its profile annotation).
  """
  id: int
  kind: str
  text: str
  indent: int
  groups: Dict[str, List['Thunk']] = dataclasses.field(default_factory=dict)
  instruction: str = ''


def parse_thunks(text: str, metadata: str = '') -> List[Thunk]:
  """The top-level thunks of a thunk sequence dump, nested thunks in
  their `groups`; `metadata` (the `*thunk_metadata.txt` dump) names each
  thunk's instruction."""
  names = {int(i): a for a, i in re.findall(
      r'profile_annotation: "([^"]*)"\s*thunk_id: (\d+)', metadata)}
  top: List[Thunk] = []
  stack: List[Tuple[Thunk, str]] = []  # (thunk, the group being filled)
  last: Optional[Thunk] = None
  for line in text.splitlines():
    m = _THUNK.match(line)
    if m:
      indent = len(m.group(1))
      while stack and stack[-1][0].indent >= indent:
        stack.pop()
      thunk = Thunk(int(m.group(2)), m.group(3), m.group(4).strip(), indent,
                    instruction=names.get(int(m.group(2)), ''))
      if stack:
        owner, group = stack[-1]
        owner.groups.setdefault(group, []).append(thunk)
      else:
        top.append(thunk)
      stack.append((thunk, ''))
      last = thunk
      continue
    m = _HEADER.match(line)
    if m and last is not None:
      # 'condition:' follows its while line (XLA prints it unindented);
      # other headers sit 2 columns right of the thunk that owns them.
      h = len(m.group(1))
      owner = last if m.group(2) == 'condition' else next(
          (t for t, _ in reversed(stack) if t.indent == h - 2), last)
      while stack and stack[-1][0] is not owner:
        stack.pop()
      if not stack:
        stack.append((owner, m.group(2)))
      else:
        stack[-1] = (owner, m.group(2))
  return top


# ---------------------------------------------------------------------------
# Per iteration.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Counts:
  """What one iteration runs, in all or in one part.

  Attributes:
    launches: host launches (direct kernels / GEMMs / copies, and one per
      command buffer; TPU: 0, launches being a GPU notion).
    kernels: kernels, GEMMs and copies run, captured ones included (TPU:
      HLO ops of the body).
    command_buffers: command buffer launches.
    captured: kernels run inside command buffers.
    bytes: estimated bytes moved.
  """
  launches: float = 0
  kernels: float = 0
  command_buffers: float = 0
  captured: float = 0
  bytes: float = 0

  def add(self, other: 'Counts', times: float = 1) -> None:
    self.launches += times * other.launches
    self.kernels += times * other.kernels
    self.command_buffers += times * other.command_buffers
    self.captured += times * other.captured
    self.bytes += times * other.bytes


@dataclasses.dataclass
class Iteration:
  """The counts of one iteration of a program's main loop.

  Attributes:
    platform: 'gpu' or 'tpu'.
    total: the whole iteration's `Counts`.
    parts: part name (`part_of`) -> its `Counts`.
    notes: what the counts assumed (unknown trip counts, branches).
    program_bytes: TPU: `cost_analysis()` bytes accessed of the whole
      program (a loop body counted once); None on a GPU (it reports none).
    counted: TPU: part -> the bytes XLA's cost analysis counts for its ops
      (`Module.counted_bytes`), where `total` and `parts` count only what
      moves to or from HBM (`Module.hbm_traffic`).
    breakdown: TPU: per iteration, the HBM bytes by kind (`HBM_KINDS`) and
      the counted excess over them by cause (`EXCESS`).
    program_counted: TPU: `program_counted`, beside `program_bytes`.
    kinds: TPU: op kind (`op_kind`) -> [ops, HBM bytes, counted bytes] per
      iteration.
  """
  platform: str
  total: Counts
  parts: Dict[str, Counts]
  notes: List[str] = dataclasses.field(default_factory=list)
  program_bytes: Optional[float] = None
  counted: Optional[Dict[str, float]] = None
  breakdown: Optional[Dict[str, float]] = None
  program_counted: Optional[float] = None
  kinds: Optional[Dict[str, List[float]]] = None

  def to_json(self) -> Dict[str, Any]:
    return dict(platform=self.platform, total=dataclasses.asdict(self.total),
                parts={k: dataclasses.asdict(v) for k, v in self.parts.items()},
                notes=self.notes, program_bytes=self.program_bytes,
                counted=self.counted, breakdown=self.breakdown,
                program_counted=self.program_counted, kinds=self.kinds)


_MODEL_CALL = re.compile(r'(^|/)(Transformer|T5Model|ShardedModel)\.|'
                         r'\.extend(/|$)')
_PARTS = (  # (part, pattern on 'op_name | functions'), the first match wins
    ('cache copies', r'move_slots|write_rows|rewind|take_rows|'
                     r'constrain_cache|cache'),
    ('selection', r'grow|_Levels|expand|top_k|argmax|argsort|sort|'
                  r'categorical|sample|select_token|choose|propose|'
                  r'log_softmax'),
)
TARGET, DRAFTER = 'target call', 'drafter call'


def relative(op_name: str, loop: str = '') -> str:
  """`op_name` relative to the body of the main loop (`loop`: that while
  loop's own op_name, e.g. 'jit(run)/while'); 'cond:' + the rest for its
  condition."""
  for prefix, tag in ((loop + '/body/', ''), (loop + '/cond/', 'cond:')):
    if loop and prefix in op_name:
      return tag + op_name.split(prefix, 1)[1]
  return op_name


def part_of(description: str, loop: str = '') -> str:
  """The part of an iteration an op that is no model call belongs to, from
  its `Module.describe` ('op_name | functions'): 'loop condition', 'draft
  steps' (a nested loop: the chain's drafter steps), 'cache copies' (cache
  moves, rewinds, rows written), 'selection' (choosing tokens: argmax,
  top-k, sampling, growing a tree) or 'verify bookkeeping' (the rest).
  Model calls are 'target call' / 'drafter call <n>' (`is_model_call`).
  Heuristic: names as the package's functions and JAX's primitives spell
  them."""
  op_name, _, functions = description.partition(' | ')
  rel = relative(op_name, loop)
  if rel.startswith('cond:'):
    return 'loop condition'
  if rel.startswith('while/'):
    return 'draft steps'
  text = rel + ' | ' + functions
  for part, pattern in _PARTS:
    if re.search(pattern, text):
      return part
  return 'verify bookkeeping'


def is_model_call(op_name: str, loop: str = '') -> bool:
  """Whether an op is part of a model's call (`Transformer.extend` and
  what it calls) made directly in the loop body (not in a nested loop)."""
  rel = relative(op_name, loop)
  return not rel.startswith(('while/', 'cond:')) and bool(
      _MODEL_CALL.search(rel))


def _main_while(top: Sequence[Thunk]) -> Thunk:
  """The entry-level while thunk with the most thunks inside."""
  loops = [t for t in _flatten_top(top) if t.kind == 'kWhile']
  if not loops:
    raise ValueError('no while loop in the thunk sequence')
  return max(loops, key=lambda t: sum(1 for _ in _leaves(t)))


def _flatten_top(thunks: Sequence[Thunk]) -> Iterable[Thunk]:
  for t in thunks:  # entry level: through command buffers, not loops
    yield t
    if t.kind in ('kCommandBuffer', 'kAsyncStart', 'kSequential'):
      yield from _flatten_top(t.groups.get('', []))


def _leaves(thunk: Thunk) -> Iterable[Thunk]:
  if not thunk.groups:
    yield thunk
  for group in thunk.groups.values():
    for t in group:
      yield from _leaves(t)


@dataclasses.dataclass
class _Leaf:
  """One launching thunk of an iteration, in launch order."""
  instr: Optional[Instruction]
  times: float  # runs per iteration
  buffer: int  # the command buffer it is captured in (0: none)
  bytes: float
  part: str = ''


class _Walk:
  """The launching thunks of an iteration in order (see `gpu_iteration`)."""

  def __init__(self, module: Module):
    self.module = module
    self.notes: List[str] = []
    self.leaves: List[_Leaf] = []
    self.buffers: List[float] = []  # each command buffer's runs

  def run(self, thunks: Sequence[Thunk], times: float, buffer: int,
          parent: str = '') -> None:
    seen = set()  # an instruction's bytes once per sequence (a sort: 2)
    for t in thunks:
      name = t.instruction if t.instruction in self.module.instructions else (
          parent)
      if t.kind in NO_LAUNCH:
        continue
      if t.kind == 'kWhile':
        instr = self.module.instructions.get(t.instruction)
        n = instr.trip_count if instr else None
        if n is None:
          self.notes.append(f'{t.instruction or "a loop"}: trip count '
                            'unknown, counted once')
        self.run(t.groups.get('body', []), times * (n or 1), buffer, name)
        if n is None:  # a known trip count runs no condition
          self.run(t.groups.get('condition', []), times, buffer, name)
      elif t.kind == 'kConditional':
        branches = list(t.groups.values())
        if len(branches) > 1:
          self.notes.append(f'{t.instruction}: the largest of '
                            f'{len(branches)} branches counted')
        if branches:
          self.run(max(branches, key=lambda g: sum(
              1 for x in g for _ in _leaves(x))), times, buffer, name)
      elif t.kind == 'kCommandBuffer' and not buffer:
        self.buffers.append(times)
        self.run(t.groups.get('', []), times, len(self.buffers), name)
      elif t.groups:
        self.run([x for g in t.groups.values() for x in g], times, buffer,
                 name)
      else:
        instr = self.module.instructions.get(name)
        size = 0.0
        if instr is not None and instr.name not in seen:
          seen.add(instr.name)
          size = self.module.bytes(instr)
        self.leaves.append(_Leaf(instr, times, buffer, size))

  def parts(self, loop: str) -> Dict[str, Counts]:
    """Each leaf's part, and the counts per part. A model call is an op
    under a model's call in the body (`is_model_call`) or one reading a
    model's weights (e.g. a weight concatenation XLA made); it belongs to
    the argument whose weights it reads (the first argument: the target's,
    the others: a drafter's), an op reading none to the call before it. A
    drafter call ends where a GEMM reads a weight a GEMM of the call read
    already (GEMMs run a model's matrices in order; the scheduler may move
    the small ops, e.g. an embedding lookup, next to the call before): its
    calls are numbered in launch order (a tree's levels). An op without an
    op_name joins the part of the op that reads what it made
    (`_to_consumers`). A command buffer's launch goes to the part most of
    its kernels are in."""
    current, calls, read = None, 0, set()
    for leaf in self.leaves:
      if leaf.instr is None:
        leaf.part = 'verify bookkeeping'
        continue
      op_name = self.module.op_name(leaf.instr)
      nested = relative(op_name, loop).startswith(('while/', 'cond:'))
      weights = [] if nested else self.module.weights(leaf.instr)
      if not weights and not is_model_call(op_name, loop):
        leaf.part = part_of(self.module.describe(leaf.instr), loop)
        continue
      arg = weights[0][0] if weights else None
      if arg == 0 or (arg is None and current in (None, TARGET)):
        current = TARGET
      elif arg is not None:
        names = {n for a, n in weights if a == arg} if self.module.is_gemm(
            leaf.instr) else set()
        if current in (None, TARGET) or names & read:
          calls, read = calls + 1, set()
          current = f'{DRAFTER} {calls}'
        read |= names
      leaf.part = current
    _to_consumers(self.module, self.leaves)
    return self.parts_counts()

  def parts_counts(self) -> Dict[str, Counts]:
    """The counts per part of the leaves as `parts` left them."""
    out: Dict[str, Counts] = {}
    kernels: Dict[int, Dict[str, float]] = {}
    for leaf in self.leaves:
      c = Counts(launches=0 if leaf.buffer else 1, kernels=1,
                 captured=1 if leaf.buffer else 0, bytes=leaf.bytes)
      out.setdefault(leaf.part, Counts()).add(c, leaf.times)
      if leaf.buffer:
        by_part = kernels.setdefault(leaf.buffer, {})
        by_part[leaf.part] = by_part.get(leaf.part, 0) + leaf.times
    for buffer, by_part in kernels.items():
      out[max(by_part, key=by_part.get)].add(
          Counts(launches=1, command_buffers=1), self.buffers[buffer - 1])
    return out


def _total(parts: Mapping[str, Counts]) -> Counts:
  total = Counts()
  for c in parts.values():
    total.add(c)
  return total


def gpu_iteration(thunk_text: str, hlo_text: str, metadata: str = ''
                  ) -> Iteration:
  """Counts of one iteration of the main loop of a GPU program (its thunk
  sequence after thunk passes, optimized HLO and thunk metadata dumps);
  a program with no loop counts as one iteration."""
  module = Module(hlo_text)
  top = parse_thunks(thunk_text, metadata)
  walk = _Walk(module)
  try:
    loop = _main_while(top)
  except ValueError:
    walk.run(top, 1, 0)
    parts = walk.parts('')
    return Iteration('gpu', _total(parts), parts,
                     walk.notes + ['no while loop: the whole program'])
  instr = module.instructions.get(loop.instruction)
  walk.run(loop.groups.get('body', []), 1, 0, loop.instruction)
  walk.run(loop.groups.get('condition', []), 1, 0, loop.instruction)
  parts = walk.parts(instr.op_name if instr else '')
  return Iteration('gpu', _total(parts), parts, walk.notes)


def hlo_iteration(hlo_text: str, platform: str = 'tpu',
                  program_bytes: Optional[float] = None) -> Iteration:
  """Counts of one iteration of the main loop (the entry-level while loop
  with the most ops) from the optimized HLO alone (TPU): the body's ops in
  order (kernels: HLO ops; no launches, a GPU notion) and their bytes; a
  nested loop's body times its known trip count, a conditional's every
  branch (an upper bound)."""
  module = Module(hlo_text)
  walk = _Walk(module)

  def ops(comp: str) -> int:
    return len([i for i in module.computations[comp] if i.opcode not in _FREE])

  def run(comp: str, times: float) -> None:
    for i in module.computations[comp]:
      if i.opcode in _FREE:
        continue
      if i.opcode == 'while':
        n = i.trip_count
        if n is None:
          walk.notes.append(f'{i.name}: trip count unknown, counted once')
        run(i.called[1], times * (n or 1))
        if n is None:
          run(i.called[0], times)
      elif i.opcode in ('conditional', 'call'):
        for c in i.called[:1] if i.opcode == 'call' else i.called:
          run(c, times)
      else:
        traffic = module.hbm_traffic(i)
        hbm = sum(traffic.values())
        walk.leaves.append(_Leaf(i, times, 0, hbm))
        counted[i.name] = module.counted_bytes(i)
        for kind, size in traffic.items():
          breakdown[kind] += times * size
        excess = _ASYNC if i.opcode.endswith(('-start', '-done')) and not (
            i.opcode.startswith(('all-', 'collective-'))) else _ON_CHIP
        breakdown[excess] += times * (counted[i.name] - hbm)
        row = kinds.setdefault(op_kind(i), [0.0, 0.0, 0.0])
        row[0] += times
        row[1] += times * hbm
        row[2] += times * counted[i.name]

  counted: Dict[str, float] = {}
  kinds: Dict[str, List[float]] = {}
  breakdown = dict.fromkeys(HBM_KINDS + (_ASYNC, _ON_CHIP), 0.0)
  loops = [i for i in module.computations.get(module.entry, [])
           if i.opcode == 'while' and len(i.called) > 1]
  if not loops:
    run(module.entry, 1)
    walk.notes.append('no while loop: the whole program')
    loop = ''
  else:
    main = max(loops, key=lambda i: ops(i.called[1]))
    run(main.called[1], 1)
    run(main.called[0], 1)
    loop = main.op_name
  parts = walk.parts(loop)
  for c in parts.values():
    c.launches = c.captured = c.command_buffers = 0
  by_part: Dict[str, float] = {}
  for leaf in walk.leaves:
    by_part[leaf.part] = by_part.get(leaf.part, 0.0) + leaf.times * counted[
        leaf.instr.name]
  return Iteration(platform, _total(parts), parts, walk.notes, program_bytes,
                   by_part, breakdown, program_counted(module), kinds)


def op_kind(instr: Instruction) -> str:
  """An op's kind for the per-kind table: its opcode, a fusion's kind
  (kLoop, kOutput...), a custom call's target."""
  m = re.search(r'kind=(\w+)|custom_call_target="([^"]+)"', instr.attrs)
  return instr.opcode + (':' + (m.group(1) or m.group(2)) if m and (
      instr.opcode in ('fusion', 'custom-call')) else '')


def _to_consumers(module: Module, leaves: Sequence[_Leaf]) -> None:
  """An op without an op_name (TPU: what memory space assignment made, an
  async copy or slice, its done, a ConcatBitcast; GPU: the custom call
  XLA's TopK rewrite makes) joins the part of the op that uses what it
  made (a prefetched weight: the call whose GEMM reads it; a tree level's
  top-k: the draw that reads it, selection)."""
  part = {leaf.instr.name: leaf.part for leaf in leaves if leaf.instr}

  def consumer(instr: Instruction, depth: int) -> Optional[str]:
    for user in module.users(instr.computation, instr.name):
      if module.op_name(user) and user.name in part:
        return part[user.name]
      found = depth < 4 and consumer(user, depth + 1)
      if found:
        return found
    return None

  for leaf in leaves:
    if leaf.instr is not None and not module.op_name(leaf.instr):
      leaf.part = consumer(leaf.instr, 0) or leaf.part


def program_counted(module: Module) -> float:
  """`Module.counted_bytes` of every op of the program, each loop's body
  and condition once and every branch of a conditional: what XLA's
  `cost_analysis()` reports as its bytes accessed, rebuilt op by op."""
  def run(comp: str) -> float:
    total = 0.0
    for i in module.computations[comp]:
      if i.opcode in ('while', 'conditional', 'call'):
        total += sum(run(c) for c in i.called)
      elif i.opcode not in _FREE:
        total += module.counted_bytes(i)
    return total
  return run(module.entry)


def read_dump(folder) -> Dict[str, str]:
  """The texts `gpu_iteration` reads from an `xla_dump_to` folder (of one
  program): 'thunks', 'hlo', 'metadata' ('' where absent; a `.gz` file
  is read too)."""
  folder = pathlib.Path(folder)

  def text(pattern: str) -> str:
    paths = sorted(folder.glob(pattern)) + sorted(folder.glob(pattern + '.gz'))
    if not paths:
      return ''
    path = max(paths, key=lambda p: p.stat().st_size)
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == '.gz' else data).decode()

  thunks = (text('*thunk_sequence_after_thunk_passes.txt') or
            text('*thunk_sequence.txt'))
  return dict(thunks=thunks, hlo=text('*after_optimizations.txt'),
              metadata=text('*thunk_metadata.txt'))


_HOST = (' outfeed(', ' infeed(', ' send(', ' recv(', 'callback',
         'host_compute')
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
  found = re.search(r'^ENTRY .*\{$(.*?)^\}', text, re.M | re.S)
  entry = found.group(1).splitlines() if found else []
  ops = [l for l in entry if '=' in l and not any(
      f' {op}' in l.split('=', 1)[1] for op in _NOT_OPS)]
  return {'while_loops': text.count(' while('),
          'entry_while_loops': sum(' while(' in l for l in entry),
          'host_transfers': sum(text.count(op) for op in _HOST),
          'entry_ops': len(ops),
          'collectives': partitioning.count_collectives(text)}


def cost_analysis(compiled) -> Dict[str, Any]:
  """A compiled program's `cost_analysis()` as one dict ({} if none;
  some jax versions give a list of one per device)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return cost or {}


def compile_options(platform: str,
                    options: Optional[Mapping[str, Any]] = None
                    ) -> Dict[str, Any]:
  """The XLA options a program for `platform` is counted with: on a GPU
  as the project's builds compile without autotune results (cuBLAS GEMMs,
  `UNTUNED_OPTIONS`), with `options` over them."""
  return dict(UNTUNED_OPTIONS if platform == 'gpu' else {}, **(options or {}))


def check_options(device, platform: str,
                  options: Optional[Mapping[str, Any]]) -> None:
  """Raises InputError where the compiler of `device` (compile-only, of
  `platform`) refuses one of the XLA `options` (an unknown name, a value
  of another type; with `compile_options`): tried on a program of one
  addition, before the long compiles. None or {}: nothing to try."""
  if not options:
    return
  x = jax.ShapeDtypeStruct((8,), np.float32,
                           sharding=jax.sharding.SingleDeviceSharding(device))
  try:
    jax.jit(lambda a: a + 1).lower(x).compile(
        compile_options(platform, options))
  except jax.errors.JaxRuntimeError as e:
    raise checks.InputError(f'--xla_option: {e}') from None


def compile_iteration(lowered, platform: str,
                      options: Optional[Mapping[str, Any]] = None
                      ) -> Iteration:
  """Compiles `lowered` (a `jax.stages.Lowered` for a compile-only target)
  with `compile_options` and counts one iteration of its main loop."""
  opts = compile_options(platform, options)
  if platform != 'gpu':
    compiled = lowered.compile(opts)
    return hlo_iteration(compiled.as_text(), platform,
                         cost_analysis(compiled).get('bytes accessed'))
  with tempfile.TemporaryDirectory() as folder:
    opts.update(xla_dump_to=folder, xla_dump_hlo_as_text=True)
    lowered.compile(opts)
    texts = read_dump(folder)
  if not texts['thunks']:
    raise ValueError('the GPU compiler dumped no thunk sequence')
  return gpu_iteration(texts['thunks'], texts['hlo'], texts['metadata'])


# ---------------------------------------------------------------------------
# The device model.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceModel:
  """Per part: max(GB / bandwidth, launches x launch_us + captured x
  captured_us); an iteration: the sum over its parts.

  A part of an iteration is bound either by the bytes it moves or by
  running its kernels (launched from the host or captured in a command
  buffer), whichever takes longer: the kernels of a call that streams
  gigabytes of weights (the target call) hide behind its transfers, those
  of a chain of tiny kernels (a small drafter's call at batch 1) are its
  time. ESTIMATES, never measurements.

  Attributes:
    name: the device's name, e.g. 'nvidia-h100-80gb-hbm3'.
    bandwidth: bytes per second.
    launch_us: microseconds per host launch (direct, or a command buffer).
    captured_us: microseconds per kernel inside a command buffer.
  """
  name: str
  bandwidth: float
  launch_us: float
  captured_us: float

  def transfer_ms(self, c: Counts) -> float:
    return 1e3 * c.bytes / self.bandwidth

  def launch_ms(self, c: Counts) -> float:
    return 1e-3 * (c.launches * self.launch_us + c.captured * self.captured_us)

  def part_ms(self, c: Counts) -> float:
    """The ESTIMATED milliseconds of one part's counts."""
    return max(self.transfer_ms(c), self.launch_ms(c))

  def ms(self, parts: Mapping[str, Counts]) -> float:
    """The ESTIMATED milliseconds of an iteration (its parts' counts)."""
    return sum(self.part_ms(c) for c in parts.values())


def fit(rows: Sequence[Tuple[Mapping[str, Counts], float]],
        name: str = 'device', start: Optional[DeviceModel] = None
        ) -> DeviceModel:
  """The `DeviceModel` that best fits `rows` ((parts' counts, measured
  ms) of each program), relative to each time (every program weighs
  alike). Given which parts are bound by bytes and which by launches, the
  model is linear in (1 / bandwidth, launch_us, captured_us): least
  squares, a term that would go negative left out. The bounds are taken
  from `start` (default: 3 TB/s, 5 us a launch, 2 us a captured kernel),
  then from each fit, until they hold; the best fit seen is returned."""
  y = np.array([ms for _, ms in rows], float)
  model = start or DeviceModel(name, 3e12, 5.0, 2.0)
  best, seen = None, []
  for _ in range(20):
    bound = [{p: model.transfer_ms(c) >= model.launch_ms(c)
              for p, c in parts.items()} for parts, _ in rows]
    if bound in seen:
      break
    seen.append(bound)
    x = np.zeros((len(rows), 3))
    for i, (parts, _) in enumerate(rows):
      for p, c in parts.items():
        if bound[i][p]:
          x[i, 0] += c.bytes / 1e9
        else:
          x[i, 1:] += (c.launches, c.captured)
    coef = _nonnegative_lstsq(x / y[:, None], np.ones(len(y)))
    model = DeviceModel(name, 1e12 / coef[0] if coef[0] > 0 else math.inf,
                        coef[1] * 1e3, coef[2] * 1e3)
    error = sum((model.ms(parts) / ms - 1) ** 2 for parts, ms in rows)
    if best is None or error < best[0]:
      best = (error, model)
  return best[1]


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """argmin |a x - b| with x >= 0, by leaving out the most negative term
  until none is (enough for three terms)."""
  keep = [j for j in range(a.shape[1]) if a[:, j].any()]
  while keep:
    coef, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
    if (coef >= 0).all():
      break
    keep.pop(int(np.argmin(coef)))
  out = np.zeros(a.shape[1])
  out[keep] = coef if keep else []
  return out


def load_model(name: str = 'nvidia-h100-80gb-hbm3') -> Dict[str, Any]:
  """The stored fit of device `name` (`MODEL_DIR/<name>.json`): its
  `DeviceModel` ('model'), the measured iterations it was fitted to
  ('programs': each with its counts per part and where its time comes
  from)."""
  data = json.loads((MODEL_DIR / f'{name}.json').read_text())
  m = data['model']
  data['model'] = DeviceModel(name, m['bandwidth'], m['launch_us'],
                              m['captured_us'])
  return data


def measured_ms(program: Mapping[str, Any]) -> float:
  """A stored program's measured ms per iteration: `t_ms`, or its run's
  timed seconds less the fixed per-example cost, over its target calls."""
  if 't_ms' in program:
    return program['t_ms']
  return 1e3 * (program['seconds'] - program['rows'] * program[
      'fixed_ms'] * 1e-3) / program['target_calls']


def parts_of(data: Mapping[str, Mapping[str, float]]) -> Dict[str, Counts]:
  """Parts' counts from their JSON form (`Iteration.to_json()['parts']`)."""
  return {p: Counts(**{f.name: c[f.name] for f in dataclasses.fields(Counts)})
          for p, c in data.items()}


def refit(data: Mapping[str, Any]) -> DeviceModel:
  """The model fitted anew to a stored fit's programs (their counts as
  stored, their measured times)."""
  return fit([(parts_of(p['parts']), measured_ms(p))
              for p in data['programs']], data['model'].name)


# ---------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------


_ORDER = (TARGET, DRAFTER, 'draft steps', 'selection', 'cache copies',
          'verify bookkeeping', 'loop condition')


def _part_key(part: str) -> Tuple[int, int]:
  """Parts in the order of `_ORDER`, drafter calls by number."""
  head, _, number = part.rpartition(' ')
  if head == DRAFTER and number.isdigit():
    return _ORDER.index(DRAFTER), int(number)
  return (_ORDER.index(part) if part in _ORDER else len(_ORDER)), 0


def rows(iterations: Sequence[Tuple[str, Iteration, Optional[float]]],
         model: Optional[DeviceModel]) -> List[Dict[str, Any]]:
  """One row per program ((label, iteration, measured ms or None)) and one
  per part of it: counts, GB, the ESTIMATED ms (GPU, with `model`), the
  measured ms and estimated / measured."""
  out = []
  for label, it, measured in iterations:
    for part, c in [('all', it.total)] + sorted(
        it.parts.items(), key=lambda kv: _part_key(kv[0])):
      est = None if model is None or it.platform != 'gpu' else (
          model.ms(it.parts) if part == 'all' else model.part_ms(c))
      counted = None if it.counted is None else (
          sum(it.counted.values()) if part == 'all' else it.counted.get(
              part, 0.0)) / 1e9
      row = dict(program=label, part=part, launches=c.launches,
                 kernels=c.kernels, command_buffers=c.command_buffers,
                 captured=c.captured, gb=c.bytes / 1e9, counted_gb=counted,
                 estimated_ms=est,
                 measured_ms=measured if part == 'all' else None)
      row['ratio'] = (est / measured if est is not None and
                      row['measured_ms'] else None)
      out.append(row)
  return out


def markdown(table: Sequence[Mapping[str, Any]], platform: str,
             model: Optional[DeviceModel] = None,
             fitted: Optional[float] = None) -> str:
  """The rows of `rows` as a markdown table, the estimates labelled
  (`fitted`: the fit's captured-kernel cost, where `model` assumes
  another)."""
  gpu = platform == 'gpu'
  columns = ['program', 'part'] + (
      ['host launches', 'kernels', 'command buffers'] if gpu else
      ['HLO ops']) + (['GB'] if gpu else [
          'HBM GB', 'counted GB', 'counted excess GB']) + (
              ['estimated ms', 'measured ms', 'estimated / measured']
              if gpu else [])
  body = []
  for r in table:
    cells = [r['program'], r['part']] + ([
        _n(r['launches']), _n(r['kernels']), _n(r['command_buffers'])] if gpu
        else [_n(r['kernels'])]) + [f"{r['gb']:.2f}"]
    if not gpu:
      counted = r.get('counted_gb')
      cells += ['-', '-'] if counted is None else [
          f'{counted:.2f}', f"{counted - r['gb']:.2f}"]
    if gpu:
      cells += [report.fmt(r['estimated_ms']), report.fmt(r['measured_ms']),
                report.fmt(r['ratio'])]
    body.append(cells)
  if not gpu:
    note = ("Per iteration of each program's main while loop, per device, "
            "estimated from the loop body's optimized HLO (host launches, "
            'kernels and command buffers are a GPU notion and are not '
            'counted). HBM GB: what moves to or from HBM, the figure to set '
            'against a floor of weights + K/V read (operands and results in '
            'VMEM stay on chip; an async copy between HBM and VMEM moves its '
            "bytes once). Counted GB: what XLA's TPU cost analysis counts "
            'for the same ops (every operand and result, VMEM too; an async '
            'copy at its start and its done); counted excess: the '
            'difference, a counting artefact, not HBM traffic.')
  elif model is None:
    note = ("Per iteration of each program's main while loop; no device "
            'model is fitted for this GPU, so no time is estimated.')
  else:
    note = (
        "Per iteration of each program's main while loop. Estimated ms: "
        f'{ESTIMATE}, not measured: per part max(GB / '
        f'{model.bandwidth / 1e12:.3g} TB/s, host launches x '
        f'{model.launch_us:.3g} us + captured kernels x '
        f'{model.captured_us:.3g} us), summed over the parts.' + (
            '' if fitted is None or fitted == model.captured_us else
            f' The captured kernels\' {model.captured_us:.3g} us is '
            f'assumed (--captured_us), not fitted (the fit: '
            f'{fitted:.3g} us).'))
  return note + '\n\n' + report.table(columns, body) + '\n'


def _n(x: float) -> str:
  return f'{x:,.0f}' if float(x).is_integer() else f'{x:,.1f}'


def report_iterations(lower: Callable[..., Any], platform: str,
                      names: Optional[Sequence[str]], device: str,
                      captured_us: Optional[float] = None,
                      options: Optional[Mapping[str, Any]] = None) -> str:
  """The per-iteration table of programs compiled for a compile-only
  target (`python -m specdec_jax.compiled --iterations`).

  Args:
    lower: (program name, **`Setup` fields) -> its `jax.stages.Lowered`.
    platform: 'gpu' or 'tpu'.
    names: the programs to lower with the command's setup, or None: the
      programs the stored device model was fitted to, each with its own
      setup and its measured ms (a device with no model of its own: the
      H100's programs, with no measured ms).
    device: the target chip's name, e.g. 'NVIDIA H100 80GB HBM3': its
      stored device model estimates the times (GPU).
    captured_us: the cost of a kernel inside a command buffer the
      estimates assume (None: the fitted one).
    options: XLA options to compile with (`compile_iteration`; on a GPU
      over `UNTUNED_OPTIONS`), named in a note under the table.

  Returns:
    A markdown text: the table (`markdown`) and what each row compiled.
  """
  path = MODEL_DIR / f'{report.device_name(device)}.json'
  stored = load_model(path.stem) if path.is_file() else None
  model = stored['model'] if stored and platform == 'gpu' else None
  if model is not None and captured_us is not None:
    model = dataclasses.replace(model, captured_us=captured_us)
  if names is None:
    # The programs a device model was fitted to: this device's, else the
    # H100's (their setups hold on any target; the measured ms only on the
    # device that measured them).
    fitted = stored or load_model()
    todo = [(p['label'], p['program'], p['setup'],
             measured_ms(p) if stored else None) for p in fitted['programs']]
  else:
    todo = [(n, n, {}, None) for n in names]
  found = []
  for label, name, setup, measured in todo:
    found.append((label, compile_iteration(lower(name, **setup), platform,
                                           options), measured))
  chosen = {'every program compiled with the XLA options '
            f'{compile_options(platform, options)}'} if options else set()
  notes = sorted({f'{label}: {n}' for label, it, _ in found
                  for n in it.notes} | chosen | {
                      f'{label}: the whole program accesses '
                      f'{it.program_bytes / 1e9:.2f} GB (cost_analysis, a '
                      'loop body counted once)' + (
                          f'; its ops counted as in the table: '
                          f'{it.program_counted / 1e9:.2f} GB'
                          if it.program_counted else '')
                      for label, it, _ in found if it.program_bytes})
  found_breakdown = [(label, it) for label, it, _ in found if it.breakdown]
  fit = stored['model'].captured_us if model is not None else None
  return markdown(rows(found, model), platform, model, fit) + ''.join(
      f'\n- {n}' for n in notes) + ('\n' if notes else '') + (
          '\n' + breakdown_markdown(found_breakdown)
          if found_breakdown else '')


_KIND_LABELS = {
    'invariant': 'HBM: loop invariants read (weights, cross-attention K/V)',
    'state': 'HBM: loop state read (K/V caches, tokens)',
    'temporary': 'HBM: values made in the iteration read',
    'written': 'HBM: written'}


def breakdown_markdown(found: Sequence[Tuple[str, Iteration]]) -> str:
  """Per iteration of each program (label, its TPU `Iteration`): the HBM
  GB by kind, their sum (floor-relevant), and the cost analysis's counted
  excess by cause (labelled: not HBM traffic)."""
  labels = [_KIND_LABELS[k] for k in HBM_KINDS] + [
      'HBM: all (floor-relevant)'] + list(EXCESS) + [
          'counted by the cost analysis']
  body = []
  for label in labels:
    cells = [label]
    for _, it in found:
      b = it.breakdown
      hbm = sum(b[k] for k in HBM_KINDS)
      value = {'HBM: all (floor-relevant)': hbm,
               'counted by the cost analysis': hbm + sum(
                   b[k] for k in EXCESS)}.get(label)
      if value is None:
        value = b[next((k for k, v in _KIND_LABELS.items() if v == label),
                       label)]
      cells.append(f'{value / 1e9:.3f}')
    body.append(cells)
  kinds = []
  for label, it in found:
    for kind, (n, hbm, counted) in sorted(it.kinds.items(),
                                          key=lambda kv: -kv[1][2]):
      if max(counted, hbm) >= 5e5:  # the kinds that move 1 MB or more
        kinds.append([label, kind, _n(n), f'{hbm / 1e9:.3f}',
                      f'{counted / 1e9:.3f}', f'{(counted - hbm) / 1e9:.3f}'])
  return ('GB per iteration and device: what moves to or from HBM, by '
          "kind, and the excess XLA's cost analysis counts over it, by "
          'cause (a counting artefact, not HBM traffic).\n\n' +
          report.table(['bytes'] + [label for label, _ in found], body) +
          '\n\nBy op kind (GB per iteration and device):\n\n' +
          report.table(['program', 'op kind', 'ops', 'HBM GB', 'counted GB',
                        'counted excess GB'], kinds) + '\n')


def main(argv: Optional[Sequence[str]] = None) -> None:
  """`python -m specdec_jax.program_cost`: refused in one line (exit status
  2) whatever its flags, naming the command that prints the table: this
  module has none of its own (--help: the module's summary)."""
  parser = argparse.ArgumentParser(
      prog='python -m specdec_jax.program_cost',
      description=__doc__.split('\n')[0])
  parser.parse_known_args(argv)  # --help: the summary
  parser.error('no command line of its own: the table is python -m '
               'specdec_jax.compiled --target=<target> --iterations '
               '(docs/tpu.md)')


if __name__ == '__main__':
  main()
