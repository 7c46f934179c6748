"""The T5 model configs as Python values, and loading a model from a spec.

The twin of gin_configs/models/ (as t5x's fiddle_configs/models/t5_1_1.py is
of its gin files): `CONFIGS['t5_1_1_xxl']` is the `network.T5Config` that
gin_configs/models/t5_1_1/xxl.gin binds to `T5_1_1_XXL`, with the same
vocabulary (32128) and dtype (bfloat16) defaults; tests/bench/test_bench.py checks
that every gin file and its twin agree. Scripts take their dimensions from
here instead of typing them.

`load(spec, config)` is how every benchmark and method script opens a model:
`shipped:<name>` (a shipped model, `shipped.model_names()`) or the path of
a T5X checkpoint (`.../checkpoint_<step>`, local or gs://) with a config
spec: a name of `CONFIGS` optionally followed by overrides,
e.g. 't5_1_1_small' or 't5_1_1_tiny,vocab_size=256,dtype=float32'.
"""

from __future__ import annotations

import ast
import collections
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import network
from specdec_jax import shipped

VOCAB_SIZE = 32128
DTYPE = 'bfloat16'

# The dimensions T5X gives each size (t5x/examples/t5/*/*.gin).
_T5_1_1 = dict(mlp_activations=('gelu', 'linear'), logits_via_embedding=False)
_T5_1_0 = dict(mlp_activations=('relu',), logits_via_embedding=True)


def _dims(emb, heads, layers, head_dim, mlp, family):
  return dict(emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
              num_decoder_layers=layers, head_dim=head_dim, mlp_dim=mlp,
              **family)


DIMS: Dict[str, Dict[str, Any]] = {
    't5_1_1_tiny': _dims(8, 4, 2, 3, 16, _T5_1_1),
    't5_1_1_small': _dims(512, 6, 8, 64, 1024, _T5_1_1),
    't5_1_1_base': _dims(768, 12, 12, 64, 2048, _T5_1_1),
    't5_1_1_large': _dims(1024, 16, 24, 64, 2816, _T5_1_1),
    't5_1_1_xl': _dims(2048, 32, 24, 64, 5120, _T5_1_1),
    't5_1_1_xxl': _dims(4096, 64, 24, 64, 10240, _T5_1_1),
    't5_1_0_small': _dims(512, 8, 6, 64, 2048, _T5_1_0),
    't5_1_0_base': _dims(768, 12, 12, 64, 3072, _T5_1_0),
    't5_1_0_large': _dims(1024, 16, 24, 64, 4096, _T5_1_0),
    't5_1_0_3B': _dims(1024, 32, 24, 128, 16384, _T5_1_0),
    't5_1_0_11B': _dims(1024, 128, 24, 128, 65536, _T5_1_0),
}
# Flan-T5 is the T5 1.1 LM-adapted architecture with T5 1.1's dimensions.
DIMS.update({f'flan_t5_{size}': DIMS[f't5_1_1_{size}']
             for size in ('small', 'base', 'large', 'xl', 'xxl')})

CONFIGS: Dict[str, network.T5Config] = {
    name: network.T5Config(vocab_size=VOCAB_SIZE, dtype=DTYPE,
                           dropout_rate=0.0, **dims)
    for name, dims in DIMS.items()}

# The mini models trained on CPU (the experiments' 'mini' and 'shipped'
# model sets): name -> what gin_configs/train/mini_<name>.gin binds to
# MINI_<NAME> ('xxl' the target): T5 1.1's architecture, the Debian
# tasks' vocabulary (8000 pieces rounded up to 8064), float32.
MINI: Dict[str, network.T5Config] = {
    name: network.T5Config(
        vocab_size=8064, dtype='float32', emb_dim=emb, num_heads=heads,
        num_encoder_layers=encoder, num_decoder_layers=decoder,
        head_dim=head_dim, mlp_dim=mlp, dropout_rate=0.0, **_T5_1_1)
    for name, (emb, heads, encoder, decoder, head_dim, mlp) in {
        'xxl': (256, 4, 4, 4, 64, 640), 'large': (192, 3, 3, 3, 64, 512),
        'base': (128, 2, 2, 2, 64, 320), 'small': (64, 2, 1, 1, 32, 160),
        'dec2': (256, 4, 2, 2, 64, 640), 'dec1': (256, 4, 2, 1, 64, 640),
    }.items()}

def _known(name: str) -> str:
  if name not in DIMS:
    raise checks.InputError(
        f'unknown model config {name!r}; known: {", ".join(sorted(DIMS))}')
  return name


