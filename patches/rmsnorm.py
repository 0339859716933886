"""Residual RMSNorm region: the residual stream and its norms, stored where the target engine stores
(docs/patches.md: "What each region changes", "How the residual stream travels").

An aligned decoder layer returns its FP32 stream, packed into a BF16 tensor of twice the width
(patches/stream.py), and the next layer's input norm, or the model's final norm, reads the FP32 value.
Backward passes recompute the normalized value from the saved inputs and one FP32 statistic per row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from patches import _precision, stream
from patches._precision import (check_kernel_roundings, inductor_sums, kernel, mean_square, norm_backward, norm_sums,
                                round_if, stored, sums_by_inductor, wide)


def _stream(x: Tensor, residual: Tensor | None, sum_to: torch.dtype | None = None) -> Tensor:
    """The value the norm reads: the input, or the sum of input and residual - unrounded, or rounded to
    `sum_to` where the table stores `residual.post_attention`."""
    return wide(x) if residual is None else round_if(wide(x) + wide(residual), sum_to)


# The same sums from the kernel's own inputs (reduction="inductor_cpu" compiles these on their own).
def _variance(x: Tensor, residual: Tensor | None) -> Tensor:
    return mean_square(_stream(x, residual))


def _backward_sums(g_out: Tensor, weight: Tensor, rstd: Tensor, x: Tensor, residual: Tensor | None):
    return norm_sums(wide(g_out), wide(weight), _stream(x, residual) * rstd)


def _normalize(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float,
               normalized_to: torch.dtype | None = None, sum_to: torch.dtype | None = None):
    """((s * rstd) * w, s, rstd); `normalized_to`/`sum_to`: where the table stores `rmsnorm.normalized`
    and `residual.post_attention`, the dtype they are rounded to (the rounding only: eager code's)."""
    s = _stream(x, residual, sum_to)
    variance = inductor_sums(_variance, x, residual) if sums_by_inductor() else mean_square(s)
    rstd = torch.rsqrt(variance + eps)
    return round_if(s * rstd, normalized_to) * wide(weight), s, rstd


def _normalize_backward(g_out: Tensor, weight: Tensor, rstd: Tensor, x: Tensor, residual: Tensor | None,
                        sum_to: torch.dtype | None = None):
    sums = inductor_sums(_backward_sums, g_out, weight, rstd, x, residual) if sums_by_inductor() else None
    d_x, d_weight = norm_backward(wide(g_out), wide(weight), _stream(x, residual, sum_to) * rstd, rstd, sums)
    return d_x, d_weight.to(weight.dtype)


def rms_norm_forward(x: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype,
                     normalized: bool = False) -> tuple[Tensor, Tensor]:
    out, _, rstd = _normalize(x, None, weight, eps, out_dtype if normalized else None)
    return out.to(out_dtype), rstd


def rms_norm_backward(grad: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    dx, dw = _normalize_backward(grad, weight, rstd, x, None)
    return dx.to(x.dtype), dw


def add_rms_norm_forward(x: Tensor, residual: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype,
                         stores: tuple[bool, bool] = (False, False)) -> tuple[Tensor, Tensor, Tensor]:
    """(normed, sum, rstd): normed rounded to `out_dtype` once; the sum in FP32, unrounded unless the
    table stores it. `stores`: whether the table stores rmsnorm.normalized and residual.post_attention."""
    normalized_to, sum_to = (out_dtype if s else None for s in stores)
    out, s, rstd = _normalize(x, residual, weight, eps, normalized_to, sum_to)
    return out.to(out_dtype), s, rstd


def add_rms_norm_backward(g_out: Tensor, g_sum: Tensor | None, x: Tensor, residual: Tensor, weight: Tensor,
                          rstd: Tensor, sum_to: torch.dtype | None = None) -> tuple[Tensor, Tensor, Tensor]:
    d_sum, dw = _normalize_backward(g_out, weight, rstd, x, residual, sum_to)
    if g_sum is not None:
        d_sum = d_sum + wide(g_sum)
    return d_sum.to(x.dtype), d_sum.to(residual.dtype), dw


class RMSNorm(torch.autograd.Function):
    """out_dtype((x * rstd) * w), x and rstd in FP32 (x: an activation or the FP32 stream)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype) -> Tensor:
        check_kernel_roundings(x.device)
        out, rstd = kernel(rms_norm_forward, x)(x, weight, eps, out_dtype, stored("rmsnorm.normalized"))
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = kernel(rms_norm_backward, grad)(grad, x, weight, rstd)
        return dx, dw, None, None


class AddRMSNorm(torch.autograd.Function):
    """(normed, sum): normed = out_dtype(norm(x + residual)), sum = x + residual in FP32, unrounded."""

    @staticmethod
    def forward(ctx, x: Tensor, residual: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype):
        check_kernel_roundings(x.device)
        stores = (stored("rmsnorm.normalized"), stored("residual.post_attention"))
        out, s, rstd = kernel(add_rms_norm_forward, x)(x, residual, weight, eps, out_dtype, stores)
        ctx.save_for_backward(x, residual, weight, rstd)  # the sum is recomputed: one FP32 tensor less
        ctx.sum_to = out_dtype if stores[1] else None
        return out, s

    @staticmethod
    def backward(ctx, g_out: Tensor, g_sum: Tensor):
        x, residual, weight, rstd = ctx.saved_tensors
        if ctx.sum_to is None:
            dx, dr, dw = kernel(add_rms_norm_backward, g_out)(g_out, g_sum, x, residual, weight, rstd)
        else:  # a stored sum: eager (check_kernel_roundings refused compiled kernels for it)
            dx, dr, dw = add_rms_norm_backward(g_out, g_sum, x, residual, weight, rstd, ctx.sum_to)
        return dx, dr, dw, None, None


def rms_norm(x: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype | None = None) -> Tensor:
    return RMSNorm.apply(x, weight, eps, out_dtype or x.dtype)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float,
                 out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    return AddRMSNorm.apply(x, residual, weight, eps, out_dtype or x.dtype)


def norm_forward(self, hidden_states: Tensor) -> Tensor:
    """RMSNorm.forward: a packed stream (an aligned layer's output, into the final norm) is read in
    FP32; plain inputs stay stock, which keeps Qwen3's q_norm/k_norm (the RoPE region's) untouched."""
    width = self.weight.shape[-1]
    if stream.is_packed(hidden_states, width):
        return _stream_norm(self, hidden_states, stream.unpack(hidden_states, width))
    return type(self)._rla_stock_forward(self, hidden_states)


def _stream_norm(norm, hidden_states: Tensor, s: Tensor) -> Tensor:
    """`norm` of the stream `s` that `hidden_states` carries (packed, or the embeddings), as the engine's
    norm reads it: from its two addends (`_graph_addends`), else from `s` itself (`_norm_input`)."""
    dtype = hidden_states.dtype  # activations: the packed stream's carrier, or the embedding's dtype
    if (added := _graph_addends(hidden_states, s)) is not None:
        return add_rms_norm(*added, norm.weight, norm.variance_epsilon, dtype)[0]
    return rms_norm(_norm_input(s, dtype), norm.weight, norm.variance_epsilon, dtype)


def _graph_addends(packed: Tensor, s: Tensor) -> tuple[Tensor, Tensor] | None:
    """With reduction="vllm_cpu_graph", the (previous layer's output, stream before it) a norm sums from,
    as the engine's add + norm kernel does; None where the norm reads the stream itself (another order,
    a first layer, a table that rounds the stream the norm reads, addends outside autograd)."""
    if not _precision.sums_as_the_graph() or _norm_input(s, packed.dtype) is not s:
        return None
    added = stream.parts(packed)
    # addends made outside autograd (a reentrant checkpoint's forward) would cut the norm's gradient path
    return added if added and all(a.requires_grad == s.requires_grad for a in added) else None


def _norm_input(s: Tensor, dtype: torch.dtype) -> Tensor:
    """The previous layer's output as an input norm reads it: the FP32 sum (both named targets: the
    engine's norm reads the unrounded `x`), or rounded where the table stores `residual.norm_input`."""
    return round_if(s, dtype if stored("residual.norm_input") and s.dtype == torch.float32 else None)


def decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                          use_cache=False, position_embeddings=None, **kwargs):
    """Qwen2/Qwen3 DecoderLayer.forward on the FP32 residual stream, rounded where the target rounds."""
    dtype = hidden_states.dtype  # activations: the packed stream's carrier, or the embedding's dtype
    s = stream.unpack(hidden_states, self.input_layernorm.weight.shape[-1])
    h = _stream_norm(self.input_layernorm, hidden_states, s)
    residual = s.to(dtype) if _precision.target().rounds_layer_output else s  # residual.layer_output
    if past_key_values is not None:  # the KV cache by the release's name (`cache` from 5.24: then in kwargs)
        kwargs[self._rla_cache_arg] = past_key_values
    h, _ = self.self_attn(
        hidden_states=h,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    attn = self.self_attn
    if _precision.sums_as_the_graph() and _precision.graph_stores_stream(attn.config, attn.layer_idx):
        h = wide(h)  # the kernel that stores the stream: its FP32 store sets the FP32 tiling (same values)
    h, s = add_rms_norm(h, residual, self.post_attention_layernorm.weight,
                        self.post_attention_layernorm.variance_epsilon, dtype)  # residual.post_attention: FP32
    out = self.mlp(h)
    return stream.keep_parts(stream.pack(s + wide(out), dtype), out, s)


def model_forward(self, *args, **kwargs):
    """Qwen2Model/Qwen3Model.forward: stock, with `hidden_states` reported as transformers reports them
    (each layer's stream rounded to the activation dtype, width hidden). Costs nothing otherwise."""
    return_dict = kwargs.pop("return_dict", None)
    out = type(self)._rla_stock_forward(self, *args, return_dict=True, **kwargs)
    if out.hidden_states is not None:  # a field of every model output: None unless asked for
        # output_hidden_states=[indices] captures some layers: the others are None
        out.hidden_states = tuple(t if t is None else stream.hidden_state(t, self.config.hidden_size)
                                  for t in out.hidden_states)
    if return_dict is False or (return_dict is None and not self.config.return_dict):
        return out.to_tuple()
    return out
