"""The drafter registry's types: what a kind is and what it is built from.

A *kind* is a drafter a job may name (`DrafterSpec.kind`, gin `DRAFTER`):
its name, what it needs (`DrafterKind`) and how it is built from what the
job has at hand (`DraftSource`). The kinds themselves are listed once, in
`specdec_jax.drafters.KINDS` (a `KindTable`); this module imports only the
contracts, so every drafter module can import it.
"""

from __future__ import annotations

import dataclasses
from typing import (Any, Callable, Dict, Iterable, Iterator, Mapping,
                    Optional, Sequence, Tuple)

from specdec_jax import checks
from specdec_jax import interfaces


@dataclasses.dataclass(frozen=True)
class DraftSource:
  """What a drafter kind may be built from (a kind reads what it needs).

  Attributes:
    vocab_size: the target's vocabulary size.
    draft_model: a separate draft model (`network.T5Model`), loaded by the
      caller when the kind `needs_model`.
    draft_params: its parameters.
    train_targets: a callable returning the task's train target ids, read
      only by kinds that need them (lazily: reading a train split costs):
      an iterable of token id sequences as the decoder emits them: no BOS,
      no padding (0s dropped), EOS kept.
    target_model: the target (`interfaces.DecodingModel`), for kinds that
      draft with the target itself or embed requests with it.
    target_params: its parameters.
    train_pairs: like train_targets, (input ids, target ids) pairs: what
      an output cache is seeded with when it starts empty.
    output_cache: an `output_cache.OutputCache` (the 'cache' and 'combined'
      kinds draft from it; the eval job appends to it), or None: a new one,
      seeded with train_pairs.
    output_length: the task's target length (a new cache's output width).
    confidence: adaptive draft length: > 0 makes model drafters stop below
      this confidence and copying drafters stop where nothing matches
      (`T5Drafter`, `LookupDrafter.adaptive`); 0 drafts gamma always.
    draft_checkpoint: DRAFT_CHECKPOINT for kinds that read their own
      parameters from a checkpoint without a separate model ('pass': the
      look-ahead embeddings, 'heads': a draft head), a path or a shipped
      name (`shipped:heads/en_de`).
    tree: TREE, the shape of a token tree for kinds that draft trees
      (`DrafterKind.reads_tree`): a `drafters.tree.shape.parse` spec, e.g.
      'beam:4,2,8'; None: the kind's default.
  """

  vocab_size: int
  draft_model: Any = None
  draft_params: Any = None
  train_targets: Optional[Callable[[], Iterable[Sequence[int]]]] = None
  target_model: Any = None
  target_params: Any = None
  train_pairs: Optional[Callable[[], Iterable[Tuple[Sequence[int],
                                                    Sequence[int]]]]] = None
  output_cache: Any = None
  output_length: int = 64
  confidence: float = 0.0
  draft_checkpoint: Optional[str] = None
  tree: Optional[str] = None

  def __post_init__(self):
    for name, value in (('train_targets', self.train_targets),
                        ('train_pairs', self.train_pairs)):
      if value is not None and not callable(value):
        raise checks.InputError(
            f'DraftSource {name} must be a callable returning the rows (read '
            f'lazily, only by kinds that need them), e.g. lambda: rows; got '
            f'{checks.said(value)}.')


@dataclasses.dataclass(frozen=True)
class DrafterKind:
  """A kind of drafter a job may name (`DrafterSpec.kind`).

  Attributes:
    name: the name ('t5', 'bigram', ...).
    needs_model: built from `DraftSource.draft_model` / `draft_params`, a
      separate model the caller loads (DRAFT_MODEL / DRAFT_CHECKPOINT).
    build: `DraftSource -> (drafter, params)`, the drafter an
      `interfaces.Drafter`. Raises ValueError when the source lacks what the
      kind needs.
    description: one line for listings and error messages.
    data_only: built from `DraftSource.train_targets` and `vocab_size`
      alone, so the result is a function of (task, vocab_size): a caller may
      build it once per task and reuse it.
    uses_cache: drafts from `DraftSource.output_cache`: the caller opens
      (or creates) the store and appends finished outputs to it; the
      drafter is an `interfaces.StoreDrafter`, whose `with_store(params,
      store)` gives its params after the store changed.
    needs_target: built from `DraftSource.target_model` / `target_params`
      (drafts with the target itself, or embeds requests with it).
    reads_tree: drafts token trees of the shape `DraftSource.tree` (gin
      TREE); a job refuses TREE for a kind that does not.
    reads_confidence: drafts adaptive lengths with `DraftSource.confidence`
      > 0 (gin DRAFT_CONFIDENCE); a job refuses a confidence for a kind
      that does not (it would change nothing).
  """

  name: str
  needs_model: bool
  build: Callable[[DraftSource], Tuple[interfaces.Drafter, Any]]
  description: str
  data_only: bool = False
  uses_cache: bool = False
  needs_target: bool = False
  reads_tree: bool = False
  reads_confidence: bool = False


class KindTable(Mapping[str, DrafterKind]):
  """The kinds a job may name, by name, in the order listed (read-only).

  Refuses two kinds of one name when built; `get_kind` names the known
  kinds when asked for an unknown one.
  """

  def __init__(self, *kinds: DrafterKind):
    self._kinds: Dict[str, DrafterKind] = {}
    for kind in kinds:
      if kind.name in self._kinds:
        raise ValueError(f'Two drafter kinds are named {kind.name!r}.')
      self._kinds[kind.name] = kind

  def __getitem__(self, name: str) -> DrafterKind:
    return self._kinds[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._kinds)

  def __len__(self) -> int:
    return len(self._kinds)

  def get_kind(self, name: str) -> DrafterKind:
    """The kind `name`; ValueError naming the known ones."""
    if name not in self._kinds:
      raise checks.InputError(f'Unknown drafter kind {name!r}; known kinds: '
                              f'{sorted(self._kinds)}.')
    return self._kinds[name]

  def describe(self) -> str:
    """One line per kind: name, what it needs, description."""
    lines = []
    for kind in self._kinds.values():
      needs = [label for flag, label in (
          (kind.needs_model, 'draft model'), (kind.needs_target, 'target'),
          (kind.data_only, 'train targets'), (kind.uses_cache,
                                              'output cache')) if flag]
      lines.append(f'{kind.name:<10} {kind.description}'
                   + (f' [needs: {", ".join(needs)}]' if needs else ''))
    return '\n'.join(lines)
