"""Random models at a shape with the scaling study's output and attention scales, their BF16 copy, the
engine beside it and its samples: the scaling study and the GPU check."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from transformers import AutoModelForCausalLM

from localrl import Engine, compute_copy, use_local_kernels
from studies._shared.shapes import Shape, hf_config, qwen_shape

NORM_SPREAD = 0.2  # norm weights 1 + 0.2 N(0, 1): trained norms are not all ones (x * 1 is exact)
BASE_LAYERS, BASE_HIDDEN, BASE_VOCAB = 4, 256, 4096


@dataclass(frozen=True)
class Point:
    """One measurement: a shape, how sharp its outputs and attention are, and the token layout."""

    factor: str
    value: float
    shape: Shape
    shape_name: str = ""
    n_seq: int = 16
    prompt_len: int = 16
    response_len: int = 128
    logit_scale: float = 16.0  # output layer x this: entropy per token falls as it grows
    attn_scale: float = 1.0    # q and k x this (Qwen2: projections, Qwen3: q/k-norm weights): scores x its square
    qk_bias: float = 0.0       # Qwen2: q/k biases ~ N(0, qk_bias^2) (trained Qwen2 models carry large ones)
    update: float = 0.0        # relative size of a weight update before re-scoring (persistence)
    seed: int = 0


def base_point(arch: str) -> Point:
    return Point("base", 0, qwen_shape(arch, BASE_HIDDEN, BASE_LAYERS, BASE_VOCAB))


def matched_scale(base: Point, hidden: int) -> float:
    """The output scale giving width `hidden` the base's logit spread (unit-RMS norm output: it grows as sqrt)."""
    return base.logit_scale * math.sqrt(base.shape.hidden / hidden)


def gpu_point(name: str, shape: Shape, n_seq: int, prompt_len: int, response_len: int,
              sharpen: float = 1.0) -> Point:
    """The GPU check's point at `shape`: the base's matched logit scale times `sharpen`."""
    base = base_point(shape.arch)
    return replace(base, factor="gpu_check", shape=shape, shape_name=name, n_seq=n_seq, prompt_len=prompt_len,
                   response_len=response_len, logit_scale=sharpen * matched_scale(base, shape.hidden))


def build_model(point: Point, max_positions: int, device: str | torch.device = "cpu"):
    """fp32 master weights of a random model at the point's scales, initialised on `device` (the CPU: the
    same weights anywhere)."""
    torch.manual_seed(point.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(point.shape, max_positions), dtype=torch.float32)
    bias_gen = torch.Generator().manual_seed(point.seed + 104729)
    # Qwen3 normalises q and k per head: there the q/k-norm weights set the scores' scale
    attn_scaled = ("q_norm", "k_norm") if point.shape.arch == "qwen3" else ("q_proj", "k_proj")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(NORM_SPREAD * torch.randn_like(p))
            elif name == "lm_head.weight":
                p.mul_(point.logit_scale)
            if point.attn_scale != 1 and any(f".{m}." in name for m in attn_scaled):
                p.mul_(point.attn_scale)
            if point.qk_bias and (".q_proj.bias" in name or ".k_proj.bias" in name):
                p.copy_(point.qk_bias * torch.randn(p.shape, generator=bias_gen))  # own stream: the rest unchanged
    return model.eval().requires_grad_(False)


def cast_copy(master, keep_master: bool = True):
    """bf16 parameters, fp32 buffers (as FSDP), shared kernels; without `keep_master` the master is cast."""
    if keep_master:
        return use_local_kernels(compute_copy(master))
    for p in master.parameters():
        p.data = p.data.to(torch.bfloat16)
    return use_local_kernels(master)


def cast_pair(point: Point, device: torch.device) -> tuple:
    """(BF16 training model, BF16 engine) built on `device`, cast in place (an 8B model's master and copies
    would not fit beside each other)."""
    max_positions = point.prompt_len + point.response_len
    train = cast_copy(build_model(point, max_positions, device), keep_master=False)
    engine = Engine(train.config, eos_id=-1, pad_id=0, max_positions=max_positions, device=device)
    engine.load_weights({k: v for k, v in train.state_dict().items() if v.dtype == torch.bfloat16})
    return train, engine


def sample(engine, point: Point):
    """Random prompts, then full-length responses sampled from the engine at temperature 1."""
    gen = torch.Generator().manual_seed(point.seed + 1)
    prompts = torch.randint(1, point.shape.vocab, (point.n_seq, point.prompt_len), generator=gen).tolist()
    return engine.generate(prompts, point.response_len, temperature=1.0, generator=gen)
