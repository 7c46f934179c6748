"""Measured hardware profiles and the one speed-up prediction.

A `HardwareProfile` holds what a run measured on one device: the time of a
1-token target call t(1), its memory floor and the bandwidth behind it, the
cost curve cost(k) = t(k) / t(1) of a k-token target call per batch size,
and c = t_draft / t(1) of each drafter it timed. It is READ from a measured
run's JSON, never typed by hand:

- `from_accelerator_run`: the json of the older device run (deleted from
  tools/accelerator/; a T5 1.1-XXL-cost target on a GPU), the source of the
  committed H100 profile;
- `from_costs_run`: scripts/benchmark_costs.py's json (this CPU);
- the `profile` spec (`specdec_jax.experiments.specs.profile`) writes one
  from its own measurements, which is how a device's profile is made now.

Each is written into `profiles/<name>.json`; `load(name)` reads it, and
the profile's `source` names the run file and its command. `python -m
specdec_jax.hardware` lists the profiles; `... RUN.json` writes RUN's
again.

`predict` is the ONE formula every "predicted" figure uses: Theorem 3.8 of
the paper (Leviathan et al. 2023) with the profile's measured
cost(gamma + 1) and c, or, from a run's counters, tokens per target call /
(cost(width) + drafter calls per target call x c). A drafter the profile did
not time is predicted from a stated bytes / launches model, and the
prediction says so (`Prediction.how`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
from typing import Any, Dict, Mapping, Optional, Tuple

from specdec_jax import checks
from specdec_jax import theory

PROFILES_DIR = pathlib.Path(__file__).resolve().parent / 'profiles'
# The repository's root: what a profile's `source` and a results file's
# own path are written relative to (`in_repository`).
ROOT = PROFILES_DIR.parents[1]
# The profile of our measured H100 run, and of the CPU the costs ran on.
H100 = 'nvidia-h100-80gb-hbm3'
CPU = 'cpu-amd-epyc-2-cores'

MEASURED = 'measured'
INTERPOLATED = 'interpolated between measured k'
EXTRAPOLATED = 'beyond the measured k: the largest measured cost'
BYTES_MODEL = 'bytes / launches model'


def _int_keys(d: Mapping[Any, Any]) -> Dict[int, Any]:
  return {int(k): v for k, v in d.items()}


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
  """What one run measured on one device (see the module docstring).

  Attributes:
    name: file name of the profile, e.g. 'nvidia-h100-80gb-hbm3'.
    device: the device as jax names it.
    target: the target whose calls were timed (dimensions, dtype).
    t1_ms: a 1-token target call at batch 1, milliseconds.
    floor_ms: its memory floor (step bytes / bandwidth), or None.
    bandwidth: bytes / s behind the floor, or None.
    launch_ms: the cheapest measured program call (launch-bound), or None:
      the per-kernel time of the bytes / launches model.
    cost: batch -> k -> cost(k) = t(k) / t(1) at that batch.
    c: batch -> drafter name -> measured c = t_draft / t(1).
    source: the run file the profile was read from.
    command: the command that measured it.
    date: when.
  """
  name: str
  device: str
  target: str
  t1_ms: float
  floor_ms: Optional[float]
  bandwidth: Optional[float]
  launch_ms: Optional[float]
  cost: Dict[int, Dict[int, float]]
  c: Dict[int, Dict[str, float]]
  source: str
  command: str
  date: str

  def batches(self) -> Tuple[int, ...]:
    return tuple(sorted(self.cost))

  def cost_at(self, k: int, batch: int = 1) -> Tuple[float, str]:
    """(cost(k) at `batch`, how it was obtained).

    Measured k: the measured value. Between two measured k: linear
    interpolation. Beyond the largest measured k: that k's cost (a target
    call is bandwidth-bound far beyond the k measured here; labelled).

    Raises:
      KeyError: naming the measured batches, for a batch not measured.
    """
    if k < 1:
      raise ValueError(f'cost(k) needs k >= 1, got {k}')
    if batch not in self.cost:
      raise KeyError(f'profile {self.name!r} has no cost curve at batch '
                     f'{batch}; measured batches: {list(self.batches())}')
    curve = self.cost[batch]
    if k in curve:
      return float(curve[k]), MEASURED
    ks = sorted(curve)
    if k > ks[-1]:
      return float(curve[ks[-1]]), EXTRAPOLATED
    lo = max(x for x in ks if x < k)
    hi = min(x for x in ks if x > k)
    w = (k - lo) / (hi - lo)
    return float((1 - w) * curve[lo] + w * curve[hi]), INTERPOLATED

  def max_measured_k(self, batch: int = 1) -> int:
    return max(self.cost[batch])

  def drafters(self, batch: int = 1) -> Tuple[str, ...]:
    return tuple(sorted(self.c.get(batch, {})))

  def c_of(self, drafter: str, batch: int = 1, *,
           step_bytes: Optional[float] = None,
           kernels: int = 0) -> Tuple[float, str]:
    """(c of `drafter` at `batch`, how it was obtained).

    The measured c at that batch; else the one measured at batch 1 (said);
    else, given the drafter's bytes read per step and kernels launched per
    step, the bytes / launches model (step_bytes / bandwidth + kernels x
    launch) / t(1).

    Raises:
      KeyError: naming the measured drafters, for a drafter the profile did
        not time when no bytes are given.
    """
    if drafter in self.c.get(batch, {}):
      return float(self.c[batch][drafter]), MEASURED
    if drafter in self.c.get(1, {}):
      return float(self.c[1][drafter]), f'{MEASURED} at batch 1'
    if step_bytes is None:
      raise KeyError(
          f'profile {self.name!r} did not time drafter {drafter!r} (timed: '
          f'{list(self.drafters(1))}); pass its step_bytes and kernels for '
          'the bytes / launches model')
    if self.bandwidth is None:
      raise KeyError(f'profile {self.name!r} has no bandwidth: no bytes / '
                     f'launches model for {drafter!r}')
    seconds = step_bytes / self.bandwidth + kernels * (
        (self.launch_ms or 0.0) * 1e-3)
    return seconds / (self.t1_ms * 1e-3), BYTES_MODEL

  @classmethod
  def of_run(cls, name: str, batch: int, t1_s: float,
             cost: Mapping[int, float], c: Mapping[str, float],
             device: str = '') -> 'HardwareProfile':
    """The profile of what a run measured itself at one batch: t(1)
    seconds, cost(k) = t(k) / t(1) per k, c per drafter (no floor,
    bandwidth or launch time)."""
    return cls(name=name, device=device, target='', t1_ms=t1_s * 1e3,
               floor_ms=None, bandwidth=None, launch_ms=None,
               cost={batch: {int(k): float(v) for k, v in cost.items()}},
               c={batch: {d: float(v) for d, v in c.items()}}, source='',
               command='', date='')

  def to_json(self) -> Dict[str, Any]:
    d = dataclasses.asdict(self)
    d['cost'] = {str(b): {str(k): v for k, v in curve.items()}
                 for b, curve in self.cost.items()}
    d['c'] = {str(b): dict(cs) for b, cs in self.c.items()}
    return d

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> 'HardwareProfile':
    fields = {f.name for f in dataclasses.fields(cls)}
    missing = fields - set(d)
    if missing:
      raise ValueError(f'a hardware profile needs {sorted(missing)}')
    d = dict(d)
    d['cost'] = {int(b): _int_keys(curve) for b, curve in d['cost'].items()}
    d['c'] = {int(b): dict(cs) for b, cs in d['c'].items()}
    return cls(**{k: d[k] for k in fields})


def from_accelerator_run(run: Mapping[str, Any],
                         source: str) -> HardwareProfile:
  """The profile of an older device run (its json; the H100 profile's
  source).

  cost(k) per batch from the run's bfloat16 costs (the activations the
  table ran with); c per batch of every drafter it timed; launch_ms the
  cheapest drafter call it timed.
  """
  setup = run['setup']
  act = setup.get('activation_dtype', 'bfloat16')
  costs = run['costs'][act]
  c, draft_ms = {}, []
  for name, d in run['drafters'].items():
    for b, value in d['c'].items():
      c.setdefault(int(b), {})[name] = float(value)
    draft_ms += [float(t) for t in d['t_draft_ms'].values()]
  cfg = setup['target_config']
  target = (f"T5 1.1-XXL cost: emb {cfg['emb_dim']}, "
            f"{cfg['num_encoder_layers']}+{cfg['num_decoder_layers']} layers, "
            f"{setup['weights_dtype']} weights, {act} activations, input "
            f"{setup['input_length']}, output {setup['output_length']}")
  return HardwareProfile(
      name=run['device_name'], device=run['device'], target=target,
      t1_ms=float(run['floor']['t1_ms']),
      floor_ms=float(run['floor']['floor_ms']),
      bandwidth=float(run['bandwidth']['bytes_per_s']),
      launch_ms=min(draft_ms) if draft_ms else None,
      cost={int(b): {int(k): float(v) for k, v in x['cost'].items()}
            for b, x in costs.items()},
      c=c, source=source, command=run['command'], date=run['date'])


def from_costs_run(run: Mapping[str, Any], source: str,
                   name: str = CPU) -> HardwareProfile:
  """The profile of a scripts/benchmark_costs.py run (its json): this CPU.

  The T5 1.1-small-size target's t(k) at batch 1, the floor of that model
  from the larger of the two measured bandwidths, c of the drafter it
  timed.
  """
  t = _int_keys(run['t_target_ms'])
  floor = run.get('floor') or {}
  bw = max((floor[k]['bytes_per_s'] for k in ('read_bandwidth',
                                              'copy_bandwidth')
            if k in floor), default=None)
  model = (floor.get('models') or {}).get('T5 1.1-small') or {}
  return HardwareProfile(
      name=name, device=run['machine'],
      target=run.get('target', 'T5 1.1-small size, float32, batch 1'),
      t1_ms=float(t[1]),
      floor_ms=(float(model['floor_ms']) if 'floor_ms' in model else None),
      bandwidth=float(bw) if bw else None, launch_ms=None,
      cost={1: {k: v / t[1] for k, v in t.items()}},
      c={1: {run.get('drafter', 'drafter'): float(run['c'])}},
      source=source, command=run['command'], date=run.get('date', ''))


def from_run(run: Mapping[str, Any], source: str) -> HardwareProfile:
  """The profile of either kind of run: an older device run's json has a
  `setup`."""
  if 'setup' in run:
    return from_accelerator_run(run, source)
  return from_costs_run(run, source)


def in_repository(path) -> str:
  """`path` relative to the repository where it is inside it, else as
  given (a results file names no machine's folders)."""
  resolved = pathlib.Path(path).resolve()
  return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(
      ROOT) else str(path)


def path_of(name: str) -> pathlib.Path:
  return PROFILES_DIR / f'{name}.json'


def names() -> Tuple[str, ...]:
  return tuple(sorted(p.stem for p in PROFILES_DIR.glob('*.json')))


def write(profile: HardwareProfile, path=None) -> pathlib.Path:
  path = pathlib.Path(path) if path else path_of(profile.name)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(profile.to_json(), indent=1) + '\n')
  return path


