"""Compute dtype, reduction order and implementation shared by the aligned regions.

Compute dtype: fp32 for bf16/fp16/fp32 inputs (what the engine's fused kernels use); float64 is kept
as is so that torch.autograd.gradcheck can check the backward passes.

Reduction order: the RMSNorm variance (and the backward's row sums) are sums, and two correct kernels
may add in different orders (a 1-ulp fp32 difference in a few rows, which sometimes flips a bf16
rounding). Rounding locations are what the patches align; the order is a kernel detail. "eager" uses
torch's own mean and sum, as HF eager does on any device. "inductor_cpu" reproduces the order of
Inductor's C++ reductions on x86 CPUs (a row: 16 lane-wise partial sums, then a halving tree; a
column over tokens, for weight gradients: row after row), so that on a CPU the aligned training side
can be compared with a compiled engine, and the eager implementation with the fused one, bit for bit.

Implementation: every region is a pair of pure functions (forward, backward) wrapped in an autograd
Function. "eager" runs them op by op; "fused" runs them compiled (patches/fused.py: one or a few
fused kernels each, same rounding locations, the kernel's own summation order); "auto" is fused on
CUDA and eager elsewhere.
"""

from collections.abc import Callable

import torch

REDUCTIONS = ("eager", "inductor_cpu")
IMPLS = ("auto", "eager", "fused")
_reduction = "eager"
_impl = "auto"


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


def uses_fused(device: torch.device) -> bool:
    return _impl == "fused" or (_impl == "auto" and device.type == "cuda")


def kernel(fn: Callable, like: torch.Tensor) -> Callable:
    """`fn` itself, or its compiled version when the fused implementation is selected for `like`'s device."""
    if not uses_fused(like.device):
        return fn
    from patches import fused  # imported on first use: compiling needs Inductor, eager does not

    return fused.compiled(fn)


def row_mean(x: torch.Tensor) -> torch.Tensor:
    """mean over the last dim, keepdim, in the configured order (a compiled kernel: its own order)."""
    lanes = 16
    width = x.shape[-1]
    if torch.compiler.is_compiling() or _reduction == "eager" or width % lanes:
        return x.mean(dim=-1, keepdim=True)
    blocks = x.unflatten(-1, (width // lanes, lanes))
    acc = blocks[..., 0, :]
    for j in range(1, width // lanes):  # each lane accumulates its column in row order
        acc = acc + blocks[..., j, :]
    while acc.shape[-1] > 1:  # horizontal reduction: fold halves
        half = acc.shape[-1] // 2
        acc = acc[..., :half] + acc[..., half:]
    return acc / width


def column_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over every dim but the last (a weight gradient over tokens), in the configured order."""
    rows = x.reshape(-1, x.shape[-1])
    if torch.compiler.is_compiling() or _reduction == "eager":
        return rows.sum(0)
    acc = rows[0].clone()
    for row in rows[1:]:  # Inductor's C++ column reduction adds the rows in order (a slow, test-only mode)
        acc += row
    return acc


def mean_square(x: torch.Tensor) -> torch.Tensor:
    """mean(x**2) over the last dim, keepdim, in the configured order."""
    return row_mean(x.pow(2))
