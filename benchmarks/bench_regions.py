"""Time and activation memory of the aligned regions: stock HF eager vs aligned-eager vs aligned-fused
(and Liger's Triton kernels where installed), per region and for a whole Qwen2 / Qwen3 decoder layer; and
of a trainable attention that rounds where vLLM-CPU's AMX kernel does, against SDPA (`attention_case`).

Per case: forward+backward time (torch.utils.benchmark, blocked_autorange; compiled paths warmed up
first; --repeats rounds that each time every implementation in turn, the median reported, and the
ratio to stock as the median of per-round ratios, so that drift in machine speed cancels), bytes autograd saves for backward (distinct storages, weights
excluded), and on CUDA the max_memory_allocated peak and the memory still held after the forward,
both as deltas over the inputs. Memory-bound cases also get an effective bandwidth (interface bytes
/ time) against a measured device copy. Writes JSON (its tables: the kernels page, the GPU check's summary).

    .venv/bin/python benchmarks/bench_regions.py                      # CPU, reduced shape
    python3 benchmarks/bench_regions.py --device cuda                 # Qwen2.5-7B and Qwen3-8B shapes
    .venv/bin/python benchmarks/bench_regions.py --quick              # seconds: a smoke run

Shapes: GPU_SHAPES (Qwen2.5-7B's and Qwen3-8B's) and CPU_SHAPES below; on the CPU the decoder layer's
GEMMs and attention run through localrl's fp32-compute kernels (bf16 in, bf16 out, as a GPU GEMM rounds),
as the rig runs them (localrl/kernels.py says why fp32). The stock region formulas below are transformers'
Qwen2/Qwen3 code written out (tests/test_bench_regions.py checks them against transformers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rla.machine import describe  # noqa: E402

import patches  # noqa: E402
from patches import rmsnorm, rope, stream, swiglu  # noqa: E402
from benchmarks.stock import stock_rms_norm  # noqa: E402,F401
from localrl import kernels  # noqa: E402
from localrl.amx_attention import amx_rounding_attention  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402
from tinyqwen.models import REAL_SHAPES  # noqa: E402

BF16 = torch.bfloat16
EPS = 1e-6
THETA = 1e6


@dataclass(frozen=True)
class Shape:
    model: str
    arch: str  # qwen2: plain RoPE; qwen3: per-head q/k RMSNorm fused into RoPE
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    tokens: int
    layer_tokens: int


def real_shape(model: str, arch: str, real: str, tokens: int, layer_tokens: int) -> Shape:
    """`model`'s row label at the widths of tinyqwen.models.REAL_SHAPES[`real`]."""
    dims = REAL_SHAPES[real]
    return Shape(model, arch, dims["hidden_size"], dims["num_attention_heads"], dims["num_key_value_heads"],
                 dims["head_dim"], dims["intermediate_size"], tokens, layer_tokens)


GPU_SHAPES = [real_shape("qwen2.5-7b", "qwen2", "qwen2.5-math-7b", 8192, 8192),
              real_shape("qwen3-8b", "qwen3", "qwen3-8b", 8192, 8192)]
CPU_SHAPES = [real_shape("reduced", arch, "qwen2.5-1.5b", 4096, 1024) for arch in ("qwen2", "qwen3")]
QUICK_SHAPES = [Shape("quick", "qwen2", 256, 4, 2, 64, 512, 64, 64),
                Shape("quick", "qwen3", 256, 4, 2, 64, 512, 64, 64)]
IMPLS = ("stock", "aligned-eager", "aligned-fused", "liger", "rounded-once", "amx-rounding")
OPTIONAL_IMPLS = ("liger",)  # another project's kernels: a failure there is a note, not a lost table

# ---------------------------------------------------------------------------------------------
# Stock HF formulas: transformers' own RoPE, its RMSNorm written out (tests/numerics.py)

stock_rope = modeling_qwen2.apply_rotary_pos_emb


# ---------------------------------------------------------------------------------------------
# Cases: inputs, which of them get gradients, and one function per implementation


@dataclass
class Case:
    name: str
    shape: Shape
    inputs: tuple[Tensor, ...]
    grad_inputs: tuple[int, ...]
    impls: dict[str, Callable[..., tuple[Tensor, ...]]]
    memory_bound: bool = True
    module: torch.nn.Module | None = None  # a decoder layer: its parameters get gradients too
    notes: list[str] = field(default_factory=list)


def _randn(*shape, device, scale=1.0, gen):
    return (scale * torch.randn(*shape, generator=gen, device="cpu")).to(device=device, dtype=BF16)


