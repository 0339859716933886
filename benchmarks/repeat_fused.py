"""Whether compiled kernels give the same last bits from one process to the next: check_fused.py run
--runs times per mode, each in a fresh process with empty Inductor and Triton caches (so each compiles, and
on a GPU autotunes, anew), in Inductor's default mode and with TORCHINDUCTOR_DETERMINISTIC=1 (Inductor then
skips the on-device benchmarking it knows can change numerics). Per mode, model, region and side (the
engine's formulation, the fused aligned region, the eager one): how many distinct outputs the runs gave,
by a hash of each output's bytes. One distinct output is bit-equal runs.

    python3 benchmarks/repeat_fused.py --device cuda --out $OUT/repeat.json
    .venv/bin/python benchmarks/repeat_fused.py --device cpu --quick --out /tmp/repeat.json   # a dry run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {"default": "0", "deterministic": "1"}  # the value of TORCHINDUCTOR_DETERMINISTIC
SIDES = ("engine", "fused", "eager")


def one_run(mode: str, device: str, regions: str, quick: bool) -> dict:
    """check_fused.py in a fresh process with empty compile caches; its output digests per model/region."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "TRITON_CACHE_DIR": f"{tmp}/triton",
               "TORCHINDUCTOR_DETERMINISTIC": MODES[mode]}
        out = Path(tmp) / "fused.json"
        cmd = [sys.executable, str(ROOT / "benchmarks/check_fused.py"), "--device", device, "--regions", regions,
               "--out", str(out), *(["--quick"] if quick else [])]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if not out.exists():  # exit 1 with a report is a verdict, not a failure to run
            raise RuntimeError(f"check_fused.py gave no report (exit {done.returncode}): {done.stderr[-2000:]}")
        report = json.loads(out.read_text())
    if report["inductor_deterministic"] != (mode == "deterministic"):
        raise RuntimeError(f"mode {mode}: Inductor's deterministic flag was {report['inductor_deterministic']}")
    return {f"{r['model']}/{r['region']}": r["digests"] for r in report["rows"]}


def distinct(runs: list[dict]) -> list[dict]:
    """Per mode, model/region, side and output: runs and distinct digests among them."""
    rows = []
    for mode in MODES:
        mine = [r["digests"] for r in runs if r["mode"] == mode]
        for key in (mine[0] if mine else {}):
            model, region = key.split("/")
            for side in SIDES:
                for output, _ in enumerate(mine[0][key][side]):
                    seen = {d[key][side][output] for d in mine}
                    rows.append({"mode": mode, "model": model, "region": region, "side": side, "output": output,
                                 "runs": len(mine), "distinct": len(seen)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--runs", type=int, default=2, help="processes per mode (default %(default)s)")
    p.add_argument("--regions", default="qk_norm_rope,add_rmsnorm", help="check_fused.py's --regions")
    p.add_argument("--quick", action="store_true", help="check_fused.py's small shape: a dry run")
    p.add_argument("--out", type=Path, required=True, help="the JSON to write (rewritten after every run)")
    args = p.parse_args(argv)
    if args.runs < 2:
        p.error(f"--runs {args.runs}: a repeat needs at least 2")
    report = {"device": args.device, "regions": args.regions.split(","), "runs": []}
    start = time.perf_counter()
    for index in range(args.runs):
        for mode in MODES:  # alternated, so that a drift in the machine falls on both modes
            digests = one_run(mode, args.device, args.regions, args.quick)
            report["runs"].append({"mode": mode, "index": index, "digests": digests})
            report["distinct"] = distinct(report["runs"])
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1))
            print(f"[{time.perf_counter() - start:4.0f} s] {mode} run {index + 1} of {args.runs}", flush=True)
    for row in report["distinct"]:
        print(f"  {row['mode']:13s} {row['model']}/{row['region']} {row['side']}[{row['output']}]: "
              f"{row['distinct']} distinct of {row['runs']} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
