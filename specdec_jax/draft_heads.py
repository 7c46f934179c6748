"""Self-drafting heads: the frozen target drafts from its own final state.

A small trainable head reads the target's normalized final decoder state h_t
(the state whose logits gave token y_{t+1}) and the embedding of y_{t+1},
predicts the next state h'_{t+1}, and drafts y_{t+2} from it through the
target's own (frozen) logits layer; fed its own state and draft, it drafts
y_{t+3}, ... (sequentially dependent heads: Hydra, Ankner et al. 2024;
feature-level drafting: EAGLE, Li et al. 2024; one head per offset without
the token: Medusa, Cai et al. 2024). This is the design issue 16's note
proposed where PaSS's look-ahead embeddings (`pass_drafter`) stay at
alpha 0.14 on our 4-layer target: the same frozen target, a few trained
parameters beside it, no second model, and drafting attached to the
verification call.

    x   = s + out(attend(query([s; E y]), K_L, V_L))    (cross_attention)
    s'  = x + wo(gelu(wi([x; E y])))
    q   = softmax(s' @ W_logits / temperature ...)      (the target's head)

E and W_logits are the target's token embedding and logits layer, K_L / V_L
its last decoder layer's cross-attention keys and values of the encoder
output (already in the decoder cache: nothing recomputed). `out` and `wo`
start at zero, so an untrained head drafts the target's distribution at the
previous position. Parameters (`init_head`): `{'draft_head': {'wi', 'wo'
[, 'query', 'out']}}`, a few hundred thousand for the shipped target.

Decoding (`heads_sample`, the merged loop): one (gamma + 1)-token target
call per iteration on [last committed, x_1..x_gamma] returns logits AND
final states; verification (`speculative.accept_and_commit`) accepts n
drafts and commits the residual / bonus token y; the head then drafts the
next gamma tokens from (h_n, y): h_n is the state at block position n, the
one whose distribution y was drawn from, whatever n is, so no iteration is
lost to a rejection (PaSS's recovery calls). Draft i is drawn from q_i,
which depends on drafts 1..i-1 (ordinary autoregressive drafting): exact
under Algorithm 1 for every sampling mode, greedy identical to the baseline.
Cost per iteration: one (gamma + 1)-token target call + gamma head steps (a
few small matmuls and the target's logits matmul each: c of a head step,
not 0; `head_step_bytes`).

`HeadDrafter` (kind 'heads') is the same drafter for the ordinary loop
(`speculative.speculative_sample`, the eval job through `sampler`): its
`propose` runs the target on the committed tokens its own cache copy lacks
(draft 1 from the target's own next-token logits, q_1 = p_1), then the head
from that state; exact, but it pays a second target call per iteration, so
`sampler(drafter)` hands callers `heads_sample` instead.

Training (`chain_loss`, scripts/train_heads.py): on the target's own
outputs, from its teacher-forced states (`target_features`), the head
unrolled `depth` steps on its own predicted states with the true tokens,
cross-entropy on each step's next token; the target's params are not an
argument of the gradient.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any, Optional, Tuple

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import decoding
from specdec_jax import drafters
from specdec_jax import layers
from specdec_jax import network
from specdec_jax import sampling as sampling_lib
from specdec_jax import speculative
from specdec_jax.sampling import SamplingConfig

Array = jax.Array
KEY = 'draft_head'
CONFIG_FILE = 'draft_head.json'


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """A draft head's shape (saved beside its checkpoint as draft_head.json).

  Attributes:
    mlp_dim: hidden width of the head's MLP.
    cross_attention: attend over the target's last decoder layer's encoder
      keys / values (one trained query and output projection).
  """

  mlp_dim: int = 1024
  cross_attention: bool = True

  def __post_init__(self):
    if isinstance(self.mlp_dim, bool) or not isinstance(
        self.mlp_dim, int) or self.mlp_dim < 1:
      raise ValueError(f'mlp_dim must be an int >= 1, got {self.mlp_dim!r}.')


class DraftHead(nn.Module):
  """One drafting step: (state, token embedding) -> next state."""

  config: network.T5Config
  head: HeadConfig

  def setup(self):
    cfg = self.config
    dense = functools.partial(layers.DenseGeneral, dtype=cfg.compute_dtype,
                              weight_dtype=cfg.dtype)
    zeros = nn.initializers.zeros
    if self.head.cross_attention:
      self.query = dense((cfg.num_heads, cfg.head_dim),
                         kernel_axes=('embed', 'joined_kv'),
                         kernel_init=nn.initializers.variance_scaling(
                             1.0 / cfg.head_dim, 'fan_in', 'normal'))
      self.out = dense(cfg.emb_dim, axis=(-2, -1), kernel_init=zeros,
                       kernel_axes=('joined_kv', 'embed'))
    self.wi = dense(self.head.mlp_dim, kernel_axes=('embed', 'mlp'))
    self.wo = dense(cfg.emb_dim, kernel_init=zeros,
                    kernel_axes=('mlp', 'embed'))

  def __call__(self, state: Array, token_embedding: Array, cross_kv=None,
               cross_bias=None) -> Array:
    """`state`, `token_embedding` `[batch, k, embed]` -> next `[b, k, e]`.

    cross_kv: the target's last layer's `(key, value)` `[batch, input_len,
    heads, head_dim]` (with `cross_bias` `[batch, 1, 1, input_len]`), used
    when the head has cross-attention.
    """
    x = jnp.asarray(state, self.config.compute_dtype)
    e = jnp.asarray(token_embedding, self.config.compute_dtype)
    if self.head.cross_attention:
      q = self.query(jnp.concatenate([x, e], -1))
      a = layers.dot_product_attention(q, cross_kv[0], cross_kv[1],
                                       cross_bias, self.config.compute_dtype)
      x = x + self.out(a)
    return x + self.wo(jax.nn.gelu(self.wi(jnp.concatenate([x, e], -1))))


# ---------------------------------------------------------------------------
# Parameters.
# ---------------------------------------------------------------------------


def init_head(config: network.T5Config, head: HeadConfig = HeadConfig(),
              seed: int = 0):
  """An untrained head (`{'draft_head': ...}`): drafts the previous
  position's distribution until trained (`out` and `wo` start at zero)."""
  d = config.emb_dim
  kv = jnp.zeros((1, 2, config.num_heads, config.head_dim))
  variables = DraftHead(config, head).init(
      jax.random.key(seed), jnp.zeros((1, 1, d)), jnp.zeros((1, 1, d)),
      (kv, kv), jnp.zeros((1, 1, 1, 2)))
  return {KEY: jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32),
                                      dict(variables['params']))}


