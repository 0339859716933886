"""Which transformers attributes each region replaces, per model family (one entry per family). Patches
are class- and module-level, so models built before and after `apply` both use them (verl builds its
models inside Ray workers). The copied forwards were checked per release: patches/upstream.py.
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
        of the one it replaces (what `inspect.signature` sees: transformers' Trainer, generation, PEFT),
        and a decoder layer's forward the gradient-checkpointing wrapper of its release (`layer_forwards`)."""
        out = []
        for owner, attr, new in self._replacements(regions):
            if attr.startswith("_rla"):
                out.append((owner, attr, new))
            elif owner is self.cls("DecoderLayer"):
                out += layer_forwards(owner, stock_signature(new, vars(owner)[attr]))
            else:
                out.append((owner, attr, stock_signature(new, vars(owner)[attr])))
        return out

    def cache_arg(self) -> str:
        """The name the release gives the KV cache argument of attention and decoder layers: `cache`
        from transformers 5.24, `past_key_values` before (the copied forwards pass it on by this name)."""
        return "cache" if "cache" in inspect.signature(self.cls("Attention").forward).parameters else "past_key_values"

    def _replacements(self, regions) -> list[tuple[object, str, object]]:
        m, cls = self.modeling(), self.cls
        out = []
        if "rope" in regions:
            out += [(m, "apply_rotary_pos_emb", rope.apply_rotary_pos_emb),
                    (cls("RotaryEmbedding"), "forward", rope.rotary_embedding_forward)]
            if self.qk_norm:
                out += [(cls("Attention"), "_rla_modeling", m),
                        (cls("Attention"), "_rla_cache_arg", self.cache_arg()),
                        (cls("Attention"), "forward", rope.qwen3_attention_forward)]
        if "swiglu" in regions:
            out.append((cls("MLP"), "forward", swiglu.mlp_forward))
        if "rmsnorm" in regions:
            norm, model = cls("RMSNorm"), cls("Model")
            out += [(cls("DecoderLayer"), "_rla_cache_arg", self.cache_arg()),
                    (cls("DecoderLayer"), "forward", rmsnorm.decoder_layer_forward),
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


def _wraps_forward_per_class() -> bool:
    """transformers >= 5.23: `GradientCheckpointingLayer.__init_subclass__` wraps each layer class's
    `forward` for gradient checkpointing when the class is created (FSDP2's per-module subclasses too);
    before, `__call__` checkpointed."""
    from transformers.modeling_layers import GradientCheckpointingLayer  # here: `import patches` loads no transformers

    return "__init_subclass__" in vars(GradientCheckpointingLayer)


def _wrapped(cls: type, forward):
    """`forward` wrapped as the release wraps the forward of a new subclass of `cls` (the class made for
    it is dropped; only its wrapper is kept)."""
    return type(cls.__name__, (cls,), {"forward": forward, "_rla_wrapper_only": True}).__dict__["forward"]


def layer_forwards(cls: type, new) -> list[tuple[object, str, object]]:
    """The replacement of a decoder layer class's forward. Where the release wraps forwards per class,
    the new forward gets the same wrapper (else gradient checkpointing would be dropped), and every
    subclass that already wrapped stock's - an FSDP2-sharded layer's class, made before `apply` - a
    wrapper of the new one (else it would keep running stock's)."""
    if not _wraps_forward_per_class():
        return [(cls, "forward", new)]
    out = [(cls, "forward", _wrapped(cls, new))]
    pending = list(cls.__subclasses__())
    while pending:
        sub = pending.pop()
        if "forward" in vars(sub) and not vars(sub).get("_rla_wrapper_only"):
            parent = next(value for owner, _, value in reversed(out) if issubclass(sub, owner))
            out.append((sub, "forward", _wrapped(sub, parent)))
        pending += sub.__subclasses__()
    return out


FAMILIES: dict[str, Family] = {
    "qwen2": Family("qwen2", "transformers.models.qwen2.modeling_qwen2", "Qwen2", qk_norm=False),  # Qwen2, Qwen2.5, R1-Distill-Qwen
    "qwen3": Family("qwen3", "transformers.models.qwen3.modeling_qwen3", "Qwen3", qk_norm=True),
}


def decoder_layers(model) -> list:
    """The model's decoder layers in order, of any family (a module class named *DecoderLayer)."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
