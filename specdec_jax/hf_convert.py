"""Name map between T5X's T5 parameter tree and HF transformers' T5.

One table, `parameter_map`, drives both directions. HF `nn.Linear` weights are
`[out, in]`; T5X kernels are `[in, out]`, so they are transposed. The relative
position table lives in HF's first block of each stack as `[buckets, heads]`.
Nothing here imports torch: state dicts are dicts of numpy arrays.
"""

from __future__ import annotations

from typing import Dict, Iterator, Tuple

import numpy as np

from specdec_jax.network import T5Config

# (T5X path, HF name, transpose)
Entry = Tuple[Tuple[str, ...], str, bool]


def _mlp_names(config: T5Config):
  acts = tuple(config.mlp_activations)
  if len(acts) == 1:
    return [('wi', 'wi')]
  return [(f'wi_{i}', f'wi_{i}') for i in range(len(acts))]


def parameter_map(config: T5Config) -> Iterator[Entry]:
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
        yield (stack, lyr, ln, 'scale'), f'{block}.{idx}.layer_norm.weight', False
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


def to_hf_state_dict(params, config: T5Config) -> Dict[str, np.ndarray]:
  """T5X params -> HF T5ForConditionalGeneration state dict (numpy)."""
  out = {}
  for path, hf_name, transpose in parameter_map(config):
    value = np.asarray(_get(params, path), np.float32)
    out[hf_name] = value.T if transpose else value
  return out


def from_hf_state_dict(state_dict, config: T5Config):
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


def hf_config_kwargs(config: T5Config) -> dict:
  """Keyword arguments of `transformers.T5Config` for the same network."""
  acts = tuple(config.mlp_activations)
  if acts == ('relu',):
    ff = 'relu'
  elif acts == ('gelu', 'linear'):
    ff = 'gated-gelu'
  else:
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


def to_hf_model(params, config: T5Config):
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
