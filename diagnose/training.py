"""The training side as an RL trainer holds the model (FSDP mixed precision: BF16 parameters, FP32
buffers such as RoPE's inv_freq), scoring the engine's tokens teacher-forced, stock or with the
alignment patches applied."""

from __future__ import annotations

import contextlib

import torch
from transformers import AutoModelForCausalLM

import patches

SPECS = ("none", *patches.REGIONS, "all")  # stock, each region alone, all regions


def load(checkpoint_dir) -> torch.nn.Module:
    """The checkpoint in FP32, its parameters cast to BF16 (round to nearest), its buffers kept FP32."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32).eval()
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    return model


@contextlib.contextmanager
def numerics(spec: str, target, reduction: str):
    """The patches applied for `spec` ("none": stock transformers), restored after."""
    with patches.aligned(spec, target=target, reduction=reduction):
        yield


@torch.no_grad()
def score(model, prompt: list[int], response: list[int]) -> list[float]:
    """The model's logprob of each response token given everything before it (one unpadded sequence,
    as a trainer without padding computes it): FP32 log-softmax of the BF16 logits."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    rows = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return torch.log_softmax(logits, -1)[rows, torch.tensor(response)].tolist()
