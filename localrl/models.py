"""Tiny Qwen-family models built from transformers configs (no downloads).

`arch: qwen2` -> Qwen2 (q/k/v projections with bias); `arch: qwen3` -> Qwen3 (per-head q/k RMSNorm,
no bias). Depth and width come from `model_specs` in the experiment config.
"""

from __future__ import annotations

import copy

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
    model = AutoModelForCausalLM.from_config(model_config(spec, tokenizer), dtype=torch.float32)
    return model


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def to_bf16_fsdp_style(model, dtype: torch.dtype = torch.bfloat16):
    """Cast the parameters (in place) to `dtype` but keep the buffers (rotary inv_freq) in fp32, as FSDP
    mixed precision does. `model.to(bfloat16)` would also round inv_freq and change every cos/sin."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def compute_copy(master, dtype: torch.dtype = torch.bfloat16):
    """The training side's compute model: a copy of the fp32 master, parameters in `dtype`, buffers fp32."""
    return to_bf16_fsdp_style(copy.deepcopy(master), dtype)
