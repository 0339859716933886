"""The collapse rule on runs with no mismatch (experiments/calibration.yaml): how often it fires where
nothing can collapse from rounding, how many runs never rise (the rule cannot fire for them), and how
many steps a run has left after its peak to show a fall (the rule needs `patience` below the threshold).

    python -m studies report calibration --stability results/calibration/tables/stability.csv --config experiments/calibration.yaml
    python -m studies report calibration ... --runs results/calibration/runs --alternative min_rise=0.05 --alternative ...

`--alternative KEY=VALUE[,KEY=VALUE]` re-applies the rule to the runs with those thresholds changed:
how many false positives each alternative would have reported.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from analysis.tables import wilson_interval


def calibrate(stability: pd.DataFrame, patience: int, smooth_window: int) -> dict:
    n = len(stability)
    fired = int(stability["collapsed"].astype(bool).sum())
    low, high = wilson_interval(fired, n)
    left = stability["last_step"] - stability["peak_step"]
    return {"runs": n, "false_positives": fired, "false_positive_rate": fired / n if n else float("nan"),
            "fp_rate_95ci": f"{low:.2f} - {high:.2f}",
            "reasons": stability["reason"].value_counts().to_dict(),
            "never_rose": int((stability["reason"] == "no_rise").sum()),
            "steps_after_peak_min": int(left.min()), "steps_after_peak_median": float(left.median()),
            "runs_with_room_to_fall": int((left >= patience + smooth_window).sum())}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies report calibration", description="the collapse rule's false positives on runs with no mismatch")
    p.add_argument("--stability", required=True, help="stability.csv of the calibration runs")
    p.add_argument("--config", required=True, nargs="+", help="their config(s), later laid over earlier (its "
                   "`collapse:` thresholds, `report.alternatives`)")
    p.add_argument("--runs", help="the runs themselves (needed for --alternative)")
    p.add_argument("--alternative", action="append", default=[],
                   help="thresholds to try instead, e.g. min_rise=0.05,patience=5 (repeatable; default: the "
                        "config's report.alternatives)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from analysis.config import CollapseConfig
    from rla.config import load_all

    stability = pd.read_csv(args.stability)
    config = load_all(args.config)
    cfg = CollapseConfig.from_mapping(config.get("collapse"))
    args.alternative = args.alternative or list((config.get("report") or {}).get("alternatives", []))
    for key, value in calibrate(stability, cfg.patience, cfg.smooth_window).items():
        print(f"{key}: {value}")
    if args.alternative:
        if not args.runs:
            print("error: --alternative needs --runs", file=sys.stderr)
            return 2
        from dataclasses import replace

        from analysis.collapse import stability_table
        from analysis.load import load_runs

        runs = load_runs(args.runs)
        for text in args.alternative:
            try:
                changes = {k: type(getattr(cfg, k))(v) for k, v in (item.split("=", 1) for item in text.split(","))}
                table = stability_table(runs, replace(cfg, **changes))
            except (ValueError, TypeError, AttributeError) as err:
                print(f"error: --alternative {text!r}: {err}", file=sys.stderr)
                return 2
            print(f"alternative {text}: {int(table['collapsed'].sum())} of {len(table)} runs collapsed, "
                  f"{int((table['reason'] == 'no_rise').sum())} never rose")
    return 0