def load(name_or_path: str) -> HardwareProfile:
  """A profile by name (`names()`) or by the path of its json file."""
  path = pathlib.Path(name_or_path)
  if not path.suffix:
    path = path_of(name_or_path)
  if not path.is_file():
    raise FileNotFoundError(
        f'no hardware profile {name_or_path!r} ({path}); profiles: '
        f'{list(names())}')
  return parse(path.read_text(), str(path))


def parse(text: str, where: str) -> HardwareProfile:
  """A profile from the json text of its file `where` (named in errors)."""
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise checks.InputError(f'hardware profile {where} is not valid JSON: '
                            f'{e}') from e
  try:
    return HardwareProfile.from_json(data)
  except (ValueError, TypeError, KeyError, AttributeError) as e:
    raise checks.InputError(f'hardware profile {where}: {e}') from e


def measured_run(profile: HardwareProfile) -> Optional[Dict[str, Any]]:
  """The run json a profile was read from (its measured rows), or None.

  `profile.source` is relative to the repository root; an installed package
  without results/ has no run.
  """
  path = ROOT / profile.source
  if not path.is_file():
    return None
  return json.loads(path.read_text())


@dataclasses.dataclass(frozen=True)
class Prediction:
  """A PREDICTED speed-up over the baseline, and what it rests on."""
  speedup: float
  profile: str
  batch: int
  gamma: Optional[int]
  width: int
  cost: float
  cost_how: str
  c: float
  c_how: str
  formula: str

  @property
  def label(self) -> str:
    """'predicted on <profile>' and every input that is not measured."""
    notes = [f'cost({self.width}) {self.cost_how}'] if (
        self.cost_how != MEASURED) else []
    if self.c_how != MEASURED and self.c:
      notes.append(f'c {self.c_how}')
    extra = f' ({"; ".join(notes)})' if notes else ''
    return f'predicted on {self.profile}, batch {self.batch}{extra}'

  def to_json(self) -> Dict[str, Any]:
    return dict(dataclasses.asdict(self), label=self.label)


