"""What an evaluation decodes, as one typed value, and how it is loaded.

`EvalSetup` is the eval job's configuration (gin configures it, as T5X
configures `DatasetConfig` / `RestoreCheckpointConfig`): the target, the
task and how to decode, with what is decoded grouped in a `DataSpec` (T5X's
`DatasetConfig`), the drafter in a `DrafterSpec` and the batching in a
`BatchSpec`. Building one checks everything that can
be checked without loading (gamma, sampling, vocabularies, the drafter kind,
widening), so a bad configuration fails before any work. `build(setup)`
loads it: the task, the target (checkpoint, then widening), the drafter (by
its kind in `drafters.KINDS`, from the one `DraftSource` its spec gives).
A `LoadCache` keeps what was loaded for the next setup of the same process
(a sweep's cells share a target, its drafters and a task split).

The eval job (eval.py), the reproduction code (experiments/) and the scripts
all go through here, so a setup means the same thing everywhere.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional
from typing import Tuple, Union

import jax
import jax.numpy as jnp

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import data
from specdec_jax import drafters as drafters_lib
from specdec_jax import network
from specdec_jax import output_cache
from specdec_jax import shipped
from specdec_jax import speculative
from specdec_jax import synthetic
from specdec_jax import tasks
from specdec_jax import widening
from specdec_jax.drafters.tree import shape as tree_shape
from specdec_jax import sampling as sampling_lib
from specdec_jax.sampling import SamplingConfig

_ACTIVATION_DTYPES = ('bfloat16', 'float16', 'float32')
BATCHINGS = ('stream', 'fixed')
BATCH_GAMMAS = ('profile', 'always', 'config')
_CHOOSE = 'choose:'  # DrafterSpec.tree: the job chooses the tree
_MOST_NODES = 256  # the largest tree 'choose:N' searches


def _kinds_that(has) -> list:
  """The kinds for which `has(kind)` holds (named in errors)."""
  return sorted(k for k, v in drafters_lib.KINDS.items() if has(v))


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
  """What drafts: a drafter kind and what it is built from.

  Gin binds it from DRAFTER, DRAFT_MODEL, DRAFT_CHECKPOINT, DRAFT_CONFIDENCE,
  TREE and OUTPUT_CACHE (gin_configs/runs/eval.gin), `widen_to` as
  `--gin.DrafterSpec.widen_to=...`. Building one checks the
  fields against the kind (`drafters.DrafterKind`); `source` turns it into
  the `drafters.DraftSource` a kind is built from.

  Attributes:
    kind: a kind in `drafters.KINDS` (`python -m specdec_jax.drafters` lists
      them).
    config: `T5Config` of the draft model (kinds that need one).
    checkpoint: as `EvalSetup.target_checkpoint`, for the drafter (a draft
      model's, or the weights of a kind that reads its own: PaSS's
      embeddings, heads).
    confidence: adaptive draft lengths: 0 drafts gamma tokens every
      iteration; > 0 (e.g. 0.4) makes a model drafter stop where its most
      likely token is below this probability and a copying drafter stop
      where nothing matches (see `drafters.T5Drafter`); refused for a kind
      that drafts no adaptive lengths (`DrafterKind.reads_confidence`).
    tree: a token tree's shape, for kinds that draft trees (a
      `drafters.tree.shape.parse` spec, e.g. 'beam:4,2,8' or a
      'dynamic:...' shape of `drafters.tree.shape.best`); None: the kind's
      default (`drafters.tree.DEFAULT_TREE`). The setup's gamma is the depth
      of the tree used (at most the shape's). 'choose:N' (greedy only): the
      eval job chooses the tree of at most N nodes and gamma levels with
      the most tokens per second predicted on this machine, from the
      drafter's rank probabilities on the baseline's outputs of the first
      examples and the call costs it measures (`unit_loop.choose_tree`,
      Sequoia's way); its choice is kept in gamma_choice.json.
    output_cache: for kinds that draft from an output cache: its file
      (`output_cache.OutputCache`), loaded (and checked against the target)
      when it exists, else created, seeded with the task's train pairs when
      it has a train split; the eval job appends every finished output to
      it, committed with each unit's records. None: the eval job keeps the
      run's cache in EVAL_OUTPUT_DIR (output_cache.npz, so a resumed run
      drafts from the same cache); `build` alone makes an in-memory one.
    widen_to: None, or, for kinds that need a draft model, a
      `widening.PRESETS` name (e.g. 't5_1_1_small_cost') or a dict of
      dimensions: the loaded draft model is widened function-preservingly
      to that size before drafting (`load_drafter`, as
      `EvalSetup.target_widen_to` widens the target): the same drafts at
      the cost of the bigger model.
  """
  kind: str = 't5'
  config: Optional[network.T5Config] = None
  checkpoint: Optional[str] = None
  confidence: float = 0.0
  tree: Optional[str] = None
  output_cache: Optional[str] = None
  widen_to: Optional[Union[str, Mapping[str, int]]] = None

  def __post_init__(self):
    kind = self.drafter_kind
    if isinstance(self.output_cache, os.PathLike):  # a path: its text
      object.__setattr__(self, 'output_cache', os.fspath(self.output_cache))
    for name, value in (('tree', self.tree),
                        ('output_cache', self.output_cache)):  # or None
      checks.check_type(name, value, (str, type(None)), 'a string (or None)')
    conf = self.confidence
    if not checks.is_number(conf) or not 0 <= conf < 1:
      raise checks.InputError(
          f'draft_confidence must be a number in [0, 1), got {conf!r}.')
    if conf and not kind.reads_confidence:
      raise checks.InputError(
          f'draft_confidence is set but drafter {self.kind!r} drafts no '
          'adaptive lengths (kinds that do: '
          f'{_kinds_that(lambda k: k.reads_confidence)}).')
    if self.tree is not None and not kind.reads_tree:
      raise checks.InputError(f'tree is set but drafter {self.kind!r} does not '
                              'draft trees (kinds that do: '
                              f'{_kinds_that(lambda k: k.reads_tree)}).')
    if kind.reads_tree:
      self.tree_shape  # pylint: disable=pointless-statement  (validates)
    if self.output_cache is not None and not kind.uses_cache:
      raise checks.InputError(f'output_cache is set but drafter {self.kind!r} '
                              'does not use one (kinds that do: '
                              f"{_kinds_that(lambda k: k.uses_cache)}).")
    if self.output_cache is not None:
      checkpoints.is_gcs(self.output_cache, 'output_cache')  # or refused
      if os.path.isdir(self.output_cache):
        raise checks.InputError(f'output_cache {self.output_cache!r} is a '
                                "folder: name the cache's file (.npz).")
    if kind.needs_model and self.config is None:
      raise checks.InputError(f'drafter={self.kind!r} needs DRAFT_MODEL (a '
                              'T5Config).')
    if self.config is not None:
      network.check_config(self.config, 'draft_config')
    if self.widen_to is not None:
      if not kind.needs_model:
        raise checks.InputError(
            f'widen_to is set but drafter {self.kind!r} has no draft model '
            'to widen (kinds that do: '
            f'{_kinds_that(lambda k: k.needs_model)}).')
      if isinstance(self.widen_to, Mapping):  # else refused as no size
        object.__setattr__(self, 'widen_to', dict(self.widen_to))
      self.decoding_config  # pylint: disable=pointless-statement  (validates)

  @property
  def drafter_kind(self) -> drafters_lib.DrafterKind:
    return drafters_lib.get_kind(self.kind)

  @property
  def decoding_config(self) -> network.T5Config:
    """The draft model's config as it drafts (widened if asked)."""
    if self.widen_to is None:
      return self.config
    return widening.widened_config(self.config, self.widen_to)

  @property
  def chooses_tree(self) -> bool:
    """Whether the job chooses the tree (tree 'choose:N')."""
    return self.tree is not None and self.tree.startswith(_CHOOSE)

  @property
  def tree_budget(self) -> int:
    """N of tree 'choose:N': the most nodes a chosen tree has."""
    text = self.tree[len(_CHOOSE):]
    if not text.isdigit() or not 1 <= int(text) <= _MOST_NODES:
      raise checks.InputError(
          f"tree {self.tree!r}: 'choose:N' takes N, the most nodes of the "
          f'tree to choose, 1 <= N <= {_MOST_NODES}.')
    return int(text)

  @property
  def built_tree(self) -> Optional[str]:
    """The tree the drafter is built with: one chosen later by the job
    (tree 'choose:N') is a chain of one draft until then."""
    if self.chooses_tree:
      self.tree_budget  # pylint: disable=pointless-statement  (validates)
      return 'chain:1'
    return self.tree

  @property
  def tree_shape(self) -> tree_shape.TreeShape:
    """The tree a tree-drafting kind grows (its default when unset)."""
    return tree_shape.parse(self.built_tree or
                            drafters_lib.tree.DEFAULT_TREE)

  def replace(self, **changes) -> 'DrafterSpec':
    return dataclasses.replace(self, **changes)

  def source(self, *, vocab_size: int, output_length: int, draft_model=None,
             draft_params=None, target=None, target_params=None,
             train_targets=None, train_pairs=None,
             store=None) -> drafters_lib.DraftSource:
    """The `DraftSource` its kind is built from: this spec with what was
    loaded for it (the draft model, the target, the task's train data, the
    output cache)."""
    return drafters_lib.DraftSource(
        vocab_size=vocab_size, draft_model=draft_model,
        draft_params=draft_params, train_targets=train_targets,
        target_model=target, target_params=target_params,
        train_pairs=train_pairs, output_cache=store,
        output_length=output_length, confidence=float(self.confidence),
        draft_checkpoint=(None if self.drafter_kind.needs_model else
                          self.checkpoint),
        tree=self.built_tree)


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  """How examples are batched, and gamma at batch > 1.

  Gin binds `size` from BATCH_SIZE and `mode` from BATCHING
  (gin_configs/runs/eval.gin); the rest as e.g.
  `--gin.BatchSpec.chunk=2`.

  Attributes:
    size: examples per decode call.
    mode: at size > 1, 'stream' (continuous batching: both decoders run
      `streaming.sample_stream` / `speculative_stream`, an ended row
      refilled with the next example inside the loop, over chunks of
      `chunk` batches' worth of examples) or 'fixed' (each batch runs until
      its slowest row ends: `decoding.temperature_sample` /
      `speculative.speculative_sample`). Batch 1 always decodes fixed.
    chunk: batches' worth of examples per streamed call (the unit that is
      timed, recorded and resumed; a drafter's output cache learns after
      each).
    gamma_rule: at size > 1 (where the slowest row sets the pace and cost(k)
      grows with the batch), 'profile' (default): the job chooses gamma for
      the batch from a hardware profile it measures first on this machine:
      cost(k) = t(k) / t(1) of the target at this batch for k = 1 ..
      max_gamma + 1, the drafter's c, and alpha from the first unit decoded
      (untimed, the compile warm-up) at the setup's gamma; gamma is the
      argmax of Theorem 3.8 with the measured cost(gamma + 1)
      (`hardware.predict`), or 0 (no speculation: the batch decodes
      with the baseline) where even the best is predicted slower than the
      baseline; written to gamma_choice.json and reused when the run
      resumes. Drafters with a merged loop (PaSS, heads, trees) keep the
      setup's gamma (their drafting rides on the target call; the chain
      formula does not price it). 'always': the same at every batch,
      batch 1 included (the paper's rule, gamma from alpha and the costs,
      on costs measured on this machine: a Table 2 row decoded at the gamma
      the rule picks). 'config': the setup's gamma at every batch. With
      'profile', batch 1 decodes with the setup's gamma.
    max_gamma: the largest gamma 'profile' may choose.
  """
  size: int = 1
  mode: str = 'stream'
  chunk: int = 4
  gamma_rule: str = 'profile'
  max_gamma: int = 8

  def __post_init__(self):
    checks.check_int('batch_size', self.size)
    if self.mode not in BATCHINGS:
      raise checks.InputError(f'batching must be one of {BATCHINGS}, got '
                              f'{self.mode!r}.')
    if self.gamma_rule not in BATCH_GAMMAS:
      raise checks.InputError(f'batch_gamma must be one of {BATCH_GAMMAS}, got '
                              f'{self.gamma_rule!r}.')
    checks.check_int('max_gamma', self.max_gamma)
    checks.check_int('stream_chunk', self.chunk)

  @property
  def streamed(self) -> bool:
    """Whether the job decodes with continuous batching (`mode`)."""
    return self.mode == 'stream' and self.size > 1

  @property
  def profile_gamma(self) -> bool:
    """Whether the job chooses gamma from a profile (`gamma_rule`)."""
    return self.gamma_rule == 'always' or (
        self.gamma_rule == 'profile' and self.size > 1)

  def replace(self, **changes) -> 'BatchSpec':
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """What the job decodes: T5X's `DatasetConfig`, for an eval.

  Gin binds the first four from MIXTURE_OR_TASK_NAME,
  TASK_FEATURE_LENGTHS, SPLIT and NUM_EXAMPLES
  (gin_configs/runs/eval.gin); the rest as e.g.
  `--gin.DataSpec.truncate_inputs=True`.

  Attributes:
    mixture_or_task_name: a registered seqio task (see tasks.py); a Debian
      task is read without seqio where data_dir stores its token ids.
    task_feature_lengths: {'inputs': N, 'targets': M}; M is the output
      length.
    split: the split to decode.
    num_examples: first N examples of the split (None = all).
    truncate_inputs: cut inputs longer than allowed instead of failing.
    eos_id: end-of-sequence id.
    data_dir: data folder of the offline Debian tasks (default:
      $SPECDEC_DATA_DIR or ~/.cache/specdec_jax/debian; 'shipped' = the
      shipped test slices, read without seqio: `tasks.array_task`).
  """
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  split: str = 'validation'
  num_examples: Optional[int] = None
  truncate_inputs: bool = False
  eos_id: int = 1
  data_dir: Optional[str] = None

  def __post_init__(self):
    if isinstance(self.data_dir, os.PathLike):  # a path: its text
      object.__setattr__(self, 'data_dir', os.fspath(self.data_dir))
    for name, value, kind, what in (
        ('mixture_or_task_name', self.mixture_or_task_name, str,
         'a task name'),
        ('split', self.split, str, "a split's name"),
        ('truncate_inputs', self.truncate_inputs, bool, 'True or False'),
        ('data_dir', self.data_dir, (str, type(None)), 'a path or None')):
      checks.check_type(name, value, kind, what)
    checks.check_feature_lengths(self.task_feature_lengths)
    object.__setattr__(self, 'task_feature_lengths',
                       dict(self.task_feature_lengths))
    if self.num_examples is not None:
      checks.check_int('num_examples', self.num_examples, 1, ' (or None: all)')


# The job's flat names of the groups' fields (gin macros, run.json, a
# sweep cell's changes, a results row): name -> (group, field).
GROUPED = {
    'drafter': ('draft', 'kind'), 'draft_config': ('draft', 'config'),
    'draft_checkpoint': ('draft', 'checkpoint'),
    'draft_confidence': ('draft', 'confidence'), 'tree': ('draft', 'tree'),
    'output_cache': ('draft', 'output_cache'),
    'draft_widen_to': ('draft', 'widen_to'),
    'batch_size': ('batch', 'size'), 'batching': ('batch', 'mode'),
    'stream_chunk': ('batch', 'chunk'), 'batch_gamma': ('batch', 'gamma_rule'),
    'max_gamma': ('batch', 'max_gamma'),
    **{f: ('sampling', f) for f in sampling_lib.FIELDS},
    **{f.name: ('data', f.name) for f in dataclasses.fields(DataSpec)},
}
# The `EvalSetup` fields that are groups.
_GROUPS = frozenset(group for group, _ in GROUPED.values())
# A gin file's binding of a grouped name on EvalSetup, and where it is
# bound now ('EvalSetup.data_dir' -> 'loading.DataSpec.data_dir').
_GROUP_GIN = {'draft': 'loading.DrafterSpec', 'batch': 'loading.BatchSpec',
              'sampling': 'sampling.SamplingConfig', 'data': 'loading.DataSpec'}
MOVED = {f'EvalSetup.{name}': f'{_GROUP_GIN[group]}.{field}'
         for name, (group, field) in GROUPED.items()}


@dataclasses.dataclass(frozen=True)
class EvalSetup:
  """One evaluation: target, drafter, task, decoding.

  Attributes:
    target_config: `network.T5Config` of the target.
    target_checkpoint: T5X checkpoint path (legacy or orbax, local or gs://),
      HF T5 folder, 'shipped:<name>' (the package's models), or None (random
      weights).
    data: the `DataSpec` (task, feature lengths, split, examples).
    gamma: drafts per iteration.
    draft: the `DrafterSpec` (kind, draft model, checkpoint, confidence,
      tree, output cache).
    batch: the `BatchSpec` (batch size, streamed or fixed, gamma at batch
      > 1).
    sampling: the `SamplingConfig` (temperature, 0 for greedy; topk, 0 =
      off; topp, 1.0 = off).
    seed: PRNG seed (random weights: target seed, drafter seed + 1; and
      sampling).
    target_widen_to: None, or a `widening.PRESETS` name (e.g.
      't5_1_1_base_cost') or a dict of dimensions: the loaded target is
      widened function-preservingly to that size before decoding (same
      outputs and alpha, the cost of the bigger model; see widening.py).
    activation_dtype: None (activations in the target config's dtype, as in
      T5X) or e.g. 'float32': the target (used by both decoders) runs its
      weights, rounded to its dtype, with activations in this dtype.
    same_shape_baseline: the baseline computes each step with the shapes of
      the speculative verification (`decoding.temperature_sample`
      block_size=gamma+1), so greedy outputs can be equal bit for bit in
      bfloat16 too; the baseline then pays cost(gamma+1) per token.

  `replace` and `flat` also speak the job's flat names of the groups'
  fields (`GROUPED`: drafter, tree, batch_size, batching, ...).
  """

  target_config: network.T5Config
  target_checkpoint: Optional[str]
  data: DataSpec
  gamma: int
  draft: DrafterSpec
  batch: BatchSpec = BatchSpec()
  sampling: SamplingConfig = SamplingConfig()
  seed: int = 0
  target_widen_to: Optional[Union[str, Mapping[str, int]]] = None
  activation_dtype: Optional[str] = None
  same_shape_baseline: bool = False

  def __post_init__(self):
    set_ = lambda k, v: object.__setattr__(self, k, v)
    for name, value, kind in (
        ('data', self.data, DataSpec), ('draft', self.draft, DrafterSpec),
        ('batch', self.batch, BatchSpec),
        ('sampling', self.sampling, SamplingConfig)):  # not a dict of them
      checks.check_type(name, value, kind, f'a {kind.__name__}')
    checks.check_type('same_shape_baseline', self.same_shape_baseline, bool,
                      'True or False')
    checks.check_int('seed', self.seed, 0)
    speculative.check_gamma(self.gamma)
    network.check_config(self.target_config, 'target_config')
    if self.same_shape_baseline and self.batch.streamed:
      raise checks.InputError(
          "same_shape_baseline needs batching='fixed' at batch_size > 1: the "
          'streamed baseline steps one token per row.')
    if self.draft.chooses_tree and not self.sampling.greedy:
      raise checks.InputError(
          f'tree {self.draft.tree!r} chooses a tree from the rank '
          'probabilities of greedy outputs: set temperature 0, or name a '
          'tree (e.g. beam:4,2,8).')
    if self.draft.drafter_kind.reads_tree and not self.draft.chooses_tree:
      shape = self.draft.tree_shape
      if self.gamma > shape.depth:
        raise checks.InputError(
            f'gamma {self.gamma} is deeper than the tree {shape.spec!r} '
            f'(depth {shape.depth}): set gamma <= {shape.depth} (the tree is '
            'cut to gamma levels).')
    if self.draft.drafter_kind.needs_model:  # its config is set (DrafterSpec)
      speculative.check_vocab(self.target_config.vocab_size,
                              self.draft.config.vocab_size)
    self.sampling.check_vocab(self.target_config.vocab_size)  # before loads
    checks.check_eos_id(self.data.eos_id, self.target_config.vocab_size)
    if self.activation_dtype is not None:
      try:
        name = jnp.dtype(self.activation_dtype).name
      except TypeError:
        name = None
      if name not in _ACTIVATION_DTYPES:
        raise checks.InputError(
            'activation_dtype must be None, bfloat16, float16 or float32, '
            f'got {self.activation_dtype!r}.')
      set_('activation_dtype', name)
    if self.target_widen_to is not None:
      if isinstance(self.target_widen_to, Mapping):  # else refused: no size
        set_('target_widen_to', dict(self.target_widen_to))
      self.decoding_config  # pylint: disable=pointless-statement

  @property
  def chooses_gamma(self) -> bool:
    """Whether the job chooses gamma from a profile it measures, as far as
    the setup says (`BatchSpec.profile_gamma`; not for a tree the job
    chooses). A drafter with a merged loop keeps its gamma too, which only
    the built drafter says (`unit_loop.chooses_gamma`)."""
    return self.batch.profile_gamma and not self.draft.chooses_tree

  @property
  def loaded_config(self) -> network.T5Config:
    """The target's config as its checkpoint holds it (+ activation dtype)."""
    if self.activation_dtype is None:
      return self.target_config
    return self.target_config.replace(activation_dtype=self.activation_dtype)

  @property
  def decoding_config(self) -> network.T5Config:
    """The config of the target both decoders run (widened if asked)."""
    if self.target_widen_to is None:
      return self.loaded_config
    return widening.widened_config(self.loaded_config, self.target_widen_to)

  def replace(self, **changes) -> 'EvalSetup':
    """The setup with fields changed: its own, or the groups' by their
    flat names (`GROUPED`, e.g. drafter='bigram', batch_size=8)."""
    groups: Dict[str, Dict[str, Any]] = {}
    own = {}
    for name, value in changes.items():
      if name in GROUPED:
        group, field = GROUPED[name]
        groups.setdefault(group, {})[field] = value
      else:
        own[name] = value
    for group, fields in groups.items():
      own[group] = dataclasses.replace(own.get(group, getattr(self, group)),
                                       **fields)
    return dataclasses.replace(self, **own)

  def flat(self) -> Dict[str, Any]:
    """Every field by its flat name: the setup's own (but the groups) and
    the groups' (`GROUPED`)."""
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
              if f.name not in _GROUPS}
    for name, (group, field) in GROUPED.items():
      fields[name] = getattr(getattr(self, group), field)
    return fields

  def baseline_fields(self) -> Dict[str, Any]:
    """What shapes its baseline decode: every field (`flat`) but the
    drafter's, and but gamma unless the baseline steps with gamma + 1
    tokens (`same_shape_baseline`). Setups with equal `baseline_fields`
    share one baseline decode in a job (`unit_loop.Lane`)."""
    fields = {name: value for name, value in self.flat().items()
              if GROUPED.get(name, ('',))[0] != 'draft'}
    if not self.same_shape_baseline:
      for name in ('gamma', 'batch_gamma', 'max_gamma'):
        fields.pop(name)
    return fields

  def settings(self) -> Dict[str, Any]:
    """The run's identity, as run.json holds it (a rerun must match it)."""
    draft, batch, sampling, dataset = (self.draft, self.batch,
                                       self.sampling, self.data)
    settings = dict(
        task=dataset.mixture_or_task_name, split=dataset.split,
        drafter=draft.kind, gamma=self.gamma, **sampling.settings(),
        batch_size=batch.size,
        num_examples=dataset.num_examples, seed=self.seed,
        target_checkpoint=str(self.target_checkpoint),
        draft_checkpoint=str(draft.checkpoint),
        target_widen_to=self.target_widen_to,
        task_feature_lengths=dict(dataset.task_feature_lengths))
    # Only when set, so that runs from before these options still resume.
    if self.activation_dtype is not None:
      settings['activation_dtype'] = self.activation_dtype
    if self.same_shape_baseline:
      settings['same_shape_baseline'] = True
    if draft.confidence:
      settings['draft_confidence'] = float(draft.confidence)
    if draft.tree is not None:
      settings['tree'] = draft.tree
    if draft.widen_to is not None:
      settings['draft_widen_to'] = draft.widen_to
    if batch.streamed:  # fixed batches: as before streaming existed
      settings['batching'] = 'stream'
      settings['stream_chunk'] = batch.chunk
    if batch.profile_gamma:
      settings['batch_gamma'] = batch.gamma_rule
      settings['max_gamma'] = batch.max_gamma
    return settings

  def describe(self) -> str:
    """One `name = value` line per field, the groups' by their flat names
    (the eval job's --dry_run)."""
    return '\n'.join(f'{k} = {v!r}' for k, v in self.flat().items())