def _cos_sin(tokens: int, head_dim: int, device) -> tuple[Tensor, Tensor]:
    """(1, T, D) bf16 tables, HF layout (duplicated halves), packed-sequence positions."""
    inv_freq = 1.0 / (THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    pos = torch.arange(tokens) % 2048
    freqs = pos[:, None].float() * inv_freq
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos()[None].to(device, BF16), emb.sin()[None].to(device, BF16)


def _liger():
    try:  # Liger's Triton kernels: optional, compared only where installed
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError:
        return None
    return LigerRMSNormFunction, LigerRopeFunction, LigerSiLUMulFunction


def region_cases(shape: Shape, device) -> list[Case]:
    gen = torch.Generator().manual_seed(0)
    t, d = shape.tokens, shape.head_dim
    cos, sin = _cos_sin(t, d, device)
    liger = _liger() if device.type == "cuda" else None
    cases = []

    if shape.arch == "qwen2":
        q = _randn(1, shape.heads, t, d, device=device, gen=gen)
        k = _randn(1, shape.kv_heads, t, d, device=device, gen=gen)
        c4, s4 = cos[:, None], sin[:, None]
        impls = {"stock": lambda q, k, cos, sin: stock_rope(q, k, cos, sin),
                 "aligned": lambda q, k, cos, sin: (rope.Rope.apply(q, c4, s4), rope.Rope.apply(k, c4, s4))}
        if liger:
            impls["liger"] = lambda q, k, cos, sin: liger[1].apply(q, k, cos, sin)
        cases.append(Case("rope", shape, (q, k, cos, sin), (0, 1), impls))
    else:
        xq = _randn(1, t, shape.heads, d, device=device, scale=3.0, gen=gen)
        xk = _randn(1, t, shape.kv_heads, d, device=device, scale=3.0, gen=gen)
        wq, wk = (_randn(d, device=device, scale=0.3, gen=gen) + 1 for _ in range(2))
        c3, s3 = cos[:, :, None], sin[:, :, None]

        def stock(xq, xk, wq, wk, cos, sin):  # Qwen3Attention: norm, transpose to (B, H, T, D), rope
            q, k = stock_rms_norm(xq, wq).transpose(1, 2), stock_rms_norm(xk, wk).transpose(1, 2)
            return stock_rope(q, k, cos, sin)

        impls = {"stock": stock,
                 "aligned": lambda xq, xk, wq, wk, cos, sin: (
                     rope.NormRope.apply(xq, wq, c3, s3, EPS).transpose(1, 2),
                     rope.NormRope.apply(xk, wk, c3, s3, EPS).transpose(1, 2))}
        if liger:
            def liger_qk(xq, xk, wq, wk, cos, sin):
                q = liger[0].apply(xq, wq, EPS).transpose(1, 2)
                k = liger[0].apply(xk, wk, EPS).transpose(1, 2)
                return liger[1].apply(q, k, cos, sin)
            impls["liger"] = liger_qk
        cases.append(Case("qk_norm_rope", shape, (xq, xk, wq, wk, cos, sin), (0, 1, 2, 3), impls))

    gate = _randn(t, shape.inter, device=device, scale=2.0, gen=gen)
    up = _randn(t, shape.inter, device=device, gen=gen)
    impls = {"stock": lambda g, u: (F.silu(g) * u,), "aligned": lambda g, u: (swiglu.swiglu(g, u),)}
    if liger:
        impls["liger"] = lambda g, u: (liger[2].apply(g, u),)
    cases.append(Case("swiglu", shape, (gate, up), (0, 1), impls))

    x = _randn(t, shape.hidden, device=device, gen=gen)
    res = _randn(t, shape.hidden, device=device, scale=4.0, gen=gen)
    w = _randn(shape.hidden, device=device, scale=0.3, gen=gen) + 1

    def stock_add(x, r, w):
        s = r + x
        return stock_rms_norm(s, w), s

    impls = {"stock": stock_add, "aligned": lambda x, r, w: rmsnorm.add_rms_norm(x, r, w, EPS)}
    if liger:
        impls["liger"] = lambda x, r, w: ((lambda s: (liger[0].apply(s, w, EPS), s))(r + x))
    cases.append(Case("add_rmsnorm", shape, (x, res, w), (0, 1, 2), impls))

    impls = {"stock": lambda x, w: (stock_rms_norm(x, w),), "aligned": lambda x, w: (rmsnorm.rms_norm(x, w, EPS),)}
    if liger:
        impls["liger"] = lambda x, w: (liger[0].apply(x, w, EPS),)
    cases.append(Case("rmsnorm", shape, (x, w), (0, 1), impls))
    for case in cases:  # one aligned function, run by both implementations
        case.impls["aligned-eager"] = case.impls["aligned-fused"] = case.impls.pop("aligned")
    return cases


def layer_case(shape: Shape, device) -> Case:
    """One decoder layer in the steady state of a stack: stock gets a plain hidden state, aligned the
    FP32 stream from the previous aligned layer (bit-cast, patches/stream.py), and each returns what it
    returns."""
    config = (Qwen2Config if shape.arch == "qwen2" else Qwen3Config)(
        vocab_size=256, hidden_size=shape.hidden, intermediate_size=shape.inter, num_hidden_layers=1,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        max_position_embeddings=32768, rope_theta=THETA, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config).to(BF16)
    notes = []
    if device.type == "cpu":
        kernels.use_local_kernels(model)
        notes.append("CPU: GEMMs and attention through localrl.kernels (fp32 compute, bf16 in/out)")
    layer, rotary = model.model.layers[0], model.model.rotary_emb
    rotary.inv_freq = rotary.inv_freq.float()  # FSDP mixed precision keeps buffers in fp32
    gen = torch.Generator().manual_seed(1)
    residual = _randn(1, shape.layer_tokens, shape.hidden, device=device, scale=4.0, gen=gen)
    pending = _randn(1, shape.layer_tokens, shape.hidden, device=device, gen=gen)
    positions = torch.arange(shape.layer_tokens, device=device)[None]

    def run(hidden, pair):
        aligned = bool(patches.active())
        x = pair if aligned else hidden
        cos_sin = rotary(x, positions)  # once per model forward, here per call: small next to a layer
        return (layer(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin),)

    hidden = residual + pending
    pair = stream.pack(residual.float() + pending.float(), BF16)
    impls = {name: run for name in ("stock", "aligned-eager", "aligned-fused")}
    return Case("decoder_layer", shape, (hidden, pair), (0, 1), impls, memory_bound=False, module=layer, notes=notes)


def attention_case(shape: Shape, device) -> Case:
    """Causal attention over a decoder layer's tokens, as three training sides would compute it: `stock`,
    torch's SDPA on the BF16 values (transformers' `sdpa`); `rounded-once`, the rig's FP32 attention rounded
    once (localrl/kernels.py); `amx-rounding`, the attention that rounds where vLLM-CPU's AMX kernel does
    (localrl/amx_attention.py), in torch ops that materialise the scores."""
    gen = torch.Generator().manual_seed(3)
    tokens, scale = shape.layer_tokens, shape.head_dim ** -0.5
    q = _randn(1, shape.heads, tokens, shape.head_dim, device=device, gen=gen)
    k, v = (_randn(1, shape.kv_heads, tokens, shape.head_dim, device=device, gen=gen) for _ in range(2))
    impls = {"stock": lambda q, k, v: (F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                                      enable_gqa=True),),
             "rounded-once": lambda q, k, v: (kernels.attention(q, k, v, None, True, scale),),
             "amx-rounding": lambda q, k, v: (amx_rounding_attention(q, k, v, None, scale),)}
    return Case("attention", shape, (q, k, v), (0, 1, 2), impls, memory_bound=False)


