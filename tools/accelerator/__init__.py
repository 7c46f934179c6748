"""A short, budgeted run on a borrowed accelerator: the loan in a box.

The logistics of renting an accelerator by the minute, kept out of the
package (which never imports them: .importlinter), run from the
repository root with `python -m tools.accelerator.stored` (README.md
here):

- `stored`: the package's own specs run on programs built ahead of time
  (the eval job's programs found by their fingerprints): `build` on a
  machine without the device, `run` on it;
- `aot`: the executable store those programs are kept in, and what a
  build for a device elsewhere needs (its topology, autotune results).
"""
