"""BF16 against FP32 GEMMs on this CPU, at the local rig's shapes: which one should the shared kernels run?

Both sides of the local rig compute every GEMM through `localrl.kernels.linear`. Two ways to compute
a GEMM of BF16 values with one rounding at the output (a GPU GEMM's rounding location):

- `fp32`: upcast the BF16 inputs, an FP32 GEMM, round the output once (the kernels' CPU path today);
- `bf16`: torch's `F.linear` on the BF16 tensors (oneDNN: AVX512-BF16 or AMX where the CPU has them,
  FP32 accumulation, one rounding at the output).

Per shape (tokens x in -> out), forward and backward (dx = g W, dW = g^T x, each one GEMM with one
rounding) are timed, one thread as the rig runs, with torch.utils.benchmark (median of
blocked_autorange), both implementations alternating over `--repeats` rounds: the fastest round of each
and the ratio of those (and the median of the per-round ratios); also whether the two give the same bits. Shapes: every projection of the tiny and stress models at the rig's token counts
(one update micro-batch and one old-log-prob pass), a decode step, and 1024 x 1024 x 1024 for
comparison with the figure quoted in the docs.

    .venv/bin/python benchmarks/bench_gemm.py [--repeats 7] [--out benchmarks/results/gemm-cpu.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rla.machine import describe  # noqa: E402

BF16 = torch.bfloat16

# (model, projection, in, out) of the tiny (experiments/tiny.yaml) and stress (experiments/stress.yaml)
# models; HF's separate q/k/v and gate/up projections, as the trainer runs them.
PROJECTIONS = {
    "qwen2-s": {"q": (64, 64), "kv": (64, 32), "o": (64, 64), "gate_up": (64, 192), "down": (192, 64),
                "lm_head": (64, 384)},
    "qwen3-m": {"q": (128, 128), "kv": (128, 64), "o": (128, 128), "gate_up": (128, 320), "down": (320, 128),
                "lm_head": (128, 384)},
    "qwen2-st": {"q": (192, 192), "kv": (192, 48), "o": (192, 192), "gate_up": (192, 1152), "down": (1152, 192),
                 "lm_head": (192, 384)},
}
# Tokens per forward: the update's micro-batch (32 sequences of ~80 tokens), the old-log-prob pass
# (64 sequences), one decode step of 64 sequences.
TOKENS = {"update": 2560, "old_log_prob": 5120, "decode": 64}


def fp32_linear(x, w):
    return F.linear(x.float(), w.float()).to(x.dtype)


def bf16_linear(x, w):
    return F.linear(x, w)


def fp32_backward(g, x, w):
    gf = g.float()
    return (gf @ w.float()).to(BF16), (gf.T @ x.float()).to(BF16)


def bf16_backward(g, x, w):
    return g @ w, g.T @ x


IMPLS = {"fp32": (fp32_linear, fp32_backward), "bf16": (bf16_linear, bf16_backward)}


def _time(fn, *args) -> float:
    timer = benchmark.Timer(stmt="fn(*args)", globals={"fn": fn, "args": args}, num_threads=1)
    return timer.blocked_autorange(min_run_time=0.2).median


def measure(tokens: int, k: int, n: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, k, generator=gen).to(BF16)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(BF16)
    g = torch.randn(tokens, n, generator=gen).to(BF16)
    times = {f"{impl}_{part}": [] for impl in IMPLS for part in ("forward", "backward")}
    for _ in range(repeats):
        for impl, (fwd, bwd) in IMPLS.items():
            times[f"{impl}_forward"].append(_time(fwd, x, w))
            times[f"{impl}_backward"].append(_time(bwd, g, x, w))
    # the machine is shared: the fastest round of each is its speed without contention, and the ratio is
    # also given as the median over rounds of each round's ratio (both implementations ran in that round)
    median = {key: min(v) for key, v in times.items()}
    round_ratio = {part: statistics.median(b / f for b, f in zip(times[f"bf16_{part}"], times[f"fp32_{part}"]))
                   for part in ("forward", "backward")}
    same_fwd = torch.equal(fp32_linear(x, w), bf16_linear(x, w))
    (dx32, dw32), (dx16, dw16) = fp32_backward(g, x, w), bf16_backward(g, x, w)
    flops = 2 * tokens * k * n
    return {
        "tokens": tokens, "in": k, "out": n,
        **{f"{key}_ms": 1e3 * v for key, v in median.items()},
        "bf16_over_fp32_forward": median["bf16_forward"] / median["fp32_forward"],
        "bf16_over_fp32_backward": median["bf16_backward"] / median["fp32_backward"],
        "bf16_over_fp32_forward_round_median": round_ratio["forward"],
        "bf16_over_fp32_backward_round_median": round_ratio["backward"],
        "fp32_forward_gflops": flops / median["fp32_forward"] / 1e9,
        "bf16_forward_gflops": flops / median["bf16_forward"] / 1e9,
        "bits_equal_forward": same_fwd,
        "frac_equal_forward": (fp32_linear(x, w) == bf16_linear(x, w)).double().mean().item(),
        "bits_equal_backward": bool(torch.equal(dx32, dx16) and torch.equal(dw32, dw16)),
        "rounds": {key: [1e3 * t for t in v] for key, v in times.items()},
    }


def cases(quick: bool) -> list[tuple[str, str, str, int, int, int]]:
    out = [("reference", "square", "-", 1024, 1024, 1024)]
    if quick:
        return out + [("qwen2-s", "gate_up", "decode", 64, 64, 192)]
    for model, projections in PROJECTIONS.items():
        for pass_name, tokens in TOKENS.items():
            for proj, (k, n) in projections.items():
                out.append((model, proj, pass_name, tokens, k, n))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/gemm-cpu.json"))
    p.add_argument("--quick", action="store_true", help="two shapes, one round (tests)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    repeats = 1 if args.quick else args.repeats
    rows = []
    for model, proj, pass_name, tokens, k, n in cases(args.quick):
        row = {"model": model, "projection": proj, "pass": pass_name, **measure(tokens, k, n, repeats)}
        rows.append(row)
        print(f"{model:9s} {proj:8s} {pass_name:12s} {tokens:5d}x{k:4d}->{n:4d}: fp32 {row['fp32_forward_ms']:.3f} ms "
              f"bf16 {row['bf16_forward_ms']:.3f} ms (x{row['bf16_over_fp32_forward']:.2f}); backward "
              f"x{row['bf16_over_fp32_backward']:.2f}; same bits {row['bits_equal_forward']}/{row['bits_equal_backward']}",
              flush=True)
    rig = [r for r in rows if r["model"] != "reference"]
    summary = {"reference_1024_bf16_over_fp32_forward": rows[0]["bf16_over_fp32_forward"],
               "reference_1024_fp32_forward_ms": rows[0]["fp32_forward_ms"],
               "reference_1024_bf16_forward_ms": rows[0]["bf16_forward_ms"]}
    if rig:
        for part in ("forward", "backward"):
            ratios = [r[f"bf16_over_fp32_{part}"] for r in rig]
            summary[f"bf16_over_fp32_{part}_median"] = statistics.median(ratios)
            summary[f"bf16_over_fp32_{part}_range"] = [min(ratios), max(ratios)]
            summary[f"bf16_slower_{part}"] = sum(x > 1 for x in ratios)
        # the time a rig step spends in GEMMs, as the sum over its shapes (each pass's projections once)
        for impl in IMPLS:
            summary[f"{impl}_total_ms"] = sum(r[f"{impl}_forward_ms"] + r[f"{impl}_backward_ms"] for r in rig)
        summary["bits_equal_forward"] = sum(r["bits_equal_forward"] for r in rig)
        summary["shapes"] = len(rig)
    result = {"machine": describe(), "threads": 1, "repeats": repeats, "summary": summary, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
