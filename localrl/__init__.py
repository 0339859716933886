"""The CPU backend: a two-system RL rig (an Inductor-compiled engine and an HF + patches trainer).

RLA_INDUCTOR_SIMDLEN=256 (with ATEN_CPU_CAPABILITY=avx2) makes this machine generate the AVX2 code
another x86-64 machine would: the numbers of a run depend on the vector ISA (docs/numerics.md).
"""

import os

if os.environ.get("RLA_INDUCTOR_SIMDLEN"):
    import torch._inductor.config

    torch._inductor.config.cpp.simdlen = int(os.environ["RLA_INDUCTOR_SIMDLEN"])
