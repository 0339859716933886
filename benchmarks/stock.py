"""transformers' stock formulas written out, for the benchmarks and the tests that compare against them."""

import torch


def stock_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' Qwen2RMSNorm/Qwen3RMSNorm.forward, written out (it also runs in float64, and stays
    stock while the patches replace the module's forward); checked equal in tests/test_bench_regions.py."""
    xf = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
