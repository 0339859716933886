"""Where Inductor adds a GEMM's bias on this device, in vLLM's graph: inside the GEMM, or in the next
pointwise kernel (which moves where the bias sum is rounded).

Qwen2's q/k/v projections have a bias. Why Inductor's `unfuse_bias_add_to_pointwise` should not fire in
vLLM's graph, as the `vllm` target assumes (the bias inside the GEMM, rounded once with it, as stock HF's
addmm does), read in torch 2.13's source: docs/patches.md, "Qwen2's q/k/v bias". On a GPU's own torch
this script checks it: it compiles vLLM's qkv -> split -> RoPE tail on the device and reports whether
the compiled graph still holds an addmm (bias fused) or an mm plus a bias add (unfused), for vLLM's
shape of the graph (v a graph output) and, for contrast, one where every user is pointwise.

    python benchmarks/check_epilogue.py [--device cuda] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localrl.engine import ops  # noqa: E402
from patches import engine_table  # noqa: E402
from tinyqwen.models import REAL_SHAPES  # noqa: E402


def vllm_tail(x, w, b, positions, cache, sizes, head_dim):
    """vLLM's Qwen2Attention up to the attention op: v leaves the piece unchanged."""
    qkv = F.linear(x, w, b)
    q, k, v = qkv.split(sizes, dim=-1)
    q, k = ops.rotary_emb(positions, q, k, cache, head_dim)
    return q, k, v


def pointwise_only(x, w, b, positions, cache, sizes, head_dim):
    """Every user of the GEMM pointwise (v scaled too): where the pass may fire."""
    q, k, v = vllm_tail(x, w, b, positions, cache, sizes, head_dim)
    return q, k, v * 2


def graph_ops(fn, *args) -> list[str]:
    """The aten ops of the graph Inductor lowers for `fn`, after its post-grad passes (where the
    unfusing happens), read with the rounding map's scheduler hook."""
    torch._dynamo.reset()
    with engine_table.capture() as graphs:
        torch.compile(fn, fullgraph=True)(*args)
    return [node.op for graph in graphs for node in graph.nodes]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    dims, tokens = REAL_SHAPES["qwen2.5-1.5b"], 64
    hidden, heads, kv_heads, head_dim = (dims[key] for key in ("hidden_size", "num_attention_heads",
                                                                "num_key_value_heads", "head_dim"))
    sizes = (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen).to(dev, torch.bfloat16)
    w = (0.02 * torch.randn(sum(sizes), hidden, generator=gen)).to(dev, torch.bfloat16)
    b = torch.randn(sum(sizes), generator=gen).to(dev, torch.bfloat16)
    positions = torch.arange(tokens, device=dev)
    cache = ops.rope_cos_sin_cache(head_dim, 1e6, 4096, torch.bfloat16, dev)
    result = {"device": str(dev), "torch": torch.__version__,
              "keep_addmm_fused_for_half_dtypes": getattr(torch._inductor.config, "keep_addmm_fused_for_half_dtypes", None)}
    for name, fn in (("vllm_graph", vllm_tail), ("every_user_pointwise", pointwise_only)):
        found = graph_ops(fn, x, w, b, positions, cache, sizes, head_dim)
        fused = "addmm" in found
        result[name] = {"bias": "inside the GEMM (addmm)" if fused else "separate pointwise add (mm + add)",
                        "gemm_ops": sorted(set(op for op in found if op.endswith("mm")))}
        print(f"{name}: bias {result[name]['bias']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    # the `vllm` target assumes the bias stays inside the GEMM in vLLM's graph
    return 0 if result["vllm_graph"]["bias"].startswith("inside") else 1


if __name__ == "__main__":
    sys.exit(main())
