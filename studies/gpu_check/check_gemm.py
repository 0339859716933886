"""Whether this device's BF16 GEMM gives a row the same bits whatever the number of rows beside it, and
whether the engine's merged projections give the bits of transformers' separate ones.

- rows: one input row's product (row 0, the same values in every call) with 1 row (a decode step of one
  sequence) up to a prefill's thousands of rows, each against the 1-row product, bit for bit. The engine
  samples with GEMMs of a few rows and scores with GEMMs of all of them: a GEMM whose bits move with the
  row count gives the sampling and the prefill logprobs of one model different values.
- merged: the engine's merged q/k/v (with Qwen2's bias) and gate/up weights, as vLLM loads them, against
  the separate projections transformers computes, each output's slice bit for bit, at a decode and a
  prefill row count.
Each at the paper shapes (R1-Distill-Qwen-1.5B, Qwen3-8B; random weights), with cuBLAS's reduced-precision
BF16 reduction allowed and not (on a CPU the flag does nothing: one pass, named).

    python3 -m studies.gpu_check.check_gemm --device cuda --out gemm.json
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from studies.gpu_check.check_common import MODELS, Report, bit_compare, step_args
from studies._shared.shapes import PAPER_SHAPES, Shape, qwen_shape

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
QUICK_SHAPES = {"tiny-qwen2": qwen_shape("qwen2", 256, 2, 512)}
QUICK_ROWS = (1, 2, 8, 32, 128)
DECODE_ROWS = 8  # the engine's sampling batch


def randn(*size: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """BF16 normal values drawn on the generator's device (an 8B output layer drawn on a CPU takes seconds)."""
    return (scale * torch.randn(*size, generator=gen, device=gen.device)).to(torch.bfloat16)


def weights(shape: Shape, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A layer's projections and the output layer, random (std 0.02, HF's init), BF16, as (out, in)."""
    def w(rows: int, cols: int) -> torch.Tensor:
        return randn(rows, cols, gen=gen, scale=0.02)

    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return {"q_proj": w(q, shape.hidden), "k_proj": w(kv, shape.hidden), "v_proj": w(kv, shape.hidden),
            "o_proj": w(shape.hidden, q), "gate_proj": w(shape.intermediate, shape.hidden),
            "up_proj": w(shape.intermediate, shape.hidden), "down_proj": w(shape.hidden, shape.intermediate),
            "lm_head": w(shape.vocab, shape.hidden)}


def row_invariance(name: str, projections: dict[str, torch.Tensor], rows: tuple[int, ...], flag: str,
                   gen: torch.Generator) -> list[dict]:
    """Per projection and row count: row 0's product against its 1-row product."""
    out = []
    for proj, w in projections.items():
        x = randn(max(rows), w.shape[1], gen=gen)
        alone = F.linear(x[:1], w)
        for m in rows:
            out.append({"model": name, "reduced_precision": flag, "projection": proj, "out": w.shape[0],
                        "in": w.shape[1], "rows": m, **bit_compare(F.linear(x[:m], w)[:1], alone)})
    return out


def merged_vs_separate(name: str, shape: Shape, w: dict[str, torch.Tensor], rows: tuple[int, ...], flag: str,
                       gen: torch.Generator) -> list[dict]:
    """The engine's merged q/k/v (+ bias for Qwen2) and gate/up GEMMs against the separate ones, per output."""
    groups = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}
    bias = {p: randn(w[p].shape[0], gen=gen, scale=0.5) for p in groups["qkv"]} if shape.arch == "qwen2" else {}
    out = []
    for m in rows:
        x = randn(m, shape.hidden, gen=gen)
        for group, parts in groups.items():
            b = [bias.get(p) for p in parts]
            merged = F.linear(x, torch.cat([w[p] for p in parts]), torch.cat(b) if b[0] is not None else None)
            pieces = merged.split([w[p].shape[0] for p in parts], dim=-1)
            for p, bp, piece in zip(parts, b, pieces):
                out.append({"model": name, "reduced_precision": flag, "group": group, "projection": p,
                            "bias": bp is not None, "rows": m, **bit_compare(piece, F.linear(x, w[p], bp))})
    return out


def main(argv=None) -> int:
    args, device = step_args(__doc__, argv)
    shapes = QUICK_SHAPES if args.quick else {n: PAPER_SHAPES[n] for n in MODELS}
    rows = QUICK_ROWS if args.quick else ROWS
    report = Report(args, "gemm", device, ("row_invariance", "merged_vs_separate"), row_counts=list(rows),
                    decode_rows=DECODE_ROWS,
                    gemm="torch.nn.functional.linear on BF16 tensors (cuBLAS on a GPU, oneDNN/ATen on a CPU)")
    matmul = torch.backends.cuda.matmul
    default = matmul.allow_bf16_reduced_precision_reduction
    # (name, value of allow_bf16_reduced_precision_reduction) to run under; on a CPU only the default
    flags = [("allowed", True), ("not allowed", False)] if device.type == "cuda" else [("not applicable (CPU)", None)]
    for name, shape in shapes.items():
        gen = torch.Generator(device).manual_seed(0)
        w = weights(shape, gen)
        for flag, value in flags:
            if value is not None:
                matmul.allow_bf16_reduced_precision_reduction = value
            try:
                invariance = row_invariance(name, w, rows, flag, gen)
                report.parts["merged_vs_separate"] += merged_vs_separate(name, shape, w, (DECODE_ROWS, max(rows)),
                                                                         flag, gen)
                report.extend("row_invariance", invariance)
                for proj in ("q_proj", "gate_proj", "down_proj", "lm_head"):
                    moved = [r["rows"] for r in invariance if r["projection"] == proj and not r["bit_equal"]]
                    found = f"differs from {min(moved)} rows" if moved else "bit-equal at every row count"
                    print(f"{name} {proj} (reduced precision {flag}): {found}", flush=True)
            finally:
                matmul.allow_bf16_reduced_precision_reduction = default
        del w
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
