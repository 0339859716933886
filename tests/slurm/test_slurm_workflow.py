"""The micro grid (experiments/micro.yaml, local CPU backend) through the SLURM profile on a real
one-node cluster: every job is submitted with the resources the profile promises, the grid finishes
with its tables and figures, and a training job cancelled with scancel resumes from its checkpoint
when the workflow is run again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.test_workflow import REPO, copy_workflow, grid_size, job_counts, load, resolved_config, results_of, snakemake

pytestmark = pytest.mark.slurm
STEPS = 60  # long enough (with micro.yaml's checkpoint every 2 steps) to cancel a cell midway


def slurm_test_profile(work: Path) -> str:
    """profiles/slurm as it is, less what this machine lacks: no conda (the micro grid
    runs in the CPU venv), the test cluster's partition, squeue for job states (no accounting
    database), no automatic retries (the test reruns the workflow itself), short polling."""
    profile = load(REPO / "profiles/slurm/config.yaml")
    for key in ("software-deployment-method", "conda-prefix"):
        profile.pop(key)
    node = subprocess.run(["scontrol", "show", "node", "--oneliner"], capture_output=True, text=True, check=True).stdout
    memory = int(re.search(r"RealMemory=(\d+)", node).group(1))
    cpus = int(re.search(r"CPUTot=(\d+)", node).group(1))
    partitions = {"partitions": {"debug": {"max_runtime": 1440, "max_mem_mb": memory, "max_gpu": 0, "max_nodes": 1,
                                           "max_cpus_per_task": cpus}}}
    directory = work / "test-profile"
    directory.mkdir()
    (directory / "partitions.yaml").write_text(yaml.safe_dump(partitions))
    profile.update({
        "slurm-partition-config": str(directory / "partitions.yaml"),
        "slurm-status-command": "squeue",
        "slurm-init-seconds-before-status-checks": 5,
        "retries": 0,
        "keep-going": True,
        "latency-wait": 10,
        "jobs": 4,
    })
    (directory / "config.yaml").write_text(yaml.safe_dump(profile))
    return str(directory)


def jobs_of_run(comment_prefix: str = "rule_") -> list[dict]:
    """Every job the controller still knows (MinJobAge is an hour), as key=value dicts."""
    out = subprocess.run(["scontrol", "show", "job", "--oneliner"], capture_output=True, text=True, check=True).stdout
    jobs = []
    for line in out.splitlines():
        fields = dict(re.findall(r"(\S+?)=(\S*)", line))
        if fields.get("Comment", "").startswith(comment_prefix):
            jobs.append(fields)
    return jobs


def _cancel_a_running_cell(work: Path, results: Path, before: set[str], timeout: float = 900) -> tuple[str, Path]:
    """scancel the first train job that runs and has written a checkpoint; returns (job id, cell)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for job in jobs_of_run("rule_train"):
            if job["JobId"] in before or job["JobState"] != "RUNNING":
                continue
            # The plugin's comment: rule_train_wildcards_<model>_<ablation>_<seed> (model names have no "_").
            model, ablation, seed = job["Comment"].removeprefix("rule_train_wildcards_").rsplit("_", 2)
            cell = results / "runs" / model / ablation / f"seed{seed}"
            if list((cell / "checkpoints").glob("step_*.pt")):
                subprocess.run(["scancel", job["JobId"]], check=True)
                return job["JobId"], cell
        time.sleep(1)
    raise AssertionError(f"no train job reached a checkpoint while running within {timeout} s")


def test_micro_grid_on_slurm_with_a_cancelled_and_resumed_cell(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    figures = tmp_path / "figures"
    profile = slurm_test_profile(work)
    args = ("--workflow-profile", profile, "--configfile", "experiments/micro.yaml",
            "--config", f"steps={STEPS}", f"figures_dir={figures}")
    before = {job["JobId"] for job in jobs_of_run()}
    env_cmd = [sys.executable, "-m", "snakemake", *args, "--nolock"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen(env_cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cfg = load(work / "experiments/micro.yaml")
    results = results_of(work, cfg)
    cancelled, cell = _cancel_a_running_cell(work, results, before)
    output, _ = first.communicate(timeout=1800)
    assert first.returncode != 0, "the cancelled job should fail the first run\n" + output[-3000:]
    assert "CANCELLED" in output or "cancel" in output.lower(), output[-3000:]

    # Resources: what the config asks for, as SLURM granted it (scontrol).
    resolved = resolved_config(work, "micro")
    train = resolved["resources"]["train"]
    jobs = [j for j in jobs_of_run() if j["JobId"] not in before]
    trains = [j for j in jobs if j["Comment"].startswith("rule_train")]
    assert len(trains) == grid_size(cfg)
    for job in trains:
        assert job["NumNodes"] == "1" and job["Partition"] == "debug"
        assert job["MinMemoryNode"] == f"{train['mem_mb']}M"
        assert job["TimeLimit"] == f"{train['runtime'] // 60:02d}:{train['runtime'] % 60:02d}:00"
        assert job["CPUs/Task"] == str(train["threads"])
    states = {j["JobId"]: j["JobState"] for j in trains}
    assert states.pop(cancelled) == "CANCELLED"
    assert set(states.values()) == {"COMPLETED"}, states
    assert "stopped by signal" in (cell / "train.log").read_text()

    # The rerun trains only the cancelled cell, which resumes from its checkpoint.
    second = snakemake(work, *args, timeout=1800)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    counts = job_counts(second.stdout + second.stderr)
    assert counts.get("train") == 1 and "warmstart" not in counts, counts
    log = (cell / "train.log").read_text()
    assert re.search(r"resuming from the checkpoint at step [1-9]", log), log[-2000:]
    frame = pd.read_json(cell / "metrics.jsonl", lines=True)
    assert list(frame["step"]) == list(range(1, STEPS + 1))
    rerun = [j for j in jobs_of_run("rule_train") if j["JobId"] not in before and j["JobId"] not in {x["JobId"] for x in trains}]
    assert [j["JobState"] for j in rerun] == ["COMPLETED"]

    tables = results / "tables"
    assert len(pd.read_csv(tables / "stability.csv")) == grid_size(cfg)
    assert {".png", ".pdf"} <= {p.suffix for p in (figures / cfg["profile"]).iterdir()}
    (tmp_path / "slurm-jobs.json").write_text(json.dumps(jobs_of_run(), indent=1))
