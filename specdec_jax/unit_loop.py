"""The eval job's unit loop: every unit decoded both ways, timed, recorded.

A unit is what the job decodes, times, records and resumes in one piece: a
batch, or streamed (`BatchSpec.streamed`) a chunk of `stream_chunk`
batches' worth of examples. `decode_units` decodes each unfinished unit
with the baseline and with speculative decoding (their `programs`) on the
same inputs and rng, both compiled outside the timings, timed alternately
(`measure.time_alternating`), diagnoses a greedy row that differs
(`diagnostics.diagnose`), and yields the unit's records (the fields of
examples.jsonl); the job (`eval.evaluate`) writes them. It may choose
gamma from a profile measured at the first unit, alpha on the first
examples (`choose_gamma`, `warmup_alpha`). The output cache of the
'cache' / 'combined' drafters learns each unit's outputs here and is
committed with its records (`run_folder.CacheCommit`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
from tqdm import tqdm
import numpy as np

from specdec_jax import data
from specdec_jax import diagnostics
from specdec_jax import drafters
from specdec_jax import interfaces
from specdec_jax import loading
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import partitioning
from specdec_jax import programs
from specdec_jax import run_folder
from specdec_jax import spec_stats
from specdec_jax import speculative
from specdec_jax import theory
from specdec_jax import hardware
from specdec_jax.drafters.tree import shape as tree_shape
from specdec_jax.loading import EvalSetup


def units(setup: EvalSetup, all_inputs: np.ndarray
           ) -> Iterator[Tuple[int, int, int, np.ndarray]]:
  """The timed decode calls: `(unit, start, rows used, inputs)`.

  Fixed batches: unit b is batch b (`data.batches`, a short last one
  filled). Streamed (`setup.batch.streamed`): unit c is chunk c, the examples
  [c K B, (c + 1) K B) with K = `setup.batch.chunk` and B the batch, a
  short last chunk filled (repeating its first row) to a multiple of B.
  """
  b = setup.batch.size
  if not setup.batch.streamed:
    for start, n, inputs in data.batches(all_inputs, b):
      yield start // b, start, n, inputs
    return
  size = setup.batch.chunk * b
  for start in range(0, len(all_inputs), size):
    rows = all_inputs[start:start + size]
    n = len(rows)
    filled = -(-n // b) * b
    inputs = np.concatenate([rows, np.repeat(rows[:1], filled - n, 0)])
    yield start // size, start, n, inputs


def call_times(loaded: loading.Loaded, inputs, ks=None, gamma=None
               ) -> Tuple[Dict[int, float], float, int]:
  """What a profile of the setup's batch rests on, timed on this machine.

  On the first `batch_size` rows of `inputs`, after half the output length
  decoded (the mean context of a decode): seconds per k-token target call
  for k in `ks` (default 1 .. max_gamma + 1) and seconds per token the
  drafter drafts at `gamma` (default the setup's).

  Returns:
    ({k: seconds}, drafter seconds per token, the context).
  """
  setup = loaded.setup
  rows = inputs[:setup.batch.size]
  context = max(setup.data.task_feature_lengths['targets'] // 2, 1)
  seconds = measure.cost_curve(
      loaded.target, loaded.target_params, rows,
      range(1, setup.batch.max_gamma + 2) if ks is None else ks,
      context=context, jit_setup=True)
  t_draft = measure.drafter_token_time(
      loaded.drafter, speculative.with_target(
          loaded.drafter, loaded.draft_params, loaded.target_params),
      rows, gamma or setup.gamma, context=context, jit_setup=True)
  return seconds, t_draft, context


def _measured_profile(setup: EvalSetup, seconds: Dict[int, float],
                      t_draft: float) -> hardware.HardwareProfile:
  """The profile of what `call_times` measured at the setup's batch:
  t(1), cost(k) = t(k) / t(1), the drafter's c = t_draft / t(1)."""
  t1 = seconds[1]
  return hardware.HardwareProfile.of_run(
      'this run', setup.batch.size, t1,
      {k: t / t1 for k, t in seconds.items()},
      {setup.draft.kind: t_draft / t1}, device=measure.machine())


def choose_gamma(loaded: loading.Loaded, inputs, alpha: float
                 ) -> Dict[str, Any]:
  """gamma for the setup's batch from a profile measured now, on this
  machine (`BatchSpec.gamma_rule` 'profile').

  Args:
    loaded: the built setup.
    inputs: a unit's inputs (its first `batch_size` rows are timed).
    alpha: the drafter's alpha, measured on this run's first examples
      (`warmup_alpha`).

  Returns:
    {'gamma', 'rule', 'configured_gamma', 'alpha', 'prediction' (the
    `hardware.Prediction` of the chosen gamma), 'profile'} (JSON).
    Where even the best gamma is predicted slower than the baseline,
    'gamma' is 0 (no speculation: the job decodes with the baseline) and
    'why' says so.
  """

  setup = loaded.setup
  b, top = setup.batch.size, setup.batch.max_gamma
  seconds, t_draft, _ = call_times(loaded, inputs)
  profile = _measured_profile(setup, seconds, t_draft)
  chosen = hardware.predict(profile, alpha=theory.clamp_alpha(alpha),
                            drafter=setup.draft.kind, batch=b, max_gamma=top)
  choice = {'gamma': int(chosen.gamma), 'rule': 'profile',
            'configured_gamma': setup.gamma, 'alpha': alpha,
            'prediction': chosen.to_json(), 'profile': profile.to_json()}
  if chosen.speedup < 1.0:
    choice['gamma'] = 0
    choice['why'] = (
        f'no speculation: the best gamma ({chosen.gamma}) is predicted at '
        f'{chosen.speedup:.2f}x of the baseline on the profile measured now '
        f'(alpha {alpha:.2f}, cost(gamma + 1) {chosen.cost:.2f}, c '
        f'{chosen.c:.3f}), so the batch decodes with the baseline')
  return choice


def tree_widths(budget: int) -> List[int]:
  """The call widths timed for a tree choice: powers of two plus one up
  to the largest a tree of `budget` nodes verifies (cost(k) interpolated
  between them)."""
  return sorted({1, budget + 1} | {2 ** i + 1 for i in range(
      budget.bit_length()) if 2 ** i + 1 <= budget + 1})


# Examples whose baseline outputs the drafter's rank probabilities are
# measured on, for a tree choice (`choose_tree`).
CHOICE_EXAMPLES = 16


def choice_examples(setup: EvalSetup) -> int:
  """How many examples a tree choice decodes: the run's first, at most
  `CHOICE_EXAMPLES`."""
  return min(setup.data.num_examples or CHOICE_EXAMPLES, CHOICE_EXAMPLES)


# At most this many cuts of the trees decoded first are decoded whole
# (each a program more to compile) before the choice stands.
_MORE_DECODED = 3


def _choice_beams(setup: EvalSetup) -> Tuple[str, ...]:
  """The dynamic beams a tree choice weighs (`shape.filled_beams`): none
  for a kind that reads no tree, or a choice of one level."""
  if not setup.draft.drafter_kind.reads_tree or setup.gamma <= 1:
    return ()
  return tree_shape.filled_beams(setup.draft.tree_budget, setup.gamma,
                                 network.CUBLAS_ROWS)


def tree_evidence(loaded: loading.Loaded, inputs, outputs,
                  profile: Optional[hardware.HardwareProfile] = None,
                  drafter: Optional[str] = None) -> Dict[str, Any]:
  """What a tree choice (`choose_tree`) rests on: the drafter's rank
  probabilities on the baseline's greedy `outputs` (`measure.rank_probs`),
  and seconds of the target's call at the widths a tree of the setup's
  budget verifies (`tree_widths`), of the drafter's step and (a
  `TreeDrafter`) of a level of `drafters.tree.DEFAULT_TREE` (its mean) and
  of each beam the choice weighs (`_choice_beams`, its second level),
  timed alone (`measure.tree_level_time`).

  The seconds are timed on this machine; or, with a `profile` (another
  device's), priced on it: t(1) x cost(k), a level and a step at the c of
  its `drafter` (the profile's name of it) x t(1). So a choice can be
  made here as that device would likely make it.

  Returns:
    {'rank_probs_measured', 'seconds' ({k: s}), 'draft_s', 'level_s'
    ({tree spec: s})}.
  """
  setup = loaded.setup
  b, widths = setup.batch.size, tree_widths(setup.draft.tree_budget)
  measured = measure.rank_probs(loaded.drafter, speculative.with_target(
      loaded.drafter, loaded.draft_params, loaded.target_params), inputs,
                                *outputs)
  evidence = {'rank_probs_measured': [float(p) for p in measured]}
  trees = ((drafters.tree.DEFAULT_TREE,) + _choice_beams(setup)
           if isinstance(loaded.drafter, drafters.TreeDrafter) else ())
  if profile is not None:
    t1 = profile.t1_ms / 1e3
    t_draft = profile.c_of(drafter, b)[0] * t1
    return dict(evidence, draft_s=t_draft,
                seconds={k: t1 * profile.cost_at(k, b)[0] for k in widths},
                level_s=dict.fromkeys(trees, t_draft))
  seconds, t_draft, context = call_times(loaded, inputs, widths, gamma=1)
  return dict(evidence, seconds=seconds, draft_s=t_draft, level_s={
      spec: measure.tree_level_time(
          with_tree(loaded, spec).drafter, loaded.draft_params, inputs[:b],
          None if spec == drafters.tree.DEFAULT_TREE else
          min(2, tree_shape.parse(spec).depth - 1), context=context,
          jit_setup=True) for spec in trees})


def choose_tree(loaded: loading.Loaded, inputs, outputs, where=None,
                evidence: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """The token tree for a setup whose tree is 'choose:N'
  (`DrafterSpec.chooses_tree`), chosen on this machine.

  Sequoia's way (`drafters.tree.shape.choose`): among the trees of at most
  N nodes and gamma levels, the one with the most predicted tokens per
  second, tokens per call over an iteration's time (the target's call at
  the verified width, timed now at the widths of `tree_widths` and
  interpolated, plus one drafter call per level: a level of
  `drafters.tree.DEFAULT_TREE` timed alone, `measure.tree_level_time`,
  for a `TreeDrafter`; else the drafter's step; `tree_evidence`). The
  trees weighed: the static tree `shape.best` builds from the drafter's
  rank probabilities on the baseline's greedy outputs
  (`measure.rank_probs`) that `shape.choose` prefers, and the dynamic
  beams that fill a level (`shape.filled_beams`, their level timed
  alone), each decoded on `inputs` (`_measured_tree`: what the rank
  probabilities cannot say of a beam, and overstate of a static tree) and
  weighed cut to every depth by its counts (`shape.MeasuredTree`); a tree
  is not decoded where d + 1 tokens a call at a depth d could not beat the
  baseline and the trees decoded before it. A cut chosen (its tokens per
  call an estimate, a low one) is decoded whole and the choice made again;
  a tree chosen whole, its cut two levels shallower, while that wins; up
  to `_MORE_DECODED` decodes. Where none is decoded, the rank
  probabilities' choice.

  Args:
    loaded: the built setup.
    inputs: `[n, input length]` examples' inputs (the first `batch_size`
      rows are timed).
    outputs: `(tokens, lengths)`, the baseline's outputs of those rows.
    where: the job's `partitioning.Partitioner` (a unit's inputs placed on
      its mesh), or None (`partitioning.OneDevice`: as they are).
    evidence: `tree_evidence`'s (None: measured now).

  Returns:
    {'gamma' (the tree's depth), 'tree' (its `shape.parse` spec), 'rule',
    'configured_gamma', 'configured_tree', 'rank_probs' (as measured,
    'rank_probs_measured', made non-increasing), 'trees' (the decoded
    ones' `MeasuredTree.to_json`), 'examples' (n), 'expected_tokens',
    'iteration_ms', 'predicted_tokens_per_s', 'level_ms',
    'predicted_speedup', 'profile'} (JSON). Where even the best tree is
    predicted slower than the baseline (a token per t(1)), 'gamma' is 0
    (no speculation) and 'why' says so.
  """
  setup = loaded.setup
  evidence = evidence or tree_evidence(loaded, inputs, outputs)
  probs = tree_shape.nonincreasing(evidence['rank_probs_measured'])
  seconds, t_draft = evidence['seconds'], evidence['draft_s']
  t_level = evidence['level_s'].get(drafters.tree.DEFAULT_TREE, t_draft)
  t1 = seconds[1]
  profile = _measured_profile(setup, seconds, t_draft)
  costs = tree_shape.TreeCosts.of_profile(profile, level_ms=t_level * 1e3,
                                          batch=setup.batch.size)
  top, trees = _decoded_choice(loaded, probs, costs, evidence['level_s'],
                               1.0 / t1, inputs,
                               where or partitioning.OneDevice())
  choice = {'gamma': top.shape.depth, 'tree': top.spec, 'rule': 'profile',
            'configured_gamma': setup.gamma,
            'configured_tree': setup.draft.tree, 'rank_probs': probs,
            'examples': len(inputs),
            'rank_probs_measured': evidence['rank_probs_measured'],
            'trees': [tree.to_json() for tree in trees],
            'expected_tokens': top.tokens, 'iteration_ms': top.iteration_ms,
            'predicted_tokens_per_s': top.tokens_per_s,
            'level_ms': t_level * 1e3,
            'predicted_speedup': top.tokens_per_s * t1,
            'profile': profile.to_json()}
  if top.tokens_per_s * t1 < 1.0:  # the baseline's rate: a token per t(1)
    choice['gamma'] = 0
    choice['why'] = (
        f'no speculation: the best tree ({top.spec}) is predicted at '
        f'{top.tokens_per_s * t1:.2f}x of the baseline on the profile '
        'measured now, so the job decodes with the baseline')
  return choice


def predicted_choice(loaded: loading.Loaded, all_inputs,
                     profile: hardware.HardwareProfile, drafter: str
                     ) -> Dict[str, Any]:
  """The tree the job would likely choose (`choose_tree`) on the device
  of `profile` (another machine's; `drafter`: its name of the setup's
  drafter, whose c prices a level): chosen here on the first
  `CHOICE_EXAMPLES` of `all_inputs` as the job chooses on its first unit,
  the baseline and the trees weighed decoded here (tokens do not depend on
  the device), the calls and levels priced on the profile
  (`tree_evidence`). PREDICTED: the device's own costs may choose
  otherwise."""
  setup = loaded.setup
  base = programs_at(loaded, 1)[0]
  rows, outputs = _baseline_outputs(
      setup, base, loaded.target_params, all_inputs,
      partitioning.OneDevice(), jax.random.fold_in(jax.random.key(
          setup.seed), 0))
  return choose_tree(loaded, rows, outputs, evidence=tree_evidence(
      loaded, rows, outputs, profile, drafter))


def _decoded_choice(loaded: loading.Loaded, probs, costs, level_s, beat: float,
                    inputs, where):
  """`choose_tree`'s trees decoded and the best of them: `(the
  `shape.Candidate`, the `shape.MeasuredTree`s)`. `level_s`: seconds of a
  level of each beam (`tree_evidence`; one it lacks at `costs.level_ms`);
  `beat`: the baseline's tokens per second."""
  setup = loaded.setup
  bounds = dict(max_nodes=setup.draft.tree_budget, max_depth=setup.gamma)
  static = tree_shape.best_candidate(probs, costs, **bounds).spec
  trees, to_beat = [], beat
  for spec in ((static,) + _choice_beams(setup)
               if setup.draft.drafter_kind.reads_tree else ()):
    shape = tree_shape.parse(spec)
    level_ms = (1e3 * level_s[spec] if spec != static and spec in level_s
                else costs.level_ms)
    # Decoded where d + 1 tokens a call at a depth d would beat the
    # baseline and every tree decoded before.
    priced = dataclasses.replace(costs, level_ms=level_ms)
    if max((d + 1) / priced.iteration_ms(shape.truncate(d)) for d in range(
        1, shape.depth + 1)) * 1e3 > to_beat:
      trees.append(_measured_tree(loaded, spec, inputs, where, level_ms))
      to_beat = max(beat, tree_shape.best_candidate(
          probs, costs, measured=trees, **bounds).tokens_per_s)
  top = tree_shape.best_candidate(probs, costs, measured=trees, **bounds)
  for _ in range(_MORE_DECODED if trees else 0):
    # A cut chosen is decoded whole; a tree decoded whole, its cut two
    # levels up (a cut's estimate is low: the N verified nodes move up
    # into the levels kept), while that wins.
    depth = top.shape.depth - (2 if top.measured else 0)
    spec = top.source.at_depth(depth) if depth >= 1 else None
    if spec is None or spec in {tree.spec for tree in trees}:
      break
    trees.append(_measured_tree(loaded, spec, inputs, where,
                                top.source.level_ms))
    top = tree_shape.best_candidate(probs, costs, measured=trees, **bounds)
  return top, trees


def _measured_tree(loaded: loading.Loaded, spec: str, inputs, where,
                   level_ms: float) -> tree_shape.MeasuredTree:
  """The tree `spec` decoded (greedy) on `inputs`, unit by unit with the
  setup's speculative program: its acceptance counts per depth."""
  setup = loaded.setup
  tree = with_tree(loaded, spec)
  program = programs_at(tree, tree.drafter.shape.depth)[1]
  rng = jax.random.key(setup.seed)
  accepted_at, iterations, tokens = 0, 0, 0
  for _, _, _, rows in units(setup, inputs):
    out = partitioning.to_host(program(
        loaded.target_params, loaded.draft_params, where.shard_batch(rows),
        rng))
    accepted_at = accepted_at + np.asarray(out.stats.accepted_at)
    iterations += int(np.sum(out.stats.row_iterations))
    tokens += int(np.sum(out.lengths))
  return tree_shape.MeasuredTree(spec, tuple(accepted_at), iterations,
                                 tokens, level_ms)


def _baseline_outputs(setup: EvalSetup, base: programs.Program, params,
                      all_inputs, where, rng):
  """The first `CHOICE_EXAMPLES` examples' inputs and the baseline's
  outputs of them `(tokens, lengths)`, decoded unit by unit (the units'
  shapes: nothing new compiles but a short last one's)."""
  rows, tokens, lengths = [], [], []
  for _, _, n, inputs in units(setup, all_inputs[:CHOICE_EXAMPLES]):
    out = partitioning.to_host(base(params, where.shard_batch(inputs), rng))
    rows.append(np.asarray(inputs)[:n])
    tokens.append(np.asarray(out.tokens)[:n])
    lengths.append(np.asarray(out.lengths)[:n])
  return np.concatenate(rows), (np.concatenate(tokens),
                                np.concatenate(lengths))


def refine_tree(loaded: loading.Loaded, choice: Dict[str, Any], decoded,
                seconds: float) -> Dict[str, Any]:
  """`choice` (`choose_tree`'s) chosen again with the iteration's fixed
  work priced: what one iteration of the chosen tree took in a timed decode
  (`seconds` over its loop iterations) beyond the target's call and the
  levels the choice priced, as `TreeCosts.fixed_ms` (the walk, the cache
  moves, a GPU's launches; and the decode's own start, spread over its
  iterations: an overestimate that favours no speculation).

  Args:
    loaded: the built setup.
    choice: its tree choice.
    decoded: the speculative decode with that tree (`spec_stats.SpecResult`).
    seconds: its time.

  Returns:
    The choice with 'fixed_ms', 'measured_iteration_ms', 'first_tree' (the
    tree chosen first) and the tree (or no speculation, 'why') chosen now.
  """
  setup = loaded.setup
  profile = hardware.HardwareProfile.from_json(choice['profile'])
  costs = tree_shape.TreeCosts.of_profile(
      profile, level_ms=choice['level_ms'], batch=setup.batch.size)
  iteration_ms = 1e3 * seconds / max(int(decoded.stats.iterations), 1)
  fixed_ms = max(iteration_ms - choice['iteration_ms'], 0.0)
  costs = dataclasses.replace(costs, fixed_ms=fixed_ms)
  top = tree_shape.best_candidate(
      choice['rank_probs'], costs, max_nodes=setup.draft.tree_budget,
      max_depth=setup.gamma, measured=[tree_shape.MeasuredTree(**tree)
                                       for tree in choice.get('trees', ())])
  rate, t1_s = top.tokens_per_s, profile.t1_ms / 1e3
  refined = dict(choice, first_tree=choice['tree'], fixed_ms=fixed_ms,
                 measured_iteration_ms=iteration_ms, tree=top.spec,
                 gamma=top.shape.depth, expected_tokens=top.tokens,
                 iteration_ms=top.iteration_ms,
                 predicted_tokens_per_s=rate, predicted_speedup=rate * t1_s)
  refined.pop('why', None)
  if rate * t1_s < 1.0:
    refined['gamma'] = 0
    refined['why'] = (
        f'no speculation: with the iteration\'s fixed work measured '
        f'({fixed_ms:.3f} ms), the best tree ({top.spec}) is predicted at '
        f'{rate * t1_s:.2f}x of the baseline, so the job decodes with the '
        'baseline')
  return refined


def with_tree(loaded: loading.Loaded, spec: str) -> loading.Loaded:
  """`loaded` drafting trees of `spec` (a `drafters.tree.shape.parse`
  spec): its tree drafter (a kind that reads trees: a dataclass whose
  `shape` is the tree) with that shape."""
  if not (loaded.setup.draft.drafter_kind.reads_tree and
          dataclasses.is_dataclass(loaded.drafter)):
    raise TypeError(f'{type(loaded.drafter).__name__} drafts no tree of a '
                    'shape (kinds that read trees build a dataclass with a '
                    '`shape`).')
  return dataclasses.replace(loaded, drafter=dataclasses.replace(
      loaded.drafter, shape=tree_shape.parse(spec)))


def _tree_choice(loaded: loading.Loaded, inputs, outputs, choice_file,
                 where) -> Dict[str, Any]:
  """`choose_tree`, kept in `choice_file` and said. What it times is
  `where.agree`d (one choice on a mesh spanning processes): how long, and
  the seconds the choice rests on."""
  with measure.decided_by(where.agree):
    evidence = where.agree(tree_evidence(loaded, inputs, outputs))
  choice = choose_tree(loaded, inputs, outputs, where, evidence)
  run_folder.write_choice(choice_file, choice)
  if choice['gamma'] == 0:
    print(f"tree choice: {choice['why']}", flush=True)
    return choice
  print(f"tree {choice['tree']} ({choice['gamma']} levels; configured "
        f"{choice['configured_tree']}): chosen by the profile measured now "
        f"and the drafter's ranks ({len(choice['trees'])} trees decoded) "
        f"on {choice['examples']} examples, "
        f"{choice['expected_tokens']:.2f} tokens per call expected, "
        f"{choice['iteration_ms']:.3f} ms an iteration, "
        f"{choice['predicted_tokens_per_s']:.0f} tokens/s predicted",
        flush=True)
  return choice


def _tree_refinement(loaded: loading.Loaded, choice, decoded, seconds,
                     choice_file, where) -> Dict[str, Any]:
  """`refine_tree`, `where.agree`d, kept in `choice_file` and said."""
  refined = where.agree(refine_tree(loaded, choice, decoded, seconds))
  run_folder.write_choice(choice_file, refined)
  said = (refined['why'] if refined['gamma'] == 0 else
          f"tree {refined['tree']} from now on "
          f"({refined['predicted_tokens_per_s']:.0f} tokens/s predicted)")
  print(f"tree {refined['first_tree']}: an iteration took "
        f"{refined['measured_iteration_ms']:.3f} ms, "
        f"{refined['fixed_ms']:.3f} ms more than priced; {said}", flush=True)
  return refined


def programs_at(loaded: loading.Loaded, gamma: int
                ) -> Tuple[programs.Program, Optional[programs.Program]]:
  """The setup's baseline and speculative programs at `gamma`.

  At gamma 0 (no speculation, `choose_gamma`) there is no speculative
  program, and the baseline is that of the configured gamma.
  """
  setup = loaded.setup
  streamed = setup.batch.streamed
  block = (gamma or setup.gamma) + 1 if setup.same_shape_baseline else 1
  base = programs.ProgramSpec(
      'baseline', 'stream' if streamed else 'fixed',
      max_decode_len=setup.data.task_feature_lengths['targets'],
      sampling=setup.sampling, eos_id=setup.data.eos_id, block_size=block,
      batch_size=setup.batch.size if streamed else 0)
  spec = None
  if gamma:
    spec = programs.Program(dataclasses.replace(
        base, kind='speculative', gamma=gamma, block_size=1), loaded.target,
                            loaded.drafter)
  return programs.Program(base, loaded.target), spec


def chooses_gamma(loaded: loading.Loaded) -> bool:
  """Whether the job chooses the setup's gamma from a profile it measures
  (`BatchSpec.gamma_rule`; not for a tree the job chooses, nor a drafter
  with a merged loop, which keeps its configured gamma)."""
  return (loaded.setup.chooses_gamma and
          not speculative.decodes_merged(loaded.drafter))


def _configured_choice(loaded: loading.Loaded, choice_file
                       ) -> Optional[Dict[str, Any]]:
  """gamma as configured for a merged drafter, or as chosen by the run
  being resumed (`choice_file`); None: to be chosen on the first unit."""
  setup, gamma, choice = loaded.setup, loaded.setup.gamma, None
  if setup.draft.chooses_tree:  # chosen on the first unit, or resumed
    if choice_file is not None and choice_file.exists():
      choice = run_folder.read_choice(choice_file)
      print(f"tree {choice['tree']}, chosen by the profile of the run being "
            f'resumed ({choice_file})', flush=True)
  elif speculative.decodes_merged(loaded.drafter):
    choice = {'gamma': gamma, 'rule': 'config', 'configured_gamma': gamma,
              'why': f'drafter {setup.draft.kind!r} drafts in its merged '
                     'loop (its drafting rides on the target call; the chain '
                     'formula does not price it): gamma as configured'}
    run_folder.write_choice(choice_file, choice)
  elif choice_file is not None and choice_file.exists():
    choice = run_folder.read_choice(choice_file)
    print(f"gamma {choice['gamma']} for batch {setup.batch.size}, chosen "
          f'by the profile of the run being resumed ({choice_file})',
          flush=True)
  return choice


def warmup_alpha(lane: Lane, base: programs.Program, all_inputs, where,
                 rng) -> Tuple[float, int]:
  """(alpha, examples) of the lane's speculative decodes, untimed, of
  the first `CHOICE_EXAMPLES` examples at its configured gamma, unit by
  unit (the units' shapes: nothing new compiles but a short last one's):
  what its gamma choice measures alpha on. One unit alone is too few: at
  batch 1 it is one example, whose alpha may be 1.0 on a short easy one."""
  setup = lane.loaded.setup
  spec = lane.programs()[1]
  sums = np.zeros(5)  # `spec_stats.rates`' counters, summed
  for _, _, n, rows in units(setup, all_inputs[:CHOICE_EXAMPLES]):
    stats = partitioning.to_host(programs.calls(
        base, spec, lane.loaded.target_params, lane.draft_params,
        where.shard_batch(rows), rng)['speculative']().stats)
    used = slice(None) if setup.batch.streamed else slice(0, n)
    sums += [np.sum(np.asarray(c)[used]) for c in (
        stats.row_iterations, stats.drafted, stats.accepted, stats.beta_sum,
        stats.beta_count)]
  return (spec_stats.rates(*sums)['alpha'],
          min(len(all_inputs), CHOICE_EXAMPLES))


def _profile_choice(lane: Lane, inputs, alpha: float, examples: int, where
                    ) -> Dict[str, Any]:
  """`choose_gamma` on the alpha of the first `examples` examples
  (`warmup_alpha`), `where.agree`d (what it times and the choice), kept
  in the lane's `choice_file` and said."""
  loaded, setup = lane.loaded, lane.loaded.setup
  with measure.decided_by(where.agree):
    choice = where.agree(dict(choose_gamma(loaded, inputs, alpha),
                              alpha_examples=examples))
  run_folder.write_choice(lane.choice_file, choice)
  pred = choice['prediction']
  print(f"gamma {choice['gamma']} for batch {setup.batch.size} "
        f"(configured {setup.gamma}): chosen by the profile measured "
        f"now, alpha {choice['alpha']:.2f}, cost(gamma + 1) "
        f"{pred['cost']:.2f}, c {pred['c']:.3f}, predicted speed-up "
        f"{pred['speedup']:.2f}x" + (f"; {choice['why']}" if
                                     choice['gamma'] == 0 else ''),
        flush=True)
  return choice


def _records(loaded: loading.Loaded, u: int, batch, done: set, inputs,
             base, spec, times: Dict[str, float], gamma: int,
             load: Optional[measure.OtherLoad] = None
             ) -> List[Dict[str, Any]]:
  """The records of a unit's rows not in `done` (examples.jsonl's fields).

  Args:
    loaded: the built setup.
    u: the unit.
    batch: its examples, `(index, ids, input text, target text)`.
    done: indices already recorded.
    inputs: its inputs (the first `len(batch)` rows are its examples).
    base: its baseline decode.
    spec: its speculative decode.
    times: seconds per decode, {'baseline', 'speculative'}.
    gamma: the gamma it was decoded with.
    load: what else ran while the unit was timed (`other_load`: [CPU s
      of other processes, wall s], the unit's; None: not known).
  """
  setup, n = loaded.setup, len(batch)
  st = spec.stats
  divergences = {}
  if setup.sampling.greedy:  # why a greedy row differs: rounding or a bug
    divergences = {d.row: d.to_dict() for d in diagnostics.diagnose(
        partitioning.unwrap(loaded.target), loaded.target_params, inputs[:n],
        np.asarray(base.tokens)[:n], np.asarray(spec.tokens)[:n])}
  text = lambda out, row, length: data.decode_text(
      loaded.vocabulary, out.tokens[row], length, setup.data.eos_id)
  records = []
  for row, (i, ids, in_text, tgt_text) in enumerate(batch):
    if i in done:
      continue
    b_len, s_len = int(base.lengths[row]), int(spec.lengths[row])
    record = dict(
        index=i, batch=i // setup.batch.size,
        example=run_folder.example_fingerprint(ids, in_text, tgt_text),
        input=in_text,
        target=tgt_text, baseline=text(base, row, b_len),
        speculative=text(spec, row, s_len),
        baseline_length=b_len, speculative_length=s_len,
        identical=bool(np.array_equal(base.tokens[row], spec.tokens[row])),
        iterations=int(st.row_iterations[row]),
        drafted=int(st.drafted[row]), accepted=int(st.accepted[row]),
        beta_sum=float(st.beta_sum[row]),
        beta_count=int(st.beta_count[row]),
        batching='stream' if setup.batch.streamed else 'fixed', gamma=gamma,
        baseline_batch_s=times['baseline'],
        speculative_batch_s=times['speculative'],
        divergence=divergences.get(row))
    if load is not None and load.cpu_s is not None:
      record['other_load'] = [load.cpu_s, load.seconds]
    if setup.batch.streamed:
      record['chunk'] = u
    records.append(record)
  return records


def _learn(loaded: loading.Loaded, batch, inputs, spec, draft_params,
           commit):
  """The output cache grown by a unit's outputs; the drafter's new params.

  The cache learns every output of the unit (all its rows: a unit decoded
  again after a crash starts from the cache as it was before the unit); the
  next unit drafts from it. A grown capacity is a new compiled shape:
  warmed up again outside the timings. With `commit` the grown cache is
  staged with the unit's examples.
  """
  n = len(batch)
  loaded.store.add_requests(
      loaded.target, loaded.target_params, inputs[:n],
      [np.asarray(spec.tokens[row])[:int(spec.lengths[row])]
       for row in range(n)])
  if commit is not None:
    commit.stage(loaded.store, [i for i, *_ in batch])
  if not isinstance(loaded.drafter, interfaces.StoreDrafter):
    raise TypeError(f'{type(loaded.drafter).__name__} reads an output '
                    'cache but is no interfaces.StoreDrafter (it has '
                    'no with_store).')
  return loaded.drafter.with_store(draft_params, loaded.store)


@dataclasses.dataclass
class Lane:
  """One setup decoded against a baseline that other lanes may share.

  Lanes whose baselines are one program (the same target, task, sampling,
  lengths, batches and seed; only the drafting differs) share each unit's
  baseline decode: one baseline per unit, timed alternately with every
  lane's speculative decode (`decode_units`), so N drafters cost N + 1
  decodes a unit, not 2N, and every ratio is measured side by side.

  Attributes:
    loaded: the built setup.
    done: indices its run folder already has records of.
    choice_file: where its gamma (or tree) choice is kept; None: not kept.
    commit: its output cache's `run_folder.CacheCommit`, or None.
  """

  loaded: loading.Loaded
  done: set = dataclasses.field(default_factory=set)
  choice_file: Any = None
  commit: Any = None
  choice: Optional[Dict[str, Any]] = dataclasses.field(default=None,
                                                       init=False)
  gamma: int = dataclasses.field(default=0, init=False)
  draft_params: Any = dataclasses.field(default=None, init=False)

  def start(self, where) -> None:
    """The gamma (tree) it decodes with: configured, or the resumed run's
    choice (`where.agree`d: process 0's file); else chosen on the first
    unit (`choosing`). A choice file one process cannot read is said to
    all (`run_folder.every_process`), none left waiting for it."""
    setup = self.loaded.setup
    if setup.batch.profile_gamma or setup.draft.chooses_tree:
      self.choice = where.agree(run_folder.every_process(
          lambda: _configured_choice(self.loaded, self.choice_file)))
    self.gamma = setup.gamma if self.choice is None else self.choice['gamma']
    if self.choice is not None and 'tree' in self.choice:
      self.take_tree(self.choice)
    self.draft_params = self.loaded.draft_params

  def choosing(self, what: str) -> bool:
    """Whether its 'tree' or 'gamma' is still to be chosen."""
    return self.choice is None and (
        self.loaded.setup.draft.chooses_tree if what == 'tree' else
        chooses_gamma(self.loaded))

  def take_tree(self, choice: Dict[str, Any]) -> None:
    """Decodes with a tree choice from now on (its tree; its gamma: the
    tree's depth, or 0: no speculation)."""
    self.choice = choice
    self.loaded = with_tree(self.loaded, choice['tree'])
    self.gamma = choice['gamma']

  def refining(self) -> bool:
    """Whether its tree, chosen, awaits its first timed decode (whose
    iteration time `refine_tree` prices)."""
    return (self.loaded.setup.draft.chooses_tree and self.gamma > 0 and
            self.choice is not None and 'fixed_ms' not in self.choice)

  def programs(self):
    """Its (baseline, speculative or None) programs at its gamma."""
    return programs_at(self.loaded, self.gamma)


def _shared_baseline(lanes: Sequence[Lane]) -> programs.Program:
  """The lanes' one baseline program (ValueError where they differ)."""
  base = lanes[0].programs()[0]
  for lane in lanes[1:]:
    other = lane.programs()[0]
    mine, ours = (jax.tree.leaves(x.loaded.target_params)
                  for x in (lane, lanes[0]))
    same = len(mine) == len(ours) and all(
        a is b for a, b in zip(mine, ours))  # the very arrays
    if other.spec != base.spec or other.target != base.target or not same:
      raise ValueError(
          f'lanes {lanes[0].loaded.setup.draft.kind!r} and '
          f'{lane.loaded.setup.draft.kind!r} do not share a baseline '
          f'({base.spec} vs {other.spec}, or another target): decode them '
          'in runs of their own.')
  return base


def _unit_calls(lanes: Sequence[Lane], active: Sequence[int],
                base: programs.Program, inputs, rng) -> Dict[Any, Any]:
  """A unit's decodes: {'baseline': call, lane index: call} for the
  `active` lanes; a lane without speculation (gamma 0) decodes the
  baseline again, as a speculative result that drafted nothing."""
  params = lanes[0].loaded.target_params
  calls = {'baseline': lambda: base(params, inputs, rng)}
  for i in active:
    lane = lanes[i]
    spec = lane.programs()[1]
    calls[i] = programs.calls(base, spec, params, lane.draft_params, inputs,
                              rng)['speculative']
  return calls


def _warm(calls, keys, warmed: set) -> None:
  """Runs once (compiles, outside the timings) each call whose key is not
  in `warmed`."""
  cold = {name: call for name, call in calls.items()
          if keys[name] not in warmed}
  warmed.update(keys[name] for name in cold)
  if cold:
    measure.time_alternating(cold)


def decode_units(lanes: Sequence[Lane], examples: Sequence[Any],
                 timing_repeats: int, share=(0, 1), partitioner=None
                 ) -> Iterator[List[List[Dict[str, Any]]]]:
  """Decodes every unfinished unit with the baseline and each lane's
  speculative decoding; yields each unit's records, a list per lane.

  A unit is a batch, or streamed (`BatchSpec.streamed`) a chunk of
  `stream_chunk` batches' worth of examples through the `batch_size` slots
  of the streaming loops (`streaming`). A unit is decoded by the lanes
  that lack records of it (with the baseline); rows a lane has
  (`Lane.done`: a unit cut short by a crash) are not recorded again. With
  `share` (index, count) only units u with u % count == index are decoded
  (a process's share); with a `partitioner` each unit's inputs are placed
  on its mesh (batch over 'data'; refills: `streaming.bucket_sizes`; a mesh
  over processes: outputs by `partitioning.to_host`, timed choices alike by
  `Partitioner.agree`).

  The lanes' one baseline (`_shared_baseline`) and their speculative
  decodes run on the same inputs and rng, compiled (each new input /
  drafter shape is decoded once untimed), timed alternately
  (`measure.time_alternating`, the first one alternating between units).
  An output cache (kinds 'cache', 'combined') learns the finished outputs
  after each unit: streamed, the examples of a chunk draft from the outputs
  of earlier chunks (fixed: of earlier batches). With a lane's `commit` (a
  `run_folder.CacheCommit`) its grown cache is staged before the unit's
  records are yielded; the caller appends them, then finishes the commit.

  A lane with `setup.batch.profile_gamma` sets gamma for the rest at the
  first unit (`choose_gamma`: costs timed now, alpha on its untimed
  decodes of the first examples at `setup.gamma`, `warmup_alpha`); one
  with a tree 'choose:N' its tree (`choose_tree`, on the unit's baseline
  decode); each kept in its `choice_file` (read back when the run
  resumes). Every record says the gamma it was decoded with.
  """
  setup = lanes[0].loaded.setup
  all_inputs = data.pad_rows([ids for _, ids, _, _ in examples],
                             setup.data.task_feature_lengths['inputs'])
  where = partitioner or partitioning.OneDevice()
  warmed = set()  # what is compiled: (input shape, program) keys
  for lane in lanes:
    lane.start(where)
  for u, start, n, inputs in tqdm(list(units(setup, all_inputs)),
                                  desc='eval', unit='chunk' if
                                  setup.batch.streamed else 'batch'):
    batch = examples[start:start + n]
    active = [i for i, lane in enumerate(lanes)  # lanes lacking a record
              if any(j not in lane.done for j, *_ in batch)]
    if u % share[1] != share[0] or not active:
      continue
    placed = where.shard_batch(inputs)
    rng = jax.random.fold_in(jax.random.key(setup.seed), u)
    base = _shared_baseline(lanes)
    for lane in (lanes[i] for i in active):
      if lane.choosing('tree'):  # on the first examples' baseline outputs
        lane.take_tree(_tree_choice(lane.loaded, *_baseline_outputs(
            setup, base, lane.loaded.target_params, all_inputs, where, rng),
                                    lane.choice_file, where))
    shapes = np.shape(inputs)
    keys = lambda: {'baseline': (shapes, base.spec), **{
        i: (shapes, i, lanes[i].gamma, lanes[i].loaded.drafter,
            str(jax.tree_util.tree_map(np.shape, lanes[i].draft_params)))
        for i in active}}
    calls = _unit_calls(lanes, active, base, placed, rng)
    _warm(calls, keys(), warmed)
    for lane in (lanes[i] for i in active):
      if lane.choosing('gamma'):  # on the first examples' decodes
        lane.choice = _profile_choice(lane, inputs, *warmup_alpha(
            lane, base, all_inputs, where, rng), where)
        lane.gamma = lane.choice['gamma']
    base = _shared_baseline(lanes)  # a same-shape one's block
    calls = _unit_calls(lanes, active, base, placed, rng)
    _warm(calls, keys(), warmed)  # what the choices changed
    with measure.OtherLoad() as load:  # what else ran while timing
      res, times = measure.time_alternating(calls, timing_repeats,
                                            reverse=u % 2 == 1)
    res = {name: partitioning.to_host(r) for name, r in res.items()}
    out = [[] for _ in lanes]
    for i, lane in ((i, lanes[i]) for i in active):
      records = _records(lane.loaded, u, batch, lane.done, inputs,
                         res['baseline'], res[i], {
                             'baseline': times['baseline'],
                             'speculative': times[i]}, lane.gamma, load)
      if lane.loaded.store is not None and records:
        lane.draft_params = _learn(lane.loaded, batch, inputs, res[i],
                                   lane.draft_params, lane.commit)
      if lane.refining():  # the chosen tree's iterations, timed: again
        lane.take_tree(_tree_refinement(lane.loaded, lane.choice, res[i],
                                        times[i], lane.choice_file, where))
      out[i] = records
    yield out
