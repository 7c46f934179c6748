"""Partitioning like T5X: a ('data', 'model') mesh and logical axis rules.

Parameters carry T5X's logical axis names (`network.T5Model.param_axes`);
`standard_logical_axis_rules` maps them to mesh axes as T5X's rules of the
same name do (heads, mlp, vocab, joined_kv over 'model'; batch over 'data';
embed, kv, relpos_buckets replicated). Nothing here schedules anything: the
decoders' existing jitted programs run on sharded inputs and jax's SPMD
partitioner (GSPMD) inserts the collectives. `ShardedModel` wraps a model so
that its decoder cache (self- and cross-attention keys/values) and its logits
are constrained to the same rules inside the jitted loop:

  partitioner = partitioning.Partitioner(num_partitions=4)   # 2 x 4 on 8
  model = partitioner.sharded_model(network.T5Model(config))
  params = partitioner.shard_params(params, model)
  inputs = partitioner.shard_batch(inputs)
  decoding.temperature_sample(model, params, inputs, max_decode_len=64)
  speculative.speculative_sample(model, params, drafters.T5Drafter(
      partitioner.sharded_model(draft_model)), draft_params, inputs, ...)

A mesh that does not fit (more partitions than devices, a mesh axis not
dividing heads / mlp / vocab / the batch) raises ValueError naming the axis
and both sizes before anything is compiled (the batch: when the decoder is
traced, before it is compiled). Gin-free: the eval job binds `Partitioner`'s
knobs (T5X's names: num_partitions, model_parallel_submesh,
logical_axis_rules) from gin_configs/mesh/*.gin.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from flax import traverse_util
from flax.linen import partitioning as nn_partitioning
import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from specdec_jax import checks

Array = jax.Array
LogicalAxisRules = Tuple[Tuple[str, Optional[str]], ...]
MESH_AXES = ('data', 'model')

# Logical axes of the decoder cache's arrays, the logits and the final
# decoder states (T5X names).
CACHE_AXES = ('batch', 'length', 'heads', 'kv')
LOGITS_AXES = ('batch', 'length', 'vocab')
HIDDEN_AXES = ('batch', 'length', 'embed')


def standard_logical_axis_rules(
    activation_partitioning_dims: int = 1,
    parameter_partitioning_dims: int = 1,
    additional_rules: Sequence[Tuple[str, Optional[str]]] = (),
) -> LogicalAxisRules:
  """T5X's default rules (t5x/partitioning.py, same name and arguments).

  Args:
    activation_partitioning_dims: 1, or 2: 'embed' over 'model' as well.
    parameter_partitioning_dims: 1, or 2: 'embed' over 'data' as well.
    additional_rules: appended; the first rule naming an axis wins, so these
      only add axes (use `Partitioner.logical_axis_rules` to replace all).

  Returns:
    A tuple of (logical axis, mesh axis or None) pairs.
  """
  rules = [('batch', 'data'), ('vocab', 'model'), ('mlp', 'model'),
           ('heads', 'model'), ('kv', None), ('joined_kv', 'model')]
  dims = (activation_partitioning_dims, parameter_partitioning_dims)
  if dims == (1, 1):
    rules.insert(2, ('embed', None))
  elif dims == (2, 1):
    rules.append(('embed', 'model'))
  elif dims == (1, 2):
    rules.append(('embed', 'data'))
  elif dims == (2, 2):
    rules += [('embed', 'model'), ('embed', 'data')]
  else:
    raise checks.InputError(
        f'activation_partitioning_dims={activation_partitioning_dims}, '
        f'parameter_partitioning_dims={parameter_partitioning_dims} is not '
        'supported (1 or 2 each).')
  rules += [('relpos_buckets', None), ('abspos_buckets', None),
            ('length', None), ('layers', None), ('stack', None),
            ('mlp_activations', None)]
  return tuple(rules) + tuple(tuple(r) for r in additional_rules)


def data_parallel_rules() -> LogicalAxisRules:
  """Batch over 'data', everything else replicated (e.g. a small drafter)."""
  return (('batch', 'data'),)


def make_mesh(num_partitions: Optional[int] = None,
              model_parallel_submesh: Optional[Sequence[int]] = None,
              devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A ('data', 'model') mesh: `model` devices per partition, the rest data.

  Args:
    num_partitions: size of the 'model' axis (T5X's knob); default 1.
    model_parallel_submesh: T5X's alternative knob, a tuple of device counts
      (T5X: (x, y, z, cores) of a TPU slice); the 'model' axis gets their
      product. At most one of the two may be set.
    devices: the devices (default `jax.local_devices()`: this process's;
      in a multi-process eval each process decodes its own batches on its
      own mesh). Their order is kept, so the 'model' axis runs over
      neighbouring ids (cores of one chip / one host first).

  Returns:
    `Mesh(devices.reshape(data, model), ('data', 'model'))`.

  Raises:
    ValueError: both knobs set, a size < 1, more partitions than devices,
      or partitions not dividing the device count; names the sizes. No
      devices, one twice, or what is not a jax device.
  """
  if num_partitions is not None and model_parallel_submesh is not None:
    raise checks.InputError(
        'Set at most one of num_partitions and model_parallel_submesh '
        '(T5X: the submesh wins; here it is an error): got '
        f'{num_partitions} and {tuple(model_parallel_submesh)}.')
  if model_parallel_submesh is not None:
    if isinstance(model_parallel_submesh, str) or any(  # '22': not (2, 2)
        not checks.is_int(s) or s < 1 for s in model_parallel_submesh):
      raise checks.InputError(
          'model_parallel_submesh must be ints >= 1, e.g. (2, 2), got '
          f'{model_parallel_submesh!r}.')
    model = math.prod(int(s) for s in model_parallel_submesh)
  else:
    model = 1 if num_partitions is None else num_partitions
  checks.check_int('num_partitions', model)
  devices = list(jax.local_devices() if devices is None else devices)
  if not devices or len(set(devices)) < len(devices) or not all(
      isinstance(d, jax.Device) for d in devices):  # 'cpu:0' is no device
    raise checks.InputError(
        'devices must be distinct jax devices (jax.devices(), '
        f'jax.local_devices()), at least one; got {devices!r}.')
  if model > len(devices):
    raise checks.InputError(
        f"mesh axis 'model': num_partitions={model} is more partitions than "
        f'the {len(devices)} devices.')
  if len(devices) % model:
    raise checks.InputError(
        f"mesh axis 'model': num_partitions={model} does not divide the "
        f"{len(devices)} devices (the 'data' axis gets devices / "
        'num_partitions).')
  grid = np.asarray(devices, dtype=object).reshape(len(devices) // model,
                                                   model)
  return Mesh(grid, MESH_AXES)


