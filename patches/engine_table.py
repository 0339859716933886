"""The rounding table of the engine that serves the rollouts, read off its compiled graph: `target="auto"`
and `python -m patches.engine_table` (docs/patches.md: "`target="auto"`").

Inductor rounds a BF16 value where it writes it to a buffer, so "where does the engine round" is "which
values does Inductor store": a hook on `torch._inductor.scheduler.Scheduler.__init__`, where every buffer
Inductor will write is known, lists the value each buffer stores. (Grepping the generated code misleads:
dead casts stay in its text.) Tables are read in a child process (`--read`), so that neither vLLM's global
state nor the hook reaches the training process; so is, per model depth, where vLLM-CPU's graph stores the
FP32 stream (`--read-stream`: the summation order of reduction="vllm_cpu_graph", `stream_pattern`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import linecache
import os
import platform
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
import torch._inductor.scheduler as scheduler
from torch._inductor import ir
from torch._inductor.cpu_vec_isa import pick_vec_isa
from torch._inductor.virtualized import V
from transformers import Qwen2Config, Qwen3Config

from patches.targets import TARGETS, VALUES, Target, check
from rla.names import ENGINE_CONFIG_ENV

# (source functions, start of the source line, FX op) -> region value; "{norm}" is filled in from the
# calling model line. Lines are vLLM's (vllm/ir/ops/layernorm.py, layers/activation.py,
# layers/rotary_embedding/common.py) and, verbatim, localrl/engine/ops.py's.
NORM_FNS = ("fused_add_rms_norm", "rms_norm")
SILU_FNS = ("forward_native", "silu_and_mul")
ROPE_FNS = ("forward_static", "apply_rotary_emb")
LINES: list[tuple[tuple[str, ...], str, str, str]] = [
    (("fused_add_rms_norm",), "x_residual = x.to(orig_dtype)", "convert_element_type", "residual.{after}"),
    (NORM_FNS, "x = x.to(weight.dtype) * weight", "convert_element_type", "{norm}.normalized"),
    (NORM_FNS, "x = x.to(weight.dtype) * weight", "mul", "{norm}.out"),
    (SILU_FNS, "return F.silu(x[..., :d]) * x[..., d:]", "convert_element_type", "swiglu.silu"),
    (SILU_FNS, "return F.silu(x[..., :d]) * x[..., d:]", "mul", "swiglu.out"),
    (ROPE_FNS, "o1 = x1 * cos - x2 * sin", "mul", "rope.product"),
    (ROPE_FNS, "o2 = x2 * cos + x1 * sin", "mul", "rope.product"),
    (ROPE_FNS, "output = torch.cat((o1, o2), dim=-1)", "cat", "rope.out"),
]


@dataclass
class Node:
    """One FX node of a compiled graph that computes a floating-point value."""

    name: str
    op: str                    # aten op name, e.g. "mul", "convert_element_type"
    dtype: torch.dtype
    frames: list[tuple[str, int, str, str]]  # (file, line, function, source text), outermost first
    stored: torch.dtype | None = None        # the dtype of the buffer that stores it, None: not stored
    rounded_inline: bool = False             # rounded to its dtype inside a fused kernel (emulate_precision_casts)

    def value(self) -> str | None:
        """The region value this node computes (patches/targets.py VALUES), or None. A cast to FP32 on a
        value's line (silu's input upcast) is the input of the value, not the value."""
        if self.op == "convert_element_type" and self.dtype not in (torch.bfloat16, torch.float16):
            return None
        for depth in range(len(self.frames) - 1, -1, -1):
            _, _, func, text = self.frames[depth]
            for funcs, line, op, value in LINES:
                if func in funcs and text.startswith(line) and self.op == op:
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
    opaque: list[str] = field(default_factory=list)  # custom ops it calls ("_C.silu_and_mul"): kernels the map cannot see into


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


def _rounds_inline(node, dtype: torch.dtype) -> bool:
    """Whether Inductor, with `emulate_precision_casts` on, rounds this node's value to its BF16/FP16 dtype
    inside a fused kernel as eager would: at an explicit cast, and at the output of an op eager runs in
    that dtype (torch/_inductor/lowering.py: `to_dtype` without compute types, and the nodes tracing marks
    `low_precision_pointwise_barrier`)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return False
    return _op_name(node.target) == "convert_element_type" or bool(node.meta.get("low_precision_pointwise_barrier"))


