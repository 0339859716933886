"""verl's real trainer on this CPU (`make test-verl`): experiments/verl-cpu.yaml through Snakemake, as
`snakemake --configfile experiments/verl-cpu.yaml --cores 2` runs it, with vLLM's CPU build as the
rollout and patches.verl_plugin in the workers. Per cell: verl exited 0; the plugin logged the regions
and target it applied in the FSDP worker; the metrics the analysis reads are there and finite; `all`
lowers k3 against `none` by more than this machine's own spread of k3 between two cells with the same
numerics; `figures_only` draws every cell; the rerun-one-cell command of docs/running.md loses nothing (`make
test-extended`; run twice in a row, through the same rule, by tests/test_workflow_reruns.py). Skipped
unless RLA_TEST_VERL=1 (the Makefile sets it)."""

from __future__ import annotations

import math
import os
import re
import time

import pandas as pd
import pytest
import yaml

from rla import names
from rla.metricslog import read as read_metrics
from tests.test_workflow import copy_workflow, job_counts, load, snakemake

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("RLA_TEST_VERL") != "1", reason="verl on the CPU: make test-verl")]

PROFILE = "experiments/verl-cpu.yaml"
# The cells trained (make test-verl VERL_ABLATIONS=...): by default none, all and tis - what the k3 check
# needs; the profile's fp16 and compile cells cost 8-10 min of CPU each on an AVX2 machine.
REQUIRED = ("none", "all", "tis")
ABLATIONS = os.environ.get("RLA_TEST_VERL_ABLATIONS", ",".join(REQUIRED)).split(",")
TIMEOUT = 1500  # seconds for the grid (9-12 minutes measured on a shared 2-core machine)
# The Ray log prefix of each verl process that imports external_lib (HFModelConfig), and what it is.
PROCESSES = {"WorkerDict": "FSDP worker", "vLLMHttpServer": "vLLM server", "TaskRunnerV1": "TaskRunner",
             "AgentLoopWorkerTQ": "agent-loop worker"}
PLUGIN_LINE = re.compile(r"\((?P<proc>\w+) pid=\d+\)\S* WARNING:[^:]+:[^:]+:\d+,\d+:rounding alignment \[[^\]]+\]: "
                         r"RLA_REGIONS='(?P<spec>[^']*)' -> aligned regions: (?P<regions>.+?) \(target (?P<target>[\w:-]+): "
                         r"(?P<engine>.+?); stored as BF16: (?P<stored>[\w., ]+); impl \w+\); RLA_TREATMENTS='(?P<treatments>[^']*)' -> decoder layers compiled on build: "
                         r"(?P<compiled>.+)$")
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl-cpu")
    work = copy_workflow(root / "wf")
    cfg = load(work / PROFILE)
    results, figures = root / "results", root / "figures"
    unknown = set(ABLATIONS) - set(cfg["ablations"])
    assert not unknown and set(REQUIRED) <= set(ABLATIONS), (
        f"RLA_TEST_VERL_ABLATIONS={','.join(ABLATIONS)}: allowed {', '.join(cfg['ablations'])}, "
        f"with at least {', '.join(sorted(REQUIRED))}")
    args = ("--configfile", PROFILE, "--config", f"results_dir={results}", f"figures_dir={figures}",
            f"ablations=[{','.join(ABLATIONS)}]")
    start = time.time()
    run = snakemake(work, "--cores", "2", *args, timeout=TIMEOUT)
    TIMINGS["grid"] = time.time() - start
    logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((results / "logs").rglob("*.log")))
    assert run.returncode == 0, run.stderr[-4000:] + logs
    return {"work": work, "cfg": cfg, "results": results, "figures": figures, "args": args,
            "cells": {a: results / "runs" / m / a / f"seed{s}" for m in cfg["models"] for a in ABLATIONS
                      for s in cfg["seeds"]}}


def metrics(cell) -> pd.DataFrame:
    rows = [{"step": step, **data} for _, step, data in read_metrics(cell / "metrics.jsonl")]
    return pd.DataFrame(rows).set_index("step")


