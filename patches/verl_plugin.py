"""verl entry point: `actor_rollout_ref.model.external_lib=patches.verl_plugin` (docs/patches.md: "Using
them with verl": the variables it reads and how to pass them to Ray's workers).

verl imports `external_lib` wherever it builds a model config (verl 0.9.1: the TaskRunner, each FSDP worker,
the vLLM rollout server, the agent-loop workers), so this module runs in each of them and logs which process
it is in. A bad value raises here, at import, so a misconfigured run fails before training starts.
"""

import logging
import os
import socket

import patches
from patches import compile as compiled_layers
from rla.names import IMPL_ENV, REGIONS_ENV, TARGET_ENV, TREATMENTS_ENV, WORKER_TREATMENTS

_spec = os.environ.get(REGIONS_ENV, "")
_target = os.environ.get(TARGET_ENV, "") or patches.DEFAULT_TARGET
_impl = os.environ.get(IMPL_ENV, "") or "auto"
_treatments = os.environ.get(TREATMENTS_ENV, "")
TREATMENTS = tuple(t.strip() for t in _treatments.split(",") if t.strip())
_unknown = [t for t in TREATMENTS if t not in WORKER_TREATMENTS]
if _unknown:
    raise ValueError(f"{TREATMENTS_ENV}={_treatments!r}: unknown worker treatment(s) {_unknown}; allowed: "
                     f"{', '.join(WORKER_TREATMENTS)} (fp16, tis and mis are verl settings: verlrun writes them)")
try:
    ACTIVE = patches.apply(_spec, target=_target, impl=_impl)
except ValueError as err:
    raise ValueError(f"{REGIONS_ENV}={_spec!r}, {TARGET_ENV}={_target!r}, {IMPL_ENV}={_impl!r}: {err}") from None
COMPILED = compiled_layers.compile_on_build() if "compile" in TREATMENTS else []


def _process() -> str:
    """Which verl process this is: the Ray actor's class name where Ray knows one, else the command."""
    try:
        import ray  # here: verl's Ray, absent in a plain process

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            actor = ctx.get_actor_name() or getattr(ctx, "get_actor_class_name", lambda: None)()
            if actor:
                return f"ray actor {actor}"
            return "ray driver" if ctx.worker.mode == ray.SCRIPT_MODE else "ray worker"
    except Exception:  # Ray absent or not started: a plain process
        pass
    return "process"


_table = patches.active_table()
logging.getLogger(__name__).warning(
    "rounding alignment [%s, pid %d on %s]: %s=%r -> aligned regions: %s (target %s: %s; stored as BF16: %s; impl %s); "
    "%s=%r -> decoder layers compiled on build: %s",
    _process(), os.getpid(), socket.gethostname(), REGIONS_ENV, _spec, ", ".join(sorted(ACTIVE)) or "none (stock)",
    _table.name, _table.engine, ", ".join(v for v, stored in _table.stores.items() if stored), _impl,
    TREATMENTS_ENV, _treatments, ", ".join(COMPILED) or "none",
)