def _spec(names: Sequence[Optional[str]], rules: LogicalAxisRules) -> P:
  return nn_partitioning.logical_to_mesh_axes(tuple(names), rules)


def _mesh_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  return math.prod(mesh.shape[a] for a in axes)


def _check_divides(shape, names, spec: P, mesh: Mesh, what: str) -> None:
  """ValueError unless each mesh axis divides the dimension it shards."""
  for size, name, axes in zip(shape, names, tuple(spec)):
    n = _mesh_size(mesh, axes)
    if size % n:
      raise checks.InputError(
          f'mesh axis {axes!r} (size {n}) does not divide logical axis '
          f'{name!r} (size {size}) of {what}: choose a mesh whose {axes!r} '
          f'axis divides {size} (or a rule replicating {name!r}).')


def logical_specs(model) -> Any:
  """The params tree of `model` with a tuple of logical names per leaf."""
  axes = nn_partitioning.get_axis_names(unwrap(model).param_axes())
  return jax.tree.map(tuple, axes, is_leaf=lambda x: isinstance(x, P))


def param_shardings(model, mesh: Mesh, rules: LogicalAxisRules) -> Any:
  """A `NamedSharding` per parameter of `model` (a `T5Model` or wrapper).

  Raises:
    ValueError: a mesh axis does not divide the dimension it would shard,
      naming the mesh axis, the logical axis, both sizes and the parameter.
  """
  model = unwrap(model)
  names = logical_specs(model)
  shapes = model.param_shapes()
  flat_names = traverse_util.flatten_dict(names, sep='/')
  flat_shapes = traverse_util.flatten_dict(shapes, sep='/')
  out = {}
  for key, shape in flat_shapes.items():
    spec = _spec(flat_names[key], rules)
    _check_divides(shape.shape, flat_names[key], spec, mesh,
                   f'parameter {key} {tuple(shape.shape)}')
    out[key] = NamedSharding(mesh, spec)
  return traverse_util.unflatten_dict(out, sep='/')


