"""Reading run logs: layout, resumed parts, damaged files, NaN/inf, the tidy and wide tables."""

import json
import math

import pandas as pd
import pytest

from analysis.load import LogWarning, find_run_dirs, load_run, load_runs, tidy_table


def write_lines(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def line(step, **data):
    # metric names with a slash cannot be keywords: "__" stands for "/"
    return json.dumps({"step": step, "data": {k.replace("__", "/"): v for k, v in data.items()}})


def cell(tmp_path, model="m", ablation="none", seed=0):
    return tmp_path / "runs" / model / ablation / f"seed{seed}"


def test_resumed_run_reads_parts_in_order_and_later_steps_win(tmp_path):
    run_dir = cell(tmp_path)
    write_lines(run_dir / "metrics.part-000.jsonl", [line(s, critic__score__mean=0.1 * s) for s in range(1, 11)])
    write_lines(run_dir / "metrics.part-001.jsonl", [line(s, critic__score__mean=-1.0) for s in range(6, 9)])
    write_lines(run_dir / "metrics.jsonl", [line(s, critic__score__mean=-2.0) for s in range(8, 16)])

    run = load_run(run_dir)

    score = run.wide["critic/score/mean"]
    assert list(score.index) == list(range(1, 16))
    assert score.loc[5] == pytest.approx(0.5)       # only in part-000
    assert score.loc[6] == -1.0 and score.loc[7] == -1.0  # part-001 replaced part-000
    assert (score.loc[8:15] == -2.0).all()          # metrics.jsonl replaced both parts
    assert len(run.long) == 15                      # no duplicate rows left


def test_nan_inf_and_null_are_kept_and_flagged(tmp_path):
    run_dir = cell(tmp_path)
    write_lines(run_dir / "metrics.jsonl", [
        line(1, actor__pg_loss=0.5),
        line(2, actor__pg_loss=float("nan")),      # json writes NaN
        line(3, actor__pg_loss=float("inf")),      # json writes Infinity
        line(4, actor__pg_loss=None),              # verl's orjson writes NaN/inf as null
    ])
    with pytest.warns(LogWarning, match=r"3 non-finite value\(s\) kept and flagged, in: actor/pg_loss"):
        run = load_run(run_dir)
    values = run.wide["actor/pg_loss"]
    assert values.loc[1] == 0.5
    assert math.isnan(values.loc[2]) and values.loc[3] == math.inf and math.isnan(values.loc[4])

    table = tidy_table([run])
    assert len(table) == 4  # nothing dropped
    assert table.sort_values("step")["finite"].tolist() == [True, False, False, False]


def test_metric_missing_in_some_steps_is_absent_not_nan(tmp_path):
    run_dir = cell(tmp_path)
    write_lines(run_dir / "metrics.jsonl", [
        line(1, a=1.0, b=10.0), line(2, a=2.0), line(3, a=3.0, b=30.0),
    ])
    run = load_run(run_dir)
    table = tidy_table([run])
    assert sorted(table.loc[table["metric"] == "b", "step"]) == [1, 3]
    assert table["finite"].all()  # a missing value is not a non-finite one
    assert math.isnan(run.wide.loc[2, "b"]) and run.wide.loc[3, "b"] == 30.0


def test_truncated_last_line_is_dropped_with_warning(tmp_path):
    run_dir = cell(tmp_path)
    path = write_lines(run_dir / "metrics.jsonl", [line(s, a=float(s)) for s in range(1, 6)])
    path.write_text(path.read_text() + line(6, a=6.0)[:20])  # crash mid-write
    with pytest.warns(LogWarning, match=r"metrics\.jsonl:6: truncated last line"):
        run = load_run(run_dir)
    assert list(run.wide.index) == [1, 2, 3, 4, 5]


def test_malformed_middle_line_is_skipped_naming_file_and_line(tmp_path):
    run_dir = cell(tmp_path)
    write_lines(run_dir / "metrics.jsonl", [
        line(1, a=1.0), "{not json", line(3, a=3.0), json.dumps({"step": "x", "data": {}}), line(5, a=5.0),
    ])
    with pytest.warns(LogWarning) as record:
        run = load_run(run_dir)
    messages = [str(w.message) for w in record]
    assert any("metrics.jsonl:2: malformed line" in m for m in messages)
    assert any("metrics.jsonl:4: line is not" in m for m in messages)
    assert list(run.wide.index) == [1, 3, 5]


def test_unreadable_file_is_skipped_with_warning(tmp_path):
    run_dir = cell(tmp_path)
    write_lines(run_dir / "metrics.part-000.jsonl", [line(1, a=1.0)])
    (run_dir / "metrics.jsonl").mkdir()  # exists, but cannot be read as a file
    with pytest.warns(LogWarning, match=r"metrics\.jsonl: unreadable, skipped"):
        run = load_run(run_dir)
    assert list(run.wide.index) == [1]


def test_run_without_data_is_kept_and_reported(tmp_path):
    empty = cell(tmp_path, seed=1)
    empty.mkdir(parents=True)
    write_lines(cell(tmp_path, seed=0) / "metrics.jsonl", [line(1, a=1.0)])
    with pytest.warns(LogWarning, match=r"seed1: run has no data \(no metrics file\)"):
        runs = load_runs(tmp_path / "runs")
    assert [(r.run_id, r.steps) for r in runs] == [("m/none/seed0", 1), ("m/none/seed1", 0)]


def test_non_numeric_values_are_dropped_with_warning(tmp_path):
    run_dir = cell(tmp_path)
    write_lines(run_dir / "metrics.jsonl", [line(1, a=1.0, note="hello"), line(2, a=2.0, hist=[1, 2])])
    with pytest.warns(LogWarning, match=r"non-numeric values dropped for metric\(s\): hist, note"):
        run = load_run(run_dir)
    assert list(run.wide.columns) == ["a"]
    assert run.wide["a"].tolist() == [1.0, 2.0]


def test_layout_discovery_and_errors(tmp_path):
    write_lines(cell(tmp_path, "qwen2-s", "rope", 3) / "metrics.jsonl", [line(1, a=1.0)])
    write_lines(tmp_path / "runs" / "qwen2-s" / "rope" / "latest" / "metrics.jsonl", [line(1, a=1.0)])
    with pytest.warns(LogWarning, match="name is not seed<N>"):
        dirs = find_run_dirs(tmp_path / "runs")
    assert [d.name for d in dirs] == ["seed3"]
    run = load_run(dirs[0])
    assert (run.model, run.ablation, run.seed) == ("qwen2-s", "rope", 3)

    with pytest.raises(FileNotFoundError, match="runs directory not found"):
        load_runs(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no runs found under .*empty"):
        load_runs(tmp_path / "empty")


def test_tidy_table(tmp_path):
    for seed, ablation in [(0, "none"), (1, "none"), (0, "all")]:
        write_lines(cell(tmp_path, "qwen3-s", ablation, seed) / "metrics.jsonl",
                    [line(s, x=float(s + seed), y=2.0 * s) for s in range(1, 4)])
    runs = load_runs(tmp_path / "runs")
    table = tidy_table(runs)
    assert list(table.columns) == ["run", "model", "ablation", "seed", "step", "metric", "value", "finite"]
    assert len(table) == 3 * 3 * 2
    row = table[(table["run"] == "qwen3-s/none/seed1") & (table["step"] == 2) & (table["metric"] == "x")]
    assert row["value"].item() == 3.0 and row["seed"].item() == 1 and row["ablation"].item() == "none"

    path = tmp_path / "metrics.parquet"
    table.to_parquet(path)
    back = pd.read_parquet(path)
    assert back["value"].sum() == pytest.approx(table["value"].sum())