class _WholeModelCaptured(Exception):
    """Raised by `capture`'s hook once the graph of the whole model is recorded (see `vllm_graphs`)."""


ATTENTION_OP = "vllm.unified_attention_with_output"  # one per layer, opaque in vLLM's graphs


@contextlib.contextmanager
def capture(whole_model_layers: int | None = None):
    """Within the block, every graph Inductor compiles is recorded (Inductor's caches are off, so that
    it really compiles). Yields the list the graphs are appended to. With `whole_model_layers`, a graph
    holding that many layers' attention ops ends the compile there (the hook raises
    `_WholeModelCaptured`): nothing after it - the kernels' build, the engine's warm-up - moves a store."""
    graphs: list[Graph] = []
    stock = scheduler.Scheduler.__init__

    def init(self, *args, **kwargs):
        stock(self, *args, **kwargs)
        stored = _stored_values(V.graph)
        emulated = inductor_config.emulate_precision_casts  # as the compile that runs now has it (vLLM patches it)
        graph = Graph()
        for n in V.graph.orig_gm.graph.nodes:
            namespace = getattr(n.target, "namespace", None) if n.op == "call_function" else None
            if namespace not in (None, "aten", "prims"):
                graph.opaque.append(f"{namespace}.{_op_name(n.target)}")
            val = n.meta.get("val")
            if n.op != "call_function" or not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
                continue
            graph.nodes.append(Node(n.name, _op_name(n.target), val.dtype, _frames(n.meta.get("stack_trace", "")),
                                    stored.get(n.name), emulated and _rounds_inline(n, val.dtype)))
        graphs.append(graph)
        if whole_model_layers and graph.opaque.count(ATTENTION_OP) == whole_model_layers:
            raise _WholeModelCaptured()

    scheduler.Scheduler.__init__ = init
    try:
        with inductor_config.patch(force_disable_caches=True):
            yield graphs
    finally:
        scheduler.Scheduler.__init__ = stock


def rounding_map(graphs: list[Graph], dtype: torch.dtype = torch.bfloat16) -> dict[str, Counter]:
    """value -> Counter of "bf16" (stored in `dtype`: rounded), "fp32" (stored in FP32), "rounded inline"
    (rounded to `dtype` inside a fused kernel: emulate_precision_casts) and "inline" (kept in FP32 inside a
    fused kernel), over every node that computes that value in the graphs."""
    out: dict[str, Counter] = {}
    for graph in graphs:
        for node in graph.nodes:
            value = node.value()
            if value is None:
                continue
            if node.stored is None:
                where = "rounded inline" if node.rounded_inline and node.dtype == dtype else "inline"
            else:
                where = "bf16" if node.stored == dtype else "fp32"
            out.setdefault(value, Counter())[where] += 1
    return out


def stores(counts: dict[str, Counter]) -> dict[str, bool | None]:
    """value -> True (every occurrence rounded), False (none rounded), None (mixed)."""
    out = {}
    for value, c in counts.items():
        rounded = c["bf16"] + c["rounded inline"]
        out[value] = True if rounded == sum(c.values()) else (False if rounded == 0 else None)
    return out


# The residual add inside vLLM's fused add + RMSNorm (vllm/ir/ops/layernorm.py): the FP32 stream.
STREAM_SUM = ("fused_add_rms_norm", "x = x + x_residual.to(torch.float32)", "add")
NORMS = ("input_layernorm", "post_attention_layernorm", "self.norm(")


def stream_sums(graphs: list[Graph]) -> list[tuple[str, bool]]:
    """Each fused add + norm's FP32 stream sum in graph order: (the norm that sums it, whether Inductor
    stores the sum in a buffer) - the graph's summation order for the norms (reduction="vllm_cpu_graph"):
    a sum not stored is recomputed inside the norm's kernel from its addends."""
    func, line, op = STREAM_SUM
    found = []
    for graph in graphs:
        for node in graph.nodes:
            depths = [d for d, f in enumerate(node.frames) if f[2] == func and f[3].startswith(line)]
            if node.op != op or not depths:
                continue
            callers = [f[3] for f in node.frames[:depths[-1]]]
            norm = next((n for text in reversed(callers) for n in NORMS if n in text), None)
            found.append(((norm or "?").removesuffix("("), node.stored is not None))
    return found


