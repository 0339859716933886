"""The Hydra override list that turns one grid cell into a `verl.trainer.main_ppo` run.

Everything a cell needs is an explicit override (nothing left to verl's defaults where the
experiment depends on it), so the list in a cell's `config.yaml` is the whole story of the run.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import warnings
from pathlib import Path

import yaml

from rla import names
from rla.cells import Cell
from rla.config import RL, VERL, A, ConfigError, model_spec, rl_settings, verl_settings, verl_overrides
from rla.metricslog import RUNNING
from verlrun import memory, models

# verl imports this module wherever it builds a model config (`HFModelConfig.__post_init__`,
# verl/workers/config/model.py:149): the TaskRunner, each FSDP worker (before `from_pretrained`), the
# vLLM server and the agent-loop workers. It applies the alignment patches named by RLA_REGIONS
# (nothing for the `none` ablation) to transformers' classes, which only the FSDP workers' models use
# (vLLM runs its own model code), and the worker treatments named by RLA_TREATMENTS (`compile`).
PLUGIN_MODULE = "patches.verl_plugin"
# verl.platform: cpu. verl imports the modules VERL_USE_EXTERNAL_MODULES names inside `import verl`,
# in every process (verl/__init__.py); VERL_PLATFORM selects the platform that module registers.
CPU_SHIMS_MODULE = "verlrun.cpu_shims"
# Ray's scheduler gives each of verl's actors one logical CPU (TaskRunner, TransferQueue controller and
# storage, trainer worker, vLLM server, agent-loop and reward workers, load balancer); on a CPU the
# actual cores are shared by the OS, so the cell declares enough logical CPUs for all of them.
CPU_RAY_LOGICAL_CPUS = 16
ENV_PREFIX = "+ray_kwargs.ray_init.runtime_env.env_vars"
# The experiment's dtype, as verl's FSDP engine reads it (`fsdp_config.mixed_precision`, PrecisionType
# names). FP16 also turns on verl's ShardedGradScaler (loss scaling); FP32 gradients reduce either way.
FSDP_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}
# Attention of the training side: flash-attn 2 on GPUs (verl's default, workers/config/model.py:185);
# PyTorch's SDPA on a CPU (flash-attn has no CPU build).
ATTENTION = {"cuda": "flash_attention_2", "cpu": "sdpa"}


def hydra_value(value) -> str:
    """Format a Python value for a Hydra override; strings are quoted so commas, spaces and
    dots stay literal (an unquoted `a,b` would be read as a sweep)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return "'" + value.replace("'", "\\'") + "'"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as a Hydra override")


def cell_settings(cfg: dict, model: str, ablation: str | None = None) -> tuple[dict, dict]:
    """(rl, verl) settings of one model's cells, checked (`rla.config`); the `fp16` treatment sets
    `rl.dtype` (verl's FP16 mixed precision with loss scaling, and vLLM in FP16)."""
    local_only = names.local_only(ablation) if ablation is not None else ()
    if local_only:
        raise ConfigError(f"ablation {ablation!r} runs on the local backend only ({', '.join(local_only)}: "
                          f"{names.TREATMENTS[local_only[0]]})")
    rl = rl_settings(cfg, "verl", model)
    if ablation is not None and names.ablation(ablation).precision == "fp16":
        rl["dtype"] = "float16"
    return rl, verl_settings(cfg, model)


