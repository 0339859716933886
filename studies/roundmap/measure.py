"""The rounding map: which values a compiled engine graph stores as BF16, read off Inductor itself.

Inductor rounds a BF16 value where it writes it to a buffer and keeps it in FP32 where it fuses it
into the next computation (it drops a downcast whose value is only upcast again). So "where does the
engine round" is "which values does Inductor store", and that is decided by the graph - how vLLM
splits the model into pieces, and Inductor's own realize heuristics (`realize_reads_threshold`,
`realize_opcount_threshold`) - not by the formulas alone. This module compiles an engine's graphs with
a hook on `torch._inductor.scheduler.Scheduler.__init__`, where every buffer Inductor will write is
known, and lists the value each buffer stores. (Grepping the generated code misleads: dead casts stay
in its text.)

A buffer's stored value is the last FX node of the computation it holds (its `origins` in graph order,
leaving out the extern kernels that consume it, which Inductor also records there). The region values
of patches/targets.py are recognised by the source line that computes them - vLLM's own lines, which
localrl/engine/ops.py repeats verbatim - and by the model line that calls it (input vs post-attention
norm, q_norm/k_norm).

    python -m studies run roundmap --engine local --arch qwen2            # the local engine's pieces (C++)
    python -m studies run roundmap --engine local --device cuda           # the same pieces compiled to Triton
    python -m studies run roundmap --engine vllm --arch qwen3             # vLLM as installed (CPU: one graph)
    python -m studies run roundmap --engine vllm-gpu-split --arch qwen2   # vLLM's own code, split as on a GPU
"""

from __future__ import annotations

import contextlib
import linecache
from collections import Counter
from dataclasses import dataclass, field

import torch

from localrl.models import REAL_SHAPES, real_shape_config

# (source function, start of the source line, FX op) -> region value; "{norm}" is filled in from the
# calling model line. Lines are vLLM's (vllm/ir/ops/layernorm.py, layers/activation.py,
# layers/rotary_embedding/common.py) and, verbatim, localrl/engine/ops.py's.
LINES: list[tuple[str, str, str, str]] = [
    ("fused_add_rms_norm", "x_residual = x.to(orig_dtype)", "convert_element_type", "residual.{after}"),
    ("fused_add_rms_norm", "x = x.to(weight.dtype) * weight", "convert_element_type", "{norm}.normalized"),
    ("fused_add_rms_norm", "x = x.to(weight.dtype) * weight", "mul", "{norm}.out"),
    ("rms_norm", "x = x.to(weight.dtype) * weight", "convert_element_type", "{norm}.normalized"),
    ("rms_norm", "x = x.to(weight.dtype) * weight", "mul", "{norm}.out"),
    ("forward_native", "return F.silu(x[..., :d]) * x[..., d:]", "convert_element_type", "swiglu.silu"),
    ("forward_native", "return F.silu(x[..., :d]) * x[..., d:]", "mul", "swiglu.out"),
    ("silu_and_mul", "return F.silu(x[..., :d]) * x[..., d:]", "convert_element_type", "swiglu.silu"),
    ("silu_and_mul", "return F.silu(x[..., :d]) * x[..., d:]", "mul", "swiglu.out"),
    ("forward_static", "o1 = x1 * cos - x2 * sin", "mul", "rope.product"),
    ("forward_static", "o2 = x2 * cos + x1 * sin", "mul", "rope.product"),
    ("forward_static", "output = torch.cat((o1, o2), dim=-1)", "cat", "rope.out"),
    ("apply_rotary_emb", "o1 = x1 * cos - x2 * sin", "mul", "rope.product"),
    ("apply_rotary_emb", "o2 = x2 * cos + x1 * sin", "mul", "rope.product"),
    ("apply_rotary_emb", "output = torch.cat((o1, o2), dim=-1)", "cat", "rope.out"),
]


@dataclass
class Node:
    """One FX node of a compiled graph that computes a floating-point value."""

    name: str
    op: str                    # aten op name, e.g. "mul", "convert_element_type"
    dtype: torch.dtype
    frames: list[tuple[str, int, str, str]]  # (file, line, function, source text), outermost first
    stored: torch.dtype | None = None        # the dtype of the buffer that stores it, None: not stored

    def value(self) -> str | None:
        """The region value this node computes (patches/targets.py VALUES), or None."""
        for depth in range(len(self.frames) - 1, -1, -1):
            _, _, func, text = self.frames[depth]
            for f, line, op, value in LINES:
                if func == f and text.startswith(line) and self.op == op:
                    return _fill(value, [fr[3] for fr in self.frames[:depth]])
        return None


