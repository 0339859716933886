"""The torch study's measurement, in one torch release: which values vLLM's native formulas (RMSNorm, fused
add + RMSNorm, RoPE, SiLU-and-mul: the local engine's ops, vLLM's lines verbatim) store as BF16 when Inductor
compiles them on this CPU, and whether the compiled kernel rounds the values it keeps inside.

Two contexts, since Inductor's realize heuristics depend on the graph:
  alone  each formula compiled by itself (BF16 inputs; the fused add + RMSNorm also twice in a row, as a
         layer chains its residual); the value it keeps inside its kernel is also run, and the output
         compared bit for bit with the formula rounded at that value and not rounded there - a kept
         fp32 -> bf16 -> fp32 cast rounds inside the kernel, where no store shows it;
  layer  the formulas as they sit in the local engine's pieces (a Qwen3 model of the tiny shape, its
         decoder layers as vLLM's GPU graph splits them), read with the stores only.

The reader is `patches.engine_table` (the hook `target="auto"` uses). Imports torch, transformers and the
repository only, so that it runs in the study's small per-release environments (env.py).

    python -m studies run torch_releases --json results/studies/torch_releases/data/maps/installed.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import transformers

from localrl import EngineModel, fused_add_rms_norm, rms_norm, rope_cos_sin_cache, rotary_emb, silu_and_mul
from patches.engine_table import capture, rounding_map, stores
from patches.targets import TARGETS
from tinyqwen.models import REAL_SHAPES, real_shape_config

EPS = 1e-6
TOKENS, HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE = 16, 256, 4, 64, 768
CONTEXTS = ("alone", "layer")


# Each formula called as the engine's pieces call it: the reader names a norm's values by the calling line
# (which norm: `input_layernorm`, `post_attention_layernorm`), so the weights keep the engine's names.
def input_norm(h, input_layernorm):
    return rms_norm(h, input_layernorm, EPS)


def add_norm(h, residual, post_attention_layernorm):
    return fused_add_rms_norm(h, residual, post_attention_layernorm, EPS)


def add_norms(h, residual, h2, post_attention_layernorm, input_layernorm):
    """Two fused add + norms in a row, as a layer has them: the first one's residual, cast to BF16 on vLLM's
    line, is what the second one adds to (residual.post_attention)."""
    _, residual = fused_add_rms_norm(h, residual, post_attention_layernorm, EPS)
    return fused_add_rms_norm(h2, residual, input_layernorm, EPS)


def rope(positions, q, k, cos_sin_cache):
    return rotary_emb(positions, q, k, cos_sin_cache, HEAD_DIM)


def swiglu(gate_up):
    return silu_and_mul(gate_up)


def _grid(*shape, generator) -> torch.Tensor:
    """BF16 multiples of 1/8 in [-2, 2): squares and their sums are exact in FP32 in any order, so a norm's
    variance does not depend on Inductor's reduction order and the comparison below can be exact."""
    return (torch.randint(-16, 16, shape, generator=generator).float() / 8).to(torch.bfloat16)


def _inputs(seed: int = 0) -> dict[str, tuple]:
    g = torch.Generator().manual_seed(seed)
    weight = (1 + torch.randn(HIDDEN, generator=g) / 4).to(torch.bfloat16)  # any BF16 weight
    q, k = torch.randn(TOKENS, HEADS * HEAD_DIM, generator=g), torch.randn(TOKENS, HEADS * HEAD_DIM, generator=g)
    return {
        "rms_norm": (_grid(TOKENS, HIDDEN, generator=g), weight),
        "fused_add_rms_norm": (_grid(TOKENS, HIDDEN, generator=g), _grid(TOKENS, HIDDEN, generator=g), weight),
        # the first sum needs more bits than BF16 holds (so that rounding it shows): residual in steps of 2^-7
        "fused_add_rms_norm_chained": (_grid(TOKENS, HIDDEN, generator=g),
                                       (torch.randint(-256, 256, (TOKENS, HIDDEN), generator=g).float() / 128).to(
                                           torch.bfloat16), _grid(TOKENS, HIDDEN, generator=g), weight, weight),
        "rotary_emb": (torch.randperm(512, generator=g)[:TOKENS], q.to(torch.bfloat16), k.to(torch.bfloat16),
                       rope_cos_sin_cache(HEAD_DIM, 1e6, 512, torch.bfloat16)),
        "silu_and_mul": ((torch.randn(TOKENS, 2 * INTERMEDIATE, generator=g) * 2).to(torch.bfloat16),),
    }


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def _norm_refs(x32, weight):
    """(rounded, kept): `x.to(weight.dtype) * weight` with the normalized value rounded to BF16 (the line as
    eager runs it) and kept in FP32 (the cast elided); one rounding of the product either way."""
    r = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (_bf16(r) * weight.float()).to(torch.bfloat16), (r * weight.float()).to(torch.bfloat16)


