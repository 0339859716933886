"""The inference engine's region formulations, written line for line as vLLM writes them (its "native"
path: vllm/ir/ops/layernorm.py, layers/activation.py, layers/rotary_embedding/{base,common}.py, vLLM
0.24-0.32). Under Inductor the formulation and the graph it sits in decide where the engine rounds
(docs/patches.md: "What each region changes"): keep them as vLLM has them, the rounding map reads the
stored values off these very lines. Nothing here may import `patches`: the engine is never patched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def rope_inv_freq(head_dim: int, base: float, device=None) -> Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim))


def rope_cos_sin_cache(head_dim: int, base: float, max_positions: int, dtype: torch.dtype, device=None) -> Tensor:
    """RotaryEmbedding._compute_cos_sin_cache: (max_positions, head_dim) = [cos | sin] halves, stored in
    the model dtype (vLLM builds its modules, and this table, on the device the model lives on)."""
    t = torch.arange(max_positions, dtype=torch.float, device=device)
    freqs = torch.einsum("i,j -> ij", t, rope_inv_freq(head_dim, base, device))
    cos = freqs.cos()
    sin = freqs.sin()
    cache = torch.cat((cos, sin), dim=-1)
    return cache.to(dtype)


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """ApplyRotaryEmb.forward_static, Neox style: x (tokens, heads, head_dim), cos/sin (tokens, head_dim/2)."""
    cos = cos.unsqueeze(-2).to(x.dtype)
    sin = sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    output = torch.cat((o1, o2), dim=-1)
    return output


def rotary_emb(positions: Tensor, query: Tensor, key: Tensor, cos_sin_cache: Tensor, head_dim: int):
    """RotaryEmbedding.forward_static: rotate q and k (tokens, heads * head_dim) at `positions`."""
    num_tokens = positions.shape[0]
    cos_sin = cos_sin_cache.index_select(0, positions)
    cos, sin = cos_sin.chunk(2, dim=-1)
    query_shape = query.shape
    query = apply_rotary_emb(query.view(num_tokens, -1, head_dim), cos, sin).reshape(query_shape)
    key_shape = key.shape
    key = apply_rotary_emb(key.view(num_tokens, -1, head_dim), cos, sin).reshape(key_shape)
    return query, key


def rms_norm(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + epsilon)
    x = x.to(weight.dtype) * weight
    return x.to(orig_dtype)


def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Returns (normed, new_residual): the variance from the fp32 sum, the residual cast to bf16 - a cast
    that only the graph's stores make real."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    x = x + x_residual.to(torch.float32)
    x_residual = x.to(orig_dtype)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + epsilon)
    x = x.to(weight.dtype) * weight
    return x.to(orig_dtype), x_residual


def silu_and_mul(x: Tensor) -> Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def qk_norm(x: Tensor, weight: Tensor, epsilon: float, head_dim: int) -> Tensor:
    """Qwen3Attention: the per-head RMSNorm of q or k (tokens, heads * head_dim)."""
    x_by_head = x.view(*x.shape[:-1], x.shape[-1] // head_dim, head_dim)
    x_by_head = rms_norm(x_by_head, weight, epsilon)
    return x_by_head.view(x.shape)


# Every width is its own graph. Past Dynamo's recompile limit a compiled function silently runs eagerly -
# an engine that rounds like the trainer: allow many widths (a scaling study sweeps them in one process)
# and make the limit an error, never a fallback.
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
torch._dynamo.config.fail_on_recompile_limit_hit = True
