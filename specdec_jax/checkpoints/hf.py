"""HF transformers T5 / Flan-T5: config and weights in, and the name map.

Reading: `config_from_hf` (a `config.json` -> T5Config) and `load_hf_t5`
(safetensors weights -> T5X params, checked against the config).

The name map between T5X's T5 parameter tree and HF's: one table,
`parameter_map`, drives both directions (`to_hf_state_dict`,
`from_hf_state_dict`). HF `nn.Linear` weights are `[out, in]`; T5X kernels
are `[in, out]`, so they are transposed. The relative position table lives in
HF's first block of each stack as `[buckets, heads]`. Nothing but
`to_hf_model` imports torch: state dicts are dicts of numpy arrays.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, Iterator, Optional, Tuple

from flax import traverse_util
import jax.numpy as jnp
import numpy as np

from specdec_jax import network
from specdec_jax.checkpoints import _storage
from specdec_jax.checkpoints import t5x

PyTree = Any

# ----------------------------------------------------------------------------
# The name map (T5X <-> HF).
# ----------------------------------------------------------------------------

# (T5X path, HF name, transpose)
Entry = Tuple[Tuple[str, ...], str, bool]


def _mlp_names(config: network.T5Config):
  acts = tuple(config.mlp_activations)
  if len(acts) == 1:
    return [('wi', 'wi')]
  return [(f'wi_{i}', f'wi_{i}') for i in range(len(acts))]


def parameter_map(config: network.T5Config) -> Iterator[Entry]:
  """Yields every (T5X path, HF name, transpose) pair of a T5 config."""
  yield ('token_embedder', 'embedding'), 'shared.weight', False
  for stack, n_layers in (('encoder', config.num_encoder_layers),
                          ('decoder', config.num_decoder_layers)):
    yield ((stack, 'relpos_bias', 'rel_embedding'),
           f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias'
           '.weight', True)
    norm = 'encoder_norm' if stack == 'encoder' else 'decoder_norm'
    yield (stack, norm, 'scale'), f'{stack}.final_layer_norm.weight', False
    for i in range(n_layers):
      block = f'{stack}.block.{i}.layer'
      lyr = f'layers_{i}'
      if stack == 'encoder':
        attns = [('attention', 'pre_attention_layer_norm', 0, 'SelfAttention')]
        mlp_idx = 1
      else:
        attns = [
            ('self_attention', 'pre_self_attention_layer_norm', 0,
             'SelfAttention'),
            ('encoder_decoder_attention', 'pre_cross_attention_layer_norm',
             1, 'EncDecAttention'),
        ]
        mlp_idx = 2
      for name, ln, idx, hf_name in attns:
        yield ((stack, lyr, ln, 'scale'), f'{block}.{idx}.layer_norm.weight',
               False)
        for proj, hf_proj in (('query', 'q'), ('key', 'k'), ('value', 'v'),
                              ('out', 'o')):
          yield ((stack, lyr, name, proj, 'kernel'),
                 f'{block}.{idx}.{hf_name}.{hf_proj}.weight', True)
      yield ((stack, lyr, 'pre_mlp_layer_norm', 'scale'),
             f'{block}.{mlp_idx}.layer_norm.weight', False)
      for t5x_name, hf_name in _mlp_names(config) + [('wo', 'wo')]:
        yield ((stack, lyr, 'mlp', t5x_name, 'kernel'),
               f'{block}.{mlp_idx}.DenseReluDense.{hf_name}.weight', True)
  if not config.logits_via_embedding:
    yield ('decoder', 'logits_dense', 'kernel'), 'lm_head.weight', True


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def to_hf_state_dict(params, config: network.T5Config) -> Dict[str, np.ndarray]:
  """T5X params -> HF T5ForConditionalGeneration state dict (numpy)."""
  out = {}
  for path, hf_name, transpose in parameter_map(config):
    value = np.asarray(_get(params, path), np.float32)
    out[hf_name] = value.T if transpose else value
  return out


def from_hf_state_dict(state_dict, config: network.T5Config):
  """HF T5 state dict (numpy or torch tensors) -> T5X params tree."""
  params: dict = {}
  for path, hf_name, transpose in parameter_map(config):
    if hf_name not in state_dict:
      raise KeyError(f'HF state dict has no {hf_name!r} (T5X {"/".join(path)})')
    value = state_dict[hf_name]
    value = np.asarray(value.float().numpy() if hasattr(value, 'numpy') and
                       hasattr(value, 'float') else value, np.float32)
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value.T if transpose else value
  return params


def hf_config_kwargs(config: network.T5Config) -> dict:
  """Keyword arguments of `transformers.T5Config` for the same network."""
  acts = tuple(config.mlp_activations)
  ff = {v: k for k, v in _HF_ACTIVATIONS.items()}.get(acts)
  if ff is None:
    raise ValueError(f'No HF T5 feed_forward_proj for activations {acts}.')
  return dict(
      vocab_size=config.vocab_size,
      d_model=config.emb_dim,
      d_kv=config.head_dim,
      d_ff=config.mlp_dim,
      num_layers=config.num_encoder_layers,
      num_decoder_layers=config.num_decoder_layers,
      num_heads=config.num_heads,
      relative_attention_num_buckets=32,
      relative_attention_max_distance=128,
      dropout_rate=0.0,
      layer_norm_epsilon=1e-6,
      feed_forward_proj=ff,
      tie_word_embeddings=bool(config.logits_via_embedding),
      decoder_start_token_id=0,
      pad_token_id=0,
      eos_token_id=1,
  )


def to_hf_model(params, config: network.T5Config):
  """A float32 HF `T5ForConditionalGeneration` holding these T5X params.

  Imports torch and transformers lazily (they are test/benchmark extras).
  transformers >= 5 ties `lm_head` to the shared embedding on construction and
  decides output scaling from `tie_word_embeddings`; for T5 1.1 (untied) the
  tie is broken before loading so both matrices keep their own values.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  hf_config = transformers.T5Config(**hf_config_kwargs(config))
  model = transformers.T5ForConditionalGeneration(hf_config)
  if not config.logits_via_embedding:
    model.lm_head.weight = torch.nn.Parameter(
        model.lm_head.weight.detach().clone()
    )
  state = {k: torch.from_numpy(np.array(v, np.float32))
           for k, v in to_hf_state_dict(params, config).items()}
  for stack in ('encoder', 'decoder'):
    state[f'{stack}.embed_tokens.weight'] = state['shared.weight']
  if config.logits_via_embedding:
    state['lm_head.weight'] = state['shared.weight']
  model.load_state_dict(state, strict=True)
  return model.eval()


