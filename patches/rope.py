"""RoPE region: rotate in FP32 from BF16 q/k and BF16 cos/sin, round once, as the compiled engine does;
for Qwen3 the q/k norms fused with the rotation (docs/patches.md: "What each region changes"). Backward
passes recompute the FP32 intermediates from the BF16 inputs, the cos/sin tables and, for the norm, one
FP32 statistic per row.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from patches._precision import (check_kernel_roundings, inductor_sums, kernel, mean_square, norm_backward, norm_sums,
                                round_if, stored, sums_by_inductor, wide)
from patches.errors import UnsupportedModelError


def _halves(x: Tensor, cos: Tensor, sin: Tensor):
    # cos/sin in HF layout: full head_dim with duplicated halves; the engine uses one half.
    x1, x2 = x.chunk(2, dim=-1)
    return x1, x2, cos.chunk(2, dim=-1)[0], sin.chunk(2, dim=-1)[0]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, products: torch.dtype | None = None) -> Tensor:
    """cat(x1*c - x2*s, x2*c + x1*s). Eager writes each half into one output buffer (fewer full-size
    temporaries); compiled, the plain formula fuses into one kernel (Dynamo rejects `out=` views). With
    `products` (a table that stores `rope.product`) each product is rounded to it first, as HF's
    `q * cos + rotate_half(q) * sin` rounds it."""
    x1, x2, c, s = _halves(x, cos, sin)
    if products is not None:
        return torch.cat((round_if(x1 * c, products) - round_if(x2 * s, products),
                          round_if(x2 * c, products) + round_if(x1 * s, products)), dim=-1)
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


def rope_forward(x: Tensor, cos: Tensor, sin: Tensor, products: bool = False) -> Tensor:
    return _rotate(wide(x), wide(cos), wide(sin), x.dtype if products else None).to(x.dtype)


def rope_backward(grad: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return _rotate_backward(wide(grad), wide(cos), wide(sin)).to(grad.dtype)


# The same sums from the kernel's bf16 inputs (reduction="inductor_cpu" compiles these on their own).
def _variance(x: Tensor) -> Tensor:
    return mean_square(wide(x))


def _backward_sums(grad: Tensor, x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, rstd: Tensor):
    return norm_sums(_rotate_backward(wide(grad), wide(cos), wide(sin)), wide(weight), wide(x) * rstd)


def norm_rope_forward(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float,
                      stores: tuple[bool, bool, bool] = (False, False, False)) -> tuple[Tensor, Tensor]:
    """`stores`: whether the table stores qk_norm.normalized, qk_norm.out and rope.product."""
    normalized, out, products = (x.dtype if s else None for s in stores)
    xf = wide(x)
    variance = inductor_sums(_variance, x) if sums_by_inductor() else mean_square(xf)
    rstd = torch.rsqrt(variance + eps)
    normed = round_if(round_if(xf * rstd, normalized) * wide(weight), out)
    return _rotate(normed, wide(cos), wide(sin), products).to(x.dtype), rstd


def norm_rope_backward(grad: Tensor, x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, rstd: Tensor):
    sums = inductor_sums(_backward_sums, grad, x, weight, cos, sin, rstd) if sums_by_inductor() else None
    g_normed = _rotate_backward(wide(grad), wide(cos), wide(sin))
    dx, dw = norm_backward(g_normed, wide(weight), wide(x) * rstd, rstd, sums)
    return dx.to(x.dtype), dw.to(weight.dtype)  # dw: the broadcast weight's gradient, (head_dim,)


class Rope(torch.autograd.Function):
    """bf16(rotate(x)); the backward is the transpose rotation (a stored product rounds like an identity)."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        check_kernel_roundings(x.device)
        return kernel(rope_forward, x)(x, cos, sin, stored("rope.product"))

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        return kernel(rope_backward, grad)(grad, cos, sin), None, None


class NormRope(torch.autograd.Function):
    """Qwen3 q_norm/k_norm followed by RoPE, one rounding: bf16(rotate((x * rstd) * w))."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
        check_kernel_roundings(x.device)
        stores = (stored("qk_norm.normalized"), stored("qk_norm.out"), stored("rope.product"))
        out, rstd = kernel(norm_rope_forward, x)(x, weight, cos, sin, eps, stores)
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


# ---- the engine's cos/sin table, per RoPE scaling (docs/patches.md: what the patches refuse) ----------
#
# vLLM builds one cos/sin table per model (rotary_embedding/*.py, `_compute_cos_sin_cache`): row p is
# cos/sin(t_p * inv_freq) in fp32, times a magnitude scale, rounded to the model dtype. Each scaling
# changes t_p, inv_freq or the scale; the aligned RoPE computes row p as vLLM computes it.


@dataclass(frozen=True)
class EngineRope:
    """Row p of the engine's table: cos/sin((p / position_divisor) * inv_freq) * scale."""

    inv_freq: Tensor        # fp32, on the activations' device
    position_divisor: float | None = None
    scale: float = 1.0