# The CUDA-only `_C` ops that vLLM's FixFunctionalizationPass names unguarded (vllm/compilation/passes/
# fix_functionalization.py): absent from the CPU build, so piecewise compilation cannot start there.
_CUDA_ONLY_OPS = ("fused_add_rms_norm", "fused_add_rms_norm_static_fp8_quant", "fused_qk_norm_rope", "rms_norm",
                  "rms_norm_dynamic_per_token_quant", "rms_norm_static_fp8_quant", "rotary_embedding", "silu_and_mul",
                  "silu_and_mul_quant")


@contextlib.contextmanager
def gpu_split_on_cpu():
    """vLLM's CPU build compiled as vLLM compiles for a GPU (mode VLLM_COMPILE: pieces split at the
    attention ops), to read the stores of vLLM's own model code in the GPU's pieces. Only the split
    changes: the CPU platform turns VLLM_COMPILE into DYNAMO_TRACE_ONCE, which is set back here; the
    pass that names CUDA-only ops gets stand-ins it only compares against (they never run)."""
    from vllm.config import CompilationMode  # vLLM: optional, read only where its graph is
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


def vllm_graphs(model_dir: str, gpu_split: bool = False, compilation_config: dict | None = None,
                enforce_eager: bool = False, stop_at_whole_model: bool = True) -> list[Graph]:
    """vLLM's own graphs for the checkpoint (or config) in `model_dir`, compiled with `compilation_config`
    (vLLM's; None: its defaults): its CPU build's one graph, or, with `gpu_split`, the pieces of its GPU
    path. Weights need not be real (`load_format="dummy"`): where Inductor stores does not depend on their
    values. Run it in a fresh process (`python -m patches.engine_table --read` does). The compile stops
    at a graph of the whole model unless `stop_at_whole_model` is False (then the engine starts)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # compile in this process, under the hook
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    from vllm import LLM  # vLLM: optional, and it reads the environment set above when it loads

    compilation = dict(compilation_config or {})
    if gpu_split:
        compilation.update(compile_sizes=[], mode=3)
    # One graph of every layer is the whole of what vLLM compiles, unless it compiles per size or in
    # pieces: then every graph is waited for. Stopping at it spares the kernels' build and the warm-up.
    whole = None if gpu_split or compilation.get("compile_sizes") or not stop_at_whole_model else json.loads(
        (Path(model_dir) / "config.json").read_text())["num_hidden_layers"]
    with capture(whole) as graphs, (gpu_split_on_cpu() if gpu_split else contextlib.nullcontext()):
        try:
            # max_num_batched_tokens: vLLM's warm-up runs a batch of this many tokens (CPU default 4096:
            # minutes at real widths on an AVX2 CPU); the map needs the graph, not the run.
            LLM(model=model_dir, dtype="bfloat16", max_model_len=256, max_num_seqs=4, max_num_batched_tokens=256,
                skip_tokenizer_init=True, enable_prefix_caching=False,
                load_format="dummy", seed=0, compilation_config=compilation,
                enforce_eager=enforce_eager)
        except Exception as err:  # noqa: BLE001 - vLLM and Inductor wrap what the hook raised
            if not _raised_by(err, _WholeModelCaptured):
                raise
    return graphs


def _raised_by(err: BaseException, kind: type) -> bool:
    while err is not None:
        if isinstance(err, kind):
            return True
        err = err.__cause__ or err.__context__
    return False


def compare(counts: dict[str, Counter], target_name: str) -> dict[str, tuple[bool | None, bool]]:
    """value -> (what the graph stores, what the named target says), for every value of the target that
    the graph computes (Qwen2 has no q/k norm)."""
    found = stores(counts)
    return {value: (found[value], stored) for value, stored in TARGETS[target_name].stores.items() if value in found}


# ---- what the graph does not hold, and the engine config ---------------------------------------------

# Values the map does not read, with their table entry and where vLLM decides it.
FROM_SOURCE: dict[str, tuple[bool, str]] = {
    "residual.norm_input": (False, "which tensor the next input norm reads is an edge of the graph, not a stored "
                                   "buffer; vLLM's fused_add_rms_norm (vllm/ir/ops/layernorm.py) takes the variance "
                                   "of the unrounded sum `x`"),
}
FAMILY_VALUES = {
    "qwen2": [v for v in VALUES if v not in FROM_SOURCE and not v.startswith("qk_norm.")],  # no q/k norm
    "qwen3": [v for v in VALUES if v not in FROM_SOURCE],
}
DEVICES = ("cpu", "cuda")
_AVOID_OPAQUE = "compilation_config.custom_ops = ['none'] (vLLM's default under Inductor)"


class EngineNotReadable(ValueError):
    """An engine configuration whose roundings the map cannot attribute to the table's values."""


