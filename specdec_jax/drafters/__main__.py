"""`python -m specdec_jax.drafters`: every drafter kind a job may name."""

import argparse

from specdec_jax import drafters

if __name__ == '__main__':
  argparse.ArgumentParser(  # no flags: a mistyped one is refused, not eaten
      prog='python -m specdec_jax.drafters',
      description=__doc__.split(': ', 1)[1]).parse_args()
  print('Drafter kinds (DrafterSpec.kind, gin DRAFTER):')
  print(drafters.KINDS.describe())
