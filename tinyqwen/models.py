"""Qwen2/Qwen3 models built from transformers configs (no downloads): the tiny ones both backends train
(depth and width from `model_specs` in the experiment config), and real widths at random weights.
"""

from __future__ import annotations

import torch

MAX_POSITIONS = 256
ROPE_THETA = 10000.0


def qwen_config(arch: str, vocab_size: int, rope_theta: float = ROPE_THETA,
                max_position_embeddings: int = MAX_POSITIONS, **fields):
    """A transformers Qwen2Config / Qwen3Config with untied embeddings and default RoPE: every model
    the suite builds (the tiny grid, the scaling study, the rounding map) comes from here."""
    from transformers import Qwen2Config, Qwen3Config

    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    return cls(vocab_size=vocab_size, max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
               rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)}, **fields)


def model_config(spec: dict, tokenizer):
    """The config of one `model_specs` entry (its keys checked by rla.config.model_spec)."""
    return qwen_config(**spec, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, bos_token_id=None)


def build_model(spec: dict, tokenizer, seed: int):
    """A freshly initialised fp32 model; the seed fixes the initial weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(model_config(spec, tokenizer), dtype=torch.float32)


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# Widths and depths of real models (and a small one of the same kind), at random weights: what the
# rounding map is built at.
REAL_SHAPES: dict[str, dict] = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, head_dim=128),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    # the paper's small testbed: Qwen2 architecture, Qwen2.5-Math-1.5B's widths (its config.json)
    "r1-distill-qwen-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2, head_dim=128),
    # the paper's large models (their config.json; Qwen2.5-7B has Qwen2.5-Math-7B's widths)
    "qwen2.5-math-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                            num_key_value_heads=4, head_dim=128),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
}


def real_shape_config(arch: str, shape: str, vocab_size: int = 1024, layers: int | None = None):
    """A config of one of REAL_SHAPES (default RoPE, 1024 positions). `layers`: fewer decoder layers than
    the shape's own (the widths stay), or None for its depth."""
    dims = dict(REAL_SHAPES[shape])
    if layers is not None:
        if not 1 <= layers <= dims["num_hidden_layers"]:
            raise ValueError(f"shape {shape!r} has {dims['num_hidden_layers']} decoder layers; "
                             f"allowed: 1..{dims['num_hidden_layers']}")
        dims["num_hidden_layers"] = layers
    return qwen_config(arch, vocab_size, max_position_embeddings=1024,
                       architectures=[f"{arch.capitalize()}ForCausalLM"], **dims)


@torch.no_grad()
def sharpen(model) -> None:
    """Random weights a mismatch shows on: GEMM weights x3 (std 0.06; at HF's 0.02 the distributions are near
    uniform and the mismatch vanishes into noise), norm weights 1 + 0.2 N(0, 1) (trained norms are not all ones)."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.add_(0.2 * torch.randn_like(p))
        elif p.dim() == 2:
            p.mul_(3.0)

