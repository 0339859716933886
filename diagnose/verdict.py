"""Step 5: what to use, what it leaves, and where, against a k3 threshold."""

from __future__ import annotations

import math

import pandas as pd

from diagnose.errors import DiagnoseError

# The suite's own bar for a mismatch that matters: its collapse rule counts a collapse only with k3 above
# this (rla/config.py, COLLAPSE["k3_kl_threshold"]; healthy dense runs show about 1e-5..1e-3).
DEFAULT_THRESHOLD = 0.01
THRESHOLD_SOURCE = "the suite's collapse rule (rla/config.py, COLLAPSE k3_kl_threshold)"
SAMPLING, PREFILL = "engine_sampling", "engine_prefill"


def check_threshold(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise DiagnoseError(f"threshold {value!r} is not a number; allowed: a k3 value in (0, inf), "
                            f"default {DEFAULT_THRESHOLD}") from None
    if not (math.isfinite(value) and value > 0):
        raise DiagnoseError(f"threshold {value!r} out of range; allowed: a k3 value in (0, inf) (k3 >= 0, and 0 "
                            f"would demand bit-equal logprobs), default {DEFAULT_THRESHOLD}")
    return value


def decide(mismatch: pd.DataFrame, engine_self: pd.DataFrame, target: str, threshold: float,
           by_position: pd.DataFrame, by_probability: pd.DataFrame, firsts: pd.DataFrame | None) -> dict:
    """The spec with the lowest k3 against the engine's sampling logprobs (fewer regions on a tie), what it
    leaves, how much of that the engine makes against itself, and where the rest sits."""
    main = mismatch[mismatch["reference"] == SAMPLING].copy()
    main["n_regions"] = main["spec"].map(lambda s: 0 if s == "none" else 3 if s == "all" else 1)
    best = main.sort_values(["k3", "n_regions"]).iloc[0]
    stock = main[main["spec"] == "none"].iloc[0]
    floor = engine_self[engine_self["comparison"] == "prefill_vs_sampling"].iloc[0]
    spec = best["spec"]
    pos = by_position[(by_position["spec"] == spec)].sort_values("share_of_abs_dlogprob").iloc[-1]
    prob = by_probability[(by_probability["spec"] == spec)].sort_values("share_of_abs_dlogprob").iloc[-1]
    out = {"spec": spec, "target": target, "threshold": threshold, "threshold_source": THRESHOLD_SOURCE,
           "k3": float(best["k3"]), "k3_low": float(best["k3_low"]), "k3_high": float(best["k3_high"]),
           "stock_k3": float(stock["k3"]), "stock_k3_low": float(stock["k3_low"]),
           "stock_k3_high": float(stock["k3_high"]), "engine_self_k3": float(floor["k3"]),
           "passes": bool(best["k3"] <= threshold), "passes_at_upper_bound": bool(best["k3_high"] <= threshold),
           "worst_positions": f"{int(pos['position_low'])}..{int(pos['position_high'])}",
           "worst_positions_share": float(pos["share_of_abs_dlogprob"]),
           "worst_probabilities": f"[{prob['p_low']:g}, {prob['p_high']:g})",
           "worst_probabilities_share": float(prob["share_of_abs_dlogprob"])}
    if firsts is not None and len(firsts):
        row = firsts[firsts["spec"] == spec]
        if len(row):
            out["first_layer"] = None if pd.isna(row["earliest_layer"].iloc[0]) else int(row["earliest_layer"].iloc[0])
            out["arose_in"] = row["arose_in"].iloc[0]
    out["text"] = words(out)
    return out


def words(v: dict) -> str:
    use = ("stock transformers (no region improves on it)" if v["spec"] == "none"
           else f"`patches.apply({v['spec']!r}, target={v['target']!r})`")
    lines = [f"Use {use}: k3 {v['k3']:.3g} [{v['k3_low']:.3g}, {v['k3_high']:.3g}] against the engine's sampling "
             f"logprobs (stock: {v['stock_k3']:.3g}).",
             ("Below" if v["passes"] else "Above") + f" the threshold {v['threshold']:g} ({v['threshold_source']})"
             + ("" if v["passes"] == v["passes_at_upper_bound"] else ", but its interval reaches above it") + "."]
    if v["spec"] != "none" and v["k3_high"] >= v["stock_k3_low"]:
        lines.append(f"Its interval overlaps stock's [{v['stock_k3_low']:.3g}, {v['stock_k3_high']:.3g}]: on these "
                     "samples the regions are not told apart from stock; more prompts narrow the intervals.")
    lines.append(f"The engine's own decode against its own prefill of the same tokens gives k3 "
                 f"{v['engine_self_k3']:.3g}: no training-side change removes that part.")
    lines.append(f"What is left sits most in positions {v['worst_positions']} ({v['worst_positions_share']:.0%} of "
                 f"|d logprob|) and in tokens of engine probability {v['worst_probabilities']} "
                 f"({v['worst_probabilities_share']:.0%}).")
    if "arose_in" in v:
        lines.append(f"Layer by layer, the sides first part in {v['arose_in']}.")
    return " ".join(lines)