@dataclasses.dataclass(frozen=True)
class Loaded:
  """An `EvalSetup` loaded: what the decoders are called with."""
  setup: EvalSetup
  task: Any  # a seqio.Task or a tasks.ArrayTask
  target: network.T5Model
  target_params: Any
  drafter: Any  # interfaces.Drafter
  draft_params: Any
  store: Any = None  # the output cache the drafter reads, if it reads one

  @property
  def vocabulary(self):
    return self.task.output_features['targets'].vocabulary


def setup_from_flags(args) -> EvalSetup:
  """The `EvalSetup` the gin files and bindings of parsed job flags give.

  Args:
    args: `gin_utils.parse_flags` flags (gin_file, gin_bindings,
      gin_search_paths) of an eval job.
  """
  import gin  # pylint: disable=g-import-not-at-top
  from specdec_jax import gin_utils  # pylint: disable=g-import-not-at-top

  gin_utils.configure(args, EvalSetup, 'gin_configs/paper/ende_t0_small.gin',
                      moved=MOVED)
  # Checks the setup (EvalSetup.__post_init__) before anything is loaded.
  return gin.get_configurable(EvalSetup)()


class LoadCache:
  """What was loaded, kept for the next setup loaded in this process.

  The cells of a sweep are eval jobs on setups that share a target
  checkpoint, a few drafters and a task split; each job would load them
  again (a T5 1.1-XXL checkpoint, a tokenized split). A cache passed to
  `build` / `read_examples` (the sweep runner keeps one per run) loads each
  once:
  - models (with their params) by what loads them: config, checkpoint
    (seed for random weights) and, for the target, its widening; at most
    `max_models`, the least recently used dropped first, so that the
    models of a sweep over several targets are not all held in memory;
  - the examples of a task split by task, data folder, split, feature
    lengths, count and truncation;
  - the drafters built from a task's train split alone (n-gram tables) by
    kind, task, data folder, vocabulary and train examples read.
  A model placed by shardings (a job on a mesh: the target, a draft model)
  is kept under them too: the jobs on one mesh share its placed arrays. An
  output cache is not kept: each job grows its own. Params are returned in
  fresh containers (the arrays are shared; nothing here writes into them).
  """

  def __init__(self, max_models: int = 3):
    checks.check_int('max_models', max_models)
    self.max_models = max_models
    self._models: collections.OrderedDict = collections.OrderedDict()
    self._examples: Dict[Hashable, List[Any]] = {}
    self._drafters: Dict[Hashable, Any] = {}
    self.loads = collections.Counter()  # key kind -> loads (not hits)

  def model(self, key: Hashable, load: Callable[[], Any]):
    """`(model, params)` kept under `key`, or `load()`-ed and kept."""
    if key in self._models:
      self._models.move_to_end(key)
    else:
      self.loads[key[0]] += 1
      self._models[key] = load()
      while len(self._models) > self.max_models:
        self._models.popitem(last=False)
    return _fresh_params(self._models[key])

  def examples(self, key: Hashable, read: Callable[[], List[Any]]):
    """The examples kept under `key`, or `read()` and kept (a list)."""
    if key not in self._examples:
      self.loads['examples'] += 1
      self._examples[key] = read()
    return list(self._examples[key])

  def drafter(self, key: Hashable, build: Callable[[], Any]):
    """`(drafter, params)` kept under `key`, or `build()`-ed and kept."""
    if key not in self._drafters:
      self.loads['drafter'] += 1
      self._drafters[key] = build()
    return _fresh_params(self._drafters[key])


