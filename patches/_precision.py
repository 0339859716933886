"""Compute dtype and reduction order shared by the aligned regions.

Compute dtype: fp32 for bf16/fp16/fp32 inputs (what the engine's fused kernels use); float64 is kept
as is so that torch.autograd.gradcheck can check the backward passes.

Reduction order: the RMSNorm variance is a sum, and two correct kernels may add in different orders
(a 1-ulp fp32 difference in a few rows, which sometimes flips a bf16 rounding). Rounding locations
are what the patches align; the order is a kernel detail. "eager" uses torch's own mean, as HF eager
does on any device. "inductor_cpu" reproduces the order of Inductor's C++ reductions on x86 CPUs
(16 lane-wise partial sums over the row, then a halving tree), so that on a CPU the aligned training
side can be compared with a compiled engine bit for bit.
"""

import torch

REDUCTIONS = ("eager", "inductor_cpu")
_reduction = "eager"


def wide(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


def set_reduction(name: str) -> None:
    global _reduction
    if name not in REDUCTIONS:
        raise ValueError(f"unknown reduction order {name!r}; allowed: {', '.join(REDUCTIONS)}")
    _reduction = name


def reduction() -> str:
    return _reduction


def mean_square(x: torch.Tensor) -> torch.Tensor:
    """mean(x**2) over the last dim, keepdim, in the configured order."""
    lanes = 16
    width = x.shape[-1]
    if _reduction == "eager" or width % lanes:
        return x.pow(2).mean(dim=-1, keepdim=True)
    blocks = x.pow(2).unflatten(-1, (width // lanes, lanes))
    acc = blocks[..., 0, :]
    for j in range(1, width // lanes):  # each lane accumulates its column in row order
        acc = acc + blocks[..., j, :]
    while acc.shape[-1] > 1:  # horizontal reduction: fold halves
        half = acc.shape[-1] // 2
        acc = acc[..., :half] + acc[..., half:]
    return acc / width
