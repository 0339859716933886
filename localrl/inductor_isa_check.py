"""One patch of torch's Inductor: a process does not load again, in a child Python, a vector-ISA check
library that an earlier process on this machine loaded already.

Before its first CPU compile Inductor starts, in every process, a child Python per vector ISA that loads
a small check library (`VecISA._probe_load`): about ten children per process on an AVX-512 + AMX CPU. The
patch keeps each successful load as an empty marker beside the library (`<library>.loaded`) and skips the
child where it finds one. The library's name hashes its source, compiler, ISA flags and torch's version;
a failed load leaves no marker. Which ISA Inductor picks is unchanged.

Checked against torch 2.13.0 (`VecISA._probe_load(self, output_path) -> bool`); on another release the
patch is not applied.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

CHECKED = ("2.13.0",)
MARKER = ".loaded"


def remember_isa_checks() -> bool:
    """Apply the patch (idempotent; before the first compile); False where torch's release is not checked."""
    import torch  # here: importing this module loads no torch (the studies' command line imports it)
    from torch._inductor import cpu_vec_isa

    if torch.__version__.split("+")[0] not in CHECKED:
        return False
    stock = cpu_vec_isa.VecISA._probe_load
    if getattr(stock, "remembers", False):
        return True

    @functools.wraps(stock)
    def probe_load(self, output_path: str) -> bool:
        marker = Path(f"{output_path}{MARKER}")
        if marker.exists():
            return True
        loaded = stock(self, output_path)
        if loaded:
            with contextlib.suppress(OSError):  # a read-only cache: checked again next time
                marker.touch()
        return loaded

    probe_load.remembers = True
    cpu_vec_isa.VecISA._probe_load = probe_load
    return True
