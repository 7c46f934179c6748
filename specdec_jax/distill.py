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
- `run_settings`, `claim_run`: what a method training run on these outputs
  is (scripts/train_pass.py, scripts/train_heads.py), recorded in its
  folder (SETTINGS_FILE) before its data is generated there, and checked
  on a rerun, which resumes only a run of the same settings.

The target is frozen: its logits are computed inside the train step under
`stop_gradient` and only the drafter's parameters are updated.

References: DistillSpec, arXiv:2310.08461; sequence-level KD,
arXiv:1606.07947; speculative decoding, arXiv:2211.17192.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import arrays
from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import data as data_lib
from specdec_jax import decoding
from specdec_jax import run_folder
from specdec_jax import shipped
from specdec_jax.sampling import SamplingConfig

KD_LOSSES = ('none', 'fkl', 'tvd')
Array = Any
# The file in a method training run's folder that records what the run is
# (`claim_run`).
SETTINGS_FILE = 'settings.json'


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
    raise checks.InputError(f'kind must be "fkl" or "tvd", got {kind!r}.')
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
    raise checks.InputError(f'cannot keep {keep} of {available} layers.')
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
      raise checks.InputError(
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


# -------------------------------------------- method training run folders ---
def content_id(values: np.ndarray) -> str:
  """A short sha256 of an array's dtype, shape and values."""
  values = np.ascontiguousarray(values)
  digest = hashlib.sha256(f'{values.dtype.str}{values.shape}'.encode())
  digest.update(values.tobytes())
  return digest.hexdigest()[:32]


def run_settings(script: str, flags: Mapping[str, Any], free: Sequence[str],
                 inputs: np.ndarray, **derived) -> Dict[str, Any]:
  """What a method training run is, for `claim_run`: the `script`, every
  flag of `flags` (the parsed flags' `vars`) but the `free` ones (those
  that only extend or place the run: --steps, --save_every, the folders),
  the `derived` values over the flags of their names (what a default
  stood for: the rows, the decode length), the content of the target's
  checkpoint (flag 'target': `shipped:<name>` or a checkpoint;
  `checkpoints.manifest.fingerprint`) and of the train `inputs`."""
  settings = {k: v for k, v in flags.items() if k not in free}
  settings.update(derived, script=script, train_inputs=content_id(inputs))
  target = str(flags['target'])
  if target.startswith(shipped.SCHEME):
    target = shipped.resolve(target)
  elif not checkpoints.is_gcs(target):
    target = os.path.expanduser(target)
  settings['target_checkpoint_content'] = checkpoints.manifest.fingerprint(
      target)
  return json.loads(json.dumps(settings))


def claim_run(out_dir: str, where: str, settings: Mapping[str, Any]
              ) -> None:
  """Claims the local folder `out_dir` of a method training run for one
  of `settings` (`run_settings`), before anything is written into it: a
  new or empty folder gets SETTINGS_FILE; one whose SETTINGS_FILE holds
  the same settings is the run to resume. `where` names the folder in
  errors (the gs:// address a local copy stands for).

  Raises:
    checks.InputError: `out_dir` holds files but no SETTINGS_FILE
      (another program's folder, a train.py model dir say, or a run
      from before the file), a damaged one, a run of another script, or
      a run of other settings (each changed one named, old -> new), whose
      data and checkpoints are not this run's.
  """
  checks.check_local_folder('out_dir', out_dir)
  script = settings['script']
  held = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
  remedy = 'give another --out_dir, or delete it to start afresh'
  if held and SETTINGS_FILE not in held:
    shown = ', '.join(held[:8]) + (f', ... ({len(held)} in all)'
                                   if len(held) > 8 else '')
    raise checks.InputError(
        f'{where} holds {shown} and no {SETTINGS_FILE}: not a run of '
        f'{script} (another program\'s folder, or a run from before runs '
        'recorded their settings); give another --out_dir, a new or empty '
        'one.')
  path = os.path.join(out_dir, SETTINGS_FILE)
  if held:
    try:
      before = json.loads(checkpoints.read_bytes(path))
      problem = not isinstance(before, dict) and 'not a JSON object'
    except (OSError, ValueError) as e:
      problem = f'{type(e).__name__}: {e}'
    if problem:
      raise checks.InputError(
          f'{where}/{SETTINGS_FILE} is damaged ({problem}), so the run '
          f'cannot be checked against these settings; {remedy}.')
    if before.get('script') != script:
      raise checks.InputError(f'{where} holds a run of '
                              f"{before.get('script')}, not of {script}; "
                              f'{remedy}.')
    changes = run_folder.changes(before, settings)
    if changes:
      raise checks.InputError(
          f'{where} holds a run with other settings ({"; ".join(changes)}).'
          f' Rerun with its settings to resume it, or {remedy}.')
    return
  os.makedirs(out_dir, exist_ok=True)
  checkpoints.write_bytes(path, json.dumps(dict(settings), indent=1,
                                           sort_keys=True).encode())
