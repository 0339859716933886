"""The attention kernels of the paper's stack: the training side on SDPA's flash backend (a stand-in for
flash-attn 2, verl's default) against the engine on the memory-efficient kernel it is pinned to (a
stand-in for vLLM's FlashAttention), next to the same training side on the engine's kernel (the first
check's condition, both sides on one kernel).

R1-Distill-Qwen-1.5B and Qwen3-8B shapes at full depth, random weights, 8 sequences of 32 + 128 tokens
(the first check's model step): stock and `all` (fused region kernels, target `vllm`), each with both
attention kernels on the training side; k3, mean |d logprob| and the bit-equal share against the engine's
prefill and its sampling logprobs. On a CPU the flash backend is torch's C++ flash kernel on the BF16
values and the engine's attention is FP32 rounded once (the rig's CPU kernel): named in the JSON.

    python3 -m studies.gpu_check.check_kernels --device cuda --out kernels.json
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from localrl import CUDA_ATTENTION, causal_mask, may_attend, register_attention
from studies.gpu_check import testbed
from studies.gpu_check.check_common import Report, empty_cache, shapes, step_args
from studies._shared.random_models import cast_pair, gpu_point
from studies._shared.settings import GPU_TARGET
from studies._shared.sides import strict_recompiles

LENGTHS = dict(n_seq=8, prompt_len=32, response_len=128)
QUICK_LENGTHS = dict(n_seq=2, prompt_len=8, response_len=8)
SETTINGS = (("none", "-"), ("all", "fused"))
FLASH_NAME = "sdpa_fa_backend"  # transformers reads a name with "flash" in it as a Hub kernel


def flash_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface on SDPA's flash backend, causal, on the BF16 values (as
    flash-attn 2 computes): unpadded batches only, as the flash kernels take no mask."""
    mask = may_attend(attention_mask)
    if mask is not None and not torch.equal(mask.expand(mask.shape[0], 1, *mask.shape[-2:])[:, 0],
                                            causal_mask(query.shape[2], key.shape[2], mask.device)
                                            .expand(mask.shape[0], -1, -1)):
        raise ValueError("flash_attention: a padding mask; the flash kernels take causal, unpadded batches only")
    if query.shape[1] != key.shape[1]:  # GQA as repeated KV heads, as the engine's kernel takes it
        key, value = (t.repeat_interleave(query.shape[1] // key.shape[1], dim=1) for t in (key, value))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True,
                                             scale=module.scaling if scaling is None else scaling)
    return out.transpose(1, 2).contiguous(), None


def kernel_names(device: torch.device) -> dict[str, str]:
    if device.type == "cuda":
        return {"sdpa_flash": "SDPA flash backend, BF16 (stand-in for flash-attn 2)",
                "engine_kernel": f"SDPA {CUDA_ATTENTION}, BF16 (the engine's pinned kernel; "
                                 "stand-in for vLLM's FlashAttention)"}
    return {"sdpa_flash": "SDPA flash backend: torch's C++ CPU kernel on the BF16 values",
            "engine_kernel": "FP32 SDPA on the BF16 values, rounded once (the rig's CPU kernel)"}


def measure(name: str, shape, lengths: dict, device: torch.device, report: Report) -> None:
    start = time.perf_counter()
    point = gpu_point(name, shape, **lengths)
    train, engine = cast_pair(point, device)
    layout = testbed.sampled(engine, point)
    refs, entropy = testbed.references(engine, layout)
    print(f"{name}: sampled {lengths['n_seq']} x {lengths['response_len']} tokens, engine entropy "
          f"{entropy.mean():.3f} nats ({time.perf_counter() - start:.0f} s)", flush=True)
    head = {"model": name, "layers": shape.layers, "hidden": shape.hidden, **lengths,
            "logit_scale": point.logit_scale, "entropy_engine": entropy.mean().item()}
    for train_attention in ("engine_kernel", "sdpa_flash"):
        if train_attention == "sdpa_flash":
            register_attention(train, FLASH_NAME, flash_attention)
        for regions, impl in SETTINGS:
            lp = testbed.aligned_logprobs(train, layout, regions, impl)
            row = {**head, "train_attention": train_attention, "regions": regions, "impl": impl,
                   **testbed.against_both(lp, refs, layout)}
            report.extend("rows", [row])
            print(f"  {train_attention:13s} {regions:4s} k3 {row['engine_forward/k3']:.3e} "
                  f"(sampling {row['engine_sampling/k3']:.3e})", flush=True)
    del train, engine
    empty_cache(device)


def main(argv=None) -> int:
    args, device = step_args(__doc__, argv)
    strict_recompiles()
    report = Report(args, "kernels", device, ("rows",), target=GPU_TARGET, kernels=kernel_names(device),
                    weights="random (the scaling study's builder)")
    for name, shape in shapes(args.quick).items():  # the 1.5B testbed first
        measure(name, shape, QUICK_LENGTHS if args.quick else LENGTHS, device, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