def _fresh_params(kept: Tuple[Any, Any]) -> Tuple[Any, Any]:
  """`(model or drafter, params)` with the params in new containers (the
  same arrays): a caller that edits its tree leaves the kept one as is."""
  owner, params = kept
  return owner, jax.tree.map(lambda x: x, params)


def _weights_key(checkpoint: Optional[str], seed: int) -> Tuple[Any, Any]:
  """What a model's weights are read from: the checkpoint, or the seed of
  random weights."""
  if checkpoint is None:
    return None, seed
  return str(checkpoint), None


def _split_key(setup: EvalSetup, task) -> Tuple[Any, Any]:
  """Where a task split is read from: the task's name and its data folder
  (one name may be registered from several)."""
  return task.name, setup.data.data_dir


def load_model(config: network.T5Config, checkpoint: Optional[str],
               seed: int = 0, what: str = 'model', shardings=None,
               cache: Optional[LoadCache] = None):
  """(T5Model, params) of a checkpoint, or random weights when it is None.

  Args:
    config: the model's `T5Config`.
    checkpoint: a T5X checkpoint (legacy or orbax, local or gs://), an HF T5
      folder (with config.json), 'shipped:<name>', 'synthetic:seed=S' (the
      random weights of seed S) or 'synthetic:seed=S,noise=SIGMA' (a noisy
      copy of them: `synthetic`), or None.
    seed: PRNG seed of random weights.
    what: the model's role, named in errors ('target', 'draft').
    shardings: None, or a params tree of `jax.sharding.Sharding`s: the
      params are placed by them (a T5X checkpoint is restored straight into
      them, `checkpoints.load_t5x_params`; other sources load whole first).
    cache: a `LoadCache` that keeps the model (under its shardings), or
      None.
  """
  if cache is not None:
    key = ('model', config) + _weights_key(checkpoint, seed) + (
        _placement(shardings),)
    return cache.model(key, lambda: _read_model(config, checkpoint, seed, what,
                                                shardings))
  return _read_model(config, checkpoint, seed, what, shardings)


