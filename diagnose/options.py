"""The diagnosis's options, their defaults, and the check that refuses a bad one before anything loads."""

from __future__ import annotations

import patches
from patches.targets import TARGETS

from diagnose import verdict
from diagnose.errors import DiagnoseError

TARGET_CHOICES = ("auto", *TARGETS)
TRACE_PROMPTS = 4  # prompts traced layer by layer unless told: the tap copies every layer's q/k/v/out
DEFAULTS = dict(prompts=None, threshold=verdict.DEFAULT_THRESHOLD, target="auto", n_prompts=32, max_new_tokens=64,
                seed=0, small_batch=1, trace_prompts=None, reduction="eager", position_bin=16, kv_cache_gib=1,
                engine_model=None)


def positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DiagnoseError(f"{name} {value!r}: allowed: a positive integer")
    return value


def check_options(o: dict) -> dict:
    """Every option checked before anything loads; a DiagnoseError names the first bad one."""
    o = {**DEFAULTS, **o}
    unknown = sorted(set(o) - set(DEFAULTS) - {"checkpoint", "out"})
    if unknown:
        raise DiagnoseError(f"unknown option(s) {', '.join(unknown)}; allowed: {', '.join(DEFAULTS)}")
    o["threshold"] = verdict.check_threshold(o["threshold"])
    if not (o["target"] in TARGET_CHOICES or isinstance(o["target"], patches.targets.Target)):
        raise DiagnoseError(f"target {o['target']!r}; allowed: {', '.join(TARGET_CHOICES)}")
    if o["reduction"] not in patches.REDUCTIONS:
        raise DiagnoseError(f"reduction {o['reduction']!r}; allowed: {', '.join(patches.REDUCTIONS)}")
    for name in ("n_prompts", "max_new_tokens", "small_batch", "position_bin", "kv_cache_gib"):
        positive(name, o[name])
    if o["trace_prompts"] is None:
        o["trace_prompts"] = min(TRACE_PROMPTS, o["n_prompts"])
    if not isinstance(o["trace_prompts"], int) or not 0 <= o["trace_prompts"] <= o["n_prompts"]:
        raise DiagnoseError(f"trace_prompts {o['trace_prompts']!r}; allowed: 0..n_prompts ({o['n_prompts']})")
    if o["small_batch"] > o["n_prompts"]:
        raise DiagnoseError(f"small_batch {o['small_batch']} exceeds n_prompts {o['n_prompts']}; allowed: "
                            f"1..{o['n_prompts']}")
    return o
