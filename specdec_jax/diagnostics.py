r"""Why a greedy speculative row differs from the baseline: rounding or a bug.

Greedy speculative decoding must give the baseline's tokens. In float32 on a
CPU it does, bit for bit (tests/test_speculative.py). In bfloat16 on a GPU it
need not: the baseline computes each position in a 1-token decoder call, the
verification in a (gamma + 1)-token call; the kernels differ, so does the
rounding, and where the target's two best logits are closer than that
rounding the two argmaxes may differ (../shared/GPU.md: 4 of 4 rows). From
there on the rows are different but equally valid greedy decodes of the
target. A bug (a wrong acceptance, a stale cache slot) also makes rows differ.
`diagnose` tells the two apart at the first differing position:

1. both rows share the tokens before position i; the target's logits z at i
   are recomputed by teacher forcing with float32 activations (and float32
   attention logits, matmuls at 'highest' precision) on the same weights;
2. a decoder that chose token x had, in its own rounding, x at least as
   large as every other logit; x is consistent with rounding iff
   `z_top - z_x <= bound(x)` (below);
3. the row is a `near_tie` if both decoders' tokens are, else a `mismatch`
   (a bug), naming the decoder whose token is not.

The bound. Logit j is z_j = sum_e h_e W_ej, with h the normalized final
decoder state and W the logits kernel (or the embedding / sqrt(embed) when
tied). Let u be the unit roundoff of the arithmetic (`unit_roundoff`:
bfloat16 2^-8, float16 2^-11, float32 2^-24 on a CPU but 2^-11 on a GPU at
jax's default matmul precision (TF32) and 2^-8 on a TPU (one bfloat16
pass)). Rounding h's entries (|dh_e| <= u |h_e|) moves z_j by at most
u S_j with S_j = sum_e |h_e W_ej| (exact, worst case). h also carries the
rounding of everything before it: n_r roundings of the residual stream
or of a sublayer output added to it (each a relative change <= u), two
per sublayer, i.e. n_r = 6 L_dec + 4 L_enc + 1 (decoder layers have three
sublayers, encoder layers two, which reach the decoder through
cross-attention, plus the final norm). Modelled as independent and of mean
zero (the probabilistic rounding-error analysis of Higham & Mary 2019), they
add up to a relative error of about sqrt(n_r) u, so a computed logit is
within

    eps_j = sqrt(n_r) u S_j

of z_j, and the reference's own error (the same with its u) adds to it. A
decoder that chose x over the true top then satisfies
`z_top - z_x <= eps_top + eps_x`; that is `bound(x)`. It is a bound on
rounding, not on its typical size: on random T5s (2 to 12 layers, widths 32
to 512, bfloat16 activations against float32) the largest measured
|z_hat_j - z_j| is 1.2-3.3 u S_j against sqrt(n_r) = 4.6-11, so rounding
stays 2-8x inside it. For T5 1.1-small's shapes and bfloat16 activations it
is about 1 logit (u = 0.0039, sqrt(n_r) = 9, S ~ 15 per token; a widened
model counts all its layers, identity ones included: ~1.8 logits at T5-XXL
cost); float32 activations make it 8x (GPU, TF32 matmuls) to 2^16x (CPU)
smaller. A wrong token
closer to the top than that is not detected; the bugs that matter (a token
drafted from the wrong position, a stale cache slot) choose tokens far from
the top, and the float32 tests catch any difference at all.

References: Leviathan et al. 2023, arXiv 2211.17192 (identical greedy
outputs, sec. 2.3); N. J. Higham and T. Mary, "A new approach to
probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import network
from specdec_jax import partitioning

NEAR_TIE = 'near_tie'
MISMATCH = 'mismatch'

_MANTISSA_BITS = {'bfloat16': 8, 'float16': 11, 'float32': 24,
                  'float64': 53}

# The significand bits of a float32 matmul's products on a GPU and a TPU
# under each of jax's `jax_default_matmul_precision` values (lowercased;
# the CPU keeps float32 under every one). 'bfloat16' is 'default' and
# 'tensorfloat32' 'high' in jax; the presets name an algorithm, and n
# passes of a narrower type give about n times its bits.
_MATMUL_BITS = {
    'default': (11, 8), 'bfloat16': (11, 8), 'high': (11, 11),
    'tensorfloat32': (11, 11), 'highest': (24, 24), 'float32': (24, 24),
    'f16_f16_f16': (11, 11), 'f16_f16_f32': (11, 11),
    'bf16_bf16_bf16': (8, 8), 'bf16_bf16_f32': (8, 8),
    'bf16_bf16_f32_x3': (16, 16), 'bf16_bf16_f32_x6': (24, 24),
    'bf16_bf16_f32_x9': (24, 24), 'tf32_tf32_f32': (11, 11),
    'tf32_tf32_f32_x3': (21, 21), 'f32_f32_f32': (24, 24),
    'f64_f64_f64': (24, 24),
    # fp8 operands' algorithms: float32 operands keep their type.
    'any_f8_any_f8_f32': (24, 24), 'any_f8_any_f8_f32_fast_accum': (24, 24),
    'any_f8_any_f8_any': (24, 24), 'any_f8_any_f8_any_fast_accum': (24, 24),
}


def unit_roundoff(dtype: Any, backend: Optional[str] = None,
                  matmul_precision: Optional[str] = None) -> float:
  """Unit roundoff u of arithmetic in `dtype` on `backend`.

  Args:
    dtype: activation dtype (bfloat16, float16, float32, float64).
    backend: 'cpu', 'gpu', 'cuda', 'rocm' or 'tpu' (default: jax's).
    matmul_precision: jax's matmul precision setting, one of the values
      `jax_default_matmul_precision` takes (default: its current one). At
      the default, float32 matmuls run as TF32 on a GPU (u = 2^-11) and as
      one bfloat16 pass on a TPU (u = 2^-8); 'highest' / 'float32' keep
      float32; an algorithm preset ('BF16_BF16_F32_X3', ...) its passes.

  Returns:
    u = 2^-p for a p-bit significand.
  """
  checks.check_type('backend', backend, (str, type(None)),
                    "'cpu', 'gpu', 'cuda', 'rocm', 'tpu' or None")
  name = jnp.dtype(dtype).name
  if name not in _MANTISSA_BITS:
    raise checks.InputError(
        f'dtype must be a float dtype in {sorted(_MANTISSA_BITS)}, got '
        f'{dtype!r}.')
  bits = _MANTISSA_BITS[name]
  backend = (backend or jax.default_backend()).lower()
  if backend not in ('cpu', 'gpu', 'cuda', 'rocm', 'tpu'):
    raise checks.InputError(
        f'backend must be cpu, gpu, cuda, rocm or tpu, got {backend!r}.')
  checks.check_type('matmul_precision', matmul_precision, (str, type(None)),
                    "one of jax's matmul precision names or None")
  if matmul_precision is None:
    matmul_precision = _default_matmul_precision()
  precision = (matmul_precision or 'default').lower()
  if precision not in _MATMUL_BITS:  # a misspelling is not the default
    raise checks.InputError(
        'matmul_precision must be one of jax_default_matmul_precision\'s '
        f'values ({", ".join(sorted(_MATMUL_BITS))}; any case), got '
        f'{matmul_precision!r}.')
  if name == 'float32' and backend != 'cpu':
    bits = _MATMUL_BITS[precision][backend == 'tpu']
  return 2.0 ** -bits


def _default_matmul_precision() -> Optional[str]:
  """jax's current `jax_default_matmul_precision` (None: the default)."""
  try:
    value = jax.config.jax_default_matmul_precision
  except AttributeError:  # jax versions that only expose the State object
    value = getattr(jax.default_matmul_precision, 'value', None)
  return None if value is None else str(value)


def stream_roundings(config: network.T5Config) -> int:
  """n_r = 6 L_dec + 4 L_enc + 1 (see the module docstring)."""
  return 6 * config.num_decoder_layers + 4 * config.num_encoder_layers + 1


def relative_error(config: network.T5Config, backend: Optional[str] = None,
                   matmul_precision: Optional[str] = None) -> float:
  """sqrt(n_r) u for the model's activation dtype plus the reference's."""
  n = math.sqrt(stream_roundings(config))
  act = unit_roundoff(config.compute_dtype, backend, matmul_precision)
  ref = unit_roundoff(jnp.float32, backend, 'highest')
  return n * (act + ref)


@dataclasses.dataclass(frozen=True)
class Divergence:
  """The first differing position of one row and what caused it.

  Attributes:
    row: the row of the batch.
    position: first output position where the two rows differ.
    baseline_token, speculative_token: the tokens chosen there.
    top_tokens: the reference's two best tokens.
    top_logits: their float32 logits.
    top2_gap: top_logits[0] - top_logits[1].
    baseline_deficit, speculative_deficit: z_top - z_x of each choice x.
    baseline_bound, speculative_bound: bound(x) of each (module docstring).
    kind: NEAR_TIE or MISMATCH.
    culprit: '' for a near tie, else 'baseline', 'speculative' or 'both':
      the decoder(s) whose token is further from the top than rounding.
  """

  row: int
  position: int
  baseline_token: int
  speculative_token: int
  top_tokens: tuple
  top_logits: tuple
  top2_gap: float
  baseline_deficit: float
  speculative_deficit: float
  baseline_bound: float
  speculative_bound: float
  kind: str
  culprit: str

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)