def _residual_refs(h, residual, h2, *_):
    """(rounded, kept) of the second residual `h2 + residual'`: the first sum rounded to BF16 (its cast on
    vLLM's line) or kept in FP32; one elementwise sum, no reduction."""
    first = h.float() + residual.float()
    return (h2.float() + _bf16(first)).to(torch.bfloat16), (h2.float() + first).to(torch.bfloat16)


def _rope_refs(positions, q, k, cache):
    """(rounded, kept) of the rotated q and k: the four products rounded to BF16 before the sums, or not
    (a BF16 x BF16 product is exact in FP32: one rounding, of the sum, either way)."""
    cos, sin = (c.float()[:, None, :] for c in cache.index_select(0, positions).chunk(2, dim=-1))
    out = {}
    for name, r in (("rounded", _bf16), ("kept", lambda t: t)):
        rotated = []
        for x in (q, k):
            x1, x2 = x.float().view(TOKENS, -1, HEAD_DIM).chunk(2, dim=-1)
            o1 = _bf16(r(x1 * cos) - r(x2 * sin))
            o2 = _bf16(r(x2 * cos) + r(x1 * sin))
            rotated.append(torch.cat((o1, o2), dim=-1).reshape(TOKENS, -1).to(torch.bfloat16))
        out[name] = tuple(rotated)
    return out["rounded"], out["kept"]


def _silu_refs(gate_up):
    """(rounded, kept): silu(gate) rounded to BF16 before `* up` (eager), or kept in FP32."""
    d = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :d].float(), gate_up[..., d:].float()
    silu = torch.nn.functional.silu(gate)
    return (_bf16(silu) * up).to(torch.bfloat16), (silu * up).to(torch.bfloat16)


# formula -> (the function compiled, the value kept inside its kernel whose rounding the outputs show,
# the two references, which outputs show it)
FORMULAS = {
    "rms_norm": (input_norm, "rmsnorm.normalized", lambda x, w: _norm_refs(x.float(), w), lambda out: (out,)),
    "fused_add_rms_norm": (add_norm, "rmsnorm.normalized",
                           lambda h, r, w: _norm_refs(h.float() + r.float(), w), lambda out: (out[0],)),
    "fused_add_rms_norm_chained": (add_norms, "residual.post_attention", _residual_refs, lambda out: (out[1],)),
    "rotary_emb": (rope, "rope.product", _rope_refs, lambda out: out),
    "silu_and_mul": (swiglu, "swiglu.silu", _silu_refs, lambda out: (out,)),
}


def _mismatches(got: tuple, want) -> int:
    want = want if isinstance(want, tuple) else (want,)
    return sum(int((a.view(torch.int16) != b.view(torch.int16)).sum()) for a, b in zip(got, want, strict=True))


def alone(formulas=tuple(FORMULAS), seed: int = 0) -> list[dict]:
    """Each formula compiled by itself: its values as the hook reads them, and, for the value it keeps
    inside its kernel, whether the kernel rounds it (exact comparison with both references)."""
    rows, inputs = [], _inputs(seed)
    for formula in formulas:
        fn, inside, refs, shown = FORMULAS[formula]
        torch._dynamo.reset()
        with capture() as graphs:
            out = torch.compile(fn, fullgraph=True, dynamic=False)(*inputs[formula])
        rounded, kept = refs(*inputs[formula])
        got = shown(out)
        off = {"rounded": _mismatches(got, rounded), "kept": _mismatches(got, kept)}
        counts = rounding_map(graphs)
        found = stores(counts)
        if inside not in found:  # the graph computes no node for it (a round trip removed before lowering)
            found[inside] = False
        for value, stored in found.items():
            row = {"context": "alone", "formula": formula, "value": value, "stored_bf16": stored,
                   "in_graph": value in counts, "counts": dict(counts.get(value, {}))}
            if value == inside:
                # None: neither reference equals the kernel's output bit for bit (the counts say how close)
                row.update(rounded_in_kernel=True if off["rounded"] == 0 else False if off["kept"] == 0 else None,
                           mismatches=off, elements=sum(t.numel() for t in got))
            rows.append(row)
    return rows


