"""Reading the experiment config and resolving one grid cell, with clear errors for bad values.

Every check runs before anything in a cell directory is written, so a typo never costs a result.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from rla import layout

# The contract's ablation names (patches.ABLATIONS holds the same keys once patches is importable).
CONTRACT_ABLATIONS = ("none", "rope", "swiglu", "rmsnorm", "all")

RL_DEFAULTS = {
    "prompts_per_step": 16,
    "samples_per_prompt": 8,
    "max_new_tokens": 24,
    "temperature": 1.0,
    "lr": 2.0e-5,
    "betas": [0.9, 0.999],
    "weight_decay": 0.0,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,  # dual-clip bound for negative advantages
    "loss_agg_mode": "token-mean",
    "kl_coef": 0.0,  # low-variance KL to the initial policy (verl's use_kl_loss); 0 = off
    "kl_loss_type": "low_var_kl",
    "entropy_coeff": 0.0,
    "mini_batches": 1,  # optimizer steps per RL step (one PPO epoch over the batch)
    "grad_clip": 1.0,
    "checkpoint_every": 20,
    "val_every": 10,  # 0 = no validation
    "val_size": 100,
}
POSITIVE_INTS = ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "mini_batches", "checkpoint_every")


class ConfigError(ValueError):
    """A bad configuration value; the message names the value and the allowed ones."""


def default_paths(cfg: dict, model: str) -> tuple[Path, Path]:
    """(data dir, warm-started model dir) as the workflow lays them out (`rla.layout`)."""
    return layout.data_dir(cfg), layout.model_dir(cfg, model)


def load_config(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    cfg = yaml.safe_load(path.read_text())
    if not isinstance(cfg, dict):
        raise ConfigError(f"config file {path} does not hold a mapping")
    return cfg


def allowed_ablations() -> tuple[str, ...]:
    try:
        import patches

        return tuple(patches.ABLATIONS)
    except (ImportError, AttributeError):
        return CONTRACT_ABLATIONS


def model_spec(cfg: dict, model: str) -> dict:
    specs = cfg.get("model_specs") or {}
    if model not in specs:
        raise ConfigError(f"unknown model {model!r}; allowed: {sorted(specs)}")
    return dict(specs[model])


def section_settings(cfg: dict, section: str, defaults: dict, positive_ints: tuple[str, ...]) -> dict:
    """`defaults` updated from `cfg[section]`; an unknown key or a non-positive count is a ConfigError."""
    settings = dict(defaults)
    given = cfg.get(section) or {}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"unknown {section} setting(s) {unknown}; allowed: {sorted(defaults)}")
    settings.update(given)
    for key in positive_ints:
        if not isinstance(settings[key], int) or settings[key] <= 0:
            raise ConfigError(f"{section}.{key} must be a positive integer, got {settings[key]!r}")
    return settings


def rl_settings(cfg: dict) -> dict:
    rl = section_settings(cfg, "rl", RL_DEFAULTS, POSITIVE_INTS)
    if rl["samples_per_prompt"] < 2:
        raise ConfigError(f"rl.samples_per_prompt must be >= 2 for GRPO groups, got {rl['samples_per_prompt']}")
    if not rl["temperature"] > 0:
        raise ConfigError(f"rl.temperature must be > 0, got {rl['temperature']!r}")
    if (rl["prompts_per_step"] * rl["samples_per_prompt"]) % rl["mini_batches"]:
        raise ConfigError(f"rl.mini_batches={rl['mini_batches']} must divide the batch of "
                          f"{rl['prompts_per_step'] * rl['samples_per_prompt']} responses")
    if rl["loss_agg_mode"] not in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        raise ConfigError(f"unknown rl.loss_agg_mode {rl['loss_agg_mode']!r}; allowed: token-mean, "
                          "seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm")
    return rl


def resolve_cell(cfg: dict, model: str, ablation: str, seed: int, steps: int | None) -> dict:
    """The resolved config of one cell (written as the cell's config.yaml)."""
    spec = model_spec(cfg, model)
    if ablation not in allowed_ablations():
        raise ConfigError(f"unknown ablation {ablation!r}; allowed: {list(allowed_ablations())}")
    steps = cfg.get("steps") if steps is None else steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise ConfigError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    cell = copy.deepcopy(cfg)
    cell.update({"model": model, "ablation": ablation, "seed": seed, "steps": steps,
                 "model_spec": spec, "rl": rl_settings(cfg)})
    return cell
