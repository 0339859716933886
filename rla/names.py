"""The suite's names, defined once: regions, treatments, ablations, the sections of an experiment config.

Torch-free, so that the workflow, the analysis and the verl launcher can import it on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Where the training side is aligned with the engine's rounding (the paper's three regions).
REGIONS: tuple[str, ...] = ("rope", "swiglu", "rmsnorm")

# Which engine build the aligned training side rounds like (patches/targets.py says what each stores).
TARGETS: tuple[str, ...] = ("vllm", "vllm-cpu")
# The target where none is named: `patches.apply`'s and the verl backend's (`verl.target`), whose default
# platform is a GPU running vLLM's GPU graphs - the named `vllm`, known without compiling vLLM (`auto`
# reads the table off vLLM's graph as the cells configure it: experiments/paper.yaml, verl-cpu.yaml).
DEFAULT_TARGET = "vllm"
# The local backend's (`engine.target`): its default engine is itself `auto` - vLLM's CPU build where it
# runs (one graph: vllm-cpu's table), else the local engine (a model of vLLM's GPU graph: vllm) - so the
# target follows the engine the cell resolved to (localrl.engines.default_target).
LOCAL_DEFAULT_TARGET = "auto"

# The rollout engines of the local backend (`engine.name`): vLLM in process (its CPU build here, the
# user's build on a GPU), the suite's own model of vLLM's GPU graph (localrl/engine), or `auto`: vLLM
# where it runs, else local, saying why in one line.
ENGINES: tuple[str, ...] = ("auto", "vllm", "local")

# The fixes a user can switch on instead of aligning regions (or beside it), and what each does.
TREATMENTS: dict[str, str] = {
    "compile": "stock training forward, each decoder layer compiled by torch.compile (Inductor); engine unchanged",
    "fp16": "FP16 weights, activations and engine on both sides; FP32 master weights; dynamic loss scaling",
    "tis": "stock numerics + verl's token-level truncated importance sampling (rollout correction)",
    "mis": "stock numerics + verl's sequence-level importance sampling with sequence rejection (rollout correction)",
    "geo_rs": "stock numerics + verl's geometric-mean sequence rejection (rollout correction, its documented "
              "thresholds 0.999_1.001)",
    "engine_casts": "stock training side, the engine aligned to it instead: vLLM compiled with Inductor's "
                    "emulate_precision_casts (ENGINE_KEEPS_CASTS), which keeps eager's BF16 casts inside its fused "
                    "kernels; vLLM engines only, and no region aligned (the engine then stores a table no named "
                    "target has)",
    "engine_order": "the RMSNorm variance summed in the CPU-compiled engine's order (patches reduction "
                    "inductor_cpu): with all three regions and the local engine, a training forward equal to the "
                    "engine's; local backend only (no eager code reproduces a GPU kernel's order)",
}
# vLLM's `compilation_config` for the engine-side fix: Inductor rounds an explicit BF16 cast, and the output
# of an op eager runs in BF16, inside its kernel (patches/engine_table.py reads the table it stores).
ENGINE_KEEPS_CASTS: dict = {"inductor_compile_config": {"emulate_precision_casts": True}}

# What each treatment sets in an ablation's behaviour (the Ablation fields below). Rollout
# corrections are verl's `RolloutCorrectionConfig` presets (classmethods, called with their
# defaults): Token-TIS, Seq-MIS and Geo-RS in verl's own words.
EFFECTS: dict[str, dict] = {
    "compile": {"compiled": True},
    "fp16": {"precision": "fp16"},
    "tis": {"rollout_correction": "decoupled_token_is"},
    "mis": {"rollout_correction": "decoupled_seq_is_rs"},
    "geo_rs": {"rollout_correction": "decoupled_geo_rs"},
    "engine_casts": {"engine_compilation": ENGINE_KEEPS_CASTS},
    "engine_order": {"reduction": "inductor_cpu", "local_only": True},
}
# Treatments that change the training forward itself (the probe's and the scaling study's treatment rows).
FORWARD_TREATMENTS: tuple[str, ...] = tuple(t for t, e in EFFECTS.items() if {"compiled", "precision"} & set(e))
# Treatments that act inside verl's FSDP workers (through patches.verl_plugin), not through verl's config.
WORKER_TREATMENTS: tuple[str, ...] = ("compile",)


@dataclass(frozen=True)
class Ablation:
    """One value of the grid's ablation axis and what it does; the trainer, the verl overrides, the
    probe and the figures read these fields, never the name."""

    regions: tuple[str, ...]
    treatments: tuple[str, ...] = ()
    color: str = "#777777"              # its colour in every figure (Okabe-Ito first)
    precision: str = "bf16"             # fp16: FP16 on both sides, FP32 master weights, loss scaling
    compiled: bool = False              # the training side's decoder layers run through torch.compile
    rollout_correction: str | None = None  # verl's RolloutCorrectionConfig preset
    reduction: str = "eager"            # the RMSNorm variance's summation order (patches.apply)
    local_only: bool = False            # the verl backend refuses it (no eager code has a GPU kernel's order)
    # vLLM's compilation_config entries the engine runs with (None: its defaults); the rig and verl's
    # rollout both pass them to vLLM
    engine_compilation: dict | None = field(default=None, hash=False)


def forward_treatment(compiled: bool, fp16: bool) -> str:
    """The treatment that changes the training forward itself (a probe row's `treatment`): compile,
    fp16, or "" (aligned regions, rollout corrections and stock change none)."""
    return "compile" if compiled else "fp16" if fp16 else ""


def compose_ablation(regions: tuple[str, ...], treatments: tuple[str, ...], color: str) -> Ablation:
    """An ablation from its regions and treatments: the treatments' effects (EFFECTS) laid together."""
    effects = {}
    for treatment in treatments:
        effects.update(EFFECTS[treatment])
    if regions and effects.get("engine_compilation"):
        # the regions would round like the engine's default table, not the one this config stores
        raise ValueError(f"treatments {treatments} change the engine's compilation: they align no region")
    return Ablation(regions, treatments, color, **effects)


# The ablation axis: name -> (aligned regions, treatments, colour). Adding one is one line here plus
# its tests; the schema enum and the figures' order follow this table (tests/test_config.py).
# Okabe-Ito colours (readable with colour-vision deficiencies): the baseline vermillion, full
# alignment green, single regions the remaining distinct hues, the treatments after them.
ABLATIONS: dict[str, Ablation] = {name: compose_ablation(*spec) for name, spec in {
    "none": ((), (), "#D55E00"),
    "rope": (("rope",), (), "#0072B2"),
    "swiglu": (("swiglu",), (), "#E69F00"),
    "rmsnorm": (("rmsnorm",), (), "#CC79A7"),
    "all": (REGIONS, (), "#009E73"),
    "compile": ((), ("compile",), "#56B4E9"),
    "fp16": ((), ("fp16",), "#000000"),
    "tis": ((), ("tis",), "#8C510A"),
    "mis": ((), ("mis",), "#999999"),
    "geo_rs": ((), ("geo_rs",), "#F0E442"),
    "engine_casts": ((), ("engine_casts",), "#C51B7D"),
    "rope+tis": (("rope",), ("tis",), "#6A3D9A"),
    "all+tis": (REGIONS, ("tis",), "#B8860B"),
    # geo_rs (= none + geo_rs) beside RoPE alone and all three regions aligned
    "rope+geo_rs": (("rope",), ("geo_rs",), "#01665E"),
    "all+geo_rs": (REGIONS, ("geo_rs",), "#7FBC41"),
    # no mismatch at all (local engine): the exact reference of the gradient probe and of the
    # collapse rule's calibration
    "all+engine_order": (REGIONS, ("engine_order",), "#333333"),
}.items()}
# The region subsets the grid runs (what `patches.apply` accepts by name): none, rope, swiglu, rmsnorm, all.
REGION_ABLATIONS: dict[str, tuple[str, ...]] = {name: a.regions for name, a in ABLATIONS.items() if not a.treatments}

# The sections of an experiment config (experiments/*.yaml) besides its top-level keys.
SECTIONS: tuple[str, ...] = ("task", "model_specs", "warmstart", "rl", "engine", "collapse", "data", "verl",
                             "resources", "wandb", "gradprobe", "preregistration")

# Environment variables that carry the alignment into verl's Ray workers (patches.verl_plugin).
REGIONS_ENV = "RLA_REGIONS"
IMPL_ENV = "RLA_IMPL"
TARGET_ENV = "RLA_TARGET"
TREATMENTS_ENV = "RLA_TREATMENTS"  # the WORKER_TREATMENTS of a cell, comma-separated
ENGINE_CONFIG_ENV = "RLA_ENGINE_CONFIG"  # the rollout engine's config (JSON) for target "auto" (patches.engine_table)


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


def local_only(name: str) -> tuple[str, ...]:
    """The treatments of an ablation that only the local backend runs (empty: both backends run it)."""
    return tuple(t for t in treatments_of(name) if EFFECTS[t].get("local_only"))


def subset_name(regions: Iterable[str]) -> str:
    """A set of aligned regions by name: none, rope, rope+swiglu, ..., all (in REGIONS order)."""
    chosen = set(regions)
    ordered = [r for r in REGIONS if r in chosen]
    return "all" if len(ordered) == len(REGIONS) else "+".join(ordered) or "none"