def _inv_freq(base: float, dim: int, device) -> Tensor:
    """RotaryEmbedding._compute_inv_freq (base.py)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))


def _dims(config) -> tuple[dict, int, int]:
    """The config's rope parameters, head_dim (every checked transformers release rotates the whole head
    of a Qwen2/Qwen3 model) and max_position_embeddings (vLLM's `max_position` for these models)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.rope_parameters, head_dim, config.max_position_embeddings


def _required(params: dict, key: str, rope_type: str):
    if params.get(key) is None:
        raise UnsupportedModelError(f"rope_type {rope_type!r} needs rope_parameters[{key!r}] (vLLM reads it too)")
    return params[key]


def _default(config, device) -> EngineRope:
    params, dim, _ = _dims(config)
    return EngineRope(_inv_freq(params["rope_theta"], dim, device))


def _linear(config, device) -> EngineRope:
    """LinearScalingRotaryEmbedding: t = arange(...) / factor, then the default product."""
    params, dim, _ = _dims(config)
    return EngineRope(_inv_freq(params["rope_theta"], dim, device), float(_required(params, "factor", "linear")))


def _dynamic_base(config) -> float:
    """DynamicNTKScalingRotaryEmbedding's (or, with `alpha`, DynamicNTKAlphaRotaryEmbedding's) base, fixed
    once from the config. Without `max_trained_positions` vLLM takes max_position, and the base is the
    config's own (the factor cancels)."""
    params, dim, max_position = _dims(config)
    base = params["rope_theta"]
    if "alpha" in params:
        return base * params["alpha"] ** (dim / (dim - 2))
    factor = _required(params, "factor", "dynamic")
    trained = params.get("max_trained_positions", max_position)
    return base * ((factor * max_position / trained) - (factor - 1)) ** (dim / (dim - 2))


def _dynamic(config, device) -> EngineRope:
    return EngineRope(_inv_freq(_dynamic_base(config), _dims(config)[1], device))


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(config, device) -> EngineRope:
    """YaRNScalingRotaryEmbedding: inv_freq blended between interpolation and extrapolation by a ramp
    over the correction range; cos/sin times mscale (common.py's yarn_* helpers)."""
    params, dim, _ = _dims(config)
    base, factor = params["rope_theta"], float(_required(params, "factor", "yarn"))
    original = _required(params, "original_max_position_embeddings", "yarn")
    if params.get("attention_factor") is not None:
        scale = float(params["attention_factor"])
    elif params.get("mscale") and params.get("mscale_all_dim"):
        scale = float(_yarn_mscale(factor, params["mscale"]) / _yarn_mscale(factor, params["mscale_all_dim"]))
    else:
        scale = float(_yarn_mscale(factor))

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    # vLLM's defaults where the config has none (transformers writes an absent one as None)
    low, high = correction_dim(params.get("beta_fast") or 32), correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # vLLM's guard against a zero-width ramp
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float, device=device) - low) / (high - low), 0, 1)
    mask = 1 - ramp
    return EngineRope(inv_freq_interpolation * (1 - mask) + inv_freq_extrapolation * mask, scale=scale)


# rope_type -> the engine's table for it: every scaling vLLM's `get_rope` builds for a Qwen2/Qwen3 config
# without multimodal sections (vLLM 0.24-0.32, rotary_embedding/__init__.py).
ENGINE_ROPES = {"default": _default, "linear": _linear, "dynamic": _dynamic, "yarn": _yarn}


def check_rope(module) -> None:
    """The aligned table implements the scalings in ENGINE_ROPES: refuse another, naming it. A dynamic
    scaling is warned about once per config, and refused where the installed vLLM builds another table."""
    params = getattr(module.config, "rope_parameters", None) or {}
    if module.rope_type not in ENGINE_ROPES or "mrope_section" in params:
        what = " with mrope_section" if module.rope_type in ENGINE_ROPES else ""
        raise UnsupportedModelError(
            f"{type(module).__name__}: rope_type {module.rope_type!r}{what} is not covered by "
            f"the aligned RoPE (it implements vLLM's tables for {', '.join(ENGINE_ROPES)}); leave the rope region "
            "off for this model")
    if module.rope_type == "dynamic":
        check_dynamic(module.config)


# ---- dynamic scaling: the engine's fixed base, not transformers' growing one ------------------------------


class DynamicRopeWarning(UserWarning):
    """The aligned RoPE computes the engine's dynamic-scaling table, which transformers does not."""


_dynamic_seen: set[tuple] = set()  # the dynamic-scaling configs already warned about in this process


def _config_key(config) -> tuple:
    params, dim, max_position = _dims(config)
    return dim, max_position, tuple(sorted((key, repr(value)) for key, value in params.items()))


