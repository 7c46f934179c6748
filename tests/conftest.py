"""Shared tiny models for the test suite (compiled once per session)."""

import os
import pathlib

import jax
import pytest

from specdec_jax import network

FIXTURES = (pathlib.Path(__file__).resolve().parents[1].parent / 'shared' /
            'fixtures' / 't5x')
if 'SPECDEC_FIXTURES' in os.environ:
  FIXTURES = pathlib.Path(os.environ['SPECDEC_FIXTURES'])

# T5 1.1 (gated-gelu, separate logits) and T5 1.0 (relu, tied logits), tiny.
TINY_V11 = network.T5Config(
    vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
    num_encoder_layers=2, num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
)
TINY_V10 = TINY_V11.replace(mlp_activations=('relu',),
                            logits_via_embedding=True)


@pytest.fixture(scope='session')
def fixtures_dir():
  if not FIXTURES.is_dir():
    raise FileNotFoundError(
        f'T5X fixtures not found at {FIXTURES}; the suite expects the '
        'shared/ folder beside the repository or SPECDEC_FIXTURES set.'
    )
  return FIXTURES


@pytest.fixture(scope='session')
def v11():
  model = network.T5Model(TINY_V11)
  return model, model.init_params(jax.random.key(1))


@pytest.fixture(scope='session')
def v10():
  """T5 1.0 weights with a smaller embedding scale.

  With tied logits and N(0, 1) embeddings a random tiny model just repeats its
  last input token (the residual stream is that token's embedding); scaling the
  table by 0.1 lets the layers matter, so greedy outputs vary.
  """
  model = network.T5Model(TINY_V10)
  params = model.init_params(jax.random.key(2))
  emb = params['token_embedder']['embedding']
  params['token_embedder']['embedding'] = emb * 0.1
  return model, params