def first_differences(baseline_tokens, speculative_tokens) -> np.ndarray:
  """`[batch]` first position where two `[batch, length]` outputs differ.

  -1 where a row is identical.
  """
  a = np.asarray(baseline_tokens)
  b = np.asarray(speculative_tokens)
  if a.shape != b.shape or a.ndim != 2:
    raise checks.InputError(
        'baseline_tokens and speculative_tokens must be [batch, length] of '
        f'one shape, got {a.shape} and {b.shape}.')
  differ = a != b
  return np.where(differ.any(axis=1), differ.argmax(axis=1), -1)


def reference_model(model: network.T5Model) -> network.T5Model:
  """The same network with float32 activations and attention logits."""
  checks.check_type('model', model, network.T5Model, 'a network.T5Model')
  return network.T5Model(model.config.replace(
      activation_dtype=jnp.float32, float32_attention_logits=True))


@functools.partial(jax.jit, static_argnums=(0,))
def _reference(model: network.T5Model, params, encoder_input_tokens,
               decoder_input_tokens, position):
  """Float32 logits and S = |h| @ |W| at `position` `[batch]`."""
  logits, hidden = model.logits_and_hidden(params, encoder_input_tokens,
                                           decoder_input_tokens)
  take = lambda x: jnp.take_along_axis(
      x, position[:, None, None], axis=1)[:, 0]
  z, h = take(logits), take(hidden).astype(jnp.float32)
  if model.config.logits_via_embedding:
    w = params['token_embedder']['embedding'].astype(jnp.float32).T
    w = w / jnp.sqrt(jnp.float32(w.shape[0]))
  else:
    w = params['decoder']['logits_dense']['kernel'].astype(jnp.float32)
  # [batch, embed] x [embed, vocab] -> [batch, vocab]
  return z, jnp.abs(h) @ jnp.abs(w)


