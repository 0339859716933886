"""Comparing bf16 tensors: counts of differing elements and distances in units in the last place."""

import torch

from benchmarks.stock import stock_rms_norm  # noqa: F401  (the tests' name for it)


def max_ulp(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want| in bf16 ulps of max(|want|, RMS of `want`). The floor at the tensor's RMS makes
    the unit scale with the magnitude of the computation: a value that cancels to near zero (a rotation
    output, a gradient summed over tokens) is measured in ulps of the values it was computed from, not of
    its own tiny exponent, where one flipped fp32 bit upstream spans thousands of its ulps."""
    if not got.numel():
        return 0.0
    g, w = got.double(), want.double()
    scale = torch.maximum(w.abs(), w.pow(2).mean().sqrt())
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - 7)  # bf16: 8 significant bits
    return float(((g - w).abs() / ulp).max())


def inductor_isa() -> str:
    """The vector ISA Inductor generates CPU code for here ("scalar" when it does not vectorize)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = pick_vec_isa()
    return str(isa) if isa else "scalar"


def vllm_runs_avx512_kernels() -> bool:
    """Whether vLLM's CPU build runs its AVX-512 kernels here, attention included: vllm.platforms.cpu.import_kernels
    picks the library by this check of the CPU's own flags, which ATEN_CPU_CAPABILITY (`make test-isa`) does not
    change, and vLLM's CPU attention (vllm/v1/attention/backends/cpu_attn.py, `_get_attn_isa`, 0.32.0) takes
    its AMX kernel instead of the AVX-512 one for BF16 wherever the CPU has AMX tiles. The AVX-512 attention
    equals FP32 attention of the BF16 q/k/v rounded once, the training side's; the AVX2 library's differs from
    it on 44-50% of the elements (by one BF16 step: its sums in another order, tests/test_vllm_kernels.py),
    and on an AMX machine `all` left k3 2-3x below stock instead of 80-600x (studies/vllm_alignment):
    mismatches of their own that no region removes."""
    return torch.cpu._is_avx512_supported() and not vllm_runs_amx_attention()


def vllm_runs_amx_attention() -> bool:
    """vLLM's CPU attention runs its AMX kernel for BF16 here (`_get_attn_isa`: AMX tiles, block size a
    multiple of 32, which vLLM's CPU default is)."""
    return torch.cpu._is_amx_tile_supported()
