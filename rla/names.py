"""The suite's names, defined once: regions, treatments, ablations, the sections of an experiment config.

Torch-free, so that the workflow, the analysis and the verl launcher can import it on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

# Where the training side is aligned with the engine's rounding (the paper's three regions).
REGIONS: tuple[str, ...] = ("rope", "swiglu", "rmsnorm")

# The region subsets the grid runs (what `patches.apply` accepts by name).
REGION_ABLATIONS: dict[str, tuple[str, ...]] = {
    "none": (),
    "rope": ("rope",),
    "swiglu": ("swiglu",),
    "rmsnorm": ("rmsnorm",),
    "all": REGIONS,
}

# Which engine build the aligned training side rounds like (patches/targets.py says what each stores).
TARGETS: tuple[str, ...] = ("vllm", "vllm-cpu")

# The rollout engines of the local backend (`engine.name`): vLLM in process (its CPU build here, the
# user's build on a GPU), the suite's own model of vLLM's GPU graph (localrl/engine), or `auto`: vLLM
# where it runs, else local, saying why in one line.
ENGINES: tuple[str, ...] = ("auto", "vllm", "local")

# The fixes a user can switch on instead of aligning regions (or beside it).
TREATMENTS: dict[str, str] = {
    "compile": "stock training forward, each decoder layer compiled by torch.compile (Inductor); engine unchanged",
    "fp16": "FP16 weights, activations and engine on both sides; FP32 master weights; dynamic loss scaling",
    "tis": "stock numerics + verl's token-level truncated importance sampling (rollout correction)",
    "mis": "stock numerics + verl's sequence-level importance sampling with sequence rejection (rollout correction)",
    "geo_rs": "stock numerics + verl's geometric-mean sequence rejection (rollout correction, its documented "
              "thresholds 0.999_1.001)",
    "engine_order": "the RMSNorm variance summed in the CPU-compiled engine's order (patches reduction "
                    "inductor_cpu): with all three regions and the local engine, a training forward equal to the "
                    "engine's; local backend only (no eager code reproduces a GPU kernel's order)",
}
# verl's `RolloutCorrectionConfig` preset (a classmethod, called with its defaults) behind each
# rollout-correction treatment: Token-TIS, Seq-MIS and Geo-RS in verl's own words.
ROLLOUT_CORRECTION: dict[str, str] = {"tis": "decoupled_token_is", "mis": "decoupled_seq_is_rs",
                                      "geo_rs": "decoupled_geo_rs"}
# Treatments that act inside verl's FSDP workers (through patches.verl_plugin), not through verl's config.
WORKER_TREATMENTS: tuple[str, ...] = ("compile",)
# Treatments only the local backend runs (`verlrun` refuses them, naming why).
LOCAL_TREATMENTS: tuple[str, ...] = ("engine_order",)
# Treatments that only modify an alignment and are never an ablation by themselves.
MODIFIERS: tuple[str, ...] = ("engine_order",)


class Ablation(NamedTuple):
    """One value of the grid's ablation axis: the aligned regions plus treatments."""

    regions: tuple[str, ...]
    treatments: tuple[str, ...] = ()


ABLATIONS: dict[str, Ablation] = {
    **{name: Ablation(regions) for name, regions in REGION_ABLATIONS.items()},
    **{name: Ablation((), (name,)) for name in TREATMENTS if name not in MODIFIERS},
    "rope+tis": Ablation(("rope",), ("tis",)),
    "all+tis": Ablation(REGIONS, ("tis",)),
    # geo_rs (= none + geo_rs) beside RoPE alone and all three regions aligned
    "rope+geo_rs": Ablation(("rope",), ("geo_rs",)),
    "all+geo_rs": Ablation(REGIONS, ("geo_rs",)),
    # no mismatch at all (local engine): the exact reference of the gradient probe and of the
    # collapse rule's calibration
    "all+engine_order": Ablation(REGIONS, ("engine_order",)),
}

# The sections of an experiment config (experiments/*.yaml) besides its top-level keys.
SECTIONS: tuple[str, ...] = ("task", "model_specs", "warmstart", "rl", "engine", "collapse", "data", "verl",
                             "resources", "wandb", "gradprobe", "preregistration")

# Environment variables that carry the alignment into verl's Ray workers (patches.verl_plugin).
REGIONS_ENV = "RLA_REGIONS"
IMPL_ENV = "RLA_IMPL"
TARGET_ENV = "RLA_TARGET"
TREATMENTS_ENV = "RLA_TREATMENTS"  # the WORKER_TREATMENTS of a cell, comma-separated


def ablation(name: str) -> Ablation:
    """An ablation's regions and treatments; a ValueError names an unknown one and the allowed ones."""
    if name not in ABLATIONS:
        raise ValueError(f"unknown ablation {name!r}; allowed: {', '.join(ABLATIONS)}")
    return ABLATIONS[name]


def regions_of(name: str) -> tuple[str, ...]:
    """The regions an ablation aligns; a ValueError names an unknown one and the allowed ones."""
    return ablation(name).regions


def treatments_of(name: str) -> tuple[str, ...]:
    """The treatments an ablation switches on; a ValueError names an unknown one and the allowed ones."""
    return ablation(name).treatments


def rollout_correction_of(name: str) -> str | None:
    """The verl rollout-correction preset of an ablation (None: no rollout correction)."""
    presets = [ROLLOUT_CORRECTION[t] for t in treatments_of(name) if t in ROLLOUT_CORRECTION]
    return presets[0] if presets else None


def reduction_of(name: str) -> str:
    """The RMSNorm summation order an ablation's training side uses (patches.apply's `reduction`)."""
    return "inductor_cpu" if "engine_order" in treatments_of(name) else "eager"


def local_only(name: str) -> tuple[str, ...]:
    """The treatments of an ablation that only the local backend runs (empty: both backends run it)."""
    return tuple(t for t in treatments_of(name) if t in LOCAL_TREATMENTS)


def subset_name(regions: Iterable[str]) -> str:
    """A set of aligned regions by name: none, rope, rope+swiglu, ..., all (in REGIONS order)."""
    chosen = set(regions)
    ordered = [r for r in REGIONS if r in chosen]
    if not ordered:
        return "none"
    return "all" if len(ordered) == len(REGIONS) else "+".join(ordered)
