"""The bench harness: profiles are the measured runs, one prediction.

The shipped profiles must be exactly what their measured runs give (no hand
edit survives), and `predict` must reproduce the predictions the H100 run
made with its own code.
"""

import json
import pathlib
import re

import pytest

from specdec_jax import checks
from specdec_jax import hardware
from specdec_jax import models
from specdec_jax.bench import report

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(source):
  return json.loads((ROOT / source).read_text())


@pytest.mark.parametrize('name', [hardware.H100, hardware.CPU])
def test_profile_is_its_measured_run(name):
  profile = hardware.load(name)
  run = _run(profile.source)
  assert hardware.from_run(run, profile.source).to_json() == (
      profile.to_json())


def test_predict_reproduces_the_h100_runs_own_predictions():
  profile = hardware.load(hardware.H100)
  run = _run(profile.source)
  checked = 0
  for row in run['table2'] + run['batches']:
    p = hardware.predict(profile, alpha=row['alpha'], gamma=row['gamma'],
                         drafter=row['drafter'], batch=row['batch'])
    assert p.speedup == pytest.approx(row['predicted'], rel=1e-9), row
    assert p.c == pytest.approx(row['c'], rel=1e-12)
    checked += 1
  assert checked >= 4


def test_cost_is_measured_interpolated_or_extrapolated_and_says_which():
  profile = hardware.load(hardware.H100)
  curve = profile.cost[8]
  assert profile.cost_at(8, 8) == (curve[8], hardware.MEASURED)
  value, how = profile.cost_at(4, 8)
  assert how == hardware.INTERPOLATED
  assert value == pytest.approx(curve[1] + 3 / 7 * (curve[8] - curve[1]))
  top = profile.max_measured_k(1)
  assert profile.cost_at(top + 10, 1) == (profile.cost[1][top],
                                          hardware.EXTRAPOLATED)
  with pytest.raises(KeyError, match='measured batches'):
    profile.cost_at(2, batch=3)
  p = hardware.predict(profile, tokens_per_call=3.0, width=top + 10,
                       drafter_calls_per_call=0)
  assert 'beyond the measured k' in p.label


def test_unmeasured_drafter_is_the_labelled_bytes_model_or_an_error():
  profile = hardware.load(hardware.H100)
  with pytest.raises(KeyError, match="did not time drafter 'heads'"):
    profile.c_of('heads')
  c, how = profile.c_of('heads', step_bytes=1e9, kernels=10)
  assert how == hardware.BYTES_MODEL
  want = (1e9 / profile.bandwidth + 10 * profile.launch_ms * 1e-3) / (
      profile.t1_ms * 1e-3)
  assert c == pytest.approx(want)
  p = hardware.predict(profile, alpha=0.7, gamma=4, drafter='heads',
                       step_bytes=1e9, kernels=10)
  assert 'bytes / launches model' in p.label
  # dec2 was timed at batch 8; small only at batch 1, and it says so.
  assert profile.c_of('dec2', 8)[1] == hardware.MEASURED
  assert profile.c_of('small', 8) == (profile.c[1]['small'],
                                      'measured at batch 1')


def test_predict_from_counters():
  profile = hardware.load(hardware.H100)
  p = hardware.predict(profile, tokens_per_call=3.0, width=5,
                       drafter_calls_per_call=4, c=0.1)
  assert p.speedup == pytest.approx(3.0 / (profile.cost[1][5] + 0.4))
  with pytest.raises(ValueError, match='alpha or tokens_per_call'):
    hardware.predict(profile, gamma=3)


def test_profile_errors_name_the_file(tmp_path):
  with pytest.raises(FileNotFoundError, match='profiles:'):
    hardware.load('no-such-device')
  bad = tmp_path / 'bad.json'
  bad.write_text('{"name": ')
  with pytest.raises(ValueError, match='bad.json'):
    hardware.load(str(bad))
  bad.write_text('{"name": "x"}')
  with pytest.raises(ValueError, match='bad.json.*needs'):
    hardware.load(str(bad))


_CONSTANT = re.compile(
    r'^\s*[A-Z0-9_]*(H100|TPU|GPU|HARDWARE|BANDWIDTH|STEP_S|STEP_MS|DRAFT_MS|DEC2_C)'
    r'[A-Z0-9_]*\s*=\s*[-\d{(]', re.M)


def test_no_hand_typed_hardware_constant_in_code():
  found = []
  for path in list((ROOT / 'scripts').glob('*.py')) + list(
      (ROOT / 'specdec_jax').rglob('*.py')):
    found += [f'{path.relative_to(ROOT)}: {m.group(0).strip()}'
              for m in _CONSTANT.finditer(path.read_text())]
  assert not found, found


def test_model_config_specs():
  cfg = models.config('t5_1_1_tiny,vocab_size=64,dtype=float32')
  assert (cfg.vocab_size, cfg.dtype, cfg.emb_dim) == (64, 'float32', 8)
  with pytest.raises(ValueError, match='unknown model config'):
    models.config('t5_1_1_huge')
  with pytest.raises(ValueError, match='no field'):
    models.config('t5_1_1_tiny,width=3')
  with pytest.raises(ValueError, match=r"spec 't5_1_1_tiny,width'.*'width' "
                     'is not field=value'):
    models.config('t5_1_1_tiny,width')
  # Before: Python's "not enough values to unpack", and the
  # last of two values, silently.
  with pytest.raises(checks.InputError, match="unknown model config ''; "
                     'known: flan_t5_base'):
    models.config(',')
  with pytest.raises(checks.InputError, match='vocab_size set twice'):
    models.config('t5_1_1_tiny,vocab_size=64,vocab_size=128')
  assert models.assignment(' emb_dim = 16') == ('emb_dim', 16)
  with pytest.raises(ValueError, match='give its model config'):
    models.load('/no/such/checkpoint_1')
  with pytest.raises(checks.InputError, match="spec must be 'shipped:"):
    models.load(None)  # before: an AttributeError


def test_device_names_are_folder_names():
  """A device's kind names its results folder and its profile."""
  assert report.device_name('NVIDIA H100 80GB HBM3') == (
      'nvidia-h100-80gb-hbm3')
  assert report.device_name('TPU v5 lite') == 'tpu-v5-lite'
  assert report.device_name('cpu') == 'cpu'