def generate(model, inputs: np.ndarray, max_len: int, eos_id: int,
             assistant=None, gamma: Optional[int] = None) -> np.ndarray:
  """HF greedy decoding of one row: `[max_len]` tokens, 0 after the end.

  `model.generate(do_sample=False)` (T5X's padding and start token 0) on
  the row's non-padding tokens, on the model's device; with `assistant`,
  HF's assisted generation drafting `gamma` tokens per step (a constant
  schedule). `eos_id` < 0: no end token (all `max_len` tokens).
  """
  import torch  # pylint: disable=g-import-not-at-top
  row = np.asarray(inputs)[0]
  ids = torch.tensor(row[:max(int((row > 0).sum()), 1)][None],
                     device=model.device)
  kwargs = dict(do_sample=False, num_beams=1, max_new_tokens=max_len,
                eos_token_id=eos_id if eos_id >= 0 else None, pad_token_id=0)
  if assistant is not None:
    model.generation_config.num_assistant_tokens = gamma
    model.generation_config.num_assistant_tokens_schedule = 'constant'
    kwargs['assistant_model'] = assistant
  with torch.inference_mode():
    out = model.generate(input_ids=ids, **kwargs).cpu().numpy()[0, 1:]
  tokens = np.zeros(max_len, np.int32)
  tokens[:len(out)] = out[:max_len]
  return tokens


# ----------------------------------------------------------------------------
# HF config.json and safetensors weights.
# ----------------------------------------------------------------------------


_HF_ACTIVATIONS = {
    'relu': ('relu',),
    'gated-gelu': ('gelu', 'linear'),
    'gated-relu': ('relu', 'linear'),
}


_HF_KEYS = ('vocab_size', 'd_model', 'num_heads', 'num_layers', 'd_kv',
            'd_ff')


def _hf_config(config_json_path) -> Tuple[Dict[str, Any], str]:
  """(the dict of an HF T5 config.json, its path), or a named error."""
  path = os.fspath(config_json_path)
  if not path.endswith('.json'):  # the folder holding it
    if not _storage.isdir(path):
      raise FileNotFoundError(f'No HF T5 folder {path}')
    path = os.path.join(path, 'config.json')
  try:
    hf = json.loads(_storage.read_bytes(path))
  except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError too
    raise t5x.CheckpointError(f'{path}: not JSON ({e})') from None
  if not isinstance(hf, dict):
    raise t5x.CheckpointError(f'{path}: not an HF config (a JSON object)')
  if hf.get('model_type', 't5') not in ('t5', 'mt5'):  # mT5: T5 1.1's
    raise t5x.CheckpointError(
        f"{path}: model_type {hf['model_type']!r}, not an HF T5 ('t5', "
        "'mt5')")
  missing = [k for k in _HF_KEYS if k not in hf]
  if missing:
    raise t5x.CheckpointError(f'{path}: not an HF T5 config (no {missing})')
  return hf, path


