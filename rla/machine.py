"""What a benchmark ran on, written into every results/*.json: numbers depend on it."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> dict:
    """CPU model and count, the vector ISA ATen and Inductor use, torch and Python versions, load."""
    import torch  # here: rla imports without torch (the DAG and the reports use it)
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = pick_vec_isa()
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "aten_isa": torch.backends.cpu.get_cpu_capability(),
            "inductor_isa": str(isa) if isa else "scalar", "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "loadavg_1m": round(os.getloadavg()[0], 2)}
