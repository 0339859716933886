"""Compute dtype, summation order, implementation and target shared by the aligned regions
(docs/numerics.md: "Summation order", "Fused kernels"; docs/patches.md: "Targets").

Compute dtype: FP32 for BF16/FP16/FP32 inputs; float64 is kept as is so that torch.autograd.gradcheck can
check the backward passes. Every region is a pair of pure functions (forward, backward) wrapped in an
autograd Function, run op by op ("eager") or compiled ("fused", patches/fused.py).
"""

import contextlib
from collections.abc import Callable

import torch

from patches.fused import compiled
from patches.targets import DEFAULT_TARGET, TARGETS, Target

REDUCTIONS = ("eager", "inductor_cpu", "vllm_cpu_graph")
IMPLS = ("auto", "eager", "fused")
_reduction = "eager"
_impl = "auto"
_target = TARGETS[DEFAULT_TARGET]
_stream_patterns: dict[tuple[str, int], tuple[bool, ...]] = {}  # (family, layers) -> graph_stores_stream's pattern


def wide(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


def wide_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh tensor in the compute dtype, safe to update in place."""
    return t.to(torch.float64 if t.dtype == torch.float64 else torch.float32, copy=True)


def check(value: str, allowed: tuple[str, ...], what: str) -> str:
    """`value` if allowed, else a ValueError naming it and the allowed ones."""
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed: {', '.join(allowed)}")
    return value


def set_reduction(name: str) -> None:
    global _reduction
    _reduction = check(name, REDUCTIONS, "reduction order")


def reduction() -> str:
    return _reduction


def set_impl(name: str) -> None:
    global _impl
    _impl = check(name, IMPLS, "implementation")


def impl() -> str:
    return _impl


def set_target(target: Target) -> None:
    global _target
    _target = target  # patches.apply, its one caller with a user's value, checked its table first


def target() -> Target:
    """The engine build the aligned regions round like (patches/targets.py)."""
    return _target


def stored(value: str) -> bool:
    """Whether the target's table stores `value` (patches/targets.py VALUES) in the activation dtype."""
    return _target.stores[value]


def round_if(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`t` rounded to `dtype` and widened back (a stored value, as eager code rounds it), or `t` (None)."""
    return t if dtype is None else t.to(dtype).to(t.dtype)


def check_kernel_roundings(device: torch.device) -> None:
    """Compiled kernels (impl "fused", or "auto" on CUDA) and Inductor's sums (reduction not "eager")
    drop a rounding inside a kernel (Inductor elides a downcast that is only upcast again), so a table
    that stores a value inside a region runs eager only: refuse it, naming the values."""
    inside = _target.rounded_inside()
    if inside and (uses_fused(device) or _reduction != "eager"):
        raise ValueError(f"alignment target {_target.name!r} stores {', '.join(inside)} inside a region, which "
                         f"compiled kernels do not keep (Inductor elides the rounding): use impl='eager' and "
                         f"reduction='eager' with it (now impl={_impl!r}, reduction={_reduction!r})")


@contextlib.contextmanager
def using(impl: str = "auto", reduction: str = "eager"):
    """The region functions with this implementation and summation order inside the block (restored
    after it); `patches.aligned` does the same for whole models."""
    previous = (_impl, _reduction)
    try:  # a bad value raises here, and the previous state comes back as after the block
        set_impl(impl)
        set_reduction(reduction)
        yield
    finally:
        set_impl(previous[0])
        set_reduction(previous[1])


def uses_fused(device: torch.device) -> bool:
    return _impl == "fused" or (_impl == "auto" and device.type == "cuda")


def kernel(fn: Callable, like: torch.Tensor) -> Callable:
    """`fn` itself, or its compiled version when the fused implementation is selected for `like`'s device."""
    return compiled(fn) if uses_fused(like.device) else fn


def sums_by_inductor() -> bool:
    """Whether sums run as their own Inductor kernels: reduction="inductor_cpu" or "vllm_cpu_graph", outside
    a compiled region (inside one, Inductor already sums in its own order)."""
    return _reduction != "eager" and not torch.compiler.is_compiling()


def sums_as_the_graph() -> bool:
    """Whether each norm sums as vLLM-CPU's compiled graph tiles it (reduction="vllm_cpu_graph")."""
    return _reduction == "vllm_cpu_graph"


def graph_stores_stream(config, layer_idx: int) -> bool:
    """Whether vLLM-CPU's graph stores the FP32 stream at layer `layer_idx`'s post-attention norm, in a model
    of `config` (its `model_type` and `num_hidden_layers`): read off the graph vLLM compiles here
    (`patches.engine_table.stream_pattern`, cached on disk), once per family and depth in a process. Read
    and checked against vLLM-CPU's samples on AVX2 only; AVX-512 and AMX machines are unchecked."""
    key = (config.model_type, config.num_hidden_layers)
    if key not in _stream_patterns:
        # imported here: `python -m patches.engine_table` must not find itself imported
        from patches import engine_table

        _stream_patterns[key] = engine_table.stream_pattern(*key)
    return _stream_patterns[key][layer_idx]


def forget_stream_patterns() -> None:
    """Drop the patterns read in this process (`patches.remove`): the next use reads them again."""
    _stream_patterns.clear()


def inductor_sums(fn: Callable, *args):
    """`fn(*args)` compiled on its own, where `fn` computes sums from a region's bf16 inputs with the
    region's own expression: Inductor then tiles and orders them as inside the region's kernel (the
    tiling follows the inputs' dtypes, so the inputs must be the kernel's, not fp32 copies)."""
    return compiled(fn)(*args)


def mean_square(s: torch.Tensor) -> torch.Tensor:
    """An RMSNorm's variance: the row mean of s^2."""
    return s.pow(2).mean(dim=-1, keepdim=True)


def norm_sums(g: torch.Tensor, w: torch.Tensor, x_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An RMSNorm backward's sums: the row mean of g_hat * x_hat (g_hat = g * w), and the weight gradient,
    g * x_hat summed over every dim but the last (all tokens and heads)."""
    mean = ((g * w) * x_hat).mean(dim=-1, keepdim=True)
    per_feature = g * x_hat
    return mean, per_feature.reshape(-1, per_feature.shape[-1]).sum(0)


def norm_backward(g: torch.Tensor, w: torch.Tensor, x_hat: torch.Tensor, rstd: torch.Tensor,
                  sums: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An RMSNorm's (input gradient, weight gradient) in the compute dtype, from the upstream gradient `g`,
    the weight `w` and the normalized input `x_hat`; `sums`: `norm_sums` summed in Inductor's order
    (`inductor_sums`), or None for torch's."""
    mean, d_weight = norm_sums(g, w, x_hat) if sums is None else sums
    return rstd * ((g * w) - x_hat * mean), d_weight