def _placement(shardings) -> Optional[Tuple[Any, ...]]:
  """A params tree of shardings as a key (None: not placed)."""
  return None if shardings is None else tuple(jax.tree.leaves(shardings))


def _checkpoint_path(checkpoint, what: str) -> str:
  """A checkpoint's path as read: a shipped name resolved, ~ expanded;
  FileNotFoundError where a local one is not there."""
  if str(checkpoint).startswith('shipped:'):  # the package's own models
    checkpoint = shipped.resolve(str(checkpoint))
  checkpoint = str(checkpoint)
  if not checkpoints.is_gcs(checkpoint, f'{what} checkpoint'):
    checkpoint = os.path.expanduser(checkpoint)
    if not os.path.exists(checkpoint):
      raise FileNotFoundError(f'{what} checkpoint not found: {checkpoint}')
  return checkpoint


def check_checkpoints(setup: EvalSetup) -> List[str]:
  """The setup's checkpoints (the target's, a draft model's: the ones
  `build` loads first), each checked to be where it is read from (a gs://
  one listed), before anything is loaded; what was found, a line each.
  Random and synthetic weights are no files; a kind that reads its own
  (heads, PaSS) checks its DRAFT_CHECKPOINT as it loads it.

  Raises:
    FileNotFoundError: naming the checkpoint that is not there.
  """
  found = []
  draft = setup.draft
  for what, checkpoint in (('target', setup.target_checkpoint),
                           ('draft', draft.checkpoint
                            if draft.drafter_kind.needs_model else None)):
    if checkpoint is None or str(checkpoint).startswith(synthetic.SCHEME):
      continue
    path = _checkpoint_path(checkpoint, what)
    if checkpoints.is_gcs(path) and not (checkpoints.isdir(path) or
                                         checkpoints.isfile(path)):
      raise FileNotFoundError(f'{what} checkpoint not found: {path}')
    found.append(f'{what} checkpoint {path}')
  return found


