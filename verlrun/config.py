"""Experiment config access for the verl backend (plain dicts; no torch import)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

# Which regions each ablation aligns; the names match `patches.ABLATIONS` (checked by a test) and are
# written out here so that building a command line never imports torch.
ABLATION_REGIONS: dict[str, tuple[str, ...]] = {
    "none": (),
    "rope": ("rope",),
    "swiglu": ("swiglu",),
    "rmsnorm": ("rmsnorm",),
    "all": ("rope", "swiglu", "rmsnorm"),
}


def load_config(path: str | Path) -> dict:
    """Read an experiment config (YAML) into a dict."""
    with open(path) as f:
        cfg = yaml.safe_load(f)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(cfg).__name__}")
    return cfg


def regions_of(ablation: str) -> str:
    """The `RLA_REGIONS` value for an ablation: '' for none, 'rope,swiglu,rmsnorm' for all."""
    if ablation not in ABLATION_REGIONS:
        raise ValueError(f"unknown ablation {ablation!r}; allowed: {', '.join(ABLATION_REGIONS)}")
    return ",".join(ABLATION_REGIONS[ablation])


def model_spec(cfg: dict, model: str) -> dict:
    """The `model_specs` entry of a model; a verl model needs a `path` (HF name or local dir)."""
    specs = cfg.get("model_specs") or {}
    if model not in specs:
        raise ValueError(f"unknown model {model!r}; models in model_specs: {', '.join(specs) or '(none)'}")
    spec = specs[model]
    if not spec.get("path"):
        raise ValueError(f"model_specs.{model} has no 'path' (a Hugging Face model name or a local directory)")
    return spec


def cell_rl(cfg: dict, model: str) -> dict:
    """RL settings of one model: the global `rl` section updated by `model_specs.<model>.rl`."""
    rl = copy.deepcopy(cfg.get("rl") or {})
    rl.update(model_spec(cfg, model).get("rl") or {})
    return rl


def experiment_name(model: str, ablation: str, seed: int) -> str:
    """One name per cell, used for verl's experiment_name (and so the wandb run)."""
    return f"{model}-{ablation}-seed{seed}"
