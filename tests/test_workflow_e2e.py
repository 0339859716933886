"""The whole workflow for real on experiments/micro.yaml (CPU, local backend): data, warm start,
four training cells, tables, figures; then a rerun plans nothing and figures_only redraws."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.test_workflow import copy_workflow, grid_size, job_counts, load, plan, results_of, snakemake


def _logs(work) -> str:
    return "\n".join(f"--- {p}\n{p.read_text()[-1500:]}" for p in sorted((work / "results").rglob("*.log")))


# 4-5 min on 2 cores, each cell starting and compiling its own vLLM-CPU engine: `make test-extended` (CI
# runs the same rules through tests/test_workflow_reruns.py and, with verl's trainer, tests/test_verl_cpu.py).
@pytest.mark.extended
def test_micro_grid_end_to_end(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    figures = tmp_path / "figures"
    cfg = load(work / "experiments/micro.yaml")
    args = ("--configfile", "experiments/micro.yaml", "--config", f"figures_dir={figures}")
    run = snakemake(work, "--cores", "2", *args, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:] + _logs(work)

    results = results_of(work, cfg)
    for model in cfg["models"]:
        for ablation in cfg["ablations"]:
            for seed in cfg["seeds"]:
                cell = results / "runs" / model / ablation / f"seed{seed}"
                frame = pd.read_json(cell / "metrics.jsonl", lines=True)
                assert sorted(frame["step"]) == list(frame["step"]) and len(frame) >= cfg["steps"]
                assert {"critic/score/mean", "actor/grad_norm"} <= set(frame["data"].iloc[-1])
                assert (cell / "config.yaml").exists() and (cell / "train.log").exists()
    tidy = pd.read_parquet(results / "tables/metrics.parquet")
    assert tidy.groupby(["model", "ablation", "seed"]).ngroups == grid_size(cfg)
    assert len(pd.read_csv(results / "tables/stability.csv")) == grid_size(cfg)
    drawn = {p.suffix for p in (figures / cfg["profile"]).iterdir()}
    assert {".png", ".pdf"} <= drawn
    # the figures hold drawings, not blank canvases (what they draw: tests/test_analysis_figures.py)
    import matplotlib.image as mpimg
    import numpy as np

    for name in ("score", "mismatch", "collapse_heatmap"):
        pixels = mpimg.imread(figures / cfg["profile"] / f"{name}.png")
        assert pixels.shape[0] > 200 and len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50, name

    # Provenance is stable: a second invocation has nothing to do.
    assert plan(work, *args) == {}
    # A browsable report of the figures and tables, with the captions of workflows/report/.
    report = results / "report.html"
    made = snakemake(work, "--cores", "1", "--report", str(report), *args)
    assert made.returncode == 0, made.stderr[-3000:]
    html = report.read_text()
    for text in ("score.png", "collapse_heatmap.png", "stability.csv", "summary.csv", "Sampled score per model"):
        assert text in html, text
    # Figures from the cached logs, for real; no training job runs.
    for path in (figures / cfg["profile"]).iterdir():
        path.unlink()
    redraw = snakemake(work, "figures_only", "--cores", "1", *args)
    assert redraw.returncode == 0, redraw.stderr[-4000:]
    assert job_counts(redraw.stdout + redraw.stderr) == {"figures_only": 1}
    assert {".png", ".pdf"} <= {p.suffix for p in (figures / cfg["profile"]).iterdir()}