def _fill(value: str, callers: list[str]) -> str | None:
    """Fill in which norm / which residual from the innermost calling model line that names one."""
    if "{" not in value:
        return value
    for text in reversed(callers):
        if "q_norm" in text or "k_norm" in text:
            return None if value.startswith("residual") else value.replace("{norm}", "qk_norm")
        if "post_attention_layernorm" in text:
            return value.replace("{norm}", "rmsnorm").replace("{after}", "post_attention")
        if "input_layernorm" in text:
            return value.replace("{norm}", "rmsnorm").replace("{after}", "layer_output")
        if "final_norm" in text or "self.norm(" in text:
            return None if value.startswith("residual") else value.replace("{norm}", "rmsnorm")
    return None


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)


def _frames(stack_trace: str) -> list[tuple[str, int, str, str]]:
    frames = []
    for line in (stack_trace or "").splitlines():
        line = line.strip()
        if not line.startswith('File "'):
            continue
        path, _, rest = line[6:].partition('", line ')
        number, _, func = rest.partition(", in ")
        if number.isdigit():
            frames.append((path, int(number), func.strip(), linecache.getline(path, int(number)).strip()))
    return frames


def _op_name(target) -> str:
    name = getattr(target, "__name__", str(target))  # e.g. "mul.Tensor"
    return name.split(".")[0]


_EXTERN_ATEN = ("mm", "addmm", "bmm", "baddbmm", "convolution", "embedding")


def _is_extern(node) -> bool:
    """Whether an FX node runs as an opaque kernel (a GEMM, a custom op) rather than in Inductor's own
    loops: Inductor lists such a consumer among the origins of the buffer it reads."""
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        return True
    namespace = getattr(target, "namespace", None)
    if namespace is None:
        return False
    if namespace not in ("aten", "prims"):
        return True
    return target.overloadpacket.__name__ in _EXTERN_ATEN


def _stored_values(graph_lowering) -> dict[str, torch.dtype]:
    """FX node name -> dtype of the buffer that stores its value."""
    from torch._inductor import ir

    nodes = list(graph_lowering.orig_gm.graph.nodes)
    order = {n.name: i for i, n in enumerate(nodes)}
    extern = {n.name for n in nodes if n.op == "call_function" and _is_extern(n)}
    for buf in graph_lowering.buffers:
        if isinstance(buf, (ir.ExternKernel, ir.MultiOutput)) and buf.get_origin_node() is not None:
            extern.add(buf.get_origin_node().name)
    stored = {}
    for buf in graph_lowering.buffers:
        if isinstance(buf, ir.ConcatKernel) and buf.get_origin_node() is not None:  # a cat written in slices
            stored[buf.get_origin_node().name] = buf.get_dtype()
        if not isinstance(buf, ir.ComputedBuffer):
            continue
        own = [o.name for o in buf.origins if o.name in order and o.name not in extern]
        if own:
            stored[max(own, key=order.__getitem__)] = buf.get_dtype()
    return stored


@contextlib.contextmanager
def capture():
    """Within the block, every graph Inductor compiles is recorded (Inductor's caches are off, so that
    it really compiles). Yields the list the graphs are appended to."""
    import torch._inductor.config as inductor_config
    import torch._inductor.scheduler as scheduler
    from torch._inductor.virtualized import V

    if inductor_config.emulate_precision_casts:
        raise RuntimeError("torch._inductor.config.emulate_precision_casts is on: Inductor then also rounds casts "
                           "inside fused kernels, which a map of stored values does not see (vLLM never sets it)")
    graphs: list[Graph] = []
    stock = scheduler.Scheduler.__init__

    def init(self, *args, **kwargs):
        stock(self, *args, **kwargs)
        stored = _stored_values(V.graph)
        graph = Graph()
        for n in V.graph.orig_gm.graph.nodes:
            val = n.meta.get("val")
            if n.op != "call_function" or not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
                continue
            graph.nodes.append(Node(n.name, _op_name(n.target), val.dtype, _frames(n.meta.get("stack_trace", "")),
                                    stored.get(n.name)))
        graphs.append(graph)

    scheduler.Scheduler.__init__ = init
    try:
        with inductor_config.patch(force_disable_caches=True):
            yield graphs
    finally:
        scheduler.Scheduler.__init__ = stock


