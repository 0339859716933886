"""Check the fused aligned regions against the engine's compiled formulations, per region and output,
with the size of every difference.

Reference: localrl/engine/ops.py (vLLM's native formulations) under torch.compile - on a GPU that is
Inductor's Triton output, the mechanism of vLLM's default path. Compared with it, forward: the fused
implementation, the eager-aligned one (on a GPU eager CUDA kernels evaluate sigmoid/rsqrt and a*b+c
differently from Triton) and the stock HF formulas; backward: fused against eager-aligned gradients.
Each comparison gives the share of elements that differ, the largest difference in bf16 ulps, and a
verdict (`verdict`):
  bit-equal   no element differs
  last-bit    at most 1 ulp on at most 1% of elements: the order of operations (a reduction's summation
              order, a transcendental's or an FMA's last fp32 bit) flips about 2^-16 of the roundings
  order       at most 1% of elements, each differing by at most ORDER_ROW_ULPS ulps of its row's largest
              reference value: one such flipped rounding of an intermediate, carried through a difference
              that cancels (RoPE's x*cos - y*sin, a norm's backward), is many ulps of a result near zero
              but stays within a few ulps of the row's scale. Added after the first GPU run (the eager
              q/k norm + RoPE: 272 of 14.7M elements, up to 20218 ulps of the element) and before the next
  rounding    more: a bf16 rounding moved or added changes 15-40% of the elements, by up to several ulps
The check fails when an aligned implementation (fused or eager, forward or backward) is at `rounding`
against its reference, and when stock is not at `rounding` on some output of a region (then the check
could not have seen a misplaced rounding). Imports only torch (and this repository).

    python3 benchmarks/check_fused.py --device cuda --out $OUT/fused-check-gpu.json
    .venv/bin/python benchmarks/check_fused.py --device cpu --quick      # a dry run
Exit status 1 when the check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_regions import stock_rope  # noqa: E402
from benchmarks.stock import stock_rms_norm  # noqa: E402
from localrl.engine import ops  # noqa: E402
from localrl.engine.model import compile_piece  # noqa: E402
from patches import _precision, rmsnorm, rope, swiglu  # noqa: E402
from tinyqwen.models import REAL_SHAPES  # noqa: E402

BF16 = torch.bfloat16
EPS, THETA, MAX_POS = 1e-6, 1e6, 32768
# (name, hidden, heads, kv_heads, head_dim, intermediate)
SHAPES = [(name, *(REAL_SHAPES[real][key] for key in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                       "head_dim", "intermediate_size")))
          for name, real in (("qwen2.5-7b", "qwen2.5-math-7b"), ("qwen3-8b", "qwen3-8b"))]
QUICK = [("quick", 256, 4, 2, 64, 512)]
REGIONS = ("rope", "qk_norm_rope", "swiglu", "add_rmsnorm", "rmsnorm")  # the keys of `regions`


LAST_BIT_SHARE = 0.01  # 1%: ~650x the share an order-of-operations difference flips, 1/15 of a moved rounding's
# One flipped bf16 rounding of an intermediate (1 ulp of its row), rotated or scaled (|cos| + |sin| <= sqrt 2)
# and rounded once more (1 ulp): at most about 3 ulps of the result row's scale; 4 leaves a last bit to spare.
ORDER_ROW_ULPS = 4


def row_ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| per element, in bf16 ulps of the largest |want| of its row (last dimension)."""
    scale = want.float().abs().amax(-1, keepdim=True).clamp_min(torch.finfo(BF16).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - 7)  # bf16 keeps 8 significant bits
    return (got.float() - want.float()).abs() / ulp


def compare(got: torch.Tensor, want: torch.Tensor) -> dict:
    differ = got != want
    ulps = (got[differ].view(torch.int16).int() - want[differ].view(torch.int16).int()).abs()
    row = {"differing": int(differ.sum()), "of": want.numel(), "max_ulp": int(ulps.max()) if ulps.numel() else 0,
           "max_row_ulp": float(row_ulps(got, want).max()) if ulps.numel() else 0.0}
    return {**row, "verdict": verdict(row)}


