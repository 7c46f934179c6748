"""Experiments on top of the jobs: the paper's tables and their setups.

`reproduce` holds the paper's published numbers (Tables 2 and 3), the model
setups the reproduction scripts run (mini models trained here, the shipped
models, real T5X checkpoints) as `loading.EvalSetup`s, and the helpers the
scripts/reproduce_*.py share. Nothing below the jobs imports this package.
"""