def shard_params(params, model, mesh: Mesh, rules: LogicalAxisRules):
  """`params` placed on `mesh` by `rules` (each device gets its shard);
  InputError unless they are `model`'s (`T5Model.check_params`: params of
  another config were placed, or failed in jax as indivisible)."""
  shardings = param_shardings(model, mesh, rules)  # the model fits first
  unwrap(model).check_params(params, source='params')
  return jax.tree.map(jax.device_put, params, shardings)


def replicate(tree, mesh: Mesh):
  """Every leaf of `tree` replicated on all devices of `mesh` (a leaf
  replicated there already is kept: the same array, not a copy)."""
  everywhere = NamedSharding(mesh, P())
  kept = lambda x: (isinstance(x, jax.Array) and isinstance(
      x.sharding, NamedSharding) and x.sharding.mesh == mesh and
                    x.sharding.is_equivalent_to(everywhere, x.ndim))
  return jax.tree.map(
      lambda x: x if kept(x) else jax.device_put(x, everywhere), tree)


def batch_sharding(mesh: Mesh, rules: LogicalAxisRules, ndim: int = 2
                   ) -> NamedSharding:
  """`[batch, ...]` arrays: batch by the rules' 'batch' axis, rest whole."""
  return NamedSharding(mesh, _spec(('batch',) + (None,) * (ndim - 1), rules))


def shard_batch(tokens, mesh: Mesh, rules: LogicalAxisRules):
  """`[batch, length]` ids placed with the batch over the 'data' axis."""
  tokens = np.asarray(tokens, np.int32) if not isinstance(
      tokens, jax.Array) else tokens
  sharding = batch_sharding(mesh, rules, np.ndim(tokens))
  _check_divides(np.shape(tokens), ('batch',) + (None,) * (
      np.ndim(tokens) - 1), sharding.spec, mesh, 'the input batch')
  return jax.device_put(tokens, sharding)


def constrain(x: Array, names: Sequence[Optional[str]], mesh: Mesh,
              rules: LogicalAxisRules, what: str = 'an activation') -> Array:
  """`with_sharding_constraint` of x by logical names (checked to divide)."""
  spec = _spec(names, rules)
  _check_divides(x.shape, names, spec, mesh, what)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def unwrap(model):
  """The model a `ShardedModel` wraps (any other model as is)."""
  return model.model if isinstance(model, ShardedModel) else model


def batch_multiple(model) -> int:
  """The parts a `ShardedModel` splits every batch it sees into (the mesh
  axes logical 'batch' maps to under its rules); 1 for any other model."""
  if not isinstance(model, ShardedModel):
    return 1
  return _mesh_size(model.mesh, tuple(_spec(('batch',), model.rules))[0])


