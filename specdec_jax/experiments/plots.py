"""Plots of the experiments: training curves.

`plot_losses` draws the loss and accuracy curves of training runs from their
log.jsonl files (`training.train`'s logs). matplotlib is imported only when
a plot is drawn, with the Agg backend (no display needed).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from specdec_jax import training


def plot_losses(log_paths: Sequence[str], out_png: str,
                labels: Optional[Sequence[str]] = None) -> str:
  """Plots the loss and accuracy curves of training runs.

  Args:
    log_paths: log.jsonl files (or model dirs holding one).
    out_png: the image to write.
    labels: one per log; default the model dir names.

  Returns:
    `out_png`. Train curves are solid lines, validation dashed with markers,
    one color per run."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for i, path in enumerate(log_paths):
    path = os.fspath(path)
    if os.path.isdir(path):
      path = os.path.join(path, training.LOG_FILE)
    label = labels[i] if labels else os.path.basename(os.path.dirname(
        os.path.abspath(path)))
    records = training.read_log(path)
    color = f'C{i % 10}'
    for split, style in (('train', dict(linestyle='-')),
                         ('validation', dict(linestyle='--', marker='o',
                                             markersize=3))):
      rows = [r for r in records if r['split'] == split]
      if not rows:
        continue
      steps = [r['step'] for r in rows]
      for ax, key in zip(axes, ('loss', 'accuracy')):
        ax.plot(steps, [r[key] for r in rows], color=color,
                label=f'{label} ({split})', **style)
  for ax, key in zip(axes, ('loss (cross entropy + z-loss)', 'token accuracy')):
    ax.set_xlabel('step')
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
  axes[0].set_yscale('log')
  axes[1].legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
  fig.savefig(out_png, dpi=120)
  plt.close(fig)
  return out_png
