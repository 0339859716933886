"""studies.treatments.report on hand-made tables: ratios to none per model, errors, no backend import."""

import json

import pandas as pd
import pytest

from studies.treatments.report import per_model, run
from tests.standalone import run_report_alone

K3 = {("a", "none"): 1e-4, ("a", "fp16"): 1e-6, ("a", "tis"): 1e-4, ("b", "none"): 2e-4, ("b", "fp16"): 4e-6,
      ("b", "tis"): 3e-4}


def write_tables(tables, collapsed=("b", "tis")):
    rows = []
    for (model, ablation), k3 in K3.items():
        for seed in (0, 1):
            run_id = f"{model}/{ablation}/seed{seed}"
            for step, factor in ((1, 0.5), (2, 1.5)):  # step mean = k3
                rows += [{"run": run_id, "model": model, "ablation": ablation, "seed": seed, "step": step,
                          "metric": "rollout_corr/k3_kl", "value": k3 * factor, "finite": True},
                         {"run": run_id, "model": model, "ablation": ablation, "seed": seed, "step": step,
                          "metric": "training/rollout_probs_diff_mean", "value": 10 * k3, "finite": True}]
    tables.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(tables / "metrics.parquet")
    pd.DataFrame([{"model": m, "ablation": a, "seed": s, "steps": 2, "collapsed": (m, a) == collapsed and s == 0}
                  for m, a in K3 for s in (0, 1)]).to_csv(tables / "stability.csv", index=False)
    pd.DataFrame([{"model": m, "setting": a, "reference": ref, "mean_abs_dlogprob": 100 * k3 if ref == "engine_forward"
                   else 1.0} for (m, a), k3 in K3.items() if a != "tis"
                  for ref in ("engine_forward", "engine_sampling")]).to_csv(tables / "probe_subsets.csv", index=False)


def bench_file(path):
    ratios = {"none": (1.0, 1.0), "fp16": (1.2, 1.0), "tis": (1.05, 1.01)}
    path.write_text(json.dumps({"models": {m: {"ablations": {a: {
        "update_s_median": 0.1 * t, "update_vs_none_median": t, "update_peak_bytes": int(1e6 * p),
        "update_peak_vs_none": p, "first_update_s": 0.2} for a, (t, p) in ratios.items()}} for m in ("a", "b")}}))
    return path


def test_ratios_are_per_model(tmp_path):
    write_tables(tmp_path / "tables")
    frame = per_model(tmp_path / "tables", json.loads(bench_file(tmp_path / "bench.json").read_text()))
    row = frame.set_index(["model", "ablation"])
    assert row.loc[("a", "fp16"), "k3_kl"] == pytest.approx(1e-6)
    assert row.loc[("a", "fp16"), "k3_kl_vs_none"] == pytest.approx(0.01)
    assert row.loc[("b", "fp16"), "k3_kl_vs_none"] == pytest.approx(0.02)
    assert row.loc[("b", "tis"), "probs_diff_vs_none"] == pytest.approx(1.5)
    assert row.loc[("a", "fp16"), "probe_dlogprob_vs_none"] == pytest.approx(0.01)
    assert pd.isna(row.loc[("a", "tis"), "probe_dlogprob"])  # the probe has no loss: no tis row
    assert row.loc[("b", "tis"), "collapsed"] == 1 and row.loc[("b", "tis"), "seeds"] == 2


def test_runs_without_torch_and_writes_table_and_figure(tmp_path):
    write_tables(tmp_path / "tables")
    done = run_report_alone("treatments", "--tables", tmp_path / "tables", "--bench", bench_file(tmp_path / "b.json"),
                            "--out", tmp_path / "fig")
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout
    assert {p.name for p in (tmp_path / "fig").iterdir()} == {"treatments.csv", "treatments.png", "treatments.pdf"}


def test_missing_inputs_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.parquet not found"):
        run(tmp_path, None, tmp_path / "fig")
    write_tables(tmp_path / "tables")
    with pytest.raises(FileNotFoundError, match="nope.json not found: run `python -m studies run treatments`"):
        run(tmp_path / "tables", tmp_path / "nope.json", tmp_path / "fig")


def test_rollout_time_is_the_engines_seconds_per_token_after_the_first_step():
    """Per run the median over steps after the first of timing_s/gen over response_length/mean, then the
    mean over seeds; the first step (the engine's warm-up) is left out, so a slow first step changes nothing."""
    from studies.treatments.report import rollout_time

    rows = []
    for ablation, per_token in (("none", 0.01), ("engine_casts", 0.02)):
        for seed in (0, 1):
            for step, length in ((1, 10.0), (2, 10.0), (3, 20.0), (4, 30.0)):
                gen = 100.0 if step == 1 else per_token * length * (1 + seed)
                run_id = f"a/{ablation}/seed{seed}"
                rows += [{"run": run_id, "model": "a", "ablation": ablation, "seed": seed, "step": step,
                          "metric": "timing_s/gen", "value": gen, "finite": True},
                         {"run": run_id, "model": "a", "ablation": ablation, "seed": seed, "step": step,
                          "metric": "response_length/mean", "value": length, "finite": True}]
    table = rollout_time(pd.DataFrame(rows)).set_index("ablation")["gen_s_per_token"]
    assert table["none"] == pytest.approx(0.015) and table["engine_casts"] == pytest.approx(0.03)
    assert rollout_time(pd.DataFrame(rows[:2])).empty  # logs without both metrics: no column
