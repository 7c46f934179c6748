"""Prompt lookup: drafts copied from the input and the output so far.

`LookupDrafter` (kind 'lookup', LLMA-style) needs no model and no
parameters: it copies what followed the longest recent match of the last
1-3 tokens (`lookup_next`) in the row's source or its own output, with
one-hot q. `CacheDrafter` (drafters/cache.py) copies from other streams by
overriding `init`.

References: Yang et al. 2023 (LLMA), arXiv 2304.04487; Saxena 2023,
prompt lookup decoding.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import registry

Array = jax.Array


def lookup_next(stream: Array, context: Array, length: Array, n_max: int,
                n_min: int) -> Tuple[Array, Array]:
  """The token that followed the longest recent match of a context's suffix.

  For each row, the last n tokens of `context[b, :length[b]]` (n = n_max
  down to n_min; a pattern may include BOS, never a position before it) are
  looked up in `stream[b] ++ context[b, 1:length[b]]`, the context's own
  positions after BOS (so a suffix never matches itself). The longest n that
  matches anywhere wins; among its matches the latest, i.e. the own prefix
  first, then the stream from its end. Entries < 0 in `stream` never match
  and are never copied (separators, ignored tokens); a 0 in it matches BOS
  (how a cached output's first token can follow BOS).

  Args:
    stream: `[batch, s]` int32 reference tokens (negative: none).
    context: `[batch, width]` decoder tokens, BOS first; those at or after
      `length` are ignored.
    length: `[batch]` int32 tokens of the context (>= 1).
    n_max, n_min: the pattern lengths tried (static).

  Returns:
    `(token [batch] int32, n [batch] int32)`: the copied token and the
    length of the match, n = 0 (and token -1) where none matched.
  """
  b, width = context.shape
  context = context.astype(jnp.int32)
  length = length.astype(jnp.int32)
  pos = jnp.arange(width)[None]
  pre = jnp.where((pos >= 1) & (pos < length[:, None]), context, -2)
  full = jnp.concatenate(
      [stream.astype(jnp.int32), jnp.full((b, 1), -1, jnp.int32), pre,
       jnp.full((b, n_max), -2, jnp.int32)], axis=1)
  starts = stream.shape[1] + 1 + width  # candidate match starts (static)
  token = jnp.full((b,), -1, jnp.int32)
  found = jnp.zeros((b,), jnp.int32)
  for n in range(n_max, n_min - 1, -1):
    idx = jnp.clip(length[:, None] - n + jnp.arange(n), 0, width - 1)
    pattern = jnp.take_along_axis(context, idx, axis=1)  # [batch, n]
    match = length - n >= 0  # the pattern lies in the context
    match = match[:, None] & (full[:, n:n + starts] >= 0)
    for k in range(n):
      match &= full[:, k:k + starts] == pattern[:, k:k + 1]
    best = jnp.max(jnp.where(match, jnp.arange(starts), -1), axis=1)
    copied = jnp.take_along_axis(
        full, (jnp.maximum(best, 0) + n)[:, None], axis=1)[:, 0]
    hit = (found == 0) & (best >= 0)
    token = jnp.where(hit, copied, token)
    found = jnp.where(hit, n, found)
  return token, found


def source_stream(encoder_input_tokens: Array, eos_id: int) -> Array:
  """A lookup stream of encoder inputs: padding 0 and EOS become -1."""
  source = jnp.asarray(encoder_input_tokens, jnp.int32)
  return jnp.where((source != 0) & (source != eos_id), source, -1)


def one_hot_logits(token: Array, vocab_size: int) -> Array:
  """Logits 0 at `token` `[...]`, -inf elsewhere (a deterministic draft)."""
  iota = jnp.arange(vocab_size, dtype=jnp.int32)
  return jnp.where(iota == token[..., None], 0.0, -jnp.inf)


@dataclasses.dataclass(frozen=True)
class LookupDrafter:
  """Prompt-lookup (LLMA-style) drafts: copies what followed a match.

  T5's encoder and decoder share one vocabulary, so a source token can be
  proposed as an output token. For each row and each draft, the context is
  the decoder prefix (committed tokens, BOS first, then the drafts proposed
  so far in this call); its last n tokens are looked up (`lookup_next`),
  n = n_max down to n_min, in the stream `source ++ prefix`:

  - source: the row's encoder input tokens (the drafter's state, from
    `init`), without padding 0 and `eos_id` (never matched, never copied);
  - prefix: the context's earlier positions, BOS excluded (a match must be
    followed by a token of the context, so the suffix never matches
    itself); a pattern including BOS matches nothing here.

  Matching rule: the longest n that matches anywhere wins; among the matches
  of that n, the most recent one in the stream (the latest in the prefix,
  else the latest in the source). The draft is the token that followed the
  match. Where no n matches: `eos_id` (lookup never copies EOS, so this is
  its only way to propose the end of the output, and the source has no
  continuation after its last token), or, with `adaptive`, no draft at all:
  the row stops drafting there (q = 0 from that position on,
  `interfaces.Drafter.propose`). Each draft re-runs the lookup on
  prefix ++ drafts so far, so a match continues copying.

  Deterministic: q is one-hot on the draft (logits 0 there, -inf elsewhere,
  through `sampling.draw`), so the acceptance probability is p(draft) in
  every sampling mode. No parameters: params are `()` (or None). All jnp with
  static shapes, vectorized over the batch; rows are independent.
  Subclasses draft from other streams by overriding `init`.
  """

  vocab_size: int
  n_max: int = 3
  n_min: int = 1
  eos_id: int = 1
  adaptive: bool = False

  def __post_init__(self):
    ints = (self.vocab_size, self.n_max, self.n_min, self.eos_id)
    if not all(checks.is_int(x) for x in ints):
      raise ValueError(f'{type(self).__name__} fields must be ints, got '
                       f'{self!r}.')
    if not 1 <= self.n_min <= self.n_max:
      raise ValueError(f'{type(self).__name__} needs 1 <= n_min <= n_max, '
                       f'got n_min={self.n_min}, n_max={self.n_max}.')
    if not 0 <= self.eos_id < self.vocab_size:
      raise ValueError(f'eos_id={self.eos_id} is outside [0, '
                       f'{self.vocab_size}).')

  def check_params(self, params) -> None:
    """Accepts `()` or None (no parameters); ValueError otherwise."""
    if params is None or (isinstance(params, tuple) and not params):
      return
    raise ValueError('the lookup drafter has no parameters: draft_params '
                     f'must be () or None, got {type(params).__name__}.')

  def init(self, params, encoder_input_tokens, max_length: int):
    """The state is the lookup stream `[batch, s]` (`source_stream`)."""
    del params, max_length
    return source_stream(encoder_input_tokens, self.eos_id)

  def prefill(self, params, state, sequences, lengths):
    """Nothing to consume: every lookup reads the whole prefix."""
    del params, sequences, lengths
    return state

  def lookup(self, stream: Array, context: Array, length: Array):
    """`(token, matched)` `[batch]` after `context[b, :length[b]]`.

    token is the copied token, or `eos_id` where nothing matched
    (matched False).
    """
    token, n = lookup_next(stream, context, length, self.n_max, self.n_min)
    return jnp.where(n > 0, token, self.eos_id), n > 0

  def score_tokens(self, params, encoder_input_tokens, decoder_input_tokens):
    """`(tokens, matched)` `[batch, length]`: the lookup after each prefix."""
    decoder_input_tokens = jnp.asarray(decoder_input_tokens, jnp.int32)
    b, n = decoder_input_tokens.shape
    stream = self.init(params, encoder_input_tokens, n)
    # [length, batch]: position t looks up after tokens :t + 1.
    tokens, matched = jax.vmap(
        lambda t: self.lookup(stream, decoder_input_tokens,
                              jnp.full((b,), t + 1, jnp.int32)))(
                                  jnp.arange(n))
    return tokens.T, matched.T

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    """One-hot logits of the draft after each prefix (the fallback where
    nothing matched, also when `adaptive`, which does not draft there)."""
    tokens, _ = self.score_tokens(params, encoder_input_tokens,
                                  decoder_input_tokens)
    return one_hot_logits(tokens, self.vocab_size)

  def propose(self, params, state, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """gamma lookups, each after the prefix and the drafts before it."""
    del params
    context = jnp.pad(sequences.astype(jnp.int32), ((0, 0), (0, gamma)))
    pos = jnp.arange(context.shape[1])[None]

    def step(carry, i_rng):
      context, going = carry
      i, rng_i = i_rng
      token, matched = self.lookup(state, context, lengths + i)
      token, q = sampling_lib.draw(
          rng_i, one_hot_logits(token, self.vocab_size), sampling)
      if self.adaptive:
        going = going & matched
        q = jnp.where(going[:, None], q, 0.0)
      context = jnp.where(pos == (lengths + i)[:, None], token[:, None],
                          context)
      return (context, going), (token, q)

    going = jnp.ones(lengths.shape, bool)
    _, (tokens, qs) = jax.lax.scan(
        step, (context, going),
        (jnp.arange(gamma), jax.random.split(rng, gamma)))
    return tokens.T, jnp.moveaxis(qs, 0, 1), state



def build(source: registry.DraftSource):
  """Needs nothing but the vocabulary: it copies from each row's own input
  and output."""
  return LookupDrafter(source.vocab_size, adaptive=source.confidence > 0), ()


KIND = registry.DrafterKind(
    'lookup', needs_model=False, build=build, reads_confidence=True,
    description='prompt lookup: copies what followed the longest recent '
                'match of the last 1-3 tokens in the input or the output')
