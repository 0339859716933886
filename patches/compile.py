"""The `compile` treatment: the stock training forward with each decoder layer compiled by
torch.compile (Inductor), as FSDP2 users compile per block. Not an alignment: Inductor fuses HF's own
formulations wherever it chooses, so it removes some roundings and keeps others.

A layer's own `forward` is replaced by its compiled version (an instance attribute), so module hooks,
gradient checkpointing and FSDP wrappers stay outside the compiled code, and deleting the attribute gives
back the class's forward. Regions and compilation are independent switches; `patches.remove()` undoes both.
"""

from __future__ import annotations

import weakref

import torch

from patches import registry
from patches.registry import FAMILIES

_compiled: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
_stock_inits: list[tuple[type, object]] = []  # (decoder layer class, its own __init__)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers (what `compile` compiles and the probe records), in order."""
    layers = registry.decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder layers")
    return layers


def compile_layer(layer: torch.nn.Module) -> None:
    """Compile the forward the layer has now (with the regions applied now, if any)."""
    if layer not in _compiled:
        layer.forward = torch.compile(layer.forward)
        _compiled.add(layer)


def compile_layers(model: torch.nn.Module) -> int:
    """Compile every decoder layer of `model`; returns how many."""
    layers = decoder_layers(model)
    for layer in layers:
        compile_layer(layer)
    return len(layers)


def uncompile_layers(model: torch.nn.Module) -> None:
    """Give `model`'s decoder layers their class's forward again."""
    for layer in decoder_layers(model):
        vars(layer).pop("forward", None)
        _compiled.discard(layer)


def is_compiled(layer: torch.nn.Module) -> bool:
    return layer in _compiled


def compile_on_build() -> list[str]:
    """Every Qwen2/Qwen3 decoder layer constructed from now on compiles itself at the end of its
    __init__ (verl builds its models in the workers after importing the plugin). Returns the classes."""
    if _stock_inits:
        return [cls.__name__ for cls, _ in _stock_inits]
    for family in FAMILIES.values():
        cls = family.cls("DecoderLayer")
        stock = cls.__dict__["__init__"]

        def init(self, *args, _stock=stock, **kwargs):
            _stock(self, *args, **kwargs)
            compile_layer(self)

        _stock_inits.append((cls, stock))
        cls.__init__ = init
    return [cls.__name__ for cls, _ in _stock_inits]


def remove() -> None:
    """Compiled layers run their class's forward again; layers built from now on are not compiled."""
    for layer in list(_compiled):
        vars(layer).pop("forward", None)
    _compiled.clear()
    while _stock_inits:
        cls, stock = _stock_inits.pop()
        cls.__init__ = stock