def test_every_cell_ran_verls_trainer_to_the_end(grid):
    assert set(grid["cells"]) == set(ABLATIONS) and all((c / "metrics.jsonl").exists() for c in grid["cells"].values())
    rows = []
    for ablation, cell in grid["cells"].items():
        log = (cell / "train.log").read_text()
        assert "-m verl.trainer.main_ppo" in log and log.rstrip().endswith("=== exit status 0"), ablation
        bench = pd.read_csv(grid["results"] / "benchmarks/train" / cell.relative_to(grid["results"] / "runs").parent
                            / f"{cell.name}.tsv", sep="\t")
        frame = metrics(cell)
        rows.append(f"{ablation:8} rc 0  wall {bench['s'].iloc[0]:6.1f} s  cpu {bench['cpu_time'].iloc[0]:6.1f} s  k3 "
                    + ", ".join(f"{v:.3g}" for v in frame["rollout_corr/k3_kl"]) + "  probs_diff_mean "
                    + ", ".join(f"{v:.3g}" for v in frame["training/rollout_probs_diff_mean"]))
    print(f"\ngrid {TIMINGS['grid']:.0f} s\n" + "\n".join(rows))
    for ablation, cell in grid["cells"].items():
        assert list(metrics(cell).index) == list(range(1, grid["cfg"]["steps"] + 1)), ablation
        # verl's own metrics, which no stand-in writes.
        assert {"perf/mfu/actor", "timing_s/update_weights", "global_seqlen/mean"} <= set(metrics(cell)), ablation
        # The treatments as verl was told them.
        resolved = yaml.safe_load((cell / "config.yaml").read_text())["cell"]["verl_overrides"]
        assert ("actor_rollout_ref.rollout.dtype='float16'" in resolved) == (ablation == "fp16")
        assert ("algorithm.rollout_correction.rollout_is='token'" in resolved) == (ablation == "tis")


def test_the_plugin_logged_what_it_applied_in_each_process(grid):
    for ablation, cell in grid["cells"].items():
        lines = [m for m in map(PLUGIN_LINE.search, (cell / "train.log").read_text().splitlines()) if m]
        seen = {m["proc"] for m in lines}
        assert set(PROCESSES) <= seen, (ablation, seen)
        regions = names.regions_of(ablation)
        for m in lines:
            # target auto: the table read off vLLM-CPU's graph in the workers is vllm-cpu's
            assert m["spec"] == ",".join(regions) and m["target"] == "auto:vllm-cpu", (ablation, m.group(0))
            assert m["stored"] == "rope.out, swiglu.out, rmsnorm.out" and m["engine"].startswith("vllm "), m.group(0)
            assert m["regions"] == (", ".join(sorted(regions)) or "none (stock)"), (ablation, m.group(0))
            assert m["treatments"] == ("compile" if ablation == "compile" else "")
        worker = next(m for m in lines if m["proc"] == "WorkerDict")
        assert (worker["compiled"] == "Qwen2DecoderLayer, Qwen3DecoderLayer") == (ablation == "compile"), worker.group(0)
        log = (cell / "train.log").read_text()
        assert "verlrun.cpu_shims [pid" in log and "vllm_plain_linear applied" in log, ablation


def test_the_metrics_the_analysis_reads_are_there_and_finite(grid):
    from analysis.config import CollapseConfig
    from analysis.figures import DYNAMICS, MISMATCH, SCORE

    collapse = CollapseConfig()
    read = {SCORE.metric, *(p.metric for p in MISMATCH + DYNAMICS), collapse.score_metric, collapse.k3_metric,
            *collapse.nonfinite_metrics}
    for ablation, cell in grid["cells"].items():
        frame = metrics(cell)
        assert read <= set(frame), (ablation, read - set(frame))
        bad = {k: frame[k].tolist() for k in read if not all(math.isfinite(v) for v in frame[k])}
        assert not bad, (ablation, bad)


