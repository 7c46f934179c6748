"""HF transformers' T5 (torch, CPU) is the independent referee.

Same random weights in both implementations: logits must agree to float32
tolerance and greedy decoding must give the same tokens. This catches errors
that a self-consistency test cannot (relative-position buckets, norm placement,
logit scaling of tied T5 1.0 models, cross-attention masking).
"""

import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.checkpoints import hf as hf_lib

from conftest import teacher_forced_logits  # pylint: disable=g-bad-import-order


def _inputs(vocab, seed=0):
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, vocab, (3, 12))
  enc[1, 8:] = 0  # three inputs of different lengths
  enc[2, 5:] = 0
  dec = rng.integers(2, vocab, (3, 40))
  dec[:, 0] = 0
  return enc, dec


@pytest.mark.parametrize('which', ['v11', 'v10'])
def test_logits_equal_hf(which, request, torch):
  model, params = request.getfixturevalue(which)
  hf = hf_lib.to_hf_model(params, model.config)
  enc, dec = _inputs(model.vocab_size)
  ours = np.asarray(teacher_forced_logits(model, params, enc, dec))
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(enc),
                attention_mask=torch.tensor(enc > 0),
                decoder_input_ids=torch.tensor(dec)).logits.numpy()
  assert np.abs(theirs).max() > 0.1  # non-trivial logits
  np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=0)


def test_an_hf_t5_saved_by_transformers_loads_and_decodes_as_hf(tmp_path,
                                                              torch):
  """A gated-gelu T5 made and saved by transformers itself (not from our
  weights): transformers >= 5 ties its unscaled output layer to the
  embedding and saves the one matrix, which must then be the output
  layer. Greedy tokens equal HF's generate."""
  import transformers  # pylint: disable=g-import-not-at-top
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from specdec_jax import network  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
      vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1,
      num_heads=2, feed_forward_proj='gated-gelu', tie_word_embeddings=False,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
      initializer_factor=20.0)).eval()
  hf.save_pretrained(tmp_path)
  params = checkpoints.load_hf_t5(tmp_path)
  model = network.T5Model(checkpoints.config_from_hf(tmp_path))
  enc = np.random.default_rng(0).integers(2, 64, (3, 7))
  enc[1, 4:] = 0
  _assert_greedy_equals_hf(model, params, hf, enc, 8, torch)


@pytest.mark.parametrize('which', ['v11', 'v10'])
def test_greedy_tokens_equal_hf_generate(which, request, torch):
  model, params = request.getfixturevalue(which)
  hf = hf_lib.to_hf_model(params, model.config)
  enc, _ = _inputs(model.vocab_size, seed=3)
  _assert_greedy_equals_hf(model, params, hf, enc, 24, torch)


def _assert_greedy_equals_hf(model, params, hf, enc, steps, torch):
  """Our greedy tokens equal HF `generate`'s on the same rows."""
  ours = np.asarray(decoding.temperature_sample(
      model, params, enc, max_decode_len=steps).tokens)
  with torch.no_grad():
    theirs = hf.generate(
        input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
        do_sample=False, num_beams=1, max_new_tokens=steps,
    ).numpy()[:, 1:]  # drop the decoder start token
  # HF pads finished rows with pad=0 after EOS, as T5X and we do.
  theirs = np.pad(theirs, ((0, 0), (0, steps - theirs.shape[1])))
  assert len(np.unique(ours)) > 3  # the rows are not one repeated token
  np.testing.assert_array_equal(ours, theirs)


def test_parameter_map_round_trip(v11):
  """T5X -> HF names -> T5X gives back every array unchanged."""
  model, params = v11
  state = hf_lib.to_hf_state_dict(params, model.config)
  back = hf_lib.from_hf_state_dict(state, model.config)
  import jax  # pylint: disable=g-import-not-at-top
  assert (jax.tree_util.tree_structure(back)
          == jax.tree_util.tree_structure(params))
  for a, b in zip(jax.tree_util.tree_leaves(back),
                  jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)
