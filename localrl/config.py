"""One local grid cell's resolved settings (the checks themselves are `rla.config`'s and `Cell.of`'s)."""

from __future__ import annotations

import copy

from rla.cells import Cell
from rla.config import engine_settings, model_spec, rl_settings
from rla.names import ablation


def resolve(cell: Cell) -> dict:
    """The resolved config of one cell (written as the cell's config.yaml); checks every value first.
    `engine` is resolved on this machine (`auto` becomes the engine that runs: localrl.engines)."""
    from localrl import engines
    from localrl.device import device

    spec = model_spec(cell.cfg, cell.model, "local")
    resolved = engines.resolve(engine_settings(cell.cfg), device().type,
                               compilation=ablation(cell.ablation).engine_compilation, ablation=cell.ablation)
    engines.check_shape(resolved, cell.model, spec)
    config = copy.deepcopy(cell.cfg)
    config.update({"model": cell.model, "ablation": cell.ablation, "seed": cell.seed, "steps": cell.steps,
                   "model_spec": spec, "rl": rl_settings(cell.cfg, "local", cell.model), "engine": resolved})
    return config
