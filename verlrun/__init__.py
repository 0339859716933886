"""The verl backend of the suite: one grid cell = one `python -m verl.trainer.main_ppo` run.

Modules, one job each:
- `cell`: a cell's identity (what a resume must match); its settings come from `rla.config`.
- `overrides`: the Hydra override list for verl's `ppo_trainer` config, and composing it.
- `metrics`: keep earlier metrics when a run resumes (verl's file logger truncates its file).
- `data`: GSM8K / MATH-style sources to verl's parquet schema.
- `launch`: run one cell (resolved config, command, log, metric parts).
- `models`: stage each model once, at a pinned revision, for offline cells.
- `memory`: per-GPU memory estimate and the token budget that fits.
- `checkpoints`, `disk`: checkpoints bounded across restarts; disk per cell and grid.
- `preflight`, `envcheck`, `plan`: checks before submitting; the tables of docs/running.md.
"""
