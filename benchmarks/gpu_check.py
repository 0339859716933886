"""The GPU check in one call: what the alignment does on a GPU, measured with the machine's own Python
(torch with Triton, transformers; no vLLM, verl, ray or orjson) within a time budget, returned as one
summary, each step's JSON and one archive.

Steps, in this order, so that the first minutes give the most:
  fused         check_fused.py: the fused region kernels and eager-aligned against the engine's
                formulations compiled by Inductor (Triton), forward and backward, Qwen2.5-7B / Qwen3-8B
                shapes: share of elements differing, max ulp, verdict, per region
  model         studies/scaling/check_model.py: target `vllm` against the local engine compiled to Triton (vLLM's
                layout, native formulas and split at attention), at the paper models' shapes, full depth,
                both sides on one attention kernel: k3, mean |d logprob|, bit-equal share per setting;
                and the rounding map of those Triton graphs (studies.roundmap.measure) against the `vllm` table
  epilogue      check_epilogue.py: whether Inductor keeps Qwen2's q/k/v bias inside the GEMM (the pass
                that could move it runs for GPUs only: skipped on a CPU)
  cuda-tests    the suite's `cuda`-marked tests (one attention kernel for both sides, the RoPE table
                built on the GPU, `all` against the Triton engine), skipped on every CPU
  regions       bench_regions.py: time and activation memory per region and per decoder layer, stock /
                aligned eager / aligned fused / Liger (where its wheel is installed), against a copy
The second check (`--steps preflight,gemm,long,kernels,determinism,cost`, one call of at most 9 minutes of
command time), each step `python -m studies.gpu_check.check_<step>` (its folder's check_<step>.py), with its
planned GPU time, which is also its limit there (SECOND_BUDGET_S in all):
  preflight      20 s  check_preflight.py: versions, the SDPA backends that run, cuBLAS's reduced-precision
                       BF16 reduction flag, whether Inductor keeps an explicit BF16 cast in a compiled norm
                       (estimate: one small compile)
  gemm           30 s  check_gemm.py: a row's GEMM bits against the row count (1 to 8,192 rows) and merged
                       q/k/v, gate/up against separate projections, reduced-precision reduction on and off,
                       1.5B and 8B shapes (estimate: a few hundred GEMMs, no compilation)
  long          190 s  check_long.py: R1-Distill-Qwen-1.5B shape, 4 x 4,096 engine-sampled tokens; none /
                       rope / all fused, FP16 stock against an FP16 engine; k3 by position bin, the engine's
                       entropy; matched and sharper logit scale (estimate: four 4,064-step decode loops of a
                       28-layer model, ~30 s each, and compilation)
  kernels       100 s  check_kernels.py: training side on SDPA flash against the engine's efficient kernel,
                       1.5B and 8B shapes, 8 x 160 tokens (from 26b9ccb: `model`, the same work at 7B and 8B
                       with five settings, took 93 s)
  determinism   100 s  check_determinism.py: a short model step (1.5B widths, 4 layers) in four fresh
                       processes with empty compile caches, digests compared, autotuning on and off (from
                       26b9ccb: `model` built, compiled and sampled one 36-layer model in ~45 s; a 4-layer
                       one compiles the same pieces: ~25 s a process, an estimate)
  cost          100 s  check_cost.py: whole-model forward + backward, 8,192 tokens, gradient checkpointing,
                       stock / all fused / all eager / Liger, 1.5B and 8B (from 26b9ccb: `regions` timed
                       single layers and regions in 209 s; a whole-model step of 8B is ~1 s: an estimate)
Each step runs in its own process under its own time limit on a GPU, cut to what is left of --budget-s (a CPU
dry run has the budget alone). A step that cannot run (a package missing, no GPU), fails or runs out of
time is in the summary with the reason.
Written to --out (default: $OUT, else benchmarks/results/gpu-check), rewritten after every step (what a
call cut short returns is what had finished, and on SIGTERM the running step's part): gpu-check-<tag>.md,
the summary (every step asked for, with its values or why it has none); <step>.json for the first six steps
that ran; gpu-check-<tag>.tar.gz, every step's JSON and log, the environment and the summary as JSON: at
most 8 files, all directly in --out. The archive unpacked into studies/gpu_check/runs/<machine>-<commit>/ is what
`snakemake --cores 2 gpu_check` makes its tables of.

    python3 benchmarks/gpu_check.py                                   # on the GPU machine (gpu_check.sh)
    python3 benchmarks/gpu_check.py --steps preflight,gemm,long,kernels,determinism,cost   # the second check
    .venv/bin/python benchmarks/gpu_check.py --device cpu --quick     # a dry run on a CPU
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The whole check on one H200, compilation included. Measured there (studies/gpu_check/runs/h200-26b9ccb):
# fused 75 s, model 93 s, epilogue 26 s, cuda-tests 46 s, regions 209 s (454 s in all, the machine's start
# not counted). A 15-minute lease holds one full run and a rerun of the steps that need it (--steps).
BUDGET_S = 480
SECOND_BUDGET_S = 540  # the second check: its steps' planned times above, one call's 9 minutes
MAX_FILES = 8  # what one call returns at most: the summary, the archive, and this many less two step JSONs
CPU_BUDGET_S = 1800  # a dry run's time depends on the CPU and its load; the per-step limits are the GPU's
ABSENT_OK = ("vllm", "verl", "ray", "orjson", "snakemake")  # reported, never needed


@dataclass(frozen=True)
class Run:
    device: str
    quick: bool
    work: Path
    python: str

    @property
    def tag(self) -> str:
        return ("gpu" if self.device == "cuda" else "cpu") + ("-quick" if self.quick else "")

    def json(self, step: str) -> Path:
        return self.work / f"{step}.json"


Rows = dict[str, str]  # measurement -> its value, or why it has none


@dataclass(frozen=True)
class Step:
    name: str
    needs: tuple[str, ...]  # modules the step imports
    limit_s: int            # its own time limit on a GPU (within what is left of the budget)
    argv: Callable[[Run], list[str]]
    read: Callable[[dict, Run], Rows]  # its JSON -> rows
    cuda_only: str = ""     # why it measures nothing on a CPU, if it does not

    def needs_here(self, run: Run) -> tuple[str, ...]:
        return self.needs + (("triton",) if run.device == "cuda" else ())


# ---- what each step's JSON says -------------------------------------------------------------------

def _cmp(rows: list[dict]) -> str:
    return ", ".join(c["verdict"] + ("" if c["verdict"] == "bit-equal" else
                                     f" ({c['differing']} of {c['of']}, max {c['max_ulp']} ulp, "
                                     f"{c.get('max_row_ulp', float('nan')):.2g} ulp at its row's scale)") for c in rows)


def read_fused(report: dict, run: Run) -> Rows:
    return {f"{r['model']}/{r['region']}": ("ok" if r["passed"] else "FAIL") + f": fused {_cmp(r['fused_vs_engine'])}; "
            f"eager {_cmp(r['eager_vs_engine'])}; stock {_cmp(r['stock_vs_engine'])}; "
            f"fused-eager grads {_cmp(r['fused_vs_eager_grads'])}" for r in report["rows"]}


def read_model(report: dict, run: Run) -> Rows:
    rows = {}
    for r in report["rows"]:
        key = f"{r['model']} (L{r['layers']})/{r['regions']}/{r['impl']}"
        text = f"k3 {r['k3']:.3g}, |d| {r['mean_abs_dlogprob']:.3g}, bit-equal {r['bit_equal']:.1%}"
        rows[key] = rows.get(key, "") + ("" if r["reference"] == "engine_forward" else "; sampling: ") + text
        rows["attention (both sides)"] = r["attention"]
    for m in report["roundmaps"]:
        differ = [v for v, x in m["values"].items() if x["stored"] != x["target"]]
        rows[f"{m['model']}/rounding map of the engine's {m['graphs']} graphs"] = (
            f"as target `{report['target']}`" if not differ else f"DIFFERS from `{report['target']}` at {', '.join(differ)}")
    return rows


def read_epilogue(report: dict, run: Run) -> Rows:
    return {"qkv bias in vLLM's graph": report["vllm_graph"]["bias"]}


def read_cuda_tests(report: dict, run: Run) -> Rows:
    return {test["nodeid"]: test["outcome"] + (f": {test['message']}" if test.get("message") else "")
            for test in report["tests"]}


def read_regions(report: dict, run: Run) -> Rows:
    rows = {"copy bandwidth": f"{report['copy_GBps']:.0f} GB/s"}
    for r in report["rows"]:
        text = f"{r['time_ms']:.3f} ms ({r.get('time_x_stock', float('nan')):.2f}x stock), saved " \
               f"{r['saved_bytes'] / 2**20:.1f} MiB ({r.get('saved_x_stock', float('nan')):.2f}x)"
        if "peak_bytes" in r:
            text += f", peak {r['peak_bytes'] / 2**20:.1f} MiB ({r.get('peak_x_stock', float('nan')):.2f}x)"
        if "GBps" in r:
            text += f", {100 * r['GBps'] / report['copy_GBps']:.0f}% of copy"
        if "device_ms" in r:
            text += f", GPU busy {r['device_ms']:.3f} ms in {r['device_ops']:.0f} device ops"
        rows[f"{r['model']}/{r['arch']}/{r['case']}/{r['impl']}"] = text
    if not report["environment"].get("liger_kernel"):
        why = "liger_kernel not installed" if run.device == "cuda" else "Liger's kernels are Triton: CUDA only"
        rows["liger (every case)"] = f"skipped: {why}"
    return rows


def _parts(report: dict) -> dict:
    """A second-check step's parts, each measured or {"skipped": why}."""
    return report.get("parts", {})


