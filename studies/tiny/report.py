"""The tiny grid's headline: per model and ablation, the mean over logged steps and seeds of the mismatch the
RL loop logged (METRICS), and each ablation's ratio to `none` (headline.csv, headline.md); no torch."""

from __future__ import annotations

import pandas as pd

from analysis.output import report_parser, to_markdown, write_tables
from rla.names import ABLATIONS

METRICS = {"rollout_corr/k3_kl": "k3 KL", "training/rollout_probs_diff_mean": "mean abs(p_rollout - p_train)"}


def headline(tidy: pd.DataFrame) -> pd.DataFrame:
    """One row per model x ablation: each metric's mean over finite values, and `none`'s over it."""
    missing = sorted(set(METRICS) - set(tidy["metric"]))
    if missing:
        raise ValueError(f"the metrics table has no {missing}; it holds {sorted(set(tidy['metric']))[:20]}")
    logged = tidy[tidy["metric"].isin(METRICS) & tidy["finite"]]
    logged = logged.assign(model=logged["model"].astype(str), ablation=logged["ablation"].astype(str))  # not categories
    means = logged.pivot_table(index=["model", "ablation"], columns="metric", values="value", aggfunc="mean",
                               observed=True)
    table = means.rename(columns=METRICS).reset_index()
    order = {name: i for i, name in enumerate(ABLATIONS)}  # the ablations in the suite's order
    table = table.sort_values(["model", "ablation"], key=lambda c: c.map(order) if c.name == "ablation" else c)
    table = table.reset_index(drop=True)
    for name in METRICS.values():
        none = table[table["ablation"] == "none"].set_index("model")[name]
        table[f"{name}: none / ablation"] = table["model"].map(none) / table[name]
    return table


def main(argv: list[str] | None = None) -> int:
    args = report_parser("tiny", __doc__, tables="the grid's tables (metrics.parquet)",
                         out="where headline.csv and headline.md go").parse_args(argv)
    table = headline(pd.read_parquet(args.tables / "metrics.parquet"))
    write_tables(args.out, {"headline.csv": table, "headline.md": to_markdown(table, float_format="{:.2g}")})
    return 0
