"""Time ``python -m analysis plots`` (load + stability + every figure) on a full-size synthetic grid.

Default size: 4 models x 3 ablations x 3 seeds = 36 runs, 1000 steps, 50 metrics per step, the
command pinned to 2 CPU cores. Target: <= 20 s. Writes benchmarks/results/figures.json.

    .venv/bin/python benchmarks/bench_figures.py [--steps 1000 --metrics 50 --seeds 3 --repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rla.machine import cpu_model  # noqa: E402

from rla.files import write_text  # noqa: E402
from analysis.synthetic import write_grid  # noqa: E402

STAGES = re.compile(r"total [\d.]+ s \((.*)\)")


def pin_to(cores: int):
    """A preexec function that restricts the child to the first ``cores`` CPUs we may use."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

    def pin() -> None:
        if allowed:
            os.sched_setaffinity(0, allowed[:cores])

    return pin


def run_once(runs: Path, out: Path, config: Path, cores: int) -> tuple[float, float, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": str(cores), "MPLBACKEND": "Agg"}
    command = [sys.executable, "-m", "analysis", "plots", "--runs", str(runs), "--config", str(config),
               "--out", str(out / "figures"), "--tables", str(out / "tables")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          preexec_fn=pin_to(cores))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"plots failed ({done.returncode}):\n{done.stderr[-3000:]}")
    stages = {}
    match = STAGES.search(done.stderr)
    if match:
        for part in match.group(1).split(", "):
            name, seconds, _ = part.split(" ")
            stages[name] = float(seconds)
    return wall, cpu, stages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--ablations", default="none,rope,all")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--metrics", type=int, default=50)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--budget", type=float, default=20.0, help="target seconds")
    parser.add_argument("--config", default=str(ROOT / "experiments" / "tiny.yaml"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "figures.json"))
    args = parser.parse_args(argv)

    models = [f"model{i}" for i in range(args.models)]
    ablations = args.ablations.split(",")
    with tempfile.TemporaryDirectory(prefix="bench_figures.") as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        files = write_grid(tmp / "runs", models, ablations, list(range(args.seeds)), args.steps, args.metrics)
        size_mb = sum(f.stat().st_size for f in files) / 2**20
        print(f"generated {len(files)} runs ({size_mb:.0f} MiB) in {time.perf_counter() - start:.1f} s",
              file=sys.stderr)
        walls, cpus, stages = [], [], {}
        for i in range(args.repeat):
            wall, cpu, stages = run_once(tmp / "runs", tmp / f"out{i}", Path(args.config), args.cores)
            walls.append(round(wall, 2))
            cpus.append(round(cpu, 2))
            print(f"run {i + 1}/{args.repeat}: {wall:.2f} s wall, {cpu:.2f} s CPU  {stages}", file=sys.stderr)
        figures = sorted(p.name for p in (tmp / "out0" / "figures").iterdir())

    import matplotlib
    import pandas
    import seaborn

    result = {
        "benchmark": "python -m analysis plots (load + stability + figures + summary), cold process",
        "runs": len(files), "models": args.models, "ablations": ablations, "seeds": args.seeds,
        "steps": args.steps, "metrics_per_step": args.metrics, "log_size_mib": round(size_mb, 1),
        "cores": args.cores, "wall_s": walls, "best_wall_s": min(walls), "cpu_s": cpus,
        "load_average_1min_after": round(os.getloadavg()[0], 2),
        "stages_s_last_run": stages, "budget_s": args.budget, "within_budget": min(walls) <= args.budget,
        "figures": figures,
        "python": platform.python_version(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
        "pandas": pandas.__version__, "matplotlib": matplotlib.__version__, "seaborn": seaborn.__version__,
    }
    write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
