"""One local grid cell's resolved settings and paths (the checks themselves are `rla.config`'s)."""

from __future__ import annotations

import copy
from pathlib import Path

from rla import layout
from rla.config import ConfigError, engine_settings, model_spec, rl_settings
from rla.names import ABLATIONS


def default_paths(cfg: dict, model: str) -> tuple[Path, Path]:
    """(data dir, warm-started model dir) as the workflow lays them out (`rla.layout`)."""
    return layout.data_dir(cfg), layout.model_dir(cfg, model)


def resolve_cell(cfg: dict, model: str, ablation: str, seed: int, steps: int | None) -> dict:
    """The resolved config of one cell (written as the cell's config.yaml); checks every value first.
    `engine` is resolved on this machine (`auto` becomes the engine that runs: localrl.engines)."""
    from localrl import engines
    from localrl.device import device

    spec = model_spec(cfg, model, "local")
    engine = engine_settings(cfg)
    if ablation not in ABLATIONS:
        raise ConfigError(f"unknown ablation {ablation!r}; allowed: {', '.join(ABLATIONS)}")
    steps = cfg.get("steps") if steps is None else steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise ConfigError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    rl = rl_settings(cfg, "local", model)
    resolved = engines.resolve(engine, device().type)
    engines.check_shape(resolved, model, spec)
    cell = copy.deepcopy(cfg)
    cell.update({"model": model, "ablation": ablation, "seed": seed, "steps": steps,
                 "model_spec": spec, "rl": rl, "engine": resolved})
    return cell