@functools.lru_cache(maxsize=None)
def _shapes(config: network.T5Config, head: HeadConfig):
  return jax.tree_util.tree_map(
      lambda x: tuple(x.shape),
      jax.eval_shape(lambda: init_head(config, head)))


def check_head(head_params, config: network.T5Config, head: HeadConfig,
               source: str = 'draft head params') -> None:
  """ValueError unless `head_params` has the shapes `head` on `config` has."""
  try:
    got = jax.tree_util.tree_map(lambda x: tuple(np.shape(x)), head_params)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{source}: not a params tree ({e}).') from e
  want = _shapes(config, head)
  if got != want:
    raise ValueError(
        f'{source} do not fit this target and head config {head}: expected '
        f'{want}, got {got} (a head trained for another target, emb_dim '
        f'{config.emb_dim}, heads {config.num_heads} x {config.head_dim}?).')


def save_head(head_params, head: HeadConfig, directory: str,
              step: int = 0, dtype: Any = jnp.float32) -> str:
  """Writes the head as a T5X orbax checkpoint `<dir>/checkpoint_<step>`,
  with its `HeadConfig` in `draft_head.json` inside it; `dtype` bfloat16
  halves the files of a head to ship (`load_head` returns float32)."""
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype),
                                  head_params)
  meta = json.dumps(dataclasses.asdict(head), indent=1).encode()
  return checkpoints.save_t5x_params(params, directory, step,
                                     extra_files={CONFIG_FILE: meta})


