"""Residual RMSNorm region: residual add fused with RMSNorm, as the compiled engine computes it.

Engine (vLLM's fused_add_rms_norm, native formulation under Inductor): sum = residual + x in fp32;
the residual stream stores bf16(sum); the variance comes from the *unrounded* fp32 sum; the output
`(sum * rstd) * weight` is rounded once. Stock HF rounds the sum first, then `x * rstd`, then
`weight * .`: the norm reads a rounded sum and rounds twice.

To give the next norm the unrounded sum, an aligned decoder layer does not finish its last residual
add: it returns `cat(residual, mlp_out)` (width 2*hidden, bf16) - the pair the engine also carries -
and the next layer's input norm (or the model's final norm) performs the fused add. The pair is
bf16, so FSDP2's `cast_forward_inputs` leaves it untouched; it has the size of one fp32 tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

from patches._precision import inductor_sums, kernel, rows_total, sums_by_inductor, wide


def _stream(x: Tensor, residual: Tensor | None) -> Tensor:
    """The fp32 value the norm reads: the input, or the unrounded sum of input and residual."""
    return wide(x) if residual is None else wide(x) + wide(residual)


def _mean_square(s: Tensor) -> Tensor:
    return s.pow(2).mean(dim=-1, keepdim=True)


def _sums(g: Tensor, w: Tensor, x_hat: Tensor) -> tuple[Tensor, Tensor]:
    """The backward's sums: row mean of g_hat * x_hat (g_hat = g * w) and the weight gradient."""
    return ((g * w) * x_hat).mean(dim=-1, keepdim=True), rows_total(g * x_hat)


# The same sums from the kernel's bf16 inputs (reduction="inductor_cpu" compiles these on their own).
def _variance(x: Tensor, residual: Tensor | None) -> Tensor:
    return _mean_square(_stream(x, residual))


def _backward_sums(g_out: Tensor, weight: Tensor, rstd: Tensor, x: Tensor, residual: Tensor | None):
    return _sums(wide(g_out), wide(weight), _stream(x, residual) * rstd)


def _normalize(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float):
    s = _stream(x, residual)
    variance = inductor_sums(_variance, x, residual) if sums_by_inductor() else _mean_square(s)
    rstd = torch.rsqrt(variance + eps)
    return (s * rstd) * wide(weight), s, rstd


def _normalize_backward(g_out: Tensor, weight: Tensor, rstd: Tensor, x: Tensor, residual: Tensor | None):
    g, w, x_hat = wide(g_out), wide(weight), _stream(x, residual) * rstd
    if sums_by_inductor():
        mean, d_weight = inductor_sums(_backward_sums, g_out, weight, rstd, x, residual)
    else:
        mean, d_weight = _sums(g, w, x_hat)
    return rstd * ((g * w) - x_hat * mean), d_weight.to(weight.dtype)


def rms_norm_forward(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    out, _, rstd = _normalize(x, None, weight, eps)
    return out.to(x.dtype), rstd


def rms_norm_backward(grad: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    dx, dw = _normalize_backward(grad, weight, rstd, x, None)
    return dx.to(x.dtype), dw


def add_rms_norm_forward(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    out, s, rstd = _normalize(x, residual, weight, eps)
    return out.to(x.dtype), s.to(residual.dtype), rstd


def add_rms_norm_backward(g_out: Tensor, g_residual: Tensor | None, x: Tensor, residual: Tensor, weight: Tensor,
                          rstd: Tensor) -> tuple[Tensor, Tensor]:
    d_sum, dw = _normalize_backward(g_out, weight, rstd, x, residual)
    if g_residual is not None:
        d_sum = d_sum + wide(g_residual)
    return d_sum.to(x.dtype), dw


class RMSNorm(torch.autograd.Function):
    """bf16((x * rstd) * w) with x, rstd in fp32."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        out, rstd = kernel(rms_norm_forward, x)(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = kernel(rms_norm_backward, grad)(grad, x, weight, rstd)
        return dx, dw, None


class AddRMSNorm(torch.autograd.Function):
    """(normed, residual_out) = (bf16(norm(x + residual)), bf16(x + residual)), sum kept in fp32."""

    @staticmethod
    def forward(ctx, x: Tensor, residual: Tensor, weight: Tensor, eps: float):
        out, residual_out, rstd = kernel(add_rms_norm_forward, x)(x, residual, weight, eps)
        ctx.save_for_backward(x, residual, weight, rstd)
        return out, residual_out

    @staticmethod
    def backward(ctx, g_out: Tensor, g_residual: Tensor):
        x, residual, weight, rstd = ctx.saved_tensors
        d, dw = kernel(add_rms_norm_backward, g_out)(g_out, g_residual, x, residual, weight, rstd)
        return d, d, dw, None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return RMSNorm.apply(x, weight, eps)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return AddRMSNorm.apply(x, residual, weight, eps)


def _norm(norm_module, hidden_states: Tensor) -> tuple[Tensor, Tensor]:
    """Apply a norm module to a plain or pending (residual, x) input; returns (normed, residual)."""
    width = norm_module.weight.shape[-1]
    if hidden_states.shape[-1] == 2 * width:
        residual, pending = hidden_states.split(width, dim=-1)
        return add_rms_norm(pending, residual, norm_module.weight, norm_module.variance_epsilon)
    return rms_norm(hidden_states, norm_module.weight, norm_module.variance_epsilon), hidden_states


def norm_forward(self, hidden_states: Tensor) -> Tensor:
    """RMSNorm.forward: a pending pair (from an aligned layer) gets the fused add; others stay stock.
    Stock for plain inputs keeps Qwen3's q_norm/k_norm (the RoPE region's business) untouched."""
    if hidden_states.shape[-1] == 2 * self.weight.shape[-1]:
        return _norm(self, hidden_states)[0]
    return type(self)._rla_stock_forward(self, hidden_states)


def decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                          use_cache=False, position_embeddings=None, **kwargs):
    """Qwen2/Qwen3 DecoderLayer.forward with both norms fused with the residual add before them."""
    h, residual = _norm(self.input_layernorm, hidden_states)
    h, _ = self.self_attn(
        hidden_states=h,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    h, residual = add_rms_norm(h, residual, self.post_attention_layernorm.weight,
                               self.post_attention_layernorm.variance_epsilon)
    h = self.mlp(h)
    return torch.cat((residual, h), dim=-1)  # the add is finished by the next norm


def unpack_hidden(hidden_states: Tensor, hidden_size: int) -> Tensor:
    """The residual-stream value (fp32) of a layer output, pending pair or plain."""
    if hidden_states.shape[-1] == 2 * hidden_size:
        residual, pending = hidden_states.split(hidden_size, dim=-1)
        return wide(residual) + wide(pending)
    return wide(hidden_states)
