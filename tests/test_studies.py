"""The studies' judges: the rejection stall (studies/geo_rs/judge.py) and the collapse rule's calibration
(studies/calibration/judge.py) hold or fail as the per-run numbers say."""

import math

import pandas as pd
import pytest

from studies.geo_rs.judge import judge, sign_test

PREREG = {"rejected_fraction": {"geo_rs": [0.63, 0.73], "all+geo_rs": [0.0, 0.02]}, "gain_ratio_max": 0.5,
          "sign_test_p_max": 0.05, "baseline": "geo_rs", "aligned": "all+geo_rs"}


def _runs(base_gain, aligned_gain, base_rejected=0.7):
    rows = []
    for seed in range(12):
        rows.append({"model": "m", "seed": seed, "ablation": "geo_rs", "rejected_frac": base_rejected,
                     "val_gain": base_gain(seed)})
        rows.append({"model": "m", "seed": seed, "ablation": "all+geo_rs", "rejected_frac": 0.01,
                     "val_gain": aligned_gain(seed)})
    return pd.DataFrame(rows)


def test_sign_test_is_the_binomial_tail():
    assert sign_test(12, 12) == pytest.approx(1 / 4096)
    assert sign_test(10, 12) == pytest.approx((66 + 12 + 1) / 4096)
    assert sign_test(0, 12) == 1.0


def test_a_stall_that_alignment_prevents_passes_every_check():
    checks = judge(_runs(lambda s: 0.01, lambda s: 0.1), PREREG).set_index("check")["holds"]
    assert checks.all() and len(checks) == 4


def test_each_check_can_fail():
    no_stall = judge(_runs(lambda s: 0.1 + (0.01 if s % 2 else -0.01), lambda s: 0.1, base_rejected=0.2), PREREG)
    held = dict(zip(no_stall["check"].str[:2] + no_stall.index.astype(str), no_stall["holds"]))
    assert not held["S10"]  # rejection 0.2, predicted 0.63-0.73
    assert held["S11"]
    assert not held["S22"] and not held["S33"]  # equal gains; 6 of 12 pairs
    assert math.isclose(no_stall.loc[3, "measured"], sign_test(6, 12))


def test_missing_ablation_is_named():
    runs = _runs(lambda s: 0.0, lambda s: 0.1)
    with pytest.raises(ValueError, match="all\\+geo_rs"):
        judge(runs[runs["ablation"] == "geo_rs"], PREREG)


def test_calibration_counts_false_positives_and_runs_that_never_rose():
    from studies.calibration.judge import calibrate

    stability = pd.DataFrame({"collapsed": [True, False, False, False], "reason": ["score_fall", "stable", "no_rise", "stable"],
                              "last_step": [60, 60, 60, 60], "peak_step": [30, 59, 12, 40]})
    got = calibrate(stability, patience=10, smooth_window=10)
    assert got["false_positives"] == 1 and got["false_positive_rate"] == 0.25 and got["never_rose"] == 1
    assert got["steps_after_peak_min"] == 1 and got["runs_with_room_to_fall"] == 3  # 30, 48, 20 >= 20


def test_calibrate_reapplies_the_rule_with_other_thresholds(tmp_path, capsys):
    """Synthetic runs where `none` collapses: the command counts them, and an alternative threshold
    that asks for an impossible rise finds none; a bad key is named."""
    import yaml

    from studies.__main__ import main
    from analysis.collapse import stability_table
    from analysis.config import CollapseConfig
    from analysis.load import load_runs
    from tests.synthetic import write_grid

    write_grid(tmp_path / "runs", ["m"], ["none", "all"], [0, 1], steps=80)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"collapse": {"smooth_window": 5, "min_rise": 0.05, "patience": 5}}))
    cfg = CollapseConfig.from_mapping(yaml.safe_load(config.read_text())["collapse"])
    stability_table(load_runs(tmp_path / "runs"), cfg).to_csv(tmp_path / "stability.csv", index=False)
    alternatives = tmp_path / "alternatives.yaml"
    args = ["report", "calibration", "--stability", str(tmp_path / "stability.csv"), "--config", str(config),
            str(alternatives), "--runs", str(tmp_path / "runs")]
    alternatives.write_text(yaml.safe_dump({"report": {"alternatives": ["min_rise=5.0"]}}))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "false_positives: 2" in out and "alternative min_rise=5.0: 0 of 4 runs collapsed, 4 never rose" in out
    alternatives.write_text(yaml.safe_dump({"report": {"alternatives": ["min_rize=0.05"]}}))
    assert main(args) == 2
    assert "min_rize" in capsys.readouterr().err


