"""Preflight of the second GPU check: the versions, which of SDPA's attention kernels run here, whether
cuBLAS may reduce BF16 GEMMs in reduced precision, and whether this torch's Inductor keeps an explicit
BF16 cast inside a compiled norm.

The norm probe is `(x * rsqrt(v)).to(bf16) * w`, the RMSNorm tail as transformers writes it: compiled by
Inductor against eager, bit for bit. Equal: the cast is kept (the normalised value is rounded before the
weight multiplies it); differing: Inductor dropped it (it elides a downcast that is only upcast again,
unless `emulate_precision_casts` is set), so a compiled norm rounds once where eager rounds twice.

    python3 -m studies.gpu_check.check_preflight --device cuda --out preflight.json
"""

from __future__ import annotations

import importlib.metadata
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from studies.gpu_check.check_common import Report, bit_compare, step_args

PACKAGES = ("torch", "triton", "transformers", "numpy", "pandas", "liger_kernel")
NORM_ROWS, NORM_WIDTH = 256, 1536  # one R1-Distill-Qwen-1.5B hidden state per row


def versions(device: torch.device) -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found.update(python=sys.version.split()[0], cuda=torch.version.cuda,
                 cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    if device.type == "cuda":
        found["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return found


def sdpa_backends(device: torch.device) -> dict[str, str]:
    """Each SDPA backend: "runs", or the first line of why not, on a small causal BF16 call."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 128, 128, generator=gen).to(device, torch.bfloat16) for _ in range(3))
    out = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out[backend.name.lower()] = "runs"
        except (RuntimeError, NotImplementedError, ValueError) as error:  # its reason is the answer
            out[backend.name.lower()] = "does not run: " + str(error).strip().splitlines()[0][:200]
    return out


def reduced_precision(device: torch.device) -> dict:
    matmul = torch.backends.cuda.matmul
    return {"allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
            "allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
            "applies": "cuBLAS GEMMs" if device.type == "cuda" else "no: a CUDA flag, read on a CPU"}


def norm_tail(x: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * torch.rsqrt(v)).to(torch.bfloat16) * w


def norm_probe(device: torch.device) -> dict:
    """The compiled norm tail against eager, and against the tail with no cast (one rounding at the end):
    which of the two the compiled kernel computes."""
    gen = torch.Generator().manual_seed(1)
    x = (4 * torch.randn(NORM_ROWS, NORM_WIDTH, generator=gen)).to(device)
    v = x.pow(2).mean(-1, keepdim=True) + 1e-6
    w = (1 + 0.2 * torch.randn(NORM_WIDTH, generator=gen)).to(device, torch.bfloat16)
    eager = norm_tail(x, v, w)
    torch._dynamo.reset()
    compiled = torch.compile(norm_tail, fullgraph=True)(x, v, w)
    uncast = (x * torch.rsqrt(v) * w.float()).to(torch.bfloat16)
    vs_eager, vs_uncast = bit_compare(compiled, eager), bit_compare(compiled, uncast)
    verdict = ("keeps the cast" if vs_eager["bit_equal"] else
               "drops the cast (rounds once, as the uncast tail)" if vs_uncast["bit_equal"] else
               "differs from both the cast and the uncast tail")
    return {"expression": "(x * rsqrt(v)).to(bf16) * w", "rows": NORM_ROWS, "width": NORM_WIDTH,
            "emulate_precision_casts": getattr(torch._inductor.config, "emulate_precision_casts", None),
            "compiled_vs_eager": vs_eager, "compiled_vs_uncast": vs_uncast,
            "eager_vs_uncast": bit_compare(eager, uncast), "verdict": verdict}


def main(argv=None) -> int:
    args, device = step_args(__doc__, argv)
    report = Report(args, "preflight", device)
    report.add("versions", versions(device))
    report.add("sdpa_backends", sdpa_backends(device))
    report.add("reduced_precision", reduced_precision(device))
    probe = norm_probe(device)
    report.add("norm_cast", probe)
    print(f"versions {report.parts['versions']}\nSDPA {report.parts['sdpa_backends']}\n"
          f"norm probe: Inductor {probe['verdict']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