@dataclasses.dataclass(frozen=True)
class ShardedModel:
  """A decoding model whose cache and logits follow the mesh's rules.

  The same `interfaces.DecodingModel` as the wrapped one (it forwards every
  other attribute), so `decoding.temperature_sample`,
  `speculative.speculative_sample`, the streaming loops and every drafter
  kind take it as is (the self-drafting kinds' target too).
  Inside their jitted loop, `init_cache` and `extend` constrain the cache's
  keys/values `[batch, length, heads, head_dim]` to (batch -> 'data', heads
  -> 'model'), `encoder_mask` / `position` to the batch axis, and the logits
  `[batch, k, vocab]` to (batch, vocab -> 'model') under T5X's rules: the
  loop-carried cache then keeps the parameters' layout, and the sampling and
  accept/reject bookkeeping run on the batch axis. Hashable (mesh and rules
  are), so compiled programs are cached per mesh.
  """

  model: Any
  mesh: Mesh
  rules: LogicalAxisRules

  def __getattr__(self, name):
    if name in ('model', 'mesh', 'rules'):  # Not yet set (copy / pickle).
      raise AttributeError(name)
    return getattr(self.model, name)

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  # The contract's members on the class itself: from Python 3.12 an
  # isinstance check of a runtime-checkable Protocol reads attributes
  # statically, past `__getattr__` (`decoding.check_is`).
  def check_params(self, params) -> None:
    self.model.check_params(params)

  def logits(self, *args, **kwargs):
    return self.model.logits(*args, **kwargs)

  def _cache_axes(self, cache):
    """(logical names, what) per leaf of a `network.DecoderCache`."""
    kv = lambda kind: (CACHE_AXES, f'the {kind}-attention cache')
    return cache.replace(
        self_key=tuple(kv('self') for _ in cache.self_key),
        self_value=tuple(kv('self') for _ in cache.self_value),
        cross_key=tuple(kv('cross') for _ in cache.cross_key),
        cross_value=tuple(kv('cross') for _ in cache.cross_value),
        encoder_mask=(('batch', 'length'), 'the encoder mask'),
        position=(('batch',), 'the cache positions'),
        pending=None if cache.pending is None else cache.pending.replace(
            source=(('batch', None), 'the slots a pending move reads'),
            start=(('batch',), 'where a pending move writes')))

  def cache_shardings(self, cache):
    """A `NamedSharding` per array of `cache` (arrays or abstract shapes)."""
    return jax.tree.map(
        lambda x, a: NamedSharding(self.mesh, _spec(a[0], self.rules)),
        cache, self._cache_axes(cache))

  def _constrain_cache(self, cache):
    return jax.tree.map(
        lambda x, a: constrain(x, a[0], self.mesh, self.rules, a[1]),
        cache, self._cache_axes(cache))

  def init_cache(self, params, encoder_input_tokens, max_length: int):
    encoder_input_tokens = constrain(
        encoder_input_tokens, ('batch', 'length'), self.mesh, self.rules,
        'the input batch')
    return self._constrain_cache(
        self.model.init_cache(params, encoder_input_tokens, max_length))

  def extend(self, params, tokens, cache, *args, return_hidden=False,
             **options):
    """The model's `extend` (`args`, `options`: its other arguments, e.g.
    PaSS's look-ahead slots or a `tree`); with `return_hidden` (a keyword)
    `((logits, hidden), cache)`, the final states batch over 'data'."""
    if return_hidden:
      options['return_hidden'] = True
    out, cache = self.model.extend(params, tokens, cache, *args, **options)
    logits = constrain(out[0] if return_hidden else out, LOGITS_AXES,
                       self.mesh, self.rules, 'the logits')
    if return_hidden:
      logits = (logits, constrain(out[1], HIDDEN_AXES, self.mesh, self.rules,
                                  'the final states'))
    return logits, self._constrain_cache(cache)