def layer(layers: int = 2) -> list[dict]:
    """The local engine's pieces (Qwen3, tiny widths, `layers` decoder layers; zero weights: where Inductor
    stores depends on shapes, not values), read with the stores only: one row per value, per graph."""
    torch._dynamo.reset()
    config = real_shape_config("qwen3", "tiny", layers=layers)
    with torch.device("meta"):
        shapes = transformers.AutoModelForCausalLM.from_config(config).state_dict()
    weights = {name: torch.zeros(t.shape, dtype=torch.bfloat16) for name, t in shapes.items()}
    with capture() as graphs:
        engine = EngineModel(config, max_positions=32, device="cpu")
        engine.load_hf_weights(weights)
        engine(torch.randint(0, config.vocab_size, (1, TOKENS)), torch.arange(TOKENS)[None])
    counts = rounding_map(graphs)
    return [{"context": "layer", "formula": "decoder layer", "value": value, "stored_bf16": stored,
             "in_graph": True, "counts": dict(counts[value])} for value, stored in stores(counts).items()]


# The target each context is judged against: the local engine's pieces are vLLM's GPU split (`vllm`; its
# one difference from `vllm-cpu`, the residual between layers, is the split's, not torch's); the values a
# formula keeps inside its kernel are the same in every target.
JUDGED_AGAINST = {"alone": "vllm", "layer": "vllm"}


def judged(rows: list[dict]) -> list[dict]:
    """Each row with what the targets say and whether it agrees with its context's target: in a layer, where
    the graph stores the value as the target does; alone, only the value kept inside the kernel is judged (a
    formula's outputs are its graph's outputs, stored by construction), by the stores and the kernel's
    rounding both."""
    for row in rows:
        row["targets"] = {name: t.stores[row["value"]] for name, t in TARGETS.items()}
        row["judged_against"] = JUDGED_AGAINST[row["context"]]
        if row["context"] == "alone" and "rounded_in_kernel" not in row:
            row["agrees"] = None
            continue
        found = row["stored_bf16"] or bool(row.get("rounded_in_kernel"))
        row["agrees"] = found == row["targets"][row["judged_against"]]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run torch_releases",
                                description="Which values vLLM's native formulas store as BF16 under this torch.")
    p.add_argument("--contexts", nargs="+", choices=CONTEXTS, default=list(CONTEXTS),
                   help="alone: each formula compiled by itself; layer: the local engine's pieces")
    p.add_argument("--formulas", nargs="+", choices=tuple(FORMULAS), default=list(FORMULAS),
                   help="the formulas compiled alone (default: all of them)")
    p.add_argument("--layers", type=int, default=2, help=f"decoder layers of the layer context (1.."
                   f"{REAL_SHAPES['tiny']['num_hidden_layers']}; two hold every value: a middle piece's residual "
                   "is a layer's output)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    try:
        real_shape_config("qwen3", "tiny", layers=args.layers)  # refuses a depth the shape does not have
    except ValueError as err:
        p.error(f"--layers {args.layers}: {err}")
    rows = judged((alone(args.formulas) if "alone" in args.contexts else []) + (layer(args.layers) if "layer" in args.contexts
                                                                    else []))
    release = torch.__version__
    print(f"torch {release}, transformers {transformers.__version__} (cpu)")
    for r in rows:
        kernel = "" if "rounded_in_kernel" not in r else (
            f"  rounded in kernel: {r['rounded_in_kernel']} (mismatches {r['mismatches']} of {r['elements']})")
        node = "" if r["in_graph"] else " (no node computes it)"
        print(f"  {r['context']:5s} {r['formula']:26s} {r['value']:24s} stored {str(r['stored_bf16']):5s}{node}"
              f"{kernel}  agrees with {r['judged_against']!r}: {r['agrees']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": release, "transformers": transformers.__version__, "python": sys.version.split()[0],
                       "device": "cpu", "layers": args.layers if "layer" in args.contexts else None,
                       "rows": rows}, f, indent=1)
    return 0