def _engine_formula(config) -> str:
    """The base the engine fixes once for this config, as a formula with the config's values."""
    params, dim, max_position = _dims(config)
    theta = params["rope_theta"]
    if "alpha" in params:
        formula = (f"rope_theta * alpha ** (head_dim / (head_dim - 2)) = "
                   f"{theta} * {params['alpha']} ** ({dim} / {dim - 2})")
    else:
        factor, trained = params.get("factor"), params.get("max_trained_positions", max_position)
        formula = (f"rope_theta * (factor * max_position_embeddings / max_trained_positions - (factor - 1)) ** "
                   f"(head_dim / (head_dim - 2)) = {theta} * ({factor} * {max_position} / {trained} - ({factor} - 1)) "
                   f"** ({dim} / {dim - 2})")
    return f"{formula} = {_dynamic_base(config):.6g}"


def _dynamic_message(config) -> str:
    params = _dims(config)[0]
    scaled_by = "alpha" if "alpha" in params else "factor"
    return (f"rope_parameters['rope_type'] = 'dynamic' (with {scaled_by} = {params.get(scaled_by)}): the aligned "
            f"RoPE builds vLLM's table, whose base is fixed once from the config, base = {_engine_formula(config)}; "
            "transformers instead grows the base with the sequence past max_position_embeddings, so this model's "
            "cos/sin differ from transformers' for longer inputs (docs/patches.md, the rope region)")


def _installed_vllm_table(config) -> tuple[str, Tensor] | None:
    """The installed vLLM's version and fp32 cos/sin table for this config, built by its `get_rope` as its
    Qwen models build it; None where vLLM cannot be imported."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:  # vLLM: optional, its table compared only where it imports
        import vllm
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.model_executor.layers import rotary_embedding
    except ImportError:
        return None
    params, dim, max_position = _dims(config)
    known = set(rotary_embedding._ROPE_DICT)
    with set_current_vllm_config(VllmConfig()):  # vLLM's modules are built inside a config
        table = rotary_embedding.get_rope(dim, max_position, True, dict(params), torch.float32).cos_sin_cache
    for key in set(rotary_embedding._ROPE_DICT) - known:  # the fp32 table is ours, not the engine's: not kept
        del rotary_embedding._ROPE_DICT[key]
    return vllm.__version__, table.cpu()


def _aligned_table(config) -> Tensor:
    """The aligned RoPE's fp32 cos/sin at positions 0 .. max_position_embeddings - 1, in vLLM's layout."""
    table = engine_rope(config, "cpu")
    freqs = torch.arange(_dims(config)[2], dtype=torch.float)[:, None] * table.inv_freq
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * table.scale


def check_dynamic(config) -> None:
    """Once per dynamic-scaling config: refuse where the installed vLLM's table differs from the aligned
    one (the rope region would then align to no engine), else warn that the table is the engine's."""
    key = _config_key(config)
    if key in _dynamic_seen:
        return
    installed = _installed_vllm_table(config)
    if installed is not None:
        _refuse_another_table(config, *installed)
    warnings.warn(_dynamic_message(config), DynamicRopeWarning, stacklevel=3)
    _dynamic_seen.add(key)


def _refuse_another_table(config, version: str, table: Tensor) -> None:
    aligned = _aligned_table(config)
    if torch.equal(table, aligned):
        return
    differ = "shape" if table.shape != aligned.shape else f"{(table != aligned).float().mean().item():.1%} of entries"
    raise UnsupportedModelError(
        f"rope_parameters['rope_type'] = 'dynamic': the installed vLLM {version} builds another cos/sin table "
        f"for this config than the aligned RoPE (they differ in {differ}), whose base is "
        f"{_engine_formula(config)} (vLLM 0.24-0.32's DynamicNTKScalingRotaryEmbedding); the rope region "
        "would round another RoPE than this engine's. Leave the rope region off for this model, or use a "
        "vLLM that builds this table")


def engine_rope(config, device) -> EngineRope:
    return ENGINE_ROPES[config.rope_parameters.get("rope_type", "default")](config, device)


@torch.no_grad()
def rotary_embedding_forward(self, x, position_ids):
    """cos/sin as the engine's table holds them (`EngineRope`): fp32 `position * inv_freq` (an exact
    product, never a matmul that TF32 could shorten), inv_freq computed in fp32 from the config on the
    device of `x` (immune to a model cast to bf16), times the table's scale, rounded to the model dtype."""
    check_rope(self)
    table = getattr(self, "_rla_engine_rope", None)
    if table is None or table.inv_freq.device != x.device:
        self._rla_engine_rope = table = engine_rope(self.config, x.device)
    positions = position_ids[..., None].float()
    if table.position_divisor is not None:
        positions = positions / table.position_divisor
    freqs = positions * table.inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * table.scale).to(x.dtype), (emb.sin() * table.scale).to(x.dtype)


def qwen3_attention_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
    """Qwen3Attention.forward with q/k norm fused into the rotation; everything else as stock, the KV
    cache as the release names and updates it (`past_key_values` up to 5.23; `cache`, updated with the
    call's kwargs, from 5.24, where the old name is still accepted)."""
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

    cache = past_key_values if past_key_values is not None else kwargs.pop("cache", None)
    if cache is not None and self._rla_cache_arg == "cache":
        key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)
    elif cache is not None:
        key_states, value_states = cache.update(key_states, value_states, self.layer_idx)

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
