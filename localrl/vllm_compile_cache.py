"""Two patches of vLLM, so that the suite's many engine starts reuse what an earlier start compiled
(docs/running.md, "Make targets"). Nothing the engine computes changes: the same generated code runs.

1. **One Inductor cache, shared.** vLLM points TORCHINDUCTOR_CACHE_DIR at each compile's own folder,
   unconditionally, so the same kernels are built again in every folder. Inductor keys kernels and graphs
   by their source, flags and configuration, so a shared cache hands a compile only what it would build.
2. **A saved compile that loads on the CPU.** Loading one calls `finalize_loading` on the compiled
   function, a method of vLLM's own compile backend only; vLLM-CPU compiles with Inductor as
   torch.compile's backend, so every load fails (a warning) and every start compiles again. The patch
   gives such a function a no-op `finalize_loading`: Inductor's function is complete once loaded. The
   weights are graph inputs, so a saved model runs another checkpoint of the same configuration
   (tests/test_vllm_engine.py: bit for bit).

Checked against vllm-cpu 0.32.0 with torch 2.13.0 (vllm/compilation/decorators.py
`_try_load_aot_compiled_fn`, compiler_interface.py `InductorAdaptor.initialize_cache`); on another release
neither patch is applied.
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
    """Apply both patches (idempotent; before the engine starts); returns the shared Inductor cache, or None
    where vLLM's release is not one checked here."""
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
