"""summary.md: one section per step, each table beside its parquet file, the verdict, the figure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from diagnose import metrics, report

STATS = ["k3", "mean_abs_dlogprob", "bit_equal", "seq_logratio_var", "max_abs_dlogprob", "tokens", "sequences"]


def with_intervals(frame: pd.DataFrame) -> pd.DataFrame:
    """Each statistic with a bootstrap interval shown as `value [low, high]` (the parquet keeps three columns)."""
    frame = frame.copy()
    for name in metrics.STATISTICS:
        if name in frame:
            frame[name] = [f"{v:.3g} [{lo:.3g}, {hi:.3g}]" for v, lo, hi in
                           zip(frame[name], frame[f"{name}_low"], frame[f"{name}_high"])]
    return frame


def write(out: Path, run: dict, tables: dict[str, pd.DataFrame], decided: dict | None, stopped: str | None) -> None:
    files = report.write_tables(out, tables)
    lines = report.header(run)
    weights = tables["weights"]
    lines += ["## 1. Weights: the engine's loaded model against the checkpoint", ""]
    differing = weights[weights["equal"] == False]  # noqa: E712 (None: not read)
    unreadable = weights[weights["equal"].isna()]
    lines.append(f"{len(weights)} tensors compared; read: "
                 + ", ".join(f"{n} {how}" for how, n in weights["read"].value_counts().items()) + ".")
    if len(unreadable):
        lines.append(f"Could not be read back from the engine: {', '.join(unreadable['tensor'])}.")
    if len(differing):
        lines += ["", f"**{len(differing)} tensor(s) differ; the diagnosis stops here** (no rounding alignment can "
                      "fix a weight):", "",
                  report.table(differing, ["tensor", "checkpoint", "read", "differing", "max_abs", "missing"])]
    else:
        lines.append("Every tensor read equals the checkpoint's (cast to the engine's dtype), bit for bit.")
    lines.append("")
    if stopped is None:
        lines += section_engine(tables) + section_mismatch(tables, decided)
        lines += section_layers(tables, run["settings"]["layer trace"])
        lines += ["## 5. Verdict", "", decided["text"], ""]
        figure = report.figure(out, tables["mismatch"], tables["by_position"], tables.get("layers"))
        lines += [f"![mismatch per spec, by position and by layer]({figure})", ""]
    lines += ["## Files", "", ", ".join(files), ""]
    (out / "summary.md").write_text("\n".join(lines))


def section_engine(tables) -> list[str]:
    return ["## 2. The engine against itself", "",
            "`prefill_vs_sampling`: its sampling logprobs against its own teacher-forced prefill of the same tokens "
            "(d = prefill - sampling). `small_batch_vs_batch`: the same seeded requests decoded at the small batch "
            "against all at once, over each response up to where the two sample differently. No training-side "
            "change removes either.", "",
            report.table(with_intervals(tables["engine_self"]),
                         ["comparison"] + STATS + ["sequences_sampled_differently"]), ""]


def section_mismatch(tables, decided) -> list[str]:
    main = tables["mismatch"]
    lines = ["## 3. The mismatch as the RL loop sees it", "",
             f"The training side (transformers, BF16 parameters and FP32 buffers) scores the engine's tokens "
             f"teacher-forced, stock (`none`) and under each region subset at target `{decided['target']}`; "
             "d = logp_train - logp_engine per response token; intervals: 95% bootstrap over sequences.", ""]
    for reference in ("engine_sampling", "engine_prefill"):
        rows = with_intervals(main[main["reference"] == reference])
        lines += [f"Against `{reference}`:", "", report.table(rows, ["spec"] + STATS), ""]
    spec = decided["spec"]
    for name, columns in (("by_position", ["position_low", "position_high"]), ("by_probability", ["p_low", "p_high"])):
        frame = tables[name]
        lines += [f"`{spec}` {name.replace('_', ' ')} (all specs: {name}.parquet):", "",
                  report.table(frame[frame["spec"] == spec], columns + ["tokens", "k3", "mean_abs_dlogprob",
                                                                         "bit_equal", "share_of_abs_dlogprob"]), ""]
    return lines


def section_layers(tables, run_layer_trace: str) -> list[str]:
    if "layers" not in tables:
        return ["## 4. Where the two sides part", "", f"Layer trace {run_layer_trace}.", ""]
    return ["## 4. Where the two sides part, layer by layer", "",
            "At each layer's attention op, the values both sides hold (q, k, v after RoPE, attention output), on "
            "prompts decoded alone. vLLM's MLP output and residual are inside its compiled graph and not read: a "
            "first difference is placed in the segment it arose in (see layers.parquet for every layer and "
            "first_divergence.parquet per sequence).", "",
            report.table(tables["first_summary"]), "",
            "Growth of the attention output's relative L2 difference by layer:", "",
            report.table(tables["layers"][tables["layers"]["value"] == "out"].pivot(
                index="layer", columns="spec", values="rel_l2").reset_index()), ""]
