"""Re-exports the T5X <-> HF T5 name map, which lives in `checkpoints/hf.py`."""

from specdec_jax.checkpoints.hf import Entry
from specdec_jax.checkpoints.hf import from_hf_state_dict
from specdec_jax.checkpoints.hf import hf_config_kwargs
from specdec_jax.checkpoints.hf import parameter_map
from specdec_jax.checkpoints.hf import to_hf_model
from specdec_jax.checkpoints.hf import to_hf_state_dict
