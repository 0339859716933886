"""The preflight command: on this CPU machine it fails and says why; with stand-ins for the driver
and a staged model, the checks pass one by one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verlrun import preflight
from rla.config import load as load_config
from tests.test_verlrun import PAPER, REPO


def _fake_nvidia_smi(directory: Path, driver: str, gpus: int) -> None:
    script = directory / "nvidia-smi"
    lines = "\\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})" for i in range(gpus))
    script.write_text(f"""#!/bin/sh
case "$*" in
  *driver_version*) printf '%s\\n' {' '.join([driver] * gpus)};;
  --list-gpus) printf '{lines}\\n';;
esac
""")
    script.chmod(0o755)


@pytest.mark.long  # about a minute: it imports verl, vLLM and torch in turn
@pytest.mark.slow
def test_preflight_on_a_machine_without_gpus_fails_naming_each_problem(tmp_path):
    out = subprocess.run([sys.executable, "-m", "verlrun", "preflight", "--config", str(PAPER)], cwd=REPO,
                         capture_output=True, text=True, timeout=900, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(l.startswith("FAIL  driver") and "no NVIDIA driver" in l for l in lines)
    assert any(l.startswith("FAIL  gpus") and "0 visible" in l for l in lines)
    assert any(l.startswith("FAIL  import") and "vllm" in l for l in lines)
    assert any(l.startswith("FAIL  import") and "torch" in l for l in lines)
    assert sum(l.startswith("FAIL  model") for l in lines) == 4
    assert any(l.startswith("PASS  import") and "verl 0.9.1" in l for l in lines)
    assert lines[-1].startswith("preflight:") and "failed" in lines[-1]


def test_driver_and_gpu_checks_read_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    _fake_nvidia_smi(tmp_path, "580.82.07", 8)
    assert preflight.check_driver().ok and preflight.check_gpus(8).ok
    assert not preflight.check_gpus(16).ok
    _fake_nvidia_smi(tmp_path, "550.54.15", 8)
    check = preflight.check_driver()
    assert not check.ok and "550.54.15" in check.detail and ">= 580" in check.detail


def test_a_version_other_than_the_pinned_one_fails():
    assert not preflight.check_import("yaml", "0.0.1").ok
    assert preflight.check_import("yaml", None).ok
    assert not preflight.check_import("no_such_module_here", None).ok


def test_staged_models_and_disk(tmp_path, monkeypatch):
    from verlrun import models

    paper = load_config(PAPER)
    snapshot = tmp_path / "model"
    snapshot.mkdir()
    cfg = {**paper, "results_dir": str(tmp_path / "results"), "models": ["qwen3-8b"],
           "verl": {**paper["verl"], "models_dir": str(tmp_path / "models")}}
    (check,) = preflight.check_models(cfg)
    assert not check.ok and "no such directory" in check.detail and "stage_model" in check.detail
    disk = preflight.check_disk(cfg)
    assert not disk.ok and "TB free" in disk.detail and "needs" in disk.detail  # terabytes on a laptop disk
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: type("U", (), {"free": 10**16})())
    assert preflight.check_disk(cfg).ok
    monkeypatch.setattr(models, "is_staged", lambda cfg, model: True)
    assert all(c.ok for c in preflight.check_models(cfg))


def test_every_cell_must_fit_a_partition(tmp_path):
    paper = load_config(PAPER)
    assert all(c.ok for c in preflight.check_partitions(paper, preflight.PARTITIONS))
    small = tmp_path / "partitions.yaml"
    small.write_text("partitions:\n  gpu: {max_runtime: 1440, max_mem_mb: 500000, max_gpu: 8, max_nodes: 1}\n")
    checks = {c.detail.split(":")[0]: c for c in preflight.check_partitions(paper, small)}
    assert not checks["qwen3-8b"].ok and "2880 min" in checks["qwen3-8b"].detail and "fits none of gpu" in checks["qwen3-8b"].detail
    assert not preflight.check_partitions(paper, tmp_path / "absent.yaml")[0].ok
