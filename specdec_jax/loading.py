"""What an evaluation decodes, as one typed value, and how it is loaded.

`EvalSetup` is the eval job's configuration (gin configures it, as T5X
configures `DatasetConfig` / `RestoreCheckpointConfig`): the target, the
drafter, the task and how to decode. Building one checks everything that can
be checked without loading (gamma, sampling, vocabularies, the drafter kind,
widening), so a bad configuration fails before any work. `build(setup)`
loads it: the task, the target (checkpoint, then widening), the drafter (by
its kind in `drafters.KINDS`).

The eval job (eval.py), the reproduction code (experiments/) and the scripts
all go through here, so a setup means the same thing everywhere.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Dict, Mapping, Optional, Union

from specdec_jax import checks
from specdec_jax import drafters as drafters_lib
from specdec_jax import network
from specdec_jax import speculative
from specdec_jax import widening
from specdec_jax.drafters.tree import shape as tree_shape
from specdec_jax.sampling import SamplingConfig

_ACTIVATION_DTYPES = ('bfloat16', 'float16', 'float32')
BATCHINGS = ('stream', 'fixed')
BATCH_GAMMAS = ('profile', 'config')


@dataclasses.dataclass(frozen=True)
class EvalSetup:
  """One evaluation: target, drafter, task, decoding.

  Attributes:
    target_config: `network.T5Config` of the target.
    target_checkpoint: T5X checkpoint path (legacy or orbax, local or gs://),
      HF T5 folder, 'shipped:<name>' (the package's models), or None (random
      weights).
    mixture_or_task_name: a registered seqio task (see tasks.py); a Debian
      task is read without seqio where data_dir stores its token ids.
    task_feature_lengths: {'inputs': N, 'targets': M}; M is the output
      length.
    gamma: drafts per iteration.
    drafter: a kind in `drafters.KINDS` (`python -m specdec_jax.drafters`
      lists them).
    draft_config: `T5Config` of the drafter (kinds that need a model).
    draft_checkpoint: as target_checkpoint, for the drafter.
    split: the split to decode.
    temperature: 0 for greedy.
    topk: 0 = off.
    topp: 1.0 = off.
    batch_size: examples per decode call.
    num_examples: first N examples of the split (None = all).
    seed: PRNG seed (random weights: target seed, drafter seed + 1; and
      sampling).
    truncate_inputs: cut inputs longer than allowed instead of failing.
    eos_id: end-of-sequence id.
    data_dir: data folder of the offline Debian tasks (default:
      $SPECDEC_DATA_DIR or ~/.cache/specdec_jax/debian; 'shipped' = the
      shipped test slices, read without seqio: `tasks.array_task`).
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
    output_cache: for the 'cache' and 'combined' drafters: the file of the
      output cache (`output_cache.OutputCache`): loaded (and checked against
      the target) when it exists, else created, seeded with the task's
      train pairs when it has a train split; the eval job appends every
      finished output to it, committed with each unit's records. None:
      the eval job keeps the run's cache in EVAL_OUTPUT_DIR
      (output_cache.npz, so a resumed run drafts from the same cache);
      `build` alone makes an in-memory one.
    draft_confidence: adaptive draft lengths: 0 drafts gamma tokens every
      iteration; > 0 (e.g. 0.4) makes a model drafter stop where its most
      likely token is below this probability and a copying drafter stop
      where nothing matches (see `drafters.T5Drafter`); refused for a kind
      that drafts no adaptive lengths (`DrafterKind.reads_confidence`).
    batching: at batch_size > 1, 'stream' (continuous batching: both
      decoders run `streaming.sample_stream` / `speculative_stream`, an
      ended row refilled with the next example inside the loop, over chunks
      of `stream_chunk` batches' worth of examples) or 'fixed' (each batch
      runs until its slowest row ends: `decoding.temperature_sample` /
      `speculative.speculative_sample`). Batch 1 always decodes fixed.
    stream_chunk: batches' worth of examples per streamed call (the unit
      that is timed, recorded and resumed; a drafter's output cache learns
      after each).
    batch_gamma: at batch_size > 1 (where the slowest row sets the pace
      and cost(k) grows with the batch), 'profile' (default): the job
      chooses gamma for the batch from a hardware profile it measures
      first on this machine: cost(k) = t(k) / t(1) of the target at this
      batch for k = 1 .. max_gamma + 1, the drafter's c, and alpha from
      the first unit decoded (untimed, the compile warm-up) at `gamma`;
      gamma is the argmax of Theorem 3.8 with the measured cost(gamma + 1)
      (`bench.hardware.predict`), or 0 (no speculation: the batch decodes
      with the baseline) where even the best is predicted slower than the
      baseline; written to gamma_choice.json and reused when the run
      resumes. Drafters with a merged loop (PaSS, heads,
      trees) keep `gamma` (their drafting rides on the target call; the
      chain formula does not price it). 'config': `gamma` at every batch.
      Batch 1 always decodes with `gamma` (the paper's rule).
    max_gamma: the largest gamma 'profile' may choose.
    tree: TREE, for drafter 'tree': the token tree's shape (a
      `drafters.tree.shape.parse` spec, e.g. 'beam:4,2,8' or a
      'dynamic:...' shape of `drafters.tree.shape.best`); None: the
      kind's default (`drafters.tree.DEFAULT_TREE`). gamma is the depth of
      the tree used (at most the shape's).
  """

  target_config: network.T5Config
  target_checkpoint: Optional[str]
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  gamma: int
  drafter: str = 't5'
  draft_config: Optional[network.T5Config] = None
  draft_checkpoint: Optional[str] = None
  split: str = 'validation'
  temperature: float = 0.0
  topk: int = 0
  topp: float = 1.0
  batch_size: int = 1
  num_examples: Optional[int] = None
  seed: int = 0
  truncate_inputs: bool = False
  eos_id: int = 1
  data_dir: Optional[str] = None
  target_widen_to: Optional[Union[str, Mapping[str, int]]] = None
  activation_dtype: Optional[str] = None
  same_shape_baseline: bool = False
  output_cache: Optional[str] = None
  draft_confidence: float = 0.0
  batching: str = 'stream'
  stream_chunk: int = 4
  tree: Optional[str] = None
  batch_gamma: str = 'profile'
  max_gamma: int = 8

  def __post_init__(self):
    set_ = lambda k, v: object.__setattr__(self, k, v)
    speculative.check_gamma(self.gamma)
    self.sampling  # pylint: disable=pointless-statement  (validates)
    if set(self.task_feature_lengths) < {'inputs', 'targets'}:
      raise ValueError('TASK_FEATURE_LENGTHS needs "inputs" and "targets", '
                       f'got {dict(self.task_feature_lengths)}.')
    set_('task_feature_lengths', dict(self.task_feature_lengths))
    checks.check_int('batch_size', self.batch_size)
    if self.num_examples is not None:
      checks.check_int('num_examples', self.num_examples, 0, ' (or None: all)')
    if self.batching not in BATCHINGS:
      raise ValueError(f'batching must be one of {BATCHINGS}, got '
                       f'{self.batching!r}.')
    if self.batch_gamma not in BATCH_GAMMAS:
      raise ValueError(f'batch_gamma must be one of {BATCH_GAMMAS}, got '
                       f'{self.batch_gamma!r}.')
    checks.check_int('max_gamma', self.max_gamma)
    checks.check_int('stream_chunk', self.stream_chunk)
    if self.same_shape_baseline and self.streamed:
      raise ValueError(
          "same_shape_baseline needs batching='fixed' at batch_size > 1: the "
          'streamed baseline steps one token per row.')
    kind = drafters_lib.get_kind(self.drafter)
    conf = self.draft_confidence
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not (
        0 <= conf < 1):
      raise ValueError(f'draft_confidence must be a number in [0, 1), got '
                       f'{conf!r}.')
    if conf and not kind.reads_confidence:
      raise ValueError(
          f'draft_confidence is set but drafter {self.drafter!r} drafts no '
          'adaptive lengths (kinds that do: '
          f'{sorted(k for k, v in drafters_lib.KINDS.items() if v.reads_confidence)}).')
    if self.tree is not None and not kind.reads_tree:
      raise ValueError(f'tree is set but drafter {self.drafter!r} does not '
                       'draft trees (kinds that do: '
                       f'{sorted(k for k, v in drafters_lib.KINDS.items() if v.reads_tree)}).')
    if kind.reads_tree:
      shape = tree_shape.parse(self.tree or drafters_lib.tree.DEFAULT_TREE)
      if self.gamma > shape.depth:
        raise ValueError(f'gamma {self.gamma} is deeper than the tree '
                         f'{shape.spec!r} (depth {shape.depth}): set gamma '
                         f'<= {shape.depth} (the tree is cut to gamma '
                         'levels).')
    if self.output_cache is not None and not kind.uses_cache:
      raise ValueError(f'output_cache is set but drafter {self.drafter!r} '
                       'does not use one (kinds that do: '
                       f'{sorted(k for k, v in drafters_lib.KINDS.items() if v.uses_cache)}).')
    if kind.needs_model:
      if self.draft_config is None:
        raise ValueError(f'drafter={self.drafter!r} needs DRAFT_MODEL (a '
                         'T5Config).')
      speculative.check_vocab(self.target_config.vocab_size,
                              self.draft_config.vocab_size)
    if self.activation_dtype is not None:
      import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
      try:
        name = jnp.dtype(self.activation_dtype).name
      except TypeError:
        name = None
      if name not in _ACTIVATION_DTYPES:
        raise ValueError('activation_dtype must be None, bfloat16, float16 or '
                         f'float32, got {self.activation_dtype!r}.')
      set_('activation_dtype', name)
    if self.target_widen_to is not None:
      if not isinstance(self.target_widen_to, str):
        set_('target_widen_to', dict(self.target_widen_to))
      self.decoding_config  # pylint: disable=pointless-statement

  @property
  def profile_gamma(self) -> bool:
    """Whether the job chooses gamma from a profile (`batch_gamma`)."""
    return self.batch_gamma == 'profile' and self.batch_size > 1

  @property
  def streamed(self) -> bool:
    """Whether the job decodes with continuous batching (`batching`)."""
    return self.batching == 'stream' and self.batch_size > 1

  @property
  def sampling(self) -> SamplingConfig:
    return SamplingConfig(self.temperature, self.topk, self.topp)

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
    return dataclasses.replace(self, **changes)

  def settings(self) -> Dict[str, Any]:
    """The run's identity, as run.json holds it (a rerun must match it)."""
    settings = dict(
        task=self.mixture_or_task_name, split=self.split, drafter=self.drafter,
        gamma=self.gamma, temperature=float(self.temperature), topk=self.topk,
        topp=float(self.topp), batch_size=self.batch_size,
        num_examples=self.num_examples, seed=self.seed,
        target_checkpoint=str(self.target_checkpoint),
        draft_checkpoint=str(self.draft_checkpoint),
        target_widen_to=self.target_widen_to,
        task_feature_lengths=dict(self.task_feature_lengths))
    # Only when set, so that runs from before these options still resume.
    if self.activation_dtype is not None:
      settings['activation_dtype'] = self.activation_dtype
    if self.same_shape_baseline:
      settings['same_shape_baseline'] = True
    if self.draft_confidence:
      settings['draft_confidence'] = float(self.draft_confidence)
    if self.tree is not None:
      settings['tree'] = self.tree
    if self.streamed:  # fixed batches: as before streaming existed
      settings['batching'] = 'stream'
      settings['stream_chunk'] = self.stream_chunk
    if self.profile_gamma:
      settings['batch_gamma'] = 'profile'
      settings['max_gamma'] = self.max_gamma
    return settings

  def describe(self) -> str:
    """One `name = value` line per field (the eval job's --dry_run)."""
    return '\n'.join(f'{f.name} = {getattr(self, f.name)!r}'
                     for f in dataclasses.fields(self))


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

  gin_utils.configure(args, EvalSetup, 'gin_configs/paper/ende_t0_small.gin')
  # Checks the setup (EvalSetup.__post_init__) before anything is loaded.
  return gin.get_configurable(EvalSetup)()


def load_model(config: network.T5Config, checkpoint: Optional[str],
               seed: int = 0, what: str = 'model', shardings=None):
  """(T5Model, params) of a checkpoint, or random weights when it is None.

  Args:
    config: the model's `T5Config`.
    checkpoint: a T5X checkpoint (legacy or orbax, local or gs://), an HF T5
      folder (with config.json), 'shipped:<name>', or None.
    seed: PRNG seed of random weights.
    what: the model's role, named in errors ('target', 'draft').
    shardings: None, or a params tree of `jax.sharding.Sharding`s: a T5X
      checkpoint is then restored straight into them
      (`checkpoints.load_t5x_params`); other sources load whole (the caller
      places them).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top

  model = network.T5Model(config)
  if checkpoint is None:
    return model, model.init_params(jax.random.key(seed))
  if str(checkpoint).startswith('shipped:'):  # the package's own models
    from specdec_jax import shipped  # pylint: disable=g-import-not-at-top
    checkpoint = shipped.resolve(str(checkpoint))
  path = pathlib.Path(str(checkpoint))
  if not str(checkpoint).startswith('gs://') and not path.exists():
    raise FileNotFoundError(f'{what} checkpoint not found: {checkpoint}')
  if path.is_dir() and (path / 'config.json').exists():
    return model, checkpoints.load_hf_t5(path, config)
  return model, checkpoints.load_t5x_params(checkpoint, config=config,
                                            shardings=shardings)


def load_task(setup: EvalSetup):
  """The setup's task, its vocabulary checked against the target.

  A Debian task whose split's token ids its data_dir stores (the shipped
  test slices: data_dir 'shipped') is a `tasks.ArrayTask`, read without
  seqio or TensorFlow; any other is the seqio task (registered from
  data_dir).
  """
  from specdec_jax import tasks  # pylint: disable=g-import-not-at-top

  task = None
  if setup.data_dir is not None:
    task = tasks.array_task(setup.mixture_or_task_name, setup.data_dir,
                            setup.split)
    if task is None:
      tasks.register_tasks(data_dir=setup.data_dir)
  if task is None:
    task = tasks.get_task(setup.mixture_or_task_name)
  vocab = task.output_features['targets'].vocabulary
  if vocab.vocab_size > setup.target_config.vocab_size:
    raise ValueError(
        f'Task {setup.mixture_or_task_name} uses a vocabulary of '
        f'{vocab.vocab_size} tokens but TARGET_MODEL has vocab_size '
        f'{setup.target_config.vocab_size}.')
  return task


def load_target(setup: EvalSetup, shardings=None):
  """(T5Model, params) the decoders run: loaded, then widened if asked.

  `shardings` (a params tree of Shardings of the loaded model): a T5X
  checkpoint is restored straight into them, unless it is widened after.
  """
  if setup.target_widen_to is not None:
    shardings = None  # Widening needs the whole tree; place it afterwards.
  target, params = load_model(setup.loaded_config, setup.target_checkpoint,
                              setup.seed, 'target', shardings)
  if setup.target_widen_to is not None:
    config = setup.decoding_config
    params = widening.widen(params, setup.loaded_config, config)
    target = network.T5Model(config)
  return target, params


# Drafters built from task data only (`DrafterKind.data_only`: n-gram
# tables), once per task and process.
_BUILT: Dict[Any, Any] = {}


def load_store(setup: EvalSetup, task, target, target_params,
               max_train_examples: int = 20000):
  """The output cache of a setup whose drafter reads one (else None).

  `setup.output_cache` is loaded when the file exists (checked against the
  target and the task's output length); otherwise a new cache is seeded
  with the task's train pairs (when the task has a train split) and, with
  a path, saved.
  """
  from specdec_jax import data  # pylint: disable=g-import-not-at-top
  from specdec_jax import output_cache  # pylint: disable=g-import-not-at-top

  if not drafters_lib.get_kind(setup.drafter).uses_cache:
    return None
  length = setup.task_feature_lengths['targets']
  store = output_cache.OutputCache.open(setup.output_cache, target,
                                        target_params, length)
  if len(store) or task is None:
    return store
  try:
    pairs = list(data.train_pairs(task, max_train_examples))
  except Exception as e:  # pylint: disable=broad-except
    print(f'output cache: no train pairs to seed it from ({type(e).__name__}'
          f': {str(e)[:120]}); it starts empty and grows with the outputs.')
    pairs = []
  if pairs:
    store.add_pairs(target, target_params, pairs,
                    setup.task_feature_lengths['inputs'])
    print(f'output cache: seeded with {len(pairs)} train pairs.')
  if store.path:
    store.save()
  return store


def load_drafter(setup: EvalSetup, task=None, target=None,
                 target_params=None, max_train_examples: int = 20000,
                 store=None):
  """(drafter, params) of the setup's drafter kind (`drafters.KINDS`).

  Args:
    setup: the setup (drafter kind, draft config / checkpoint, seed).
    task: the task (kinds that read its train split), or None.
    target: the target model (kinds that draft with it), or None.
    target_params: its params.
    max_train_examples: train examples a data-built drafter reads.
    store: the output cache of a kind that reads one (`load_store`), or
      None (such a kind then builds a new one from the task's train pairs).
  """
  from specdec_jax import data  # pylint: disable=g-import-not-at-top

  kind = drafters_lib.get_kind(setup.drafter)
  draft_model = draft_params = None
  if kind.needs_model:
    draft_model, draft_params = load_model(
        setup.draft_config, setup.draft_checkpoint, setup.seed + 1, 'draft')
  train = None
  if task is not None:
    train = lambda: data.train_targets(task, max_train_examples)
  pairs = None
  if task is not None:
    pairs = lambda: data.train_pairs(task, max_train_examples)
  source = drafters_lib.DraftSource(
      vocab_size=setup.target_config.vocab_size, draft_model=draft_model,
      draft_params=draft_params, train_targets=train, target_model=target,
      target_params=target_params, train_pairs=pairs, output_cache=store,
      output_length=setup.task_feature_lengths['targets'],
      confidence=float(setup.draft_confidence),
      draft_checkpoint=(None if kind.needs_model else
                        setup.draft_checkpoint),
      tree=setup.tree)
  if not kind.data_only or task is None:
    return kind.build(source)
  key = (kind.name, task.name, setup.target_config.vocab_size,
         max_train_examples)
  if key not in _BUILT:
    _BUILT[key] = kind.build(source)
  return _BUILT[key]


def build(setup: EvalSetup, task=None, target_shardings=None) -> Loaded:
  """Loads a setup: task (unless given), target (widened if asked), drafter.

  `target_shardings`: see `load_target` (the eval job on a mesh).
  """
  task = load_task(setup) if task is None else task
  target, target_params = load_target(setup, target_shardings)
  store = load_store(setup, task, target, target_params)
  drafter, draft_params = load_drafter(setup, task, target, target_params,
                                       store=store)
  # The loop the job decodes with (the drafter's own: merged for a
  # MergedDrafter) must take the setup's gamma.
  speculative.check_drafter_gamma(drafter, setup.gamma)
  return Loaded(setup, task, target, target_params, drafter, draft_params,
                store)
