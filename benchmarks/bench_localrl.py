"""Benchmarks of the local backend (measurements, not tests).

    python benchmarks/bench_localrl.py step [--models qwen2-s,qwen3-m] [--engine vllm|local] [--steps 10]
        the rig's start-up and one RL step (rollout + old log-probs + update + weight sync) of the
        real loop, median over steps, per model
    python benchmarks/bench_localrl.py grid [--jobs 2] [--steps N]
        the whole default grid from scratch (data, warm starts, every cell) in a temporary
        results dir, cells run `--jobs` at a time with one thread each; wall time and per-cell
        scores / k3 KL

Results go to benchmarks/results/localrl_step-{engine}.json and localrl_grid.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rla.machine import describe  # noqa: E402
CONFIG = ROOT / "experiments" / "tiny.yaml"
RESULTS = ROOT / "benchmarks" / "results"


def bench_step(models: list[str], steps: int, ablation: str, engine: str) -> dict:
    """The real loop (`build_rig`, `rl_step`) on each model with the given engine: the rig's start-up
    (engine, GEMM check, trainer) and the median phase times of `steps` RL steps after two warm-up steps."""
    import torch

    from localrl.data import write_splits
    from localrl.run import build_rig, rl_step
    from localrl.task import TaskSettings
    from localrl.warmstart import warmstart
    from rla.cells import Cell
    from rla.config import load as load_config
    from rla.config import rl_settings

    torch.set_num_threads(1)
    cfg = load_config(CONFIG)
    cfg["engine"] = {"name": engine}
    tmp = Path(tempfile.mkdtemp(prefix="bench_localrl_"))
    write_splits(TaskSettings.from_config(cfg["task"]), tmp / "data")
    result = {"engine": engine, "ablation": ablation, "steps_timed": steps, "models": {}}
    for model in models:
        warmstart(cfg, model, tmp / "data", tmp / model)  # a realistic policy: realistic response lengths
        cell = Cell.of(cfg, model, ablation, 0, tmp / "unused", tmp / "data", steps + 2)
        rl = rl_settings(cfg, "local", model)
        t0 = time.perf_counter()
        with build_rig(cell, tmp / model) as rig:
            start = time.perf_counter() - t0
            timed = [rl_step(rig, step) for step in range(1, steps + 3)][2:]  # the first two: warm-up
            engine_start = getattr(rig.engine, "startup_s", None)
            gemm = rig.numerics["trainer_gemm"]
        result["models"][model] = {
            "engine": cell["engine"]["name"], "target": cell["engine"]["target"], "trainer_gemm": gemm,
            "responses_per_step": rl["prompts_per_step"] * rl["samples_per_prompt"],
            "max_response_length": rl["max_response_length"], "rig_start_s": round(start, 2),
            "engine_start_s": None if engine_start is None else round(engine_start, 2),
            "median_s": {k: round(statistics.median(m[f"timing_s/{k}"] for m in timed), 4)
                         for k in ("gen", "old_log_prob", "update", "step")}}
        print(json.dumps({model: result["models"][model]}), flush=True)
    result["machine"] = describe()
    return result


def _run(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as fp:
        subprocess.run(cmd, check=True, stdout=fp, stderr=subprocess.STDOUT, cwd=ROOT,
                       env={**os.environ, "WANDB_MODE": "disabled"})
    return time.perf_counter() - t0


def bench_grid(jobs: int, steps: int | None) -> dict:
    import yaml

    cfg = yaml.safe_load(CONFIG.read_text())
    tmp = Path(tempfile.mkdtemp(prefix="bench_grid_"))
    py = [sys.executable, "-m", "localrl"]
    data = tmp / "data"
    t0 = time.perf_counter()
    timings = {"prepare-data": _run(py + ["prepare-data", "--config", str(CONFIG), "--out", str(data)],
                                    tmp / "data.log")}

    def warm(m):
        return m, _run(py + ["warmstart", "--config", str(CONFIG), "--model", m, "--data", str(data),
                             "--out", str(tmp / "models" / m)], tmp / f"warm_{m}.log")

    with ThreadPoolExecutor(jobs) as pool:
        timings.update({f"warmstart/{m}": s for m, s in pool.map(warm, cfg["models"])})
    t_warm = time.perf_counter() - t0

    cells = [(m, a, s) for m in cfg["models"] for a in cfg["ablations"] for s in cfg["seeds"]]

    def train(cell):
        m, a, s = cell
        out = tmp / "runs" / m / a / f"seed{s}"
        cmd = py + ["train", "--config", str(CONFIG), "--model", m, "--ablation", a, "--seed", str(s),
                    "--out", str(out), "--data", str(data), "--model-dir", str(tmp / "models" / m)]
        if steps:
            cmd += ["--steps", str(steps)]
        return cell, _run(cmd, tmp / f"train_{m}_{a}_{s}.log")

    with ThreadPoolExecutor(jobs) as pool:
        for (m, a, s), sec in pool.map(train, cells):
            timings[f"train/{m}/{a}/seed{s}"] = sec
    wall = time.perf_counter() - t0

    summary = []
    for m, a, s in cells:
        rows = [json.loads(line) for line in open(tmp / "runs" / m / a / f"seed{s}" / "metrics.jsonl")]
        d = [r["data"] for r in rows]
        k = max(1, len(d) // 5)  # first and last fifth of the run
        val = [x["val/score/mean"] for x in d if "val/score/mean" in x]
        summary.append({
            "model": m, "ablation": a, "seed": s, "steps": len(d),
            "score_first": statistics.mean(x["critic/score/mean"] for x in d[:k]),
            "score_last": statistics.mean(x["critic/score/mean"] for x in d[-k:]),
            "val_first": val[0] if val else None, "val_last": val[-1] if val else None,
            "k3_kl_mean": statistics.mean(x["rollout_corr/k3_kl"] for x in d),
            "k3_kl_max": max(x["rollout_corr/k3_kl"] for x in d),
            "probs_diff_mean": statistics.mean(x["training/rollout_probs_diff_mean"] for x in d),
            "step_s_median": statistics.median(x["timing_s/step"] for x in d[1:]),
        })
    warm = {m: json.loads((tmp / "models" / m / "warmstart.json").read_text())["greedy_solve_rate"]
            for m in cfg["models"]}
    return {"jobs": jobs, "wall_s": round(wall, 1), "warmstart_wall_s": round(t_warm, 1), "goal_wall_s": 600,
            "meets_goal": wall <= 600, "warmstart_greedy_solve_rate": warm, "cells": summary,
            "process_s": {k: round(v, 1) for k, v in timings.items()}, "machine": describe(), "workdir": str(tmp)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step")
    s.add_argument("--models", default="qwen2-s", help="comma-separated models of experiments/tiny.yaml")
    s.add_argument("--ablation", default="none")
    s.add_argument("--steps", type=int, default=10)
    s.add_argument("--engine", default="vllm", choices=("vllm", "local"))
    g = sub.add_parser("grid")
    g.add_argument("--jobs", type=int, default=2)
    g.add_argument("--steps", type=int, help="override the config's steps")
    args = p.parse_args()
    if args.what == "step":
        result = bench_step(args.models.split(","), args.steps, args.ablation, args.engine)
        name = f"localrl_step-{args.engine}"
    else:
        result, name = bench_grid(args.jobs, args.steps), "localrl_grid"
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