def verdict(row: dict) -> str:
    if row["differing"] == 0:
        return "bit-equal"
    if row["differing"] > LAST_BIT_SHARE * row["of"]:
        return "rounding"
    if row["max_ulp"] <= 1:
        return "last-bit"
    return "order" if row["max_row_ulp"] <= ORDER_ROW_ULPS else "rounding"


def judge(row: dict) -> list[str]:
    """What fails in one region's row: an aligned comparison at `rounding`, or stock at `rounding` nowhere."""
    bad = [f"{key} {c['verdict']} ({c['differing']}/{c['of']}, max {c['max_ulp']} ulp)"
           for key in ("fused_vs_engine", "eager_vs_engine", "fused_vs_eager_grads") for c in row[key]
           if c["verdict"] == "rounding"]
    if all(c["verdict"] != "rounding" for c in row["stock_vs_engine"]):
        bad.append("stock_vs_engine: no output at `rounding`, so this check could not see a misplaced rounding")
    return bad


def summary(rows: list[dict]) -> str:
    """One line per comparison: share differing, max ulp, verdict."""
    return ", ".join(f"{r['differing'] / r['of']:.4%} {r['max_ulp']} ulp ({r['max_row_ulp']:.2g} of the row) "
                     f"{r['verdict']}" for r in rows)


def with_impl(impl: str, fn, *args):
    with _precision.using(impl):
        return fn(*args)


def regions(shape, tokens: int, device):
    """name -> (inputs, reference fn, aligned fn, stock fn): all return tuples of forward outputs."""
    _, hidden, heads, kv_heads, head_dim, inter = shape
    gen = torch.Generator().manual_seed(0)

    def randn(*s, scale=1.0):
        return (scale * torch.randn(*s, generator=gen)).to(device=device, dtype=BF16)

    half = tokens // 2  # packed sequences restarting at 0, then far positions
    pos = torch.cat([torch.arange(half), torch.randint(0, MAX_POS, (tokens - half,), generator=gen)]).to(device)
    cache = ops.rope_cos_sin_cache(head_dim, THETA, MAX_POS, BF16).to(device)
    c, s = cache[pos].chunk(2, dim=-1)
    cos, sin = torch.cat((c, c), -1)[None], torch.cat((s, s), -1)[None]  # HF layout (1, T, D)
    def engine_rope(pos, x, cache):  # (T, H, D): vLLM's rotation, one tensor
        c, s = cache.index_select(0, pos).chunk(2, dim=-1)
        return ops.apply_rotary_emb(x, c, s)

    def engine_qk_norm_rope(pos, x, w, eps, cache):
        return engine_rope(pos, ops.qk_norm(x.flatten(-2), w, eps, x.shape[-1]).view(x.shape), cache)

    ref = {"apply_rope": compile_piece(engine_rope, (0, 1)), "qk_norm_rope": compile_piece(engine_qk_norm_rope, (0, 1)),
           "silu_and_mul": compile_piece(ops.silu_and_mul, (0,)),
           "fused_add_rms_norm": compile_piece(ops.fused_add_rms_norm, (0, 1)), "rms_norm": compile_piece(ops.rms_norm, (0,))}
    q, xq = randn(tokens, heads, head_dim), randn(tokens, heads, head_dim, scale=3.0)
    wq = randn(head_dim, scale=0.3) + 1
    gate, up = randn(tokens, inter, scale=2.0), randn(tokens, inter)
    x, res, w = randn(tokens, hidden), randn(tokens, hidden, scale=4.0), randn(hidden, scale=0.3) + 1
    c3, s3 = cos[:, :, None], sin[:, :, None]

    def hf_rope(q):  # (T, H, D) -> HF's (1, H, T, D) and back
        return stock_rope(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)[0][0].transpose(0, 1)

    return {
        "rope": ((q,), lambda q: (ref["apply_rope"](pos, q, cache),),
                 lambda q: (rope.Rope.apply(q[None], c3, s3)[0],), lambda q: (hf_rope(q),)),
        "qk_norm_rope": ((xq, wq), lambda x, w: (ref["qk_norm_rope"](pos, x, w, EPS, cache),),
                         lambda x, w: (rope.NormRope.apply(x[None], w, c3, s3, EPS)[0],),
                         lambda x, w: (hf_rope(stock_rms_norm(x, w)),)),
        "swiglu": ((gate, up), lambda g, u: (ref["silu_and_mul"](torch.cat((g, u), -1)),),
                   lambda g, u: (swiglu.swiglu(g, u),), lambda g, u: (F.silu(g) * u,)),
        "add_rmsnorm": ((x, res, w), lambda x, r, w: ref["fused_add_rms_norm"](x, r, w, EPS),
                        lambda x, r, w: (lambda out, s: (out, s.to(BF16)))(*rmsnorm.add_rms_norm(x, r, w, EPS)),
                        lambda x, r, w: (stock_rms_norm(r + x, w), r + x)),
        "rmsnorm": ((x, w), lambda x, w: (ref["rms_norm"](x, w, EPS),),
                    lambda x, w: (rmsnorm.rms_norm(x, w, EPS),), lambda x, w: (stock_rms_norm(x, w),)),
    }