def test_calibration_row_is_calibrate_as_one_table_row():
    from analysis.tables import wilson_interval
    from studies.calibration.judge import calibrate, calibration_row

    stability = pd.DataFrame({"collapsed": [True, False, False, False], "reason": ["score_fall", "stable", "no_rise", "no_rise"],
                              "last_step": [60, 60, 60, 60], "peak_step": [30, 59, 12, 40]})
    row = calibration_row(stability, patience=10, smooth_window=10)
    assert len(row) == 1
    row, said = row.iloc[0], calibrate(stability, patience=10, smooth_window=10)
    for key in ("runs", "false_positives", "false_positive_rate", "never_rose", "steps_after_peak_median",
                "runs_with_room_to_fall"):
        assert row[key] == said[key], key
    assert (row["fp_rate_95ci_low"], row["fp_rate_95ci_high"]) == pytest.approx(wilson_interval(1, 4))
    assert (row["reason_score_fall"], row["reason_stable"], row["reason_no_rise"], row["reason_too_short"]) == (1, 1, 2, 0)
    assert "reasons" not in row and "fp_rate_95ci" not in row


def test_calibration_judge_writes_its_tables_and_can_drop_the_no_recovery_clause(tmp_path, capsys):
    """Two runs: one dips below the rule's threshold for longer than `patience` and recovers (no collapse
    under the clause, a collapse without it), one never rises. --out writes calibration.csv and
    alternatives.csv; the text on stdout is what it was without --out."""
    import numpy as np
    import yaml

    from analysis.collapse import stability_table
    from analysis.config import CollapseConfig
    from analysis.load import load_runs
    from tests.synthetic import write_metrics
    from studies.__main__ import main

    step = np.arange(1, 81)
    dip = np.where(step <= 10, 0.1, np.where((step >= 30) & (step <= 36), 0.0, 0.8))  # 7 steps down, then back
    for name, score in (("seed0", dip), ("seed1", np.full(80, 0.4))):
        write_metrics(tmp_path / "runs" / "m" / "none" / name / "metrics.jsonl",
                      [{"critic/score/mean": float(s), "actor/pg_loss": 0.01, "actor/grad_norm": 0.5,
                        "rollout_corr/k3_kl": 1e-4} for s in score])
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"collapse": {"smooth_window": 1, "min_rise": 0.05, "patience": 5},
                                      "report": {"alternatives": ["patience=5", "patience=5,no_recovery=false"]}}))
    cfg = CollapseConfig.from_mapping(yaml.safe_load(config.read_text())["collapse"])
    stability_table(load_runs(tmp_path / "runs"), cfg).to_csv(tmp_path / "stability.csv", index=False)
    args = ["report", "calibration", "--stability", str(tmp_path / "stability.csv"), "--config", str(config), "--runs",
            str(tmp_path / "runs")]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert main(args + ["--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == text
    assert "false_positives: 0" in text and "alternative patience=5,no_recovery=false: 1 of 2 runs collapsed, 1 never rose" in text

    [row] = pd.read_csv(tmp_path / "out" / "calibration.csv").to_dict("records")
    assert (row["runs"], row["false_positives"], row["never_rose"], row["reason_stable"], row["reason_no_rise"]) == (2, 0, 1, 1, 1)
    alternatives = pd.read_csv(tmp_path / "out" / "alternatives.csv")
    assert list(alternatives.columns) == ["alternative", "smooth_window", "min_rise", "drop_frac", "patience", "no_recovery",
                                          "runs", "collapsed", "never_rose"]
    assert alternatives["alternative"].tolist() == ["patience=5", "patience=5,no_recovery=false"]
    assert alternatives["no_recovery"].tolist() == [True, False]
    assert alternatives["collapsed"].tolist() == [0, 1] and alternatives["runs"].tolist() == [2, 2]
    assert alternatives["never_rose"].tolist() == [1, 1] and alternatives["smooth_window"].tolist() == [1, 1]

    config.write_text(yaml.safe_dump({"collapse": {"smooth_window": 1, "min_rise": 0.05, "patience": 5},
                                      "report": {"alternatives": ["no_recovery=maybe"]}}))
    assert main(args) == 2  # a flag is true or false, not bool("maybe")
    assert "no_recovery" in capsys.readouterr().err


def test_the_tiny_headline_is_the_mean_logged_mismatch_and_its_ratio_to_none():
    from studies.tiny.report import headline

    rows = [{"model": "m", "ablation": a, "seed": 0, "step": step, "metric": metric, "value": value * scale,
             "finite": True}
            for a, scale in (("none", 1.0), ("all", 0.01))
            for step, value in ((1, 2e-4), (2, 4e-4))
            for metric in ("rollout_corr/k3_kl", "training/rollout_probs_diff_mean")]
    rows.append({"model": "m", "ablation": "all", "seed": 0, "step": 3, "metric": "rollout_corr/k3_kl",
                 "value": float("inf"), "finite": False})  # a non-finite value is not averaged in
    table = headline(pd.DataFrame(rows)).set_index("ablation")
    assert table.loc["none", "k3 KL"] == pytest.approx(3e-4) and table.loc["all", "k3 KL"] == pytest.approx(3e-6)
    assert table.loc["all", "k3 KL: none / ablation"] == pytest.approx(100)
    with pytest.raises(ValueError, match="rollout_corr/k3_kl"):
        headline(pd.DataFrame(rows).query("metric != 'rollout_corr/k3_kl'"))
