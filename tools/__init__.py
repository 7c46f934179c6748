"""Tools beside the package, run from the repository root; not installed.

`tools.accelerator`: a short, budgeted run on a borrowed accelerator.
The package never imports them (an import-linter contract).
"""
