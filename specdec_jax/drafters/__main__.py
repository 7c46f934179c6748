"""`python -m specdec_jax.drafters`: every drafter kind a job may name."""

from specdec_jax import drafters

if __name__ == '__main__':
  print('Drafter kinds (DrafterSpec.kind, gin DRAFTER):')
  print(drafters.KINDS.describe())
