"""The engine's model runner: Qwen2/Qwen3 compiled piece by piece, as vLLM compiles them on a GPU (the graph
split at the attention ops; docs/patches.md: "Targets"). A piece runs from one layer's o_proj to the next
layer's qkv and RoPE in vLLM's formulations (ops.py), compiled by Inductor; its outputs are stored in BF16.
GEMMs are opaque kernels inside the pieces, attention runs between them. Weights: BF16, never patched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from localrl import kernels
from localrl.engine import ops


def _qkv(x, qkv_w, qkv_b, positions, cos_sin_cache, sizes, head_dim, q_norm_w, k_norm_w, eps):
    """qkv GEMM, Qwen3's q/k norms, RoPE: the tail of every piece but the last (vLLM's Qwen2/Qwen3Attention)."""
    qkv = kernels.linear(x, qkv_w, qkv_b)
    q, k, v = qkv.split(sizes, dim=-1)
    if q_norm_w is not None:
        q = ops.qk_norm(q, q_norm_w, eps, head_dim)
        k = ops.qk_norm(k, k_norm_w, eps, head_dim)
    q, k = ops.rotary_emb(positions, q, k, cos_sin_cache, head_dim)
    return q, k, v


def _mlp(x, gate_up_w, down_w):
    return kernels.linear(ops.silu_and_mul(kernels.linear(x, gate_up_w)), down_w)


def first_piece(h, positions, input_layernorm, qkv_w, qkv_b, q_norm_w, k_norm_w, cos_sin_cache, sizes, head_dim, eps):
    """Embedding output -> layer 0's input norm -> qkv -> RoPE."""
    residual = h
    x = ops.rms_norm(h, input_layernorm, eps)
    q, k, v = _qkv(x, qkv_w, qkv_b, positions, cos_sin_cache, sizes, head_dim, q_norm_w, k_norm_w, eps)
    return q, k, v, residual


def middle_piece(attn, residual, positions, o_w, post_attention_layernorm, gate_up_w, down_w, input_layernorm,
                 qkv_w, qkv_b, q_norm_w, k_norm_w, cos_sin_cache, sizes, head_dim, eps):
    """Layer i's o_proj -> add + norm -> MLP -> layer i+1's add + norm -> qkv -> RoPE."""
    h = kernels.linear(attn, o_w)
    x, residual = ops.fused_add_rms_norm(h, residual, post_attention_layernorm, eps)
    h = _mlp(x, gate_up_w, down_w)
    x, residual = ops.fused_add_rms_norm(h, residual, input_layernorm, eps)
    q, k, v = _qkv(x, qkv_w, qkv_b, positions, cos_sin_cache, sizes, head_dim, q_norm_w, k_norm_w, eps)
    return q, k, v, residual


def last_piece(attn, residual, o_w, post_attention_layernorm, gate_up_w, down_w, final_norm, eps):
    """The last layer's o_proj -> add + norm -> MLP -> the model's final add + norm. The residual is
    returned too (the probe records it; vLLM drops it)."""
    h = kernels.linear(attn, o_w)
    x, residual = ops.fused_add_rms_norm(h, residual, post_attention_layernorm, eps)
    h = _mlp(x, gate_up_w, down_w)
    x, residual = ops.fused_add_rms_norm(h, residual, final_norm, eps)
    return x, residual


def compile_piece(fn, token_args: tuple[int, ...]):
    """Compile a piece as vLLM does: one graph, dim 0 of the arguments in `token_args` (the token count)
    dynamic, every other dimension static (vLLM's `_mark_dynamic_inputs`); one token gets its own graph."""
    graph = torch.compile(fn, dynamic=False, fullgraph=True)

    def run(*args):
        for i in token_args:
            torch._dynamo.maybe_mark_dynamic(args[i], 0)
        return graph(*args)

    return run


PIECES = {"first": (first_piece, (0, 1)), "middle": (middle_piece, (0, 1, 2)), "last": (last_piece, (0, 1))}
_compiled = {name: compile_piece(fn, args) for name, (fn, args) in PIECES.items()}


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
        self.layer_outputs: list[Tensor] | None = None  # set to [] to record each layer's stored residual

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
            w[p + "gate_up"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
            w[p + "down"] = sd[p + "mlp.down_proj.weight"]
            w[p + "in_norm"] = sd[p + "input_layernorm.weight"]
            w[p + "post_norm"] = sd[p + "post_attention_layernorm.weight"]
            w[p + "q_norm"] = sd.get(a + "q_norm.weight") if self.qk_norm else None
            w[p + "k_norm"] = sd.get(a + "k_norm.weight") if self.qk_norm else None
            if sd.get(a + "o_proj.bias") is not None:
                raise ValueError("EngineModel: an o_proj bias is not part of Qwen2/Qwen3 (vLLM builds o_proj without one)")
        self.weights = {k: (v.contiguous() if v is not None else None) for k, v in w.items()}

    def _qkv_weights(self, i: int) -> tuple:
        w, p = self.weights, f"layers.{i}."
        return w[p + "qkv"], w[p + "qkv_bias"], w[p + "q_norm"], w[p + "k_norm"]

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
        sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)
        shape = (self.cos_sin_cache, sizes, self.head_dim, self.eps)
        h = w["embed"][input_ids.reshape(-1)]           # (N, hidden), N = B*T
        q, k, v, residual = _compiled["first"](h, pos, w["layers.0.in_norm"], *self._qkv_weights(0), *shape)
        for i in range(self.num_layers):
            p = f"layers.{i}."
            attn = self._attention(i, q, k, v, B, T, mask, kv_cache, cache_len)
            mlp = (w[p + "o"], w[p + "post_norm"], w[p + "gate_up"], w[p + "down"])
            if i + 1 < self.num_layers:
                q, k, v, residual = _compiled["middle"](attn, residual, pos, *mlp, w[f"layers.{i + 1}.in_norm"],
                                                        *self._qkv_weights(i + 1), *shape)
            else:
                x, residual = _compiled["last"](attn, residual, *mlp, w["final_norm"], self.eps)
            if self.layer_outputs is not None:
                self.layer_outputs.append(residual.view(B, T, -1))
        return kernels.linear(x, w["lm_head"]).view(B, T, -1)

    def _attention(self, layer, q, k, v, B, T, mask, kv_cache, cache_len):
        # (N, heads * D) -> (B, heads, T, D)
        q, k, v = (t.reshape(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if kv_cache is not None:
            end = cache_len + T
            kv_cache.keys[layer][:, :, cache_len:end] = k
            kv_cache.values[layer][:, :, cache_len:end] = v
            k, v = kv_cache.keys[layer][:, :, :end], kv_cache.values[layer][:, :, :end]
        causal = mask is None
        out = kernels.attention(q, k, v, mask, causal and T > 1, self.scale)
        return out.transpose(1, 2).reshape(B * T, -1)
