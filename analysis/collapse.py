"""Did a run collapse, and when? The three rules and the stability table; docs/reference.md, "Collapse
definition", states them with the thresholds (:class:`analysis.config.CollapseConfig`). What it leaves out:

- the score is smoothed over finite values and full windows only; the trailing average lags the raw
  score by about ``(smooth_window - 1) / 2`` steps, so ``collapse_step`` is late by about that much;
- ``peak`` is the running maximum up to each step, so the threshold ``peak - drop_frac * (peak - start)``
  moves with it; under ``no_recovery`` a window counts when the smoothed score never climbs back to
  that window's threshold later in the run;
- when rules 1 and 2 fire at the same step, ``reason`` names both, joined by ``+``;
- ``too_short`` means fewer than ``smooth_window + patience`` finite scores; ``peak_score``,
  ``final_score`` and ``start_score`` are smoothed, ``max_k3_kl`` and ``max_grad_norm`` maxima over
  finite logged values; a non-finite k3 counts as a blow-up.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.config import CollapseConfig
from analysis.load import Run
from analysis.series import finite_series, smooth
from rla.names import ABLATIONS

GRAD_NORM = "actor/grad_norm"
LOSS_SCALE = "actor/loss_scale"  # logged by the local rig under FP16 loss scaling

STABILITY_COLUMNS = [
    "model", "ablation", "seed", "run", "steps", "last_step", "collapsed", "collapse_step", "reason",
    "score_collapse_step", "nonfinite_step", "start_score", "peak_score", "peak_step", "final_score",
    "max_k3_kl", "k3_blowup", "k3_blowup_step", "max_grad_norm", "n_nonfinite",
]
_STEP_COLUMNS = ["last_step", "collapse_step", "score_collapse_step", "nonfinite_step", "peak_step",
                 "k3_blowup_step"]


def score_collapse(score: pd.Series, cfg: CollapseConfig) -> dict:
    """Rule 1 on a series of finite scores (index: step). Returns the score part of a stability row."""
    out = {"score_collapse_step": None, "start_score": np.nan, "peak_score": np.nan,
           "peak_step": None, "final_score": np.nan, "score_status": "no_score"}
    if score.empty:
        return out
    smoothed = smooth(score, cfg.smooth_window, full_windows_only=True)
    if not smoothed.empty:
        values = smoothed.to_numpy()
        out.update(start_score=float(values[0]), peak_score=float(values.max()),
                   peak_step=int(smoothed.index[values.argmax()]), final_score=float(values[-1]))
    if len(score) < cfg.smooth_window + cfg.patience:
        out["score_status"] = "too_short"
        return out

    steps = smoothed.index.to_numpy()
    peak = np.maximum.accumulate(values)
    rise = peak - values[0]
    risen = rise >= cfg.min_rise
    below = risen & (values < peak - cfg.drop_frac * rise)
    # A window of `patience` consecutive below-points: count them with a sliding sum.
    window_sums = np.convolve(below.astype(np.int64), np.ones(cfg.patience, dtype=np.int64), "valid")
    threshold = peak - cfg.drop_frac * rise
    starts = [t for t in np.flatnonzero(window_sums == cfg.patience)
              if not (cfg.no_recovery and (values[t + cfg.patience:] >= threshold[t]).any())]  # no recovery afterwards
    if starts:
        out["score_collapse_step"] = int(steps[starts[0]])
        out["score_status"] = "score_fall"
    else:
        out["score_status"] = "stable" if risen.any() else "no_rise"
    return out


def loss_scaled(run: Run) -> bool:
    """Did the run train with FP16 loss scaling? The local rig logs its scale; verl's FSDP engine logs
    none, so there the ablation's registry entry (its precision) says."""
    if (run.long["metric"] == LOSS_SCALE).any():
        return True
    return run.ablation in ABLATIONS and ABLATIONS[run.ablation].precision == "fp16"


