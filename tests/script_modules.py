"""scripts/<name>.py as modules, for the tests of the scripts.

scripts/ is no package: a script is loaded from its file once per test
process and registered in `sys.modules` (its dataclasses look their module
up there).
"""

import importlib.util
import pathlib
import sys

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / 'scripts'


def load_script(name: str):
  """The module of scripts/<name>.py, loaded once."""
  key = f'script_{name}'
  if key not in sys.modules:
    spec = importlib.util.spec_from_file_location(key, SCRIPTS / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
  return sys.modules[key]