@dataclass(frozen=True)
class EngineConfig:
    """What of the rollout engine's configuration decides where it rounds ($RLA_ENGINE_CONFIG's keys:
    docs/patches.md, "`target="auto"`")."""

    compilation_config: dict = field(default_factory=dict)
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    device: str = "cpu"

    @classmethod
    def parse(cls, text: str | dict | None) -> EngineConfig:
        """From JSON (or a dict): keys of this class; a bad key or value raises, naming it."""
        data = json.loads(text) if isinstance(text, str) and text.strip() else dict(text or {})
        allowed = [f for f in cls.__dataclass_fields__]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ValueError(f"engine config: unknown key(s) {unknown}; allowed: {', '.join(allowed)}")
        config = cls(**data)
        if config.device not in DEVICES:
            raise ValueError(f"engine config: device {config.device!r}; allowed: {', '.join(DEVICES)}")
        if not isinstance(config.compilation_config, dict):
            raise ValueError(f"engine config: compilation_config {config.compilation_config!r}; allowed: a dict of "
                             "vLLM's CompilationConfig fields")
        if not isinstance(config.tensor_parallel_size, int) or config.tensor_parallel_size < 1:
            raise ValueError(f"engine config: tensor_parallel_size {config.tensor_parallel_size!r}; allowed: 1, 2, ...")
        return config

    @classmethod
    def from_env(cls) -> EngineConfig:
        """$RLA_ENGINE_CONFIG (the launcher sets it from the rollout's settings); unset: vLLM's defaults on
        this machine's device."""
        text = os.environ.get(ENGINE_CONFIG_ENV, "")
        try:
            return cls.parse(text) if text.strip() else cls(device="cuda" if torch.cuda.is_available() else "cpu")
        except (ValueError, TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"{ENGINE_CONFIG_ENV}={text!r}: {err}") from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def refusal(config: EngineConfig) -> str | None:
    """Why the map cannot read this configuration before compiling anything (None: it can)."""
    cc, passes = config.compilation_config, config.compilation_config.get("pass_config", {}) or {}
    if config.enforce_eager or cc.get("mode") in (0, "NONE"):
        setting = "enforce_eager=True" if config.enforce_eager else f"compilation_config.mode={cc.get('mode')!r}"
        return (f"{setting}: vLLM runs its layers eagerly through its custom kernels, with no compiled graph to read; "
                "avoid: enforce_eager=False and the default compilation mode (verl: rollout.enforce_eager=False)")
    if config.device == "cuda" and config.tensor_parallel_size > 1 and passes.get("fuse_allreduce_rms") is not False:
        return (f"tensor_parallel_size={config.tensor_parallel_size} on a GPU: vLLM's default optimisation fuses "
                "all-reduce + residual add + RMSNorm into one FlashInfer kernel (pass_config.fuse_allreduce_rms), whose "
                "roundings the map cannot see; avoid: tensor_parallel_size=1, or "
                "compilation_config.pass_config.fuse_allreduce_rms=False")
    for name in ("enable_qk_norm_rope_fusion", "fuse_qk_norm_rope_kvcache", "fuse_rope_kvcache"):
        if passes.get(name):
            return (f"compilation_config.pass_config.{name}=True: q/k norm and RoPE run in one fused CUDA kernel whose "
                    f"roundings the map cannot see; avoid: pass_config.{name}=False (its default on CUDA)")
    if config.device == "cuda" and not torch.cuda.is_available() and cc.get("mode", 3) not in (3, "VLLM_COMPILE"):
        return (f"compilation_config.mode={cc.get('mode')!r} for a GPU, read on this CPU-only machine: only vLLM's GPU "
                "default (mode VLLM_COMPILE, pieces split at attention) can be read here; read it on the GPU")
    return None


