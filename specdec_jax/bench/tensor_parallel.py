"""Tensor parallelism on paper: a measured profile's target over chips.

No profile measures an interconnect, so a target call on several chips is
PREDICTED, never measured: `on_paper` splits the profile's measured 1-chip
time t(k) evenly over the chips (a batch-1 call is bound by reading the
weights, which the chips split) and adds the call's ring all-reduces at an
ASSUMED link bandwidth and latency; `tensor_parallel_profile` is the
profile on the chips (that call time as t(k), the replicated drafters'
step times unchanged); `on_paper_speedups` puts both through
`hardware.predict`, one chip against `CHIPS` (scripts/benchmark_mesh.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from specdec_jax import network
from specdec_jax import hardware
from specdec_jax import models

CHIPS = 8
# The profile's drafters of the on-paper speed-ups: its dec2 (a 2-layer
# decoder) and the paper's T5 1.1-small-cost drafter.
PAPER_DRAFTERS = ('dec2', 'small@t5_1_1_small_cost')
XXL = models.CONFIGS['t5_1_1_xxl']


def allreduces_per_call(config: network.T5Config = XXL,
                        chips: int = CHIPS) -> int:
  """All-reduces of one tensor-parallel decoder call: 3 per decoder layer
  (self-attention out, cross-attention out, MLP out) + 1 for the
  vocab-sharded embedding lookup (the compiled target call's count)."""
  return 3 * config.num_decoder_layers + 1 if chips > 1 else 0


def on_paper(profile: hardware.HardwareProfile, link_bytes_s: float,
             latency_s: float, config: network.T5Config = XXL,
             chips: int = CHIPS, tokens: int = 1) -> Dict[str, Any]:
  """One target call on `chips` with tensor parallelism, on paper.

  The measured 1-chip time t(k) of the profile's target (`tokens` = k, batch
  1) divided evenly over the chips (the call is bound by reading the
  weights, which the chips split), plus `allreduces_per_call` ring
  all-reduces of `[tokens, emb]` bfloat16 activations: each moves
  2 (n - 1) / n of the buffer per chip at `link_bytes_s`, after
  `latency_s` (both ASSUMED: no profile measures an interconnect).
  Predicted, not measured.
  """
  t_k, how = profile.cost_at(tokens, 1)
  one_chip_ms = profile.t1_ms * t_k
  n_allreduce = allreduces_per_call(config, chips)
  buffer = tokens * config.emb_dim * 2  # bfloat16
  ring = 2 * (chips - 1) / chips * buffer
  comm_ms = 1e3 * n_allreduce * (latency_s + ring / link_bytes_s)
  weights_ms = one_chip_ms / chips
  return {
      'chips': chips, 'tokens_per_call': tokens,
      't_one_chip_ms': round(one_chip_ms, 4), 't_one_chip_how': how,
      'weights_ms_per_chip': round(weights_ms, 4),
      'allreduces_per_call': n_allreduce, 'bytes_per_allreduce': buffer,
      'ring_bytes_per_chip_per_call': round(n_allreduce * ring),
      'allreduce_ms': round(comm_ms, 4),
      'call_ms': weights_ms + comm_ms,
      'comm_share': round(comm_ms / (weights_ms + comm_ms), 2),
  }


def tensor_parallel_profile(profile: hardware.HardwareProfile,
                            link_bytes_s: float, latency_s: float,
                            chips: int = CHIPS) -> hardware.HardwareProfile:
  """`profile` on `chips`, on paper: a `hardware.HardwareProfile` whose
  t(k) is `on_paper`'s call time and whose drafters (replicated: the same
  step time as on one chip) have c = t_draft / that t(1)."""
  if chips == 1:
    return profile
  t = {k: on_paper(profile, link_bytes_s, latency_s, chips=chips,
                   tokens=k)['call_ms'] for k in profile.cost[1]}
  draft_ms = {name: c * profile.t1_ms for name, c in profile.c[1].items()}
  return dataclasses.replace(
      profile,
      name=(f'{profile.name} x {chips}, tensor-parallel on paper (link '
            f'{link_bytes_s / 1e9:g} GB/s, all-reduce latency '
            f'{latency_s * 1e6:g} us: assumed)'),
      t1_ms=t[1], floor_ms=None, bandwidth=None, launch_ms=None,
      cost={1: {k: v / t[1] for k, v in t.items()}},
      c={1: {name: ms / t[1] for name, ms in draft_ms.items()}})


def run_alphas(profile: hardware.HardwareProfile,
               task: str = 'en_de') -> Dict[str, float]:
  """{drafter: alpha} of the profile's run (its Table 2, `task`, t = 0)."""
  run = hardware.measured_run(profile) or {}
  return {r['drafter']: r['alpha'] for r in run.get('table2', [])
          if r['task'] == task and r['temperature'] == 0}


def on_paper_speedups(profile: hardware.HardwareProfile, link_bytes_s: float,
                      latency_s: float, alpha: Optional[float] = None
                      ) -> Dict[str, Any]:
  """c, cost(gamma + 1) and the speed-up on 1 vs `CHIPS` chips.

  Through `hardware.predict`: on one chip on the measured profile, on
  `CHIPS` on its `tensor_parallel_profile`; alpha: `alpha`, else each
  drafter's alpha in the profile's run (en_de, t = 0). Predicted, not
  measured.
  """
  alphas = run_alphas(profile)
  rows = []
  for chips in (1, CHIPS):
    tp = tensor_parallel_profile(profile, link_bytes_s, latency_s, chips)
    for name in PAPER_DRAFTERS:
      a = alpha if alpha is not None else alphas.get(name)
      if a is None or name not in profile.drafters(1):
        continue
      p = hardware.predict(tp, alpha=a, drafter=name)
      rows.append({'chips': chips, 'drafter': name, 'alpha': round(a, 4),
                   't_target_1_ms': round(tp.t1_ms, 3),
                   't_draft_ms': round(profile.c[1][name] * profile.t1_ms,
                                       4),
                   'c': round(p.c, 4), 'gamma': p.gamma,
                   'cost_gamma_plus_1': round(p.cost, 3),
                   'speedup': round(p.speedup, 2), 'label': p.label,
                   'profile': tp.name})
  return {'profile': profile.name, 'rows': rows,
          'alpha': ('given' if alpha is not None else
                    "each drafter's alpha in the profile's run (en_de, "
                    't = 0)')}
