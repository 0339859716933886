"""verl entry point: `actor_rollout_ref.model.external_lib=patches.verl_plugin`.

verl imports this module in each FSDP worker before building the model. It reads RLA_REGIONS
(same syntax as `patches.apply`: "", "none", "rope", "all", "rope,swiglu", ...) and applies it;
RLA_IMPL (optional: auto, eager, fused; default auto = compiled region kernels on CUDA) chooses the
implementation. A bad value raises here, at import, so a misconfigured run fails before training
starts. Pass the variables to every Ray worker with
`+ray_kwargs.ray_init.runtime_env.env_vars.RLA_REGIONS=...`.
"""

import logging
import os

import patches

ENV_VAR = "RLA_REGIONS"
IMPL_VAR = "RLA_IMPL"

_spec = os.environ.get(ENV_VAR, "")
_impl = os.environ.get(IMPL_VAR, "") or "auto"
try:
    ACTIVE = patches.apply(_spec, impl=_impl)
except ValueError as err:
    raise ValueError(f"{ENV_VAR}={_spec!r}, {IMPL_VAR}={_impl!r}: {err}") from None

logging.getLogger(__name__).warning(
    "rounding alignment: %s=%r -> aligned regions: %s (impl %s)",
    ENV_VAR, _spec, ", ".join(sorted(ACTIVE)) or "none (stock)", _impl,
)
