"""Fits, shares, figures and tables of the mismatch scaling study from its CSV files only (what they show:
studies/scaling/page.md)."""

from __future__ import annotations

import logging
from pathlib import Path

from matplotlib.ticker import LogLocator, NullFormatter
import numpy as np
import pandas as pd

from analysis import figures
from analysis.figures import plt
from analysis.output import read_checked, report_parser, to_markdown, write_tables
from studies._shared.names import MAIN_REFERENCE
from studies._shared.shares import region_shares
from analysis.style import ABLATION_COLORS
from rla import names

log = logging.getLogger(__name__)

# factor -> x-axis label
FACTORS = {"depth": "layers", "width": "hidden size", "vocab": "vocabulary", "length": "response tokens",
           "sharpness": "output-layer scale", "attention": "q/k scale", "qk_bias": "q/k bias std (Qwen2)"}
METRICS = {"mean_abs_dlogprob": "mean |Δ logprob|", "k3_kl": "k3 KL per token",
           "seq_logratio_var": "var of sequence log-ratio", "frac_abs_d_gt_1e-2": "fraction |Δ| > 1e-2"}
ABLATIONS = ("none", *names.REGIONS, "all", *names.FORWARD_TREATMENTS)  # those present are drawn
# The error of one region alone: the setting that aligns the other two.
ALONE = {r: names.subset_name(set(names.REGIONS) - {r}) for r in names.REGIONS}
ARCH_STYLE = {"qwen2": "-", "qwen3": "--"}
REQUIRED = ["factor", "value", "arch", "setting", *METRICS]
POINT = ["factor", "value", "arch", "shape_name"]  # one measured point (shape_name: a real shape's, else empty)


def load_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `python -m studies run scaling --out {path.parent}` first")
    return read_checked(path, REQUIRED, float_precision="round_trip")  # the values as measured, to the last bit


def _treatment(setting: str) -> str:
    """A probe row's treatment, from the ablation registry: compiled layers or FP16 align no region."""
    entry = names.ABLATIONS.get(setting)
    return "" if entry is None else names.forward_treatment(entry.compiled, entry.precision == "fp16")


def point_shares(table: pd.DataFrame) -> pd.DataFrame:
    """Per point, the Shapley shares of the stock mean |Δ logprob| (`share_*`) and k3 (`k3_share_*`): one per
    region, the summation order's, what remains; a point without every region subset has none (a warning)."""
    rows = []
    if not {"regions", "reduction"} <= set(table.columns):
        log.warning("no shares: the table has no regions / reduction columns")
        return pd.DataFrame(rows)
    for key, point in table.assign(shape_name=table.get("shape_name", "")).fillna({"shape_name": ""}).groupby(
            POINT, sort=False):
        frame = point.assign(reference=MAIN_REFERENCE, treatment=point["setting"].map(_treatment))
        row = dict(zip(POINT, key))
        for metric, prefix in (("mean_abs_dlogprob", "share"), ("k3_kl", "k3_share")):
            try:
                shares = region_shares(frame, metric).set_index("component")["share"]
            except ValueError as err:
                log.warning("point %s: no shares: %s", row, err)
                break
            row.update({f"{prefix}_{r}": float(shares[r]) for r in names.REGIONS})
            row[f"{prefix}_summation_order"] = float(shares.get("summation order", np.nan))
            row[f"{prefix}_remaining"] = float(shares["remaining"])
        else:
            rows.append(row)
    return pd.DataFrame(rows)


FIT_COLUMNS = ["arch", "factor", "setting", "metric", "exponent", "r2", "n_points", "value_low", "value_high",
               "metric_low", "metric_high"]


def fit_exponents(table: pd.DataFrame) -> pd.DataFrame:
    """Slope of log(metric) on log(value) for every (arch, factor, setting, metric) with >= 3 positive
    points; `r2` says how well a power law describes the points."""
    rows = []
    ladder = table[table["factor"].isin(FACTORS)]
    for (arch, factor, setting), group in ladder.groupby(["arch", "factor", "setting"], sort=True):
        for metric in METRICS:
            g = group[(group[metric] > 0) & (group["value"] > 0)]
            if g["value"].nunique() < 3:
                continue
            x, y = np.log(g["value"].to_numpy(float)), np.log(g[metric].to_numpy(float))
            slope, intercept = np.polyfit(x, y, 1)
            residual = y - (slope * x + intercept)
            r2 = 1 - residual.var() / y.var() if y.var() > 0 else np.nan
            rows.append({"arch": arch, "factor": factor, "setting": setting, "metric": metric,
                         "exponent": slope, "r2": r2, "n_points": len(g), "value_low": g["value"].min(),
                         "value_high": g["value"].max(), "metric_low": float(g.loc[g["value"].idxmin(), metric]),
                         "metric_high": float(g.loc[g["value"].idxmax(), metric])})
    return pd.DataFrame(rows, columns=FIT_COLUMNS)