def load_head(path: str, config: network.T5Config
              ) -> Tuple[Any, HeadConfig]:
  """`(head params, HeadConfig)` from `save_head`'s checkpoint (or its dir).

  Raises:
    ValueError: no draft_head.json, or shapes that do not fit `config`.
  """
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  if not path.startswith('gs://'):
    path = os.path.abspath(os.path.expanduser(path))
  if os.path.isdir(path) and not os.path.basename(path).startswith(
      'checkpoint_'):
    latest = checkpoints.latest_checkpoint(path)
    if latest is None:
      raise ValueError(f'No checkpoint_<step> in {path} (a draft head dir '
                       'written by scripts/train_heads.py?).')
    path = latest
  meta_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(meta_path):
    raise ValueError(f'{path} has no {CONFIG_FILE}: not a draft head '
                     'checkpoint (scripts/train_heads.py writes them).')
  with open(meta_path) as f:
    try:
      head = HeadConfig(**json.load(f))
    except (TypeError, ValueError) as e:
      raise ValueError(f'{meta_path}: not a head config ({e}).') from e
  params = checkpoints.load_t5x_params(path, dtype=jnp.float32)
  check_head(params, config, head, f'draft head checkpoint {path}')
  return params, head


# ---------------------------------------------------------------------------
# The head on the target's own states.
# ---------------------------------------------------------------------------


def embed(target_params, config: network.T5Config, tokens: Array) -> Array:
  """The target's input embedding of `tokens`."""
  table = target_params['token_embedder']['embedding']
  return jnp.asarray(jnp.take(table, tokens, axis=0), config.compute_dtype)


def project(target_params, config: network.T5Config, state: Array) -> Array:
  """The target's logits of a normalized final state (float32)."""
  state = jnp.asarray(state, jnp.float32)
  if config.logits_via_embedding:
    table = jnp.asarray(target_params['token_embedder']['embedding'],
                        jnp.float32)
    return state @ table.T / jnp.sqrt(state.shape[-1])
  kernel = target_params['decoder']['logits_dense']['kernel']
  return state @ jnp.asarray(kernel, jnp.float32)


@dataclasses.dataclass(frozen=True)
class Head:
  """A draft head on a target: the callables the loops use (hashable)."""

  config: network.T5Config
  head: HeadConfig

  @property
  def module(self) -> DraftHead:
    return DraftHead(self.config, self.head)

  def step(self, head_params, target_params, state, tokens, cross_kv,
           cross_bias):
    """`[batch, k, embed]` states + `[batch, k]` tokens -> (state, logits)."""
    nxt = self.module.apply({'params': head_params[KEY]}, state,
                            embed(target_params, self.config, tokens),
                            cross_kv, cross_bias)
    return nxt, project(target_params, self.config, nxt)

  def draft(self, head_params, target_params, state, token, cache, gamma,
            sampling, rng):
    """gamma drafts after `token` `[batch]`, from `state` `[batch, embed]`.

    cache: the target's `DecoderCache` (its last layer's cross K/V).
    Returns `(drafts [batch, gamma], q [batch, gamma, vocab])`.
    """
    kv = (cache.cross_key[-1], cache.cross_value[-1])
    bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])
    s, tok = state[:, None], token[:, None]
    drafts, qs = [], []
    for key in jax.random.split(rng, gamma):
      s, logits = self.step(head_params, target_params, s, tok, kv, bias)
      tok, q = sampling_lib.draw(key, logits[:, 0], sampling)
      tok = tok[:, None]
      drafts.append(tok)
      qs.append(q)
    return jnp.concatenate(drafts, 1), jnp.stack(qs, 1)


# ---------------------------------------------------------------------------
# Training on the target's own states.
# ---------------------------------------------------------------------------


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
  return model.module.apply({'params': target_params}, encoder_input_tokens,
                            dec_in, method=_features)


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


