"""Disk a grid needs: checkpoints per cell (bounded by `rl.keep_checkpoints`) and the staged models
(docs/running.md, "Disk": 12 bytes per parameter, `max(keep, 2) + 1` checkpoints at the peak). A checkpoint is
verl's `save_contents` model, optimizer and extra; its RNG and data-loader state, config and tokenizer are megabytes."""

from __future__ import annotations

from verlrun import memory
from rla.config import model_spec, rl_settings

CHECKPOINT_BYTES_PER_PARAM = 4 + 8
SMALL_FILES = 64 * 1024**2      # logs, metrics, configs, tokenizer copies per checkpoint or cell
STAGED_BYTES_PER_PARAM = 2      # BF16 safetensors on the Hub


def checkpoint_bytes(shape: memory.Shape) -> int:
    return CHECKPOINT_BYTES_PER_PARAM * shape.params() + SMALL_FILES


def checkpoints_at_peak(keep: int | None, steps: int, save_every: int) -> int:
    if keep is None:
        return max(1, steps // max(1, save_every))
    return max(keep, 2) + 1


def checkpoints_per_cell(cfg: dict, model: str) -> int:
    rl = rl_settings(cfg, "verl", model)
    return checkpoints_at_peak(rl["keep_checkpoints"], int(cfg["steps"]), int(rl["checkpoint_every"]))


def cell_bytes(cfg: dict, model: str) -> int:
    shape = memory.shape_of(model_spec(cfg, model, "verl"))
    return checkpoints_per_cell(cfg, model) * checkpoint_bytes(shape) + SMALL_FILES


def grid_rows(cfg: dict) -> list[dict]:
    """One row per model of the configured grid: checkpoint, cell and model-total bytes."""
    cells_per_model = len(cfg["ablations"]) * len(cfg["seeds"])
    rows = []
    for model in cfg["models"]:
        shape = memory.shape_of(model_spec(cfg, model, "verl"))
        cell, staged = cell_bytes(cfg, model), STAGED_BYTES_PER_PARAM * shape.params()
        rows.append({"model": model, "checkpoint": checkpoint_bytes(shape),
                     "checkpoints_per_cell": checkpoints_per_cell(cfg, model), "cell": cell, "cells": cells_per_model,
                     "staged_model": staged, "total": cells_per_model * cell + staged})
    return rows


def grid_bytes(cfg: dict) -> int:
    """Everything the grid writes at its peak: every cell's checkpoints plus the staged models."""
    return sum(row["total"] for row in grid_rows(cfg))