def _literal(text: str) -> Any:
  """`text` as a Python literal, else the string itself."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def config(spec: str, where: str = 'config spec',
           **overrides) -> network.T5Config:
  """A `network.T5Config` from 'name[,field=value...]' (and overrides).

  Raises:
    ValueError: an unknown name, a malformed override or an unknown field;
      `checks.InputError`: a value no T5 can have (named with `where`, e.g.
      the flag that gave `spec`, and `spec`).
  """
  name, *rest = parts(spec) or ['']  # none: refused by `_known`
  return with_fields(CONFIGS[_known(name)], rest, f'{where} {spec!r}',
                     **overrides)


_OPEN, _CLOSE = '([{', ')]}'


def parts(text: str) -> List[str]:
  """The comma-separated parts of `text`, stripped, empty ones dropped; a
  comma inside brackets, parentheses or quotes parts nothing (a tuple
  value: "t5_1_1_small,mlp_activations=('swish',)")."""
  out, depth, quote, start = [], 0, '', 0
  for i, char in enumerate(text):
    if quote:
      quote = '' if char == quote else quote
    elif char in '\'"':
      quote = char
    elif char in _OPEN:
      depth += 1
    elif char in _CLOSE:
      depth = max(depth - 1, 0)
    elif char == ',' and not depth:
      out.append(text[start:i])
      start = i + 1
  out.append(text[start:])
  return [part.strip() for part in out if part.strip()]


def specs(text: str) -> List[str]:
  """The config specs of `text`, comma separated ('a,k=v,b': a part that
  sets no field begins the next spec)."""
  out = []
  for part in parts(text):
    if '=' in part and out:
      out[-1] += ',' + part
    else:
      out.append(part)
  return out


def assignment(text: str) -> Tuple[str, Any]:
  """(key, value) of 'key=value' (the value a Python literal, else a
  string); ValueError if `text` is none."""
  if '=' not in text:
    raise checks.InputError(f'{text!r} is not field=value')
  key, value = text.split('=', 1)
  return key.strip(), _literal(value.strip())


def with_fields(base: network.T5Config, items: Sequence[str],
                where: str = 'model fields', **overrides) -> network.T5Config:
  """`base` with 'field=value' items (values as Python literals, else
  strings; e.g. 'attention_kernel=cudnn') and overrides set.

  Raises:
    ValueError: a malformed item or an unknown field (named with `where`).
    checks.InputError: a value no T5 can have (`network.check_config`).
  """
  try:
    pairs = list(map(assignment, items))
    fields = dict(pairs, **overrides)
  except ValueError as e:
    raise checks.InputError(f'{where}: {e}') from None
  twice = sorted(k for k, n in collections.Counter(
      k for k, _ in pairs).items() if n > 1)
  if twice:  # before: the last one silently
    raise checks.InputError(f'{where}: {", ".join(twice)} set twice')
  unknown = set(fields) - set(base.__dataclass_fields__)
  if unknown:
    raise checks.InputError(
        f'{where}: T5Config has no field(s) {sorted(unknown)}')
  if isinstance(fields.get('mlp_activations'), list):  # hashable
    fields['mlp_activations'] = tuple(fields['mlp_activations'])
  result = base.replace(**fields)
  network.check_config(result, where)
  return result


SHIPPED = 'shipped:'


def load(spec: str, config_spec: Optional[str] = None, *,
         dtype: Any = None) -> Tuple[network.T5Model, Any]:
  """`(network.T5Model, params)` for `shipped:<name>` or a T5X checkpoint.

  Args:
    spec: 'shipped:<name>' or the path of a `checkpoint_<step>` folder.
    config_spec: for a checkpoint path, its config ('t5_1_1_small',
      't5_1_1_tiny,vocab_size=256,dtype=float32'); unused for shipped
      models, whose configs ship with them.
    dtype: parameter dtype after loading (default: the stored dtypes for
      a checkpoint, float32 for a shipped model).

  Raises:
    ValueError: a checkpoint path without a config spec, or a bad spec.
    FileNotFoundError: no such checkpoint or shipped model.
  """
  checks.check_type('spec', spec, str,
                     "'shipped:<name>' or a checkpoint_<step> folder's path")
  if spec.startswith(SHIPPED):
    return shipped.load_model(spec[len(SHIPPED):], dtype=dtype)
  if not config_spec:
    raise checks.InputError(
        f'{spec!r} is a checkpoint path: give its model config too (one of '
        f'{", ".join(sorted(DIMS))}, with overrides such as '
        "'t5_1_1_small,vocab_size=32128,dtype=float32'), or use "
        f'shipped:<name> ({", ".join(shipped.model_names())})')
  cfg = config(config_spec)
  params = checkpoints.load_t5x_params(spec, config=cfg, dtype=dtype)
  return network.T5Model(cfg), params