def scaling_figure(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One column per factor (log-log), one row per metric, one colour per ablation; Qwen2 solid, Qwen3 dashed."""
    factors = [f for f in FACTORS if f in set(table["factor"])]
    if not factors:
        raise ValueError(f"no factor of {list(FACTORS)} in the table; found {sorted(set(table['factor']))}")
    archs = sorted(set(table["arch"]))
    fig, axes = figures.subplots(len(METRICS), len(factors), squeeze=False,
                                 figsize=(2.6 * len(factors) + 1.6, 2.2 * len(METRICS)))
    for col, factor in enumerate(factors):
        data = table[table["factor"] == factor]
        for row, (metric, label) in enumerate(METRICS.items()):
            ax = axes[row, col]
            for arch in archs:
                for setting in ABLATIONS:
                    line = data[(data["arch"] == arch) & (data["setting"] == setting)].sort_values("value")
                    line = line[(line[metric] > 0) & (line["value"] > 0)]
                    if len(line):
                        ax.plot(line["value"], line[metric], ARCH_STYLE.get(arch, ":"), marker="o", ms=2.5,
                                color=ABLATION_COLORS[setting], lw=1.2)
            ax.set_xscale("log", base=2 if factor in ("depth", "attention") else 10)
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):  # unlabelled minor ticks: labelled ones overlap on short log axes
                axis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(numticks=5))
            if row == 0:
                ax.set_title(factor)
            if row == len(METRICS) - 1:
                ax.set_xlabel(FACTORS[factor])
            if col == 0:
                ax.set_ylabel(label)
    fig.subplots_adjust(left=0.07, right=1 - 1.5 / fig.get_figwidth(), top=0.95, bottom=0.08, wspace=0.35,
                        hspace=0.3)
    settings = set(table["setting"])
    handles = [plt.Line2D([], [], color=ABLATION_COLORS[a], lw=2, label=a) for a in ABLATIONS if a in settings]
    handles += [plt.Line2D([], [], color="0.3", ls=ARCH_STYLE.get(a, ":"), label=a) for a in archs]
    fig.legend(handles=handles, loc="center right", frameon=False, title="ablation / arch")
    return figures.save_figure(fig, out_dir, "mismatch_scaling")


def where_table(by_position: pd.DataFrame, by_probability: pd.DataFrame, point: dict) -> pd.DataFrame:
    """Per error (none, each region alone, all): its growth with position (log-log slope of mean |d|
    over the position bins), first and last bin, and its size on unlikely vs likely tokens."""
    pos, prob = (frame[(frame[list(point)] == pd.Series(point)).all(axis=1)] for frame in (by_position, by_probability))
    rows = []
    for name, setting in {"none": "none", **{f"{r} alone": s for r, s in ALONE.items()}, "all": "all"}.items():
        g = pos[pos["setting"] == setting].sort_values("position_low")
        mid = (g["position_low"] + g["position_high"] + 1) / 2
        mean_abs, signed = g["mean_abs_dlogprob"], g["mean_dlogprob"]
        keep = mean_abs > 0
        slope = np.polyfit(np.log(mid[keep]), np.log(mean_abs[keep]), 1)[0] if keep.sum() >= 3 else np.nan
        pr = prob[prob["setting"] == setting]
        unlikely, likely = pr[pr["p_high"] <= 0.1], pr[pr["p_low"] >= 0.9]
        rows.append({"error_of": name, "setting": setting, "position_slope": slope,
                     "abs_first_bin": float(mean_abs.iloc[0]), "abs_last_bin": float(mean_abs.iloc[-1]),
                     "last_bin": f"{int(g['position_low'].iloc[-1])}-{int(g['position_high'].iloc[-1])}",
                     "signed_first_bin": float(signed.iloc[0]), "signed_last_bin": float(signed.iloc[-1]),
                     "abs_p_below_0.1": _weighted(unlikely), "abs_p_above_0.9": _weighted(likely)})
    return pd.DataFrame(rows)


def _weighted(frame: pd.DataFrame) -> float:
    n = frame["n_tokens"].sum()
    return float((frame["mean_abs_dlogprob"] * frame["n_tokens"]).sum() / n) if n else np.nan


def fits_markdown(fits: pd.DataFrame) -> str:
    """Exponents of none, rope and all per factor and arch, one column per metric."""
    metrics = ("mean_abs_dlogprob", "k3_kl", "seq_logratio_var")
    keep = fits[fits["setting"].isin(["none", "rope", "all"]) & fits["metric"].isin(metrics)]
    if keep.empty:
        return "No factor has 3 or more points with a positive metric: nothing to fit.\n"
    wide = keep.pivot_table(index=["factor", "arch", "setting"], columns="metric", values="exponent").reset_index()
    return to_markdown(wide[["factor", "arch", "setting", *[m for m in metrics if m in wide.columns]]],
                       float_format="{:.2f}")


def main(argv: list[str] | None = None) -> int:
    args = report_parser("scaling", __doc__, tables="dir with mismatch_scaling.csv (+ _by_position, _by_probability)",
                         out="output dir, e.g. results/studies/scaling/report").parse_args(argv)
    table = load_table(args.tables / "mismatch_scaling.csv")
    fits, shares = fit_exponents(table), point_shares(table)
    report = {"mismatch_scaling_fits.csv": fits, "mismatch_scaling_fits.md": fits_markdown(fits)}
    if len(shares):
        report["mismatch_scaling_shares.csv"] = shares
    pos_path, prob_path = (args.tables / f"mismatch_scaling_by_{name}.csv" for name in ("position", "probability"))
    if pos_path.exists() and prob_path.exists():
        pos, prob = pd.read_csv(pos_path), pd.read_csv(prob_path)
        lengths = pos[pos["factor"] == "length"]
        if len(lengths):  # the longest responses of the first arch: the widest range of positions
            arch = sorted(set(lengths["arch"]))[0]
            point = {"factor": "length", "arch": arch, "value": lengths[lengths["arch"] == arch]["value"].max()}
            report["mismatch_where.csv"] = where = where_table(pos, prob, point)
            report["mismatch_where.md"] = to_markdown(where, float_format="{:.3g}")
    write_tables(args.out, report)
    scaling_figure(table, args.out)
    return 0
