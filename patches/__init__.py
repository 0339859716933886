"""Rounding-location alignment for transformers' Qwen2/Qwen2.5/Qwen3: make the training side round
where the compiled inference engine rounds, in three regions (RoPE, SwiGLU, residual RMSNorm).

    import patches
    patches.apply("all")          # or "rope", "swiglu,rmsnorm", ("rope",), "none"
    patches.check_model(model)    # raises if some layer is not covered
    with patches.aligned("rope"): ...
    patches.remove()              # stock transformers again, bit for bit (and no compiled layers)
    patches.apply("all", reduction="inductor_cpu")  # + a CPU-compiled engine's summation order
    patches.apply("all", impl="fused")  # compiled region kernels (the default on CUDA: impl="auto")

GEMMs, attention, embeddings, the engine and the loss are untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from patches import _precision
from patches import compile as _compile
from patches._precision import IMPLS, REDUCTIONS
from patches.registry import FAMILIES, check_transformers
from rla.names import REGION_ABLATIONS as ABLATIONS  # patches know regions only
from rla.names import REGIONS

_MISSING = object()
_saved: list[tuple[object, str, object]] = []  # (owner, attribute, stock value) in patch order
_active: frozenset[str] = frozenset()


class UnsupportedModelError(ValueError):
    """The model has layers the patches do not cover: applying them would be a silent no-op."""


def _bad_spec(value) -> ValueError:
    return ValueError(
        f"unknown alignment spec {value!r}: use an ablation ({', '.join(ABLATIONS)}), "
        f"a region ({', '.join(REGIONS)}), a comma-separated list of regions, or an iterable of regions"
    )


def resolve(spec: str | Iterable[str] | None) -> frozenset[str]:
    """Spec -> frozenset of region names. None or "" means none."""
    if spec is None:
        return frozenset()
    if isinstance(spec, str):
        name = spec.strip()
        if name in ABLATIONS:
            return frozenset(ABLATIONS[name])
        items = [part.strip() for part in name.split(",")] if name else []
    else:
        try:
            items = list(spec)
        except TypeError:
            raise _bad_spec(spec) from None
    for item in items:
        if not isinstance(item, str) or item not in REGIONS:
            raise _bad_spec(item)
    return frozenset(items)


def remove() -> None:
    """Restore stock transformers: no aligned region, no compiled decoder layer (patches/compile.py)."""
    _remove_regions()
    _compile.remove()


def _remove_regions() -> None:
    global _active
    _precision.set_reduction("eager")
    _precision.set_impl("auto")
    while _saved:
        owner, attr, stock = _saved.pop()
        if stock is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, stock)
    _active = frozenset()


def apply(spec: str | Iterable[str] | None, *, reduction: str = "eager", impl: str = "auto") -> frozenset[str]:
    """Align the given regions for every supported family in this process; returns the active set.
    Idempotent; a new spec replaces the previous one. `reduction` is the RMSNorm variance's summation
    order (see patches/_precision.py): "eager" (torch's) or "inductor_cpu". `impl` runs the regions
    "eager" (op by op), "fused" (compiled kernels, same rounding locations) or "auto" (fused on CUDA
    tensors, eager on others)."""
    global _active
    regions = resolve(spec)
    # checked before anything changes: a bad value leaves the current state in place
    _precision.check(reduction, REDUCTIONS, "reduction order")
    _precision.check(impl, IMPLS, "implementation")
    check_transformers()
    _remove_regions()
    _precision.set_reduction(reduction)
    _precision.set_impl(impl)
    for family in FAMILIES.values():
        for owner, attr, new in family.replacements(regions):
            _saved.append((owner, attr, vars(owner).get(attr, _MISSING)))
            setattr(owner, attr, new)
    _active = regions
    return _active


def active() -> frozenset[str]:
    return _active


@contextlib.contextmanager
def aligned(spec: str | Iterable[str] | None, *, reduction: str = "eager", impl: str = "auto"):
    """Apply `spec` inside the block; restore the previous state on exit."""
    previous = (_active, _precision.reduction(), _precision.impl())
    try:
        yield apply(spec, reduction=reduction, impl=impl)
    finally:
        apply(previous[0], reduction=previous[1], impl=previous[2])


def check_model(model) -> str:
    """Return the model's family name, or raise UnsupportedModelError if any decoder layer (or its
    MLP) is not one the patches cover (e.g. Llama, Qwen2-MoE / Qwen3-MoE experts)."""
    supported = {family.cls("DecoderLayer"): family for family in FAMILIES.values()}
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    names = ", ".join(c.__name__ for c in supported)
    if not layers:
        raise UnsupportedModelError(f"{type(model).__name__} has no decoder layers the patches know; supported: {names}")
    families = set()
    for layer in layers:
        family = supported.get(type(layer))
        mlp = getattr(layer, "mlp", None)
        if family is None or type(mlp) is not family.cls("MLP"):
            raise UnsupportedModelError(
                f"{type(layer).__name__} with {type(mlp).__name__} is not covered by the alignment patches; "
                f"supported: {names} with their dense SiLU MLPs"
            )
        act = getattr(model.config, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise UnsupportedModelError(f"hidden_act {act!r} is not covered: the swiglu region assumes silu")
        families.add(family.name)
    return families.pop() if len(families) == 1 else ",".join(sorted(families))


__all__ = ["REGIONS", "ABLATIONS", "REDUCTIONS", "IMPLS", "apply", "remove", "active", "aligned", "resolve", "check_model",
           "UnsupportedModelError"]
