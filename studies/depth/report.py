"""The depth study's tables and figure, from its measurement's JSON only (no torch).

`points.csv` per point x training attention x setting, `ladder.csv` over seeds (`ladder`), `depth.png`: k3 and
the sequence log-ratio variance against depth. Columns: studies/depth/page.md (Result).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.figures import sns
from analysis.output import report_parser, write_tables
from studies._shared.ladder import ladder, points

ATTENTION = {"attention": "FP32 attention rounded once", "hf": "transformers' SDPA"}
LINES = (  # (spec, target, reduction) -> label, drawn on the ladder
    (("none", "vllm-cpu", "eager"), "none"),
    (("rope", "vllm-cpu", "eager"), "rope"),
    (("all", "vllm-cpu", "eager"), "all"),
    (("all", "vllm-cpu", "inductor_cpu"), "all, engine order"),
    (("all", "vllm", "eager"), "all, target vllm"),
)


def plot(table: pd.DataFrame, out_dir: Path) -> list[Path]:
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
