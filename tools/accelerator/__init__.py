"""A short, budgeted run on a borrowed accelerator: the loan in a box.

The logistics of renting an accelerator by the minute, kept out of the
package (which never imports them: .importlinter), run from the
repository root with `python -m tools.accelerator` (README.md here):

- `spec`: the run as data (`plan.DeviceSpec`): phases in priority order,
  sizes, result sections;
- `run`: the device run itself, its flags and its `Runner`;
- `plan`: its drafters, programs, phases and projection, and what a
  device command may carry (`TRAVEL_LIMIT`, `aot_budget`);
- `pool`: the compile pool, the compile watch and the projection of a
  plan from a measured run's time log;
- `aot`: executables compiled ahead of time on a machine without the
  device, stored, checked and loaded;
- `report`: the run's results page and plots;
- `stored`: the package's own specs run on programs built ahead of time
  (the eval job's programs found by their fingerprints).
"""