def family_config(family: str, layers: int = 2):
    """A model of `family` at a small width (two layers unless asked): the shapes of what the graph
    computes, not a model."""
    common = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=2048, max_position_embeddings=512, torch_dtype="bfloat16")
    if family == "qwen2":
        return Qwen2Config(architectures=["Qwen2ForCausalLM"], **common)
    if family == "qwen3":
        return Qwen3Config(architectures=["Qwen3ForCausalLM"], head_dim=64, **common)
    raise ValueError(f"model family {family!r}; allowed: {', '.join(FAMILY_VALUES)}")


def read_stores(family: str, config: EngineConfig) -> dict[str, bool]:
    """value -> stored as BF16, for every value of `family`, read off vLLM's graph compiled here with
    `config` (call it in a fresh process). Raises EngineNotReadable where the graph does not decide."""
    why = refusal(config)
    if why:
        raise EngineNotReadable(why)
    with tempfile.TemporaryDirectory() as tmp:
        family_config(family).save_pretrained(tmp)
        graphs = vllm_graphs(tmp, gpu_split=config.device == "cuda" and not torch.cuda.is_available(),
                             compilation_config=config.compilation_config, enforce_eager=config.enforce_eager)
    found = stores(rounding_map(graphs))
    missing = [v for v in FAMILY_VALUES[family] if v not in found]
    if missing:
        opaque = sorted({op for g in graphs for op in g.opaque if op.startswith("_C.")})
        raise EngineNotReadable(
            f"compilation_config.custom_ops={config.compilation_config.get('custom_ops', 'default')!r}: "
            f"{', '.join(missing)} computed inside an opaque kernel ({', '.join(opaque) or 'none named in the graph'}), "
            f"whose roundings the map cannot see; avoid: {_AVOID_OPAQUE}")
    mixed = [v for v in FAMILY_VALUES[family] if found[v] is None]
    if mixed:
        raise EngineNotReadable(f"the graph stores {', '.join(mixed)} in some places and not in others: no one table "
                                "describes it")
    return {v: found[v] for v in FAMILY_VALUES[family]}


# ---- target="auto": the table, cached -------------------------------------------------------------

def installed_vllm() -> str | None:
    """vLLM's distribution and version as installed here ("vllm-cpu 0.32.0"), None where it is not."""
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{dist} {importlib.metadata.version(dist)}"
    return None


def vllm_version() -> str:
    if version := installed_vllm():
        return version
    raise EngineNotReadable("target 'auto' reads the rollout engine's graph, but vLLM is not installed here; "
                            f"allowed instead: a named target ({', '.join(TARGETS)}) or a patches.targets.Target")


def cache_dir() -> Path:
    root = os.environ.get("RLA_TABLE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rla-patches", "tables")
    return Path(root)