def _read_model(config: network.T5Config, checkpoint: Optional[str],
                seed: int, what: str, shardings=None):
  """`load_model` with no cache: read (or initialized) every call."""
  model = network.T5Model(config)
  if checkpoint is None:
    params = model.init_params(jax.random.key(seed))
  elif str(checkpoint).startswith(synthetic.SCHEME):  # named random weights
    params = synthetic.params(config, str(checkpoint))
  else:
    checkpoint = _checkpoint_path(checkpoint, what)
    if not checkpoints.isfile(os.path.join(checkpoint, 'config.json')):
      return model, checkpoints.load_t5x_params(checkpoint, config=config,
                                                shardings=shardings)
    params = checkpoints.load_hf_t5(checkpoint, config)
  if shardings is not None:
    params = jax.tree.map(jax.device_put, params, shardings)
  return model, params


def load_task(setup: EvalSetup):
  """The setup's task, its vocabulary checked against the target.

  A Debian task whose split's token ids its data_dir stores (the shipped
  test slices: data_dir 'shipped') is a `tasks.ArrayTask`, read without
  seqio or TensorFlow; any other is the seqio task (registered from
  data_dir).
  """
  task, spec = None, setup.data
  if spec.data_dir is not None:
    task = tasks.array_task(spec.mixture_or_task_name, spec.data_dir,
                            spec.split)
    if task is None:
      tasks.register_tasks(data_dir=spec.data_dir)
  if task is None:
    task = tasks.get_task(spec.mixture_or_task_name)
  size = tasks.vocab_size(task)
  if size > setup.target_config.vocab_size:
    raise checks.InputError(
        f'Task {spec.mixture_or_task_name} uses a vocabulary of '
        f'{size} tokens but TARGET_MODEL has vocab_size '
        f'{setup.target_config.vocab_size}.')
  return task


