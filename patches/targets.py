"""Alignment targets: which engine build the training side rounds like, and where that build stores BF16
(docs/patches.md: "Targets"). A Target is its table: the regions read `stores`, never the name, so a new
engine's table needs no new code (`check` refuses one the regions cannot compute, naming the value).
"""

from __future__ import annotations

from dataclasses import dataclass

from rla import names as rla_names

# The values the regions compute, in the order they occur in a decoder layer.
VALUES: dict[str, str] = {
    "qk_norm.normalized": "Qwen3: q/k * rsqrt(mean(q^2) + eps) in the per-head RMSNorm, before `* weight`",
    "qk_norm.out": "Qwen3: q/k after the per-head RMSNorm, before the rotation",
    "rope.product": "the four products x1*cos, x2*sin, x2*cos, x1*sin",
    "rope.out": "q and k after the rotation (`x1*cos - x2*sin`, `x2*cos + x1*sin`)",
    "swiglu.silu": "silu(gate), before `* up`",
    "swiglu.out": "silu(gate) * up, the down projection's input",
    "rmsnorm.normalized": "x * rsqrt(mean(x^2) + eps), before `* weight`",
    "rmsnorm.out": "the norm's output, the next GEMM's input",
    "residual.post_attention": "residual + attention output (read by the post-attention norm)",
    "residual.layer_output": "residual + MLP output: the layer's output, as the next layer keeps it for its residual",
    "residual.norm_input": "the layer's output as the next input norm (or the model's final norm) reads it",
}

# What both targets store (True: rounded to BF16 there; False: kept in FP32 inside a fused kernel).
_COMMON: dict[str, bool] = {
    "qk_norm.normalized": False,    # inside the fused norm (as rmsnorm.normalized)
    "qk_norm.out": False,           # fused with the rotation (vllm/model_executor/models/qwen3.py: q_norm -> rotary_emb)
    "rope.product": False,          # vllm/model_executor/layers/rotary_embedding/common.py: o1 = x1 * cos - x2 * sin
    "rope.out": True,               # attention input: a buffer
    "swiglu.silu": False,           # vllm/model_executor/layers/activation.py SiluAndMul.forward_native: silu(x[:d]) * x[d:]
    "swiglu.out": True,             # down_proj input
    "rmsnorm.normalized": False,    # vllm/ir/ops/layernorm.py: `x = x.to(weight.dtype) * weight`, the cast elided
    "rmsnorm.out": True,            # qkv / gate_up input
    "residual.post_attention": False,  # inside one piece (GPU) or one graph (CPU): `x_residual = x.to(orig_dtype)` elided
    "residual.norm_input": False,   # vllm/ir/ops/layernorm.py fused_add_rms_norm: the variance of `x`, the unrounded sum
}


# Values a region hands to an op outside it (attention, a GEMM), which reads them in the activation
# dtype: every table stores them.
HANDED_ON = ("rope.out", "swiglu.out", "rmsnorm.out")


@dataclass(frozen=True)
class Target:
    """A table of where an engine stores BF16. `patches.apply` reads the table, never the name: a
    Target under any name with a named target's table rounds exactly as that target does."""

    name: str
    engine: str
    stores: dict[str, bool]  # VALUES key -> stored as BF16
    source: str              # where vLLM decides it

    def rounded_inside(self) -> list[str]:
        """The values this table stores that a region computes inside its kernel (not its outputs)."""
        return [v for v, stored in self.stores.items()
                if stored and v not in HANDED_ON + ("residual.layer_output", "residual.norm_input")]

    @property
    def rounds_layer_output(self) -> bool:
        """Whether the residual stream is rounded to BF16 between layers (the only difference)."""
        return self.stores["residual.layer_output"]


TARGETS: dict[str, Target] = {
    "vllm": Target(
        "vllm", "vLLM on a GPU, default compiled path (piecewise graphs split at attention)",
        {**_COMMON, "residual.layer_output": True},
        "vllm/config/compilation.py (mode VLLM_COMPILE, splitting_ops = attention ops); the residual is a piece "
        "output, stored in its graph dtype",
    ),
    "vllm-cpu": Target(
        "vllm-cpu", "vLLM's CPU build (one graph for the whole model)",
        {**_COMMON, "residual.layer_output": False},
        "vllm/platforms/cpu.py (mode DYNAMO_TRACE_ONCE: no split); no piece output carries the residual",
    ),
}
DEFAULT_TARGET = rla_names.DEFAULT_TARGET
# Stock transformers as a table (no engine's): every value rounded after its op. Under it every spec
# gives stock's logits bit for bit (tests/test_patches_tables.py).
EAGER = Target("eager", "every value rounded after its op (stock transformers)", {value: True for value in VALUES},
               "transformers' eager modules: each op's output in the activation dtype")
assert tuple(TARGETS) == rla_names.TARGETS, "rla.names.TARGETS and patches.targets.TARGETS must name the same targets"

def check(target: Target) -> Target:
    """`target` if the regions can round as its table says, else a ValueError naming the value."""
    where = f"alignment target {target.name!r}"
    if set(target.stores) != set(VALUES):
        missing, unknown = sorted(set(VALUES) - set(target.stores)), sorted(set(target.stores) - set(VALUES))
        raise ValueError(f"{where}: its table must say, for each of {', '.join(VALUES)}, whether it is stored"
                         + (f"; missing {', '.join(missing)}" if missing else "")
                         + (f"; unknown {', '.join(unknown)}" if unknown else ""))
    for value, stored in target.stores.items():
        if not isinstance(stored, bool):
            raise ValueError(f"{where}: {value} is {stored!r}; allowed: True (stored as BF16) or False (kept in FP32)")
        if value in HANDED_ON and not stored:
            raise ValueError(f"{where}: {value} kept in FP32 - {VALUES[value]} - is read by an op outside the "
                             "regions in the activation dtype; no table can keep it in FP32")
    return target


def resolve(target: str | Target) -> Target:
    """A target's table: a name of TARGETS, or a Target (checked)."""
    if isinstance(target, Target):
        return check(target)
    if isinstance(target, str) and target in TARGETS:
        return TARGETS[target]
    raise ValueError(f"unknown alignment target {target!r}; allowed: {', '.join(TARGETS)}, auto (read off the installed "
                     "engine: patches/engine_table.py), or a patches.targets.Target")
