"""The ``python -m analysis`` commands end to end on small synthetic grids."""

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.cli import main
from analysis.collapse import STABILITY_COLUMNS
from analysis.figures import FigureWarning
from tests.synthetic import run_records, score_curve, write_grid, write_metrics
from tests.standalone import run_analysis_alone

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "tiny.yaml"
FIGURES = ["score", "mismatch", "dynamics", "collapse_heatmap"]


def figure_files(folder):
    return sorted(p.name for p in Path(folder).iterdir())


def assert_all_figures(folder, names=FIGURES):
    for name in names:
        png, pdf = Path(folder) / f"{name}.png", Path(folder) / f"{name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert pdf.read_bytes()[:5] == b"%PDF-", pdf


@pytest.fixture
def grid(tmp_path):
    """2 models x 3 ablations x 2 seeds, 120 steps; 'none' collapses."""
    write_grid(tmp_path / "runs", ["qwen2-s", "qwen3-s"], ["none", "rope", "all"], [0, 1], 120)
    return tmp_path


def test_stability_command_writes_one_row_per_run(grid):
    out = grid / "tables" / "stability.csv"
    assert main(["stability", "--runs", str(grid / "runs"), "--out", str(out), "--config", str(CONFIG), "-q"]) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == STABILITY_COLUMNS
    assert len(table) == 12
    collapsed = table.groupby("ablation")["collapsed"].all()
    assert collapsed["none"] and not table.loc[table["ablation"] != "none", "collapsed"].any()
    # write_grid puts the fall at 120 * (0.5 + 0.1 * ((seed + model) % 3)) on steps counted from 1
    none = table[table["ablation"] == "none"].set_index(["model", "seed"])
    for (model, seed), row in none.iterrows():
        fall_step = int(120 * (0.5 + 0.1 * ((seed + ["qwen2-s", "qwen3-s"].index(model)) % 3))) + 1
        assert fall_step <= row["collapse_step"] <= fall_step + 5
        assert row["k3_blowup"] and row["k3_blowup_step"] == fall_step


def test_collect_command_writes_the_tidy_table(grid):
    out = grid / "tables" / "metrics.parquet"
    assert main(["collect", "--runs", str(grid / "runs"), "--out", str(out), "-q"]) == 0
    table = pd.read_parquet(out)
    assert list(table.columns) == ["run", "model", "ablation", "seed", "step", "metric", "value", "finite"]
    assert len(table) == 12 * 120 * 14  # runs x steps x core metrics
    assert table["run"].nunique() == 12


def test_plots_command_writes_every_figure_and_the_summary(grid):
    figures, tables = grid / "figures", grid / "tables"
    assert main(["plots", "--runs", str(grid / "runs"), "--config", str(CONFIG), "--out", str(figures),
                 "--tables", str(tables), "-q"]) == 0
    assert figure_files(figures) == sorted(f"{n}.{e}" for n in FIGURES for e in ("png", "pdf"))
    assert_all_figures(figures)
    summary = pd.read_csv(tables / "summary.csv")
    assert len(summary) == 6
    assert summary["ablation"].tolist()[:3] == ["none", "rope", "all"]  # config order
    none = summary[summary["ablation"] == "none"]
    assert (none["frac_collapsed"] == 1.0).all() and (none["collapsed"] == 2).all()
    assert (summary.loc[summary["ablation"] != "none", "frac_collapsed"] == 0.0).all()
    markdown = (tables / "summary.md").read_text().splitlines()
    assert markdown[0].startswith("| model | ablation |") and len(markdown) == 2 + 6


def test_all_command_with_one_seed_one_model(tmp_path):
    write_grid(tmp_path / "runs", ["qwen3-m"], ["none", "all"], [0], 80)
    code = main(["all", "--runs", str(tmp_path / "runs"), "--config", str(CONFIG),
                 "--tables", str(tmp_path / "tables"), "--figures", str(tmp_path / "figures"), "-q"])
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [
        "metrics.parquet", "stability.csv", "summary.csv", "summary.md"]
    assert_all_figures(tmp_path / "figures")


def test_missing_metrics_skip_panels_with_a_warning(tmp_path):
    runs = tmp_path / "runs"
    for ablation in ["none", "rope"]:
        records = run_records(score_curve("rise", 60), n_metrics=14)
        for record in records:  # a backend that logs no mismatch and no entropy
            for name in ["rollout_corr/k3_kl", "training/rollout_probs_diff_mean", "actor/entropy"]:
                record.pop(name)
        write_metrics(runs / "qwen2-s" / ablation / "seed0" / "metrics.jsonl", records)
    with pytest.warns(FigureWarning) as record:
        assert main(["plots", "--runs", str(runs), "--out", str(tmp_path / "fig"),
                     "--tables", str(tmp_path / "tables"), "-q"]) == 0
    messages = " ".join(str(w.message) for w in record)
    assert "'rollout_corr/k3_kl' not logged by any run" in messages
    assert "'actor/entropy' not logged by any run" in messages
    assert "mismatch: no metric of this figure was logged; figure skipped" in messages
    assert_all_figures(tmp_path / "fig", ["score", "dynamics", "collapse_heatmap"])
    assert not (tmp_path / "fig" / "mismatch.png").exists()


