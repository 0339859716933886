"""Figure building blocks: palette, smoothing, binning, mean + CI, collapse marks."""

import math

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest

from analysis.collapse import stability_table
from analysis.config import CollapseConfig
from analysis.figures import _collapse_points, smoothed_frame
from analysis.load import load_runs
from analysis.series import bin_steps, mean_ci, trailing_mean
from analysis.style import ABLATION_COLORS, StyleWarning, ablation_order, ablation_palette
from tests.synthetic import write_grid


def test_palette_is_fixed_and_distinct():
    from rla.names import ABLATIONS

    assert list(ABLATION_COLORS) == list(ABLATIONS)  # every ablation of the grid, in rla.names' order
    assert len({mcolors.to_hex(c) for c in ABLATION_COLORS.values()}) == len(ABLATIONS)
    # the same colour whatever else is plotted alongside
    assert ablation_palette(["all", "rope"])["rope"] == ablation_palette(["rope"])["rope"]
    with pytest.warns(StyleWarning, match="ablation 'bf8' has no fixed colour"):
        palette = ablation_palette(["none", "bf8"])
    assert palette["bf8"] not in ABLATION_COLORS.values()


def test_ablation_order_is_fixed_then_config_then_sorted():
    assert ablation_order({"all", "zeta", "none", "rope", "alpha"}, ("zeta",)) == [
        "none", "rope", "all", "zeta", "alpha"]


def test_trailing_mean_matches_pandas_rolling():
    values = np.random.default_rng(0).normal(size=50)
    expected = pd.Series(values).rolling(7, min_periods=1).mean().to_numpy()
    assert np.allclose(trailing_mean(values, 7), expected)
    full = pd.Series(values).rolling(7).mean().dropna().to_numpy()
    assert np.allclose(trailing_mean(values, 7, full_windows_only=True), full)


def test_mean_ci_over_seeds():
    frame = pd.DataFrame({"g": ["a", "a", "a", "b"], "step": [1, 1, 1, 1], "value": [1.0, 2.0, 6.0, 4.0]})
    out = mean_ci(frame, ["g", "step"], "value").set_index("g")
    sd = np.std([1.0, 2.0, 6.0], ddof=1)
    half = 4.303 * sd / math.sqrt(3)  # t(0.975, 2 dof)
    assert out.loc["a", "mean"] == pytest.approx(3.0)
    assert out.loc["a", "low"] == pytest.approx(3.0 - half, rel=1e-3)
    assert out.loc["a", "high"] == pytest.approx(3.0 + half, rel=1e-3)
    assert out.loc["b", "low"] == out.loc["b", "high"] == 4.0  # one seed: no band


def test_bin_steps_keeps_seeds_aligned_and_means():
    long_run = pd.DataFrame({"run": "a", "step": np.arange(1000), "value": np.arange(1000, dtype=float)})
    short_run = pd.DataFrame({"run": "b", "step": np.arange(0, 600, 3), "value": 1.0})
    binned = bin_steps(pd.concat([long_run, short_run]), 100, by=["run"])
    a, b = binned[binned["run"] == "a"], binned[binned["run"] == "b"]
    assert len(a) == 100
    assert set(b["step"]) <= set(a["step"])  # same bin centres for both runs
    assert a["value"].mean() == pytest.approx(long_run["value"].mean())
    small = pd.DataFrame({"run": "a", "step": np.arange(50), "value": np.ones(50)})
    assert bin_steps(small, 100, by=["run"]) is small  # short runs are not touched


def test_collapse_marks_sit_on_the_smoothed_score(tmp_path):
    write_grid(tmp_path / "runs", ["m"], ["none", "all"], [0, 1], 100)
    runs = load_runs(tmp_path / "runs")
    cfg = CollapseConfig()
    table = stability_table(runs, cfg)
    marks = _collapse_points(runs, table, cfg.smooth_window, "critic/score/mean")
    collapsed = table[table["collapsed"]]
    assert len(marks) == len(collapsed) == 2
    assert sorted(marks["step"]) == sorted(collapsed["collapse_step"].astype(int))
    smooth = smoothed_frame(runs, ["critic/score/mean"], cfg.smooth_window)
    for mark in marks.itertuples():
        at = smooth[(smooth["ablation"] == mark.ablation) & (smooth["step"] == mark.step)]
        assert mark.value in set(at["value"])


def captured(monkeypatch):
    """Figures the analysis draws, kept instead of written: tests read what they show."""
    import analysis.figures as figures

    kept = {}
    monkeypatch.setattr(figures, "save_figure", lambda fig, out_dir, name: kept.setdefault(name, fig) and [])
    return kept


def test_score_figure_draws_each_ablations_seed_mean_of_smoothed_scores(tmp_path, monkeypatch):
    """The thick line of every (model, ablation) is the mean over seeds of each seed's trailing mean of
    critic/score/mean - recomputed here from the logs with pandas, not with the analysis' own code."""
    from analysis.config import AnalysisConfig
    from analysis.figures import make_figures

    write_grid(tmp_path / "runs", ["m1", "m2"], ["none", "all"], [0, 1, 2], 40)
    runs = load_runs(tmp_path / "runs")
    cfg = AnalysisConfig()
    kept = captured(monkeypatch)
    make_figures(runs, stability_table(runs, cfg.collapse), cfg, tmp_path / "fig")
    fig = kept["score"]
    window = cfg.collapse.smooth_window
    checked = 0
    for ax in fig.axes:
        if not ax.get_visible() or not ax.get_title():
            continue
        for line in ax.get_lines():
            ablation = line.get_label()
            per_seed = [r.wide["critic/score/mean"].rolling(window, min_periods=1).mean()
                        for r in runs if r.model == ax.get_title() and r.ablation == ablation]
            want = pd.concat(per_seed, axis=1).mean(axis=1)
            x, y = line.get_xdata(), line.get_ydata()
            assert np.allclose(y, want.loc[x].to_numpy()), (ax.get_title(), ablation)
            checked += 1
    assert checked == 4  # 2 models x 2 ablations
