"""Which rollout engine a local cell runs on, starting it, and the trainer's GEMM that goes with it
(docs/running.md: "The rollout engine: vLLM, or the local model of it"). The resolved engine, and the
vLLM compilation config an ablation sets, are part of a cell's identity (`identity`)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

from transformers import Qwen2Config, Qwen3Config

from localrl import gemm_match, vllm_support
from localrl.engine.engine import Engine
from localrl.vllm_engine import VllmEngine, environment_defaults
from patches import engine_table
from patches.targets import TARGETS
from rla.config import ConfigError

# The rig's vLLM engine is vLLM's CPU build: cells side by side on one GPU would each claim most of its
# memory, and that path is untested. On a GPU, the probe (`--engine vllm`) and verlrun use a GPU vLLM.
RIG_VLLM_ON_CPU_ONLY = ("the rig runs vLLM's CPU build only (LOCALRL_DEVICE is not cpu); on a GPU, "
                        "`python -m studies run probe --engine vllm` and the verl backend use your vLLM")


@functools.cache
def vllm_unavailable(device_type: str = "cpu") -> str | None:
    """Why vLLM cannot be the engine on `device_type` here (None: it can): on a CPU `vllm_support`'s checks;
    then that vLLM imports and runs on that device."""
    if device_type == "cpu":
        reason = vllm_support.unavailable_reason()
        if reason is not None:
            return reason
    elif importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    environment_defaults()  # read when vLLM is imported (its logging level)
    try:  # vLLM: optional, and whether it imports is what this finds out
        from vllm import LLM  # noqa: F401
        from vllm.platforms import current_platform
    except Exception as err:  # any import failure means it cannot run here; the reason is shown
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"vLLM is installed but does not import: {type(err).__name__}: {first}"
    found = current_platform.device_type or "none"
    if found != device_type:
        return f"this vLLM runs on {found!r} and the rig on {device_type!r} (LOCALRL_DEVICE)"
    return None


def vllm_build() -> tuple[str, str]:
    import vllm  # vLLM: optional, asked only where a cell runs on it
    from vllm.platforms import current_platform

    return vllm.__version__, current_platform.device_type


def default_target(name: str, engine_platform: str) -> str:
    """The alignment target an engine rounds like: for vLLM, the named target whose table equals the one
    read off its graph as this rig compiles it; the local engine (a model of vLLM's GPU graph): vllm."""
    if name != "vllm":
        return "vllm"
    table = engine_table.auto_target(engine_table.EngineConfig(device=engine_platform))
    named = table.name.removeprefix("auto:")
    if named not in TARGETS:
        raise ConfigError(f"engine.target = 'auto': vLLM's graph stores a table no named target has ({table.stores}); "
                          f"allowed: name one of {', '.join(TARGETS)} in engine.target")
    return named


def resolve(settings: dict, device_type: str, log=lambda msg: print(msg, file=sys.stderr, flush=True),
            compilation: dict | None = None, ablation: str = "none") -> dict:
    """The cell's engine from its (checked) `engine` settings, `auto` resolved; `compilation`: the vLLM
    compilation_config entries of the cell's `ablation`."""
    requested, reason = settings["name"], None
    if requested == "local":
        name, version, engine_platform = "local", None, device_type
    else:
        reason = RIG_VLLM_ON_CPU_ONLY if device_type != "cpu" else vllm_unavailable(device_type)
        if reason is None:
            name, (version, engine_platform) = "vllm", vllm_build()
        elif requested == "vllm":
            raise ConfigError(f"engine.name = 'vllm' but vLLM cannot run here: {reason}; "
                              "allowed here: local, or auto (vllm where it runs, else local)")
        else:
            name, version, engine_platform = "local", None, device_type
            log(f"engine auto -> local: {reason}")
    if compilation and name != "vllm":
        raise ConfigError(f"ablation {ablation!r} compiles vLLM with {compilation}, but this cell's engine is "
                          f"{name}" + (f" ({reason})" if reason else "") + "; allowed: engine.name vllm or auto "
                          "where vLLM runs")
    target = settings["target"]
    if target == "auto":
        target = default_target(name, engine_platform)  # what aligned regions would round like (none here)
    out = {"name": name, "target": target, "version": version, "platform": engine_platform,
           "kv_cache_gib": settings["kv_cache_gib"], "requested": requested}
    if compilation:
        out["compilation_config"] = compilation
    if name == "local" and requested == "auto":
        out["why_local"] = reason
    return out


def vllm_shape_problem(arch: str, hidden_size: int, heads: int, head_dim: int | None) -> str | None:
    """Why vLLM's CPU build would refuse this model shape (None: it takes it)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # vLLM: optional, asked only for its cells

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if arch == "qwen2" and head_dim is not None and head_dim * heads != hidden_size:
        return (f"head_dim = {head_dim}, but vLLM's Qwen2 derives head_dim = hidden_size // num_attention_heads "
                f"= {hidden_size // heads}: keep hidden_size = num_attention_heads x head_dim")
    size = head_dim if head_dim is not None else hidden_size // heads
    if size not in supported:
        return f"head_dim {size}: vLLM's CPU attention supports head sizes {supported}"
    return None


def check_shape(engine_cell: dict, model: str, spec: dict) -> None:
    if engine_cell["name"] != "vllm" or engine_cell["platform"] != "cpu":
        return
    base = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[spec["arch"]]()  # transformers' defaults for unset keys
    value = {k: spec.get(k, getattr(base, k, None)) for k in ("hidden_size", "num_attention_heads", "head_dim")}
    problem = vllm_shape_problem(spec["arch"], value["hidden_size"], value["num_attention_heads"], value["head_dim"])
    if problem:
        raise ConfigError(f"model_specs.{model}: {problem}; or run it on engine: local")


def identity(engine_cell: dict) -> dict:
    """What of the resolved engine a cell's results depend on."""
    keys = ("name", "target", "version", "platform", "compilation_config")
    return {k: engine_cell[k] for k in keys if k in engine_cell}


def describe(engine_cell: dict) -> str:
    if engine_cell["name"] == "vllm":
        what = f"vLLM {engine_cell['version']} in process ({engine_cell['platform']})"
        if engine_cell.get("compilation_config"):
            what += f" compiled with {engine_cell['compilation_config']}"
    else:
        what = "local (localrl/engine, the suite's model of vLLM's GPU graph)"
        if engine_cell.get("why_local"):
            what += f"; auto chose it: {engine_cell['why_local']}"
    return f"engine {what}; trainer target {engine_cell['target']}"


def start(engine_cell: dict, model_dir: str | Path, tokenizer, hf_config, dtype, seed: int, log=print):
    if engine_cell["name"] == "local":
        return Engine(hf_config, tokenizer.eos_token_id, tokenizer.pad_token_id, dtype=dtype)
    return VllmEngine(model_dir, tokenizer.eos_token_id, tokenizer.pad_token_id, dtype=dtype, seed=seed,
                      kv_cache_gib=engine_cell["kv_cache_gib"], compilation_config=engine_cell.get("compilation_config"),
                      log=log)


def trainer_gemm(engine, model_dir: str | Path, hf_config, dtype, device="cpu", log=print) -> str:
    """The shared FP32 kernel with the local engine; with vLLM, the candidate equal to its GEMM layers."""
    if getattr(engine, "name", "local") != "vllm":
        return "fp32"
    found = gemm_match.match(engine, model_dir, bool(getattr(hf_config, "tie_word_embeddings", False)), dtype,
                             device)
    log(found.describe())
    return found.choice
