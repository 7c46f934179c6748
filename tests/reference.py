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


def reference_greedy_walk(tokens, valid, parent, top, target_top, sizes):
  """The greedy tree walk, one row at a time, level by level, in numpy.

  At the current node u (the root first) its drafted children of the
  next level are tried in slot order; the first whose token is the
  target's argmax at u is accepted and becomes u; where none is, the walk
  stops and the next token is the target's argmax at u. beta is counted
  at each node the walk verified children of: 1 where the drafter's and
  the target's argmax there agree.

  Args:
    tokens, valid, parent, top, target_top: `[batch, T]` (the `Tree`
      fields and the target's argmax after each node).
    sizes: the nodes of each level 1..D.

  Returns:
    `(n, path [batch, D], next_token, beta_sum, beta_count)`.
  """
  offsets = np.concatenate([[1], 1 + np.cumsum(sizes)])
  batch, depth = len(tokens), len(sizes)
  n = np.zeros(batch, int)
  path = np.zeros((batch, depth), int)
  next_token = np.zeros(batch, int)
  beta_sum, beta_count = np.zeros(batch), np.zeros(batch, int)
  for b in range(batch):
    u = 0
    for d in range(depth):
      children = [s for s in range(offsets[d], offsets[d + 1])
                  if valid[b, s] and parent[b, s] == u]
      if not children:
        break
      beta_count[b] += 1
      beta_sum[b] += float(top[b, u] == target_top[b, u])
      taken = [s for s in children if tokens[b, s] == target_top[b, u]]
      if not taken:
        break
      u = taken[0]
      path[b, d] = u
      n[b] += 1
    next_token[b] = target_top[b, u]
  return n, path, next_token, beta_sum, beta_count
