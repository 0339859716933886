"""RoPE region: rotate in fp32 from bf16 q/k and bf16 cos/sin, round once (as the compiled engine does).

Stock HF rounds three times: `q * cos`, `rotate_half(q) * sin` and their sum. The engine (vLLM's
native rotation under Inductor) computes `x1*cos - x2*sin`, `x2*cos + x1*sin` in fp32 and stores
bf16 once. For Qwen3 the per-head q_norm/k_norm feed the rotation inside the same fused kernel, so
the normalized value is never rounded either: `norm_rope` keeps it in fp32.

Backward passes recompute the fp32 intermediates: they save only bf16 inputs, the cos/sin tables
(which the stock path saves too) and, for the norm, one fp32 statistic per row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from patches._precision import inductor_sums, kernel, rows_total, sums_by_inductor, wide


def _halves(x: Tensor, cos: Tensor, sin: Tensor):
    # cos/sin in HF layout: full head_dim with duplicated halves; the engine uses one half.
    x1, x2 = x.chunk(2, dim=-1)
    return x1, x2, cos.chunk(2, dim=-1)[0], sin.chunk(2, dim=-1)[0]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """cat(x1*c - x2*s, x2*c + x1*s). Eager writes each half into one output buffer (fewer full-size
    temporaries); compiled, the plain formula fuses into one kernel (Dynamo rejects `out=` views)."""
    x1, x2, c, s = _halves(x, cos, sin)
    if torch.compiler.is_compiling():
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    out = torch.empty_like(x)
    o1, o2 = out.chunk(2, dim=-1)
    torch.mul(x1, c, out=o1).sub_(x2 * s)
    torch.mul(x2, c, out=o2).add_(x1 * s)
    return out


def _rotate_backward(g: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """cat(g1*c + g2*s, g2*c - g1*s): the transpose of the rotation, i.e. the rotation by -sin
    (exact: negation is exact and a - (-b) == a + b in IEEE arithmetic)."""
    return _rotate(g, cos, -sin)


def rope_forward(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return _rotate(wide(x), wide(cos), wide(sin)).to(x.dtype)


def rope_backward(grad: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return _rotate_backward(wide(grad), wide(cos), wide(sin)).to(grad.dtype)


def _norm_sums(g_normed: Tensor, w: Tensor, x_hat: Tensor) -> tuple[Tensor, Tensor]:
    """The backward's sums: row mean of g_hat * x_hat (g_hat = g_normed * w) and the weight gradient."""
    return ((g_normed * w) * x_hat).mean(dim=-1, keepdim=True), rows_total(g_normed * x_hat)


# The same sums from the kernel's bf16 inputs (reduction="inductor_cpu" compiles these on their own).
def _variance(x: Tensor) -> Tensor:
    return wide(x).pow(2).mean(dim=-1, keepdim=True)


def _backward_sums(grad: Tensor, x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, rstd: Tensor):
    return _norm_sums(_rotate_backward(wide(grad), wide(cos), wide(sin)), wide(weight), wide(x) * rstd)


def norm_rope_forward(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    xf = wide(x)
    variance = inductor_sums(_variance, x) if sums_by_inductor() else xf.pow(2).mean(dim=-1, keepdim=True)
    rstd = torch.rsqrt(variance + eps)
    return _rotate((xf * rstd) * wide(weight), wide(cos), wide(sin)).to(x.dtype), rstd


def norm_rope_backward(grad: Tensor, x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, rstd: Tensor):
    g_normed, w, x_hat = _rotate_backward(wide(grad), wide(cos), wide(sin)), wide(weight), wide(x) * rstd
    if sums_by_inductor():
        mean, dw = inductor_sums(_backward_sums, grad, x, weight, cos, sin, rstd)
    else:
        mean, dw = _norm_sums(g_normed, w, x_hat)
    dx = rstd * ((g_normed * w) - x_hat * mean)
    return dx.to(x.dtype), dw.to(weight.dtype)  # dw: the broadcast weight's gradient, (head_dim,)


class Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return kernel(rope_forward, x)(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        return kernel(rope_backward, grad)(grad, cos, sin), None, None


class NormRope(torch.autograd.Function):
    """Qwen3 q_norm/k_norm followed by RoPE, one rounding: bf16(rotate((x * rstd) * w))."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
        out, rstd = kernel(norm_rope_forward, x)(x, weight, cos, sin, eps)
        ctx.save_for_backward(x, weight, cos, sin, rstd)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, cos, sin, rstd = ctx.saved_tensors
        dx, dw = kernel(norm_rope_backward, grad)(grad, x, weight, cos, sin, rstd)
        return dx, dw, None, None, None


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Drop-in for transformers' `apply_rotary_pos_emb` (same signature)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return Rope.apply(q, cos, sin), Rope.apply(k, cos, sin)


def check_rope(module) -> None:
    """The aligned table implements default RoPE: refuse a scaled one. (Qwen2/Qwen3's default RoPE
    rotates the whole head in every checked transformers release, `partial_rotary_factor` or not;
    so does the aligned rotation.)"""
    from patches import UnsupportedModelError

    if module.rope_type != "default":
        raise UnsupportedModelError(
            f"{type(module).__name__}: rope_type {module.rope_type!r} is not covered by the aligned RoPE (it "
            "implements rope_type 'default'); leave the rope region off for this model")


def engine_inv_freq(config, device) -> Tensor:
    """vLLM's `RotaryEmbedding._compute_inv_freq` (rotary_embedding/base.py), on `device`: vLLM builds
    its modules, and so this table, on the device the model lives on, and CUDA's `pow` may differ from
    the CPU's in a last bit. The formula is transformers' default one too (base and dim from the config
    as `compute_default_rope_parameters` reads them); only the device was transformers' own (the CPU)."""
    base = config.rope_parameters["rope_theta"]
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))


@torch.no_grad()
def rotary_embedding_forward(self, x, position_ids):
    """cos/sin as the engine's table holds them: fp32 `position * inv_freq` (an exact product, never a
    matmul that TF32 could shorten), inv_freq computed in fp32 from the config on the device of `x`, as
    vLLM computes it on its model's device (immune to a model cast to bf16), cos/sin rounded to the
    model dtype."""
    check_rope(self)
    inv_freq = getattr(self, "_rla_inv_freq", None)
    if inv_freq is None or inv_freq.device != x.device:
        self._rla_inv_freq = inv_freq = engine_inv_freq(self.config, x.device)
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def qwen3_attention_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
    """Qwen3Attention.forward with q/k norm fused into the rotation; everything else as stock."""
    modeling = self._rla_modeling
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    cos, sin = position_embeddings
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (B, T, 1, D): broadcast over heads
    q = NormRope.apply(self.q_proj(hidden_states).view(hidden_shape), self.q_norm.weight, cos, sin,
                       self.q_norm.variance_epsilon)
    k = NormRope.apply(self.k_proj(hidden_states).view(hidden_shape), self.k_norm.weight, cos, sin,
                       self.k_norm.variance_epsilon)
    query_states, key_states = q.transpose(1, 2), k.transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

    if past_key_values is not None:
        key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)

    attention_interface = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, modeling.eager_attention_forward
    )
    attn_output, attn_weights = attention_interface(
        self,
        query_states,
        key_states,
        value_states,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        sliding_window=self.sliding_window,
        **kwargs,
    )
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return self.o_proj(attn_output), attn_weights