# ---------------------------------------------------------------------------
# The drafter for the ordinary loop.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HeadDrafter:
  """The target and its draft head as an `interfaces.Drafter` (kind 'heads').

  params: `{'target': target params, 'head': head params}` (`head_params`).
  Draft 1 is drawn from the target's own next-token distribution (its
  `propose` runs the target on the committed tokens its cache copy lacks),
  drafts 2.. from the head. Use `heads_sample` (what `sampler` returns) for
  the loop where drafting rides on the verification call.
  """

  model: network.T5Model
  head: HeadConfig

  # q_i for i >= 2 comes from the head, not from `score` after the prefix
  # and drafts 1..i-1: tests/test_drafters.py's prefill/score check skips.
  drafts_from_score = False

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def heads(self) -> Head:
    return Head(self.model.config, self.head)

  @property
  def merged_loop(self):
    """The loop callers decode with (`speculative.sampler`)."""
    return heads_sample

  def check_params(self, params) -> None:
    if not isinstance(params, dict) or set(params) != {'target', 'head'}:
      raise ValueError("Draft-head params must be {'target': target params, "
                       "'head': head params} (head_params).")
    check_head(params['head'], self.model.config, self.head)
    drafters.T5Drafter(self.model).check_params(params['target'])

  def init(self, params, encoder_input_tokens, max_length: int):
    return self.model.init_cache(params['target'], encoder_input_tokens,
                                 max_length + 2)

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    """The target's logits (q_1's; later drafts come from the head)."""
    return drafters.T5Drafter(self.model).score(
        params['target'], encoder_input_tokens, decoder_input_tokens)

  def prefill(self, params, cache, sequences, lengths):
    """Consumes `sequences[b, :lengths[b] - 1]` into its target cache."""
    return drafters.T5Drafter(self.model).prefill(params['target'], cache,
                                                  sequences, lengths)

  def propose(self, params, cache, sequences, lengths, gamma: int,
              sampling: SamplingConfig, rng: Array):
    """One target call on the tokens the cache lacks, then the head."""
    start = cache.position
    fed = lengths - start  # 1 .. gamma + 1 committed tokens to feed
    idx = jnp.minimum(start[:, None] + jnp.arange(gamma + 1),
                      sequences.shape[1] - 1)
    block = jnp.take_along_axis(sequences, idx, axis=1)
    (logits, hidden), cache = self.model.extend(
        params['target'], block, cache, return_hidden=True)
    last = (fed - 1)[:, None, None]
    logits = jnp.take_along_axis(logits, last, 1)[:, 0]
    state = jnp.take_along_axis(hidden, last, 1)[:, 0]
    rng1, rng2 = jax.random.split(rng)
    first, q1 = sampling_lib.draw(rng1, logits, sampling)
    cache = cache.rewind(lengths)
    if gamma == 1:
      return first[:, None], q1[:, None], cache
    rest, q_rest = self.heads.draft(params['head'], params['target'], state,
                                    first, cache, gamma - 1, sampling, rng2)
    return (jnp.concatenate([first[:, None], rest], 1),
            jnp.concatenate([q1[:, None], q_rest], 1), cache)


def head_params(target_params, params):
  """The drafter's params: the target's (shared, not copied) + the head's."""
  return {'target': target_params, 'head': params}


# ---------------------------------------------------------------------------
# The merged loop: drafting rides on the verification call.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _HeadLoop(speculative.MergedLoop):
  head: Head

  def body_fn(self, target_params, head_params,
              state: speculative.MergedState):
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    lengths = state.lengths
    last = jnp.take_along_axis(state.sequences, (lengths - 1)[:, None], 1)
    block = jnp.concatenate([last, state.drafts], axis=1)
    cache = state.target_cache.rewind(lengths - 1)
    (logits, hidden), cache = self.target.extend(target_params, block, cache,
                                                 return_hidden=True)
    p = sampling_lib.probabilities(logits, self.sampling)
    # Rows without drafts (q = 0) accept none: their token is from p_1.
    sequences, new_lengths, ended, stats, n = speculative.accept_and_commit(
        verify_rng, state.drafts, state.q, p, self.sampling, self.eos_id,
        self.max_decode_len, sequences=state.sequences, lengths=lengths,
        ended=state.ended, stats=state.stats)
    # h_n gave the committed token y (accepted-draft bonus or residual).
    h_n = jnp.take_along_axis(hidden, n[:, None, None], 1)[:, 0]
    y = jnp.take_along_axis(sequences, (new_lengths - 1)[:, None], 1)[:, 0]
    drafts, q = self.head.draft(head_params, target_params, h_n, y, cache,
                                self.gamma, self.sampling, draft_rng)
    return speculative.MergedState(sequences, new_lengths, ended, cache,
                                   drafts, q, rng, stats)


def _prepare(target, target_params, drafter, draft_params,
             encoder_input_tokens, gamma, max_decode_len, sampling, eos_id,
             rng):
  decoding.check_common_args(target, encoder_input_tokens, max_decode_len,
                             sampling, eos_id)
  speculative.check_gamma(gamma)
  if not isinstance(drafter, HeadDrafter):
    raise ValueError(f'heads_sample needs a HeadDrafter, got '
                     f'{type(drafter).__name__}.')
  if not isinstance(target, network.T5Model):
    raise ValueError('heads_sample reads the final states of a plain '
                     f'network.T5Model target, got {type(target).__name__}.')
  speculative.check_vocab(target.vocab_size, drafter.vocab_size)
  if not isinstance(draft_params, dict) or 'head' not in draft_params:
    raise ValueError('draft_params must be head_params(...).')
  check_head(draft_params['head'], target.config, drafter.head)
  rng = decoding.default_rng(rng, sampling)
  inputs = jnp.asarray(encoder_input_tokens, jnp.int32)
  loop = _HeadLoop(target, int(gamma), sampling, int(eos_id),
                   int(max_decode_len), head=Head(target.config, drafter.head))
  return loop, (target_params, draft_params['head'], inputs, rng)