class Partitioner:
  """T5X's partitioner knobs -> a mesh, its rules and the helpers above.

  Args (T5X's names, bound in gin_configs/mesh/*.gin):
    num_partitions: size of the 'model' axis (default 1: data parallel).
    model_parallel_submesh: alternative to num_partitions (see `make_mesh`).
    logical_axis_rules: the rules (default `standard_logical_axis_rules()`).
    devices: default `jax.local_devices()` (a multi-host eval: data
      parallel over hosts, model parallel within each).
    global_mesh: the mesh holds every process's devices (`jax.devices()`,
      T5X's mesh), instead of `devices`: one program over all hosts, for a
      model too large for one host's devices; every process then places
      the same whole arrays and makes the same calls (`spans_processes`).

  Besides the mesh, what a job needs to run on it whatever it spans:
  `shard_batch` (inputs in) and `agree` (a decision every process takes
  alike; outputs come out through `to_host`); `OneDevice` has the same
  two for a job without a mesh.
  """

  def __init__(self, num_partitions: Optional[int] = None,
               model_parallel_submesh: Optional[Sequence[int]] = None,
               logical_axis_rules: Optional[Sequence[Tuple[str, Optional[
                   str]]]] = None,
               devices: Optional[Sequence[Any]] = None,
               global_mesh: bool = False):
    if global_mesh and devices is not None:
      raise checks.InputError(
          'Pass devices or global_mesh=True, not both (the global mesh is '
          'all of jax.devices()).')
    self.mesh = make_mesh(num_partitions, model_parallel_submesh,
                          jax.devices() if global_mesh else devices)
    rules = (standard_logical_axis_rules() if logical_axis_rules is None
             else logical_axis_rules)
    self.rules: LogicalAxisRules = tuple(
        tuple(r) if isinstance(r, (tuple, list)) else (r,) for r in rules)
    for rule in self.rules:  # a string would be split into characters
      if len(rule) != 2 or not isinstance(rule[0], str) or rule[1] not in (
          None, *self.mesh.axis_names):
        raise checks.InputError(
            'logical_axis_rules must be (logical axis, mesh axis of '
            f"{self.mesh.axis_names} or None) pairs, e.g. ('batch', "
            f"'data'); got {rule!r}.")

  @property
  def data_size(self) -> int:
    return self.mesh.shape['data']

  @property
  def model_size(self) -> int:
    return self.mesh.shape['model']

  def sharded_model(self, model, rules: Optional[LogicalAxisRules] = None
                    ) -> ShardedModel:
    """`model` wrapped for this mesh (rules: default this partitioner's)."""
    return ShardedModel(unwrap(model), self.mesh,
                        self.rules if rules is None else tuple(rules))

  def _rules_for(self, model, rules: Optional[LogicalAxisRules]
                 ) -> LogicalAxisRules:
    """`rules`, else a wrapped model's, else this partitioner's."""
    if rules is not None:
      return rules
    return model.rules if isinstance(model, ShardedModel) else self.rules

  def param_shardings(self, model, rules: Optional[LogicalAxisRules] = None):
    return param_shardings(model, self.mesh, self._rules_for(model, rules))

  def shard_params(self, params, model,
                   rules: Optional[LogicalAxisRules] = None):
    """`params` of `model` on the mesh (by `model`'s rules if wrapped)."""
    return shard_params(params, model, self.mesh,
                        self._rules_for(model, rules))

  @property
  def spans_processes(self) -> bool:
    """Whether the mesh holds devices of more than one process: then no
    process holds a decode's outputs whole, and every process must make
    the same calls in the same order (a collective waits for all)."""
    return len({d.process_index for d in self.mesh.devices.flat}) > 1

  def shard_batch(self, tokens):
    return shard_batch(tokens, self.mesh, self.rules)

  def agree(self, value):
    """Process 0's `value` (any picklable value) on every process where
    the mesh spans several (each must call it), else `value`: for the
    decisions made from a process's own clock (a gamma or tree chosen by
    timing), which would otherwise differ and make the processes compile
    and call different programs."""
    return agree(value) if self.spans_processes else value

  def replicate(self, tree):
    return replicate(tree, self.mesh)

  def replicate_sharing(self, tree, loaded, placed):
    """`tree` replicated on the mesh, but for the leaves that ARE leaves of
    `loaded` (the same arrays: the kinds that draft with the target hold
    its own params): those become `placed`'s leaves at the same positions
    (`loaded` as this mesh placed it), not a whole copy on every device."""
    shared = {id(x): y for x, y in zip(jax.tree.leaves(loaded),
                                       jax.tree.leaves(placed))}
    return jax.tree.map(
        lambda x: shared[id(x)] if id(x) in shared else self.replicate(x),
        tree)

  def __repr__(self):
    return (f'Partitioner(mesh={dict(self.mesh.shape)}, '
            f'rules={self.rules!r})')


class OneDevice:
  """A `Partitioner`'s job-facing side for a job without a mesh: inputs
  as they are, every decision this process's."""

  spans_processes = False

  def shard_batch(self, tokens):
    return tokens

  def agree(self, value):
    return value


def to_host(tree):
  """`tree` with each array whole on this host (numpy): read where this
  process holds it whole (or a replica of it), else gathered from every
  process (`multihost_utils.process_allgather`: on a mesh spanning
  processes every process must make the same reads, as it makes the same
  calls)."""
  def read(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return np.asarray(x)
    if x.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree.map(read, tree)


def agree(value):
  """Process 0's `value` on every process of a `jax.distributed` run
  (pickled; `multihost_utils.broadcast_one_to_all`: its length, then its
  bytes; every process must call it); `value` itself in a run of one
  process."""
  if jax.process_count() == 1:
    return value
  data = np.frombuffer(pickle.dumps(value), np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
  padded = np.zeros(size, np.uint8)
  if jax.process_index() == 0:
    padded[:] = data
  return pickle.loads(bytes(np.asarray(
      multihost_utils.broadcast_one_to_all(padded))))


def gather(value) -> list:
  """Every process's `value`, in process order, on every process of a
  `jax.distributed` run (pickled; `multihost_utils.process_allgather`:
  their lengths, then their bytes padded to the longest; every process
  must call it); `[value]` in a run of one process."""
  if jax.process_count() == 1:
    return [value]
  data = np.frombuffer(pickle.dumps(value), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(data.size)))
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:data.size] = data
  every = np.asarray(multihost_utils.process_allgather(padded))
  return [pickle.loads(bytes(row[:n])) for row, n in zip(every, sizes)]