def _cached_tables(config: EngineConfig, version: str, log) -> dict[str, dict[str, bool]]:
    """family -> its table, from the cache or read off the graph. The missing families are read side by
    side: each read is mostly a compile on one core."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    paths = {family: cache_dir() / "{}-{}.json".format(family, hashlib.sha256(
        json.dumps([version, config.to_json(), family, config.device]).encode()).hexdigest()[:16])
        for family in FAMILY_VALUES}
    with contextlib.ExitStack() as held:
        for path in paths.values():  # verl's processes start together: one reads, the others wait for it
            fcntl.flock(held.enter_context(open(f"{path}.lock", "w")), fcntl.LOCK_EX)  # one order: no deadlock
        missing = [family for family, path in paths.items() if not path.exists()]
        with ThreadPoolExecutor(max(len(missing), 1)) as pool:
            list(pool.map(lambda family: read_family(paths[family], family, config, version, log), missing))
    return {family: json.loads(path.read_text())["stores"] for family, path in paths.items()}


def read_family(path: Path, family: str, config: EngineConfig, version: str, log) -> None:
    """Read one family's table in a child process (vLLM's state and the hook stay there) into `path`."""
    log(f"reading {family}'s rounding table off {version}'s compiled graph ({config.to_json()}): "
        "a compile up to its graph, once per configuration")
    proc = subprocess.run([sys.executable, "-m", "patches.engine_table", "--read", family,
                           "--config", config.to_json(), "--json", str(path) + ".part"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise EngineNotReadable(lines[-1].removeprefix("patches.engine_table: ") if lines else
                                f"reading {family}'s table failed (exit {proc.returncode})")
    os.replace(str(path) + ".part", path)  # complete or absent: a killed read leaves no table behind


def auto_target(config: EngineConfig | None = None, log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> Target:
    """The table of vLLM as installed with `config` (default: $RLA_ENGINE_CONFIG), read off its graphs of
    both families; named after the named target whose table it equals, if one does."""
    config = config or EngineConfig.from_env()
    version = vllm_version()
    why = refusal(config)
    if why:
        raise EngineNotReadable(why)
    read = _cached_tables(config, version, log)
    disagree = [v for v in read["qwen2"] if read["qwen2"][v] != read["qwen3"][v]]
    if disagree:
        raise EngineNotReadable(f"Qwen2's and Qwen3's graphs store {', '.join(disagree)} differently: one table "
                                "cannot serve both")
    stores_ = {v: read["qwen3"].get(v, FROM_SOURCE.get(v, (None,))[0]) for v in VALUES}
    same = [name for name, t in TARGETS.items() if t.stores == stores_]
    split = " (vLLM's code split at attention as on a GPU, read on this CPU build)" if (
        config.device == "cuda" and not torch.cuda.is_available()) else ""
    return check(Target(f"auto:{same[0] if same else 'read'}", f"{version}, {config.to_json()}{split}", stores_,
                        f"read off {version}'s compiled graphs (patches/engine_table.py); "
                        + "; ".join(f"{v}: {why}" for v, (_, why) in FROM_SOURCE.items())))


# ---- reduction="vllm_cpu_graph": where the graph stores the stream, cached ------------------------

STREAM_ALTERNATIVES = "reduction 'inductor_cpu' (each norm's sums as their own Inductor kernel) or 'eager'"


class StreamNotReadable(EngineNotReadable):
    """vLLM-CPU's stream-store pattern cannot be read here, so reduction="vllm_cpu_graph" has no order."""


def _stream_refused(why: str) -> StreamNotReadable:
    return StreamNotReadable(f"reduction 'vllm_cpu_graph' sums as the graph vLLM-CPU compiles here, which cannot be "
                             f"read: {why}; allowed instead: {STREAM_ALTERNATIVES}")


def expected_stream_sums(pattern: tuple[bool, ...]) -> list[tuple[str, bool]]:
    """`stream_sums` of a graph that stores the stream at the post-attention norms `pattern` marks: the
    input norms (from layer 1) and the final norm sum from their addends, as the training side's order
    assumes (patches/rmsnorm.py `_graph_addends`)."""
    found = []
    for i, stored in enumerate(pattern):
        found += [("input_layernorm", False)] if i else []  # layer 0's input norm has no add
        found += [("post_attention_layernorm", stored)]
    return found + [("self.norm", False)]


def read_stream_pattern(family: str, layers: int, config: EngineConfig) -> tuple[bool, ...]:
    """Per decoder layer, whether vLLM-CPU's graph for a `layers`-deep model of `family`, compiled here with
    `config`, stores the FP32 stream at its post-attention norm (call it in a fresh process)."""
    with tempfile.TemporaryDirectory() as tmp:
        family_config(family, layers).save_pretrained(tmp)
        sums = stream_sums(vllm_graphs(tmp, compilation_config=config.compilation_config))
    from vllm.platforms import current_platform  # loaded by the compile above

    if not current_platform.is_cpu():
        raise EngineNotReadable(f"vLLM runs on {current_platform.device_type!r} here, not its CPU build")
    pattern = tuple(stored for norm, stored in sums if norm == "post_attention_layernorm")
    if len(pattern) != layers or sums != expected_stream_sums(pattern):
        raise EngineNotReadable(f"the graph's fused add + norms are {sums}: not one per norm, with the input and final "
                                "norms summed from their addends, as the order models them")
    return pattern


