"""Whether a short model step gives the same bits when rerun in a fresh process at the same seeds: the
sampled responses, the engine's sampling and prefill logprobs, and the training side's logprobs (stock and
`all` fused), compared by digest. Twice with Inductor's defaults and twice with its autotuning off (no
pointwise/reduction config benchmarking, no max-autotune, no coordinate descent, deterministic mode where
this torch has it); each process with its own empty Inductor and Triton caches, so each compiles (and
autotunes) anew.

The step: the R1-Distill-Qwen-1.5B widths at 4 decoder layers (compilation, not depth, is what a rerun
could change), random weights, 4 sequences of 16 + 48 tokens.

    python3 -m studies.gpu_check.check_determinism --device cuda --out determinism.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from rla.digest import tensor_digest
from studies.gpu_check import testbed
from studies.gpu_check.check_common import Report, step_args
from studies._shared.random_models import cast_pair, gpu_point
from studies._shared.shapes import PAPER_SHAPES, QUICK_SHAPES
from studies._shared.sides import strict_recompiles

ROOT = Path(__file__).resolve().parents[2]  # the children run from the repository root

MODEL = "r1-distill-qwen-1.5b"
LAYERS = 4
LENGTHS = dict(n_seq=4, prompt_len=16, response_len=48)
QUICK_LENGTHS = dict(n_seq=2, prompt_len=8, response_len=8)
RUNS = ("default 1", "default 2", "autotuning off 1", "autotuning off 2")
# (what it asks, one run, the other), each compared as soon as both ran: the rerun first (a step stopped at
# its time limit keeps the answers it has)
PAIRS = (("default: rerun in a fresh process", "default 1", "default 2"),
         ("default against autotuning off", "default 1", "autotuning off 1"),
         ("autotuning off: rerun in a fresh process", "autotuning off 1", "autotuning off 2"))
CHILD_LIMIT_S = 240


def autotuning_off() -> dict:
    """Inductor's autotuning switched off in this process; returns each setting changed (those this
    torch has)."""
    config = torch._inductor.config
    wanted = {"max_autotune": False, "max_autotune_pointwise": False, "max_autotune_gemm": False,
              "coordinate_descent_tuning": False, "benchmark_epilogue_fusion": False, "deterministic": True,
              "triton.autotune_pointwise": False}
    applied = {}
    for name, value in wanted.items():
        owner, _, attr = name.rpartition(".")
        target = getattr(config, owner) if owner else config
        if hasattr(target, attr):
            setattr(target, attr, value)
            applied[name] = value
    return applied


def model_step(device: torch.device, quick: bool) -> dict:
    """One short step's digests: sample, the engine's prefill, the training side stock and `all` fused."""
    name, shape = next(iter(QUICK_SHAPES.items())) if quick else (MODEL, replace(PAPER_SHAPES[MODEL], layers=LAYERS))
    point = gpu_point(name, shape, **(QUICK_LENGTHS if quick else LENGTHS))
    train, engine = cast_pair(point, device)
    layout = testbed.sampled(engine, point)
    refs, _ = testbed.references(engine, layout)
    digests = {"responses": tensor_digest(layout.ids), "engine_sampling": tensor_digest(layout.sampling),
               "engine_forward": tensor_digest(refs["engine_forward"])}
    for regions, impl in (("none", "eager"), ("all", "fused")):
        digests[f"train_{regions}"] = tensor_digest(testbed.aligned_logprobs(train, layout, regions, impl))
    return {"model": name, "layers": shape.layers, "hidden": shape.hidden, **digests}


def child(args, device: torch.device) -> int:
    applied = autotuning_off() if args.autotuning_off else {}
    strict_recompiles()
    start = time.perf_counter()
    result = {"inductor_settings": applied, **model_step(device, args.quick),
              "seconds": round(time.perf_counter() - start, 1)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def run_child(device: str, quick: bool, off: bool, work: Path, label: str) -> dict:
    """One fresh process with empty compile caches (--quick: one cache for every run, as a dry run
    compiling four times would take minutes on a CPU); its digests, or why it gave none."""
    caches = work / "caches" if quick else Path(tempfile.mkdtemp(prefix="caches-", dir=work))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
           "TRITON_CACHE_DIR": str(caches / "triton")}
    out = work / f"{label.replace(' ', '-')}.json"
    cmd = [sys.executable, "-m", __spec__.name, "--child", "--device", device, "--out", str(out),
           *(["--quick"] if quick else []), *(["--autotuning-off"] if off else [])]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_LIMIT_S)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return {"run": label, "failed": f"exit status {done.returncode}: {' | '.join(tail)}"}
    return {"run": label, **json.loads(out.read_text())}


DIGESTS = ("responses", "engine_sampling", "engine_forward", "train_none", "train_all")


def compare(a: dict, b: dict, pair: str) -> dict:
    if "failed" in a or "failed" in b:
        return {"pair": pair, "skipped": "a run failed: " + (a.get("failed") or b.get("failed"))}
    equal = {d: a[d] == b[d] for d in DIGESTS}
    return {"pair": pair, "runs": [a["run"], b["run"]], **equal, "all_equal": all(equal.values())}


def main(argv=None) -> int:
    args, device = step_args(__doc__, argv, "--child", "--autotuning-off")  # --child: one run, in a fresh process
    if args.child:
        return child(args, device)
    report = Report(args, "determinism", device, ("runs", "comparisons"),
                    lengths=QUICK_LENGTHS if args.quick else LENGTHS,
                    caches="one Inductor and Triton cache for every run (--quick)" if args.quick
                    else "an empty Inductor and Triton cache per process")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in RUNS:
            runs[label] = run_child(args.device, args.quick, label.startswith("autotuning off"), Path(tmp), label)
            report.parts["runs"].append(runs[label])
            print(f"{label}: {runs[label].get('failed') or {d: runs[label][d] for d in DIGESTS}}", flush=True)
            report.extend("comparisons", [compare(runs[a], runs[b], pair) for pair, a, b in PAIRS
                                          if label in (a, b) and a in runs and b in runs])
    for c in report.parts["comparisons"]:
        print(f"{c['pair']}: {c.get('skipped') or ('bit-equal' if c['all_equal'] else 'DIFFERS')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