KINDS = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all',
         'collective-permute')
_COLLECTIVE = re.compile(
    r'=\s*(.*?)\s(all-reduce|all-gather|reduce-scatter|all-to-all|'
    r'collective-permute)(?:-start)?\(')
_GROUPS = re.compile(
    r'replica_groups=('
    r'\{\{[^}]*\}'                        # {{0,1,2,3},{4,5,6,7}}
    r'|\[\d+,\d+\]<='                      # [2,4]<=[8]
    r"|mesh\[[^\]]*\][^{\n]*\{[^}]*\})")   # mesh['axis_0'=4,...] {'axis_0'}


def _group_size(groups: str) -> int:
  if groups.startswith('{{'):  # The first group's size.
    return len(groups[2:].split(','))
  if groups.startswith('['):  # Iota: [number of groups, size]<=[devices].
    return int(groups[1:].split(',')[1].split(']')[0])
  # Mesh form: the product of the sizes of the axes in braces.
  sizes = dict((a, int(n)) for a, n in re.findall(r"'(\w+)'=(\d+)", groups))
  chosen = re.findall(r"'(\w+)'", groups[groups.rindex('{'):])
  return math.prod(sizes[a] for a in chosen)


def list_collectives(hlo_text: str) -> List[Dict[str, Any]]:
  """Each collective instruction of an HLO module's text, in order.

  Returns:
    [{'kind': 'all-reduce', 'group_size': 4 (devices per replica group;
    None if not printed), 'result': 'f32[2,5,32]{2,1,0}'}, ...]: XLA's three
    forms of `replica_groups` are read (explicit lists, iota
    `[groups,size]<=[n]`, named mesh axes). On a ('data', 'model') mesh a
    collective over 'model' has groups of the 'model' axis' size.
  """
  out = []
  for line in hlo_text.splitlines():
    m = _COLLECTIVE.search(line)
    if not m:
      continue
    g = _GROUPS.search(line)
    out.append({'kind': m.group(2), 'result': m.group(1),
                'group_size': _group_size(g.group(1)) if g else None})
  return out


def count_collectives(hlo_text: str) -> Dict[str, int]:
  """Collective instructions in an HLO module's text, by kind (static count).

  An instruction inside a while loop's body counts once, i.e. once per
  iteration; async pairs (`all-reduce-start` / `-done`) count once.
  """
  counts = {k: 0 for k in KINDS}
  for c in list_collectives(hlo_text):
    counts[c['kind']] += 1
  return counts


def collective_group_sizes(hlo_text: str) -> Dict[str, list]:
  """{kind: sorted distinct replica group sizes} (`list_collectives`)."""
  sizes: Dict[str, set] = {}
  for c in list_collectives(hlo_text):
    sizes.setdefault(c['kind'], set()).add(c['group_size'])
  return {k: sorted(v, key=lambda x: -1 if x is None else x)
          for k, v in sizes.items()}


_COMPUTATION = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$')
_CALLED = re.compile(
    r'\b(?:body|condition|to_apply|calls|branch_computations)='
    r'(?:\{([^}]*)\}|(%?[\w.\-]+))')


def loop_collectives(hlo_text: str) -> Dict[str, int]:
  """Collectives inside while loops' bodies (and what they call), by kind.

  `count_collectives` of the whole program also counts what runs once
  (e.g. the encoder); this counts one iteration of every loop.
  """
  computations = _computation_lines(hlo_text)
  def called(lines, key=None):
    out = []
    for line in lines:
      for m in _CALLED.finditer(line):
        if key is None or m.group(0).startswith(key):
          names = m.group(1) if m.group(1) is not None else m.group(2)
          out += [c.strip().lstrip('%') for c in names.split(',')]
    return out
  todo = [c for lines in computations.values() for c in called(
      [l for l in lines if ' while(' in l], 'body')]
  seen = set()
  while todo:
    c = todo.pop()
    if c in seen or c not in computations:
      continue
    seen.add(c)
    todo += called(computations[c])
  return count_collectives('\n'.join(
      l for c in seen for l in computations[c]))


