"""What the aligned regions cost a whole training step: forward + backward of a whole model at the paper
shapes (R1-Distill-Qwen-1.5B, Qwen3-8B; random BF16 weights, no optimizer), 8,192 tokens per micro-batch
(2 sequences of 4,096), gradient checkpointing on, transformers' SDPA attention: stock, `all` fused, `all`
eager, and Liger's kernels (RoPE, RMSNorm, SwiGLU) where its wheel is installed. Median step time over a
few steps after a warm-up, and the peak of allocated GPU memory (torch keeps no such count on a CPU).

    python3 -m studies.gpu_check.check_cost --device cuda --out cost.json
"""

from __future__ import annotations

import importlib.util
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

import patches
from studies.gpu_check.check_common import Report, empty_cache, shapes, step_args
from studies._shared.shapes import hf_config

BATCH, SEQ_LEN, REPEATS = 2, 4096, 3
QUICK_BATCH, QUICK_SEQ_LEN, QUICK_REPEATS = 2, 64, 2
IMPLS = ("stock", "all-fused", "all-eager", "liger")  # Liger last: it patches transformers' classes for good


def build(shape, seq_len: int, device: torch.device):
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(shape, seq_len), dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def select(impl: str, model) -> None:
    """Patch stock transformers for `impl` (measure removes the patches after each)."""
    if impl.startswith("all-"):
        patches.apply("all", impl=impl.removeprefix("all-"))
    elif impl == "liger":
        # optional: only the liger case needs its wheel
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2, apply_liger_kernel_to_qwen3

        apply = apply_liger_kernel_to_qwen2 if model.config.model_type == "qwen2" else apply_liger_kernel_to_qwen3
        apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False,
              model=model)


def step(model, ids: torch.Tensor) -> float:
    """One forward + backward (next-token cross entropy); its loss."""
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.item()


def timed(model, ids: torch.Tensor, repeats: int, device: torch.device) -> dict:
    step(model, ids)  # warm-up: compilation, allocator
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        losses.append(step(model, ids))
        sync()
        times.append(time.perf_counter() - start)
    out = {"step_s": statistics.median(times), "step_s_all": times, "loss": losses[-1]}
    if device.type == "cuda":
        out["peak_bytes"] = torch.cuda.max_memory_allocated(device)
    return out


def measure(name: str, shape, batch: int, seq_len: int, repeats: int, device: torch.device, report: Report) -> None:
    model = build(shape, seq_len, device)
    ids = torch.randint(0, shape.vocab, (batch, seq_len), generator=torch.Generator().manual_seed(1)).to(device)
    liger_skip = ("Liger's kernels are Triton: CUDA only" if device.type != "cuda"
                  else "liger_kernel not installed (no wheel in benchmarks/wheels)"
                  if importlib.util.find_spec("liger_kernel") is None else "")
    for impl in IMPLS:
        head = {"model": name, "layers": shape.layers, "hidden": shape.hidden, "tokens": batch * seq_len, "impl": impl}
        why = liger_skip if impl == "liger" else ""
        try:
            if not why:
                select(impl, model)
                row = {**head, **timed(model, ids, repeats, device)}
        except Exception as error:  # noqa: BLE001 - another project's kernels: a failure is a note, not a lost step
            if impl != "liger":
                raise
            why = f"Liger failed: {type(error).__name__}: {str(error)[:200]}"
        finally:
            patches.remove()
        if why:
            report.extend("rows", [{**head, "skipped": why}])
            continue
        stock = next((r for r in report.parts["rows"] if r["model"] == name and r["impl"] == "stock"), row)
        row["time_x_stock"] = row["step_s"] / stock["step_s"]  # stock runs first
        if "peak_bytes" in row:
            row["peak_x_stock"] = row["peak_bytes"] / stock["peak_bytes"]
        report.extend("rows", [row])
        print(f"{name} {impl:9s} {row['step_s'] * 1e3:.0f} ms ({row['time_x_stock']:.2f}x stock)"
              + (f", peak {row['peak_bytes'] / 2**30:.2f} GiB" if "peak_bytes" in row else ""), flush=True)
    del model
    empty_cache(device)


def main(argv=None) -> int:
    args, device = step_args(__doc__, argv)
    batch, seq_len, repeats = (QUICK_BATCH, QUICK_SEQ_LEN, QUICK_REPEATS) if args.quick else (BATCH, SEQ_LEN, REPEATS)
    report = Report(args, "cost", device, ("rows",), batch=batch, seq_len=seq_len, repeats=repeats,
                    gradient_checkpointing=True, attention="transformers' sdpa", weights="random BF16, no optimizer",
                    peak_memory="torch.cuda.max_memory_allocated" if device.type == "cuda"
                    else "not measured: torch keeps no allocator peak on a CPU")
    for name, shape in shapes(args.quick).items():
        measure(name, shape, batch, seq_len, repeats, device, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
