"""Experiments on top of the jobs: benchmarks as specs over the eval job.

`task_table` (the one task table), `reproduce` (the model sets as the eval
job's setups), `sweep` (a spec's cells, each decoded by `eval.evaluate`),
`table` (the rows, the one repredict, the writers), `specs/` (one file per
benchmark) and `python -m specdec_jax.experiments`. Nothing below the jobs
imports this package. A budgeted run on a borrowed accelerator is no part
of it: tools/accelerator/ at the repository root.
"""