def read_examples(setup: EvalSetup, task, num_examples: Optional[int],
                  cache: Optional[LoadCache] = None) -> List[Any]:
  """The first `num_examples` (None: all) of the setup's split of `task`:
  `data.task_examples` tuples, checked against its feature lengths (and
  kept in `cache`, when given)."""
  spec = setup.data
  def read():
    return list(data.task_examples(task, spec.split,
                                   spec.task_feature_lengths, num_examples,
                                   spec.truncate_inputs))
  if cache is None:
    return read()
  key = _split_key(setup, task) + (
      spec.split, tuple(sorted(spec.task_feature_lengths.items())),
      num_examples, spec.truncate_inputs)
  return cache.examples(key, read)


def load_target(setup: EvalSetup, shardings=None,
                cache: Optional[LoadCache] = None):
  """(T5Model, params) the decoders run: loaded, then widened if asked.

  `shardings` (a params tree of Shardings of the target as it decodes,
  `decoding_config`): its params are placed by them (a T5X checkpoint
  restored straight into them; a widened target written into them by the
  widening, so that no device holds it whole).
  `cache`: a `LoadCache` that keeps the target (widened, placed), or None.
  """
  if cache is not None:
    key = ('target', setup.loaded_config, setup.decoding_config
           ) + _weights_key(setup.target_checkpoint, setup.seed) + (
               _placement(shardings),)
    return cache.model(key, lambda: load_target(setup, shardings))
  if setup.target_widen_to is None:
    return load_model(setup.loaded_config, setup.target_checkpoint,
                      setup.seed, 'target', shardings)
  _, params = load_model(setup.loaded_config, setup.target_checkpoint,
                         setup.seed, 'target')
  config = setup.decoding_config
  return network.T5Model(config), widening.widen(
      params, setup.loaded_config, config, shardings=shardings)


