"""Step 1: the engine's loaded weights against the checkpoint's, tensor by tensor. No alignment of where
values are rounded can fix a weight that differs, so a difference stops the diagnosis.

Each engine parameter is read back from the engine's loaded model. vLLM merges projections (its model
class's `packed_modules_mapping`: q/k/v into qkv_proj, gate/up into gate_up_proj): a merged parameter is
compared with the checkpoint's tensors concatenated in that order. Where vLLM's CPU build has handed a
linear layer's weight to a prepacked GEMM (oneDNN, or its AMX kernel) and left an empty parameter, the
weight is read through that GEMM: the layer applied to identity rows gives W^T exactly (each output is one
product w * 1 plus exact zeros). A weight neither way can read is listed as unreadable.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from diagnose.checkpoint import Tensors

READ_PARAMETER, READ_GEMM, UNREADABLE = "parameter", "through its GEMM (identity input)", "unreadable"
MISSING = "not in the checkpoint"
IDENTITY_ROWS = 1024  # identity rows per GEMM call: bounds the memory of a read-back


@dataclass
class Comparison:
    table: pd.DataFrame  # one row per engine tensor: name, checkpoint tensors, how read, equal, differing, max_abs

    @property
    def differing(self) -> pd.DataFrame:
        return self.table[self.table["equal"] == False]  # noqa: E712 (None: not compared)

    @property
    def unreadable(self) -> pd.DataFrame:
        return self.table[self.table["read"] == UNREADABLE]


def sources(name: str, packed: dict[str, list[str]]) -> list[str]:
    """The checkpoint tensors an engine parameter holds, in vLLM's concatenation order."""
    module, _, kind = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    if leaf in packed:
        return [f"{parent}.{part}.{kind}" for part in packed[leaf]]
    return [name]


def read_through_gemm(layer, width: int, dtype: torch.dtype) -> torch.Tensor | None:
    """W (out, in) of a linear layer whose weight is prepacked, from its own GEMM on identity rows."""
    method = getattr(layer, "quant_method", None)
    if method is None:
        return None
    parts = []
    with torch.inference_mode():
        for lo in range(0, width, IDENTITY_ROWS):
            eye = torch.zeros(min(IDENTITY_ROWS, width - lo), width, dtype=dtype)
            eye[torch.arange(eye.shape[0]), torch.arange(lo, lo + eye.shape[0])] = 1
            out = method.apply(layer, eye, bias=None)
            parts.append((out[0] if isinstance(out, tuple) else out).float())
    return torch.cat(parts).T


def engine_value(model, name: str, parameter: torch.Tensor, width: int | None) -> tuple[torch.Tensor | None, str]:
    """(the parameter's values, how they were read)."""
    if parameter.numel() > 0:
        return parameter.detach().float().cpu(), READ_PARAMETER
    if width is None or not name.endswith(".weight"):
        return None, UNREADABLE
    layer = model.get_submodule(name.rpartition(".")[0])
    value = read_through_gemm(layer, width, parameter.dtype)
    return (value, READ_GEMM) if value is not None else (None, UNREADABLE)


def padded_vocab(model, name: str, value: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether `value` is an embedding or LM head whose extra rows are vLLM's vocabulary padding."""
    layer = model.get_submodule(name.rpartition(".")[0])
    return (hasattr(layer, "org_vocab_size") and value.ndim == 2 and value.shape[1:] == expected.shape[1:]
            and value.shape[0] > expected.shape[0] == layer.org_vocab_size)


def compare(engine, checkpoint_dir, progress=None) -> Comparison:
    """Every parameter of the engine's loaded model against the checkpoint, cast to the engine's dtype
    (what loading it must give); and the checkpoint tensors the engine holds none of."""
    model = engine.loaded_model()
    packed = getattr(type(model), "packed_modules_mapping", {}) or {}
    tensors = Tensors(checkpoint_dir)
    tied = bool(getattr(model.config, "tie_word_embeddings", False)) if hasattr(model, "config") else False
    rows, used = [], set()
    parameters = list(model.named_parameters(remove_duplicate=False))
    for name, parameter in parameters:
        names = sources(name, packed)
        if tied and name == "lm_head.weight" and name not in tensors.files:
            names = ["model.embed_tokens.weight"]  # a tied head is the embedding
        used.update(names)
        row = {"tensor": name, "checkpoint": ", ".join(names), "shape": "x".join(map(str, parameter.shape)),
               "dtype": str(parameter.dtype).removeprefix("torch.")}
        if any(n not in tensors.files for n in names):
            rows.append({**row, "read": MISSING, "equal": False, "differing": None, "max_abs": None,
                         "missing": ", ".join(n for n in names if n not in tensors.files)})
            continue
        expected = torch.cat([tensors.get(n).to(parameter.dtype) for n in names]).float()
        width = expected.shape[1] if expected.ndim == 2 else None
        value, how = engine_value(model, name, parameter, width)
        if value is not None and padded_vocab(model, name, value, expected):
            value = value[:expected.shape[0]]  # vLLM pads the vocabulary rows to a multiple of its own
        if value is None:
            rows.append({**row, "read": how, "equal": None, "differing": None, "max_abs": None, "missing": ""})
        elif value.shape != expected.shape:
            rows.append({**row, "read": how, "equal": False, "differing": None, "max_abs": None,
                         "missing": f"shape {tuple(value.shape)} in the engine, {tuple(expected.shape)} in the "
                                    "checkpoint"})
        else:
            # compared as values: +0 and -0 are one weight; NaN in both places is the same weight
            differs = (value != expected) & ~(value.isnan() & expected.isnan())
            rows.append({**row, "read": how, "equal": not bool(differs.any()), "differing": int(differs.sum()),
                         "max_abs": float((value - expected).abs()[differs].max()) if differs.any() else 0.0,
                         "missing": ""})
        if progress is not None:
            progress(1)
    for name in tensors.names():
        ignored = name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight")  # not weights vLLM keeps
        if name not in used and not ignored:
            rows.append({"tensor": "", "checkpoint": name, "shape": "", "dtype": "", "read": "not in the engine",
                         "equal": False, "differing": None, "max_abs": None, "missing": name})
    return Comparison(pd.DataFrame(rows))
