"""The settings both sides are compared under (`Setting`, `probe_settings`), the training side's numerics
under one (`numerics`) and the loop over them (`run_settings`): the probe (both engines), the scaling
study, the gradient probe and the GPU check."""

from __future__ import annotations

import contextlib
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
    """One configuration of both sides: the aligned regions, the RMSNorm summation order, decoder
    layers compiled or not, the dtype both sides compute in, the engine build the regions round like
    (`target`), and verl's rollout-correction preset of the loss (`correction`: read by the gradient
    probe; a forward does not see it)."""

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
    """Every subset of the regions rounding like `target`, all + engine order, then (with `other`, the
    other target) every subset with rmsnorm rounding like it - the targets differ only in where the
    residual stream is stored - and the treatments."""
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
    """The training side under `setting` inside the block: its regions rounding like its target, the
    norm's summation order, its decoder layers compiled (`compile`); the previous state after it."""
    with patches.aligned(setting.regions, target=setting.target, reduction=setting.reduction):
        if setting.compiled:  # the forward each layer has under these regions
            compiled_layers.compile_layers(model)
        try:
            yield model
        finally:
            if setting.compiled:
                compiled_layers.uncompile_layers(model)


def run_settings(settings: list[Setting], sides, step: Callable, log=print,
                 describe: Callable = lambda result: "") -> dict[str, float]:
    """The loop over settings: for each setting its sides in its dtype (`sides.get(dtype)`: a
    studies._shared.sides.Sides, or a dict {dtype: (training model, engine side)}), `step(setting,
    train_model, engine_side)` called under the setting's numerics, and one progress line
    (`describe(step's result)`). Returns each setting's seconds."""
    seconds = {}
    for i, setting in enumerate(settings, 1):
        start = time.perf_counter()
        model, engine_side = sides.get(setting.dtype)
        with numerics(model, setting):
            result = step(setting, model, engine_side)
        seconds[setting.name] = round(time.perf_counter() - start, 2)
        log(f"[{i}/{len(settings)}] {setting.name:26s} {describe(result)} ({seconds[setting.name]:.1f} s)")
    return seconds
