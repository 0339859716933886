"""Rounding-location alignment for transformers' Qwen2/Qwen2.5/Qwen3: make the training side round
where the compiled inference engine rounds, in three regions (RoPE, SwiGLU, residual RMSNorm).
The API (`apply`, `aligned`, `remove`, `check_model`), the regions and the targets: docs/patches.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from patches import _precision, rope, swiglu
from patches import compile as _compile
from patches.errors import UnsupportedModelError
from patches._precision import IMPLS, REDUCTIONS
from patches.registry import FAMILIES, decoder_layers
from patches import targets
from patches.targets import DEFAULT_TARGET, TARGETS, Target
from patches.upstream import check_transformers
from rla.names import REGION_ABLATIONS as ABLATIONS  # patches know regions only
from rla.names import REGIONS

_MISSING = object()
_saved: list[tuple[object, str, object]] = []  # (owner, attribute, stock value) in patch order
_active: frozenset[str] = frozenset()


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
    _precision.set_target(TARGETS[DEFAULT_TARGET])
    _precision.forget_stream_patterns()
    while _saved:
        owner, attr, stock = _saved.pop()
        if stock is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, stock)
    _active = frozenset()


def apply(spec: str | Iterable[str] | None, *, target: str | Target = DEFAULT_TARGET, reduction: str = "eager",
          impl: str = "auto") -> frozenset[str]:
    """Align the given regions for every supported family in this process; returns the active set.
    Idempotent; a new spec replaces the previous one. `target`: a named target, "auto" or a
    `patches.targets.Target` (docs/patches.md: "Targets"); `reduction`: the norms' summation order
    (docs/numerics.md: "Summation order"); `impl`: "eager", "fused" or "auto" (fused on CUDA tensors)."""
    global _active
    regions = resolve(spec)
    # checked before anything changes: a bad value leaves the current state in place
    if target == "auto":
        # imported here, not at the top: `python -m patches.engine_table` must not find itself imported
        from patches import engine_table

        table = engine_table.auto_target()
    else:
        table = targets.resolve(target)
    _precision.check(reduction, REDUCTIONS, "reduction order")
    _precision.check(impl, IMPLS, "implementation")
    check_transformers()
    _remove_regions()
    _precision.set_target(table)
    _precision.set_reduction(reduction)
    _precision.set_impl(impl)
    replacements = [(owner, attr, new) for family in FAMILIES.values() for owner, attr, new in family.replacements(regions)]
    if regions:
        from transformers import PreTrainedModel  # here: `import patches` loads no transformers until a model is patched

        replacements += [(PreTrainedModel, "_rla_stock_post_init", PreTrainedModel.__dict__["post_init"]),
                         (PreTrainedModel, "post_init", _checked_post_init)]
    for owner, attr, new in replacements:
        _saved.append((owner, attr, vars(owner).get(attr, _MISSING)))
        setattr(owner, attr, new)
    _active = regions
    return _active


def active() -> frozenset[str]:
    return _active


def active_target() -> str:
    return _precision.target().name


def active_table() -> Target:
    """The table the regions round by (the resolved target)."""
    return _precision.target()


@contextlib.contextmanager
def aligned(spec: str | Iterable[str] | None, *, target: str | Target = DEFAULT_TARGET, reduction: str = "eager",
            impl: str = "auto"):
    """Apply `spec` inside the block; restore the previous state on exit."""
    previous = dict(spec=_active, target=_precision.target(), reduction=_precision.reduction(), impl=_precision.impl())
    try:
        yield apply(spec, target=target, reduction=reduction, impl=impl)
    finally:
        apply(previous.pop("spec"), **previous)


def check_model(model, regions: str | Iterable[str] = REGIONS) -> str:
    """Return the model's family name ("qwen2", "qwen3"), or raise UnsupportedModelError naming the
    model, the setting and what is supported (docs/patches.md: what the patches refuse). `regions` is a
    spec as `apply` takes it."""
    regions = resolve(regions)  # a string's `in` would test substrings: "swiglu" in "all" is False
    supported = {family.cls("DecoderLayer"): family for family in FAMILIES.values()}
    layers = decoder_layers(model)
    names = ", ".join(c.__name__ for c in supported)
    name = type(model).__name__
    if not layers:
        raise UnsupportedModelError(f"{name} has no decoder layers the patches know; supported: {names}")
    families = set()
    for layer in layers:
        family = supported.get(type(layer))
        mlp = getattr(layer, "mlp", None)
        if family is None or type(mlp) is not family.cls("MLP"):
            raise UnsupportedModelError(
                f"{name}: {type(layer).__name__} with {type(mlp).__name__} is not covered by the alignment patches; "
                f"supported: {names} with their dense SiLU MLPs"
            )
        families.add(family.name)
        if "swiglu" in regions:
            swiglu.check_activation(mlp)
    if "rope" in regions:
        rotary = tuple(family.cls("RotaryEmbedding") for family in FAMILIES.values())
        for module in model.modules():
            if isinstance(module, rotary):
                rope.check_rope(module)
    return ",".join(sorted(families))


def _checked_post_init(self):
    """PreTrainedModel.post_init while regions are applied: stock, then `check_model` for a model with
    decoder layers, so that an uncovered model fails where it is built (verl's workers, the trainer)."""
    from transformers import PreTrainedModel  # here: `import patches` loads no transformers until a model is patched

    PreTrainedModel._rla_stock_post_init(self)  # post_init(self): every checked release
    if decoder_layers(self):
        check_model(self, _active)


__all__ = ["REGIONS", "ABLATIONS", "REDUCTIONS", "IMPLS", "TARGETS", "DEFAULT_TARGET", "apply", "remove", "active",
           "active_target", "active_table", "aligned", "resolve", "check_model", "UnsupportedModelError"]
