"""SwiGLU region: `silu(gate) * up` in fp32, rounded once.

Stock HF rounds `silu(gate)` and then the product (2 roundings); the compiled engine computes
`silu(x[..., :d]) * x[..., d:]` in one fused kernel. The backward saves gate and up (bf16), as
stock does, and recomputes sigmoid in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from patches._precision import check_kernel_roundings, kernel, stored, wide_copy
from patches.errors import UnsupportedModelError


def swiglu_forward(gate: Tensor, up: Tensor, silu_stored: bool = False) -> Tensor:
    # in place on one fp32 copy: fewer full-size temporaries; `h *= up` widens up exactly. A table that
    # stores swiglu.silu gets it as eager code computes it: silu in the activation dtype.
    h = wide_copy(F.silu(gate)) if silu_stored else F.silu(wide_copy(gate), inplace=True)
    return h.mul_(up).to(gate.dtype)


def swiglu_backward(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    # d_up = dy * (g * sig);  d_gate = dy * u * sig * (1 + g * (1 - sig)), evaluated left to right
    g = wide_copy(gate)
    sig = torch.sigmoid(g)
    tail = (1 - sig).mul_(g).add_(1)
    d_gate = wide_copy(grad).mul_(up).mul_(sig).mul_(tail)
    d_up = g.mul_(sig).mul_(grad)
    return d_gate.to(gate.dtype), d_up.to(up.dtype)


CHUNK_ELEMENTS = 1 << 18  # eager on a CPU: fp32 temporaries of ~1 MiB stay in cache instead of streaming memory


def _in_row_blocks(fn, *tensors):
    """Apply an elementwise `fn` block of rows by block (same values; eager only)."""
    shape = tensors[0].shape
    flat = [t.reshape(-1, shape[-1]) for t in tensors]
    rows = max(1, CHUNK_ELEMENTS // shape[-1])
    if flat[0].shape[0] <= rows:
        return fn(*tensors)
    blocks = [fn(*(t[i:i + rows] for t in flat)) for i in range(0, flat[0].shape[0], rows)]
    if isinstance(blocks[0], tuple):
        return tuple(torch.cat(parts).view(shape) for parts in zip(*blocks))
    return torch.cat(blocks).view(shape)


def _run(fn, *tensors):
    compiled = kernel(fn, tensors[0])
    if compiled is not fn:
        return compiled(*tensors)
    # Blocks help a CPU's cache only: on a GPU each block is a dozen kernel launches, and a Qwen2.5-7B MLP's
    # 630 blocks made the eager region 90x slower than stock on an H200 (benchmarks/results/gpu-check).
    return _in_row_blocks(fn, *tensors) if tensors[0].device.type == "cpu" else fn(*tensors)


class SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        check_kernel_roundings(gate.device)
        if stored("swiglu.silu"):
            return _run(lambda g, u: swiglu_forward(g, u, True), gate, up)
        return _run(swiglu_forward, gate, up)

    @staticmethod
    def backward(ctx, grad: Tensor):
        gate, up = ctx.saved_tensors
        return _run(swiglu_backward, grad, gate, up)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return SwiGLU.apply(gate, up)


SILU = ("silu", "swish")


def check_activation(mlp) -> None:
    """The aligned SwiGLU computes silu(gate) * up: refuse an MLP with another activation."""
    act = mlp.config.hidden_act
    if act not in SILU:
        raise UnsupportedModelError(f"{type(mlp).__name__}: hidden_act {act!r} is not covered by the aligned SwiGLU "
                                    f"(it computes silu(gate) * up; supported: {', '.join(SILU)})")


def mlp_forward(self, x):
    """Drop-in for Qwen2MLP/Qwen3MLP.forward (SiLU-gated MLP); any other activation is refused."""
    check_activation(self)
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
