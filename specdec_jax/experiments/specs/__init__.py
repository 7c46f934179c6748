"""The benchmark specs, one file each: config values and one runner call.

A spec is a `sweep.Spec` (its cells, columns, prediction, plot); SPECS
names every one (`python -m specdec_jax.experiments list`). Adding a
benchmark is adding a file here and its name below.
"""

from typing import Dict

from specdec_jax.experiments import sweep
from specdec_jax.experiments.specs import batches
from specdec_jax.experiments.specs import draft_free
from specdec_jax.experiments.specs import heads
from specdec_jax.experiments.specs import hf
from specdec_jax.experiments.specs import lookahead
from specdec_jax.experiments.specs import numerics
from specdec_jax.experiments.specs import profile
from specdec_jax.experiments.specs import table2
from specdec_jax.experiments.specs import table3
from specdec_jax.experiments.specs import trees

SPECS: Dict[str, sweep.Spec] = {
    spec.name: spec for spec in (batches.SPEC, trees.SPEC, table2.SPEC,
                                 table3.SPEC, draft_free.SPEC,
                                 lookahead.SPEC, heads.SPEC, profile.SPEC,
                                 numerics.SPEC, hf.SPEC)
}


def get(name: str) -> sweep.Spec:
  if name not in SPECS:
    raise ValueError(f'Unknown spec {name!r}; expected one of '
                     f'{sorted(SPECS)}.')
  return SPECS[name]