def rounding_map(graphs: list[Graph], dtype: torch.dtype = torch.bfloat16) -> dict[str, Counter]:
    """value -> Counter of "bf16" (stored in `dtype`: rounded), "fp32" (stored in FP32) and "inline"
    (kept inside a fused kernel), over every node that computes that value in the graphs."""
    out: dict[str, Counter] = {}
    for graph in graphs:
        for node in graph.nodes:
            value = node.value()
            if value is None:
                continue
            where = "inline" if node.stored is None else ("bf16" if node.stored == dtype else "fp32")
            out.setdefault(value, Counter())[where] += 1
    return out


def stores(counts: dict[str, Counter]) -> dict[str, bool | None]:
    """value -> True (every occurrence rounded), False (none rounded), None (mixed)."""
    out = {}
    for value, c in counts.items():
        rounded = c["bf16"]
        out[value] = True if rounded == sum(c.values()) else (False if rounded == 0 else None)
    return out


# ---- the graphs of each engine -------------------------------------------------------------------

def local_graphs(config, tokens: int = 16, device: str = "cpu") -> list[Graph]:
    """The local engine's pieces (first, middle, last), compiled for a model of `config` on `device`:
    Inductor writes C++ for the CPU and Triton for a GPU, and each may store differently."""
    from transformers import AutoModelForCausalLM

    from localrl.engine.model import EngineModel

    torch._dynamo.reset()  # compile again, under the hook
    with torch.device("meta"):  # shapes only: where Inductor stores does not depend on the values
        shapes = AutoModelForCausalLM.from_config(config).state_dict()
    weights = {name: torch.zeros(t.shape, dtype=torch.bfloat16, device=device) for name, t in shapes.items()}
    with capture() as graphs:
        engine = EngineModel(config, max_positions=max(tokens, 32), device=device)
        engine.load_hf_weights(weights)
        ids = torch.randint(0, config.vocab_size, (1, tokens))
        engine(ids, torch.arange(tokens)[None])
    return graphs


# The CUDA-only `_C` ops that vLLM's FixFunctionalizationPass names unguarded (vllm/compilation/passes/
# fix_functionalization.py): absent from the CPU build, so piecewise compilation cannot start there.
_CUDA_ONLY_OPS = ("fused_add_rms_norm", "fused_add_rms_norm_static_fp8_quant", "fused_qk_norm_rope", "rms_norm",
                  "rms_norm_dynamic_per_token_quant", "rms_norm_static_fp8_quant", "rotary_embedding", "silu_and_mul",
                  "silu_and_mul_quant")


@contextlib.contextmanager
def _gpu_split_on_cpu():
    """vLLM's CPU build compiled as vLLM compiles for a GPU (mode VLLM_COMPILE: pieces split at the
    attention ops), to read the stores of vLLM's own model code in the GPU's pieces. Only the split
    changes: the CPU platform turns VLLM_COMPILE into DYNAMO_TRACE_ONCE, which is set back here; the
    pass that names CUDA-only ops gets stand-ins it only compares against (they never run)."""
    from vllm.config import CompilationMode
    from vllm.platforms import cpu

    stock = cpu.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        wanted = vllm_config.compilation_config.mode
        stock(cls, vllm_config)
        if wanted == CompilationMode.VLLM_COMPILE:
            vllm_config.compilation_config.mode = CompilationMode.VLLM_COMPILE
            vllm_config.compilation_config.backend = "inductor"

    class _StandIn:
        def __init__(self, name):
            self.default = ("cuda-only stand-in", name)

    added = [name for name in _CUDA_ONLY_OPS if not hasattr(torch.ops._C, name)]
    for name in added:
        setattr(torch.ops._C, name, _StandIn(name))
    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    try:
        yield
    finally:
        cpu.CpuPlatform.check_and_update_config = classmethod(stock)
        for name in added:
            delattr(torch.ops._C, name)


