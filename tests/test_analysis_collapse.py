"""Collapse verdicts on synthetic logs of known shape, and the collapse config."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.collapse import STABILITY_COLUMNS, stability_table
from analysis.config import CollapseConfig, load_config
from analysis.load import LogWarning, load_run
from tests.synthetic import run_records, score_curve, write_metrics

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = CollapseConfig()  # window 5, min_rise 0.05, drop_frac 0.5, patience 5, k3 0.01


def step_score(low_until=10, high_until=50, steps=80, low=0.1, high=0.8, fallen=0.0):
    """Score per step 1..steps: `low` up to low_until, `high` up to high_until, then `fallen`."""
    step = np.arange(1, steps + 1)
    return np.where(step <= low_until, low, np.where(step <= high_until, high, fallen))


def make_run(tmp_path, score, name="seed0", edit=None, ablation="none", **write):
    records = [{"critic/score/mean": float(s), "actor/pg_loss": 0.01, "actor/grad_norm": 0.5,
                "rollout_corr/k3_kl": 1e-4} for s in score]
    for step, changes in (edit or {}).items():
        records[step - 1].update(changes)
    run_dir = tmp_path / "runs" / "m" / ablation / name
    write_metrics(run_dir / "metrics.jsonl", records, **write)
    return load_run(run_dir)


def verdict(run, cfg=DEFAULT):
    return stability_table([run], cfg).iloc[0]


def test_clean_rise_is_stable(tmp_path):
    row = verdict(make_run(tmp_path, score_curve("rise", 200, noise=0.01)))
    assert not row["collapsed"] and row["reason"] == "stable"
    assert row["peak_score"] > row["start_score"] + 0.3
    assert row["steps"] == 200


def test_rise_then_fall_collapses_at_first_step_of_the_sustained_fall(tmp_path):
    run = make_run(tmp_path, step_score())
    # Without smoothing the fall is seen at once: steps 51.. are below, for longer than patience.
    raw = verdict(run, CollapseConfig(smooth_window=1))
    assert raw["collapsed"] and raw["reason"] == "score_fall" and raw["collapse_step"] == 51
    # Trailing mean over 5: start 0.1, peak 0.8, threshold 0.8 - 0.5 * 0.7 = 0.45. Windows ending
    # at 51, 52 hold 4 and 3 high values (0.64, 0.48); the one ending at 53 holds 2 (0.32 < 0.45).
    row = verdict(run)
    assert row["collapsed"] and row["collapse_step"] == 53 and row["score_collapse_step"] == 53
    assert row["peak_score"] == pytest.approx(0.8) and row["final_score"] == pytest.approx(0.0)
    assert row["peak_step"] == 15  # first full window of high values


def test_nan_loss_is_collapse_at_that_step(tmp_path):
    with pytest.warns(LogWarning, match="1 non-finite value"):
        run = make_run(tmp_path, score_curve("rise", 100), edit={37: {"actor/pg_loss": None}})  # orjson's NaN
    row = verdict(run)
    assert row["collapsed"] and row["collapse_step"] == 37 and row["nonfinite_step"] == 37
    assert row["reason"] == "nonfinite:actor/pg_loss"
    assert row["n_nonfinite"] == 1


def test_inf_grad_norm_before_a_score_fall_wins(tmp_path):
    with pytest.warns(LogWarning, match="1 non-finite value"):
        run = make_run(tmp_path, step_score(), edit={30: {"actor/grad_norm": float("inf")}})
    row = verdict(run)
    assert row["collapsed"] and row["collapse_step"] == 30
    assert row["reason"] == "nonfinite:actor/grad_norm"
    assert row["score_collapse_step"] == 53  # the later score fall is still reported
    assert row["max_grad_norm"] == 0.5       # max over finite values


def test_fp16_overflow_skips_are_not_collapse_unless_they_persist(tmp_path):
    """Under loss scaling an inf gradient norm is a skipped step; the same log without fp16 is a collapse."""
    overflows = {7: {"actor/grad_norm": float("inf")}, 40: {"actor/grad_norm": float("inf")}}
    with pytest.warns(LogWarning, match="2 non-finite value"):
        scaled = verdict(make_run(tmp_path / "a", score_curve("rise", 100), edit=overflows, ablation="fp16"))
    assert not scaled["collapsed"] and scaled["reason"] == "stable" and scaled["n_nonfinite"] == 2
    with pytest.warns(LogWarning, match="2 non-finite value"):
        stock = verdict(make_run(tmp_path / "b", score_curve("rise", 100), edit=overflows))
    assert stock["collapsed"] and stock["collapse_step"] == 7
    stuck = {step: {"actor/grad_norm": float("inf")} for step in range(60, 60 + DEFAULT.patience)}
    with pytest.warns(LogWarning):
        row = verdict(make_run(tmp_path / "c", score_curve("rise", 100), edit=stuck, ablation="fp16"))
    assert row["collapsed"] and row["collapse_step"] == 60 and row["reason"] == "nonfinite:actor/grad_norm"
    with pytest.warns(LogWarning):  # a NaN loss is a collapse under FP16 too
        row = verdict(make_run(tmp_path / "d", score_curve("rise", 100), edit={20: {"actor/pg_loss": None}},
                               ablation="fp16"))
    assert row["collapsed"] and row["collapse_step"] == 20


def test_k3_spike_without_score_fall_is_flagged_not_collapse(tmp_path):
    run = make_run(tmp_path, score_curve("rise", 100), edit={42: {"rollout_corr/k3_kl": 0.05},
                                                             70: {"rollout_corr/k3_kl": 0.02}})
    row = verdict(run)
    assert not row["collapsed"] and row["reason"] == "stable"
    assert row["k3_blowup"] and row["k3_blowup_step"] == 42
    assert row["max_k3_kl"] == pytest.approx(0.05)
    below = verdict(run, CollapseConfig(k3_kl_threshold=0.1))
    assert not below["k3_blowup"] and pd.isna(below["k3_blowup_step"])


def test_too_short_run(tmp_path):
    row = verdict(make_run(tmp_path, [0.1, 0.5, 0.9, 0.9, 0.0, 0.0]))
    assert not row["collapsed"] and row["reason"] == "too_short" and row["steps"] == 6


def test_truncated_file_keeps_the_verdict(tmp_path):
    with pytest.warns(LogWarning, match="truncated last line"):
        run = make_run(tmp_path, step_score(), truncate_last=True)
    row = verdict(run)
    assert row["steps"] == 79 and row["last_step"] == 79
    assert row["collapsed"] and row["collapse_step"] == 53


def test_fall_shorter_than_patience_is_not_collapse(tmp_path):
    dip = step_score(high_until=80, steps=80).astype(float)  # rises and never falls by itself
    dip[39:43] = 0.0  # steps 40..43: four steps below, then back up
    row = verdict(make_run(tmp_path, dip, name="seed0"), CollapseConfig(smooth_window=1))
    assert not row["collapsed"] and row["reason"] == "stable"
    # a dip lasting the patience that then recovers is still not a collapse: collapses do not heal
    dip[39:45] = 0.0
    row = verdict(make_run(tmp_path, dip, name="seed1"), CollapseConfig(smooth_window=1))
    assert not row["collapsed"] and row["reason"] == "stable"
    # the same fall without recovery is a collapse at its first step
    dip[39:] = 0.0
    row = verdict(make_run(tmp_path, dip, name="seed3"), CollapseConfig(smooth_window=1))
    assert row["collapsed"] and row["collapse_step"] == 40

    ends_falling = step_score(high_until=77, steps=80)  # only 3 steps down when the run ends
    row = verdict(make_run(tmp_path, ends_falling, name="seed2"), CollapseConfig(smooth_window=1))
    assert not row["collapsed"]


def test_small_fall_and_no_rise(tmp_path):
    small = step_score(fallen=0.5)  # gives back 0.3 of a 0.7 rise: less than drop_frac
    assert verdict(make_run(tmp_path, small, name="seed0"))["reason"] == "stable"
    flat_then_zero = step_score(low=0.4, high=0.42)  # rose by 0.02 < min_rise
    row = verdict(make_run(tmp_path, flat_then_zero, name="seed1"))
    assert not row["collapsed"] and row["reason"] == "no_rise"
    lower_bar = verdict(make_run(tmp_path, flat_then_zero, name="seed2"), CollapseConfig(min_rise=0.01))
    assert lower_bar["collapsed"]


def test_no_data_and_no_score(tmp_path):
    (tmp_path / "runs" / "m" / "none" / "seed0").mkdir(parents=True)
    with pytest.warns(LogWarning, match="no data"):
        empty = load_run(tmp_path / "runs" / "m" / "none" / "seed0")
    no_score_dir = tmp_path / "runs" / "m" / "none" / "seed1"
    write_metrics(no_score_dir / "metrics.jsonl", [{"actor/grad_norm": 1.0}] * 20)
    table = stability_table([empty, load_run(no_score_dir)], DEFAULT)
    assert list(table.columns) == STABILITY_COLUMNS
    assert table["reason"].tolist() == ["no_data", "no_score"]
    assert table["steps"].tolist() == [0, 20]
    assert not table["collapsed"].any()


def test_synthetic_grid_shapes_are_detected(tmp_path):
    """The generator the benchmark uses: a collapse at step c is found shortly after c."""
    for seed in range(3):
        collapse_at = 300 + 50 * seed
        score = score_curve("collapse", 600, collapse_at, noise=0.02, seed=seed)
        run_dir = tmp_path / "runs" / "m" / "none" / f"seed{seed}"
        write_metrics(run_dir / "metrics.jsonl", run_records(score, collapse_at=collapse_at, seed=seed),
                      first_step=0)
        row = verdict(load_run(run_dir))
        assert row["collapsed"] and collapse_at <= row["collapse_step"] <= collapse_at + DEFAULT.smooth_window
        assert row["k3_blowup"] and row["k3_blowup_step"] >= collapse_at


def test_config_is_read_from_the_experiment_file():
    section = yaml.safe_load((ROOT / "experiments" / "tiny.yaml").read_text())["collapse"]
    cfg = load_config(ROOT / "experiments" / "tiny.yaml")
    for key, value in section.items():
        assert getattr(cfg.collapse, key) == value
    assert cfg.models and cfg.ablations


def test_config_errors_name_the_bad_value(tmp_path):
    bad_key = tmp_path / "bad_key.yaml"
    bad_key.write_text(json.dumps({"collapse": {"smooth_windw": 5}}))
    with pytest.raises(ValueError, match=r"unknown collapse setting\(s\) \['smooth_windw'\]; allowed: drop_frac, k3_kl_threshold"):
        load_config(bad_key)
    bad_value = tmp_path / "bad_value.yaml"
    bad_value.write_text(json.dumps({"collapse": {"drop_frac": 1.5}}))
    with pytest.raises(ValueError, match=r"collapse.drop_frac = 1.5 \(float\) is invalid: it must be a number in \(0, 1\]"):
        load_config(bad_value)
    with pytest.raises(ValueError, match=r"collapse.patience = 0"):
        CollapseConfig(patience=0)
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