def _skipped(value) -> str | None:
    return f"skipped: {value['skipped']}" if isinstance(value, dict) and "skipped" in value else None


def read_preflight(report: dict, run: Run) -> Rows:
    parts, rows = _parts(report), {}
    if v := parts.get("versions"):
        rows["versions"] = ", ".join(f"{k} {x}" for k, x in v.items() if x is not None)
    if b := parts.get("sdpa_backends"):
        rows["SDPA backends"] = "; ".join(f"{k}: {x}" for k, x in b.items())
    if r := parts.get("reduced_precision"):
        rows["allow_bf16_reduced_precision_reduction"] = f"{r['allow_bf16_reduced_precision_reduction']} " \
                                                         f"(applies to {r['applies']})"
    if n := parts.get("norm_cast"):
        c = n["compiled_vs_eager"]
        rows[f"compiled norm {n['expression']}"] = _skipped(n) or (
            f"Inductor {n['verdict']}: {c['differing']} of {c['of']} elements differ from eager "
            f"(emulate_precision_casts {n['emulate_precision_casts']})")
    return rows


def _first_moved(rows: list[dict]) -> str:
    moved = sorted(r["rows"] for r in rows if not r["bit_equal"])
    return "bit-equal at every row count" if not moved else f"differs from 1 row's at {moved[0]} rows " \
        f"(at {len(moved)} of {len(rows)} row counts)"


