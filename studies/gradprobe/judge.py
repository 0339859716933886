"""The gradient probe's pre-registered hypotheses (experiments/gradprobe.yaml: HA1-HA4 and the stopping
rule above its `preregistration:` thresholds), judged on the measured points: `{out}/hypotheses.csv`
(one row per point and check) and a summary on stdout. Reads the points' tables only (no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.output import report_parser, write_tables
from rla.config import ConfigError, load

THRESHOLD_KEYS = ("ha1_all_over_none_max", "ha2_e_over_mean_d", "ha2_is_over_sqrt_2k3l", "ha2_flat_max_over_min",
                  "ha3_mnr_none_max", "ha4_ratio", "stopping_mnr_none_max")


def preregistration(plan_file: str | Path) -> tuple[dict, dict]:
    """(the plan's `gradprobe:` section, its `preregistration:` thresholds), checked."""
    cfg = load(plan_file)
    plan, prereg = cfg.get("gradprobe") or {}, cfg.get("preregistration") or {}
    missing = [k for k in THRESHOLD_KEYS if k not in prereg]
    if missing or not plan.get("points"):
        raise ConfigError(f"{plan_file}: needs `gradprobe: points:` and `preregistration:` with "
                          f"{', '.join(THRESHOLD_KEYS)}; missing: {missing or ['gradprobe.points']}")
    if "lead" in prereg and "seeds" not in plan:
        raise ConfigError(f"{plan_file}: `preregistration: lead:` reads each point at each seed: the plan needs "
                          "`gradprobe: seeds:`")
    return plan, prereg


def seeded(plan_file: str | Path, plan: dict, points: dict[str, dict]) -> dict[str, dict]:
    """The plan's points, each at each of its `seeds` if it gives some (named POINT-sSEED: the batches drawn anew)."""
    if "seeds" not in plan:
        return points
    seeds = plan["seeds"]
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise ConfigError(f"{plan_file}: gradprobe.seeds {seeds!r}: a list of integers")
    if fixed := [name for name, point in points.items() if "seed" in point]:
        raise ConfigError(f"{plan_file}: gradprobe points {fixed} give a seed and the plan gives seeds; "
                          "one or the other")
    # seeds outermost: a run stopped early has every point at its first seeds
    return {f"{name}-s{seed}": {**point, "seed": seed} for seed in seeds for name, point in points.items()}


def point_checks(rows: pd.DataFrame, t: dict) -> dict[str, tuple[float, bool]]:
    """{check: (measured value, holds)} of one point's table (one row per setting)."""
    at = rows.set_index("setting")
    none, rope, all_ = at.loc["none"], at.loc["rope"], at.loc["all"]
    e_per_d = none["e"] / none["mean_abs_d_ref"]
    is_per_k3 = none["is_size"] / none["sqrt_2k3L"] if none["sqrt_2k3L"] > 0 else float("nan")
    ratio = (rope["e"] / none["e"]) / (rope["mean_abs_d_ref"] / none["mean_abs_d_ref"])
    (d_lo, d_hi), (is_lo, is_hi), (r_lo, r_hi) = t["ha2_e_over_mean_d"], t["ha2_is_over_sqrt_2k3l"], t["ha4_ratio"]
    return {f"HA1 e(all)/e(none) <= {t['ha1_all_over_none_max']:g}":
            (all_["e"] / none["e"], all_["e"] <= t["ha1_all_over_none_max"] * none["e"]),
            f"HA2 e(none)/mean|d|(none) in [{d_lo:g}, {d_hi:g}]": (e_per_d, d_lo <= e_per_d <= d_hi),
            f"HA2 IS size / sqrt(2 k3 L) in [{is_lo:g}, {is_hi:g}]": (is_per_k3, is_lo <= is_per_k3 <= is_hi),
            f"HA3 MNR(none) <= {t['ha3_mnr_none_max']:g}": (none["mnr"], none["mnr"] <= t["ha3_mnr_none_max"]),
            f"HA4 e ratio / mean|d| ratio (rope:none) in [{r_lo:g}, {r_hi:g}]": (ratio, r_lo <= ratio <= r_hi),
            f"stopping rule: MNR(none) <= {t['stopping_mnr_none_max']:g}":
            (none["mnr"], none["mnr"] <= t["stopping_mnr_none_max"])}


def points_table(points: dict[str, dict], out: Path) -> str:
    """One markdown row per measured point: its ladder values and the numbers the hypotheses read."""
    head = ("| point | model | T | RL step | mean response length | e(none) | e(rope) | e(all) | noise | MNR(none) "
            "| largest token \\|log-ratio\\| | geo_rs rejects |\n" + "| --- " * 12 + "|")
    rows = [head]
    for name in points:
        if not (out / name / "gradprobe.csv").exists():
            continue
        at = pd.read_csv(out / name / "gradprobe.csv").set_index("setting")
        meta = json.loads((out / name / "gradprobe.json").read_text())
        none = at.loc["none"]
        rejects = f"{at.loc['geo_rs', 'rejected_seq_frac']:.2f}" if "geo_rs" in at.index else "-"
        rows.append(f"| {name} | {meta['model']} | {meta['temperature']:g} | {meta['rl_step']} | "
                    f"{meta['response_len_mean']:.0f} | {none['e']:.3g} | {at.loc['rope', 'e']:.3g} | "
                    f"{at.loc['all', 'e']:.3g} | {none['noise']:.3g} | {none['mnr']:.3g} | "
                    f"{none['max_abs_log_ratio']:.2f} | {rejects} |")
    return "\n".join(rows)


def lead_checks(frame: pd.DataFrame, lead: dict, seeds: list[int]) -> list[dict]:
    """The RoPE lead (a plan's `preregistration: lead:`): at each pair, the Qwen3 point's HA4 ratio is below
    `below` at every seed and its Qwen2 counterpart's at none; it reproduces at `pairs_min` pairs or more."""
    ha4 = frame[frame["check"].str.startswith("HA4")].set_index("point")["value"]
    below, rows = lead["below"], []
    for qwen3, qwen2 in lead["pairs"].values():
        ratios = {name: [ha4.get(f"{name}-s{seed}", float("nan")) for seed in seeds] for name in (qwen3, qwen2)}
        holds = max(ratios[qwen3]) < below and min(ratios[qwen2]) >= below  # NaN compares false: a missing point fails
        rows.append({"point": f"{qwen3}+{qwen2}", "check": f"lead: HA4 ratio of the first < {below:g} at every seed, "
                     f"of the second >= {below:g} at every seed", "value": max(ratios[qwen3]), "holds": holds})
    held = sum(r["holds"] for r in rows)
    rows.append({"point": "+".join(lead["pairs"]), "check": f"lead reproduces: holds at >= {lead['pairs_min']} of "
                 f"{len(lead['pairs'])} pairs", "value": float(held), "holds": held >= lead["pairs_min"]})
    return rows


def judge(plan_file: str | Path, out: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """(each pre-registered check at each measured point, the points not measured and why)."""
    plan, prereg = preregistration(plan_file)
    out = Path(out)
    rows, missing = [], []
    names = seeded(plan_file, plan, plan["points"])
    for name in names:
        table = out / name / "gradprobe.csv"
        if not table.exists():
            missing.append(f"{name} ({'no learning signal' if (out / name / 'no_signal.txt').exists() else 'not run'})")
            continue
        for check, (value, holds) in point_checks(pd.read_csv(table), prereg).items():
            rows.append({"point": name, "check": check, "value": float(value), "holds": bool(holds)})
    if len(missing) == len(names) and not any("no learning signal" in m for m in missing):
        raise ConfigError(f"no point of the plan under {out}: run the plan first "
                          f"(python -m studies run gradprobe --plan {plan_file} --out {out})")
    frame = pd.DataFrame(rows, columns=["point", "check", "value", "holds"])
    ladder = [p for p in plan.get("length_ladder", []) if p in set(frame["point"])]
    flat = frame[(frame["check"].str.startswith("HA2 e(none)")) & frame["point"].isin(ladder)]["value"]
    if len(flat) >= 2:
        spread, limit = float(flat.max() / flat.min()), prereg["ha2_flat_max_over_min"]
        frame = pd.concat([frame, pd.DataFrame([{"point": "+".join(ladder),
                                                 "check": f"HA2 flat in length (max/min <= {limit:g})",
                                                 "value": spread, "holds": spread <= limit}])], ignore_index=True)
    if "lead" in prereg:
        frame = pd.concat([frame, pd.DataFrame(lead_checks(frame, prereg["lead"], plan["seeds"]))], ignore_index=True)
    return frame, missing


def main(argv: list[str] | None = None) -> int:
    args = report_parser("gradprobe", __doc__, plan="the pre-registered plan, experiments/gradprobe.yaml",
                         out="the plan's output dir (one folder per point); hypotheses.csv goes here").parse_args(argv)
    frame, missing = judge(args.plan, args.out)
    write_tables(args.out, {"hypotheses.csv": frame})
    plan = load(args.plan)["gradprobe"]
    print(points_table(seeded(args.plan, plan, plan["points"]), args.out) + "\n")
    print("| check | holds at | values (min - max) |\n| --- | --- | --- |")
    for check, group in frame.groupby("check", sort=False):
        print(f"| {check.replace('|', chr(92) + '|')} | {int(group['holds'].sum())} of {len(group)} points | "
              f"{group['value'].min():.3g} - {group['value'].max():.3g} |")
    if missing:
        print(f"not measured: {', '.join(missing)}")
    return 0
