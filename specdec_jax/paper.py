"""The paper's published numbers (Leviathan, Kalman & Matias, 2023).

One home for what the reproduction compares against: Table 2 (gamma,
alpha, walltime speed-up of T5-XXL with T5 small / base / large drafters,
TPU-v4, batch 1), Table 3 (alpha of every drafter) and Table 4's c (a
drafter's step over the target's). Keyed by the paper's task column
('EnDe', 'CNNDM'; task_table maps our tasks to it) and
temperature (0, 1).
"""

from typing import Dict, Tuple

# Table 2: (task, t) -> drafter -> (gamma, alpha, speed-up).
TABLE2: Dict[Tuple[str, int], Dict[str, Tuple[int, float, float]]] = {
    ('EnDe', 0): {'small': (7, .75, 3.4), 'base': (7, .80, 2.8),
                  'large': (7, .82, 1.7)},
    ('EnDe', 1): {'small': (7, .62, 2.6), 'base': (5, .68, 2.4),
                  'large': (3, .71, 1.4)},
    ('CNNDM', 0): {'small': (5, .65, 3.1), 'base': (5, .73, 3.0),
                   'large': (3, .74, 2.2)},
    ('CNNDM', 1): {'small': (5, .53, 2.3), 'base': (3, .55, 2.2),
                   'large': (3, .56, 1.7)},
}
# Table 3: task -> drafter -> (alpha at t = 0, alpha at t = 1), T5-XXL target.
TABLE3: Dict[str, Dict[str, Tuple[float, float]]] = {
    'EnDe': {'unigram': (.08, .07), 'bigram': (.20, .19),
             'small': (.75, .62), 'base': (.80, .68), 'large': (.82, .71)},
    'CNNDM': {'unigram': (.13, .08), 'bigram': (.23, .16),
              'small': (.65, .53), 'base': (.73, .55), 'large': (.74, .56)},
}
# Table 4: c of each T5 drafter against T5-XXL.
TABLE4_C: Dict[str, float] = {'small': 0.02, 'base': 0.04, 'large': 0.11}
