"""What `all` leaves at depth, by component: its tables and figure from the depth study's JSON (no torch).

`points.csv`, `summary.csv`: as depth's `points.csv` and `ladder.csv`; `shares.csv`: `shares`; `leftover.png`:
`all`'s k3 per training kernels set and summation order, against stock's (studies/leftover/page.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.figures import plt, sns
from analysis.output import report_parser, write_tables
from analysis.style import apply_theme
from studies._shared.ladder import ladder, points

BASELINE = ("attention", "inductor_cpu")  # the depth goal's condition
# the training kernels a share is measured with, in the figure's order (what each swaps in:
# studies/_shared/scoring.py TRAINING_KERNELS)
SWAPS = ("engine_attention", "engine_gemm", "engine", "engine_steps", "amx_rounding", "amx_rounding_engine_gemm")
ORDERS = {"eager": "eager order", "inductor_cpu": "engine order", "vllm_cpu_graph": "engine graph's order"}


def shares(frame: pd.DataFrame) -> pd.DataFrame:
    """Per point x kernels x order of `all` at vllm-cpu: k3, bit-equal fraction and `left`, this k3 over
    BASELINE's on the same samples, over seeds. With one engine kernel swapped in, `1 - left` is its share."""
    aligned = frame[(frame["spec"] == "all") & (frame["target"] == "vllm-cpu")]
    point = ["arch", "width", "layers"]
    baseline = aligned[(aligned["kernels"] == BASELINE[0]) & (aligned["reduction"] == BASELINE[1])]
    k3_of = baseline.set_index(["point"])["k3"]
    rows = aligned.assign(left=aligned["k3"] / aligned["point"].map(k3_of))
    table = rows.groupby([*point, "kernels", "reduction"]).agg(
        seeds=("seed", "size"), k3=("k3", "mean"), bit_equal=("bit_equal", "mean"), left=("left", "mean"),
        left_min=("left", "min"), left_max=("left", "max"))
    return table.reset_index()


def plot(summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    apply_theme()
    rows = summary[(summary["target"] == "vllm-cpu") & (summary["spec"] == "all")].copy()
    rows["point"] = rows["arch"] + ", " + rows["width"].where(rows["width"] != "ladder", "hidden 256")
    rows["order"] = rows["reduction"].map(ORDERS)
    order = [k for k in ("hf", "attention", *SWAPS) if k in set(rows["kernels"])]
    grid = sns.catplot(rows, kind="bar", x="kernels", y="k3", hue="order", col="point", col_wrap=2, order=order,
                       palette="colorblind", height=3.2, aspect=1.4, sharey=False)
    stock = summary[(summary["spec"] == "none") & (summary["kernels"] == "hf") & (summary["reduction"] == "eager")]
    for (point_name, ax) in grid.axes_dict.items():
        arch, width = point_name.split(", ")
        level = stock[(stock["arch"] == arch) & (stock["width"] == ("ladder" if width == "hidden 256" else width))]
        if len(level):
            ax.axhline(level["k3"].iloc[0], color="0.3", ls="--", lw=1, label="stock, SDPA")
        ax.set_yscale("log")
        plt.setp(ax.get_xticklabels(), rotation=35, ha="right", fontsize=7)
    grid.set_titles("{col_name}")
    grid.set_axis_labels("training kernels", "k3 per token under all")
    grid.figure.tight_layout()  # the rotated kernel names below the lower panels
    return figures.save_figure(grid.figure, out_dir, "leftover")


def main(argv: list[str] | None = None) -> int:
    args = report_parser("leftover", __doc__, result="the measurement's JSON (python -m studies run depth ...)",
                         out="where the tables and leftover.{png,pdf} go").parse_args(argv)
    frame, sums = points(json.loads(args.result.read_text()))
    summary = ladder(frame, sums)
    write_tables(args.out, {"points.csv": frame.drop(columns=["index"]), "summary.csv": summary,
                            "shares.csv": shares(frame)})
    plot(summary, args.out)
    return 0
