"""The CPU backend: a two-system RL rig (an Inductor-compiled engine and an HF + patches trainer).

Its front door: the names below are what code outside `localrl` may use (studies never import a
submodule; tests/test_study_imports.py). They load on first use, so `import localrl` stays light (a
study's report imports no torch).

RLA_INDUCTOR_SIMDLEN=256 (with ATEN_CPU_CAPABILITY=avx2) makes this machine generate the AVX2 code
another x86-64 machine would: the numbers of a run depend on the vector ISA (docs/numerics.md).
"""

import importlib
import os

if os.environ.get("RLA_INDUCTOR_SIMDLEN"):
    import torch._inductor.config

    torch._inductor.config.cpp.simdlen = int(os.environ["RLA_INDUCTOR_SIMDLEN"])

# name -> the submodule that defines it ("submodule:its name there" where the two differ)
FRONT_DOOR = {
    # a rig for a setting, and one RL step of it
    **dict.fromkeys(("Rig", "build_rig", "rl_step", "train_cell", "PromptSampler", "decode_responses"), "run"),
    # the training side: score a batch, one step and its gradient
    **dict.fromkeys(("Batch", "Trainer", "sequence_inputs", "correct_rollout", "rollout_correction_config",
                     "policy_loss"), "trainer"),
    **dict.fromkeys(("compute_copy", "to_bf16_fsdp_style"), "models"),
    **dict.fromkeys(("mismatch_metrics",), "metrics"),
    # the engines: start one, sample with it
    **dict.fromkeys(("Engine", "Rollout", "prefill_mask", "left_pad", "pad"), "engine.engine"),
    **dict.fromkeys(("EngineModel",), "engine.model"),
    # vLLM's native formulas as the engine runs them (compiled alone by studies/torch_releases)
    **dict.fromkeys(("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_emb", "rope_cos_sin_cache"),
                    "engine.ops"),
    **dict.fromkeys(("VllmEngine", "request_seeds"), "vllm_engine"),
    **dict.fromkeys(("vllm_unavailable", "vllm_build", "vllm_shape_problem", "default_target"), "engines"),
    "resolve_engine": "engines:resolve",
    **dict.fromkeys(("unavailable_reason", "require_vllm"), "vllm_support"),
    **dict.fromkeys(("reuse_compiles",), "vllm_compile_cache"),
    **dict.fromkeys(("remember_isa_checks",), "inductor_isa_check"),
    # the kernels either side may run
    **dict.fromkeys(("use_local_kernels", "register_attention", "causal_mask", "may_attend", "CUDA_ATTENTION"),
                    "kernels"),
    **dict.fromkeys(("attention_isa", "EngineSteps", "fed_as", "stepwise", "use_engine_attention",
                     "use_engine_gemms"), "vllm_kernels"),
    **dict.fromkeys(("use_amx_rounding_attention",), "amx_attention"),
    "match_trainer_gemm": "gemm_match:match",
    **dict.fromkeys(("engine_gemms",), "gemm_match"),
    # named apart from their submodules: importing a submodule binds its name on the package
    "rig_device": "device:device",
    "warm_start": "warmstart:warmstart",
}
__all__ = sorted(FRONT_DOOR)


def __getattr__(name: str):
    if name not in FRONT_DOOR:
        raise AttributeError(f"module 'localrl' has no attribute {name!r}; its front door: {', '.join(__all__)}")
    module, _, defined_as = FRONT_DOOR[name].partition(":")
    return getattr(importlib.import_module(f"localrl.{module}"), defined_as or name)
