"""Target `vllm` against the local engine at the paper models' shapes: how far the training side is
from an engine compiled as vLLM compiles on a GPU, per region setting.

Run as a script by benchmarks/gpu_check.py (setup and results: docs/studies/gpu_check.md); random weights,
both sides sharing the GEMMs and one attention kernel. Imports no vLLM, verl or orjson (the GPU image's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # run as a script by benchmarks/gpu_check.py
sys.path.insert(0, str(ROOT))

import patches  # noqa: E402
from localrl import CUDA_ATTENTION  # noqa: E402
from patches import engine_table  # noqa: E402
from rla.digest import tensor_digest  # noqa: E402
from studies._shared.random_models import cast_pair, gpu_point, sample  # noqa: E402
from studies._shared.scored import Layout, token_mismatch  # noqa: E402
from studies._shared.settings import GPU_TARGET  # noqa: E402
from studies._shared.shapes import PAPER_SHAPES, QUICK_SHAPES, Shape  # noqa: E402
from studies._shared.sides import engine_forward, train_forward  # noqa: E402

# (regions, implementation): stock has no region to implement
SETTINGS = [("none", "-"), ("rope", "eager"), ("rope", "fused"), ("all", "eager"), ("all", "fused")]
# Deepest first: when time runs out the first model's rows are already written.
MODELS = ("qwen3-8b", "qwen2.5-math-7b")


def measure(name: str, shape: Shape, lengths: dict, device: torch.device, log=print) -> tuple[list[dict], dict]:
    """The rows of every setting and reference, and the rounding map of the engine's compiled graphs
    (value -> stored as bf16 there, and in target `vllm`)."""
    point = gpu_point(name, shape, **lengths)
    start = time.perf_counter()
    # built on the device (a 7B model's fp32 init on a CPU would take minutes), cast to bf16 in place
    model, engine = cast_pair(point, device)
    torch._dynamo.reset()  # every engine piece compiles below, under the rounding map's hook
    with engine_table.capture() as graphs:
        layout = Layout.from_rollout(sample(engine, point))
        ref = engine_forward(engine.model, layout.ids, layout.mask, layout.positions).logprobs.cpu()
    stores = {value: {"stored": found, "target": want}
              for value, (found, want) in engine_table.compare(engine_table.rounding_map(graphs), GPU_TARGET).items()}
    differ = [value for value, x in stores.items() if x["stored"] != x["target"]]
    log(f"{name}: {shape.layers} layers, hidden {shape.hidden}, vocab {shape.vocab}: built, sampled "
        f"{point.n_seq} x {point.response_len} tokens ({time.perf_counter() - start:.0f} s); the engine's "
        f"{len(graphs)} compiled graphs store bf16 {'as' if not differ else 'NOT as'} target {GPU_TARGET!r} says"
        f"{'' if not differ else ': ' + ', '.join(differ)}")
    head = {"model": name, **{k: getattr(shape, k) for k in ("arch", "layers", "hidden", "heads", "kv_heads",
                                                            "head_dim", "intermediate", "vocab", "rope_theta")},
            "n_seq": point.n_seq, "prompt_len": point.prompt_len, "response_len": point.response_len,
            "target": GPU_TARGET, "attention": CUDA_ATTENTION if device.type == "cuda" else "fp32 SDPA, rounded once",
            # what another run compares: the same sampled tokens, the same engine logprobs
            "responses_digest": tensor_digest(layout.ids), "engine_logprobs_digest": tensor_digest(ref)}
    rows = []
    for regions, impl in SETTINGS:
        with patches.aligned(regions, target=GPU_TARGET, impl="eager" if impl == "-" else impl):
            train = train_forward(model, layout.ids, layout.mask, layout.positions).logprobs.cpu()
        for reference, ref_lp in (("engine_forward", ref), ("engine_sampling", layout.sampling)):
            rows.append({**head, "regions": regions, "impl": impl, "reference": reference,
                         **token_mismatch(train, ref_lp, layout.response)})
        main = rows[-2]
        log(f"  {regions:5s} {impl:6s} k3 {main['k3']:.3e}  |d| {main['mean_abs_dlogprob']:.3e}  "
            f"bit-equal {main['bit_equal']:.1%}  ({time.perf_counter() - start:.0f} s)")
    del model, engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, {"model": name, "graphs": len(graphs), "values": stores, "matches": not differ}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="a tiny Qwen3 shape, few tokens: a dry run")
    p.add_argument("--out", type=Path, required=True, help="JSON path (rewritten after each model)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device visible to torch")
    if args.quick:
        shapes, lengths = dict(QUICK_SHAPES), dict(n_seq=2, prompt_len=8, response_len=8)
    else:
        shapes, lengths = {n: PAPER_SHAPES[n] for n in MODELS}, dict(n_seq=8, prompt_len=32, response_len=128)
    device = torch.device(args.device)
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "target": GPU_TARGET, "rows": [], "roundmaps": []}
    for name, shape in shapes.items():
        rows, stores = measure(name, shape, lengths, device)
        report["rows"] += rows
        report["roundmaps"].append(stores)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
