"""The gradient probe's ladders: the points of a pre-registered plan (the `gradprobe:` section of
experiments/gradprobe.yaml), run one after the other.

    points:
      base-qwen2: {model: qwen2-s}                                  # the plan's own config, T 1, warm start
      t05-qwen2: {model: qwen2-s, temperature: 0.5}
      step30-qwen2: {model: qwen2-s, rl_step: 30}                   # an RL checkpoint, made with the rig
      long-qwen2: {config: experiments/long.yaml, model: qwen2-l}   # another config's task and model
      w256-qwen2: {model: qwen2-w256, settings: [none, rope, all]}  # fewer settings than the plan's

A point's model is its config's warm start (`{results_dir}/models/{model}`, made with its data on
first use, as the workflow makes them); `rl_step: N` is that
model after N RL steps of the rig (`rl_ablation`, default none, seed 0, the config's RL settings and
engine), trained here on first use: the cell runs to N steps, its checkpoint is copied to
`{out}/checkpoints/{model}/step_N.pt`, and a later N continues the same cell. Each point writes
`{out}/{point}/` (localrl.gradprobe.write), or `no_signal.txt` when every batch's groups scored alike
(a zero gradient: nothing to compare); a point whose folder holds either is not measured again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from localrl.gradprobe import DEFAULT_BATCHES, SETTINGS, NoSignal, PointSpec, run_point, write
from rla.config import ConfigError, load

POINT_KEYS = {"config", "model", "temperature", "rl_step", "rl_ablation", "batches", "max_new_tokens", "seed",
              "settings"}


def plan_points(plan_file: str | Path) -> tuple[dict, dict[str, dict]]:
    """(plan settings, {point name: point}) of a plan file, checked."""
    cfg = load(plan_file)
    plan = cfg.get("gradprobe")
    if not isinstance(plan, dict) or not isinstance(plan.get("points"), dict) or not plan["points"]:
        raise ConfigError(f"{plan_file}: no `gradprobe: points:` mapping of point names to points")
    points = {}
    for name, point in plan["points"].items():
        unknown = sorted(set(point) - POINT_KEYS)
        if unknown or "model" not in point:
            raise ConfigError(f"{plan_file}: gradprobe point {name!r}: unknown keys {unknown} or no model; "
                              f"allowed: {', '.join(sorted(POINT_KEYS))}")
        points[name] = {"config": str(plan_file), **point}
    bad = [s for p in [plan, *points.values()] for s in p.get("settings", ()) if s not in SETTINGS]
    if bad:
        raise ConfigError(f"{plan_file}: gradprobe.settings {bad} unknown; allowed: {', '.join(SETTINGS)}")
    return plan, points


def ensure_warm_start(point: dict, log=print) -> None:
    """The point's data and warm-started model, made as the workflow makes them if missing."""
    from localrl.data import write_splits
    from localrl.task import TaskSettings
    from localrl.warmstart import warmstart
    from rla import layout
    from rla.config import model_spec, warmstart_settings

    cfg = load(point["config"])
    model_spec(cfg, point["model"], "local")
    data_dir, model_dir = layout.data_dir(cfg), layout.model_dir(cfg, point["model"])
    if not (data_dir / "train.parquet").exists():
        log(f"data: {data_dir}")
        write_splits(TaskSettings.from_config(cfg.get("task") or {}), data_dir)
    if not (model_dir / "model.safetensors").exists():
        log(f"warm start: {point['model']} of {point['config']} in {model_dir}")
        warmstart_settings(cfg)
        warmstart(cfg, point["model"], data_dir, model_dir)


def checkpoint_of(point: dict, out: Path, log=print) -> str | None:
    """The RL checkpoint a point asks for (None: the warm start), trained with the rig if missing."""
    steps = point.get("rl_step")
    if not steps:
        return None
    from localrl.run import train_cell
    from rla import layout
    from rla.cells import Cell

    kept = out / "checkpoints" / point["model"] / f"step_{int(steps):06d}.pt"
    if kept.exists():
        return str(kept)
    cfg = load(point["config"])
    ablation, seed = point.get("rl_ablation", "none"), int(point.get("seed", 0))
    cell_dir = layout.cell_dir(cfg, point["model"], ablation, seed)
    log(f"RL checkpoint: {point['model']}/{ablation}/seed{seed} to step {steps} in {cell_dir}")
    train_cell(Cell.of(cfg, point["model"], ablation, seed, cell_dir, steps=int(steps)))
    made = cell_dir / "checkpoints" / f"step_{int(steps):06d}.pt"
    if not made.exists():
        raise ConfigError(f"the cell {cell_dir} has no checkpoint at step {steps}")
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(made, kept)
    return str(kept)


