"""Independent numpy references the tests compare against."""

import numpy as np


def reference_distribution(logits, temperature, topk=0, topp=1.0):
  """The standardized distribution, written independently with numpy."""
  x = np.asarray(logits, np.float64) / temperature
  if topk:
    x = np.where(x >= np.sort(x)[-topk], x, -np.inf)
  p = np.exp(x - x.max())
  p /= p.sum()
  if topp < 1.0:
    order = np.argsort(-p, kind='stable')
    cum = np.cumsum(p[order])
    n_keep = int(np.searchsorted(cum, topp) + 1)  # first index reaching topp
    keep = np.zeros_like(p, bool)
    keep[order[:n_keep]] = True
    keep |= p >= p[order[n_keep - 1]]  # ties at the threshold are kept
    p = np.where(keep, p, 0.0)
    p /= p.sum()
  return p