def stream_pattern(family: str, layers: int, config: EngineConfig | None = None,
                   log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> tuple[bool, ...]:
    """`read_stream_pattern` for the rollout engine's config (default: $RLA_ENGINE_CONFIG), read in a child
    process once per key of `_stream_path` and cached on disk. Raises StreamNotReadable, naming why and the
    orders allowed instead, where it cannot be read."""
    if family not in FAMILY_VALUES or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"model family {family!r} at {layers!r} layers; allowed: {', '.join(FAMILY_VALUES)} "
                         "at 1, 2, ... layers")
    config = config or EngineConfig.from_env()
    if why := _stream_refusal(config):
        raise _stream_refused(why)
    path = _stream_path(family, layers, config)
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as lock:  # processes that start together: one reads, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            read_stream(path, family, layers, config, log)
    return tuple(json.loads(path.read_text())["stores_stream"])


def _stream_refusal(config: EngineConfig) -> str | None:
    """Why no vLLM-CPU graph can be read here for `config` before compiling anything (None: it can)."""
    if installed_vllm() is None:
        return "vLLM is not installed here"
    if config.device != "cpu":
        return (f"the engine config names device {config.device!r} (${ENGINE_CONFIG_ENV}, else this machine's "
                "device), not vLLM's CPU build")
    return refusal(config)


def _stream_path(family: str, layers: int, config: EngineConfig) -> Path:
    """The cache file of a pattern, keyed by what decides it: vLLM's and torch's versions, the engine
    config, the model, and the code Inductor generates here (vector ISA, machine)."""
    key = [installed_vllm(), torch.__version__, config.to_json(), family, layers, str(pick_vec_isa() or "scalar"),
           platform.machine()]
    return cache_dir() / "stream-{}-{}-{}.json".format(
        family, layers, hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16])


def read_stream(path: Path, family: str, layers: int, config: EngineConfig, log) -> None:
    """Read one pattern in a child process (vLLM's state and the hook stay there) into `path`."""
    log(f"reading where vLLM-CPU's graph stores the stream ({family}, {layers} layers, {config.to_json()}): "
        "a compile up to its graph, once per model depth and configuration")
    proc = subprocess.run([sys.executable, "-m", "patches.engine_table", "--read-stream", family, "--layers",
                           str(layers), "--config", config.to_json(), "--json", f"{path}.part"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise _stream_refused(lines[-1].removeprefix("patches.engine_table: ") if lines else
                              f"the read failed (exit {proc.returncode})")
    os.replace(f"{path}.part", path)  # complete or absent: a killed read leaves no pattern behind


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m patches.engine_table",
                                description="The rounding table vLLM as installed compiles to, and the target it equals.")
    p.add_argument("--config", help=f"engine config as JSON (keys: {', '.join(EngineConfig.__dataclass_fields__)}); "
                                    f"default: ${ENGINE_CONFIG_ENV}, else vLLM's defaults on this machine")
    p.add_argument("--read", choices=tuple(FAMILY_VALUES), help="read one family's table in this process (no cache)")
    p.add_argument("--read-stream", choices=tuple(FAMILY_VALUES),
                   help="read where one family's graph stores the stream, per layer, in this process (no cache)")
    p.add_argument("--layers", type=int, default=4, help="with --read-stream: the model's depth (default 4)")
    p.add_argument("--json", help="with --read or --read-stream: write what was read here")
    args = p.parse_args(argv)
    try:
        config = EngineConfig.parse(args.config) if args.config is not None else EngineConfig.from_env()
        if args.read_stream:
            pattern = read_stream_pattern(args.read_stream, args.layers, config)
            if args.json:
                Path(args.json).write_text(json.dumps({
                    "family": args.read_stream, "layers": args.layers, "config": json.loads(config.to_json()),
                    "vllm": vllm_version(), "torch": torch.__version__, "stores_stream": pattern}, indent=1))
            print(json.dumps(pattern))
            return 0
        if args.read:
            table = read_stores(args.read, config)
            if args.json:
                Path(args.json).write_text(json.dumps({"family": args.read, "config": json.loads(config.to_json()),
                                                       "vllm": vllm_version(), "stores": table}, indent=1))
            print(json.dumps(table, indent=1))
            return 0
        target = auto_target(config)
    except ValueError as err:
        print(f"patches.engine_table: {err}", file=sys.stderr)
        return 2
    print(f"engine: {target.engine}")
    for value, stored in target.stores.items():
        print(f"  {value:26s} {'stored as BF16' if stored else 'kept in FP32'}")
    print(f"target: {target.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
