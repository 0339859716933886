"""The fixes side by side (region alignment and the treatments of ``rla.names``), from files only: per model x
ablation (`per_model`) the loop's and the probe's mismatch, the cost (cost.py's JSON), the rollout time and
collapsed runs, with ratios "vs none" per model: ``treatments.csv`` and ``treatments.{png,pdf}``
(setup and results: studies/treatments/page.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.style import ablation_order, ablation_palette
from analysis.output import report_parser, write_tables

K3, PROBS = "rollout_corr/k3_kl", "training/rollout_probs_diff_mean"
GEN_S, LENGTH = "timing_s/gen", "response_length/mean"


def loop_mismatch(metrics: pd.DataFrame) -> pd.DataFrame:
    """model, ablation, k3_kl, probs_diff (mean |p_rollout - p_train|), runs: step means, averaged over seeds."""
    rows = metrics[metrics["metric"].isin([K3, PROBS]) & metrics["finite"]]
    per_run = rows.groupby(["model", "ablation", "run", "metric"], observed=True)["value"].mean().unstack("metric")
    out = per_run.groupby(["model", "ablation"], observed=True).agg(
        k3_kl=(K3, "mean"), probs_diff=(PROBS, "mean"), runs=(K3, "size"))
    return out.reset_index()


def rollout_time(metrics: pd.DataFrame) -> pd.DataFrame:
    """model, ablation, gen_s_per_token: the engine's seconds per mean response token of a step, median over
    steps after the first (the engine's warm-up), averaged over seeds. The grid's cells share the machine: the
    rows whose engine is stock's (all but ``engine_casts``) show how far apart equal engines land."""
    rows = metrics[metrics["metric"].isin([GEN_S, LENGTH]) & metrics["finite"] & (metrics["step"] > 1)]
    if set(rows["metric"].unique()) != {GEN_S, LENGTH}:  # logs without the engine's timing: no column
        return pd.DataFrame(columns=["model", "ablation", "gen_s_per_token"])
    steps = rows.pivot_table(index=["model", "ablation", "run", "step"], columns="metric", values="value",
                             observed=True)
    steps["gen_s_per_token"] = steps[GEN_S] / steps[LENGTH]
    per_run = steps.groupby(["model", "ablation", "run"], observed=True)["gen_s_per_token"].median()
    return per_run.groupby(["model", "ablation"], observed=True).mean().reset_index()


def probe_mismatch(probe: pd.DataFrame) -> pd.DataFrame:
    """model, ablation, probe_dlogprob: against the engine's own forward (the probe's main reference)."""
    rows = probe[probe["reference"] == "engine_forward"]
    return rows.rename(columns={"setting": "ablation", "mean_abs_dlogprob": "probe_dlogprob"})[
        ["model", "ablation", "probe_dlogprob"]]


def costs(bench: dict) -> pd.DataFrame:
    """model, ablation, update time and peak (seconds, bytes) and their ratios to none as cost.py measured them."""
    return pd.DataFrame([{"model": model, "ablation": ablation, "update_s": r["update_s_median"],
                          "update_time_vs_none": r["update_vs_none_median"], "update_peak_bytes": r["update_peak_bytes"],
                          "update_peak_vs_none": r["update_peak_vs_none"], "first_update_s": r["first_update_s"]}
                         for model, result in bench["models"].items() for ablation, r in result["ablations"].items()])


def stability(table: pd.DataFrame) -> pd.DataFrame:
    with_data = table[table["steps"] > 0]
    return with_data.groupby(["model", "ablation"], observed=True).agg(
        collapsed=("collapsed", "sum"), seeds=("collapsed", "size")).reset_index()


def per_model(tables: Path, bench: dict | None) -> pd.DataFrame:
    """Every measurement per model x ablation, with the mismatch ratios to none of the same model."""
    metrics = pd.read_parquet(tables / "metrics.parquet")
    parts = [rollout_time(metrics)] + [table(pd.read_csv(tables / name)) for name, table in
                                       (("stability.csv", stability), ("probe_subsets.csv", probe_mismatch))
                                       if (tables / name).exists()]
    frame = loop_mismatch(metrics)
    for part in parts + ([] if bench is None else [costs(bench)]):
        frame = frame.merge(part, on=["model", "ablation"], how="left")
    for column, ratio in (("k3_kl", "k3_kl_vs_none"), ("probs_diff", "probs_diff_vs_none"),
                          ("probe_dlogprob", "probe_dlogprob_vs_none"), ("gen_s_per_token", "rollout_time_vs_none")):
        if column in frame:
            stock = frame[frame["ablation"] == "none"].set_index("model")[column]
            frame[ratio] = frame[column] / frame["model"].map(stock)
    rank = {a: i for i, a in enumerate(ablation_order(set(frame["ablation"])))}
    return frame.sort_values(["ablation", "model"], key=lambda s: s.map(rank) if s.name == "ablation" else s,
                             ignore_index=True)


PANELS = (("k3_kl", "k3 KL, RL loop", True), ("probs_diff", "mean |p_rollout - p_train|, RL loop", True),
          ("update_time_vs_none", "update time / none", False),
          ("update_peak_vs_none", "update peak memory / none", False),
          ("rollout_time_vs_none", "rollout time per token / none", False))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One panel per measure; x = ablation (its colour), one marker per model, a bar at the median."""
    panels = [p for p in PANELS if p[0] in frame and frame[p[0]].notna().any()]
    ablations = ablation_order(set(frame["ablation"]))
    palette = ablation_palette(ablations)
    models = sorted(frame["model"].unique())
    fig, axes = figures.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.2), layout="constrained",
                                 squeeze=False)
    x = {a: i for i, a in enumerate(ablations)}
    for ax, (column, label, log_scale) in zip(axes[0], panels):
        for ablation, group in frame.groupby("ablation"):
            values = group[column].dropna()
            if values.empty:
                continue
            ax.bar(x[ablation], values.median(), color=palette[ablation], alpha=0.35, width=0.7)
        for marker, model in zip(MARKERS, models):
            rows = frame[(frame["model"] == model) & frame[column].notna()]
            ax.scatter([x[a] for a in rows["ablation"]], rows[column], marker=marker, s=16, color="0.15",
                       label=model, zorder=3)
        if log_scale:
            ax.set_yscale("log")
        else:
            ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
        ax.set_xticks(range(len(ablations)), ablations, rotation=60, ha="right", fontsize=7)
        ax.set_title(label, fontsize=8)
    axes[0, -1].legend(fontsize=6, title="model", title_fontsize=6)
    return figures.save_figure(fig, out_dir, "treatments")


def run(tables: str | Path, bench: str | Path | None, out_dir: str | Path) -> None:
    tables = Path(tables)
    if not (tables / "metrics.parquet").exists():
        raise FileNotFoundError(f"{tables / 'metrics.parquet'} not found: run the grid "
                                "(or `python -m analysis all`) first")
    if bench is not None and not Path(bench).exists():
        raise FileNotFoundError(f"{bench} not found: run `python -m studies run treatments` first")
    frame = per_model(tables, None if bench is None else json.loads(Path(bench).read_text()))
    write_tables(out_dir, {"treatments.csv": frame})
    plot(frame, out_dir)


def main(argv: list[str] | None = None) -> int:
    p = report_parser("treatments", "the fixes side by side: mismatch, cost, stability",
                      tables="a grid's tables (metrics.parquet, stability.csv, probe_subsets.csv)",
                      out="where treatments.{csv,png,pdf} go")
    p.add_argument("--bench", help="studies/treatments/published/cost.json (cost columns)")
    args = p.parse_args(argv)
    run(args.tables, args.bench, args.out)
    return 0