# ---------------------------------------------------------------------------------------------
# Measuring


def select(impl: str) -> None:
    """Set the patch state an implementation runs under (regions call the Functions directly)."""
    if impl == "stock":
        patches.remove()
    elif impl in ("aligned-eager", "aligned-fused"):
        patches.apply("all", impl=impl.removeprefix("aligned-"))


def leaves(case: Case, impl: str) -> tuple[Tensor, ...]:
    out = []
    for i, t in enumerate(case.inputs):
        wanted = i in case.grad_inputs and (case.module is None or (i == 1) == impl.startswith("aligned"))
        out.append(t.detach().requires_grad_(wanted))
    return tuple(out)


def saved_bytes(fn: Callable, inputs, exclude: set[int]) -> int:
    """Bytes of distinct storages autograd saves for backward in one forward (weights excluded)."""
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in exclude:
            seen[(ptr, t.dtype)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def prepare(case: Case, impl: str, args, device) -> tuple[Callable[[], None], dict]:
    """A forward+backward step of `impl` (warmed up: fused kernels compiled) and its untimed facts."""
    select(impl)
    fn = case.impls[impl]
    params = list(case.module.parameters()) if case.module is not None else []
    exclude = {p.untyped_storage().data_ptr() for p in params}
    inputs = leaves(case, impl)
    gen = torch.Generator().manual_seed(2)
    upstream = [torch.randn(o.shape, generator=gen).to(device=device, dtype=o.dtype) for o in fn(*inputs)]

    def step():
        for p in params:
            p.grad = None
        xs = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
        torch.autograd.backward(fn(*xs), upstream)

    for _ in range(args.warmup):  # compiles the fused kernels (first call) and settles allocators
        step()
    row = {"model": case.shape.model, "arch": case.shape.arch, "case": case.name, "impl": impl,
           "saved_bytes": saved_bytes(fn, inputs, exclude)}
    if device.type == "cuda":
        row.update(cuda_memory(fn, inputs, upstream, params))
    if case.memory_bound:
        used = [t for t in inputs if t.requires_grad]
        # interface bytes: inputs read by the forward and again by the backward, outputs written,
        # upstream gradients read, input gradients written - a lower bound on the traffic
        row["interface_bytes"] = 2 * nbytes(inputs) + 2 * nbytes(upstream) + nbytes(used)
    select("stock")
    return step, row


def time_interleaved(steps: dict[str, Callable[[], None]], args) -> dict[str, list[float]]:
    """ms per step, --repeats rounds; each round times every implementation once, in turn, so that
    drift in the machine's speed (other tenants, clocks) falls on all of them alike."""
    runs = {impl: [] for impl in steps}
    for _ in range(args.repeats):
        for impl, step in steps.items():
            select(impl)
            timer = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
            runs[impl].append(timer.blocked_autorange(min_run_time=args.min_run_time).median * 1e3)
    select("stock")
    return runs


def measure(case: Case, impls: list[str], args, device) -> tuple[list[dict], list[str]]:
    """One row per implementation of `case`, and a note for Liger's if it failed to run (left out).
    The suite's own implementations never fail quietly: an error there (a fused kernel past its
    recompile limit, say) stops the benchmark rather than leave a table without its row."""
    steps, rows, failures = {}, {}, []
    for impl in impls:
        try:
            steps[impl], rows[impl] = prepare(case, impl, args, device)
        except Exception as err:
            if impl not in OPTIONAL_IMPLS:
                raise
            failures.append(f"{impl}: failed: {type(err).__name__}: {err}")
    for impl, runs in time_interleaved(steps, args).items():
        row = rows[impl]
        row["time_ms"], row["time_ms_runs"] = statistics.median(runs), runs
        if device.type == "cuda":
            select(impl)
            row.update(device_time(steps[impl]))
            select("stock")
        if "interface_bytes" in row:
            row["GBps"] = row["interface_bytes"] / (row["time_ms"] * 1e-3) / 1e9
    return list(rows.values()), failures


def device_time(step: Callable[[], None], steps: int = 5) -> dict:
    """Per step, the GPU's busy time (kernels, copies and fills, from torch.profiler) and how many of them
    ran. Beside the wall-clock time it says whether a case waits on the GPU or on the host launching it: a
    region whose device time is a small part of its wall time is bound by launches and Python, not memory."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    on_device = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    if not on_device:
        return {"device_note": "the profiler saw no device activity"}
    busy_us = sum(e.time_range.elapsed_us() for e in on_device)
    return {"device_ms": busy_us / steps / 1e3, "device_ops": len(on_device) / steps}


def cuda_memory(fn, inputs, upstream, params) -> dict:
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    xs = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
    outs = fn(*xs)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    peak_forward = torch.cuda.max_memory_allocated() - base
    torch.autograd.backward(outs, upstream)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del outs
    return {"held_after_forward_bytes": held, "peak_forward_bytes": peak_forward, "peak_bytes": peak}


def copy_bandwidth(device, args) -> float:
    """GB/s of a device copy (bytes read + written), the ceiling for memory-bound kernels."""
    n = (1 << 28) if device.type == "cuda" and not args.quick else (1 << 24)
    src = torch.empty(n, dtype=BF16, device=device).normal_()
    dst = torch.empty_like(src)
    timer = benchmark.Timer(stmt="dst.copy_(src)", globals={"dst": dst, "src": src},
                            num_threads=torch.get_num_threads())
    seconds = timer.blocked_autorange(min_run_time=args.min_run_time).median
    return 2 * src.numel() * src.element_size() / seconds / 1e9


# ---------------------------------------------------------------------------------------------
# Report


def ratios(rows: list[dict]) -> None:
    stock = {(r["model"], r["arch"], r["case"]): r for r in rows if r["impl"] == "stock"}
    for r in rows:
        base = stock.get((r["model"], r["arch"], r["case"]))
        if base is None:
            continue
        # paired: the median over rounds of this round's time over stock's in the same round
        r["time_x_stock_runs"] = [t / b for t, b in zip(r["time_ms_runs"], base["time_ms_runs"])]
        r["time_x_stock"] = statistics.median(r["time_x_stock_runs"])
        for key in ("saved_bytes", "peak_bytes", "held_after_forward_bytes"):
            if key in r and base.get(key):
                r[key.replace("_bytes", "_x_stock")] = r[key] / base[key]


def environment(device) -> dict:
    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "threads": torch.get_num_threads(), **describe(), "transformers": transformers.__version__}
    env["liger_kernel"] = _liger() is not None
    return env


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny shapes, one short repeat: a smoke run")
    p.add_argument("--out", type=Path, help="JSON path (default results/benchmarks/regions-{cpu,gpu}.json)")
    p.add_argument("--repeats", type=int, default=5, help="timer runs per case; the median is reported")
    p.add_argument("--min-run-time", type=float, default=0.5, help="seconds per timer run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cases", default="all", help="comma-separated: rope, qk_norm_rope, swiglu, add_rmsnorm, "
                   "rmsnorm, decoder_layer, attention (default all)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.min_run_time, args.warmup = 1, 0.05, 2
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device visible to torch")
    allowed = {"rope", "qk_norm_rope", "swiglu", "add_rmsnorm", "rmsnorm", "decoder_layer", "attention"}
    args.cases = allowed if args.cases == "all" else set(args.cases.split(","))
    if bad := args.cases - allowed:
        p.error(f"--cases: unknown {', '.join(sorted(bad))}; allowed: {', '.join(sorted(allowed))}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    shapes = QUICK_SHAPES if args.quick else GPU_SHAPES if device.type == "cuda" else CPU_SHAPES
    out = args.out or ROOT / "results" / "benchmarks" / f"regions-{'gpu' if device.type == 'cuda' else 'cpu'}.json"
    start = time.perf_counter()
    print(f"imports: {time.process_time():.0f} s of CPU time", file=sys.stderr)  # long work shows progress
    report = {"environment": environment(device), "shapes": [vars(s) for s in shapes],
              "settings": {"repeats": args.repeats, "min_run_time_s": args.min_run_time, "quick": args.quick}}
    print(f"[{time.perf_counter() - start:6.0f} s] environment read (liger_kernel: "
          f"{report['environment']['liger_kernel']})", file=sys.stderr)
    report |= {"copy_GBps": copy_bandwidth(device, args), "rows": [], "notes": []}
    print(f"[{time.perf_counter() - start:6.0f} s] copy bandwidth: {report['copy_GBps']:.1f} GB/s", file=sys.stderr)
    seen = set()
    for shape in shapes:
        cases = [c for c in region_cases(shape, device) if c.name in args.cases]
        if "decoder_layer" in args.cases:
            cases.append(layer_case(shape, device))
        if "attention" in args.cases:
            cases.append(attention_case(shape, device))
        for case in cases:
            key = (case.name, shape.hidden, shape.heads, shape.kv_heads, shape.inter, shape.tokens)
            if case.name in ("swiglu", "add_rmsnorm", "rmsnorm", "attention") and key in seen:
                continue  # same shape as the other architecture's: measured once
            seen.add(key)
            report["notes"] += [f"{case.name} {shape.arch}: {n}" for n in case.notes]
            rows, failures = measure(case, [i for i in IMPLS if i in case.impls], args, device)
            for failure in failures:
                report["notes"].append(f"{case.name} {shape.arch} {failure}")
                print(f"  {case.name} {failure}", file=sys.stderr)
            for row in rows:
                report["rows"].append(row)
                print(f"[{time.perf_counter() - start:6.0f} s] {shape.model}/{shape.arch} {case.name:14s} "
                      f"{row['impl']:14s} {row['time_ms']:9.3f} ms  saved {row['saved_bytes'] / 2**20:8.1f} MiB",
                      file=sys.stderr)
            out.parent.mkdir(parents=True, exist_ok=True)  # partial results survive a timeout
            ratios(report["rows"])
            out.write_text(json.dumps(report, indent=1))
    if _liger() is None:
        report["notes"].append("liger_kernel not installed: no Liger column")
    ratios(report["rows"])
    out.write_text(json.dumps(report, indent=1))
    for note in report["notes"]:
        print(f"- {note}")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
