"""Tiny random Qwen models as verl's FSDP workers run them: bf16 weights, fp32 buffers."""

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

from localrl.models import to_bf16_fsdp_style  # noqa: F401  (the tests' name for it)

CONFIGS = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}


def tiny_config(arch: str, **overrides):
    kw = dict(vocab_size=256, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
              num_attention_heads=6, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
              tie_word_embeddings=False, rope_theta=1e6)
    kw.update(overrides)
    return CONFIGS[arch](**kw)


def tiny_model(arch: str, seed: int = 0, **overrides):
    """Random weights, with norm weights spread around 1 (trained norms are not all-ones)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def bf16_sdpa_unavailable() -> str | None:
    """Why torch's CPU SDPA cannot run BF16 here, or None. On a CPU with AMX tiles it packs its operands for
    them, and refuses when ATen's vector ISA is forced below AVX-512 (`make test-isa`'s second pass)."""
    try:
        torch.nn.functional.scaled_dot_product_attention(*[torch.ones(1, 1, 64, 32, dtype=torch.bfloat16)] * 3)
    except RuntimeError as err:
        return f"torch's BF16 SDPA does not run with this ISA: {err}"
    return None


def attention_inputs(seed: int = 0, heads: int = 4, kv_heads: int = 2, tokens: int = 70, head_dim: int = 64):
    """Random BF16 q, k, v for one sequence, (1, heads, T, D) and (1, kv_heads, T, D): scores spread wide
    enough that the softmax is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(1, heads, tokens, head_dim, generator=g) * 2).bfloat16()
    k = (torch.randn(1, kv_heads, tokens, head_dim, generator=g) * 2).bfloat16()
    v = torch.randn(1, kv_heads, tokens, head_dim, generator=g).bfloat16()
    return q, k, v
