"""What the probes read: a model of the config or a checkpoint directory, checked before any engine
starts, and its prompts (a verl-schema test split or the generated task, in the model's chat template)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import patches
from rla import layout
from rla.config import ConfigError, model_spec, rl_settings
from tinyqwen.data import load_split, split_frame
from tinyqwen.task import TaskSettings, render_prompt


@dataclass
class Inputs:
    model_dir: Path
    tokenizer: object
    prompts: list[list[int]]  # token ids
    max_new_tokens: int
    rl: dict | None  # the config's rl settings of the model; None for a checkpoint directory


def probe_inputs(args, cfg: dict | None, checkpoint_tokens: int | None = None) -> Inputs:
    """What the probe reads, every option checked before any engine starts; a checkpoint directory's responses
    are `checkpoint_tokens` long unless --max-new-tokens says otherwise."""
    if cfg is None:
        rl, data_dir, model_dir, tokens = None, args.data, Path(args.model), checkpoint_tokens
    else:
        rl, data_dir, model_dir = config_model(args, cfg)  # an unknown model fails before any work
        tokens = rl["max_response_length"]
    n_prompts = positive("--n-prompts", args.n_prompts)
    max_new_tokens = positive("--max-new-tokens", tokens if args.max_new_tokens is None else args.max_new_tokens)
    messages = task_messages(data_dir, n_prompts, args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return Inputs(model_dir, tokenizer, chat_prompts(tokenizer, messages), max_new_tokens, rl)


def config_model(args, cfg: dict) -> tuple[dict, Path, Path]:
    """(rl settings, data dir, warm-started model dir) of `--model`, a model of the config."""
    model_spec(cfg, args.model, "local")
    model_dir = Path(args.model_dir or layout.model_dir(cfg, args.model))
    if not (model_dir / "config.json").exists():
        raise ConfigError(f"model {model_dir} not found: run `python -m localrl warmstart --model {args.model} "
                          f"--out {model_dir}` first, or pass --model-dir")
    return rl_settings(cfg, "local", args.model), Path(args.data or layout.data_dir(cfg)), model_dir


def check_checkpoint(path: str | Path):
    """The checkpoint's transformers config, or a ConfigError in one line naming what is wrong: not a
    directory, no config.json, no weights, or layers the alignment patches do not cover."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"--model {path}: not a directory (a Hugging Face checkpoint directory is expected)")
    if not (path / "config.json").exists():
        raise ConfigError(f"--model {path}: no config.json, so not a Hugging Face checkpoint directory")
    if not any((path / name).exists() for name in ("model.safetensors", "model.safetensors.index.json")):
        raise ConfigError(f"--model {path}: no model.safetensors or model.safetensors.index.json (safetensors "
                          "weights are needed)")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # a broken or unknown config.json: say which file and why
        raise ConfigError(f"--model {path}: config.json does not load: {type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}") from None
    with torch.device("meta"):
        try:
            model = AutoModelForCausalLM.from_config(config)
        except Exception as err:
            raise ConfigError(f"--model {path}: transformers cannot build a causal LM from it "
                              f"({config.model_type}): {type(err).__name__}") from None
    try:
        patches.check_model(model)
    except patches.UnsupportedModelError as err:
        raise ConfigError(f"--model {path}: {err}") from None
    return config


def chat_prompts(tokenizer, messages: list[list[dict]]) -> list[list[int]]:
    """Token ids of each chat: the checkpoint's own chat template, else the task's (the tiny models')."""
    if getattr(tokenizer, "chat_template", None):
        return [list(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))
                for m in messages]
    return [tokenizer(render_prompt(m))["input_ids"] for m in messages]


def task_messages(data_dir: str | Path | None, n: int, seed: int) -> list[list[dict]]:
    """`n` chats, a seeded choice in file order, from `data_dir`'s test.parquet or the generated task's."""
    if data_dir is None:
        test = split_frame(TaskSettings(n_test=max(n, 200)), "test")
    else:
        try:
            test = load_split(data_dir, "test")
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from None
    if n > len(test):
        raise ConfigError(f"--n-prompts {n} exceeds the {len(test)} prompts of the test split; allowed: 1..{len(test)}")
    index = np.sort(np.random.default_rng(seed).choice(len(test), size=n, replace=False))
    return [list(p) for p in test.iloc[index]["prompt"]]


def positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value