def test_all_lowers_k3_against_none_by_more_than_this_machines_spread(grid):
    """`tis` has `none`'s numerics (rollout correction reweights the loss, the forward is the same), so
    the k3 between them, step by step, is what two runs with the same numerics differ by here: the
    sampling noise of k3 on this machine. `all` must lower k3 against `none` at every step by more than
    twice that."""
    k3 = {a: metrics(c)["rollout_corr/k3_kl"] for a, c in grid["cells"].items()}
    noise = max(abs(math.log(k3["tis"][s] / k3["none"][s])) for s in k3["none"].index)
    effect = min(math.log(k3["none"][s] / k3["all"][s]) for s in k3["none"].index)
    TIMINGS.update(k3_none=float(k3["none"].mean()), k3_all=float(k3["all"].mean()),
                   ratio_all=float((k3["all"] / k3["none"]).mean()), noise=math.exp(noise) - 1)
    print("\nk3 per step: " + "; ".join(f"{a} {', '.join(f'{v:.3g}' for v in k3[a])}" for a in k3)
          + f"\nall/none {math.exp(-effect):.3f} at most; same-numerics spread {math.exp(noise) - 1:.1%}")
    assert effect > 2 * noise > 0, (k3, noise, effect)


def test_figures_only_draws_every_cell(grid):
    figures = grid["figures"] / grid["cfg"]["profile"]
    for path in figures.iterdir():
        path.unlink()
    redraw = snakemake(grid["work"], "figures_only", "--cores", "1", *grid["args"], timeout=600)
    assert redraw.returncode == 0, redraw.stderr[-3000:]
    assert job_counts(redraw.stdout + redraw.stderr) == {"figures_only": 1}
    for name in ("score", "mismatch", "dynamics", "collapse_heatmap"):
        assert (figures / f"{name}.png").stat().st_size > 0 and (figures / f"{name}.pdf").stat().st_size > 0
    tidy = pd.read_parquet(grid["results"] / "tables/metrics.parquet")
    cells = len(grid["cells"])
    groups = tidy.groupby(["model", "ablation", "seed"], observed=True).ngroups
    assert set(tidy["ablation"]) == set(grid["cells"]) and groups == cells
    assert len(pd.read_csv(grid["results"] / "tables/stability.csv")) == cells


@pytest.mark.extended  # a whole verl cell again (3-5 min on 2 AVX2 cores): make test-extended
def test_the_rerun_one_cell_command_loses_nothing(grid):
    """`snakemake --configfile experiments/verl-cpu.yaml --cores 2 --force <cell>/metrics.jsonl`: the run
    trains the cell again and moves the previous verl cell aside, with its metrics and checkpoints; no other
    cell changes. (A second rerun moves a second folder aside beside the first: the train rule's, whatever
    the backend, checked in a row by tests/test_workflow_reruns.py.)"""
    cell = grid["cells"]["none"]
    target = str(cell / "metrics.jsonl")
    before = {a: (c / "metrics.jsonl").read_bytes() for a, c in grid["cells"].items()}
    start = time.time()
    result = snakemake(grid["work"], "--configfile", PROFILE, "--cores", "2", "--force", target, "--config",
                       *grid["args"][3:], timeout=900)
    TIMINGS["rerun"] = time.time() - start
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result.stdout + result.stderr) == {"train": 1}
    moved = [p for p in cell.parent.iterdir() if ".replaced-" in p.name]
    assert [(p / "metrics.jsonl").read_bytes() for p in moved] == [before["none"]]
    assert (moved[0] / "checkpoints/latest_checkpointed_iteration.txt").exists()
    assert list(metrics(cell).index) == [1, 2]
    assert "already finished all 2 steps: training it again" in (cell / "train.log").read_text()
    for ablation, other in grid["cells"].items():
        if ablation != "none":
            assert (other / "metrics.jsonl").read_bytes() == before[ablation], ablation
    print("\n" + ", ".join(f"{k} {v:.3g}" for k, v in TIMINGS.items()))
