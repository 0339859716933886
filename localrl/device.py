"""Where the local rig runs: `LOCALRL_DEVICE` = cpu (default) or cuda[:N].

On CUDA both sides use cuBLAS bf16 GEMMs and one attention kernel (`localrl.kernels`), and the engine's
elementwise pieces compile to Triton through Inductor, as vLLM's default path does. The variable
(not a config key) keeps the experiment configs identical across machines; every stage logs it.
Sampling draws on the CPU from a CPU generator on every device, so seeds mean the same everywhere.
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
