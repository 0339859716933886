"""The inference engine's region formulations, written as vLLM writes them (its "native" path).

vLLM's default V1 path runs these under torch.compile: Inductor fuses each elementwise chain into
one kernel that computes in fp32 and rounds to bf16 only where a buffer is stored, and it drops
the explicit `.to(bf16)` casts inside a fused kernel (emulate_precision_casts is off). So the
*formulation* decides where the engine rounds: keep these as vLLM has them (half-width cos/sin
table, chunk -> rotate -> cat at the output, `(x * rsqrt(var + eps)).to(dtype) * w`, residual add
in fp32). Nothing here may import `patches`: the engine is never patched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def rope_inv_freq(head_dim: int, base: float, device=None) -> Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim))


def rope_cos_sin_cache(head_dim: int, base: float, max_positions: int, dtype: torch.dtype, device=None) -> Tensor:
    """vLLM's RotaryEmbedding._compute_cos_sin_cache: (max_positions, head_dim) = [cos | sin] halves,
    computed on the device the model lives on (vLLM builds its modules there)."""
    t = torch.arange(max_positions, dtype=torch.float, device=device)
    freqs = torch.einsum("i,j -> ij", t, rope_inv_freq(head_dim, base, device))
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def apply_rope(positions: Tensor, x: Tensor, cos_sin_cache: Tensor) -> Tensor:
    """Neox-style rotation of x (..., tokens, heads, head_dim) at `positions` (..., tokens)."""
    cos_sin = cos_sin_cache[positions]
    cos, sin = cos_sin.chunk(2, dim=-1)
    cos = cos.unsqueeze(-2).to(x.dtype)
    sin = sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return x.to(orig_dtype) * weight


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Returns (normed, new_residual); the sum stays fp32 for the variance, the residual is stored bf16."""
    orig_dtype = x.dtype
    x = x.to(torch.float32) + residual.to(torch.float32)
    residual = x.to(orig_dtype)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return x.to(orig_dtype) * weight, residual


def silu_and_mul(gate_up: Tensor) -> Tensor:
    d = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :d]) * gate_up[..., d:]


def qk_norm_rope(positions: Tensor, q: Tensor, weight: Tensor, eps: float, cos_sin_cache: Tensor) -> Tensor:
    """Qwen3: per-head RMSNorm then RoPE; compiled, the normed value never hits memory in bf16."""
    return apply_rope(positions, rms_norm(q, weight, eps), cos_sin_cache)


# Every width (hidden, head_dim, intermediate) is its own graph. Past Dynamo's recompile limit a
# compiled function silently runs eagerly - an engine that rounds like the trainer: allow many widths
# (a scaling study sweeps them in one process) and make the limit an error, never a fallback.
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
torch._dynamo.config.fail_on_recompile_limit_hit = True

# The arguments of each formulation whose dim 0 is the token count.
TOKEN_ARGS = {apply_rope: (0, 1), rms_norm: (0,), fused_add_rms_norm: (0, 1), silu_and_mul: (0,), qk_norm_rope: (0, 1)}


def compiled(fn, token_args: tuple[int, ...] | None = None):
    """Compile a formulation the way vLLM's default path does: Inductor, with the token count (dim 0
    of the arguments in `token_args`, default `TOKEN_ARGS[fn]`) dynamic and every other dimension
    static. vLLM marks only the token dimension of the model's inputs dynamic
    (`vllm/compilation/decorators.py`, `_mark_dynamic_inputs`); widths come from the weights and are
    constants of the graph. A batch of one token gets its own graph (Dynamo specializes size 1)."""
    token_args = TOKEN_ARGS[fn] if token_args is None else token_args
    graph = torch.compile(fn, dynamic=False, fullgraph=True)

    def run(*args):
        for i in token_args:
            torch._dynamo.maybe_mark_dynamic(args[i], 0)
        return graph(*args)

    return run