def read_gemm(report: dict, run: Run) -> Rows:
    parts, rows = _parts(report), {}
    invariance = parts.get("row_invariance", [])
    for key in dict.fromkeys((r["model"], r["projection"], r["reduced_precision"]) for r in invariance):
        found = [r for r in invariance if (r["model"], r["projection"], r["reduced_precision"]) == key]
        most = max(r["rows"] for r in found)
        rows[f"{key[0]}/{key[1]}/rows 1-{most}/reduced precision {key[2]}"] = _first_moved(found)
    merged = parts.get("merged_vs_separate", [])
    for key in dict.fromkeys((r["model"], r["group"], r["rows"], r["reduced_precision"]) for r in merged):
        found = [r for r in merged if (r["model"], r["group"], r["rows"], r["reduced_precision"]) == key]
        rows[f"{key[0]}/merged {key[1]} vs separate/{key[2]} rows/reduced precision {key[3]}"] = ", ".join(
            f"{r['projection']} " + ("bit-equal" if r["bit_equal"] else f"{r['differing']} of {r['of']} differ")
            for r in found)
    return rows


def _k3(row: dict) -> str:
    return (f"k3 {row['engine_forward/k3']:.3g} (sampling {row['engine_sampling/k3']:.3g}), "
            f"|d| {row['engine_forward/mean_abs_dlogprob']:.3g}, bit-equal {row['engine_forward/bit_equal']:.1%}")


