"""PREDICTED speed-ups at T5-XXL target cost on a measured hardware profile.

A row measured on the shipped models (or any model set) is predicted at
the paper's costs (`predict`: `hardware.predict` with its alpha on the
profile's measured cost(k) of a T5 1.1-XXL-cost target): its drafter taken
at the cost the H100 profile's run timed it under (`STAND_INS`: 'small' is
the shipped small widened to T5 1.1-small's cost), or, one the run did not
time, as a shipped model whose decoder step sets the profile's bytes /
launches model (`MODELLED`). `cell` and `note` are the column and the note
a results page shows it with (experiments/table.py, scripts/ship_models.py).
"""

from __future__ import annotations

import pathlib
from typing import Any, Dict, Optional, Tuple

from specdec_jax import hardware
from specdec_jax import measure
from specdec_jax import network
from specdec_jax import shipped
from specdec_jax import theory
from specdec_jax import widening
from specdec_jax.bench import report

# A drafter the H100 profile's run timed -> the name of its c there.
STAND_INS = {'small': 'small@t5_1_1_small_cost', 'dec2': 'dec2',
             'unigram': 'unigram', 'bigram': 'bigram'}
# One it did not time -> (the shipped model whose decoder step prices it,
# a widening preset or config changes).
MODELLED = {
    'base': ('small', 't5_1_1_base_cost'),
    'large': ('small', 't5_1_1_large_cost'),
    'dec1': ('dec2', {'num_decoder_layers': 1}),
}
# The timed drafter whose step fits the launches per decoder layer:
# (profile name, shipped model, preset).
LAUNCH_FIT = ('small@t5_1_1_small_cost', 'small', 't5_1_1_small_cost')
ROOT = pathlib.Path(__file__).resolve().parents[2]
_CACHE: Dict[Any, Any] = {}


def _how(change) -> str:
  return f'at {change}' if isinstance(change, str) else f'with {change}'


def _step(profile, model: str, change) -> Tuple[int, int, str]:
  """(bytes one decoder step reads, decoder layers, what) of a shipped
  model at a preset / with config changes, bfloat16, at the profile run's
  input length and half its output length decoded."""
  key = (profile.name, model, str(change))
  if key not in _CACHE:
    cfg = shipped.config(model, dtype='bfloat16')
    cfg = (widening.preset_config(cfg, change) if isinstance(change, str)
           else cfg.replace(**change))
    net = network.T5Model(cfg)
    source = ROOT / profile.source
    setup = report.read_json(source).get('setup', {}) if (
        source.is_file()) else {}
    length_in = int(setup.get('input_length', 0))
    context = int(setup.get('output_length', 0)) // 2
    what = (f'shipped {model} {_how(change)}, bfloat16, '
            f'{cfg.num_decoder_layers} decoder layers, caches at input '
            f'{length_in}, {context} decoded tokens')
    _CACHE[key] = (measure.step_bytes(net, net.param_shapes(), 1, context,
                                      length_in),
                   cfg.num_decoder_layers, what)
  return _CACHE[key]


def launches_per_layer(profile) -> Tuple[float, str]:
  """(kernel launches per decoder layer, how), fitted to `LAUNCH_FIT`: its
  step time less bytes / bandwidth, in launch times, per decoder layer; 0
  (said) where the profile lacks the launch time, bandwidth or drafter."""
  name, model, preset = LAUNCH_FIT
  if (profile.launch_ms is None or profile.bandwidth is None
      or name not in profile.c.get(1, {})):
    return 0.0, f'no launches (profile {profile.name} has no {name} or ' \
        'launch time)'
  nbytes, layers, _ = _step(profile, model, preset)
  rest_s = profile.c[1][name] * profile.t1_ms * 1e-3 - (
      nbytes / profile.bandwidth)
  per_layer = max(rest_s, 0.0) / (profile.launch_ms * 1e-3) / layers
  return per_layer, (f'{per_layer:.2f} launches per decoder layer, fitted '
                     f'to the timed {name} ({layers} layers)')


def predict(profile, alpha: float, drafter: str,
                        gamma: Optional[int] = None
                        ) -> Optional[Dict[str, Any]]:
  """The PREDICTED speed-up of `drafter` at T5-XXL target cost on `profile`:
  `hardware.predict` with alpha, the best gamma within the measured cost(k)
  (or `gamma`) and the c measured for the drafter's stand-in
  (`STAND_INS`) or modelled (`MODELLED`).

  Returns:
    `Prediction.to_json()` plus `drafter_as` (what the drafter is taken
    as), or None for a drafter neither timed nor modelled.
  """
  alpha = theory.clamp_alpha(alpha)
  if drafter in STAND_INS:
    name = STAND_INS[drafter]
    if name not in profile.drafters(1):
      return None
    p = hardware.predict(profile, alpha=alpha, gamma=gamma, drafter=name)
    return dict(p.to_json(), drafter_as=f'{name} (timed)')
  if drafter not in MODELLED or profile.bandwidth is None:
    return None
  nbytes, layers, what = _step(profile, *MODELLED[drafter])
  per_layer, how = launches_per_layer(profile)
  kernels = round(per_layer * layers)
  p = hardware.predict(profile, alpha=alpha, gamma=gamma,
                       drafter=f'{drafter} (modelled)', step_bytes=nbytes,
                       kernels=kernels)
  return dict(p.to_json(), drafter_as=f'{what} (not timed)',
              step_bytes=nbytes, kernels=kernels, kernels_how=how)


def cell(pred: Optional[Dict[str, Any]]) -> str:
  """'2.05x (5)', a dagger for the bytes / launches model, '-' for None."""
  if not pred:
    return '-'
  mark = '' if pred['c_how'].startswith('measured') else ' †'
  return f"{pred['speedup']:.2f}x ({pred['gamma']}){mark}"


def note(profile) -> str:
  """What a 'predicted <profile>' column is, for a results .md."""
  stand_in = ', '.join(f'{k} as {v}' for k, v in STAND_INS.items())
  modelled = ', '.join(f'{k} as shipped {m} {_how(c)}'
                       for k, (m, c) in MODELLED.items())
  return (
      f'"predicted {profile.name}" is PREDICTED, not measured: predicted on '
      f'profile {profile.name} (specdec_jax/profiles, read from '
      f'{profile.source}) through hardware.predict: Theorem 3.8 with '
      "the row's alpha, the profile's measured cost(gamma + 1) of its "
      f'target ({profile.target}) and the best gamma within the measured '
      f'k (in brackets). c: measured for {stand_in}; marked † the bytes / '
      f'launches model of the profile (step bytes / its bandwidth + '
      f'launches x its launch time, over its t(1); '
      f'{launches_per_layer(profile)[1]}) for {modelled}: the profile did '
      'not time them.')
