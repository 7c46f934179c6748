"""The multi-token cache reproduces one teacher-forced forward pass.

Speculative decoding feeds the target gamma+1 tokens per call and rewinds rows
by different amounts; if the cache got any of that wrong the "exact" outputs
would silently differ from the target's. The reference is the cache-free
teacher-forced forward pass.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import extend
from conftest import init_cache
from conftest import teacher_forced_logits

LENGTH = 24
ATOL = 2e-5


def _data(vocab, batch=3, seed=0):
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, vocab, (batch, 10))
  enc[1, 6:] = 0  # rows with different input lengths
  enc[2, 3:] = 0
  dec = rng.integers(2, vocab, (batch, LENGTH))
  dec[:, 0] = 0  # BOS
  return jnp.asarray(enc), jnp.asarray(dec)


@pytest.mark.parametrize('k', [1, 3, 8])
@pytest.mark.parametrize('which', ['v11', 'v10'])
def test_chunked_decode_equals_teacher_forcing(k, which, request):
  model, params = request.getfixturevalue(which)
  enc, dec = _data(model.vocab_size)
  reference = np.asarray(teacher_forced_logits(model, params, enc, dec))
  cache = init_cache(model, params, enc, LENGTH)
  chunks = []
  for start in range(0, LENGTH, k):
    logits, cache = extend(model, params, dec[:, start:start + k], cache)
    chunks.append(np.asarray(logits))
  got = np.concatenate(chunks, axis=1)[:, :LENGTH]
  np.testing.assert_allclose(got, reference, atol=ATOL, rtol=0)
  np.testing.assert_array_equal(cache.position, [LENGTH + (-LENGTH) % k] * 3)


@pytest.mark.parametrize('k', [1, 3, 8])
def test_rows_at_different_positions_after_rewind(k, v11):
  """Rows hold different prefixes; stale (rejected) slots are overwritten."""
  model, params = v11
  enc, dec = _data(model.vocab_size, seed=1)
  reference = np.asarray(teacher_forced_logits(model, params, enc, dec))
  keep = np.array([0, 2, 5])  # each row's true prefix length after a rewind
  garbage = np.asarray(
      jax.random.randint(jax.random.key(3), (3, 8), 2, model.vocab_size))
  first = np.where(np.arange(8)[None] < keep[:, None], np.asarray(dec[:, :8]),
                   garbage)
  cache = init_cache(model, params, enc, LENGTH + 16)
  _, cache = extend(model, params, jnp.asarray(first), cache)
  cache = cache.rewind(keep)
  # Each row continues from its own position with its own true tokens.
  outputs = [[] for _ in range(3)]
  for step in range(0, 16, k):
    idx = keep[:, None] + step + np.arange(k)[None]
    tokens = np.take_along_axis(np.asarray(dec), np.minimum(idx, LENGTH - 1), 1)
    logits, cache = extend(model, params, jnp.asarray(tokens), cache)
    for b in range(3):
      outputs[b].append(np.asarray(logits[b]))
  for b in range(3):
    got = np.concatenate(outputs[b])[:16]
    want = reference[b, keep[b]:keep[b] + 16]
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
  np.testing.assert_array_equal(cache.position, keep + 16 + (-16) % k)