def read_long(report: dict, run: Run) -> Rows:
    parts, rows = _parts(report), {}
    bins = parts.get("by_position", [])
    for r in parts.get("rows", []):
        key = (r["scale"], r["dtype"], r["regions"], r["impl"])
        mine = [b for b in bins if (b["scale"], b["dtype"], b["regions"], b["impl"]) == key]
        ends = "" if len(mine) < 2 else (
            f"; by position: {mine[0]['position_low']}-{mine[0]['position_high']} k3 {mine[0]['engine_forward/k3']:.3g}"
            f" (sampling {mine[0]['engine_sampling/k3']:.3g}), {mine[-1]['position_low']}-{mine[-1]['position_high']}"
            f" k3 {mine[-1]['engine_forward/k3']:.3g} (sampling {mine[-1]['engine_sampling/k3']:.3g})")
        rows[f"{r['model']}/{r['scale']} scale/{r['dtype']}/{r['regions']}/{r['impl']}"] = (
            f"{_k3(r)}, engine entropy {r['entropy_engine']:.3g} nats{ends}")
    return rows


def read_kernels(report: dict, run: Run) -> Rows:
    parts = _parts(report)
    rows = {f"kernel: {name}": text for name, text in report.get("kernels", {}).items()}
    for r in parts.get("rows", []):
        rows[f"{r['model']} (L{r['layers']})/train on {r['train_attention']}/{r['regions']}/{r['impl']}"] = _k3(r)
    return rows


def read_determinism(report: dict, run: Run) -> Rows:
    parts, rows = _parts(report), {}
    for r in parts.get("runs", []):
        if "failed" in r:
            rows[f"run {r['run']}"] = f"failed: {r['failed']}"
    for c in parts.get("comparisons", []):
        digests = [k for k, v in c.items() if isinstance(v, bool) and k != "all_equal"]
        rows[c["pair"]] = _skipped(c) or ("bit-equal: " + ", ".join(digests) if c["all_equal"] else
                                          "DIFFERS in " + ", ".join(d for d in digests if not c[d]))
    return rows


def read_cost(report: dict, run: Run) -> Rows:
    rows = {}
    for r in _parts(report).get("rows", []):
        key = f"{r['model']} (L{r['layers']}, {r['tokens']} tokens)/{r['impl']}"
        if "skipped" in r:
            rows[key] = f"skipped: {r['skipped']}"
            continue
        rows[key] = f"{r['step_s'] * 1e3:.0f} ms a step ({r['time_x_stock']:.2f}x stock), " + (
            f"peak {r['peak_bytes'] / 2**30:.2f} GiB ({r['peak_x_stock']:.2f}x)" if "peak_bytes" in r
            else f"peak memory {report.get('peak_memory', 'not measured')}")
    return rows


# A dry run (--quick) runs every step's code, on less: the paper's three regions (RoPE with Qwen3's
# q/k norm, SwiGLU, the residual add + RMSNorm) in `fused`, the decoder layers alone in `regions`.
QUICK_REGIONS = ("qk_norm_rope", "swiglu", "add_rmsnorm")


# The test modules holding `cuda`-marked tests (tests/test_gpu_check.py checks the list is complete):
# importable without vLLM, verl, ray or orjson, as the rest of the suite's tests are not.
CUDA_TESTS = ("tests/test_kernels.py", "tests/test_patches_regions.py", "tests/test_device.py")

def second_step(name: str, needs: tuple[str, ...], limit_s: int, read: Callable[[dict, Run], Rows]) -> Step:
    """A step of the second check: studies/gpu_check/check_<name>.py, run as a module from the repository root."""
    return Step(name, needs, limit_s, lambda r: ["-m", f"studies.gpu_check.check_{name}", "--device", r.device,
                                                 "--out", str(r.json(name)), *(["--quick"] if r.quick else [])], read)