def reference_logits(model, params, encoder_input_tokens, decoder_tokens,
                     position):
  """Teacher-forced float32 logits of the target at given positions.

  Args:
    model: the target, a `network.T5Model` (any activation dtype).
    params: its parameters (the same weights are used).
    encoder_input_tokens: `[batch, input_length]`.
    decoder_tokens: `[batch, length]` output tokens (BOS is prepended).
    position: `[batch]` the output position of each row to read.

  Returns:
    `(z [batch, vocab], s [batch, vocab])`: the logits predicting
    decoder_tokens[:, position] from the tokens before it, and
    S_j = sum_e |h_e W_ej` (module docstring).
  """
  ref = reference_model(model)
  tokens = jnp.asarray(decoder_tokens, jnp.int32)
  decoder_inputs = jnp.pad(tokens, ((0, 0), (1, 0)))[:, :-1]  # BOS = 0
  with jax.default_matmul_precision('highest'):
    z, s = _reference(ref, params, jnp.asarray(encoder_input_tokens,
                                               jnp.int32),
                      decoder_inputs, jnp.asarray(position, jnp.int32))
  return partitioning.to_host((z, s))


def classify(z: np.ndarray, s: np.ndarray, baseline_token: int,
             speculative_token: int, relative: float) -> Dict[str, Any]:
  """Classifies one differing position from its reference logits.

  Args:
    z: `[vocab]` float32 reference logits.
    s: `[vocab]` S_j = sum_e |h_e W_ej|.
    baseline_token, speculative_token: the two decoders' choices.
    relative: sqrt(n_r) u (`relative_error`).

  Returns:
    The `Divergence` fields other than row and position.
  """
  z = np.asarray(z, np.float64)
  s = np.asarray(s, np.float64)
  top = np.argsort(-z, kind='stable')[:2]
  out = dict(baseline_token=int(baseline_token),
             speculative_token=int(speculative_token),
             top_tokens=(int(top[0]), int(top[1])),
             top_logits=(float(z[top[0]]), float(z[top[1]])),
             top2_gap=float(z[top[0]] - z[top[1]]))
  off = []
  for name, x in (('baseline', baseline_token),
                  ('speculative', speculative_token)):
    deficit = float(z[top[0]] - z[x])
    bound = float(relative * (s[top[0]] + s[x]))
    out[f'{name}_deficit'] = deficit
    out[f'{name}_bound'] = bound
    if deficit > bound:
      off.append(name)
  out['kind'] = MISMATCH if off else NEAR_TIE
  out['culprit'] = {0: '', 1: off[0] if off else '', 2: 'both'}[len(off)]
  return out