def shard_shapes(tree) -> Dict[str, Tuple[Tuple[int, ...], ...]]:
  """{'a/b': (shape of each device's shard, ...)} of a tree of jax arrays."""
  flat = traverse_util.flatten_dict(tree, sep='/')
  return {k: tuple(tuple(s.data.shape) for s in v.addressable_shards)
          for k, v in flat.items()}


# What a while body must not do to a weight it only reads.
REWRITES = ('concatenate', 'convert', 'copy', 'transpose', 'slice')
_INSTRUCTION = re.compile(
    r'^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$')
_ARRAY = re.compile(r'\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]')
_BITS = {'pred': 8, 's4': 4, 'u4': 4}


def _array_bytes(hlo_type: str) -> int:
  """Bytes of an HLO type's arrays (a tuple's summed): 'bf16[4,8]{1,0}'."""
  total = 0
  for dtype, dims in _ARRAY.findall(hlo_type):
    bits = _BITS.get(dtype) or int(re.sub(r'\D.*', '', re.sub(
        r'^[a-z]+', '', dtype)) or 8)
    total += math.prod(int(d) for d in dims.split(',') if d) * bits // 8
  return total


def _computation_lines(hlo_text: str) -> Dict[str, List[str]]:
  """{computation name: its lines} of an HLO module's text."""
  computations, name = {}, None
  for line in hlo_text.splitlines():
    m = _COMPUTATION.match(line)
    if m:
      name = m.group(1)
      computations[name] = []
    elif line.startswith('}'):
      name = None
    elif name is not None:
      computations[name].append(line)
  return computations


def _instructions(hlo_text: str) -> Dict[str, List[Dict[str, Any]]]:
  """{computation: [{'name', 'type', 'op', 'operands', 'args', 'attrs'}]} of an
  HLO module's text, each computation's instructions in text order (an
  order in which every operand comes first)."""
  out = {}
  for name, lines in _computation_lines(hlo_text).items():
    out[name] = []
    for line in lines:
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      rest, depth = m.group(4), 1
      for end, ch in enumerate(rest):
        depth += {'(': 1, ')': -1}.get(ch, 0)
        if depth == 0:
          break
      out[name].append({
          'name': m.group(1), 'type': m.group(2), 'op': m.group(3),
          'operands': re.findall(r'%([\w.\-]+)', rest[:end]),
          'args': rest[:end], 'attrs': rest[end + 1:]})
  return out


def _called(attrs: str, key: str) -> List[str]:
  """The computations an instruction's attribute `key` names."""
  m = re.search(rf'\b{key}=(?:\{{([^}}]*)\}}|%?([\w.\-]+))', attrs)
  if not m:
    return []
  names = m.group(1) if m.group(1) is not None else m.group(2)
  return [c.strip().lstrip('%') for c in names.split(',') if c.strip()]


def loop_weight_rewrites(hlo_text: str, min_bytes: int = 1
                         ) -> List[Dict[str, Any]]:
  """Weights a while loop rewrites on every iteration, in a compiled HLO.

  A value a loop only reads (a tuple element its body returns as it got
  it: the weights, and whatever else is loop-invariant) costs its bytes
  once per read. Rewriting it inside the body, a `REWRITES` op (or a
  fusion holding one) whose operands all derive from such values and
  constants, costs a write and a read more on every iteration: e.g. a
  compiler joining two weights of matmuls that share an input, or a
  weight converted to float32 for each call. Those are what this lists:
  work the program could have done once, before the loop. Nested loops,
  conditionals and calls inside a body are followed, with what is
  invariant in the outer loop still invariant inside them.

  Args:
    hlo_text: `compiled.as_text()` (an optimized HLO module).
    min_bytes: smallest output to report (e.g. to skip scalar copies).

  Returns:
    [{'op': opcode (a fusion's: 'fusion:<rewrites inside>'), 'name',
    'type', 'bytes', 'computation', 'op_name': the jax op it came from,
    if recorded}], each instruction once.
  """
  return _InvarianceWalk(hlo_text, min_bytes).rewrites()