STEPS = [
    Step("fused", ("torch", "transformers"), 80,
         lambda r: ["benchmarks/check_fused.py", "--device", r.device, "--out", str(r.json("fused")),
                    *(["--quick", "--regions", ",".join(QUICK_REGIONS)] if r.quick else [])],
         read_fused),
    Step("model", ("torch", "transformers", "pandas"), 140,
         lambda r: ["studies/scaling/check_model.py", "--device", r.device, *(["--quick"] if r.quick else []),
                    "--out", str(r.json("model"))],
         read_model),
    Step("epilogue", ("torch",), 60,
         lambda r: ["benchmarks/check_epilogue.py", "--device", r.device, "--out", str(r.json("epilogue"))],
         read_epilogue, cuda_only="Inductor's pass that could move the bias out of the GEMM runs for GPUs only"),
    Step("cuda-tests", ("torch", "transformers", "pytest", "yaml"), 60,
         lambda r: ["benchmarks/cuda_tests.py", "--out", str(r.json("cuda-tests")), *CUDA_TESTS],
         read_cuda_tests, cuda_only="they are skipped here, as in every CPU run of the suite"),
    Step("regions", ("torch", "transformers"), 240,
         lambda r: ["benchmarks/bench_regions.py", "--device", r.device, "--repeats", "3", "--out", str(r.json("regions")),
                    *(["--quick", "--cases", "decoder_layer", "--min-run-time", "0.05"] if r.quick
                      else ["--min-run-time", "0.1"])],
         read_regions),
    # the second check: each step's limit is its planned GPU time (the header)
    second_step("preflight", ("torch",), 20, read_preflight),
    second_step("gemm", ("torch", "transformers", "pandas"), 30, read_gemm),
    second_step("long", ("torch", "transformers", "pandas"), 190, read_long),
    second_step("kernels", ("torch", "transformers", "pandas"), 100, read_kernels),
    second_step("determinism", ("torch", "transformers", "pandas"), 100, read_determinism),
    second_step("cost", ("torch", "transformers"), 100, read_cost),
]
FIRST = ("fused", "model", "epilogue", "cuda-tests", "regions")
SECOND = ("preflight", "gemm", "long", "kernels", "determinism", "cost")


# ---- running --------------------------------------------------------------------------------------

def importable(name: str) -> bool:
    """Whether `name` imports (found is not enough: a broken install fails only when imported)."""
    try:
        importlib.import_module(name)
        return True
    except Exception:  # noqa: BLE001 - any failure to import is "cannot import", named in the summary
        return False


def cuda_here() -> bool:
    try:
        import torch  # here: a machine without torch gets a summary saying so
    except ImportError:
        return False
    return torch.cuda.is_available()


def environment(run: Run) -> dict:
    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "python": platform.python_version(),
           "machine": platform.machine(), "processor": platform.processor(), "cores": os.cpu_count(),
           "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
           "commit": os.environ.get("RLA_COMMIT") or _git_commit()}
    for name in ("torch", "triton", "transformers", "liger_kernel", "numpy", "pandas"):
        env[name] = _version(name)
    try:
        import torch  # here: a machine without torch gets a summary saying so

        env["cuda"] = torch.version.cuda
        env["device_name"] = torch.cuda.get_device_name() if run.device == "cuda" else platform.processor() or "cpu"
    except ImportError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,clocks.max.sm,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        env["nvidia_smi"] = out.stdout.strip()
    return env


