"""The user's checkpoint: checked before any engine starts, and read tensor by tensor."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

import patches
from patches.registry import FAMILIES

from diagnose.errors import DiagnoseError

INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"


def supported() -> str:
    """The architectures the alignment patches cover, from their own registry."""
    return ", ".join(f"{family.prefix}ForCausalLM (model_type {name})" for name, family in FAMILIES.items())


def check(path: str | Path):
    """The checkpoint's transformers config, or a DiagnoseError naming what is wrong: not a directory, no
    config.json, no safetensors weights, or an architecture or setting the patches do not cover."""
    path = Path(path)
    if not path.is_dir():
        raise DiagnoseError(f"{path}: not a directory (a Hugging Face checkpoint directory is expected)")
    if not (path / "config.json").exists():
        raise DiagnoseError(f"{path}: no config.json, so not a Hugging Face checkpoint directory")
    if not ((path / SINGLE).exists() or (path / INDEX).exists()):
        raise DiagnoseError(f"{path}: no {SINGLE} or {INDEX} (safetensors weights are needed)")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # a broken or unknown config.json: say which file and why
        raise DiagnoseError(f"{path}/config.json does not load: {type(err).__name__}: {first_line(err)}") from None
    if config.model_type not in FAMILIES:
        raise DiagnoseError(f"{path}: model_type {config.model_type!r} "
                            f"({', '.join(getattr(config, 'architectures', None) or ['?'])}) is not covered by the "
                            f"alignment patches; supported: {supported()}")
    with torch.device("meta"):  # the layers' classes and settings, without memory for the weights
        model = AutoModelForCausalLM.from_config(config)
    try:
        patches.check_model(model)
    except patches.UnsupportedModelError as err:
        raise DiagnoseError(f"{path}: {first_line(err)}") from None
    return config


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def tensor_files(path: str | Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it (one file, or an index of shards)."""
    path = Path(path)
    if (path / INDEX).exists():
        return {k: path / v for k, v in json.loads((path / INDEX).read_text())["weight_map"].items()}
    with safe_open(path / SINGLE, "pt") as f:
        return {k: path / SINGLE for k in f.keys()}


class Tensors:
    """The checkpoint's tensors by name, read on demand (one shard file open at a time)."""

    def __init__(self, path: str | Path):
        self.files = tensor_files(path)

    def names(self) -> list[str]:
        return list(self.files)

    def get(self, name: str) -> torch.Tensor:
        with safe_open(self.files[name], "pt") as f:
            return f.get_tensor(name)
