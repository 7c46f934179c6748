r"""Trains a T5 on a seqio task, launched like a T5X training job.

  python scripts/train.py \
    --gin_file=gin_configs/train/en_de_mini_xxl.gin \
    --gin.MODEL_DIR="'/tmp/models/en_de_mini_xxl'"

Flags follow T5X: `--gin_file` (repeatable), `--gin_bindings` (repeatable),
`--gin.NAME=VALUE` (shorthand for a binding), `--gin_search_paths`
(comma-separated; the project's gin_configs/ is always searched);
`--no_progress`, and `--plot` (MODEL_DIR/loss.png after training). The run
file is gin_configs/train/train.gin; the job is `specdec_jax.training.main`.

Writes to MODEL_DIR: config.gin (the full gin config, before training),
checkpoint_<step>/ (T5X orbax layout), log.jsonl, operative_config.gin (after
training) and, with --plot, loss.png. A rerun resumes from the latest
checkpoint.
"""

from specdec_jax import checks
from specdec_jax import training
from specdec_jax.experiments import plots

if __name__ == '__main__':
  checks.run_main(training.main, plot=plots.plot_losses)
