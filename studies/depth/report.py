"""The depth study's tables and figure, from its measurement's JSON only (no torch).

    python -m studies report depth --result depth.json --out DIR

`points.csv`: one row per point (architecture, layers, seed; or a paper width) x training-side attention x
setting (region subset, target, summation order). `ladder.csv`: the same over seeds, with the sequence
log-ratio's LEVEL bootstrap intervals (`ladder`). `depth.png` / `.pdf`: k3 and the sequence log-ratio
variance against depth. What each column shows: studies/depth/page.md (Result).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.output import report_parser, write_tables

BOOTSTRAP, LEVEL = 2000, 0.95
KEYS = ["arch", "layers", "width", "hidden_size", "kernels", "spec", "target", "reduction"]
ATTENTION = {"attention": "FP32 attention rounded once", "hf": "transformers' SDPA"}


def points(result: dict) -> tuple[pd.DataFrame, dict]:
    """The per-point rows, and each row's per-sequence sums keyed by (point, kernels, row index)."""
    rows, sums = [], {}
    for point, entry in result["shapes"].items():
        shape = entry["shape"]
        width = "ladder" if shape["hidden_size"] == 256 else point  # the hidden-256 ladder, or a paper width
        for kernels, scored in entry["vllm"]["rows"].items():
            for i, row in enumerate(scored):
                rows.append({"point": point, "arch": shape["arch"], "layers": shape["num_hidden_layers"],
                             "width": width, "hidden_size": shape["hidden_size"], "seed": entry["seed"],
                             "kernels": kernels, "index": i, **row})
                sums[(point, kernels, i)] = np.asarray(entry["sequences"][kernels][i])
    return pd.DataFrame(rows), sums


