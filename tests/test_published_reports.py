"""Each study's report step, re-run on the files already in its published folder, writes its published
tables and figures again byte for byte: code that moves keeps what the docs quote. No torch: the report
steps read tables. Each runs in a process of its own, as the DAG runs it (one report's figure settings
would otherwise reach the next one's figure)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from studies import STUDIES

pytestmark = pytest.mark.slow  # a minute of figures: started first under xdist

ROOT = Path(__file__).resolve().parents[1]

# study: (its published folder, the report's options). {published}: that folder, only read; {out}: an empty
# folder the outputs go to. Every file the report writes into {out} that published/ also holds must match.
REPORTS = {
    **{name: (f"{STUDIES[name].published}/avx512-amx", "--tables {published} --out {out}")
       for name in ("tiny", "tiny_sdpa", "tiny_amx")},
    "verl_cpu": (f"{STUDIES['verl_cpu'].published}/avx512", "--tables {published} --out {out}"),
    "probe": (f"{STUDIES['probe'].published}/avx512-amx", "--probe {published} --out {out} --tables {out}"),
    "scaling": (STUDIES["scaling"].published, "--tables {published} --out {out}"),
    "depth": (f"{STUDIES['depth'].published}/avx512-amx", "--result {published}/depth.json --out {out}"),
    "leftover": (f"{STUDIES['leftover'].published}/avx512-amx", "--result {published}/depth.json --out {out}"),
    "trace": (f"{STUDIES['trace'].published}/avx512-amx", "--result {published}/trace.json --out {out}"),
    "gpu_check": ("studies/gpu_check/runs", "--runs {published} --out {out}"),  # its runs, committed beside it
    # the judge reads its points from the folder it writes into: {out} starts with the published points
    "gradprobe": (STUDIES["gradprobe"].published, "--plan experiments/gradprobe.yaml --out {out}"),
    "rope_lead": (STUDIES["rope_lead"].published, "--plan experiments/gradprobe-rope.yaml --out {out}"),
}
COMPARED_WITH = {"gpu_check": STUDIES["gpu_check"].published}  # where its outputs are published, if not its input
POINTS_IN_OUT = {"gradprobe", "rope_lead"}  # the published subfolders are copied into {out} first
STDOUT = {"gradprobe": "report.md", "rope_lead": "report.md"}  # the report's stdout is this published file
# least-squares fits (numpy through its BLAS): their last digits follow the CPU (regenerated on a 2-core AVX2
# EPYC, 4e-15 apart from the published AMX machine's), so they are compared to a relative 1e-12
CLOSE = {"scaling": ("mismatch_scaling_fits.csv", "mismatch_where.csv")}
NOT_REGENERATED = {
    "geo_rs": "its judge reads the runs (--runs), which are not published",
    "calibration": "its alternatives read the runs (--runs), which are not published",
    "treatments": "its report reads the grid's metrics.parquet and probe tables, which are not published",
    "stress": "no report step: its tables and figures are the grid's, made from its runs",
    **{name: "no report step: it publishes its measurement as it is"
       for name in ("vllm_alignment", "kernels", "engine_tables", "roundmap", "diagnose_cost")},
    "torch_releases": "its report turns one release's map into its table (a job per release; "
                      "tests/test_torch_releases.py reads the published tables against the targets)",
}


def regenerate(name: str, published: Path, tmp: Path) -> Path:
    """Run `name`'s report step on `published` (read as it is) into a new folder under `tmp`; the folder."""
    out = tmp / "out"
    out.mkdir()
    if name in POINTS_IN_OUT:
        for point in (p for p in published.iterdir() if p.is_dir()):
            shutil.copytree(point, out / point.name)
    options = REPORTS[name][1].format(published=published, out=out).split()
    done = subprocess.run([sys.executable, "-m", "studies", "report", name, *options], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if name in STDOUT:
        (out / STDOUT[name]).write_text(done.stdout)
    return out


def differences(name: str, out: Path, published: Path) -> list[str]:
    """Each output in `out` that differs from its copy in `published`; an error where none was compared."""
    compared, found = 0, []
    for path in sorted(p for p in out.iterdir() if p.is_file()):
        expected = published / path.name
        if not expected.exists():
            continue
        compared += 1
        if path.read_bytes() == expected.read_bytes():
            continue
        if path.name in CLOSE.get(name, ()):
            try:
                pd.testing.assert_frame_equal(pd.read_csv(path), pd.read_csv(expected), rtol=1e-12)
                continue
            except AssertionError as err:
                found.append(f"{path.name}: {err}")
                continue
        found.append(path.name)
    assert compared, f"{name}: none of {sorted(p.name for p in out.iterdir())} is in {published}"
    return found


def test_every_study_is_listed():
    assert set(REPORTS) | set(NOT_REGENERATED) == set(STUDIES)
    assert not set(REPORTS) & set(NOT_REGENERATED)


@pytest.mark.parametrize("name", REPORTS)
def test_published_tables_regenerate(name, tmp_path):
    published = ROOT / REPORTS[name][0]
    out = regenerate(name, published, tmp_path)
    assert differences(name, out, ROOT / COMPARED_WITH.get(name, REPORTS[name][0])) == []


def test_an_altered_input_shows(tmp_path):
    """One logged value changed in a copy of the tiny grid's metrics: its headline no longer matches."""
    published = ROOT / REPORTS["tiny"][0]
    altered = tmp_path / "altered"
    shutil.copytree(published, altered)
    metrics = pd.read_parquet(altered / "metrics.parquet")
    row = metrics.index[(metrics["metric"] == "rollout_corr/k3_kl") & metrics["finite"]][0]
    metrics.loc[row, "value"] *= 2
    metrics.to_parquet(altered / "metrics.parquet")
    out = regenerate("tiny", altered, tmp_path)
    assert set(differences("tiny", out, published)) == {"headline.csv", "headline.md"}