def diagnose(model, params, encoder_input_tokens, baseline_tokens,
             speculative_tokens, *, backend: Optional[str] = None,
             rows_per_call: int = 1) -> List[Divergence]:
  """Classifies every row where greedy speculative output differs.

  Args:
    model: the target (`network.T5Model`), as both decoders ran it.
    params: its parameters.
    encoder_input_tokens: `[batch, input_length]`.
    baseline_tokens: `[batch, length]` baseline greedy output.
    speculative_tokens: `[batch, length]` speculative greedy output.
    backend: where the decoders ran (default: jax's backend); sets u.
    rows_per_call: rows per reference call (a fixed size: one compile).

  Returns:
    One `Divergence` per differing row, in row order.
  """
  checks.check_int('rows_per_call', rows_per_call)
  vocab = model.vocab_size  # an id past it would index past the logits
  batch = network.check_token_ids('encoder_input_tokens',
                                  encoder_input_tokens, vocab)[0]
  for name, tokens in (('baseline_tokens', baseline_tokens),
                       ('speculative_tokens', speculative_tokens)):
    network.check_rows(name, network.check_token_ids(name, tokens, vocab)[0],
                       'encoder_input_tokens', batch)
  first = first_differences(baseline_tokens, speculative_tokens)
  rows = np.flatnonzero(first >= 0)
  if rows.size == 0:
    return []
  enc = np.asarray(encoder_input_tokens)
  base = np.asarray(baseline_tokens)
  spec = np.asarray(speculative_tokens)
  relative = relative_error(model.config, backend)
  out = []
  for start in range(0, rows.size, rows_per_call):
    chunk = rows[start:start + rows_per_call]
    pad = np.concatenate([chunk, np.repeat(chunk[-1:], rows_per_call -
                                           chunk.size)])
    z, s = reference_logits(model, params, enc[pad], base[pad], first[pad])
    for i, row in enumerate(chunk):
      pos = int(first[row])
      out.append(Divergence(row=int(row), position=pos, **classify(
          z[i], s[i], base[row, pos], spec[row, pos], relative)))
  return out


def counts(divergences: Sequence[Divergence]) -> Dict[str, int]:
  """{'differing', 'near_ties', 'mismatches'} of a list of divergences."""
  kinds = [d.kind for d in divergences]
  return {'differing': len(kinds), 'near_ties': kinds.count(NEAR_TIE),
          'mismatches': kinds.count(MISMATCH)}
