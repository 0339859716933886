"""The per model x ablation summary of a stability table, with 95% intervals over seeds: Wilson for
the fraction collapsed, Student t for the final score and for its paired difference to `all` (same
seed = same prompts and sampling stream)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.series import t_quantile
from analysis.style import ablation_order, order

SUMMARY_COLUMNS = [
    "model", "ablation", "seeds", "seeds_with_data", "collapsed", "frac_collapsed",
    "frac_collapsed_low", "frac_collapsed_high",
    "median_collapse_step", "mean_peak_score", "mean_final_score", "final_score_low", "final_score_high",
    "final_minus_all", "final_minus_all_low", "final_minus_all_high", "k3_blowups",
    "median_max_k3_kl", "median_max_grad_norm",
]
REFERENCE = "all"  # paired differences are taken against the fully aligned cells of the same seeds


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a fraction k/n (sensible at k = 0 or n with few seeds)."""
    if n == 0:
        return np.nan, np.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def t_interval(values) -> tuple[float, float, float]:
    """(mean, low, high): 95% t-interval over seeds; the interval is the mean itself with one value."""
    values = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if not len(values):
        return np.nan, np.nan, np.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, mean, mean
    half = float(t_quantile(np.array([len(values) - 1]))[0] * values.std(ddof=1) / np.sqrt(len(values)))
    return mean, mean - half, mean + half


def summarize(stability: pd.DataFrame, models: tuple[str, ...] = (), ablations: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per (model, ablation). Runs without data count in ``seeds`` but not in the fractions."""
    rows = []
    final = stability[stability["steps"] > 0].set_index(["model", "ablation", "seed"])["final_score"]
    for (model, ablation), group in stability.groupby(["model", "ablation"], sort=False):
        with_data = group[group["steps"] > 0]
        n = len(with_data)
        steps = with_data["collapse_step"].dropna()
        k = int(with_data["collapsed"].sum())
        _, final_low, final_high = t_interval(with_data["final_score"])
        frac_low, frac_high = wilson_interval(k, n)
        paired = [final[(model, ablation, s)] - final[(model, REFERENCE, s)] for s in with_data["seed"]
                  if ablation != REFERENCE and (model, REFERENCE, s) in final.index]
        diff, diff_low, diff_high = t_interval(paired)
        rows.append({
            "model": model,
            "ablation": ablation,
            "seeds": len(group),
            "seeds_with_data": n,
            "collapsed": k,
            "frac_collapsed": float(with_data["collapsed"].mean()) if n else np.nan,
            "frac_collapsed_low": frac_low,
            "frac_collapsed_high": frac_high,
            "median_collapse_step": float(steps.median()) if len(steps) else np.nan,
            "mean_peak_score": float(with_data["peak_score"].mean()) if n else np.nan,
            "mean_final_score": float(with_data["final_score"].mean()) if n else np.nan,
            "final_score_low": final_low,
            "final_score_high": final_high,
            "final_minus_all": diff,  # paired by seed
            "final_minus_all_low": diff_low,
            "final_minus_all_high": diff_high,
            "k3_blowups": int(with_data["k3_blowup"].sum()),
            "median_max_k3_kl": float(with_data["max_k3_kl"].median()) if n else np.nan,
            "median_max_grad_norm": float(with_data["max_grad_norm"].median()) if n else np.nan,
        })
    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    if summary.empty:
        return summary
    model_rank = {m: i for i, m in enumerate(order(summary["model"].unique(), models))}
    abl_rank = {a: i for i, a in enumerate(ablation_order(summary["ablation"].unique(), ablations))}
    key = summary["model"].map(model_rank) * 1000 + summary["ablation"].map(abl_rank)
    return summary.iloc[np.argsort(key.to_numpy(), kind="stable")].reset_index(drop=True)
