"""Every study's Snakemake target for real, on its micro configuration (experiments/micro-studies.yaml):
measured, reported and published with its provenance, in a copy of the workflow (its studies/ folder
is the copy's, never the repository's). The numbers mean nothing; the DAG paths are the full studies'."""

from __future__ import annotations

import json
import subprocess

import pytest

from studies import STUDIES
from tests.test_workflow import REPO, copy_workflow, plan, snakemake

MICRO = ("--configfile", "experiments/micro.yaml", "experiments/micro-studies.yaml")


def _logs(work) -> str:
    return "\n".join(f"--- {p}\n{p.read_text()[-1500:]}" for p in sorted((work / "results").rglob("*.log")))


# In `make test-long` (7-9 min on 2 AVX2 cores, most of it vLLM-CPU's first compiles; `slow`: handed out first). The four studies that sample vLLM-CPU share one engine
# start through $RLA_SAMPLE_CACHE (the Makefile's; tests/test_sample_store.py), which this run's jobs inherit;
# the trace study's tapped engine starts on the checkpoint folder kept there, and loads that start's compile
# (or saves one for it).
@pytest.mark.long
@pytest.mark.slow
def test_every_study_runs_and_publishes_through_its_target(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    run = snakemake(work, "--cores", "2", "studies", *MICRO, timeout=1500)
    assert run.returncode == 0, run.stderr[-4000:] + _logs(work)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for name, study in STUDIES.items():
        [path] = (work / study.published).rglob("provenance.json")  # per machine kind, or the folder itself
        folder, record = path.parent, json.loads(path.read_text())
        assert record["commit"] == head and record["command"] == f"snakemake --cores N {name}", name
        assert record["files"] and all((folder / f).stat().st_size > 0 for f in record["files"]), name
        assert record["machine"]["aten_isa"] and record["engine"] == study.engine, name
        assert (work / "results/studies" / name / "publication.json").read_text() == path.read_text()
    assert "stall_checks.csv" in json.loads((work / "studies/geo_rs/published/provenance.json").read_text())["files"]
    assert (work / "studies/calibration/published/calibration.txt").read_text().startswith("runs:")
    # Nothing left to do: a second invocation plans no job.
    assert plan(work, "studies", *MICRO) == {}
