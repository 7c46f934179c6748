"""Experiments on top of the jobs: benchmarks as specs over the eval job.

`task_table` (the one task table), `reproduce` (the model sets as the eval
job's setups), `sweep` (a spec's cells, each decoded by `eval.evaluate`),
`table` (the rows, the one repredict, the writers), `device_run` (a device
spec's phases on one accelerator, planned by `device_plan`, written by
`device_report`), `specs/` (one file per benchmark) and `python -m
specdec_jax.experiments`. Nothing below the jobs imports this package.
"""