def test_bad_input_is_a_clear_error_and_keeps_existing_output(tmp_path, capsys):
    out = tmp_path / "stability.csv"
    out.write_text("previous,result\n")
    assert main(["stability", "--runs", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "runs directory not found" in capsys.readouterr().err

    write_grid(tmp_path / "runs", ["m"], ["none"], [0], 30)
    config = tmp_path / "cfg.yaml"
    config.write_text(json.dumps({"collapse": {"patiense": 3}}))
    assert main(["stability", "--runs", str(tmp_path / "runs"), "--out", str(out), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "unknown collapse setting(s) ['patiense']" in err and "allowed:" in err
    assert out.read_text() == "previous,result\n"  # nothing already written is lost
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".stability")]  # no temp left


def test_module_runs_alone_without_any_backend(tmp_path):
    """`python -m analysis` works as a program and never imports a training backend."""
    write_grid(tmp_path / "runs", ["m"], ["none", "rope"], [0], 40)
    done = run_analysis_alone("all", "--runs", tmp_path / "runs", "--figures", tmp_path / "figures", "-q")
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout
    assert (tmp_path / "tables" / "stability.csv").exists()  # default tables dir: <runs>/../tables


def test_damaged_logs_never_stop_the_analysis(grid, recwarn):
    """Empty, all-garbage, NaN-only and truncated logs: each named (file:line) in a warning and given a
    no_data / flagged row; every other run's tables and figures are still written."""
    runs = grid / "runs"
    damaged = {"empty": b"", "garbage": b"not json\n{also not\n",
               "nan_only": b'{"step": 1, "data": {"critic/score/mean": null, "actor/grad_norm": null}}\n'
                           b'{"step": 2, "data": {"critic/score/mean": null, "actor/grad_norm": null}}\n',
               "truncated": b'{"step": 1, "data": {"critic/score/mean": 0.5}}\n{"step": 2, "da'}
    for model, content in damaged.items():
        cell = runs / model / "none" / "seed0"
        cell.mkdir(parents=True)
        (cell / "metrics.jsonl").write_bytes(content)
    tables, figures = grid / "tables", grid / "figures"
    assert main(["all", "--runs", str(runs), "--config", str(CONFIG), "--tables", str(tables),
                 "--figures", str(figures)]) == 0
    err = "\n".join(str(w.message) for w in recwarn)
    for model, where in [("empty", "metrics.jsonl: run has no data (empty file)"),
                         ("garbage", "metrics.jsonl:1: malformed line"),
                         ("nan_only", "metrics.jsonl:1: 4 non-finite value(s)"),
                         ("truncated", "metrics.jsonl:2: truncated last line")]:
        assert f"{model}/none/seed0/{where}" in err, (model, err)
    stability = pd.read_csv(tables / "stability.csv").set_index("model")
    assert stability.loc["empty", "reason"] == stability.loc["garbage", "reason"] == "no_data"
    assert stability.loc["nan_only", "collapsed"] and stability.loc["nan_only", "n_nonfinite"] == 4
    assert stability.loc["truncated", "steps"] == 1
    assert len(stability) == 12 + 4
    metrics = pd.read_parquet(tables / "metrics.parquet")
    assert metrics["run"].nunique() == 12 + 2  # the two runs with readable steps
    assert_all_figures(figures)


def test_figures_and_tables_are_byte_reproducible_and_readable(grid, tmp_path):
    """The same logs give the same bytes (no dates in PDF or PNG metadata); files honour the umask."""
    import os

    outputs = []
    previous = os.umask(0o022)
    try:
        for name in ("a", "b"):
            tables, figures = tmp_path / name / "tables", tmp_path / name / "figures"
            assert main(["all", "--runs", str(grid / "runs"), "--config", str(CONFIG), "--tables", str(tables),
                         "--figures", str(figures), "-q"]) == 0
            outputs.append({p.relative_to(tmp_path / name): p for p in (tmp_path / name).rglob("*") if p.is_file()})
    finally:
        os.umask(previous)
    first, second = outputs
    assert sorted(first) == sorted(second) and len(first) >= 2 * len(FIGURES) + 4
    for rel in first:
        assert first[rel].read_bytes() == second[rel].read_bytes(), rel
        assert first[rel].stat().st_mode & 0o777 == 0o644, rel


def test_a_figure_with_one_logged_metric_wraps_more_models_than_a_row_holds(tmp_path):
    """Five models, only the score and k3 KL logged: the mismatch figure has one panel per model, in rows of
    four, as the score figure does."""
    models = [f"m{i}" for i in range(5)]
    write_grid(tmp_path / "runs", models, ["none", "all"], [0], 40, n_metrics=2)
    figures = tmp_path / "figures"
    assert main(["plots", "--runs", str(tmp_path / "runs"), "--config", str(CONFIG), "--out", str(figures),
                 "--tables", str(tmp_path / "tables"), "-q"]) == 0
    assert_all_figures(figures, ["score", "mismatch"])