def gradients(fn, inputs, seed=1):
    xs = tuple(t.detach().requires_grad_() for t in inputs)
    outs = fn(*xs)
    gen = torch.Generator().manual_seed(seed)
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs])
    return [t.grad for t in xs]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="a small shape: a dry run")
    p.add_argument("--regions", default=",".join(REGIONS), help=f"comma-separated, of {', '.join(REGIONS)}")
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/fused-check-{cpu,gpu}.json)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device visible to torch")
    wanted = args.regions.split(",")
    if bad := [r for r in wanted if r not in REGIONS]:
        p.error(f"--regions: unknown {', '.join(bad)}; allowed: {', '.join(REGIONS)}")
    device = torch.device(args.device)
    tokens = 48 if args.quick else 4096
    out = args.out or ROOT / "benchmarks" / "results" / f"fused-check-{'gpu' if device.type == 'cuda' else 'cpu'}.json"
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "tokens": tokens, "last_bit_share": LAST_BIT_SHARE, "regions": wanted,
              "inductor_deterministic": bool(torch._inductor.config.deterministic), "rows": []}
    ok = True
    start = time.perf_counter()
    for shape in QUICK if args.quick else SHAPES:
        for name, (inputs, reference, aligned, stock) in regions(shape, tokens, device).items():
            if name not in wanted:
                continue
            want = reference(*inputs)
            fused_out = with_impl("fused", aligned, *inputs)
            eager_out = with_impl("eager", aligned, *inputs)
            stock_out = stock(*inputs)
            row = {"model": shape[0], "region": name,
                   "fused_vs_engine": [compare(g, w) for g, w in zip(fused_out, want)],
                   "eager_vs_engine": [compare(g, w) for g, w in zip(eager_out, want)],
                   "stock_vs_engine": [compare(g, w) for g, w in zip(stock_out, want)],
                   "fused_vs_eager_grads": [compare(g, w) for g, w in zip(
                       with_impl("fused", gradients, aligned, inputs), with_impl("eager", gradients, aligned, inputs))]}
            row["failures"] = judge(row)
            row["passed"] = not row["failures"]
            ok &= row["passed"]
            report["rows"].append(row)
            print(f"[{time.perf_counter() - start:5.0f} s] {shape[0]} {name:13s} {'ok  ' if row['passed'] else 'FAIL'}")
            for key in ("fused_vs_engine", "eager_vs_engine", "stock_vs_engine", "fused_vs_eager_grads"):
                print(f"    {key:21s} {summary(row[key])}")
            for failure in row["failures"]:
                print(f"    FAILS: {failure}")
            out.parent.mkdir(parents=True, exist_ok=True)  # what is measured survives a timeout
            out.write_text(json.dumps({**report, "passed": ok}, indent=1))
    report["passed"] = ok
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"{'PASSED' if ok else 'FAILED'}: every aligned output at most last-bit from the compiled engine "
          f"formulation, stock at `rounding`; wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
