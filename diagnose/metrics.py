"""Per-token mismatch between two logprob sources on the same tokens, as an RL loop's rollout correction
reads it (d = logp_train - logp_engine; k3 = exp(d) - 1 - d, an estimate of KL(engine || train) on the
engine's samples), with intervals from a bootstrap over sequences (tokens of one sequence are not
independent), and the mismatch by position and by the token's probability."""

from __future__ import annotations

import numpy as np
import pandas as pd

BOOTSTRAP, LEVEL = 1000, 0.95
# the probe study's bins of the engine's probability of the token (low-probability tokens carry the
# largest errors); the last bin closes at 1
PROBABILITY_EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 1.0)
STATISTICS = ("k3", "mean_abs_dlogprob", "bit_equal", "seq_logratio_var")


def tokens(got: list[list[float]], ref: list[list[float]], prompt_lengths: list[int]) -> pd.DataFrame:
    """One row per token: its sequence, its position in prompt + response, d, k3, the reference's probability."""
    seq, pos, a, b = [], [], [], []
    for i, (g, r, n) in enumerate(zip(got, ref, prompt_lengths)):
        if len(g) != len(r):
            raise ValueError(f"sequence {i}: {len(g)} logprobs against {len(r)}")
        seq += [i] * len(g)
        pos += range(n, n + len(g))
        a += g
        b += r
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)  # exact copies of fp32 values
    d = a - b
    return pd.DataFrame({"sequence": seq, "position": pos, "d": d, "abs_d": np.abs(d), "k3": np.expm1(d) - d,
                         "bit_equal": d == 0, "p_ref": np.exp(b)})


def _per_sequence(frame: pd.DataFrame, n_sequences: int) -> dict[str, np.ndarray]:
    g = frame.groupby("sequence")
    out = {"n": g.size(), "k3": g["k3"].sum(), "abs": g["abs_d"].sum(), "eq": g["bit_equal"].sum(), "d": g["d"].sum()}
    return {k: v.reindex(range(n_sequences), fill_value=0).to_numpy(dtype=np.float64) for k, v in out.items()}


def _statistics(s: dict[str, np.ndarray], index: np.ndarray) -> np.ndarray:
    """STATISTICS for the sequences `index` ((B, N) resamples, or (1, N) the sample itself)."""
    n = s["n"][index].sum(1)
    d = s["d"][index]
    has = s["n"][index] > 0  # a sequence with no tokens has no log-ratio
    count = has.sum(1)
    mean = (d * has).sum(1) / np.maximum(count, 1)
    var = ((d - mean[:, None]) ** 2 * has).sum(1) / np.maximum(count - 1, 1)
    return np.stack([s["k3"][index].sum(1) / n, s["abs"][index].sum(1) / n, s["eq"][index].sum(1) / n, var], 1)


def summary(frame: pd.DataFrame, n_sequences: int, seed: int = 0) -> dict[str, float]:
    """Each statistic with its bootstrap interval (LEVEL, percentile, resampling sequences)."""
    s = _per_sequence(frame, n_sequences)
    point = _statistics(s, np.arange(n_sequences)[None])[0]
    rng = np.random.default_rng(seed)
    boot = _statistics(s, rng.integers(0, n_sequences, (BOOTSTRAP, n_sequences)))
    lo, hi = np.nanquantile(boot, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=0)
    out = {"tokens": int(s["n"].sum()), "sequences": n_sequences, "max_abs_dlogprob": float(frame["abs_d"].max())}
    for j, name in enumerate(STATISTICS):
        out.update({name: float(point[j]), f"{name}_low": float(lo[j]), f"{name}_high": float(hi[j])})
    return out


def _binned(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    g = frame.groupby(key, observed=True, sort=True)
    out = g.agg(tokens=("abs_d", "size"), k3=("k3", "mean"), mean_abs_dlogprob=("abs_d", "mean"),
                mean_dlogprob=("d", "mean"), bit_equal=("bit_equal", "mean"), sum_abs=("abs_d", "sum"))
    total = out["sum_abs"].sum()
    out["share_of_abs_dlogprob"] = out["sum_abs"] / total if total > 0 else 0.0
    return out.drop(columns="sum_abs").reset_index()


def by_position(frame: pd.DataFrame, width: int, aggregate=_binned) -> pd.DataFrame:
    """`aggregate(frame with a bin column, "bin")` per `width` positions, with each bin's first and last."""
    out = aggregate(frame.assign(bin=frame["position"] // width), "bin")
    out.insert(1, "position_low", out["bin"] * width)
    out.insert(2, "position_high", out["bin"] * width + width - 1)
    return out.drop(columns="bin")


def by_probability(frame: pd.DataFrame, aggregate=_binned) -> pd.DataFrame:
    """`aggregate(frame with a bin column, "bin")` per bin of PROBABILITY_EDGES of the reference's probability."""
    edges = np.asarray(PROBABILITY_EDGES)
    index = np.clip(np.searchsorted(edges, frame["p_ref"].to_numpy(), side="right") - 1, 0, len(edges) - 2)
    out = aggregate(frame.assign(bin=index), "bin")
    out.insert(1, "p_low", edges[out["bin"]])
    out.insert(2, "p_high", edges[out["bin"] + 1])
    return out.drop(columns="bin")