def load_store(setup: EvalSetup, task, target, target_params,
               max_train_examples: int = 20000):
  """The output cache of a setup whose drafter reads one (else None).

  `setup.draft.output_cache` is loaded when the file exists (checked
  against the target and the task's output length); otherwise a new cache
  is seeded with the task's train pairs (when the task has a train split)
  and, with a path, saved.
  """
  if not setup.draft.drafter_kind.uses_cache:
    return None
  length = setup.data.task_feature_lengths['targets']
  store = output_cache.OutputCache.open(setup.draft.output_cache, target,
                                        target_params, length)
  if len(store) or task is None:
    return store
  pairs = []
  try:
    if 'train' in task.splits:
      pairs = list(data.train_pairs(task, max_train_examples))
  except FileNotFoundError as e:  # a split the task has, not in its data
    print(f'output cache: no train pairs to seed it from ({e})')
  if pairs:
    store.add_pairs(target, target_params, pairs,
                    setup.data.task_feature_lengths['inputs'])
    print(f'output cache: seeded with {len(pairs)} train pairs.')
  else:
    print('output cache: it starts empty and grows with the outputs.')
  if store.path:
    store.save()
  return store


def load_draft_model(spec: DrafterSpec, seed: int,
                     cache: Optional[LoadCache] = None, shardings=None):
  """(T5Model, params) a model drafter drafts with: loaded, then widened if
  asked (`spec.widen_to`), as `load_target` widens the target.

  `seed`: of random weights (no checkpoint). `cache`: a `LoadCache` that
  keeps the model (widened, placed), or None. `shardings`: as
  `load_target`'s, of the drafter as it drafts (the jobs of a sweep on a
  mesh then share its placed arrays, not a copy each).
  """
  if spec.widen_to is None:
    return load_model(spec.config, spec.checkpoint, seed, 'draft',
                      shardings, cache)
  if cache is not None:
    key = ('draft', spec.config, spec.decoding_config) + _weights_key(
        spec.checkpoint, seed) + (_placement(shardings),)
    return cache.model(key, lambda: load_draft_model(spec, seed,
                                                     shardings=shardings))
  _, params = load_model(spec.config, spec.checkpoint, seed, 'draft')
  config = spec.decoding_config
  return network.T5Model(config), widening.widen(
      params, spec.config, config, shardings=shardings)


