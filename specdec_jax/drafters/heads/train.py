"""Training a draft head on the frozen target's own states, and alpha per
draft depth (scripts/train_heads.py).

`chain_loss`: on the target's own outputs, from its teacher-forced states
(`target_features`), the head unrolled `depth` steps on its own predicted
states with the true tokens, cross-entropy on each step's next token; the
target's params are not an argument of the gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import layers
from specdec_jax import network
from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters.heads.model import Head
from specdec_jax.drafters.heads.model import project
from specdec_jax.sampling import SamplingConfig


def _features(module, encoder_input_tokens, decoder_input_tokens):
  encoded = module.encode(encoder_input_tokens)
  mask = encoder_input_tokens > 0
  _, hidden = module.decoder(encoded, mask, decoder_input_tokens,
                             return_hidden=True)
  return hidden, module.decoder.layers[-1].cross_kv(encoded)


@functools.partial(jax.jit, static_argnums=0)
def target_features(model: network.T5Model, target_params,
                    encoder_input_tokens, decoder_target_tokens):
  """The frozen target's teacher-forced states and last-layer cross K/V.

  Returns:
    `(hidden [b, n, embed], (key, value) [b, input_len, heads, head_dim])`:
    hidden[:, t] is the state after the prefix BOS, y_1..y_t, whose logits
    give y_{t+1} (`decoder_target_tokens[:, t]`).
  """
  dec_in = jnp.pad(decoder_target_tokens[:, :-1], ((0, 0), (1, 0)))
  return model.module_for(target_params).apply(
      {'params': target_params}, encoder_input_tokens, dec_in,
      method=_features)


def chain_loss(head: Head, head_params, target_params, hidden, cross_kv,
               encoder_input_tokens, targets, positions, depth: int):
  """Cross-entropy of `depth` chained head steps from sampled positions.

  From hidden[:, t] (t in `positions` `[b, P]`) with token y_{t+1} the head
  predicts y_{t+2}, then from its own state and y_{t+2} (teacher forcing on
  tokens, not on states) y_{t+3}, ... A step counts where its label is a
  real token and its input token is not EOS / padding.

  Returns:
    `(loss, {'accuracy_at' [depth], 'weight_at' [depth]})`.
  """
  n = targets.shape[1]
  bias = layers.mask_to_bias((encoder_input_tokens > 0)[:, None, None, :])
  s = jnp.take_along_axis(hidden, positions[..., None], 1)
  padded = jnp.pad(targets, ((0, 0), (0, depth + 1)))
  total, accs, ws = 0.0, [], []
  for k in range(depth):
    tok = jnp.take_along_axis(padded, positions + k, 1)
    label = jnp.take_along_axis(padded, positions + k + 1, 1)
    w = ((positions + k + 1 < n) & (tok > 1) & (label > 0)).astype(
        jnp.float32)
    s, logits = head.step(head_params, target_params, s, tok, cross_kv, bias)
    log_p = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(log_p, label[..., None], -1)[..., 0]
    total = total + jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)
    accs.append(jnp.sum((jnp.argmax(logits, -1) == label) * w))
    ws.append(jnp.sum(w))
  return total / depth, {'accuracy_at': jnp.stack(accs),
                         'weight_at': jnp.stack(ws)}


def make_train_step(head: Head, optimizer, depth: int):
  """A jitted `(head_params, opt_state, target_params, hidden, cross_kv,
  inputs, targets, positions) -> (head_params, opt_state, loss, metrics)`:
  one optax step on the head (the target's params enter as constants)."""

  @jax.jit
  def step(head_params, opt_state, target_params, hidden, cross_kv, inputs,
           targets, positions):
    target_params = jax.lax.stop_gradient(target_params)
    (loss, metrics), grads = jax.value_and_grad(
        lambda hp: chain_loss(head, hp, target_params, hidden, cross_kv,
                              inputs, targets, positions, depth),
        has_aux=True)(head_params)
    updates, opt_state = optimizer.update(grads, opt_state, head_params)
    return optax.apply_updates(head_params, updates), opt_state, loss, metrics

  return step


@functools.partial(jax.jit, static_argnums=(0, 1, 5, 7))
def _depth_beta(model, head, target_params, head_params, inputs, depth,
                outputs, sampling):
  hidden, kv = target_features(model, target_params, inputs, outputs)
  logits = project(target_params, model.config, hidden)
  p = sampling_lib.probabilities(logits, sampling)  # p[:, t]: y_{t+1}
  n = outputs.shape[1]
  positions = jnp.broadcast_to(jnp.arange(n)[None], outputs.shape)
  bias = layers.mask_to_bias((inputs > 0)[:, None, None, :])
  padded = jnp.pad(outputs, ((0, 0), (0, depth + 1)))
  p_pad = jnp.pad(p, ((0, 0), (0, depth + 1), (0, 0)))
  s, sums, counts = hidden, [], []
  for k in range(depth):
    tok = padded[:, k:k + n]
    label = padded[:, k + 1:k + 1 + n]
    w = ((positions + k + 1 < n) & (tok > 1) & (label > 0))
    s, logits = head.step(head_params, target_params, s, tok, kv, bias)
    q = sampling_lib.probabilities(logits, sampling)
    beta = jnp.sum(jnp.minimum(q, p_pad[:, k + 1:k + 1 + n]), -1)
    sums.append(jnp.sum(beta * w))
    counts.append(jnp.sum(w))
  return jnp.stack(sums), jnp.stack(counts)


def depth_alpha(model: network.T5Model, target_params, head: Head,
                head_params, encoder_input_tokens, target_outputs,
                depth: int, sampling: SamplingConfig = SamplingConfig()):
  """alpha per draft depth on the target's outputs (teacher-forced tokens).

  beta(t, k) = sum_x min(p, q) between the target's standardized p of
  y_{t+k+2} (after the true prefix) and the head's q after k + 1 chained
  steps from h_t with the true tokens y_{t+1}..y_{t+k+1}.

  Returns:
    `(beta_sum [depth], count [depth])` numpy float64.
  """
  sums, counts = _depth_beta(model, head, target_params, head_params,
                             jnp.asarray(encoder_input_tokens, jnp.int32),
                             int(depth),
                             jnp.asarray(target_outputs, jnp.int32), sampling)
  return np.asarray(sums, np.float64), np.asarray(counts, np.float64)
