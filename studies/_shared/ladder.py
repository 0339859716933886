"""The depth measurement's rows and their pooling over seeds (no torch): the depth and leftover reports'
tables. Columns: studies/depth/page.md (Result)."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pandas as pd

BOOTSTRAP, LEVEL = 2000, 0.95
KEYS = ["arch", "layers", "width", "hidden_size", "kernels", "spec", "target", "reduction"]


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
    """LEVEL percentile intervals of the pooled sequence log-ratio's mean, variance and variance over stock's;
    resampled within each seed, each pair (this setting, stock) drawn together."""
    drawn = np.concatenate([p[rng.integers(0, len(p), (BOOTSTRAP, len(p)))] for p in pairs], axis=1)
    var = drawn.var(axis=1, ddof=1)  # (BOOTSTRAP, 2)
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample of a few equal sequences: no variance
        ratio = var[:, 0] / var[:, 1]
    stats = {"seq_mean": drawn[:, :, 0].mean(axis=1), "seq_var": var[:, 0], "seq_var_vs_none": ratio}
    tails = [50 * (1 - LEVEL), 100 - 50 * (1 - LEVEL)]
    return {name: tuple(float(v) for v in np.percentile(values, tails)) for name, values in stats.items()}


def ladder(frame: pd.DataFrame, sums: dict) -> pd.DataFrame:
    """Per KEYS, over seeds: k3 and bit-equal fraction (mean, min, max), `k3_vs_none` (mean per-seed stock k3
    over this one's), the sequence log-ratio pooled: mean, variance, variance over stock's, paired intervals."""
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