def _c(profile, drafter, c, batch, step_bytes, kernels) -> Tuple[float, str]:
  if c is not None:
    return float(c), 'given'
  if drafter is None:
    return 0.0, 'no drafter call'
  return profile.c_of(drafter, batch, step_bytes=step_bytes, kernels=kernels)


def predict(profile: HardwareProfile, *, alpha: Optional[float] = None,
            gamma: Optional[int] = None,
            tokens_per_call: Optional[float] = None,
            drafter_calls_per_call: Optional[float] = None,
            width: Optional[int] = None,
            drafter: Optional[str] = None, c: Optional[float] = None,
            batch: int = 1, max_gamma: int = 16,
            step_bytes: Optional[float] = None,
            kernels: int = 0) -> Prediction:
  """The one speed-up prediction on a measured profile.

  Two forms:
  - from alpha (Theorem 3.8): (1 - alpha^(gamma+1)) /
    ((1 - alpha)(gamma c + cost(gamma + 1))); with `gamma=None` the gamma in
    1..max_gamma (and within the measured k) that maximizes it;
  - from a run's counters (`tokens_per_call` given): tokens per target call
    / (cost(width) + drafter_calls_per_call x c); `width` (the tokens of
    one target call) defaults to gamma + 1 and drafter_calls_per_call to
    gamma (a chain drafter calls once per draft).

  c is `c` if given, else the profile's c of `drafter` (measured, or the
  bytes / launches model from `step_bytes` and `kernels`), else 0 (no
  drafter call: n-gram tables in the same program, merged drafting).

  Returns:
    a `Prediction` whose `label` says what is predicted and from what.
  """
  c_value, c_how = _c(profile, drafter, c, batch, step_bytes, kernels)
  if tokens_per_call is not None:
    if width is None:
      if gamma is None:
        raise ValueError('predict from counters needs width or gamma')
      width = gamma + 1
    calls = gamma if drafter_calls_per_call is None else (
        drafter_calls_per_call)
    if calls is None:
      raise ValueError('predict from counters needs drafter_calls_per_call '
                       'or gamma')
    cost, how = profile.cost_at(width, batch)
    return Prediction(
        speedup=float(tokens_per_call) / (cost + float(calls) * c_value),
        profile=profile.name, batch=batch, gamma=gamma, width=width,
        cost=cost, cost_how=how, c=c_value, c_how=c_how,
        formula='tokens per target call / (cost(width) + drafter calls x c)')
  if alpha is None:
    raise ValueError('predict needs alpha or tokens_per_call')
  if gamma is None:
    top = min(max_gamma, profile.max_measured_k(batch) - 1)
    if top < 1:
      raise ValueError(f'profile {profile.name!r} measured no k > 1 at batch '
                       f'{batch}: no gamma to choose')
    curve = {g: profile.cost_at(g + 1, batch)[0] for g in range(1, top + 1)}
    gamma, _ = theory.optimal_gamma_and_speedup(
        alpha, c_value, target_cost_ratio=curve, max_gamma=top)
  cost, how = profile.cost_at(gamma + 1, batch)
  speedup = theory.walltime_improvement(alpha, gamma, c_value,
                                        target_cost_ratio=cost)
  if not math.isfinite(speedup):
    raise ValueError(f'no finite prediction for alpha {alpha}, gamma {gamma}')
  return Prediction(
      speedup=float(speedup), profile=profile.name, batch=batch, gamma=gamma,
      width=gamma + 1, cost=cost, cost_how=how, c=c_value, c_how=c_how,
      formula='Theorem 3.8 with the measured cost(gamma + 1)')


def main(argv=None) -> None:
  """`python -m specdec_jax.hardware`: the profiles; with a measured run's
  json (either kind, `from_run`), writes its profile (`write`)."""
  parser = argparse.ArgumentParser(
      prog='python -m specdec_jax.hardware', description='Lists the hardware '
      "profiles; given a measured run's json, writes its profile.")
  parser.add_argument('run', nargs='?', help="a measured run's json")
  args = parser.parse_args(argv)
  if args.run is None:
    for name in names():
      p = load(name)
      print(f'{name}: {p.device}; t(1) {p.t1_ms:.2f} ms; from {p.source}')
    return
  try:
    profile = from_run(json.loads(pathlib.Path(args.run).read_text()),
                       in_repository(args.run))
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise checks.InputError(f'{args.run} is no measured run: '
                            f'{type(e).__name__}: {e}') from e
  print(write(profile))


if __name__ == '__main__':
  checks.run_main(main)
