"""The shape of a token tree: how many nodes at each depth, under whom.

A tree of depth D has levels 1..D (the root, level 0, is the row's last
committed token). Level d has a fixed number of slots (static shapes under
jit); slot s of level d is the `rank`-th child of the `parent`-th node of
level d - 1, where the rank orders a node's children as the drafter draws
them (greedy: its most likely tokens first; sampled: a draw without
replacement) and the parent index counts the nodes of level d - 1

  - static tree: in slot order;
  - dynamic tree (EAGLE-2's idea): by the drafter's cumulative probability
    of the node's path, most probable first, decided at run time: the
    budget goes where the drafter is confident.

Every parent's children are ranks 0..m-1 in slot order (a prefix of its
draws: what keeps sampled verification exact, `verify.py`). Tree index 0
is the root, then level 1's slots, level 2's, ...: `offsets[d]`.

`best(rank_probs, nodes, depth)` builds the tree of `nodes` nodes with
the most expected accepted tokens when the target takes the drafter's
rank-r candidate with probability rank_probs[r] at every node, or
rank_probs[d - 1][r] at depth d (Sequoia / Medusa's construction: greedy
on path products, which is optimal here as products only shrink along a
path). `choose(rank_probs, costs)` picks its size and depth for a device:
the most predicted tokens per second, expected tokens over one target
call at the verified width plus a drafter call per level
(`TreeCosts`, from a hardware profile; Sequoia's idea), or, given trees
decoded (`MeasuredTree`: what a dynamic beam yields, which no rank
probability says), by their counts, each cut to every depth.

References: Miao et al. 2024 (SpecInfer), Chen et al. 2024 (Sequoia),
Li et al. 2024 (EAGLE-2), Cai et al. 2024 (Medusa).
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from specdec_jax import checks
from specdec_jax import hardware

Level = Tuple[Tuple[int, int], ...]  # (parent, rank) per slot


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """Levels of (parent, rank) per slot; see the module docstring.

  Attributes:
    levels: per level 1..D, per slot, `(parent index in level d - 1, rank)`.
    dynamic: parents index level d - 1 by cumulative probability (run time)
      instead of slot order.
    top: 0 verifies every drafted node; N > 0 (greedy only): the target
      verifies the N drafted nodes of highest path probability under the
      drafter, per row (EAGLE-2's re-ranking: draft wide, verify the best;
      an ancestor-closed subtree, as a child is never more probable than
      its parent). Sampled trees are verified whole: which siblings are
      kept must not depend on what was drawn.
  """

  levels: Tuple[Level, ...]
  dynamic: bool = False
  top: int = 0

  def __post_init__(self):
    checks.check_int('top', self.top, 0)
    levels = tuple(tuple((int(p), int(r)) for p, r in level)
                   for level in self.levels)
    object.__setattr__(self, 'levels', levels)
    if not levels or not all(levels):
      raise ValueError(f'A tree needs >= 1 level and >= 1 slot per level; '
                       f'got level sizes {[len(l) for l in levels]}.')
    previous = 1
    for d, level in enumerate(levels, 1):
      ranks = {}
      for p, r in level:
        if not 0 <= p < previous:
          raise ValueError(f'level {d}: parent {p} outside the {previous} '
                           f'nodes of level {d - 1}.')
        want = ranks.get(p, 0)
        if r != want:
          raise ValueError(
              f'level {d}: parent {p}\'s children must be ranks 0, 1, ... in '
              f'slot order (a prefix of its draws); got rank {r} where '
              f'{want} is next.')
        ranks[p] = want + 1
      previous = len(level)

  @property
  def depth(self) -> int:
    return len(self.levels)

  @property
  def sizes(self) -> Tuple[int, ...]:
    """Slots per level 1..D."""
    return tuple(len(level) for level in self.levels)

  @property
  def offsets(self) -> Tuple[int, ...]:
    """Tree index of each level's first slot, levels 0..D (root: 0)."""
    out = [0, 1]
    for n in self.sizes[:-1]:
      out.append(out[-1] + n)
    return tuple(out)

  @property
  def nodes(self) -> int:
    """Drafted nodes (the root excluded)."""
    return sum(self.sizes)

  @property
  def width(self) -> int:
    """Tokens of the target's verification call: the root and the nodes."""
    return self.nodes + 1

  def verified_width(self, greedy: bool) -> int:
    """Tokens of the target's call: the root and the verified nodes."""
    if greedy and 0 < self.top < self.nodes:
      return self.top + 1
    return self.width

  @property
  def max_children(self) -> int:
    """Candidates drawn per node (the largest rank + 1)."""
    return 1 + max(r for level in self.levels for _, r in level)

  def check_vocab(self, vocab_size: int) -> None:
    """Raises InputError where a node would draw more candidates than the
    vocabulary has tokens (said by the tree's sizes, not its whole spec:
    a wide tree's is thousands of characters)."""
    if self.max_children > vocab_size:
      raise checks.InputError(
          f'the tree ({self.depth} levels of {list(self.sizes)} slots) '
          f'gives a node {self.max_children} children; the vocabulary has '
          f'{vocab_size} tokens.')

  @property
  def fed(self) -> Tuple[Tuple[int, ...], ...]:
    """Per level 1..D-1, the positions (in the level's parent order: slot
    order, or a dynamic tree's run-time ranking) of the nodes that get
    children: the nodes a drafter is called on. A node without children
    needs no logits, so a level's call is on these alone (beam:16,4,16:
    4 tokens, not 64)."""
    return tuple(tuple(sorted({p for p, _ in level}))
                 for level in self.levels[1:])

  @property
  def fed_offsets(self) -> Tuple[int, ...]:
    """Index of each level's first fed node among the nodes the drafter
    was called on (root: 0), levels 0..D-1."""
    out = [0, 1]
    for fed in self.fed[:-1]:
      out.append(out[-1] + len(fed))
    return tuple(out[:self.depth])

  @property
  def fed_width(self) -> int:
    """Nodes the drafter is called on per tree: the root and `fed`; the
    cache slots its level calls write past the root."""
    return 1 + sum(len(fed) for fed in self.fed)

  def truncate(self, depth: int) -> 'TreeShape':
    """The first `depth` levels (e.g. gamma < D)."""
    if not 1 <= depth <= self.depth:
      raise ValueError(f'depth {depth} outside 1..{self.depth}.')
    return dataclasses.replace(self, levels=self.levels[:depth])

  def expected_tokens(self, rank_probs) -> float:
    """Tokens per target call if the target takes, at a node of depth
    d - 1, the drafter's rank-r candidate w.p. `rate(rank_probs, d, r)`,
    independently (a static tree's figure; the bonus token included)."""
    value = [1.0]
    total = 1.0
    for d, level in enumerate(self.levels, 1):
      value = [value[p] * rate(rank_probs, d, r) for p, r in level]
      total += sum(value)
    return total

  @property
  def spec(self) -> str:
    """A string `parse` reads back: 'static:' or 'dynamic:' and the levels,
    ';' between levels, each slot 'parent.rank'."""
    body = ';'.join(','.join(f'{p}.{r}' for p, r in level)
                    for level in self.levels)
    top = f'/{self.top}' if self.top else ''
    return ('dynamic:' if self.dynamic else 'static:') + body + top


