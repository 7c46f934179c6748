"""Training PaSS's look-ahead embeddings on the frozen target, and alpha
per look-ahead slot (scripts/train_pass.py).

Only the L x emb_dim embeddings are trained: the target's params enter under
`stop_gradient` and come back untouched.

References: Monea, Joulin & Grave 2023, arXiv 2311.13581.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import network
from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters.lookahead.model import lookahead_logits
from specdec_jax.sampling import SamplingConfig


def loss_fn(model, target_params, lookahead_params, encoder_input_tokens,
            decoder_target_tokens, owners=None):
  """Mean cross-entropy of the slots' predictions (teacher forcing).

  Slot (t, j) predicts `decoder_target_tokens[:, t + j + 1]` (0 = padding,
  no loss), for the prefix ends t in `owners` (default: all). Gradients
  flow to `lookahead_params` only: the target's params enter under
  `stop_gradient`.

  Returns:
    `(loss, {'loss', 'accuracy_at' [L], 'weight_at' [L]})`.
  """
  targets = decoder_target_tokens
  n = targets.shape[1]
  dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
  owners = jnp.arange(n) if owners is None else jnp.asarray(owners)
  _, slots = lookahead_logits(model, jax.lax.stop_gradient(target_params),
                              lookahead_params, encoder_input_tokens, dec_in,
                              owners)
  big_l = slots.shape[2]
  idx = owners[:, None] + jnp.arange(big_l)[None, :] + 1  # [k, L]
  labels = jnp.take(jnp.pad(targets, ((0, 0), (0, big_l + 1))), idx, axis=1)
  weights = (labels > 0) & (idx < n)[None]
  log_p = jax.nn.log_softmax(slots, axis=-1)
  nll = -jnp.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
  w = weights.astype(jnp.float32)
  loss = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)
  correct = (jnp.argmax(slots, -1) == labels) * w
  return loss, {'loss': loss, 'accuracy_at': correct.sum((0, 1)),
                'weight_at': w.sum((0, 1))}


def make_train_step(model: network.T5Model, optimizer):
  """A jitted `(target_params, la_params, opt_state, inputs, targets[,
  owners]) -> (la_params, opt_state, metrics)`: one optax step on the
  embeddings only (`loss_fn`).

  Gradients are taken with respect to the look-ahead params alone; the
  target's params are an argument under `stop_gradient` and come back
  untouched (tests/drafters/test_lookahead.py checks them bit for bit).
  """

  @jax.jit
  def step(target_params, lookahead_params, opt_state, inputs, targets,
           owners=None):
    grad_fn = jax.grad(
        lambda la: loss_fn(model, target_params, la, inputs, targets,
                           owners),
        has_aux=True)
    grads, metrics = grad_fn(lookahead_params)
    updates, opt_state = optimizer.update(grads, opt_state, lookahead_params)
    return optax.apply_updates(lookahead_params, updates), opt_state, metrics

  return step


def position_alpha(model, target_params, lookahead_params,
                   encoder_input_tokens, target_outputs,
                   sampling: SamplingConfig = SamplingConfig()):
  """alpha per look-ahead slot on the target's outputs (teacher forcing).

  beta(t, j) = sum_x min(p, q) between the target's standardized p of token
  t + j + 2 (after the true prefix) and slot j's q after prefix :t+1.

  Args:
    target_outputs: `[batch, n]` the target's outputs (EOS kept, 0 after).

  Returns:
    `(beta_sum [L], count [L])` numpy float64 (alpha_j = sum / count).
  """
  targets = jnp.asarray(target_outputs, jnp.int32)
  dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
  enc = jnp.asarray(encoder_input_tokens, jnp.int32)
  real, slots = _lookahead_jit(model, target_params, lookahead_params, enc,
                               dec_in)
  p = sampling_lib.probabilities(real, sampling)  # p[:, s]: token s + 1
  q = sampling_lib.probabilities(slots, sampling)
  b, n, big_l, _ = q.shape
  sums, counts = np.zeros(big_l), np.zeros(big_l)
  targets = np.asarray(targets)
  for j in range(big_l):
    # slot (t, j) vs p at real position t + j + 1.
    m = n - j - 1
    if m <= 0:
      continue
    beta = np.asarray(jnp.sum(jnp.minimum(q[:, :m, j], p[:, j + 1:]), -1))
    w = targets[:, j + 1:] > 0
    sums[j] += (beta * w).sum()
    counts[j] += w.sum()
  return sums, counts


@functools.partial(jax.jit, static_argnums=0)
def _lookahead_jit(model, target_params, lookahead_params, enc, dec_in):
  return lookahead_logits(model, target_params, lookahead_params, enc, dec_in)
