"""Synthetic run logs of known shape, for the tests.

Shapes of the score curve: ``rise`` (rises and stays), ``collapse`` (rises, then falls to near zero
from ``collapse_at`` on), ``flat`` (never rises). Other metrics follow the story of a collapse:
the mismatch KL and grad norm grow by orders of magnitude after the fall.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CORE_METRICS = [
    "critic/score/mean", "rollout_corr/k3_kl", "rollout_corr/kl", "rollout_corr/log_ppl_abs_diff",
    "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
    "training/rollout_actor_probs_pearson_corr", "actor/entropy", "actor/grad_norm",
    "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_loss", "response_length/mean", "timing_s/step",
]


def score_curve(shape: str, steps: int, collapse_at: int | None = None, start: float = 0.1,
                top: float = 0.6, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """A score per step: exponential rise from ``start`` to ``top``; optional fall at ``collapse_at``."""
    t = np.arange(steps, dtype=np.float64)
    if shape == "flat":
        score = np.full(steps, start)
    elif shape in ("rise", "collapse"):
        score = start + (top - start) * (1 - np.exp(-t / max(steps / 8, 1)))
        if shape == "collapse":
            if collapse_at is None:
                raise ValueError("shape 'collapse' needs collapse_at")
            score = np.where(t >= collapse_at, 0.02, score)
    else:
        raise ValueError(f"unknown score shape {shape!r}; allowed: flat, rise, collapse")
    if noise:
        score = score + np.random.default_rng(seed).normal(0, noise, steps)
    return score


def run_records(score: np.ndarray, n_metrics: int = len(CORE_METRICS), collapse_at: int | None = None,
                seed: int = 0) -> list[dict]:
    """One data dict per step: the core verl metrics, then filler metrics up to ``n_metrics``."""
    rng = np.random.default_rng(seed)
    steps = len(score)
    after = np.zeros(steps) if collapse_at is None else (np.arange(steps) >= collapse_at).astype(float)
    k3 = 1e-4 * np.exp(rng.normal(0, 0.3, steps)) * (1 + 300 * after)
    columns = {
        "critic/score/mean": score,
        "rollout_corr/k3_kl": k3,
        "rollout_corr/kl": k3 * 0.9,
        "rollout_corr/log_ppl_abs_diff": np.sqrt(k3),
        "training/rollout_probs_diff_mean": 2e-3 * (1 + 10 * after) * np.exp(rng.normal(0, 0.1, steps)),
        "training/rollout_probs_diff_max": 0.2 + 0.5 * after,
        "training/rollout_actor_probs_pearson_corr": 0.999 - 0.1 * after,
        "actor/entropy": 1.5 - 0.5 * np.linspace(0, 1, steps) + 0.05 * rng.normal(size=steps),
        "actor/grad_norm": 0.5 * np.exp(rng.normal(0, 0.2, steps)) * (1 + 100 * after),
        "actor/pg_clipfrac": 0.01 + 0.01 * rng.random(steps),
        "actor/ppo_kl": 1e-4 * rng.random(steps),
        "actor/pg_loss": 0.01 * rng.normal(size=steps),
        "response_length/mean": 12 + 2 * rng.normal(size=steps),
        "timing_s/step": 1 + 0.1 * rng.random(steps),
    }
    for i in range(max(0, n_metrics - len(columns))):
        columns[f"extra/metric_{i:02d}"] = rng.normal(size=steps)
    names = list(columns)[:n_metrics]
    matrix = np.column_stack([columns[n] for n in names]).tolist()
    return [dict(zip(names, row)) for row in matrix]


def write_metrics(path: str | Path, records: list[dict], first_step: int = 1,
                  truncate_last: bool = False) -> Path:
    """Write records as verl's file logger does (one ``{"step", "data"}`` line per step)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": first_step + i, "data": data}) for i, data in enumerate(records)]
    text = "\n".join(lines) + "\n"
    if truncate_last and lines:
        text = text[: len(text) - len(lines[-1]) // 2 - 1]  # cut the last line mid-way, no newline
    path.write_text(text)
    return path


def write_grid(runs_dir: str | Path, models: list[str], ablations: list[str], seeds: list[int],
               steps: int, n_metrics: int = len(CORE_METRICS), collapsing: tuple[str, ...] = ("none",),
               noise: float = 0.02) -> list[Path]:
    """A whole grid: ablations in ``collapsing`` collapse at a seed-dependent step, others rise."""
    written = []
    for m, model in enumerate(models):
        for ablation in ablations:
            for seed in seeds:
                collapse_at = None
                if ablation in collapsing:
                    collapse_at = int(steps * (0.5 + 0.1 * ((seed + m) % 3)))
                shape = "collapse" if collapse_at is not None else "rise"
                stream = 1000 * m + 100 * ablations.index(ablation) + seed  # distinct noise per run
                score = score_curve(shape, steps, collapse_at, noise=noise, seed=stream)
                records = run_records(score, n_metrics, collapse_at, seed=stream)
                written.append(write_metrics(Path(runs_dir) / model / ablation / f"seed{seed}" / "metrics.jsonl",
                                             records))
    return written
