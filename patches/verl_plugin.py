"""verl entry point: `actor_rollout_ref.model.external_lib=patches.verl_plugin`.

verl imports this module in each FSDP worker before building the model. It reads RLA_REGIONS
(same syntax as `patches.apply`: "", "none", "rope", "all", "rope,swiglu", ...) and applies it;
RLA_IMPL (optional: auto, eager, fused; default auto = compiled region kernels on CUDA) chooses the
implementation; RLA_TREATMENTS (optional, comma-separated: compile) switches on the treatments that
act in the workers - `compile` compiles each Qwen2/Qwen3 decoder layer as it is built
(patches/compile.py), since verl's FSDP engine has no switch that compiles the model. A bad value
raises here, at import, so a misconfigured run fails before training starts. Pass the variables to
every Ray worker with `+ray_kwargs.ray_init.runtime_env.env_vars.RLA_REGIONS=...`.
"""

import logging
import os

import patches
from patches import compile as compiled_layers
from rla.names import IMPL_ENV, REGIONS_ENV, TREATMENTS_ENV, WORKER_TREATMENTS

_spec = os.environ.get(REGIONS_ENV, "")
_impl = os.environ.get(IMPL_ENV, "") or "auto"
_treatments = os.environ.get(TREATMENTS_ENV, "")
TREATMENTS = tuple(t.strip() for t in _treatments.split(",") if t.strip())
_unknown = [t for t in TREATMENTS if t not in WORKER_TREATMENTS]
if _unknown:
    raise ValueError(f"{TREATMENTS_ENV}={_treatments!r}: unknown worker treatment(s) {_unknown}; allowed: "
                     f"{', '.join(WORKER_TREATMENTS)} (fp16, tis and mis are verl settings: verlrun writes them)")
try:
    ACTIVE = patches.apply(_spec, impl=_impl)
except ValueError as err:
    raise ValueError(f"{REGIONS_ENV}={_spec!r}, {IMPL_ENV}={_impl!r}: {err}") from None
COMPILED = compiled_layers.compile_on_build() if "compile" in TREATMENTS else []

logging.getLogger(__name__).warning(
    "rounding alignment: %s=%r -> aligned regions: %s (impl %s); %s=%r -> decoder layers compiled on build: %s",
    REGIONS_ENV, _spec, ", ".join(sorted(ACTIVE)) or "none (stock)", _impl,
    TREATMENTS_ENV, _treatments, ", ".join(COMPILED) or "none",
)
