"""The collapse rule on runs with no mismatch (experiments/calibration.yaml): how often it fires, how many
runs never rise (it cannot fire for them), how many steps a run has after its peak to show a fall.

Each of the config's `report.alternatives` (`KEY=VALUE[,KEY=VALUE]`, keys of its `collapse:` section)
re-applies the rule with those thresholds. The text goes to stdout; with `--out DIR` also
`calibration.csv` (one row) and `alternatives.csv` (one row per alternative).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from analysis.collapse import stability_table
from analysis.config import CollapseConfig
from analysis.load import load_runs
from analysis.output import report_parser, write_tables
from analysis.tables import wilson_interval
from rla.config import load_all

# Every reason a run's stability row can give (analysis/collapse.py), a column of calibration.csv each,
# zero where no run gave it (a non-finite reason found in the runs adds its own column).
REASONS = ("score_fall", "stable", "no_rise", "too_short", "no_score", "no_data")
# The thresholds an alternatives.csv row names (the rest of the rule is the config's).
THRESHOLDS = ("smooth_window", "min_rise", "drop_frac", "patience", "no_recovery")


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


def calibration_row(stability: pd.DataFrame, patience: int, smooth_window: int) -> pd.DataFrame:
    """`calibrate()` as a one-row table: the interval unrounded, one `reason_<name>` column per reason."""
    row = {}
    for key, value in calibrate(stability, patience, smooth_window).items():
        if key == "fp_rate_95ci":
            row["fp_rate_95ci_low"], row["fp_rate_95ci_high"] = (
                float(x) for x in wilson_interval(row["false_positives"], row["runs"]))
        elif key == "reasons":
            row.update({f"reason_{reason}": int(value.get(reason, 0))
                        for reason in REASONS + tuple(sorted(set(value) - set(REASONS)))})
        else:
            row[key] = value
    return pd.DataFrame([row])


def parse_alternative(cfg, text: str) -> dict:
    """`min_rise=0.05,no_recovery=false` -> the changed fields, each of its field's type."""
    changes = {}
    for item in text.split(","):
        key, value = (part.strip() for part in item.split("=", 1))
        kind = type(getattr(cfg, key))
        if kind is bool:  # bool("false") is True: a flag is spelled out
            if value.lower() not in ("true", "false"):
                raise ValueError(f"{key} takes true or false, not {value!r}")
            changes[key] = value.lower() == "true"
        else:
            changes[key] = kind(value)
    return changes


def alternative_row(text: str, cfg, table: pd.DataFrame) -> dict:
    return {"alternative": text, **{key: getattr(cfg, key) for key in THRESHOLDS}, "runs": len(table),
            "collapsed": int(table["collapsed"].sum()), "never_rose": int((table["reason"] == "no_rise").sum())}


def main(argv: list[str] | None = None) -> int:
    p = report_parser("calibration", "the collapse rule's false positives on runs with no mismatch",
                      stability="stability.csv of the calibration runs")
    p.add_argument("--config", required=True, nargs="+", help="their config(s), later laid over earlier (its "
                   "`collapse:` thresholds, `report.alternatives`)")
    p.add_argument("--runs", help="the runs themselves (needed for the config's report.alternatives)")
    p.add_argument("--out", help="also write calibration.csv and alternatives.csv into this folder")
    args = p.parse_args(argv)
    stability = pd.read_csv(args.stability)
    config = load_all(args.config)
    cfg = CollapseConfig.from_mapping(config.get("collapse"))
    alternatives = list((config.get("report") or {}).get("alternatives", []))
    for key, value in calibrate(stability, cfg.patience, cfg.smooth_window).items():
        print(f"{key}: {value}")
    rows = []
    if alternatives:
        if not args.runs:
            raise ValueError("the config's report.alternatives need --runs")
        runs = load_runs(args.runs)
        for text in alternatives:
            try:
                alternative = replace(cfg, **parse_alternative(cfg, text))
                table = stability_table(runs, alternative)
            except (ValueError, TypeError, AttributeError) as err:
                raise ValueError(f"alternative {text!r}: {err}") from err
            rows.append(alternative_row(text, alternative, table))
            print(f"alternative {text}: {rows[-1]['collapsed']} of {rows[-1]['runs']} runs collapsed, "
                  f"{rows[-1]['never_rose']} never rose")
    if args.out:
        columns = ["alternative", *THRESHOLDS, "runs", "collapsed", "never_rose"]
        write_tables(args.out, {"calibration.csv": calibration_row(stability, cfg.patience, cfg.smooth_window),
                                "alternatives.csv": pd.DataFrame(rows, columns=columns)})
    return 0
