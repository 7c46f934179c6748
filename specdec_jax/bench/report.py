"""One results header and the json / md / png writers of every benchmark.

Every results file under results/ starts from `header`: the command that
reran it (home written as ~, so no machine path is committed), the device,
jax version, machine and date. `write_json` / `write_md` write the forms a
benchmark commits; `config_dict` turns a `T5Config` into plain JSON.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import pathlib
import re
import sys
import time
from typing import Any, Dict, Optional, Sequence

import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import measure
from specdec_jax import network


# Distributions whose versions a compiled program depends on (those
# installed).
PACKAGES = ('jax', 'jaxlib', 'jax-cuda13-plugin', 'jax-cuda13-pjrt',
            'jax-cuda12-plugin', 'jax-cuda12-pjrt', 'libtpu')


def versions() -> Dict[str, str]:
  """{distribution: version} of `PACKAGES` installed here."""
  out = {}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def portable(text: str) -> str:
  """`text` with the home directory written as ~ (results name no machine)."""
  home = os.path.expanduser('~')
  return text.replace(home + os.sep, '~' + os.sep) if home != '~' else text


def device_name(kind: Optional[str] = None) -> str:
  """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (results/<name>)."""
  kind = jax.devices()[0].device_kind if kind is None else kind
  return re.sub(r'[^a-z0-9]+', '-', kind.lower()).strip('-') or 'device'


def header(script: str, argv: Optional[Sequence[str]] = None,
           **extra) -> Dict[str, Any]:
  """command, device, device_name, backend, jax_version, machine, date."""
  args = sys.argv[1:] if argv is None else list(argv)
  kind = jax.devices()[0].device_kind
  return dict(
      command=portable(' '.join(['python', script] + args)),
      device=kind, device_name=device_name(kind),
      backend=jax.default_backend(), jax_version=jax.__version__,
      machine=measure.machine(), date=time.strftime('%Y-%m-%d'), **extra)


def config_dict(cfg: network.T5Config) -> Dict[str, Any]:
  """A T5Config as plain JSON values (dtypes by name)."""
  out = {}
  for f in dataclasses.fields(cfg):
    v = getattr(cfg, f.name)
    if isinstance(v, (int, float, str, bool, type(None))):
      out[f.name] = v
    elif isinstance(v, (tuple, list)):
      out[f.name] = list(v)
    else:
      out[f.name] = np.dtype(v).name
  return out


def _default(x):
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.floating):
    return float(x)
  if isinstance(x, (np.ndarray, jax.Array)):
    return np.asarray(x).tolist()
  if dataclasses.is_dataclass(x):
    return dataclasses.asdict(x)
  return str(x)


def write_json(path, obj: Any) -> pathlib.Path:
  """`obj` as indented JSON (numpy / jax values as plain numbers), whole
  or not at all (`checkpoints.write_bytes`): a run stopped as it writes
  leaves the file it had, which a rerun reads and updates."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  checkpoints.write_bytes(str(path), (json.dumps(
      obj, indent=1, default=_default) + '\n').encode())
  return path


def read_json(path) -> Any:
  """A results file, local or gs://, with its name in the error if it is
  not valid JSON."""
  try:
    return json.loads(checkpoints.read_bytes(os.fspath(path)))
  except json.JSONDecodeError as e:
    raise checks.InputError(f'{path} is not valid JSON: {e}') from e


def write_md(path, text: str) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text if text.endswith('\n') else text + '\n')
  return path


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A markdown table (cells as given; None as '-')."""
  cell = lambda x: '-' if x is None else str(x)
  lines = ['| ' + ' | '.join(columns) + ' |',
           '|' + '---|' * len(columns)]
  lines += ['| ' + ' | '.join(cell(x) for x in r) + ' |' for r in rows]
  return '\n'.join(lines)


def fmt(x, spec: str = '.2f') -> str:
  return '-' if x is None else format(x, spec)

