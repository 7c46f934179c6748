"""Checkpoints: T5X params in every T5X format, and HF T5 weights.

- `t5x`: T5X checkpoints, params only. `load_t5x_params` reads legacy msgpack
  (inline or tensorstore zarr leaves), early orbax and current orbax layouts;
  `save_t5x_params` writes T5X's orbax layout; `seal_checkpoint` /
  `verify_checkpoint` write and check the manifest of a checkpoint that
  has none (T5X's own; `python -m specdec_jax.checkpoints`); `all_steps`,
  `latest_checkpoint` and `step_of` read `checkpoint_<step>` folder names;
  each load checks its tree against the T5Config
  (`check_params` / `expected_shapes`: network's, re-exported).
- `manifest`: checksum manifests (sha256 and size of every file, sha256 of
  every array): `save_t5x_params` writes one into each checkpoint,
  `load_t5x_params(..., verify=True)` checks it, `shipped` uses the same
  code for the shipped assets' MANIFEST.json.
- `hf`: HF transformers T5 / Flan-T5: `config_from_hf`, `load_hf_t5`
  (safetensors), and the T5X <-> HF name map (`parameter_map`,
  `to_hf_state_dict`, `from_hf_state_dict`, `to_hf_model`).
- `_storage`: local and gs:// paths (tensorstore's gcs kvstore);
  `isfile`, `isdir` and `read_bytes` are re-exported for the files that
  travel inside a checkpoint folder (a draft head's config, a training
  run's optimizer state), and `write_bytes` (a whole file or nothing,
  durably), `list_files`, `delete` and `is_gcs` for the jobs' own files
  (a folder kept in a bucket: bucket_folder.py), `read_versioned` and
  `write_if` (a write only where no other came between) for its lease.

The names below are re-exported so `checkpoints.load_t5x_params(...)` etc.
work as before the split.
"""

from specdec_jax.checkpoints import manifest
from specdec_jax.network import check_params  # the rule's home: network
from specdec_jax.network import expected_shapes
from specdec_jax.checkpoints._storage import delete
from specdec_jax.checkpoints._storage import is_gcs
from specdec_jax.checkpoints._storage import isdir
from specdec_jax.checkpoints._storage import isfile
from specdec_jax.checkpoints._storage import list_files
from specdec_jax.checkpoints._storage import read_bytes
from specdec_jax.checkpoints._storage import read_versioned
from specdec_jax.checkpoints._storage import write_bytes
from specdec_jax.checkpoints._storage import write_if
from specdec_jax.checkpoints.hf import config_from_hf
from specdec_jax.checkpoints.hf import load_hf_t5
from specdec_jax.checkpoints.t5x import all_steps
from specdec_jax.checkpoints.t5x import CheckpointError
from specdec_jax.checkpoints.t5x import latest_checkpoint
from specdec_jax.checkpoints.t5x import load_t5x_params
from specdec_jax.checkpoints.t5x import PyTree
from specdec_jax.checkpoints.t5x import save_t5x_params
from specdec_jax.checkpoints.t5x import seal_checkpoint
from specdec_jax.checkpoints.t5x import step_of
from specdec_jax.checkpoints.t5x import verify_checkpoint