def worker_env(cell: Cell) -> dict[str, str]:
    """Environment every Ray worker (and the trainer actor, which owns the file logger) needs."""
    cfg, ablation = cell.cfg, cell.ablation
    repo_root = Path(__file__).resolve().parent.parent
    pythonpath = os.pathsep.join(p for p in (str(repo_root), os.environ.get("PYTHONPATH", "")) if p)
    verl = verl_settings(cfg, cell.model)
    env = {
        names.REGIONS_ENV: ",".join(names.regions_of(ablation)),
        names.TARGET_ENV: verl["target"],
        names.TREATMENTS_ENV: ",".join(t for t in names.treatments_of(ablation) if t in names.WORKER_TREATMENTS),
        "VERL_FILE_LOGGER_PATH": str(cell.out / RUNNING),  # metrics.jsonl: only once the cell finished
        # The patches package lives in this repository; workers on other nodes need it on the path.
        "PYTHONPATH": pythonpath,
        # Models are staged before the job (verlrun.models); nothing in a job talks to the Hub.
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    if verl["platform"] == "cpu":  # what verl's processes need on a CPU (nothing extra on GPUs)
        modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != CPU_SHIMS_MODULE]
        env.update({
            "VERL_USE_EXTERNAL_MODULES": ",".join([CPU_SHIMS_MODULE, *modules]),
            "VERL_PLATFORM": "cpu",
            # verl registers its FSDP engine for the devices cuda and npu only (workers/engine/fsdp/
            # transformer_impl.py:1143); verl's own switch picks it by that name (workers/engine/base.py:405).
            "VERL_ENGINE_DEVICE": "cuda",
            # Without it vLLM-CPU sizes its KV cache from the host's memory (vllm/platforms/cpu.py:324).
            "VLLM_CPU_KVCACHE_SPACE": str(verl["cpu_kv_cache_gib"]),
            # vLLM-CPU's default ("auto") pins its OpenMP threads to one logical CPU per core and reserves
            # others (vllm/utils/ompmultiprocessing.py); the cell's trainer and Ray share those cores.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        })
    wandb = cfg.get("wandb") or {}
    if wandb.get("enabled") and os.environ.get("WANDB_MODE", wandb.get("mode")):
        env["WANDB_MODE"] = os.environ.get("WANDB_MODE", wandb.get("mode"))
    return env


def memory_setup(cfg: dict, model: str) -> memory.Setup:
    """The memory plan's inputs for a model's cells. Every ablation of a model gets the same plan
    (the residual pair of the rmsnorm alignment counted for all), so cells differ only in alignment."""
    _, verl = cell_settings(cfg, model)
    return memory.Setup(
        gpus=verl["nnodes"] * verl["n_gpus_per_node"],
        gpu_gib=float(verl["gpu_memory_gib"]),
        margin=float(verl["memory_margin"]),
        vllm_utilization=float(verl["gpu_memory_utilization"]),
    )


def token_budget(cfg: dict, model: str) -> int:
    """Tokens per micro-batch and GPU (dynamic batch size), equal for the old-log-prob pass and the
    update: the configured number, or the largest that the memory plan fits ("auto")."""
    rl, _ = cell_settings(cfg, model)
    budget = rl["max_token_len_per_gpu"]
    longest = rl["max_prompt_length"] + rl["max_response_length"]
    if budget == "auto":
        return memory.plan_token_budget(memory.shape_of(model_spec(cfg, model, "verl")), memory_setup(cfg, model),
                                        longest)
    if budget < longest:  # an integer: rla.config checked it
        raise ValueError(
            f"{model}: max_token_len_per_gpu={budget!r}; allowed: 'auto' or an integer >= the longest "
            f"sequence ({longest} = max_prompt_length + max_response_length)"
        )
    return budget


def _batching(cfg: dict, model: str, rl: dict) -> dict:
    """Micro-batching of the update and of the log-prob passes (old policy; reference policy when
    there is one), kept equal (unequal micro-batches add a mismatch of their own): by tokens
    (use_dynamic_bsz) or by sequences."""
    dynamic = rl["use_dynamic_bsz"]
    per_gpu = token_budget(cfg, model) if dynamic else rl["micro_batch_size_per_gpu"]
    # verl runs a reference policy only for a KL term (`need_reference_policy`, verl/trainer/ppo/utils.py):
    # the KL loss here (use_in_reward is always off).
    sections = ("rollout", "ref") if rl["kl_coef"] > 0 else ("rollout",)
    size = "max_token_len_per_gpu" if dynamic else "micro_batch_size_per_gpu"
    return {A + "actor.use_dynamic_bsz": dynamic, **{A + f"{s}.log_prob_use_dynamic_bsz": dynamic for s in sections},
            A + f"actor.ppo_{size}": per_gpu, **{A + f"{s}.log_prob_{size}": per_gpu for s in sections}}


def _rollout_correction(ablation: str) -> dict:
    """verl's `algorithm.rollout_correction`: the fields of the ablation's preset at the preset's
    defaults (tis, mis), or correction off (rollout_is and rollout_rs null), written out either way.
    `loss_type` is read only in bypass mode (trainer/ppo/core_algos.py:2484), which no preset here
    uses; it is written only with bypass_mode on."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig  # verl: optional, read for its preset's fields

    preset = names.ablation(ablation).rollout_correction
    config = getattr(RolloutCorrectionConfig, preset)() if preset else RolloutCorrectionConfig(rollout_is=None)
    return {f"algorithm.rollout_correction.{f.name}": getattr(config, f.name)
            for f in dataclasses.fields(config)
            if not f.name.startswith("_") and (f.name != "loss_type" or config.bypass_mode)}


def _engine_compilation(ablation: str) -> dict:
    """The ablation's vLLM compilation_config entries (the engine-side fix, rla.names.ENGINE_KEEPS_CASTS),
    one override per leaf: verl passes engine_kwargs.vllm.compilation_config to vLLM as it is
    (workers/rollout/vllm_rollout/vllm_async_server.py, verl 0.9.1), adding its cudagraph mode."""
    def leaves(node: dict, path: str):
        for key, value in node.items():
            yield from leaves(value, f"{path}.{key}") if isinstance(value, dict) else [(f"{path}.{key}", value)]

    return {f"+{key}": value for key, value in
            leaves(names.ablation(ablation).engine_compilation or {}, _COMPILATION)}


def build_overrides(cell: Cell) -> list[str]:
    """All Hydra overrides for one cell (its paths absolute: Hydra changes the working directory of
    `main_ppo` to `hydra.run.dir`)."""
    cfg, model, ablation, seed = cell.cfg, cell.model, cell.ablation, cell.seed
    rl, verl = cell_settings(cfg, model, ablation)
    spec = model_spec(cfg, model, "verl")
    wandb = cfg.get("wandb") or {}
    loggers = ["console", "file"] + (["wandb"] if wandb.get("enabled") else [])
    kl_coef = float(rl["kl_coef"])

    settings = {
        # The settings of one verl key each, from their tables (rla.config); below, what is derived.
        **verl_overrides(rl, RL),
        **verl_overrides(verl, VERL),
        # GRPO on rule-based rewards, no critic, no KL in the reward.
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        **_rollout_correction(ablation),
        **_engine_compilation(ablation),
        "data.train_files": str(cell.data / "train.parquet"),
        "data.val_files": str(cell.data / "test.parquet"),
        "data.filter_overlong_prompts": True,
        "data.seed": seed,
        # The staged local copy (verlrun.models); verl would otherwise download in every rank.
        "actor_rollout_ref.model.path": str(models.local_path(cfg, model).resolve()),
        "actor_rollout_ref.model.external_lib": PLUGIN_MODULE,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        # Liger and fused kernels replace the very modules the patches align.
        "actor_rollout_ref.model.use_liger": False,
        "actor_rollout_ref.model.use_fused_kernels": False,
        **_batching(cfg, model, rl),
        "actor_rollout_ref.actor.use_kl_loss": kl_coef > 0,
        "actor_rollout_ref.actor.kl_loss_coef": kl_coef,
        "actor_rollout_ref.actor.data_loader_seed": seed,
        # What verl's FSDP engine reads for precision (`_build_fsdp_module`, workers/engine/fsdp/
        # transformer_impl.py:391): fp32 master weights; compute (params, autocast) in the experiment's
        # dtype. `fsdp_config.dtype` is not read there (nor anywhere) and is not written.
        "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision": {"param_dtype": FSDP_PRECISION[rl["dtype"]],
                                                                  "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        "actor_rollout_ref.rollout.dtype": rl["dtype"],
        # FSDP2 for every cell (verl's default is FSDP1 with use_orig_params false, under which
        # torch.compile of the `compile` treatment is unsupported; FSDP1 also refuses CPU modules with
        # sync_module_states). fsdp_config.seed is not set: verl reads it only with full_determinism.
        "actor_rollout_ref.actor.strategy": memory.STRATEGY,
        # Entropy (a metric here) in FP32 chunks instead of FP32 copies of all logits (memory plan).
        "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking": True,
        "actor_rollout_ref.rollout.name": "vllm",
        # The compiled engine path is the reference the training side is aligned to.
        "actor_rollout_ref.rollout.enforce_eager": False,
        # vLLM's processed logprobs include top-p/top-k, the trainer's do not: keep both off.
        "actor_rollout_ref.rollout.top_p": 1.0,
        "actor_rollout_ref.rollout.top_k": -1,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.seed": seed,
        # The V1 trainer samples tests with val_kwargs' temperature, top-p, top-k and n
        # (trainer/ppo/v1/agent_loop_tq.py:74); val_kwargs.do_sample is read by the legacy trainer only.
        "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
        "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
        "trainer.project_name": wandb.get("project", "rounding-alignment"),
        "trainer.experiment_name": cell.name,
        "trainer.logger": loggers,
        "trainer.default_local_dir": str(cell.out / "checkpoints"),
        "trainer.resume_mode": "auto",
        "trainer.total_training_steps": cell.steps,
        "trainer.test_freq": rl["test_every"] if rl["test_every"] > 0 else -1,
        "trainer.val_before_train": rl["test_every"] > 0,
        "+actor_rollout_ref.model.override_config.attn_implementation": ATTENTION[verl["platform"]],
    }
    if verl["platform"] == "cpu":
        # verlrun.cpu_shims: Ray hands out logical GPUs (`num_gpus`), since verl's resource pools count
        # GPUs; vLLM-CPU has no sleep mode (it needs CUDA's allocator: vllm/config/model.py:656), so verl
        # must neither sleep it nor free its cache.
        settings.update({
            "+ray_kwargs.ray_init.num_gpus": verl["nnodes"] * verl["n_gpus_per_node"],
            "ray_kwargs.ray_init.num_cpus": CPU_RAY_LOGICAL_CPUS,
            "+actor_rollout_ref.rollout.enable_sleep_mode": False,
            "actor_rollout_ref.rollout.free_cache_engine": False,
        })
    overrides = [f"{key}={hydra_value(value)}" for key, value in settings.items()]
    env = worker_env(cell)
    overrides += [f"{ENV_PREFIX}.{name}={hydra_value(value)}" for name, value in env.items()]
    # Escape hatches, applied last: experiment-wide, then per model.
    overrides += [str(o) for o in verl["overrides"]]
    overrides += [str(o) for o in spec.get("overrides") or []]
    if verl["target"] == "auto":  # the workers read the table of the engine these overrides configure
        overrides.append(f"{ENV_PREFIX}.{names.ENGINE_CONFIG_ENV}={hydra_value(rollout_engine_config(overrides))}")
    check_batch_invariance(overrides, ablation, dict(os.environ))
    return overrides


# verl keys that decide where the rollout engine rounds -> the engine config's key (patches.engine_table)
_ROLLOUT = A + "rollout."
_ENGINE_KEYS = {_ROLLOUT + "enforce_eager": "enforce_eager", _ROLLOUT + "tensor_model_parallel_size":
                "tensor_parallel_size", "trainer.device": "device"}
_COMPILATION = _ROLLOUT + "engine_kwargs.vllm.compilation_config"


# vLLM's batch-invariant mode: verl turns it on for `rollout.full_determinism` (VLLM_BATCH_INVARIANT=1,
# verl/trainer/main_ppo.py:47-49) and forwards the variable from the launching shell to every worker
# (trainer/constants_ppo.py:141). vLLM then runs RMSNorm and the linear layers through its own kernels
# (vllm/model_executor/determinism/batch_invariant.py; vLLM 0.34.0's lines below, the same kernels as
# 0.32.0's): no target describes where they round.
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
_FULL_DETERMINISM = _ROLLOUT + "full_determinism"
_BATCH_INVARIANT_WHY = (
    "it makes vLLM run another engine than the one the targets describe: RMSNorm through its Triton kernel "
    "(batch_invariant.py:1035-1083: 1/sqrt(mean + eps) over 1024-wide partial sums, one rounding after the "
    "weight; with the residual, the fused_add_rms_norm custom op, :1106-1113) instead of the compiled native "
    "formula (layers/layernorm.py:106-118), and the linear layers through a Triton persistent matmul "
    "(layers/linear.py:241-244; batch_invariant.py:49-136), with softmax, log_softmax and mean replaced too "
    "(:1443-1462), in vllm/model_executor/ of vLLM 0.34.0 (0.32.0: the same kernels)")


def _switched_on(key: str, value) -> bool:
    """Whether an override's value turns the mode on, as verl reads a bool and vLLM the variable
    (`bool(int(...))`, vllm/envs.py)."""
    if key == _FULL_DETERMINISM:
        return bool(value)
    try:
        return bool(int(value))
    except (TypeError, ValueError):
        return False


def batch_invariance_switch(overrides: list[str], environ: dict[str, str]) -> str | None:
    """The setting that turns on vLLM's batch-invariant mode for these overrides (the last override of
    a key wins, as in Hydra), or None."""
    env_key = f"{ENV_PREFIX.lstrip('+')}.{BATCH_INVARIANT_ENV}"
    final = {}
    for override in overrides:
        key, _, text = override.lstrip("+~").partition("=")
        if key in (_FULL_DETERMINISM, env_key):
            final[key] = (override, yaml.safe_load(text) if text and not override.startswith("~") else None)
    switches = [override for key, (override, value) in final.items() if _switched_on(key, value)]
    if _switched_on(BATCH_INVARIANT_ENV, environ.get(BATCH_INVARIANT_ENV)):
        switches.append(f"{BATCH_INVARIANT_ENV}={environ[BATCH_INVARIANT_ENV]} in the launching environment")
    return switches[0] if switches else None


def check_batch_invariance(overrides: list[str], ablation: str, environ: dict[str, str]) -> None:
    """Refuse vLLM's batch-invariant mode in a cell that aligns regions: they would be aligned to an engine
    that does not run."""
    regions = names.regions_of(ablation)
    switch = batch_invariance_switch(overrides, environ)
    if regions and switch:
        raise ConfigError(
            f"{switch}: verl's full_determinism turns on vLLM's batch-invariant mode ({BATCH_INVARIANT_ENV}=1), "
            f"which the aligned regions of ablation {ablation!r} ({', '.join(regions)}) cannot follow: "
            f"{_BATCH_INVARIANT_WHY}. Allowed: full_determinism and {BATCH_INVARIANT_ENV} off with aligned "
            "regions, or on with an ablation that aligns none")


def rollout_engine_config(overrides: list[str]) -> str:
    """The rollout engine's config as `target="auto"` reads it (JSON), from the cell's final overrides:
    the eager switch, tensor parallelism, device and `engine_kwargs.vllm.compilation_config`, whole or
    field by field; the last override of a key wins, as in Hydra."""
    config: dict = {"compilation_config": {}, "device": "cuda"}
    for override in overrides:
        key, _, text = override.lstrip("+~").partition("=")
        value = yaml.safe_load(text) if text else None
        if key in _ENGINE_KEYS:
            config[_ENGINE_KEYS[key]] = value
        elif key == _COMPILATION:
            config["compilation_config"] = dict(value or {})
        elif key.startswith(_COMPILATION + "."):
            *path, last = key[len(_COMPILATION) + 1:].split(".")
            node = config["compilation_config"]
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
    return json.dumps(config, sort_keys=True)


def run_dir_override(cell_dir: str | Path) -> str:
    """Where Hydra puts its own outputs (and chdirs to): inside the cell, not the repository."""
    return f"hydra.run.dir={hydra_value(str(Path(cell_dir).resolve() / 'hydra'))}"


def compose(overrides: list[str]):
    """Compose verl's `ppo_trainer` config with the overrides, as `main_ppo` would, and run
    verl's own `validate_config` on it. Raises on an unknown or mistyped key or an
    inconsistent batch setup; needs verl and Hydra, not a GPU."""
    import verl  # verl and its Hydra: optional, needed only to check a composed config
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")  # what `main_ppo` composes from
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = hydra_compose(config_name="ppo_trainer", overrides=list(overrides))
    checked = [config]
    if config.actor_rollout_ref.actor.use_dynamic_bsz:
        # verl skips its batch-size checks with dynamic batches, but the batch is still split over
        # the GPUs: check the same config with one-sequence micro-batches too.
        static = copy.deepcopy(config)
        with open_dict(static):
            static.actor_rollout_ref.actor.update(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=1)
            for section in ("rollout", "ref"):
                static.actor_rollout_ref[section].update(log_prob_use_dynamic_bsz=False,
                                                         log_prob_micro_batch_size_per_gpu=1)
        checked.append(static)
    with warnings.catch_warnings():
        # GRPO runs without a critic on purpose; verl warns about that on every check.
        warnings.filterwarnings("ignore", message="Disabled critic")
        for each in checked:
            validate_config(each, use_reference_policy=need_reference_policy(each), use_critic=need_critic(each))
    return config
