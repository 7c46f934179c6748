"""Unigram / bigram drafters: the paper's Table 3 baselines.

`NgramDrafter` drafts from token statistics of the task's train targets
(`ngram_params`), with no model: kinds 'unigram' and 'bigram'.

References: Leviathan et al. 2023, arXiv 2211.17192, Table 3.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import network
from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import registry

Array = jax.Array


def check_order(name: str, order) -> None:
  """Raises InputError unless `order` is 1 (unigram) or 2 (bigram), the
  orders an `NgramDrafter` drafts and `ngram_params` estimates."""
  if not checks.is_int(order) or order not in (1, 2):
    raise checks.InputError(
        f'{name} must be 1 (unigram) or 2 (bigram), got {order!r}.')


@dataclasses.dataclass(frozen=True)
class NgramDrafter:
  """Unigram (order 1) or bigram (order 2) drafts from token statistics.

  params: for order 1, `{'log_unigram': [vocab]}`; for order 2 also
  `next_tokens` `[vocab, k]` int32 and `next_log_probs` `[vocab, k]`, the k
  most frequent successors of each token with their smoothed log-probabilities,
  and `log_backoff` `[vocab]`: every other successor x of token a gets
  `log_backoff[a] + log_unigram[x]`. This keeps a bigram over a 32k vocabulary
  at vocab * k entries instead of vocab^2.
  Build params with `ngram_params`.
  """

  vocab_size: int
  order: int = 2

  def __post_init__(self):
    checks.check_int('NgramDrafter vocab_size', self.vocab_size)
    check_order('NgramDrafter order', self.order)

  def check_params(self, params) -> None:
    """Raises unless params have the keys and shapes of the class docstring.

    Shapes are read from arrays and `jax.ShapeDtypeStruct`s alike;
    `next_tokens` must be integer ids in [0, vocab_size) (values checked
    when concrete, as `network.check_token_ids`).

    Raises:
      ValueError: a missing key or a wrong shape; TypeError: next_tokens
        not integer.
    """
    if not isinstance(params, Mapping):
      raise ValueError(f'params must be a dict of arrays, got '
                       f'{type(params).__name__}.')
    v = self.vocab_size
    want = {'log_unigram': (v,)}
    if self.order == 2:
      k = np.shape(params.get('next_tokens', ()))[1:2] or ('k',)
      want.update(next_tokens=(v,) + k, next_log_probs=(v,) + k,
                  log_backoff=(v,))
    for name, shape in want.items():
      if name not in params:
        raise ValueError(f'{name!r} is missing (order {self.order} needs '
                         f'{sorted(want)}).')
      if tuple(np.shape(params[name])) != shape or 0 in shape:
        raise ValueError(
            f'{name!r} has shape {tuple(np.shape(params[name]))}; '
            f'vocab_size={v}, order={self.order} needs {shape}.')
    if self.order == 2:
      network.check_token_ids('next_tokens', params['next_tokens'], v)

  def init(self, params, encoder_input_tokens, max_length: int):
    del params, encoder_input_tokens, max_length
    return ()

  def log_q(self, params, prev: Array) -> Array:
    """`[batch]` previous tokens -> `[batch, vocab]` log-probabilities."""
    log_uni = jnp.broadcast_to(params['log_unigram'],
                               prev.shape + (self.vocab_size,))
    if self.order == 1:
      return log_uni
    tokens = params['next_tokens'][prev]  # [batch, k]
    log_p = params['next_log_probs'][prev]
    rows = jnp.arange(prev.shape[0])[:, None]
    base = log_uni + params['log_backoff'][prev][:, None]
    return base.at[rows, tokens].set(log_p)

  def prefill(self, params, state, sequences, lengths):
    """Nothing to consume: `propose` reads the last committed token."""
    del params, sequences, lengths
    return state

  def score(self, params, encoder_input_tokens, decoder_input_tokens):
    del encoder_input_tokens
    b, n = decoder_input_tokens.shape
    log_q = self.log_q(params, decoder_input_tokens.reshape(-1))
    return log_q.reshape(b, n, self.vocab_size)

  def propose(self, params, state, sequences, lengths, gamma: int,
              sampling: sampling_lib.SamplingConfig, rng: Array):
    """Drafts from the last committed token on; see `interfaces.Drafter`."""
    prev = jnp.take_along_axis(sequences, (lengths - 1)[:, None], axis=1)[:, 0]

    def step(prev, rng_i):
      token, q = sampling_lib.draw(rng_i, self.log_q(params, prev), sampling)
      return token, (token, q)

    _, (tokens, qs) = jax.lax.scan(step, prev, jax.random.split(rng, gamma))
    return tokens.T, jnp.moveaxis(qs, 0, 1), state


def _rows(sequences, vocab_size: int):
  """`sequences` as lists of int ids in [0, vocab_size), each without its
  trailing 0s (the padding of decode output: `decoding.DecodeResult`).

  Raises:
    checks.InputError: not a sequence of sequences (a flat list of ids), or
      an id outside [0, vocab_size); TypeError: ids not integers (as
      `network.check_token_ids`).
  """
  def refuse(said):
    raise checks.InputError(
        'sequences must be token id sequences, e.g. [[3, 4, 1], [5, 1]]; '
        f'got {said}.')

  if not isinstance(sequences, Iterable):
    refuse(checks.said(sequences))
  rows = []
  for i, seq in enumerate(sequences):
    try:
      ids = np.asarray(seq)
    except ValueError:  # ragged: a row of rows
      ids = None
    if ids is None or ids.ndim != 1:
      refuse(f'sequences[{i}] = {seq!r:.60}')
    rows.append(np.trim_zeros(ids, 'b') if ids.size else ids.astype(int))
  if any(row.size for row in rows):
    network.check_token_ids('sequences', np.concatenate(rows)[None],
                             vocab_size)
  return [row.tolist() for row in rows]


def ngram_params(sequences: Sequence[Sequence[int]], vocab_size: int,
                 order: int = 2, top_k: int = 64, smoothing: float = 0.1,
                 bos_id: int = 0):
  """Estimates NgramDrafter params from target-side token sequences.

  Args:
    sequences: token id sequences (decoder targets, without BOS), each an
      int sequence of ids in [0, vocab_size); trailing 0s are padding
      (decode output's after EOS) and dropped, so rows of
      `DecodeResult.tokens` may be passed whole.
    vocab_size: vocabulary size, an int >= 1.
    order: 1 (unigram) or 2 (bigram); no other is built.
    top_k: successors kept per token for the bigram, an int >= 1.
    smoothing: mass given to the unigram back-off for each previous token,
      in (0, 1] (add-one smoothing keeps every unigram probability > 0).
    bos_id: the decoder start token, in [0, vocab_size); the first token's
      context.

  Returns:
    A params dict for `NgramDrafter(vocab_size, order)`.

  Raises:
    checks.InputError: an argument outside its rule, named (TypeError:
      token ids not integers).
  """
  checks.check_int('vocab_size', vocab_size)
  check_order('order', order)
  checks.check_int('top_k', top_k)
  if not checks.is_number(smoothing) or not 0 < smoothing <= 1:
    raise checks.InputError(
        f'smoothing must be a number in (0, 1], got {smoothing!r}.')
  if not checks.is_int(bos_id) or not 0 <= bos_id < vocab_size:
    raise checks.InputError(
        f'bos_id must be an int in [0, vocab_size={vocab_size}), got '
        f'{bos_id!r}.')
  counts = np.ones(vocab_size, np.float64)
  pairs = {}
  for seq in _rows(sequences, vocab_size):
    np.add.at(counts, seq, 1)
    for a, b in zip([bos_id] + seq[:-1], seq):
      pairs.setdefault(a, {}).setdefault(b, 0)
      pairs[a][b] += 1
  unigram = counts / counts.sum()
  params = {'log_unigram': jnp.asarray(np.log(unigram), jnp.float32)}
  if order == 1:
    return params
  # Tokens never seen as a context: pure unigram (slot 0 restates token 0).
  next_tokens = np.zeros((vocab_size, top_k), np.int32)
  next_log_probs = np.full((vocab_size, top_k), np.log(unigram[0]), np.float32)
  log_backoff = np.zeros(vocab_size, np.float32)
  for a, succ in pairs.items():
    items = sorted(succ.items(), key=lambda kv: -kv[1])[:top_k]
    total = sum(succ.values())
    toks = np.array([t for t, _ in items])
    # Kept successors get (1 - smoothing) of their empirical share; the rest
    # of the mass (>= smoothing) is spread over all tokens by the unigram.
    kept = (1 - smoothing) * np.array([c for _, c in items]) / total
    backoff = 1.0 - kept.sum()
    probs = kept + backoff * unigram[toks]
    # Unused slots repeat the first kept token with its own probability.
    pad = top_k - len(toks)
    next_tokens[a] = np.concatenate([toks, np.full(pad, toks[0])])
    next_log_probs[a] = np.log(np.concatenate([probs, np.full(pad, probs[0])]))
    log_backoff[a] = np.log(backoff)
  params.update(
      next_tokens=jnp.asarray(next_tokens),
      next_log_probs=jnp.asarray(next_log_probs),
      log_backoff=jnp.asarray(log_backoff),
  )
  return params



def build(order: int, source: registry.DraftSource):
  """An `NgramDrafter` estimated from `source.train_targets`."""
  name = {1: 'unigram', 2: 'bigram'}[order]
  if source.train_targets is None:
    raise checks.InputError(
        f'drafter kind {name!r} is estimated from the task\'s train '
        'targets; the source has no train_targets.')
  params = ngram_params(list(source.train_targets()), source.vocab_size,
                        order)
  return NgramDrafter(source.vocab_size, order), params


UNIGRAM = registry.DrafterKind(
    'unigram', needs_model=False, data_only=True,
    build=functools.partial(build, 1),
    description="unigram statistics of the task's train targets")
BIGRAM = registry.DrafterKind(
    'bigram', needs_model=False, data_only=True,
    build=functools.partial(build, 2),
    description="bigram statistics of the task's train targets")
