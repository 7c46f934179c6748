r"""Distilling drafters on their target (DistillSpec, arXiv:2310.08461).

A drafter's value is alpha = E[sum_x min(p(x), q(x))] = 1 - E[TV(p, q)]
(Leviathan et al. 2023, Definition 3.1 and Corollary 3.6), measured on the
target's own outputs. DistillSpec finds that what matters most is (1) the
data: the target's own generations (on-policy for the target) rather than the
references, and (2) the divergence: total variation, which is 1 - beta and so
maximizes alpha directly, or forward KL. Both are here:

- `generate`: the target's outputs over a split's inputs with our batched,
  jitted baseline decoder (greedy and/or sampled), written once as a sharded
  array data set (arrays.py format) with a tqdm bar; shards already written
  are kept, so an interrupted run resumes. Training a drafter on these
  outputs with the ordinary cross entropy is sequence-level KD (Kim & Rush
  2016, arXiv:1606.07947).
- `token_kd_sums`: token-level KD against the target's logits on the same
  teacher-forced prefix: forward KL(p || q) ('fkl') or total variation
  ('tvd'), with `training.train(teacher=..., kd_loss=..., kd_weight=...)`.

The target is frozen: its logits are computed inside the train step under
`stop_gradient` and only the drafter's parameters are updated.

References: DistillSpec, arXiv:2310.08461; sequence-level KD,
arXiv:1606.07947; speculative decoding, arXiv:2211.17192.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import arrays
from specdec_jax import checks
from specdec_jax import data as data_lib
from specdec_jax import decoding
from specdec_jax.sampling import SamplingConfig

KD_LOSSES = ('none', 'fkl', 'tvd')
Array = Any


def token_kd_sums(student_logits: Array, teacher_logits: Array,
                  weights: Array, kind: str) -> Dict[str, Array]:
  """Sums of a token-level divergence over the weighted positions.

  Args:
    student_logits: `[batch, length, vocab]` (the drafter, q).
    teacher_logits: `[batch, length, vocab]` (the target, p; no gradient
      flows into it).
    weights: `[batch, length]`, 1 on real target tokens.
    kind: 'fkl' (sum_x p log(p / q)) or 'tvd' (1/2 sum_x |p - q|).

  Returns:
    `{'kd': [] sum of the divergence, 'beta': [] sum of sum_x min(p, q)}`;
    beta is reported for every kind (alpha on this data = beta / weight).
  """
  if kind not in ('fkl', 'tvd'):
    raise ValueError(f'kind must be "fkl" or "tvd", got {kind!r}.')
  weights = weights.astype(jnp.float32)
  log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32), axis=-1)
  log_p = jax.lax.stop_gradient(
      jax.nn.log_softmax(teacher_logits.astype(jnp.float32), axis=-1))
  p, q = jnp.exp(log_p), jnp.exp(log_q)
  # [batch, length, vocab] -> [batch, length]
  beta = jnp.sum(jnp.minimum(p, q), axis=-1)
  if kind == 'fkl':
    div = jnp.sum(jnp.where(p > 0, p * (log_p - log_q), 0.0), axis=-1)
  else:
    div = 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
  return {'kd': jnp.sum(div * weights), 'beta': jnp.sum(beta * weights)}


def pick_layers(available: int, keep: int) -> list:
  """Which of `available` layers a cut model keeps: evenly spaced, the
  first always, the last too when keep >= 2 (layer dropping, as in
  arXiv:2309.08168 Draft & Verify / LayerSkip's early-exit drafts)."""
  if not 1 <= keep <= available:
    raise ValueError(f'cannot keep {keep} of {available} layers.')
  return [int(round(i)) for i in np.linspace(0, available - 1, keep)] \
      if keep > 1 else [0]


def init_from_teacher(teacher_params, teacher_config, student_config):
  """The teacher's parameters cut to the student's depth.

  The student must have the teacher's widths (emb_dim, heads, head_dim,
  mlp_dim, vocabulary, activations) and at most its layers; it keeps the
  embedding, the logits layer, the norms, the relative position biases and
  `pick_layers` of the encoder and decoder layers. Distillation then starts
  from a model that already agrees with the target far more than a random
  one.

  Args:
    teacher_params: the target's params tree (T5X names).
    teacher_config: its T5Config.
    student_config: the drafter's T5Config.

  Returns:
    A params tree for `T5Model(student_config)`.

  Raises:
    ValueError: the widths differ or the student is deeper.
  """
  for field in ('vocab_size', 'emb_dim', 'num_heads', 'head_dim', 'mlp_dim',
                'mlp_activations', 'logits_via_embedding'):
    if getattr(teacher_config, field) != getattr(student_config, field):
      raise ValueError(
          f'init_from_teacher needs the same {field}: teacher '
          f'{getattr(teacher_config, field)!r}, student '
          f'{getattr(student_config, field)!r}.')
  params = {k: v for k, v in teacher_params.items()
            if k not in ('encoder', 'decoder')}
  for stack, n_teacher, n_student in (
      ('encoder', teacher_config.num_encoder_layers,
       student_config.num_encoder_layers),
      ('decoder', teacher_config.num_decoder_layers,
       student_config.num_decoder_layers)):
    src = teacher_params[stack]
    out = {k: v for k, v in src.items() if not k.startswith('layers_')}
    for i, j in enumerate(pick_layers(n_teacher, n_student)):
      out[f'layers_{i}'] = src[f'layers_{j}']
    params[stack] = out
  return jax.tree.map(jnp.asarray, params)


def generate(model, params, data: Dict[str, np.ndarray], out_dir: str,
             split: str, *, max_decode_len: int, batch_size: int = 256,
             temperature: float = 0.0, seed: int = 0, num_shards: int = 8,
             num_examples: Optional[int] = None, tag: str = '',
             progress: bool = True) -> Sequence[str]:
  """Writes the target's outputs over `data['inputs']` as an array data set.

  Args:
    model: the target (`network.T5Model`).
    params: its parameters.
    data: `arrays.load(...)` of the inputs to decode (the targets are
      ignored: they are replaced by the model's outputs).
    out_dir: folder of the new data set.
    split: the split name to write (`<split>-0000k-of-0000n.npz`).
    max_decode_len: output length (the outputs end in EOS or are cut here).
    batch_size: rows per decoder call (the last batch is padded).
    temperature: 0 for greedy, else sampling at this temperature.
    seed: sampling seed (each shard folds in its index, so shards are
      independent of the order they are written in).
    num_shards: how many files; each is written atomically when finished.
    num_examples: decode only the first N rows.
    tag: part of the shard names (`<split>-<tag>-0000k-of-0000n.npz`), so
      several generations (greedy, sampled) can share one split.
    progress: draw a tqdm bar.

  Returns:
    The shard paths. Shards already present are not decoded again.
  """
  checks.check_local_folder('out_dir', out_dir)
  inputs = np.asarray(data['inputs'], np.int32)
  if num_examples is not None:
    inputs = inputs[:num_examples]
  n = len(inputs)
  bounds = np.linspace(0, n, num_shards + 1).astype(int)
  name = f'{split}-{tag}' if tag else split
  paths = [os.path.join(out_dir, f'{name}-{i:05d}-of-{num_shards:05d}.npz')
           for i in range(num_shards)]
  todo = [i for i in range(num_shards) if not os.path.isfile(paths[i])]
  bar = None
  if progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=int(sum(bounds[i + 1] - bounds[i] for i in todo)),
               desc=f'generate {split}', unit='ex', dynamic_ncols=True)
  sampling = SamplingConfig(temperature=float(temperature))
  for i in todo:
    rows = inputs[bounds[i]:bounds[i + 1]]
    outs = []
    for start, n, batch in data_lib.batches(rows, batch_size, fill='eos'):
      rng = jax.random.fold_in(jax.random.key(seed), i * 1_000_003 + start)
      out = decoding.temperature_sample(
          model, params, jnp.asarray(batch), max_decode_len=max_decode_len,
          sampling=sampling, rng=rng)
      outs.append(np.asarray(out.tokens)[:n])
      if bar is not None:
        bar.update(n)
    targets = (np.concatenate(outs) if outs else
               np.zeros((0, max_decode_len), np.int32))
    arrays.save(paths[i], {'inputs': rows, 'targets': targets})
  if bar is not None:
    bar.close()
  return paths