def chain(gamma: int) -> TreeShape:
  """A chain of gamma drafts (one child per node)."""
  return TreeShape((((0, 0),),) * gamma)


def beam(children: int, expand: int, depth: int,
         dynamic: bool = True) -> TreeShape:
  """EAGLE-2's shape: the root's `children` best, then at each level the
  `expand` first nodes of the level above get `children` each."""
  levels = [tuple((0, r) for r in range(children))]
  for _ in range(depth - 1):
    top = min(expand, len(levels[-1]))
    levels.append(tuple((p, r) for p in range(top) for r in range(children)))
  return TreeShape(tuple(levels), dynamic)


def rate(rank_probs, depth: int, rank: int) -> float:
  """P(the target takes the drafter's rank-`rank` candidate at `depth`).

  `rank_probs`: one sequence over ranks (every depth alike), or one per
  depth 1, 2, ... (Sequoia's acceptance table; the last row holds
  deeper); a rank beyond a row is never taken."""
  rows = rank_probs if _per_depth(rank_probs) else [rank_probs]
  row = rows[min(depth, len(rows)) - 1]
  return float(row[rank]) if rank < len(row) else 0.0


def _per_depth(rank_probs) -> bool:
  return len(rank_probs) > 0 and np.ndim(rank_probs[0]) > 0


