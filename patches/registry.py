"""Which transformers attributes each region replaces, per model family (one entry per family).

Patches are class- and module-level, so models built before and after `apply` both use them -
verl builds its models inside Ray workers, after `external_lib` has been imported.

The replacements copy transformers' own forwards (Qwen3Attention, the decoder layers) with the
regions swapped in; patches/upstream.py holds the source they were checked against, per release.
"""

from __future__ import annotations

import importlib
import inspect
import types
from dataclasses import dataclass

from patches import rmsnorm, rope, swiglu


@dataclass(frozen=True)
class Family:
    name: str
    module: str   # transformers modeling module
    prefix: str   # class-name prefix in that module
    qk_norm: bool  # Qwen3: per-head q/k RMSNorm on the RoPE path

    def modeling(self):
        return importlib.import_module(self.module)

    def cls(self, suffix: str):
        return getattr(self.modeling(), self.prefix + suffix)

    def replacements(self, regions) -> list[tuple[object, str, object]]:
        """(owner, attribute, new value) for the given regions; each new function carries the signature
        of the one it replaces (what `inspect.signature` sees: transformers' Trainer, generation, PEFT)."""
        return [(owner, attr, new if attr.startswith("_rla") else stock_signature(new, vars(owner)[attr]))
                for owner, attr, new in self._replacements(regions)]

    def _replacements(self, regions) -> list[tuple[object, str, object]]:
        m, cls = self.modeling(), self.cls
        out = []
        if "rope" in regions:
            out += [(m, "apply_rotary_pos_emb", rope.apply_rotary_pos_emb),
                    (cls("RotaryEmbedding"), "forward", rope.rotary_embedding_forward)]
            if self.qk_norm:
                out += [(cls("Attention"), "_rla_modeling", m),
                        (cls("Attention"), "forward", rope.qwen3_attention_forward)]
        if "swiglu" in regions:
            out.append((cls("MLP"), "forward", swiglu.mlp_forward))
        if "rmsnorm" in regions:
            norm, model = cls("RMSNorm"), cls("Model")
            out += [(cls("DecoderLayer"), "forward", rmsnorm.decoder_layer_forward),
                    (norm, "_rla_stock_forward", norm.__dict__["forward"]),
                    (norm, "forward", rmsnorm.norm_forward),
                    (model, "_rla_stock_forward", model.__dict__["forward"]),
                    (model, "forward", rmsnorm.model_forward)]
        return out


def stock_signature(new: types.FunctionType, stock) -> types.FunctionType:
    """A copy of `new` (same code, no wrapper call) whose signature is `stock`'s: one replacement serves
    both families, whose stock signatures may differ."""
    copy = types.FunctionType(new.__code__, new.__globals__, new.__name__, new.__defaults__, new.__closure__)
    copy.__kwdefaults__, copy.__doc__, copy.__qualname__ = new.__kwdefaults__, new.__doc__, new.__qualname__
    copy.__signature__ = inspect.signature(stock)
    return copy


FAMILIES: dict[str, Family] = {
    "qwen2": Family("qwen2", "transformers.models.qwen2.modeling_qwen2", "Qwen2", qk_norm=False),  # Qwen2, Qwen2.5, R1-Distill-Qwen
    "qwen3": Family("qwen3", "transformers.models.qwen3.modeling_qwen3", "Qwen3", qk_norm=True),
}


def decoder_layers(model) -> list:
    """The model's decoder layers in order, of any family (a module class named *DecoderLayer)."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