def run_plan(plan_file: str | Path, out: str | Path, only: str | None = None, log=print) -> int:
    plan, points = plan_points(plan_file)
    out = Path(out)
    names = list(points) if not only else [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in points]
    if unknown:
        raise ConfigError(f"--points {unknown} not in {plan_file}; its points: {', '.join(points)}")
    for i, name in enumerate(names, 1):
        point = points[name]
        if (out / name / "gradprobe.csv").exists() or (out / name / "no_signal.txt").exists():
            log(f"[point {i}/{len(names)}] {name}: done already ({out / name})")
            continue
        log(f"[point {i}/{len(names)}] {name}: {point}")
        ensure_warm_start(point, log)
        spec = PointSpec(point["config"], point["model"], checkpoint_of(point, out, log),
                         float(point.get("temperature", 1.0)), int(point.get("batches", plan.get("batches", DEFAULT_BATCHES))),
                         point.get("max_new_tokens"), int(point.get("seed", 0)),
                         tuple(point.get("settings", plan.get("settings", SETTINGS))))
        try:
            result = run_point(spec, log)
        except NoSignal as err:  # recorded, and the plan goes on: a pre-registered point is reported either way
            from rla import files

            files.write_text(out / name / "no_signal.txt", f"{err}\n")
            log(f"[point {i}/{len(names)}] {name}: no learning signal: {err}")
            continue
        result.meta["point"] = name
        result.rows.insert(0, "point", name)
        result.batches.insert(0, "point", name)
        for path in write(result, out / name):
            log(f"wrote {path}")
    return 0


# ---------------------------------------------------------------------------------------------
# The pre-registered hypotheses (experiments/gradprobe.yaml), judged on the measured points


def _point_checks(rows) -> dict[str, tuple[float, bool]]:
    """{check: (measured value, holds)} of one point's table (one row per setting)."""
    at = rows.set_index("setting")
    none, rope, all_ = at.loc["none"], at.loc["rope"], at.loc["all"]
    e_per_d = none["e"] / none["mean_abs_d_ref"]
    is_per_k3 = none["is_size"] / none["sqrt_2k3L"] if none["sqrt_2k3L"] > 0 else float("nan")
    ratio = (rope["e"] / none["e"]) / (rope["mean_abs_d_ref"] / none["mean_abs_d_ref"])
    return {"HA1 e(all)/e(none) <= 0.05": (all_["e"] / none["e"], all_["e"] <= 0.05 * none["e"]),
            "HA2 e(none)/mean|d|(none) in [3, 12]": (e_per_d, 3 <= e_per_d <= 12),
            "HA2 IS size / sqrt(2 k3 L) in [0.5, 2]": (is_per_k3, 0.5 <= is_per_k3 <= 2),
            "HA3 MNR(none) <= 0.05": (none["mnr"], none["mnr"] <= 0.05),
            "HA4 e ratio / mean|d| ratio (rope:none) in [0.75, 1.25]": (ratio, 0.75 <= ratio <= 1.25),
            "stopping rule: MNR(none) <= 0.1": (none["mnr"], none["mnr"] <= 0.1)}


def points_table(points: dict[str, dict], out: Path) -> str:
    """One markdown row per measured point: its ladder values and the numbers the hypotheses read."""
    import json

    import pandas as pd

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


def report(plan_file: str | Path, out: str | Path, log=print) -> int:
    """Each pre-registered check at each measured point, and each hypothesis as it falls:
    `{out}/hypotheses.csv` (per point) and a summary on stdout."""
    import pandas as pd

    from rla.files import write_csv

    plan, points = plan_points(plan_file)
    out = Path(out)
    rows, missing = [], []
    for name in points:
        table = out / name / "gradprobe.csv"
        if not table.exists():
            missing.append(f"{name} ({'no learning signal' if (out / name / 'no_signal.txt').exists() else 'not run'})")
            continue
        for check, (value, holds) in _point_checks(pd.read_csv(table)).items():
            rows.append({"point": name, "check": check, "value": float(value), "holds": bool(holds)})
    if not rows:
        raise ConfigError(f"no measured point under {out}: run the plan first (--plan {plan_file} --out {out})")
    frame = pd.DataFrame(rows)
    ladder = [p for p in plan.get("length_ladder", []) if p in set(frame["point"])]
    flat = frame[(frame["check"].str.startswith("HA2 e(none)")) & frame["point"].isin(ladder)]["value"]
    if len(flat) >= 2:
        spread = float(flat.max() / flat.min())
        frame = pd.concat([frame, pd.DataFrame([{"point": "+".join(ladder), "check": "HA2 flat in length (max/min <= 2)",
                                                 "value": spread, "holds": spread <= 2}])], ignore_index=True)
    write_csv(frame, out / "hypotheses.csv")
    print(points_table(points, out) + "\n")
    print("| check | holds at | values (min - max) |\n| --- | --- | --- |")
    for check, group in frame.groupby("check", sort=False):
        print(f"| {check.replace('|', chr(92) + '|')} | {int(group['holds'].sum())} of {len(group)} points | "
              f"{group['value'].min():.3g} - {group['value'].max():.3g} |")
    if missing:
        print(f"not measured: {', '.join(missing)}")
    log(f"wrote {out / 'hypotheses.csv'}")
    return 0