def _version(name: str) -> str | None:
    try:
        return metadata.version(name.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown (no git)"
    except OSError:
        return "unknown (no git)"


def plan(run: Run) -> dict[str, str | None]:
    """step -> None (runs) or why it does not."""
    out = {}
    for step in STEPS:
        missing = [m for m in step.needs_here(run) if not importable(m)]
        if step.cuda_only and run.device != "cuda":
            out[step.name] = f"skipped on a CPU: {step.cuda_only}"
        else:
            out[step.name] = f"skipped: cannot import {', '.join(missing)}" if missing else None
    return out


def add_wheels(wheels: Path, run: Run) -> list[str]:
    """Install the wheels found in `wheels` (no dependencies: Liger-Kernel's is a few hundred kB and needs
    only torch and Triton) into the work folder, for every step; returns their file names."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if found:
        subprocess.run([run.python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(run.work / "site"), *map(str, found)], check=True, timeout=120)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(run.work / "site"), os.environ.get("PYTHONPATH")]))
        importlib.invalidate_caches()
        sys.path.insert(0, str(run.work / "site"))
    return [w.name for w in found]


class Ended(Exception):
    """SIGTERM: the call running the check is out of time (the machine's `timeout`)."""


def _end(signum, frame):
    raise Ended()


ENDED = "stopped: the call was ended (SIGTERM) while it ran"


def run_step(step: Step, run: Run, limit_s: float) -> tuple[str | None, float]:
    """Run one step, its output shown and logged; returns (None or why it gave no complete result, seconds)."""
    start = time.perf_counter()
    log = (run.work / f"{step.name}.log").open("w")
    cmd = [run.python, *step.argv(run)]
    log.write("$ " + " ".join(cmd) + "\n")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def tee():
        for line in proc.stdout:
            log.write(line)
            if "warn" not in line.lower():
                print(f"  {step.name}| {line}", end="", flush=True)

    reader = threading.Thread(target=tee, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=limit_s)
        problem = None if code == 0 else f"exit status {code} (see {step.name}.log)"
    except (subprocess.TimeoutExpired, Ended) as why:
        os.killpg(proc.pid, 9)  # its own session: the signal that ended this call did not reach it
        proc.wait()
        problem = ENDED if isinstance(why, Ended) else f"stopped at its time limit, {limit_s:.0f} s"
    reader.join(timeout=10)
    log.close()
    return problem, time.perf_counter() - start


def summarise(step: Step, run: Run, problem: str | None) -> Rows:
    path = run.json(step.name)
    rows = step.read(json.loads(path.read_text()), run) if path.exists() else {}
    if problem:
        rows[f"(rows not listed above)" if rows else "(every row)"] = f"not measured: {problem}"
    return rows


def publish(env: dict, results: dict[str, dict], run: Run, out: Path) -> tuple[Path, Path]:
    """The summary, the step JSONs (the first MAX_FILES - 2 that exist) and the archive of everything, into
    `out`, each replaced whole (an archive cut off mid-write is never what comes back)."""
    text = markdown(env, results, run)
    (run.work / "summary.json").write_text(json.dumps({"environment": env, "steps": results}, indent=1))
    (run.work / "summary.md").write_text(text)
    summary, archive = out / f"gpu-check-{run.tag}.md", out / f"gpu-check-{run.tag}.tar.gz"
    _replace(summary, lambda path: path.write_text(text))
    found = [run.json(name) for name in results if run.json(name).is_file()]
    for path in found[:MAX_FILES - 2]:
        _replace(out / path.name, lambda target, path=path: shutil.copyfile(path, target))

    def pack(target: Path) -> None:
        with tarfile.open(target, "w:gz") as tar:
            tar.add(run.work, arcname=run.work.name,  # not the installed wheels
                    filter=lambda info: None if info.name.startswith(f"{run.work.name}/site") else info)

    _replace(archive, pack)
    return summary, archive


def _replace(path: Path, write: Callable[[Path], object]) -> None:
    part = path.with_name(path.name + ".part")
    write(part)
    part.replace(path)


def markdown(env: dict, results: dict[str, dict], run: Run) -> str:
    lines = [f"# GPU check ({run.tag})", ""]
    lines += [f"- {k}: {v}" for k, v in env.items() if v is not None]
    lines += [f"- imported by no step: {', '.join(ABSENT_OK)}", ""]
    lines += ["| step | measurement | value |", "|---|---|---|"]
    for name, result in results.items():
        for key, value in result["rows"].items():
            lines.append(f"| {name} | {key} | {value} |")
    lines += ["", "| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {n} | {r['status']} | {r['seconds']:.0f} |" for n, r in results.items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny shapes: a dry run")
    p.add_argument("--budget-s", type=float, help=f"seconds for every step (default on a GPU: {BUDGET_S} for the first "
                   f"check's steps, {SECOND_BUDGET_S} for the second's alone, where each step also has its own limit; "
                   f"{CPU_BUDGET_S} for a CPU dry run, whose steps have none)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "benchmarks/results/gpu-check"))
    p.add_argument("--wheels", type=Path, default=ROOT / "benchmarks/wheels",
                   help="a folder of extra wheels to install for the steps, e.g. Liger-Kernel's (default: %(default)s)")
    p.add_argument("--steps", default=",".join(FIRST),
                   help=f"comma-separated steps to run, in their fixed order (default, the first check: %(default)s; "
                   f"the second: {','.join(SECOND)})")
    p.add_argument("--limit", action="append", default=[], metavar="STEP=SECONDS",
                   help="a step's own time limit on a GPU instead of its default; repeatable")
    args = p.parse_args(argv)
    names = [s.name for s in STEPS]
    args.steps = args.steps.split(",")
    if bad := [n for n in args.steps if n not in names]:
        p.error(f"--steps: unknown {', '.join(bad)}; allowed: {', '.join(names)}")
    limits = {}
    for item in args.limit:
        name, _, seconds = item.partition("=")
        if name not in names or not seconds.replace(".", "", 1).isdigit() or float(seconds) <= 0:
            p.error(f"--limit {item}: want STEP=SECONDS with STEP one of {', '.join(names)} and SECONDS > 0")
        limits[name] = float(seconds)
    if args.budget_s is None:
        gpu_budget = SECOND_BUDGET_S if set(args.steps) <= set(SECOND) else BUDGET_S
        args.budget_s = gpu_budget if args.device == "cuda" else CPU_BUDGET_S
    if args.budget_s <= 0:
        p.error(f"--budget-s {args.budget_s}: must be positive")
    if args.device == "cuda" and not cuda_here():
        p.error("--device cuda: torch is missing or sees no CUDA device; allowed here: --device cpu")
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(args.device, args.quick, Path(tmp) / f"gpu-check-{'gpu' if args.device == 'cuda' else 'cpu'}"
                  f"{'-quick' if args.quick else ''}", sys.executable)
        run.work.mkdir()
        wheels = add_wheels(args.wheels, run)
        env = environment(run)
        env["extra wheels"] = ", ".join(wheels) or "none"
        print(f"GPU check ({run.tag}): python {env['python']}, torch {env['torch']}, triton {env['triton']}, "
              f"transformers {env['transformers']}, liger_kernel {env['liger_kernel']}; budget {args.budget_s:.0f} s")
        steps = plan(run)
        for name, why in steps.items():
            print(f"  {name:15s} {why or 'runs'}")
        asked = [step for step in STEPS if step.name in args.steps]
        results = {step.name: {"status": "not reached: the call ended before it", "seconds": 0.0,
                               "rows": {"(every row)": "not measured: the call ended before this step"}}
                   for step in asked}  # what a call killed outright returns for the steps it did not reach
        summary, archive = publish(env, results, run, args.out)
        signal.signal(signal.SIGTERM, _end)
        ended = False
        try:
            for step in asked:
                left = args.budget_s - (time.perf_counter() - start)
                if ended:
                    problem, seconds = "skipped: the call was ended (SIGTERM) before it", 0.0
                elif steps[step.name]:
                    problem, seconds = steps[step.name], 0.0
                elif left < 5:
                    problem, seconds = f"skipped: the budget of {args.budget_s:.0f} s was spent", 0.0
                else:
                    limit = min(limits.get(step.name, step.limit_s), left) if args.device == "cuda" else left
                    print(f"[{time.perf_counter() - start:4.0f} s] {step.name} (limit {limit:.0f} s)")
                    problem, seconds = run_step(step, run, limit)
                    ended = problem == ENDED
                results[step.name] = {"status": problem or "done", "seconds": seconds,
                                      "rows": summarise(step, run, problem)}
                if step is not asked[-1]:
                    publish(env, results, run, args.out)
        except Ended:  # between two steps: those not reached say so already
            pass
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the last writes complete
        summary, archive = publish(env, results, run, args.out)
        text = summary.read_text()
    print(text)
    print(f"gpu_check: {time.perf_counter() - start:.0f} s; wrote {summary} and {archive}")
    failed = [n for n, r in results.items() if r["status"] != "done" and not r["status"].startswith("skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
