"""The summary table's intervals: Wilson for collapse fractions, t for scores and paired differences."""

import numpy as np
import pandas as pd
import pytest

from analysis.tables import summarize, t_interval, wilson_interval


def test_wilson_interval_at_the_edges():
    assert wilson_interval(0, 3) == pytest.approx((0.0, 0.5615), abs=1e-4)
    assert wilson_interval(3, 3) == pytest.approx((0.4385, 1.0), abs=1e-4)
    low, high = wilson_interval(1, 2)
    assert low < 0.5 < high
    assert all(np.isnan(wilson_interval(0, 0)))


def test_t_interval():
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and high - mean == pytest.approx(4.303 / np.sqrt(3), rel=1e-9)
    assert t_interval([0.5]) == (0.5, 0.5, 0.5)


def test_paired_difference_to_all_uses_the_same_seeds():
    rows = []
    for seed, base in enumerate([0.2, 0.5, 0.8]):  # seeds differ a lot, the ablation effect is constant
        rows.append({"model": "m", "ablation": "all", "seed": seed, "final_score": base})
        rows.append({"model": "m", "ablation": "none", "seed": seed, "final_score": base - 0.1})
    stability = pd.DataFrame(rows).assign(steps=100, collapsed=[False, True] * 3, collapse_step=np.nan,
                                         peak_score=1.0, k3_blowup=False, max_k3_kl=1e-4, max_grad_norm=1.0)
    summary = summarize(stability).set_index("ablation")
    none = summary.loc["none"]
    assert none["final_minus_all"] == pytest.approx(-0.1)
    assert none["final_minus_all_low"] == pytest.approx(-0.1) and none["final_minus_all_high"] == pytest.approx(-0.1)
    assert none["final_score_high"] - none["final_score_low"] > 0.5  # unpaired: wide
    assert np.isnan(summary.loc["all", "final_minus_all"])
    assert none["collapsed"] == 3 and none["frac_collapsed_low"] == pytest.approx(0.4385, abs=1e-4)
