"""The suite's names, defined once: regions, ablations, the sections of an experiment config.

Torch-free, so that the workflow, the analysis and the verl launcher can import it on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable

# Where the training side is aligned with the engine's rounding (the paper's three regions).
REGIONS: tuple[str, ...] = ("rope", "swiglu", "rmsnorm")

# An ablation of the grid: which regions are aligned.
ABLATIONS: dict[str, tuple[str, ...]] = {
    "none": (),
    "rope": ("rope",),
    "swiglu": ("swiglu",),
    "rmsnorm": ("rmsnorm",),
    "all": REGIONS,
}

# The sections of an experiment config (experiments/*.yaml) besides its top-level keys.
SECTIONS: tuple[str, ...] = ("task", "model_specs", "warmstart", "rl", "collapse", "data", "verl", "resources",
                             "wandb")

# Environment variables that carry the alignment into verl's Ray workers (patches.verl_plugin).
REGIONS_ENV = "RLA_REGIONS"
IMPL_ENV = "RLA_IMPL"


def regions_of(ablation: str) -> tuple[str, ...]:
    """The regions an ablation aligns; a ValueError names an unknown one and the allowed ones."""
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; allowed: {', '.join(ABLATIONS)}")
    return ABLATIONS[ablation]


def subset_name(regions: Iterable[str]) -> str:
    """A set of aligned regions by name: none, rope, rope+swiglu, ..., all (in REGIONS order)."""
    chosen = set(regions)
    ordered = [r for r in REGIONS if r in chosen]
    if not ordered:
        return "none"
    return "all" if len(ordered) == len(REGIONS) else "+".join(ordered)
