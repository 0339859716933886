"""The engine's model runner: Qwen2/Qwen3 forward in vLLM's layout and formulations.

Like vLLM's default path, the elementwise pieces between GEMMs and attention are compiled by
Inductor (see `ops.py` for why the formulation matters), while GEMMs and attention are opaque
kernels (`localrl.kernels`) whose bf16 outputs are materialized. Tokens are flattened to
(num_tokens, hidden) as in vLLM; the residual stream travels beside the layer output and is
added inside the next fused add+RMSNorm. Weights are bf16 copies, never trained, never patched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from localrl import kernels
from localrl.engine import ops

_rms_norm = ops.compiled(ops.rms_norm)
_add_rms_norm = ops.compiled(ops.fused_add_rms_norm)
_silu_and_mul = ops.compiled(ops.silu_and_mul)


def _qkv_rope(qkv: Tensor, positions: Tensor, cache: Tensor, sizes: tuple[int, int, int], head_dim: int):
    q, k, v = qkv.split(sizes, dim=-1)
    q = ops.apply_rope(positions, q.unflatten(-1, (-1, head_dim)), cache)
    k = ops.apply_rope(positions, k.unflatten(-1, (-1, head_dim)), cache)
    return q, k, v.unflatten(-1, (-1, head_dim))


def _qkv_norm_rope(qkv, positions, cache, sizes: tuple[int, int, int], head_dim: int, q_w, k_w, eps: float):
    q, k, v = qkv.split(sizes, dim=-1)
    q = ops.qk_norm_rope(positions, q.unflatten(-1, (-1, head_dim)), q_w, eps, cache)
    k = ops.qk_norm_rope(positions, k.unflatten(-1, (-1, head_dim)), k_w, eps, cache)
    return q, k, v.unflatten(-1, (-1, head_dim))


_qkv_rope_c = ops.compiled(_qkv_rope, (0, 1))
_qkv_norm_rope_c = ops.compiled(_qkv_norm_rope, (0, 1))


@dataclass
class KVCache:
    keys: list[Tensor]    # per layer (B, kv_heads, max_len, head_dim)
    values: list[Tensor]

    @classmethod
    def allocate(cls, model: "EngineModel", batch: int, max_len: int) -> "KVCache":
        shape = (batch, model.num_kv_heads, max_len, model.head_dim)
        n, kw = model.num_layers, {"dtype": model.dtype, "device": model.device}
        return cls([torch.zeros(shape, **kw) for _ in range(n)], [torch.zeros(shape, **kw) for _ in range(n)])


class EngineModel(nn.Module):
    def __init__(self, config, max_positions: int | None = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu"):
        super().__init__()
        self.device = torch.device(device)
        if config.model_type not in ("qwen2", "qwen3"):
            raise ValueError(f"EngineModel supports model_type qwen2 or qwen3, got {config.model_type!r}")
        self.config, self.dtype = config, dtype
        self.qk_norm = config.model_type == "qwen3"
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"EngineModel supports default RoPE only, got {rope.get('rope_type')!r}")
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        max_positions = max_positions or config.max_position_embeddings
        self.register_buffer("cos_sin_cache",
                             ops.rope_cos_sin_cache(self.head_dim, theta, max_positions, dtype, self.device))
        self.weights: dict[str, Tensor] = {}
        self.layer_outputs: list[Tensor] | None = None  # set to [] to record each layer's fp32 output

    # -- weights ----------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf_model, max_positions: int | None = None) -> "EngineModel":
        engine = cls(hf_model.config, max_positions)
        engine.load_hf_weights(hf_model.state_dict())
        return engine

    @torch.no_grad()
    def load_hf_weights(self, state_dict: dict[str, Tensor]) -> None:
        """HF parameter names in, bf16 engine layout (merged qkv and gate_up, as vLLM loads them)."""
        sd = {k.removeprefix("model."): v.detach().to(device=self.device, dtype=self.dtype) for k, v in state_dict.items()}
        w = {"embed": sd["embed_tokens.weight"], "final_norm": sd["norm.weight"],
             "lm_head": sd.get("lm_head.weight", sd["embed_tokens.weight"])}
        for i in range(self.num_layers):
            p = f"layers.{i}."
            a = p + "self_attn."
            w[p + "qkv"] = torch.cat([sd[a + n + "_proj.weight"] for n in "qkv"])
            biases = [sd.get(a + n + "_proj.bias") for n in "qkv"]
            w[p + "qkv_bias"] = torch.cat(biases) if biases[0] is not None else None
            w[p + "o"] = sd[a + "o_proj.weight"]
            w[p + "o_bias"] = sd.get(a + "o_proj.bias")
            w[p + "gate_up"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
            w[p + "down"] = sd[p + "mlp.down_proj.weight"]
            w[p + "in_norm"] = sd[p + "input_layernorm.weight"]
            w[p + "post_norm"] = sd[p + "post_attention_layernorm.weight"]
            if self.qk_norm:
                w[p + "q_norm"] = sd[a + "q_norm.weight"]
                w[p + "k_norm"] = sd[a + "k_norm.weight"]
        self.weights = {k: (v.contiguous() if v is not None else None) for k, v in w.items()}

    # -- forward ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, input_ids: Tensor, positions: Tensor, mask: Tensor | None = None,
                kv_cache: KVCache | None = None, cache_len: int = 0) -> Tensor:
        """input_ids, positions: (B, T). mask: bool (B, 1, T, S), True = may attend, S = cache_len + T;
        None means plain causal over these T tokens (no cache). Returns bf16 logits (B, T, vocab)."""
        if not self.weights:
            raise RuntimeError("EngineModel has no weights: call load_hf_weights() first")
        B, T = input_ids.shape
        w = self.weights
        input_ids, positions = input_ids.to(self.device), positions.to(self.device)
        mask = None if mask is None else mask.to(self.device)
        pos = positions.reshape(-1)
        h = w["embed"][input_ids.reshape(-1)]           # (N, hidden), N = B*T
        residual = None
        sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)
        for i in range(self.num_layers):
            p = f"layers.{i}."
            if residual is None:
                residual, x = h, _rms_norm(h, w[p + "in_norm"], self.eps)
            else:
                x, residual = _add_rms_norm(h, residual, w[p + "in_norm"], self.eps)
            qkv = kernels.linear(x, w[p + "qkv"], w[p + "qkv_bias"])
            if self.qk_norm:
                q, k, v = _qkv_norm_rope_c(qkv, pos, self.cos_sin_cache, sizes, self.head_dim,
                                           w[p + "q_norm"], w[p + "k_norm"], self.eps)
            else:
                q, k, v = _qkv_rope_c(qkv, pos, self.cos_sin_cache, sizes, self.head_dim)
            attn = self._attention(i, q, k, v, B, T, mask, kv_cache, cache_len)
            h = kernels.linear(attn, w[p + "o"], w[p + "o_bias"])
            x, residual = _add_rms_norm(h, residual, w[p + "post_norm"], self.eps)
            h = kernels.linear(_silu_and_mul(kernels.linear(x, w[p + "gate_up"])), w[p + "down"])
            if self.layer_outputs is not None:
                self.layer_outputs.append((h.float() + residual.float()).view(B, T, -1))
        x, _ = _add_rms_norm(h, residual, w["final_norm"], self.eps)
        return kernels.linear(x, w["lm_head"]).view(B, T, -1)

    def _attention(self, layer, q, k, v, B, T, mask, kv_cache, cache_len):
        # (N, heads, D) -> (B, heads, T, D)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if kv_cache is not None:
            end = cache_len + T
            kv_cache.keys[layer][:, :, cache_len:end] = k
            kv_cache.values[layer][:, :, cache_len:end] = v
            k, v = kv_cache.keys[layer][:, :, :end], kv_cache.values[layer][:, :, :end]
        causal = mask is None
        out = kernels.attention(q, k, v, mask, causal and T > 1, self.scale)
        return out.transpose(1, 2).reshape(B * T, -1)
