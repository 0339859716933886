"""The rejection-stall study (experiments/geo_rs.yaml): its pre-registered predictions judged on the runs.

Per run: the mean rejected fraction of sequences and the validation-score gain (last validation minus the
first, taken before step 1's update). S1: rejection ranges; S2: the baseline's mean gain at most
`gain_ratio_max` of the aligned one's; S3: a one-sided sign test over the (model, seed) pairs.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.load import load_runs
from analysis.output import report_parser, write_tables
from rla.config import load_all

REJECTED = "rollout_corr/rollout_rs_seq_masked_fraction"
VAL = "val/score/mean"


def per_run(runs) -> pd.DataFrame:
    rows = []
    for run in runs:
        val = run.wide.get(VAL, pd.Series(dtype=float)).dropna()
        rows.append({"model": run.model, "ablation": run.ablation, "seed": run.seed, "steps": run.steps,
                     "rejected_frac": run.wide.get(REJECTED, pd.Series(dtype=float)).dropna().mean(),  # NaN: none
                     "val_first": val.iloc[0] if len(val) else math.nan,
                     "val_last": val.iloc[-1] if len(val) else math.nan})
    frame = pd.DataFrame(rows)
    frame["val_gain"] = frame["val_last"] - frame["val_first"]
    return frame


def sign_test(wins: int, n: int) -> float:
    """One-sided p of at least `wins` successes in `n` fair coin flips."""
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def judge(runs: pd.DataFrame, prereg: dict) -> pd.DataFrame:
    base, aligned = prereg["baseline"], prereg["aligned"]
    missing = {base, aligned} - set(runs["ablation"])
    if missing:
        raise ValueError(f"no runs of {sorted(missing)}; the study's ablations: {sorted(set(runs['ablation']))}")
    rows = []
    for ablation, (low, high) in prereg["rejected_fraction"].items():
        got = runs.loc[runs["ablation"] == ablation, "rejected_frac"]
        rows.append({"check": f"S1 rejected fraction of {ablation} in [{low}, {high}]", "measured": got.mean(),
                     "range": f"{got.min():.3g} - {got.max():.3g}", "holds": bool(low <= got.mean() <= high)})
    gain = runs.groupby("ablation")["val_gain"].mean()
    ratio = gain[base] / gain[aligned] if gain[aligned] > 0 else math.nan
    rows.append({"check": f"S2 gain({base}) <= {prereg['gain_ratio_max']} gain({aligned})",
                 "measured": ratio, "range": f"gains {gain[base]:.3g} vs {gain[aligned]:.3g}",
                 "holds": bool(gain[aligned] > 0 and gain[base] <= prereg["gain_ratio_max"] * gain[aligned])})
    paired = (runs.set_index(["model", "seed", "ablation"])["val_gain"].unstack("ablation")
              .reindex(columns=[base, aligned]).dropna())  # runs without a validation score pair with nothing
    wins, n = int((paired[aligned] > paired[base]).sum()), len(paired)
    p = sign_test(wins, n) if n else math.nan
    rows.append({"check": f"S3 {aligned} gains more than {base} (sign test, p <= {prereg['sign_test_p_max']})",
                 "measured": p, "range": f"{wins} of {n} pairs", "holds": bool(n and p <= prereg["sign_test_p_max"])})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = report_parser("geo_rs", __doc__, runs="the study's runs directory",
                      out="where stall_runs.csv and stall_checks.csv go")
    p.add_argument("--config", required=True, nargs="+", help="the study's config(s), later laid over earlier "
                   "(its `preregistration:` section)")
    args = p.parse_args(argv)
    prereg = load_all(args.config).get("preregistration")
    if not isinstance(prereg, dict):
        raise ValueError(f"{args.config} has no `preregistration:` section")
    runs = per_run(load_runs(args.runs))
    checks = judge(runs, prereg)
    write_tables(args.out, {"stall_runs.csv": runs, "stall_checks.csv": checks})
    print(runs.groupby("ablation")[["rejected_frac", "val_gain"]].agg(["mean", "min", "max"]).to_string())
    print(checks.to_string(index=False))
    return 0
