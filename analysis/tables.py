"""The per model x ablation summary of a stability table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.style import ablation_order, order

SUMMARY_COLUMNS = [
    "model", "ablation", "seeds", "seeds_with_data", "collapsed", "frac_collapsed",
    "median_collapse_step", "mean_peak_score", "mean_final_score", "k3_blowups",
    "median_max_k3_kl", "median_max_grad_norm",
]


def summarize(stability: pd.DataFrame, models: tuple[str, ...] = (), ablations: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per (model, ablation). Runs without data count in ``seeds`` but not in the fractions."""
    rows = []
    for (model, ablation), group in stability.groupby(["model", "ablation"], sort=False):
        with_data = group[group["steps"] > 0]
        n = len(with_data)
        steps = with_data["collapse_step"].dropna()
        rows.append({
            "model": model,
            "ablation": ablation,
            "seeds": len(group),
            "seeds_with_data": n,
            "collapsed": int(with_data["collapsed"].sum()),
            "frac_collapsed": float(with_data["collapsed"].mean()) if n else np.nan,
            "median_collapse_step": float(steps.median()) if len(steps) else np.nan,
            "mean_peak_score": float(with_data["peak_score"].mean()) if n else np.nan,
            "mean_final_score": float(with_data["final_score"].mean()) if n else np.nan,
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
