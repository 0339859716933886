"""The residual stream between aligned decoder layers: an FP32 tensor carried in BF16 clothing.

With the rmsnorm region, a layer's output is the FP32 sum `residual + mlp_out` (never rounded on
either target; `vllm` rounds it when the next layer reads it as its residual, `vllm-cpu` never).
FSDP2's `MixedPrecisionPolicy(cast_forward_inputs=True)`, which verl uses, casts every floating
input of a wrapped decoder layer to BF16, and would round it. So the FP32 tensor travels *bit-cast*:
`pack` views its bytes as a BF16 tensor of twice the width (no copy, no arithmetic; the same bytes
as one FP32 tensor), which a BF16 cast leaves untouched, and `unpack` views them back.

Autograd: each packed tensor remembers the FP32 tensor it views (`_rla_stream`), and every reader
takes that one, so gradients from all readers (the next layer, a caller's `output_hidden_states`)
add up in FP32 on the FP32 tensor. A reader that gets the bytes without that history (a reentrant
checkpoint re-running a layer) unpacks them with `Unpack`, whose backward bit-casts the FP32
gradient the same way. A packed tensor is never used in arithmetic: its BF16 values are meaningless.
"""

from __future__ import annotations

import torch
from torch import Tensor

CARRIERS = (torch.bfloat16, torch.float16)  # 2-byte dtypes: two elements hold one FP32 value


class Pack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, stream: Tensor, dtype: torch.dtype) -> Tensor:
        return stream.view(dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad.contiguous().view(torch.float32), None


class Unpack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed: Tensor) -> Tensor:
        ctx.dtype = packed.dtype
        return packed.view(torch.float32)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad.contiguous().view(ctx.dtype)


def pack(stream: Tensor, like: torch.dtype) -> Tensor:
    """The FP32 `stream` as a tensor of dtype `like` (the model's activation dtype). Streams of other
    dtypes (an FP32 or float64 model) travel as they are."""
    if stream.dtype != torch.float32 or like not in CARRIERS:
        return stream
    packed = Pack.apply(stream.contiguous(), like)
    if not torch.compiler.is_compiling():  # Dynamo cannot trace attributes set on tensors
        packed._rla_stream = stream
    return packed


def is_packed(t: Tensor, width: int) -> bool:
    return t.dtype in CARRIERS and t.shape[-1] == 2 * width


def unpack(t: Tensor, width: int) -> Tensor:
    """The stream value of a layer's input or output: the FP32 tensor a packed one views, or `t`."""
    if not is_packed(t, width):
        return t
    stream = getattr(t, "_rla_stream", None)
    if stream is not None and stream.requires_grad == t.requires_grad and stream.data_ptr() == t.data_ptr():
        return stream
    return Unpack.apply(t)


def hidden_state(t: Tensor, width: int) -> Tensor:
    """What `output_hidden_states` reports for a layer output: the residual stream at the layer's
    output, rounded to the activation dtype, width `width` - the value a stock layer's output holds."""
    return unpack(t, width).to(t.dtype) if is_packed(t, width) else t
