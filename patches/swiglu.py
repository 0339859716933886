"""SwiGLU region: `silu(gate) * up` in fp32, rounded once.

Stock HF rounds `silu(gate)` and then the product (2 roundings); the compiled engine computes
`silu(x[..., :d]) * x[..., d:]` in one fused kernel. The backward saves gate and up (bf16), as
stock does, and recomputes sigmoid in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from patches._precision import wide


class SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return (F.silu(wide(gate)) * wide(up)).to(gate.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        gate, up = ctx.saved_tensors
        g, u, dy = wide(gate), wide(up), wide(grad)
        sig = torch.sigmoid(g)
        d_up = dy * (g * sig)
        d_gate = dy * u * sig * (1 + g * (1 - sig))
        return d_gate.to(gate.dtype), d_up.to(up.dtype)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return SwiGLU.apply(gate, up)


def mlp_forward(self, x):
    """Drop-in for Qwen2MLP/Qwen3MLP.forward (SiLU-gated MLP)."""
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