def heads_sample(target, target_params, drafter, draft_params,
                 encoder_input_tokens, *, gamma: int, max_decode_len: int,
                 sampling: SamplingConfig = SamplingConfig(),
                 eos_id: int = 1, rng: Optional[Array] = None,
                 draft_input_tokens=None) -> speculative.SpecResult:
  """Self-drafting heads, merged loop: `speculative_sample`'s signature.

  One (gamma + 1)-token target call per iteration (logits and final states)
  and gamma head steps; `drafter` / `draft_params` are the 'heads' kind's
  (`HeadDrafter`, `head_params`: only the head is read from draft_params).
  Output law = the target's; greedy = the baseline. `stats.iterations`
  counts target calls.
  """
  del draft_input_tokens  # the target reads its own inputs
  loop, args = _prepare(target, target_params, drafter, draft_params,
                        encoder_input_tokens, gamma, max_decode_len, sampling,
                        eos_id, rng)
  return speculative.run_merged(loop, *args)


def lower_heads_sample(target, target_params, drafter, draft_params,
                       encoder_input_tokens, *, gamma: int,
                       max_decode_len: int,
                       sampling: SamplingConfig = SamplingConfig(),
                       eos_id: int = 1, rng: Optional[Array] = None,
                       draft_input_tokens=None):
  """`heads_sample`'s compiled program, lowered but not run."""
  del draft_input_tokens
  loop, args = _prepare(target, target_params, drafter, draft_params,
                        encoder_input_tokens, gamma, max_decode_len, sampling,
                        eos_id, rng)
  return speculative.run_merged.lower(loop, *args)


def head_step_bytes(config: network.T5Config, head: HeadConfig,
                    weight_bytes: int = 2) -> int:
  """Weights one head step reads: the head's and the target's logits layer
  (what sets its cost at a memory-bound scale; `weight_bytes` per value)."""
  n = sum(int(np.prod(s)) for s in jax.tree_util.tree_leaves(
      _shapes(config, head), is_leaf=lambda x: isinstance(x, tuple)))
  return (n + config.emb_dim * config.vocab_size) * weight_bytes


# ---------------------------------------------------------------------------
# The drafter kind.
# ---------------------------------------------------------------------------


def _build_heads(source: drafters.DraftSource):
  """Target + head from `source.draft_checkpoint` (DRAFT_CHECKPOINT, a
  scripts/train_heads.py --out_dir), or untrained (a warning)."""
  if source.target_model is None or source.target_params is None:
    raise ValueError("drafter kind 'heads' drafts with the target itself; "
                     'the source has no target_model / target_params.')
  model = source.target_model
  params = source.draft_params
  if isinstance(params, dict) and KEY in params:
    head = HeadConfig(
        mlp_dim=int(params[KEY]['wi']['kernel'].shape[1]),
        cross_attention='query' in params[KEY])
  else:
    path = getattr(source, 'draft_checkpoint', None)
    if path and str(path).startswith('shipped:'):
      raise ValueError(
          f"drafter kind 'heads' reads a draft head from DRAFT_CHECKPOINT, "
          f'got {path!r} (a shipped T5): point it at a scripts/train_heads.py '
          '--out_dir (e.g. results/draft_heads/en_de).')
    if path:
      params, head = load_head(os.fspath(path), model.config)
    else:
      logging.warning("drafter kind 'heads': no head checkpoint "
                      '(DRAFT_CHECKPOINT); using an untrained head.')
      head = HeadConfig()
      params = init_head(model.config, head)
  check_head(params, model.config, head)
  return HeadDrafter(model, head), head_params(source.target_params, params)


drafters.register(drafters.DrafterKind(
    'heads', needs_model=False, build=_build_heads, needs_target=True,
    description='self-drafting heads: a small trained head on the target\'s '
                'own final state drafts (DRAFT_CHECKPOINT)'))
