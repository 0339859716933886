"""The settings both sides are compared under, the training side's numerics under one and the loop over them."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

import patches
from patches import compile as compiled_layers
from rla import names
from rla.names import FORWARD_TREATMENTS, REGIONS, forward_treatment, subset_name
from studies._shared.names import ENGINE_ORDER, SUBSETS

GPU_TARGET = "vllm"  # the engine build a GPU engine's graph rounds like (the GPU check's target)


@dataclass(frozen=True)
class Setting:
    """One configuration of both sides; `correction`, verl's rollout-correction preset, is the gradient
    probe's (a forward does not see it)."""

    name: str
    regions: tuple[str, ...]
    reduction: str = "eager"
    compiled: bool = False
    dtype: torch.dtype = torch.bfloat16
    target: str = patches.DEFAULT_TARGET
    correction: str | None = None

    @property
    def treatment(self) -> str:
        return forward_treatment(self.compiled, self.dtype == torch.float16)

    @classmethod
    def of_ablation(cls, name: str) -> "Setting":
        """An ablation of the grid (rla.names.ABLATIONS) as the RL trainer runs it."""
        entry = names.ablation(name)
        return cls(name, entry.regions, entry.reduction, compiled=entry.compiled,
                   dtype=torch.float16 if entry.precision == "fp16" else torch.bfloat16,
                   correction=entry.rollout_correction)


def probe_settings(target: str = patches.DEFAULT_TARGET, other: str | None = None,
                   engine_order: bool = True) -> list[Setting]:
    """Every region subset at `target`, all + engine order, then at `other` the subsets with rmsnorm (the
    targets differ only in where the residual stream is stored), and the treatments."""
    settings = [Setting(subset_name(c), c, target=target) for c in SUBSETS]
    if engine_order:
        settings.append(Setting(ENGINE_ORDER, REGIONS, "inductor_cpu", target=target))
    if other is not None:
        settings += [Setting(f"{subset_name(c)}@{other}", c, target=other) for c in SUBSETS if "rmsnorm" in c]
        if engine_order:
            settings.append(Setting(f"{ENGINE_ORDER}@{other}", REGIONS, "inductor_cpu", target=other))
    return settings + [replace(Setting.of_ablation(t), target=target) for t in FORWARD_TREATMENTS]


@contextlib.contextmanager
def numerics(model, setting: Setting):
    """The training side under `setting` inside the block; the previous state after it."""
    with patches.aligned(setting.regions, target=setting.target, reduction=setting.reduction):
        if setting.compiled:  # the forward each layer has under these regions
            compiled_layers.compile_layers(model)
        try:
            yield model
        finally:
            if setting.compiled:
                compiled_layers.uncompile_layers(model)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_settings(settings: list[Setting], sides, step: Callable, log=print,
                 describe: Callable = lambda result: "") -> dict[str, float]:
    """`step(setting, train_model, engine_side)` under each setting's numerics, on `sides.get(dtype)` (a Sides,
    or a dict {dtype: pair}), with a progress line each (`describe(result)`); each setting's seconds."""
    seconds = {}
    for i, setting in enumerate(settings, 1):
        start = time.perf_counter()
        model, engine_side = sides.get(setting.dtype)
        with numerics(model, setting):
            result = step(setting, model, engine_side)
        seconds[setting.name] = round(time.perf_counter() - start, 2)
        log(f"[{i}/{len(settings)}] {setting.name:26s} {describe(result)} ({seconds[setting.name]:.1f} s)")
    return seconds
