"""The GEMM and attention "kernels" both sides of the local rig share (docs/running.md: "The embedded
default"): on a CPU, FP32 on the BF16 values rounded once at the output (a GPU kernel's rounding, on every
CPU alike); on CUDA the GPU kernels themselves (cuBLAS, `CUDA_ATTENTION`). Custom ops, so that Inductor
materializes their BF16 outputs as a GPU GEMM's are instead of fusing the rounding into the next op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

# linear: y = bf16(x @ w.T + b), fp32 accumulation


@torch.library.custom_op("localrl::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    if x.is_cuda:  # cuBLAS bf16 GEMM
        return F.linear(x, weight, bias)
    b = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


@linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    if grad.is_cuda:  # bf16 GEMMs, as autograd of F.linear runs them
        g2, x2 = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        db = g2.sum(0, dtype=torch.float32).to(weight.dtype) if ctx.has_bias else None
        return grad @ weight, g2.T @ x2, db
    g = grad.float()
    # Each gradient is itself a GEMM: fp32 accumulation, one rounding at its output.
    dx = (g @ weight.float()).to(x.dtype)
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1]).float()
    dw = (g2.T @ x2).to(weight.dtype)
    db = g2.sum(0).to(weight.dtype) if ctx.has_bias else None
    return dx, dw, db


linear.register_autograd(_linear_backward, setup_context=_linear_setup)

# attention: o = bf16(softmax(q k^T * scale + mask) v), fp32 inside
# On CUDA both sides get one kernel: PyTorch's memory-efficient attention (fp32 softmax inside, one
# rounding at the output, as vLLM's flash attention), pinned, and always given an explicit mask. Left to
# itself SDPA picks by the call's form: the trainer's unpadded batch (no mask, `is_causal`) would get
# flash attention and the engine's explicit mask the memory-efficient or math kernel - a difference no
# alignment of the regions can remove.
CUDA_ATTENTION = "efficient"


def causal_mask(q_len: int, k_len: int, device) -> Tensor:  # SDPA's `is_causal`, bottom right
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)


def _sdpa(q, k, v, mask, causal: bool, scale: float):
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal,
                                              scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    # the GPU attention kernel on the bf16 values themselves
    if causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
    if q.shape[1] != k.shape[1]:  # GQA as repeated KV heads: the pinned kernel's only form on every release
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@torch.library.custom_op("localrl::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float) -> Tensor:
    """q: (B, H, T, D); k, v: (B, Hkv, S, D); mask: bool (B|1, 1, T, S), True = attend."""
    # contiguous, as the fake below says: compiled callers (the `compile` treatment) check strides
    return _sdpa(q, k, v, mask, causal, scale).to(q.dtype, memory_format=torch.contiguous_format)


@attention.register_fake
def _(q, k, v, mask, causal, scale):
    return q.new_empty(q.shape)


def _attention_setup(ctx, inputs, output):
    q, k, v, mask, causal, scale = inputs
    ctx.save_for_backward(q, k, v, mask)
    ctx.causal, ctx.scale = causal, scale


def _attention_backward(ctx, grad):
    q, k, v, mask = ctx.saved_tensors
    on_gpu = q.is_cuda  # the GPU kernel's own backward in bf16; fp32 on the CPU
    with torch.enable_grad():
        qf, kf, vf = ((t.detach() if on_gpu else t.detach().float()).requires_grad_() for t in (q, k, v))
        out = _sdpa(qf, kf, vf, mask, ctx.causal, ctx.scale)
        dq, dk, dv = torch.autograd.grad(out, (qf, kf, vf), grad if on_gpu else grad.float())
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


attention.register_autograd(_attention_backward, setup_context=_attention_setup)

# Plugging the kernels into a transformers model (training side)

HF_ATTENTION_NAME = "localrl_fp32"


def may_attend(attention_mask: Tensor | None) -> Tensor | None:
    """transformers' attention mask as a boolean "may attend" (an additive float mask: where it is 0)."""
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask == 0


def register_attention(model: nn.Module, name: str, fn) -> nn.Module:
    """Switch `model` to `fn` registered as the transformers attention `name`, with sdpa's masks."""
    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, sdpa_mask)
    model.set_attn_implementation(name)
    return model


def register_kernel(model: nn.Module, name: str, kernel) -> nn.Module:
    """`register_attention` of `kernel(q, k, v, allowed, scale)`: q (B, H, T, D), k and v (B, Hkv, S, D);
    `allowed` bool (B|1, 1, T, S), True = attend, None = causal; returns (B, H, T, D)."""

    def hf_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        scale = float(module.scaling if scaling is None else scaling)
        return kernel(query, key, value, may_attend(attention_mask), scale).transpose(1, 2).contiguous(), None

    return register_attention(model, name, hf_attention)


def _shared_attention(q, k, v, allowed, scale):
    return attention(q, k, v, allowed, allowed is None and q.shape[2] > 1, scale)


def _linear_forward(self, x):
    return linear(x, self.weight, self.bias)


def use_local_kernels(model: nn.Module, linear: bool = True, attention: bool = True) -> nn.Module:
    """Route a transformers model's attention (`attention`) and every nn.Linear (`linear`) through the shared
    kernels; False keeps transformers' or torch's own (localrl.gemm_match decides which GEMM an engine runs)."""
    if attention:
        register_kernel(model, HF_ATTENTION_NAME, _shared_attention)
    for module in model.modules():
        if linear and isinstance(module, nn.Linear):
            module.forward = _linear_forward.__get__(module)
    return model
