"""Where a profile's files go: one results folder per profile (tiny and paper cells never meet).

    {results_dir}/data/{train,test}.parquet
    {results_dir}/models/{model}/                 warm-started tiny models (local backend)
    {results_dir}/runs/{model}/{ablation}/seed{N}/  one cell
    {results_dir}/tables/, logs/, probe/
"""

from __future__ import annotations

from pathlib import Path


def results_dir(cfg: dict) -> Path:
    """`results_dir`, by default `results/<profile>`."""
    return Path(cfg.get("results_dir") or f"results/{cfg.get('profile', 'tiny')}")


def data_dir(cfg: dict) -> Path:
    return results_dir(cfg) / "data"


def model_dir(cfg: dict, model: str) -> Path:
    return results_dir(cfg) / "models" / model


def runs_dir(cfg: dict) -> Path:
    return results_dir(cfg) / "runs"


def cell_dir(cfg: dict, model: str, ablation: str, seed: int) -> Path:
    return runs_dir(cfg) / model / ablation / f"seed{seed}"


def tables_dir(cfg: dict) -> Path:
    return results_dir(cfg) / "tables"


def logs_dir(cfg: dict) -> Path:
    return results_dir(cfg) / "logs"