def _check_rates(rank_probs) -> None:
  rows = rank_probs if _per_depth(rank_probs) else [rank_probs]
  for row in rows:
    probs = [float(a) for a in row]
    if (not probs or any(not 0 <= a <= 1 for a in probs) or
        any(b > a for a, b in zip(probs, probs[1:]))):
      raise ValueError(f'rank_probs must be in [0, 1] and non-increasing '
                       f'over ranks, got {probs}.')


def nonincreasing(rank_probs) -> List[float]:
  """Measured rank probabilities (one row) made non-increasing over ranks,
  as `best` takes them: the least-squares non-increasing fit (adjacent
  ranks out of order pooled to their mean), so sampling noise in the rare
  ranks (rank 6 counted a little more often than rank 5) changes no mass."""
  blocks = []  # [mean, count]
  for a in (float(x) for x in rank_probs):
    blocks.append([a, 1])
    while len(blocks) > 1 and blocks[-1][0] > blocks[-2][0]:
      (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
      blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
  return [m for m, n in blocks for _ in range(n)]


def best(rank_probs, nodes: int, depth: int,
         dynamic: bool = False) -> TreeShape:
  """The tree of `nodes` nodes and depth <= `depth` with the most
  `expected_tokens(rank_probs)`; each level in decreasing path value (so a
  dynamic tree's run-time order has the same meaning).

  Greedy on path values (a node's value is the product of the rates
  along its path): optimal, as a child's value is at most its parent's
  and a later sibling's at most an earlier one's, so the `nodes` most
  valuable nodes form a tree.

  Args:
    rank_probs: probability that the target takes the drafter's rank-r
      candidate (non-increasing; `measure_rank_probs`), one sequence or
      one per depth (`rate`).
    nodes: node budget (>= 1).
    depth: largest depth (>= 1).
    dynamic: the result's `dynamic`.
  """
  if nodes < 1 or depth < 1:
    raise ValueError(f'nodes and depth must be >= 1, got {nodes}, {depth}.')
  _check_rates(rank_probs)
  at = lambda d, r: rate(rank_probs, d, r)
  # (-value, tie, node); node = (parent node id, rank, depth).
  chosen: List[Tuple[float, int, int, int]] = []  # value, parent id, rank, d
  heap = [(-at(1, 0), 0, -1, 0, 1)]
  tie = 1
  while heap and len(chosen) < nodes:
    neg, _, parent, rank, d = heapq.heappop(heap)
    me = len(chosen)
    chosen.append((-neg, parent, rank, d))
    parent_value = 1.0 if parent < 0 else chosen[parent][0]
    if at(d, rank + 1) > 0:  # next sibling
      heapq.heappush(heap, (-parent_value * at(d, rank + 1), tie, parent,
                            rank + 1, d))
      tie += 1
    if d < depth:  # first child
      heapq.heappush(heap, (neg * at(d + 1, 0), tie, me, 0, d + 1))
      tie += 1
  levels: List[Level] = []
  index = {-1: 0}  # node id -> index within its level (root: 0)
  for d in range(1, depth + 1):
    ids = sorted((i for i, node in enumerate(chosen) if node[3] == d),
                 key=lambda i: (-chosen[i][0], index[chosen[i][1]],
                                chosen[i][2]))
    if not ids:
      break
    # Slot order: by value (ids is), so rank order within a parent holds.
    ordered = ids
    for pos, i in enumerate(ordered):
      index[i] = pos
    levels.append(tuple((index[chosen[i][1]], chosen[i][2])
                        for i in ordered))
  return TreeShape(tuple(levels), dynamic)


def parse(spec: str) -> TreeShape:
  """A tree from a spec string.

  Forms:
    'chain:G'                    a chain of G drafts;
    'beam:K,B,D' / 'static-beam:K,B,D'
                                 `beam(K, B, D)`, dynamic / static;
    'static:<levels>' / 'dynamic:<levels>'
                                 `TreeShape.spec`'s form;
  each may end in '/N': verify the best N nodes only (`TreeShape.top`),
  e.g. 'beam:4,4,10/64'.

  Raises:
    ValueError: naming the spec and the forms.
  """
  forms = ("'chain:G', 'beam:K,B,D', 'static-beam:K,B,D', "
           "'static:p.r,...;...' or 'dynamic:p.r,...;...', each optionally "
           "ending in '/N'")
  if not isinstance(spec, str) or ':' not in spec:
    raise checks.InputError(f'Unknown tree spec {spec!r}; forms: {forms}.')
  kind, body = spec.split(':', 1)
  try:
    if '/' in body:
      body, top = body.rsplit('/', 1)
      return dataclasses.replace(parse(f'{kind}:{body}'), top=int(top))
    if kind == 'chain':
      return chain(int(body))
    if kind in ('beam', 'static-beam'):
      return beam(*_beam_fields(body), dynamic=kind == 'beam')
    if kind in ('static', 'dynamic'):
      levels = tuple(tuple(tuple(int(x) for x in slot.split('.'))
                           for slot in level.split(','))
                     for level in body.split(';'))
      return TreeShape(levels, kind == 'dynamic')
  except ValueError as e:
    raise checks.InputError(
        f'Bad tree spec {spec!r}: {e}; forms: {forms}.') from e
  raise checks.InputError(f'Unknown tree spec {spec!r}; forms: {forms}.')


def _beam_fields(body: str) -> Tuple[int, int, int]:
  """(K, B, D) of a beam spec's body 'K,B,D'."""
  k, b, d = (int(x) for x in body.split(','))
  return k, b, d


def beam_spec(children: int, expand: int, depth: int,
              top: Optional[int] = None) -> str:
  """The spec `parse` reads as the dynamic `beam(children, expand,
  depth)`, the best `top` nodes verified: 'beam:K,B,D/N'."""
  return f'beam:{children},{expand},{depth}' + (f'/{top}' if top else '')


@dataclasses.dataclass(frozen=True)
class TreeCosts:
  """What one tree iteration costs on a device, in milliseconds.

  An iteration is one target call on the verified width, the drafter's
  calls (the root's catch-up and levels 1..D-1: D calls, each about a
  fixed time at batch 1, where a call is bound by its kernel launches,
  not its width) and a fixed rest.

  Attributes:
    target_ms: `k -> ms` of a k-token target call.
    level_ms: one drafter call (the root's, or a level's).
    fixed_ms: the rest of an iteration (the walk, commits, the loop).
  """

  target_ms: Callable[[int], float]
  level_ms: float
  fixed_ms: float = 0.0

  @classmethod
  def of_profile(cls, profile: hardware.HardwareProfile, *,
                 level_ms: Optional[float] = None,
                 level_launches: Optional[int] = None, batch: int = 1,
                 fixed_ms: float = 0.0) -> 'TreeCosts':
    """A profile's costs: t(1) x cost(k) for the target (`cost_at`: its
    measured curve, interpolated, held beyond the largest k measured);
    a level as `level_ms`, else `level_launches` x the profile's launch
    time (the bytes / launches model's, e.g. 42 launches of a 2-layer
    drafter's level on the H100: ../shared/GPU.md).

    Raises:
      ValueError: neither `level_ms` nor a launch count the profile can
        price.
    """
    if level_ms is None:
      if level_launches is None or profile.launch_ms is None:
        raise ValueError(
            f'profile {profile.name!r}: a level needs level_ms, or '
            f'level_launches and a profile with a launch time (launch_ms '
            f'{profile.launch_ms}).')
      level_ms = level_launches * profile.launch_ms
    t1 = profile.t1_ms
    return cls(target_ms=lambda k: t1 * profile.cost_at(k, batch)[0],
               level_ms=float(level_ms), fixed_ms=float(fixed_ms))

  def iteration_ms(self, shape: TreeShape, greedy: bool = True) -> float:
    """Predicted ms of one iteration with `shape`."""
    return (self.target_ms(shape.verified_width(greedy)) +
            shape.depth * self.level_ms + self.fixed_ms)


# The root's children of the beams a tree choice decodes (`filled_beams`).
BEAM_CHILDREN = 8


def filled_beams(max_nodes: int, max_depth: int, rows: int) -> Tuple[str, ...]:
  """The dynamic beams a tree choice decodes ('beam:K,B,D/N'): K =
  `BEAM_CHILDREN` children a node, B = `rows` and 2 x `rows` paths fed a
  level (a level's drafter call runs on its fed nodes padded to a multiple
  of `rows`, and on a GPU costs its kernels whatever the rows: B = `rows`
  fills it), D = `max_depth` levels, the N = `max_nodes` most probable
  verified; K and B at most N."""
  k = min(BEAM_CHILDREN, max_nodes)
  specs = [beam_spec(k, min(b, max_nodes), max_depth, max_nodes)
           for b in (rows, 2 * rows)]
  return tuple(dict.fromkeys(specs))


@dataclasses.dataclass(frozen=True)
class MeasuredTree:
  """A tree decoded (greedy) on a tree choice's examples: its output tokens
  and iterations, and per depth d how often an iteration of a row
  accepted more than d drafts.

  The same tree cut to depth d' (a static tree's first d' levels; a beam
  'beam:K,B,D/N' becomes 'beam:K,B,d'/N': the same levels 1..d', the N
  most probable of them verified) holds, in any state, every node of
  depth <= d' the whole one verifies (a node in the N best of a larger
  set is in the N best of the smaller), so it accepts at least min(a, d')
  where the whole one accepts a. Greedy, every tree decodes the same
  tokens, so `expected_tokens(d')` scales the decode's tokens per call by
  the mean of min(a, d') + 1 over its iterations against that of a + 1:
  exact at the tree's depth; an estimate below (the cut tree's rows go
  elsewhere, and each row's last call may cover fewer tokens).

  Attributes:
    spec: the decoded tree's spec (`parse`).
    accepted_at: per depth 0..D-1, the row iterations that accepted more
      drafts (`SpecStats.accepted_at`).
    iterations: row iterations (`SpecStats.row_iterations` summed).
    tokens: the decode's output tokens (lengths summed).
    level_ms: one of its levels' drafter call.
  """

  spec: str
  accepted_at: Tuple[int, ...]
  iterations: int
  tokens: int
  level_ms: float

  def __post_init__(self):
    object.__setattr__(self, 'accepted_at', tuple(
        int(a) for a in self.accepted_at))
    if len(self.accepted_at) != parse(self.spec).depth or min(
        self.iterations, self.tokens) < 1:
      raise ValueError(
          f'tree {self.spec!r}: {len(self.accepted_at)} depths counted, '
          f'{self.iterations} iterations, {self.tokens} tokens; want one '
          'count a level, >= 1 iteration and token.')

  def at_depth(self, depth: int) -> str:
    """The spec of the tree cut to its first `depth` levels."""
    kind, body = self.spec.split(':', 1)
    if kind != 'beam':
      return parse(self.spec).truncate(depth).spec
    k, b, _ = _beam_fields(body.split('/')[0])
    return beam_spec(k, b, depth, parse(self.spec).top)

  def expected_tokens(self, depth: int) -> float:
    """Tokens per call estimated at `depth` (the class docstring)."""
    advanced = lambda d: self.iterations + sum(self.accepted_at[:d])
    return self.tokens / self.iterations * advanced(depth) / advanced(
        len(self.accepted_at))

  def to_json(self):
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A tree a choice weighs: its tokens per call over its iteration.

  Attributes:
    shape, spec: the tree.
    tokens: its tokens per call, expected.
    iteration_ms: its iteration's time, predicted.
    source: the decoded tree it is (at its depth: `tokens` measured) or is
      cut from (an estimate); None: priced by the rank probabilities.
  """

  shape: TreeShape
  spec: str
  tokens: float
  iteration_ms: float
  source: Optional[MeasuredTree] = None

  @property
  def tokens_per_s(self) -> float:
    return 1e3 * self.tokens / self.iteration_ms

  @property
  def measured(self) -> bool:
    """Whether its tokens per call are a decode's own (not a cut's)."""
    return self.source is not None and self.source.spec == self.spec


def candidates(rank_probs, costs: TreeCosts, max_nodes: int = 64,
               max_depth: int = 12, dynamic: bool = True,
               measured: Sequence[MeasuredTree] = ()) -> List[Candidate]:
  """What `choose` weighs. Decoded trees (`measured`), where there are:
  each cut to every depth <= max_depth, by its counts (`expected_tokens`),
  its levels at its own `level_ms`; a cut decoded whole counts as that
  tree alone. Else, for every depth bound D and node budget n,
  `best(rank_probs, n, D)`, by its expected tokens under the rank
  probabilities (which take the target's choices at the nodes as
  independent: a tree decoded may yield less; dynamic beams they cannot
  price at all)."""
  out, whole = [], {tree.spec for tree in measured}
  for tree in measured:
    priced = dataclasses.replace(costs, level_ms=tree.level_ms)
    depth = parse(tree.spec).depth
    for cut in range(1, min(depth, max_depth) + 1):
      spec = tree.at_depth(cut)
      if cut < depth and spec in whole:
        continue  # decoded whole: its own counts
      shape = parse(spec)
      out.append(Candidate(shape, spec, tree.expected_tokens(cut),
                           priced.iteration_ms(shape), tree))
  if out:
    return out
  for depth in range(1, max_depth + 1):
    for nodes in range(depth, max_nodes + 1):
      shape = best(rank_probs, nodes, depth, dynamic)
      if shape.depth < depth or shape.nodes < nodes:
        continue  # found at a smaller bound
      out.append(Candidate(shape, shape.spec, shape.expected_tokens(
          rank_probs), costs.iteration_ms(shape)))
  return out


def choose(rank_probs, costs: TreeCosts, max_nodes: int = 64,
           max_depth: int = 12, dynamic: bool = True,
           measured: Sequence[MeasuredTree] = ()) -> Tuple[TreeShape, float]:
  """The tree with the most predicted tokens per second on a device.

  Sequoia's hardware-aware choice: for every depth bound D and node
  budget n, `best(rank_probs, n, D)` is the tree with the most expected
  tokens per call; its predicted rate is expected_tokens /
  `costs.iteration_ms` (the target at the verified width n + 1, D drafter
  calls). Levels that cost more favour shallower trees, a target whose
  cost grows with k narrower ones. Trees decoded (`measured`) are weighed
  by their counts instead, each cut to every depth (`candidates`).

  Args:
    rank_probs: as `best` (one row, or one per depth).
    costs: the device's `TreeCosts` (e.g. `TreeCosts.of_profile`).
    max_nodes, max_depth: the search's bounds.
    dynamic: the result's `dynamic`.
    measured: decoded trees (`MeasuredTree`, of at most max_nodes verified
      nodes).

  Returns:
    `(shape, predicted tokens per second)`.
  """
  top = best_candidate(rank_probs, costs, max_nodes, max_depth, dynamic,
                       measured)
  return top.shape, top.tokens_per_s


def best_candidate(rank_probs, costs: TreeCosts, max_nodes: int = 64,
                   max_depth: int = 12, dynamic: bool = True,
                   measured: Sequence[MeasuredTree] = ()) -> Candidate:
  """The first of `candidates` (the same arguments) with the most tokens
  per second (`choose`'s)."""
  return max(candidates(rank_probs, costs, max_nodes, max_depth, dynamic,
                        measured), key=lambda c: c.tokens_per_s)
