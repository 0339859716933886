"""The gradient probe's ladders: the points of a pre-registered plan (the `gradprobe:` section of
experiments/gradprobe.yaml), run one after the other.

    points:
      base-qwen2: {model: qwen2-s}                                  # the plan's own config, T 1, warm start
      t05-qwen2: {model: qwen2-s, temperature: 0.5}
      step30-qwen2: {model: qwen2-s, rl_step: 30}                   # an RL checkpoint, made with the rig
      long-qwen2: {config: experiments/long.yaml, model: qwen2-l}   # another config's task and model
      w256-qwen2: {model: qwen2-w256, settings: [none, rope, all]}  # fewer settings than the plan's
    seeds: [0, 1, 2]      # optional: every point at each seed, named POINT-sSEED (the batches drawn anew)

A point's model is its config's warm start (made with its data on first use, as the workflow makes them);
`rl_step: N` is that model after N RL steps of the rig (`rl_ablation`, default none), trained on first use
and kept in `{out}/checkpoints/{model}/step_N.pt`. Each point writes `{out}/{point}/`, or `no_signal.txt`
when every batch's groups scored alike (a zero gradient); a point whose folder holds either is not measured
again.
"""

from __future__ import annotations

import argparse
import fcntl
import shutil
from pathlib import Path

import torch

from localrl import train_cell, warm_start
from rla import layout
from rla.cells import Cell
from rla.config import ConfigError, load, model_spec, warmstart_settings
from rla.files import write_text
from studies._shared.settings import log
from studies.gradprobe.judge import seeded
from studies.gradprobe.measure import DEFAULT_BATCHES, SETTINGS, NoSignal, run_point, write
from tinyqwen.data import write_splits
from tinyqwen.task import TaskSettings

POINT_KEYS = {"config", "model", "temperature", "rl_step", "rl_ablation", "batches", "max_new_tokens", "seed",
              "settings"}


def plan_points(plan_file: str | Path) -> tuple[dict, dict[str, dict]]:
    """(plan settings, {point name: point}) of a plan file, checked."""
    cfg = load(plan_file)
    plan = cfg.get("gradprobe")
    if not isinstance(plan, dict) or not isinstance(plan.get("points"), dict) or not plan["points"]:
        raise ConfigError(f"{plan_file}: no `gradprobe: points:` mapping of point names to points")
    points = {}
    for name, point in plan["points"].items():
        unknown = sorted(set(point) - POINT_KEYS)
        if unknown or "model" not in point:
            raise ConfigError(f"{plan_file}: gradprobe point {name!r}: unknown keys {unknown} or no model; "
                              f"allowed: {', '.join(sorted(POINT_KEYS))}")
        points[name] = {"config": str(plan_file), **point}
    points = seeded(plan_file, plan, points)
    bad = [s for p in [plan, *points.values()] for s in p.get("settings", ()) if s not in SETTINGS]
    if bad:
        raise ConfigError(f"{plan_file}: gradprobe.settings {bad} unknown; allowed: {', '.join(SETTINGS)}")
    return plan, points


def ensure_warm_start(point: dict, log=print) -> None:
    """The point's data and warm-started model, made as the workflow makes them if missing."""
    cfg = load(point["config"])
    model_spec(cfg, point["model"], "local")
    data_dir, model_dir = layout.data_dir(cfg), layout.model_dir(cfg, point["model"])
    lock_path = layout.results_dir(cfg) / ".warmstart.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two plans on one config's data and models (two studies' jobs) make them once
        if not (data_dir / "train.parquet").exists():
            log(f"data: {data_dir}")
            write_splits(TaskSettings.from_config(cfg.get("task") or {}), data_dir)
        if not (model_dir / "model.safetensors").exists():
            log(f"warm start: {point['model']} of {point['config']} in {model_dir}")
            warmstart_settings(cfg)
            warm_start(cfg, point["model"], data_dir, model_dir)


def checkpoint_of(point: dict, out: Path, log=print) -> str | None:
    """The RL checkpoint a point asks for (None: the warm start), trained with the rig if missing."""
    steps = point.get("rl_step")
    if not steps:
        return None
    kept = out / "checkpoints" / point["model"] / f"step_{int(steps):06d}.pt"
    if kept.exists():
        return str(kept)
    cfg = load(point["config"])
    ablation, seed = point.get("rl_ablation", "none"), int(point.get("seed", 0))
    cell_dir = layout.cell_dir(cfg, point["model"], ablation, seed)
    log(f"RL checkpoint: {point['model']}/{ablation}/seed{seed} to step {steps} in {cell_dir}")
    train_cell(Cell.of(cfg, point["model"], ablation, seed, cell_dir, steps=int(steps)))
    made = cell_dir / "checkpoints" / f"step_{int(steps):06d}.pt"
    if not made.exists():
        raise ConfigError(f"the cell {cell_dir} has no checkpoint at step {steps}")
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(made, kept)
    return str(kept)


def run_plan(plan_file: str | Path, out: str | Path, only: str | None = None, log=print) -> int:
    plan, points = plan_points(plan_file)
    out = Path(out)
    names = list(points) if not only else [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in points]
    if unknown:
        raise ConfigError(f"--points {unknown} not in {plan_file}; its points: {', '.join(points)}")
    for i, name in enumerate(names, 1):
        point = points[name]
        if (out / name / "gradprobe.csv").exists() or (out / name / "no_signal.txt").exists():
            log(f"[point {i}/{len(names)}] {name}: done already ({out / name})")
            continue
        log(f"[point {i}/{len(names)}] {name}: {point}")
        ensure_warm_start(point, log)
        point = {"temperature": 1.0, "batches": plan.get("batches", DEFAULT_BATCHES), "seed": 0,
                 "settings": plan.get("settings", SETTINGS), **point}
        try:
            result = run_point(point, checkpoint_of(point, out, log), log)
        except NoSignal as err:  # recorded, and the plan goes on: a pre-registered point is reported either way
            write_text(out / name / "no_signal.txt", f"{err}\n")
            log(f"[point {i}/{len(names)}] {name}: no learning signal: {err}")
            continue
        result.meta["point"] = name
        result.rows.insert(0, "point", name)
        result.batches.insert(0, "point", name)
        for path in write(result, out / name):
            log(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run gradprobe",
                                description="policy-gradient error of each setting against an exact training side")
    p.add_argument("--plan", required=True, help="a pre-registered plan (experiments/gradprobe.yaml)")
    p.add_argument("--points", help="only these points (comma-separated names)")
    p.add_argument("--out", required=True, help="output dir: one folder per point under it")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # one process per core
    return run_plan(args.plan, args.out, args.points, log)
