"""The residual stream between aligned decoder layers: an FP32 tensor carried in BF16 clothing
(docs/patches.md: "How the residual stream travels": why, and what FSDP2 does to it).

`pack` views the FP32 bytes as a BF16 tensor of twice the width and `unpack` views them back. Every reader
of one packed tensor gets the same unpacked view (`_rla_unpacked`), so the gradients of several readers add
up in FP32 before the one bit-cast: two bit-cast gradients added as BF16 would be garbage in the low bits.
A packed tensor is never used in arithmetic: its BF16 values are meaningless.
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
    return Pack.apply(stream.contiguous(), like)


def is_packed(t: Tensor, width: int) -> bool:
    return t.dtype in CARRIERS and t.shape[-1] == 2 * width


def unpack(t: Tensor, width: int) -> Tensor:
    """The stream value of a layer's input or output: the FP32 view of a packed tensor (the same view
    for every reader), or `t` itself."""
    if not is_packed(t, width):
        return t
    view = getattr(t, "_rla_unpacked", None)
    if view is not None and view.requires_grad == (t.requires_grad and torch.is_grad_enabled()):
        return view
    view = Unpack.apply(t)
    if not torch.compiler.is_compiling():  # Dynamo cannot trace attributes set on tensors
        t._rla_unpacked = view
    return view


def keep_parts(packed: Tensor, output: Tensor, before: Tensor) -> Tensor:
    """`packed` (a layer's output stream, `before + output`), remembering its two addends: the next norm
    can then sum from them as an engine kernel that adds and normalises in one does."""
    if not torch.compiler.is_compiling():  # Dynamo cannot trace attributes set on tensors
        packed._rla_parts = (output, before)
    return packed


def parts(t: Tensor) -> tuple[Tensor, Tensor] | None:
    """The (layer output, stream before it) a packed stream was made of (`keep_parts`), or None."""
    return getattr(t, "_rla_parts", None)


def hidden_state(t: Tensor, width: int) -> Tensor:
    """What `output_hidden_states` reports for a layer output: the residual stream at the layer's
    output, rounded to the activation dtype, width `width` - the value a stock layer's output holds."""
    return unpack(t, width).to(t.dtype) if is_packed(t, width) else t