class _InvarianceWalk:
  """`loop_weight_rewrites`' walk: which values of each computation derive
  from loop invariants ('w'), from constants only ('c') or vary (None)."""

  # Attributes naming the computations an instruction calls.
  CALLEE_KEYS = ('body', 'condition', 'calls', 'to_apply',
                 'branch_computations', 'true_computation',
                 'false_computation')

  def __init__(self, hlo_text: str, min_bytes: int):
    self.comps = _instructions(hlo_text)
    self.min_bytes = min_bytes
    self.inside: Dict[str, set] = {}
    self.found: Dict[Tuple[str, str], Dict[str, Any]] = {}

  def rewrites(self) -> List[Dict[str, Any]]:
    callees = {c for lines in self.comps.values() for ins in lines
               for key in self.CALLEE_KEYS
               for c in _called(ins['attrs'], key)}
    for name in self.comps:
      if name not in callees:  # the entry (and anything nothing calls)
        self.run(name, None, False)
    return list(self.found.values())

  def ops_of(self, name):
    """Opcodes of a computation and of what it calls."""
    if name not in self.inside:
      self.inside[name] = set()
      for ins in self.comps.get(name, []):
        self.inside[name].add(ins['op'])
        for key in ('calls', 'to_apply'):
          for c in _called(ins['attrs'], key):
            self.inside[name] |= self.ops_of(c)
    return self.inside[name]

  def body_params(self, body):
    """What the body's parameter holds: 'w' (invariant) where the body
    returns the element unchanged, else None (varying)."""
    lines = self.comps.get(body, [])
    param = next((i['name'] for i in lines if i['op'] == 'parameter'), None)
    gte = {i['name']: int(re.search(r'index=(\d+)', i['attrs']).group(1))
           for i in lines if i['op'] == 'get-tuple-element'
           and i['operands'] == [param]}
    root = lines[-1] if lines else None
    if root is None or root['op'] != 'tuple':
      return None
    return ['w' if gte.get(o) == i else None
            for i, o in enumerate(root['operands'])]

  def run(self, name, params, in_loop, seen=()):
    """Propagates invariance through computation `name`; returns its
    root's value ('w': from invariants, 'c': constants only, None:
    varying; a list for a tuple)."""
    if name in seen:
      return None
    seen = seen + (name,)
    value: Dict[str, Any] = {}
    last = None
    for ins in self.comps.get(name, []):
      v = self.value(ins, [value.get(o) for o in ins['operands']], params,
                     in_loop, seen)
      value[ins['name']] = last = v
      if in_loop and v == 'w':
        self.note(name, ins)
    return last

  def value(self, ins, args, params, in_loop, seen):
    """One instruction's value from its operands' (following the
    computations it runs)."""
    op = ins['op']
    if op == 'parameter':
      k = int(ins['args'])
      return params[k] if params and k < len(params) else None
    if op in ('constant', 'iota'):
      return 'c'
    if op == 'get-tuple-element':
      i = int(re.search(r'index=(\d+)', ins['attrs']).group(1))
      return args[0][i] if isinstance(args[0], list) and i < len(
          args[0]) else (args[0] if not isinstance(args[0], list) else None)
    if op == 'tuple':
      return args
    if op == 'while':
      for b in _called(ins['attrs'], 'body'):
        self.run(b, [self.body_params(b)], True, seen)
      return None
    if op == 'conditional':
      branches = (_called(ins['attrs'], 'branch_computations') or
                  _called(ins['attrs'], 'true_computation') +
                  _called(ins['attrs'], 'false_computation'))
      for b, arg in zip(branches, args[1:]):
        self.run(b, [arg], in_loop, seen)
      return None
    if op == 'call':
      v = None
      for c in _called(ins['attrs'], 'to_apply'):
        v = self.run(c, args, in_loop, seen)
      return v
    if op.startswith('rng') or any(
        a is None or isinstance(a, list) for a in args):
      return None
    return 'w' if 'w' in args else 'c'

  def note(self, name, ins):
    """Records `ins` (of computation `name`, in a loop, from invariants)
    where it rewrites: a `REWRITES` op, or a fusion holding one."""
    op = ins['op']
    hits = ([op] if op in REWRITES else sorted(
        set(REWRITES) & set().union(*[self.ops_of(c) for c in _called(
            ins['attrs'], 'calls')])) if op == 'fusion' else [])
    nbytes = _array_bytes(ins['type'])
    if hits and nbytes >= self.min_bytes:
      where = re.search(r'op_name="([^"]*)"', ins['attrs'])
      self.found[(name, ins['name'])] = {
          'op': op if op in REWRITES else 'fusion:' + ','.join(hits),
          'name': ins['name'], 'type': ins['type'], 'bytes': nbytes,
          'computation': name,
          'op_name': where.group(1) if where else None}
