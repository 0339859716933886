"""Training cost of each treatment, side by side in one process (a measurement, not a test).

Per warm-started model of a grid: one RL batch as the grid draws it, sampled once by the stock BF16
engine, then one trainer per ablation, each with its own old log-probs (and rollout correction) on that
batch. Timed after WARMUP passes: `update` (one PPO epoch over the batch) and `log_prob` (the old-log-prob
pass). Each of --rounds rounds runs every ablation once in a seeded random order; a ratio is the median
over rounds of (time / stock's time in the same round), so a slow moment of the machine hits every
ablation of a round alike. Peak memory: one untimed update. Setup and command: studies/treatments/page.md.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import patches
from localrl import Trainer, correct_rollout
from rla import files
from rla.config import load_all, rl_settings
from rla.machine import describe
from rla.names import regions_of
from studies._shared.settings import log
from studies._shared.batches import sample_batches

CONFIGS = ("experiments/tiny.yaml", "experiments/treatments.yaml")
WARMUP = 2


def peak_bytes(run) -> int:
    """The most bytes held through torch's CPU allocator while `run()` runs, above the level at its start."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    return max(itertools.accumulate((nbytes for _, nbytes in events), initial=0))


def bench_model(cfg: dict, model: str, results: Path, rounds: int, log) -> dict:
    ablations = cfg["ablations"]
    rl = rl_settings(cfg, "local", model)
    model_dir, data_dir = results / "models" / model, results / "data"
    # one batch as `rl_step` draws it (the gradient probe's first batch at seed 0), sampled by the stock engine
    with Trainer(str(model_dir), rl, "none") as stock:
        _, [sample] = sample_batches(stock, model_dir, data_dir, 1, rl, rl["temperature"], rl["max_response_length"], 0)
    stock_batch, scores, groups = sample.batch, sample.scores, sample.groups
    trainers, batches, first = {}, {}, {}
    for ablation in ablations:
        trainer = Trainer(str(model_dir), rl, ablation)
        batch = copy.copy(stock_batch)
        batch.old_log_probs, _ = trainer.compute_log_probs(batch)
        if trainer.correction is not None:
            correct_rollout(batch, trainer.correction)
        batch.advantages = trainer.grpo_advantages(scores, batch.kept_mask(), groups)
        start = time.perf_counter()
        trainer.update(batch)
        first[ablation] = time.perf_counter() - start
        for _ in range(WARMUP - 1):
            trainer.update(batch)
            trainer.compute_log_probs(batch)
        trainers[ablation], batches[ablation] = trainer, batch
        log(f"{model} {ablation}: first update {first[ablation]:.2f} s")

    def run(ablation: str, what: str) -> float:
        patches.apply(regions_of(ablation))  # process-wide: each ablation's own regions while it runs
        trainer, batch = trainers[ablation], batches[ablation]
        start = time.perf_counter()
        trainer.update(batch) if what == "update" else trainer.compute_log_probs(batch)
        return time.perf_counter() - start

    times = {a: {"update": [], "log_prob": []} for a in ablations}
    order = random.Random(0)
    for r in range(rounds):
        for ablation in order.sample(ablations, len(ablations)):
            for what in ("update", "log_prob"):
                times[ablation][what].append(run(ablation, what))
        log(f"{model} round {r + 1}/{rounds}: update " + " ".join(
            f"{a} {times[a]['update'][-1] * 1e3:.0f}ms" for a in ablations))
    peaks = {}
    for ablation in ablations:
        patches.apply(regions_of(ablation))
        peaks[ablation] = peak_bytes(lambda: trainers[ablation].update(batches[ablation]))
    patches.remove()

    out = {"responses": int(stock_batch.responses.shape[0]), "response_tokens": int(stock_batch.response_mask.sum()),
           "ablations": {}}
    for ablation in ablations:
        row = {"first_update_s": round(first[ablation], 4), "update_peak_bytes": peaks[ablation],
               "update_peak_vs_none": round(peaks[ablation] / peaks["none"], 4)}
        for what in ("update", "log_prob"):
            r = [t / s for t, s in zip(times[ablation][what], times["none"][what])]  # to stock's in the same round
            row[f"{what}_s_median"] = round(statistics.median(times[ablation][what]), 5)
            row[f"{what}_vs_none_median"] = round(statistics.median(r), 4)
            row[f"{what}_vs_none_range"] = [round(min(r), 4), round(max(r), 4)]
            row[f"{what}_s_rounds"] = [round(t, 5) for t in times[ablation][what]]
        out["ablations"][ablation] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies run treatments", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results/treatments", help="a grid's results dir (models, data)")
    parser.add_argument("--config", nargs="+", default=list(CONFIGS),
                        help="its experiment configs, later ones laid over earlier ones as Snakemake does (rl, ablations)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    cfg = load_all(args.config)
    results = Path(args.results)
    missing = [m for m in cfg["models"] if not (results / "models" / m / "model.safetensors").exists()]
    if missing:
        print(f"error: no warm-started model for {missing} under {results / 'models'}: run the grid first "
              f"(snakemake ... --config profile={results.name})", file=sys.stderr)
        return 2
    report = {"command": "python -m studies run treatments " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "machine": {**describe(), "threads": torch.get_num_threads()},
              "rounds": args.rounds, "warmup": WARMUP, "models": {}}
    for model in cfg["models"]:
        report["models"][model] = bench_model(cfg, model, results, args.rounds, log)
    out = files.write_text(args.out, json.dumps(report, indent=1) + "\n")
    log(f"wrote {out}")
    return 0