# The fields of the network a config.json fixes (the rest are how it runs:
# dtypes, kernels, dropout).
_ARCHITECTURE = ('vocab_size', 'emb_dim', 'num_heads', 'num_encoder_layers',
                 'num_decoder_layers', 'head_dim', 'mlp_dim',
                 'mlp_activations', 'logits_via_embedding')


def config_from_hf(config_json_path: str, **overrides) -> network.T5Config:
  """T5Config of an HF transformers T5 / Flan-T5 `config.json`.

  Args:
    config_json_path: the config.json file, or the folder holding it.
    **overrides: T5Config fields to set (e.g. dtype=jnp.bfloat16).

  Returns:
    The T5Config of the same network.

  Raises:
    FileNotFoundError: no such file (or folder).
    CheckpointError: not a T5 config (another model_type, keys missing,
      not JSON).
    ValueError: a feature our network does not implement (another
      feed_forward_proj, relative-attention buckets other than 32/128, a
      layer norm epsilon other than T5's 1e-6).
  """
  return _network_of(*_hf_config(config_json_path), **overrides)


def _network_of(hf: Dict[str, Any], path: str,
                **overrides) -> network.T5Config:
  """`config_from_hf` of a config.json read (`_hf_config`) from `path`."""
  ff = hf.get('feed_forward_proj', 'relu')
  if ff not in _HF_ACTIVATIONS:
    raise ValueError(f'{path}: feed_forward_proj {ff!r} is not supported '
                     f'(supported: {sorted(_HF_ACTIVATIONS)})')
  buckets = hf.get('relative_attention_num_buckets', 32)
  distance = hf.get('relative_attention_max_distance', 128)
  if (buckets, distance) != (32, 128):
    raise ValueError(f'{path}: relative attention {buckets} buckets / max '
                     f'distance {distance}; T5X T5 uses 32 / 128')
  if hf.get('layer_norm_epsilon', 1e-6) != 1e-6:
    raise ValueError(f"{path}: layer_norm_epsilon {hf['layer_norm_epsilon']}; "
                     'T5X T5 uses 1e-6')
  # T5 1.0 ties the output layer to the embedding and scales the decoder
  # output by d_model**-0.5 (T5X: logits_via_embedding). transformers < 5
  # says so with tie_word_embeddings (default True); transformers >= 5 always
  # writes tie_word_embeddings=true and puts the switch in
  # scale_decoder_outputs.
  if 'scale_decoder_outputs' in hf:
    tied = bool(hf['scale_decoder_outputs'])
  else:
    tied = bool(hf.get('tie_word_embeddings', True))
  num_layers = hf['num_layers']
  fields = dict(
      vocab_size=hf['vocab_size'],
      emb_dim=hf['d_model'],
      num_heads=hf['num_heads'],
      num_encoder_layers=num_layers,
      num_decoder_layers=hf.get('num_decoder_layers') or num_layers,
      head_dim=hf['d_kv'],
      mlp_dim=hf['d_ff'],
      mlp_activations=_HF_ACTIVATIONS[ff],
      dropout_rate=hf.get('dropout_rate', 0.1),
      logits_via_embedding=tied,
  )
  fields.update(overrides)
  return network.T5Config(**fields)


def _hf_weight_files(path: str) -> list[str]:
  """The safetensors files of a folder, an index or a file (local or
  gs://)."""
  if _storage.isfile(path):
    if path.endswith('.json'):
      index_path, folder = path, os.path.dirname(path)
    else:
      return [path]
  else:
    folder = path
    index_path = os.path.join(path, 'model.safetensors.index.json')
    single = os.path.join(path, 'model.safetensors')
    if _storage.isfile(single):
      return [single]
  if not _storage.isfile(index_path):
    if not _storage.isdir(path):
      raise FileNotFoundError(f'No HF T5 weights at {path}')
    raise FileNotFoundError(
        f'{path}: no model.safetensors or model.safetensors.index.json '
        '(only safetensors weights are read; re-save with '
        'save_pretrained(..., safe_serialization=True))')
  weight_map = json.loads(_storage.read_bytes(index_path))['weight_map']
  return [os.path.join(folder, name) for name in sorted(set(
      weight_map.values()))]


_SAFETENSORS_DTYPES = {
    'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
    'BF16': jnp.bfloat16, 'I64': np.int64, 'I32': np.int32, 'I16': np.int16,
    'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_,
}


