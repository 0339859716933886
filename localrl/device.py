"""Where the local rig runs: `LOCALRL_DEVICE` = cpu (default) or cuda[:N] (docs/running.md: "The local
rig"). A variable, not a config key, so the experiment configs stay identical across machines.
"""

from __future__ import annotations

import os

import torch

ENV = "LOCALRL_DEVICE"


def device() -> torch.device:
    name = os.environ.get(ENV, "cpu").strip() or "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{ENV}={name!r} is not a device this rig runs on; allowed: cpu, cuda, cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{ENV}={name!r} but torch {torch.__version__} sees no CUDA device; allowed here: cpu")
    return dev
