"""Checks to run on a cluster node before submitting a grid: one line per check, exit 1 on any
failure. Nothing here needs a GPU to run; without one, the GPU checks fail and say why."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from rla import layout
from verlrun import disk, models
from rla.config import verl_settings

# torch 2.11 (pinned by verl[vllm] through vllm 0.24) ships CUDA 13 wheels: NVIDIA driver >= 580.
MIN_DRIVER = 580
MIN_CUDA = 13
MIN_GLIBC = "2.31"
# Imported in a fresh interpreter each, as the Ray workers do; the versions the environment pins.
IMPORTS = {"torch": "2.11.0", "vllm": "0.24.0", "verl": "0.9.1", "flash_attn": "2.8.3", "transfer_queue": "0.1.11",
           "patches.verl_plugin": None}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name:<12} {self.detail}"


def _run(cmd: list[str], timeout: int = 120) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


def check_driver(min_major: int = MIN_DRIVER) -> Check:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out is None or out.returncode != 0 or not out.stdout.strip():
        return Check("driver", False, "nvidia-smi not found or failed: no NVIDIA driver on this node")
    version = out.stdout.split()[0]
    major = int(version.split(".")[0])
    return Check("driver", major >= min_major,
                 f"{version} (CUDA 13 wheels of torch 2.11 need >= {min_major})")


def check_glibc(minimum: str = MIN_GLIBC) -> Check:
    found = platform.libc_ver()[1] or "unknown"
    ok = found != "unknown" and tuple(int(x) for x in found.split(".")[:2]) >= tuple(int(x) for x in minimum.split("."))
    return Check("glibc", ok, f"{found} (vllm 0.24's wheels need >= {minimum})")


def check_gpus(needed: int) -> Check:
    out = _run(["nvidia-smi", "--list-gpus"])
    count = len([l for l in out.stdout.splitlines() if l.startswith("GPU ")]) if out and out.returncode == 0 else 0
    return Check("gpus", count >= needed, f"{count} visible, a cell needs {needed} on one node")


def check_import(module: str, version: str | None) -> Check:
    code = (f"import {module} as m, sys; v = getattr(m, '__version__', ''); "
            "print(v); import torch; print(torch.version.cuda or '', torch.cuda.is_available())")
    out = _run([sys.executable, "-c", code], timeout=600)
    if out is None:
        return Check("import", False, f"{module}: timed out")
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return Check("import", False, f"{module}: {last}")
    found, cuda, available = (out.stdout.split("\n") + ["", "", ""])[:3]
    if version and not found.startswith(version):
        return Check("import", False, f"{module} {found}, the environment pins {version}")
    if module == "torch":
        major = int(cuda.split(".")[0]) if cuda else 0
        ok = major >= MIN_CUDA and available.strip() == "True"
        return Check("import", ok, f"torch {found}, CUDA {cuda or 'none (CPU build)'}, "
                                   f"GPU usable: {available.strip()} (need CUDA >= {MIN_CUDA} and a GPU)")
    return Check("import", True, f"{module} {found}".strip())


def check_models(cfg: dict) -> list[Check]:
    checks = []
    for model in cfg["models"]:
        directory = models.local_path(cfg, model)
        if models.is_staged(cfg, model):
            checks.append(Check("model", True, f"{model}: {directory}"))
        else:
            problems = models.check_complete(directory)
            why = "; ".join(problems) if problems else "not from the pinned revision (no or stale marker)"
            checks.append(Check("model", False, f"{model}: {why}; run the stage_model rule"))
    return checks


def check_disk(cfg: dict) -> Check:
    """Free space where the cells write, against the grid's checkpoints at their peak (the staged
    models count only if not yet there)."""
    results = layout.results_dir(cfg).resolve()
    existing = results
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    need = sum(row["cells"] * row["cell"] for row in disk.grid_rows(cfg))
    need += sum(row["staged_model"] for row in disk.grid_rows(cfg) if not models.is_staged(cfg, row["model"]))
    tb = 1e12
    return Check("disk", free >= need, f"{free / tb:.2f} TB free at {existing}, the grid needs {need / tb:.2f} TB")


def check_partitions(cfg: dict, partition_file: str | Path) -> list[Check]:
    """Each model's cell fits at least one partition of the profile's partition file."""
    path = Path(partition_file)
    if not path.is_file():
        return [Check("partition", False, f"{path}: no such file")]
    partitions = (yaml.safe_load(path.read_text()) or {}).get("partitions") or {}
    checks = []
    for model in cfg["models"]:
        want = {**(cfg.get("resources") or {}).get("train", {}), **(cfg["model_specs"][model].get("resources") or {})}
        verl = verl_settings(cfg, model)  # the model's own cluster shape on top
        gpus, nodes = verl["n_gpus_per_node"], verl["nnodes"]
        fitting = [name for name, lim in partitions.items()
                   if lim.get("max_gpu", 0) >= gpus and lim.get("max_nodes", 1) >= nodes
                   and lim.get("max_mem_mb", float("inf")) >= want.get("mem_mb", 0)
                   and lim.get("max_runtime", float("inf")) >= want.get("runtime", 0)]
        ask = f"{nodes} node(s) x {gpus} GPUs, {want.get('mem_mb')} MB, {want.get('runtime')} min"
        checks.append(Check("partition", bool(fitting), f"{model}: {ask}: " + (f"fits {', '.join(fitting)}" if fitting
                            else f"fits none of {', '.join(partitions) or 'no partitions'} in {path}")))
    return checks


PARTITIONS = Path(__file__).resolve().parent.parent / "profiles/slurm/partitions.yaml"


def run(cfg: dict, partition_file: str | Path = PARTITIONS) -> list[Check]:
    checks = [check_driver(), check_gpus(max(verl_settings(cfg, m)["n_gpus_per_node"] for m in cfg["models"])),
              check_glibc()]
    checks += check_partitions(cfg, partition_file)
    checks += [check_import(module, version) for module, version in IMPORTS.items()]
    checks += check_models(cfg)
    checks.append(check_disk(cfg))
    return checks


def main(cfg: dict, partition_file: str | Path = PARTITIONS) -> int:
    checks = run(cfg, partition_file)
    for check in checks:
        print(check.line(), flush=True)
    failed = sum(not c.ok for c in checks)
    print(f"preflight: {failed} of {len(checks)} checks failed" if failed else f"preflight: all {len(checks)} checks passed")
    return 1 if failed else 0
