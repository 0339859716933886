"""Tiny Qwen-family models built from transformers configs (no downloads).

`arch: qwen2` -> Qwen2 (q/k/v projections with bias); `arch: qwen3` -> Qwen3 (per-head q/k RMSNorm,
no bias). Depth and width come from `model_specs` in the experiment config.
"""

from __future__ import annotations

import torch

MAX_POSITIONS = 256
ROPE_THETA = 10000.0


def model_config(spec: dict, tokenizer):
    """A transformers Qwen2Config / Qwen3Config for one `model_specs` entry."""
    from transformers import Qwen2Config, Qwen3Config

    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[spec["arch"]]  # checked by rla.config.model_spec
    kwargs = {k: v for k, v in spec.items() if k not in ("arch", "rope_theta", "max_position_embeddings")}
    return cls(
        vocab_size=len(tokenizer),
        max_position_embeddings=spec.get("max_position_embeddings", MAX_POSITIONS),
        rope_parameters={"rope_type": "default", "rope_theta": float(spec.get("rope_theta", ROPE_THETA))},
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **kwargs,
    )


def build_model(spec: dict, tokenizer, seed: int):
    """A freshly initialised fp32 model; the seed fixes the initial weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(spec, tokenizer), dtype=torch.float32)
    return model


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def to_bf16_fsdp_style(model):
    """Cast parameters to bf16 but keep buffers (rotary inv_freq) in fp32, as FSDP mixed precision does.
    `model.to(bfloat16)` alone would also round inv_freq and change every cos/sin."""
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.to(torch.bfloat16)
    for name, buf in buffers.items():
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, buf)
    return model
