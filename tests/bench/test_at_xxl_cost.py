"""PREDICTED speed-ups at T5-XXL target cost (specdec_jax/bench/at_xxl_cost.py)."""

import pytest

from specdec_jax import hardware
from specdec_jax.bench import at_xxl_cost


def test_the_prediction_is_predict_on_the_measured_profile():
  """A drafter the H100 profile timed is `hardware.predict` on its measured
  c; one it did not time is priced by the profile's bytes / launches
  model, labelled and marked; one neither timed nor modelled is None."""
  profile = hardware.load(hardware.H100)
  for drafter, timed in (('dec2', 'dec2'),
                         ('small', 'small@t5_1_1_small_cost'),
                         ('bigram', 'bigram')):
    got = at_xxl_cost.predict(profile, 0.7, drafter)
    want = hardware.predict(profile, alpha=0.7, drafter=timed)
    assert got['speedup'] == want.speedup and got['gamma'] == want.gamma
    assert got['c'] == profile.c[1][timed]
    assert got['c_how'] == hardware.MEASURED
    assert at_xxl_cost.cell(got) == (
        f'{want.speedup:.2f}x ({want.gamma})')
  # Not timed: the profile's bytes / launches model, labelled and marked.
  base = at_xxl_cost.predict(profile, 0.7, 'base')
  assert base['c_how'] == hardware.BYTES_MODEL
  assert 'bytes / launches model' in base['label']
  assert base['kernels'] > 0 and base['step_bytes'] > 0
  c, _ = profile.c_of('base', step_bytes=base['step_bytes'],
                      kernels=base['kernels'])
  assert base['c'] == pytest.approx(c)
  large = at_xxl_cost.predict(profile, 0.7, 'large')
  assert large['c'] > base['c']
  assert at_xxl_cost.cell(base).endswith('†')
  assert at_xxl_cost.predict(profile, 0.7, 'heads') is None
  assert at_xxl_cost.cell(None) == '-'
  note = at_xxl_cost.note(profile)
  assert f'predicted on profile {profile.name}' in note
  assert 'through hardware.predict' in note
