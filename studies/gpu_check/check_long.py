"""Long responses at the paper's small testbed: does RoPE's share of the mismatch grow with position, and
is FP16 stock below BF16 `all`?

R1-Distill-Qwen-1.5B's shape (random weights), a few sequences of about 4,096 tokens sampled by the local
engine (compiled as vLLM compiles on a GPU), scored by the training side under none / rope / all (fused
region kernels, target `vllm`) in BF16, and FP16 stock against an FP16 engine loaded with the same master
weights. Against both references: the engine's prefill (`engine_forward`) and its decode-path logprobs
(`engine_sampling`: the BF16 engine's own sampling logprobs; the FP16 engine's decode of the same tokens).
k3 overall and per log-spaced position bin, with the engine's entropy; at the logit scale matched to the
scaling study's base and at one sharper scale (lower entropy, as trained models have).

    python3 -m studies.gpu_check.check_long --device cuda --out long.json
"""

from __future__ import annotations

import time

import torch

from localrl import CUDA_ATTENTION
from rla.digest import tensor_digest
from studies.gpu_check import testbed
from studies.gpu_check.check_common import Report, empty_cache, step_args
from studies._shared.random_models import build_model, gpu_point
from studies._shared.settings import GPU_TARGET
from studies._shared.shapes import PAPER_SHAPES, qwen_shape
from studies._shared.sides import strict_recompiles

MODEL = "r1-distill-qwen-1.5b"
LENGTHS = dict(n_seq=4, prompt_len=32, response_len=4064)  # 4,096 positions
QUICK_MODEL, QUICK_SHAPE = "tiny-qwen2", qwen_shape("qwen2", 256, 2, 512)
QUICK_LENGTHS = dict(n_seq=2, prompt_len=8, response_len=56)
SCALES = {"matched": 1.0, "sharper": 4.0}  # the output layer x this, over the matched scale
BF16_SETTINGS = (("none", "-"), ("rope", "fused"), ("all", "fused"))


def scored(train, layout, settings, head: dict, refs: dict, entropy: torch.Tensor, report: Report) -> None:
    """Each setting's rows against both references, overall and per position bin, added to the report."""
    for regions, impl in settings:
        start = time.perf_counter()
        lp = testbed.aligned_logprobs(train, layout, regions, impl)
        keys = {**head, "regions": regions, "impl": impl}
        finite = torch.isfinite(lp[layout.response]).double().mean().item()
        row = {**keys, "finite_share": finite, **testbed.against_both(lp, refs, layout)}
        report.parts["rows"].append(row)
        report.extend("by_position", [{**keys, **b} for b in testbed.by_position(lp, refs, layout, entropy)])
        print(f"  {head['scale']:8s} {head['dtype']} {regions:5s} {impl:6s} k3 {row['engine_forward/k3']:.3e} "
              f"(sampling {row['engine_sampling/k3']:.3e})  {time.perf_counter() - start:.0f} s", flush=True)


def measure_scale(name: str, shape, lengths: dict, scale: str, device: torch.device, report: Report) -> None:
    start = time.perf_counter()
    point = gpu_point(name, shape, sharpen=SCALES[scale], **lengths)
    master = build_model(point, point.prompt_len + point.response_len, device)
    train, engine = testbed.pair_of(master, point, device)
    layout = testbed.sampled(engine, point)
    refs, entropy = testbed.references(engine, layout)
    head = {"model": name, "layers": shape.layers, "hidden": shape.hidden, "scale": scale,
            "logit_scale": point.logit_scale, **lengths, "attention": CUDA_ATTENTION if device.type == "cuda"
            else "fp32 SDPA, rounded once", "responses_digest": tensor_digest(layout.ids)}
    print(f"{name} {scale} scale ({point.logit_scale:.3g}): sampled {lengths['n_seq']} x {lengths['response_len']}"
          f" tokens, engine entropy {entropy.mean():.3f} nats ({time.perf_counter() - start:.0f} s)", flush=True)
    scored(train, layout, BF16_SETTINGS, {**head, "dtype": "bf16", "entropy_engine": entropy.mean().item()},
           refs, entropy, report)
    del train, engine
    empty_cache(device)
    train16, engine16 = testbed.pair_of(master, point, device, torch.float16)
    refs16, entropy16 = testbed.references(engine16, layout, replay=True)
    scored(train16, layout, (("none", "-"),), {**head, "dtype": "fp16",
           "entropy_engine": entropy16.mean().item()}, refs16, entropy16, report)
    del train16, engine16, master
    empty_cache(device)


def main(argv=None) -> int:
    args, device = step_args(__doc__, argv)
    strict_recompiles()
    name, shape = (QUICK_MODEL, QUICK_SHAPE) if args.quick else (MODEL, PAPER_SHAPES[MODEL])
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    report = Report(args, "long", device, ("rows", "by_position"), target=GPU_TARGET, scales=SCALES,
                    weights="random (the scaling study's builder)")
    for scale in SCALES:  # the matched scale first: its rows are written when time runs out
        measure_scale(name, shape, lengths, scale, device, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