def load_drafter(setup: EvalSetup, task=None, target=None,
                 target_params=None, max_train_examples: int = 20000,
                 store=None, cache: Optional[LoadCache] = None,
                 draft_shardings=None):
  """(drafter, params) of the setup's drafter kind (`drafters.KINDS`).

  Args:
    setup: the setup (drafter kind, draft config / checkpoint, seed).
    task: the task (kinds that read its train split), or None.
    target: the target model (kinds that draft with it), or None.
    target_params: its params.
    max_train_examples: train examples a data-built drafter reads.
    store: the output cache of a kind that reads one (`load_store`), or
      None (such a kind then builds a new one from the task's train pairs).
    cache: a `LoadCache` that keeps the draft model, or a drafter built from
      the task's train split alone; or None.
    draft_shardings: where the draft model is placed (`load_draft_model`).
  """
  spec = setup.draft
  kind = spec.drafter_kind
  draft_model = draft_params = None
  if kind.needs_model:
    draft_model, draft_params = load_draft_model(spec, setup.seed + 1, cache,
                                                 draft_shardings)
  train = pairs = None
  if task is not None:
    train = lambda: data.train_targets(task, max_train_examples)
    pairs = lambda: data.train_pairs(task, max_train_examples)
  source = spec.source(
      vocab_size=setup.target_config.vocab_size,
      output_length=setup.data.task_feature_lengths['targets'],
      draft_model=draft_model, draft_params=draft_params, target=target,
      target_params=target_params, train_targets=train, train_pairs=pairs,
      store=store)
  if not kind.data_only or task is None or cache is None:
    return kind.build(source)
  key = ('drafter', kind.name) + _split_key(setup, task) + (
      setup.target_config.vocab_size, max_train_examples)
  return cache.drafter(key, lambda: kind.build(source))


def build(setup: EvalSetup, task=None, target_shardings=None,
          cache: Optional[LoadCache] = None, draft_shardings=None) -> Loaded:
  """Loads a setup: task (unless given), target (widened if asked), drafter.

  `target_shardings`, `draft_shardings`: see `load_target`,
  `load_draft_model` (the eval job on a mesh).
  `cache`: a `LoadCache` whose models are used and kept, or None.
  """
  check_checkpoints(setup)  # the draft model's there before the target
  task = load_task(setup) if task is None else task
  target, target_params = load_target(setup, target_shardings, cache)
  store = load_store(setup, task, target, target_params)
  drafter, draft_params = load_drafter(setup, task, target, target_params,
                                       store=store, cache=cache,
                                       draft_shardings=draft_shardings)
  # The loop the job decodes with (the drafter's own: merged for a
  # MergedDrafter) must take the setup's gamma; a tree the job chooses
  # has at most gamma levels by its choice.
  if not setup.draft.chooses_tree:
    speculative.check_drafter_gamma(drafter, setup.gamma)
  return Loaded(setup, task, target, target_params, drafter, draft_params,
                store)