def _read_safetensors_raw(data: bytes) -> Dict[str, np.ndarray]:
  """Reads a safetensors file's bytes with numpy + ml_dtypes.

  safetensors.numpy cannot represent bfloat16 (numpy has no such dtype), yet
  many HF T5 exports are bfloat16. The format is an 8-byte little-endian
  header length, a JSON header {name: {dtype, shape, data_offsets}}, then
  the raw little-endian tensor bytes.
  """
  (header_len,) = np.frombuffer(data[:8], '<u8')
  header = json.loads(data[8:8 + int(header_len)])
  base = 8 + int(header_len)
  out = {}
  for key, info in header.items():
    if key == '__metadata__':
      continue
    begin, end = info['data_offsets']
    dtype = np.dtype(_SAFETENSORS_DTYPES[info['dtype']]).newbyteorder('<')
    out[key] = np.frombuffer(data[base + begin:base + end],
                             dtype=dtype).reshape(info['shape'])
  return out


def _read_safetensors(files: Iterable[str]) -> Dict[str, np.ndarray]:
  # pylint: disable-next=g-import-not-at-top
  from safetensors import numpy as st_numpy

  state: Dict[str, np.ndarray] = {}
  for name in files:
    if not _storage.isfile(name):
      raise FileNotFoundError(f'HF weight shard missing: {name}')
    try:
      # A local file is read by safetensors itself; a gs:// one whole.
      data = _storage.read_bytes(name) if _storage.is_gcs(name) else None
      try:
        state.update(st_numpy.load_file(name) if data is None
                     else st_numpy.load(data))
      except TypeError:  # A dtype numpy lacks (bfloat16).
        state.update(_read_safetensors_raw(
            _storage.read_bytes(name) if data is None else data))
    except Exception as e:  # pylint: disable=broad-except
      raise t5x.CheckpointError(
          f'{name}: unreadable safetensors file: {type(e).__name__}: {e}'
      ) from None
  return state


def load_hf_t5(path_or_dir: str, config: Optional[network.T5Config] = None,
               dtype: Any = None) -> PyTree:
  """T5X params from HF transformers T5 / Flan-T5 safetensors weights.

  Args:
    path_or_dir: a save_pretrained folder, a `model.safetensors` file, or a
      `model.safetensors.index.json` (sharded weights).
    config: the network; None reads `config.json` beside the weights.
    dtype: cast every parameter to this dtype (None: float32).

  Returns:
    The T5X params tree (nested dicts of jax arrays), checked against config.

  Raises:
    CheckpointError: a config that is not the network config.json
      describes, weights it lacks or does not read, an unreadable file.
  """
  path = os.fspath(path_or_dir)
  folder = os.path.dirname(path) if _storage.isfile(path) else path
  config_json = os.path.join(folder, 'config.json')
  hf = None
  if _storage.isfile(config_json) or config is None:
    hf, json_path = _hf_config(config_json)  # read once
    theirs = _network_of(hf, json_path)
    if config is None:
      config = theirs
    differ = [f'{k} {getattr(config, k)!r} (config.json: '
              f'{getattr(theirs, k)!r})' for k in _ARCHITECTURE
              if getattr(config, k) != getattr(theirs, k)]
    if differ:  # the weights would load and decode another network
      raise t5x.CheckpointError(
          f'{path}: the T5Config given is not the network its config.json '
          'describes: ' + ', '.join(differ))
  state = _read_safetensors(_hf_weight_files(path))
  if 'shared.weight' not in state:  # Some exports keep only the stack copies.
    for alias in ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'):
      if alias in state:
        state['shared.weight'] = state[alias]
        break
  if (hf is not None and not config.logits_via_embedding
      and hf.get('tie_word_embeddings', True)
      and 'lm_head.weight' not in state and 'shared.weight' in state):
    # transformers >= 5 ties an unscaled output layer (T5 1.1's) to the
    # embedding and saves the one matrix: the output layer is it.
    state['lm_head.weight'] = state['shared.weight']
  try:
    params = from_hf_state_dict(state, config)
  except KeyError as e:
    raise t5x.CheckpointError(f'{path}: {e.args[0]}') from None
  read = {name for _, name, _ in parameter_map(config)}
  unused = sorted(set(state) - read - {  # copies; one transformers < 4 kept
      'encoder.embed_tokens.weight', 'decoder.embed_tokens.weight',
      'decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight'
  } - (
          {'lm_head.weight'} if np.array_equal(
              state.get('lm_head.weight'), state.get('shared.weight'))
          else set()))
  if unused:  # weights of another network, e.g. an output layer it unties
    raise t5x.CheckpointError(
        f'{path}: {len(unused)} weights the T5Config does not read: '
        f'{unused[:4]} (logits_via_embedding={config.logits_via_embedding})')
  flat = traverse_util.flatten_dict(params, sep='/')
  return t5x.params_from_flat(flat, path, config, dtype)