def first_nonfinite(run: Run, metrics: tuple[str, ...], patience: int = 1) -> tuple[int | None, str | None]:
    """Rule 2: first step where one of ``metrics`` was logged non-finite, and which metric; under loss
    scaling the gradient norm's only after ``patience`` consecutive logged steps."""
    long = run.long
    bad = long[long["metric"].isin(metrics) & ~np.isfinite(long["value"].to_numpy())]
    if loss_scaled(run):
        overflow = bad["metric"] == GRAD_NORM
        bad = pd.concat([bad[~overflow], _persistent(bad[overflow], run, patience)])
    if bad.empty:
        return None, None
    step = int(bad["step"].min())
    names = sorted(set(bad.loc[bad["step"] == step, "metric"]))
    return step, "+".join(f"nonfinite:{m}" for m in names)


def _persistent(bad: pd.DataFrame, run: Run, patience: int) -> pd.DataFrame:
    """The rows of ``bad`` that start ``patience`` consecutive logged steps all in ``bad``."""
    logged = run.long.loc[run.long["metric"] == GRAD_NORM, "step"].drop_duplicates().sort_values().to_numpy()
    hit = np.isin(logged, bad["step"].to_numpy()).astype(np.int64)
    if len(hit) < patience:
        return bad.iloc[:0]
    starts = logged[np.flatnonzero(np.convolve(hit, np.ones(patience, dtype=np.int64), "valid") == patience)]
    return bad[bad["step"].isin(starts)]


def k3_blowup(run: Run, cfg: CollapseConfig) -> tuple[bool, int | None, float]:
    """Rule 3: (blew up?, first step above threshold or non-finite, max finite k3)."""
    long = run.long
    k3 = long[long["metric"] == cfg.k3_metric]
    values = k3["value"].to_numpy()
    finite = np.isfinite(values)
    max_k3 = float(values[finite].max()) if finite.any() else np.nan
    hit = ~finite | (values > cfg.k3_kl_threshold)
    if not hit.any():
        return False, None, max_k3
    return True, int(k3["step"].to_numpy()[hit].min()), max_k3


def assess_run(run: Run, cfg: CollapseConfig) -> dict:
    """One stability row for ``run``."""
    score_part = score_collapse(finite_series(run.wide, cfg.score_metric), cfg)
    score_status = score_part.pop("score_status")
    nonfinite_step, nonfinite_reason = first_nonfinite(run, cfg.nonfinite_metrics, cfg.patience)
    blew_up, blowup_step, max_k3 = k3_blowup(run, cfg)
    grad = finite_series(run.wide, GRAD_NORM)

    causes = []
    if score_part["score_collapse_step"] is not None:
        causes.append((score_part["score_collapse_step"], "score_fall"))
    if nonfinite_step is not None:
        causes.append((nonfinite_step, nonfinite_reason))
    if causes:
        collapse_step = min(step for step, _ in causes)
        reason = "+".join(name for step, name in causes if step == collapse_step)
    else:
        collapse_step = None
        reason = "no_data" if run.steps == 0 else score_status

    return {
        "model": run.model, "ablation": run.ablation, "seed": run.seed, "run": run.run_id,
        "steps": run.steps,
        "last_step": int(run.wide.index.max()) if run.steps else None,
        "collapsed": bool(causes), "collapse_step": collapse_step, "reason": reason,
        **score_part,
        "nonfinite_step": nonfinite_step,
        "max_k3_kl": max_k3, "k3_blowup": blew_up, "k3_blowup_step": blowup_step,
        "max_grad_norm": float(grad.max()) if not grad.empty else np.nan,
        "n_nonfinite": int((~np.isfinite(run.long["value"].to_numpy())).sum()),
    }


def stability_table(runs: list[Run], cfg: CollapseConfig) -> pd.DataFrame:
    """One row per run (columns :data:`STABILITY_COLUMNS`), sorted by model, ablation, seed."""
    table = pd.DataFrame([assess_run(run, cfg) for run in runs], columns=STABILITY_COLUMNS)
    for column in _STEP_COLUMNS:
        table[column] = table[column].astype("Int64")
    table["collapsed"] = table["collapsed"].astype(bool)
    table["k3_blowup"] = table["k3_blowup"].astype(bool)
    return table.sort_values(["model", "ablation", "seed"], ignore_index=True)
