"""The benchmark harness: what every script under scripts/ measures with.

- `models`: the T5 1.1 / 1.0 / Flan-T5 configs as Python values (the twin of
  gin_configs/models/) and `load(spec)` for `shipped:<name>` or a real
  checkpoint with a config name.
- `budget`: a wall-clock budget and its time log (`Clock`).
- `report`: one results header, and the json / md writers.
- `flags`: the model / data flags of the scripts (`--target`, `--draft`
  with a config spec for a checkpoint, `--arrays`).
- `costs`: the CPU costs run's models, its profile's name and its files
  (costs.json, costs.md, the profile).
- `tensor_parallel`: a measured profile's target on several chips, on
  paper (assumed all-reduces), and its predicted speed-ups.

The harness sits between `loading` and the jobs: it imports the core and
`loading`, and the jobs, the experiments and the scripts import it. The
hardware profiles and the one prediction are no benchmark's: they are a
service of the core (`specdec_jax.hardware`) that the job's gamma choice
reads too.
"""
