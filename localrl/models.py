"""The training side's compute model: FSDP mixed precision's copy of the fp32 master."""

from __future__ import annotations

import copy

import torch


def to_bf16_fsdp_style(model, dtype: torch.dtype = torch.bfloat16):
    """Cast the parameters (in place) to `dtype` but keep the buffers (rotary inv_freq) in fp32, as FSDP
    mixed precision does. `model.to(bfloat16)` would also round inv_freq and change every cos/sin."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def compute_copy(master, dtype: torch.dtype = torch.bfloat16):
    """The training side's compute model: a copy of the fp32 master, parameters in `dtype`, buffers fp32."""
    return to_bf16_fsdp_style(copy.deepcopy(master), dtype)
