"""Small numeric helpers shared by collapse detection and figures: smoothing, thinning, mean + CI."""

from __future__ import annotations

import numpy as np
import pandas as pd


def finite_series(frame: pd.DataFrame, metric: str) -> pd.Series:
    """The logged, finite values of ``metric`` (index: step); empty when the metric is absent."""
    if metric not in frame.columns:
        return pd.Series(dtype=np.float64, index=pd.Index([], dtype=np.int64, name="step"))
    column = frame[metric]
    return column[np.isfinite(column.to_numpy())]


def trailing_mean(values: np.ndarray, window: int, full_windows_only: bool = False) -> np.ndarray:
    """Mean of each point and the ``window - 1`` points before it (fewer at the start).

    Trailing (causal) so that a smoothed value at step t uses nothing after t. With
    ``full_windows_only`` the first ``window - 1`` points are dropped instead of averaged over
    fewer points.
    """
    values = np.asarray(values, dtype=np.float64)
    if not len(values):
        return values
    sums = np.convolve(values, np.ones(window), "full")[: len(values)]
    means = sums / np.minimum(np.arange(1, len(values) + 1), window)
    return means[window - 1:] if full_windows_only else means


def smooth(values: pd.Series, window: int, full_windows_only: bool = False) -> pd.Series:
    """:func:`trailing_mean` over the logged points of ``values`` (index: step)."""
    means = trailing_mean(values.to_numpy(), window, full_windows_only)
    return pd.Series(means, index=values.index[len(values) - len(means):], dtype=np.float64)


def bin_steps(frame: pd.DataFrame, max_points: int, by: list[str]) -> pd.DataFrame:
    """Average ``value`` into at most ``max_points`` equal-width step bins per ``by`` group.

    Applied after smoothing, so long runs plot in constant time and still follow the smoothed
    curve. Bins are shared by all runs (fixed width from the overall first step), so seeds stay
    aligned even when one run stopped early or logged on a sparser grid. ``step`` becomes the bin's
    centre; with ``max_points`` covering every step the frame comes back unchanged.
    """
    if frame.empty:
        return frame
    steps = frame["step"].to_numpy()
    first, last = int(steps.min()), int(steps.max())
    width = max(1, -(-(last - first + 1) // max_points)) if max_points > 0 else 1
    if width == 1:
        return frame
    binned = frame.assign(step=first + ((steps - first) // width) * width + (width - 1) / 2)
    return binned.groupby([*by, "step"], observed=True, sort=False)["value"].mean().reset_index()


def mean_ci(frame: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Mean and a 95% t-interval of ``value`` over seeds, per ``by`` group.

    Computed in one groupby instead of seaborn's bootstrap, which is slow over many points. With a
    single seed the interval collapses onto the mean.
    """
    grouped = frame.groupby(by, observed=True, sort=True)[value]
    out = grouped.agg(["mean", "std", "count"]).reset_index()
    n = out["count"].to_numpy()
    half = np.zeros(len(out))
    many = n > 1
    if many.any():
        half[many] = t_quantile(n[many] - 1) * out["std"].to_numpy()[many] / np.sqrt(n[many])
    out["low"] = out["mean"] - half
    out["high"] = out["mean"] + half
    return out


# Two-sided 95% Student-t quantiles by degrees of freedom (dof beyond the last row use 1.96).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
        18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980,
        10**9: 1.960}
_T95_DOF = np.array(sorted(_T95))
_T95_VALUE = np.array([_T95[d] for d in _T95_DOF])


def t_quantile(dof: np.ndarray) -> np.ndarray:
    """Two-sided Student-t quantile for a 95% interval (between table rows: the more conservative)."""
    rows = np.searchsorted(_T95_DOF, np.asarray(dof), side="right") - 1
    return _T95_VALUE[np.clip(rows, 0, len(_T95_DOF) - 1)]
