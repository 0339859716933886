"""Benchmarks of the local backend (measurements, not tests).

    python benchmarks/bench_localrl.py step [--model qwen2-s] [--steps 10]
        one RL step (rollout + old log-probs + update + weight sync), median over steps
    python benchmarks/bench_localrl.py grid [--jobs 2] [--steps N]
        the whole default grid from scratch (data, warm starts, every cell) in a temporary
        results dir, cells run `--jobs` at a time with one thread each; wall time and per-cell
        scores / k3 KL

Results go to benchmarks/results/localrl_{step,grid}.json.
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
from benchmarks.machine import describe  # noqa: E402
CONFIG = ROOT / "experiments" / "tiny.yaml"
RESULTS = ROOT / "benchmarks" / "results"


def bench_step(model: str, steps: int, ablation: str) -> dict:
    import numpy as np
    import torch

    from localrl.config import resolve_cell
    from rla.config import load as load_config
    from localrl.data import write_splits
    from localrl.engine.engine import Engine
    from localrl.run import PromptSampler
    from localrl.task import TaskSettings, render_prompt, score
    from localrl.tokenizer import build_tokenizer
    from localrl.trainer import Batch, Trainer
    from localrl.warmstart import warmstart

    torch.set_num_threads(1)
    cfg = load_config(CONFIG)
    cell = resolve_cell(cfg, model, ablation, 0, steps)
    rl = cell["rl"]
    tmp = Path(tempfile.mkdtemp(prefix="bench_localrl_"))
    write_splits(TaskSettings.from_config(cfg["task"]), tmp / "data")
    warmstart(cfg, model, tmp / "data", tmp / "model")  # a realistic policy: realistic response lengths
    from localrl.data import load_split

    tok = build_tokenizer()
    train = load_split(tmp / "data", "train")
    prompts = [tok(render_prompt(list(p)))["input_ids"] for p in train["prompt"]]
    truths = [r["ground_truth"] for r in train["reward_model"]]
    trainer = Trainer(str(tmp / "model"), rl, ablation)
    engine = Engine(trainer.master.config, tok.eos_token_id, tok.pad_token_id)
    engine.load_weights(trainer.weights_for_engine())
    sampler, gen = PromptSampler(len(prompts), torch.Generator().manual_seed(0)), torch.Generator().manual_seed(1)
    n, G = rl["prompts_per_step"], rl["samples_per_prompt"]
    times = {"gen": [], "old_log_prob": [], "update": [], "step": []}
    for i in range(steps + 2):  # the first two include compilation
        t0 = time.perf_counter()
        idx = sampler.take(n)
        out = engine.generate([prompts[j] for j in idx for _ in range(G)], rl["max_new_tokens"],
                              rl["temperature"], gen)
        t1 = time.perf_counter()
        texts = [tok.decode(r[m].tolist(), skip_special_tokens=True) for r, m in zip(out.responses, out.response_mask)]
        scores = torch.tensor([score(t, truths[j]) for t, j in zip(texts, np.repeat(idx, G))])
        batch = Batch(out.prompt_ids, out.prompt_mask, out.responses, out.response_mask, rollout_log_probs=out.logprobs)
        batch.old_log_probs, _ = trainer.compute_log_probs(batch)
        batch.advantages = trainer.grpo_advantages(scores, out.response_mask, np.repeat(np.arange(n), G))
        t2 = time.perf_counter()
        trainer.update(batch)
        engine.load_weights(trainer.weights_for_engine())
        t3 = time.perf_counter()
        if i >= 2:
            for k, v in (("gen", t1 - t0), ("old_log_prob", t2 - t1), ("update", t3 - t2), ("step", t3 - t0)):
                times[k].append(v)
    result = {"model": model, "ablation": ablation, "responses_per_step": n * G,
              "max_new_tokens": rl["max_new_tokens"], "steps_timed": steps,
              "median_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
              "goal_step_s": 0.5, "machine": describe()}
    result["meets_goal"] = result["median_s"]["step"] <= 0.5
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
    s.add_argument("--model", default="qwen2-s")
    s.add_argument("--ablation", default="none")
    s.add_argument("--steps", type=int, default=10)
    g = sub.add_parser("grid")
    g.add_argument("--jobs", type=int, default=2)
    g.add_argument("--steps", type=int, help="override the config's steps")
    args = p.parse_args()
    result = bench_step(args.model, args.steps, args.ablation) if args.what == "step" else bench_grid(args.jobs, args.steps)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"localrl_{args.what}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