def _intervals(pairs: list[np.ndarray], rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """LEVEL percentile intervals of the pooled sequence log-ratio's mean and variance and of its variance
    over stock's; sequences resampled within each seed, each pair (this setting, stock) drawn together."""
    drawn = np.concatenate([p[rng.integers(0, len(p), (BOOTSTRAP, len(p)))] for p in pairs], axis=1)
    var = drawn.var(axis=1, ddof=1)  # (BOOTSTRAP, 2)
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample of a few equal sequences: no variance
        ratio = var[:, 0] / var[:, 1]
    stats = {"seq_mean": drawn[:, :, 0].mean(axis=1), "seq_var": var[:, 0], "seq_var_vs_none": ratio}
    tails = [50 * (1 - LEVEL), 100 - 50 * (1 - LEVEL)]
    return {name: tuple(float(v) for v in np.percentile(values, tails)) for name, values in stats.items()}


def ladder(frame: pd.DataFrame, sums: dict) -> pd.DataFrame:
    """Per architecture x layers x attention x setting, over seeds: k3 and the bit-equal fraction (mean, min,
    max); `k3_vs_none`, the mean per-seed ratio of stock's k3 to this setting's (infinite where it is 0); the
    sequence log-ratio (the sum of a sequence's log(train / engine)) pooled over seeds: mean and variance,
    and the variance over stock's, with paired intervals (both settings score the same sequences)."""
    out = []
    stock_rows = frame[(frame["spec"] == "none") & (frame["target"] == "vllm-cpu")]
    stock_of = {(r.point, r.kernels, r.reduction): r for r in stock_rows.itertuples()}
    for key, group in frame.groupby(KEYS, sort=True):
        stocks = [stock_of[(r.point, r.kernels, r.reduction)] for r in group.itertuples()]
        pairs = [np.stack([sums[(r.point, r.kernels, r.index)], sums[(s.point, s.kernels, s.index)]], axis=1)
                 for r, s in zip(group.itertuples(), stocks)]
        pooled = np.concatenate(pairs)
        row = dict(zip(KEYS, key))
        row.update(seeds=len(group), sequences=len(pooled), interval_level=LEVEL,
                   k3=group["k3"].mean(), k3_min=group["k3"].min(), k3_max=group["k3"].max(),
                   k3_vs_none=float(np.mean([s.k3 / k if k else np.inf for s, k in zip(stocks, group["k3"])])),
                   bit_equal=group["bit_equal"].mean(), bit_equal_min=group["bit_equal"].min(),
                   bit_equal_max=group["bit_equal"].max(), mean_abs=group["mean_abs"].mean(),
                   max_abs=group["max_abs"].max(),
                   seq_mean=float(pooled[:, 0].mean()), seq_var=float(pooled[:, 0].var(ddof=1)),
                   seq_var_none=float(pooled[:, 1].var(ddof=1)))
        row["seq_var_vs_none"] = row["seq_var"] / row["seq_var_none"]
        # resamples seeded by the row's own key: its interval does not move when the table gains other rows
        rng = np.random.default_rng(zlib.crc32(json.dumps([str(k) for k in key]).encode()))
        for name, (low, high) in _intervals(pairs, rng).items():
            row[f"{name}_low"], row[f"{name}_high"] = low, high
        out.append(row)
    return pd.DataFrame(out)


LINES = (  # (spec, target, reduction) -> label, drawn on the ladder
    (("none", "vllm-cpu", "eager"), "none"),
    (("rope", "vllm-cpu", "eager"), "rope"),
    (("all", "vllm-cpu", "eager"), "all"),
    (("all", "vllm-cpu", "inductor_cpu"), "all, engine order"),
    (("all", "vllm", "eager"), "all, target vllm"),
)


def plot(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    from analysis import figures
    from analysis.figures import sns

    ladder_rows = table[table["width"] == "ladder"]
    lines = dict(list(ladder_rows.groupby(["kernels", "spec", "target", "reduction", "arch"])))
    colors = dict(zip([label for _, label in LINES], sns.color_palette("colorblind", len(LINES))))
    fig, axes = figures.subplots(2, 2, figsize=(8, 6), layout="constrained", sharex=True)
    for col, kernels in enumerate(("attention", "hf")):
        for (spec, target, reduction), label in LINES:
            for arch, style in (("qwen2", "-"), ("qwen3", "--")):
                if (kernels, spec, target, reduction, arch) not in lines:
                    continue
                rows = lines[(kernels, spec, target, reduction, arch)].sort_values("layers")
                axes[0, col].plot(rows["layers"], rows["k3"], style, marker="o", ms=3, color=colors[label],
                                  label=label if arch == "qwen2" else None)
                axes[1, col].plot(rows["layers"], rows["seq_var"], style, marker="o", ms=3, color=colors[label])
                axes[1, col].fill_between(rows["layers"], rows["seq_var_low"], rows["seq_var_high"],
                                          color=colors[label], alpha=0.15, linewidth=0)
        axes[0, col].set_title(f"training-side attention: {ATTENTION[kernels]}", fontsize=8)
        rungs = sorted(ladder_rows["layers"].unique())
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(rungs, [str(n) for n in rungs])
            ax.minorticks_off()
        axes[1, col].set_xlabel("decoder layers (hidden 256)")
    axes[0, 0].set_ylabel("k3 per token")
    axes[1, 0].set_ylabel("sequence log-ratio variance")
    axes[0, 0].legend(fontsize=7, title="solid Qwen2, dashed Qwen3", title_fontsize=7)
    return figures.save_figure(fig, out_dir, "depth")


def main(argv: list[str] | None = None) -> int:
    args = report_parser("depth", __doc__, result="the measurement's JSON (python -m studies run depth)",
                         out="where points.csv, ladder.csv and depth.{png,pdf} go").parse_args(argv)
    frame, sums = points(json.loads(args.result.read_text()))
    table = ladder(frame, sums)
    write_tables(args.out, {"points.csv": frame.drop(columns=["index"]), "ladder.csv": table})
    plot(table, args.out)
    return 0