def vllm_graphs(model_dir: str, gpu_split: bool = False, dummy_weights: bool = True) -> list[Graph]:
    """vLLM's own graphs for the checkpoint (or config) in `model_dir`: its CPU build's one graph, or,
    with `gpu_split`, the pieces of its GPU path. Weights need not be real (`load_format="dummy"`):
    where Inductor stores does not depend on their values. Run it in a fresh process (the CLI does)."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # compile in this process, under the hook
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    from vllm import LLM

    compilation = {"compile_sizes": [], "mode": 3} if gpu_split else {}
    with capture() as graphs, (_gpu_split_on_cpu() if gpu_split else contextlib.nullcontext()):
        # max_num_batched_tokens: vLLM's warm-up runs a batch of this many tokens (CPU default 4096: minutes
        # at real widths on an AVX2 CPU); the map needs the graph, not the run.
        LLM(model=model_dir, dtype="bfloat16", max_model_len=256, max_num_seqs=4, max_num_batched_tokens=256,
            skip_tokenizer_init=True, enable_prefix_caching=False, load_format="dummy" if dummy_weights else "auto",
            seed=0, compilation_config=compilation)
    return graphs


# ---- shapes and the command line ------------------------------------------------------------------

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


def derive(engine: str, arch: str, shape: str, device: str = "cpu", layers: int | None = None) -> dict[str, Counter]:
    """The rounding map of one engine's graphs for one model shape (the local engine's on `device`),
    at the shape's depth or its first `layers` layers."""
    import tempfile

    config = real_shape_config(arch, shape, layers=layers)
    if engine == "local":
        return rounding_map(local_graphs(config, device=device))
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        return rounding_map(vllm_graphs(tmp, gpu_split=engine == "vllm-gpu-split"))


# Values of patches/targets.py the map does not read, with why: their table entries come from vLLM's source.
UNREAD = {
    "residual.norm_input": "which tensor the next input norm reads is an edge of the graph, not a stored buffer; "
                           "vLLM's fused_add_rms_norm takes the variance of the unrounded sum `x`",
}


def compare(counts: dict[str, Counter], target_name: str) -> dict[str, tuple[bool | None, bool]]:
    """value -> (what the graph stores, what the target says), for every value of the target that the
    graph computes (Qwen2 has no q/k norm)."""
    from patches.targets import TARGETS

    found = stores(counts)
    return {value: (found[value], stored) for value, stored in TARGETS[target_name].stores.items() if value in found}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m studies run roundmap",
                                description="Which values an engine's compiled graphs store as BF16.")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="local: the local engine's pieces; vllm: vLLM as installed (its CPU build: one graph; on a "
                        "GPU: its piecewise graphs); vllm-gpu-split: vLLM's CPU build split at attention as on a GPU")
    p.add_argument("--arch", choices=("qwen2", "qwen3"), default="qwen2")
    p.add_argument("--shape", choices=tuple(REAL_SHAPES), default="tiny")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the local engine's pieces are compiled: cpu (C++) or cuda (Triton)")
    p.add_argument("--layers", type=int, help="decoder layers, at most the shape's own (default: all of them): "
                   "the widths stay the shape's; every layer's graph is the same code, so depth adds compile time")
    p.add_argument("--json", help="also write the map to this file")
    args = p.parse_args(argv)
    try:
        real_shape_config(args.arch, args.shape, layers=args.layers)  # refuses a depth the shape does not have
    except ValueError as err:
        p.error(f"--layers {args.layers}: {err}")
    if args.device != "cpu" and args.engine != "local":
        p.error(f"--device {args.device} is for --engine local; vLLM compiles for the device it runs on")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device visible to torch")
    if args.engine != "local" and not torch.cuda.is_available():
        from localrl.vllm_support import require_vllm

        require_vllm(f"--engine {args.engine}")
    counts = derive(args.engine, args.arch, args.shape, args.device, args.layers)
    layers = args.layers or REAL_SHAPES[args.shape]["num_hidden_layers"]
    target = expected_target(args.engine)
    rows = compare(counts, target)
    print(f"{args.engine} {args.arch} {args.shape}, {layers} layers ({args.device}): value, stored as BF16 in the "
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
                       "device": args.device, "target": target, "counts": {k: dict(v) for k, v in counts.items()},
                       "values": {value: {"stored": found, "target": want} for value, (found, want) in rows.items()},
                       "matches": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
