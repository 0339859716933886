"""The fused implementation: each region's forward and backward function compiled by Inductor
(docs/numerics.md and docs/patches.md: "Fused kernels"). The functions are the eager implementation's and
hold no BF16 intermediate, so Inductor has no cast to elide: the rounding locations are the same by
construction; reductions may sum in the kernel's own order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

_compiled: dict[Callable, Callable] = {}
# Graphs one region function may compile, one per feature width and tensor rank: past torch's default, 8
# (a process that runs several models), Dynamo would run it eagerly - other kernels, other last bits. Within
# these calls the limit is this, and reaching it is an error, never a quiet fallback (docs/patches.md).
RECOMPILE_LIMIT = 64
RUNS: Counter = Counter()  # function name -> calls of its compiled graph (tests check that fused code ran)


def compiled(fn: Callable) -> Callable:
    """`fn` compiled as a single graph (a graph break is an error), once per feature width: the last dim
    of every tensor argument is static, so the kernels vectorize over it with no symbolic tails (docs/patches.md:
    "Fused kernels"); every leading dim (tokens, heads, batch) is dynamic, so q and k, with their different
    GQA head counts, and every sequence length share one kernel."""
    if fn not in _compiled:
        graph = torch.compile(fn, fullgraph=True)

        def run(*args):
            for a in args:
                if isinstance(a, torch.Tensor):
                    for dim in range(a.dim() - 1):
                        torch._dynamo.maybe_mark_dynamic(a, dim)
                    if a.dim():  # static even after a new width (automatic dynamic would relax it)
                        torch._dynamo.mark_static(a, a.dim() - 1)
            RUNS[fn.__name__] += 1
            if torch.compiler.is_compiling():  # inlined into an enclosing graph: compiles nothing of its own
                return graph(*args)
            # set and restored by hand: `config.patch` costs ~3x as much (20 us more a call on a CPU host),
            # and every call pays it (RoPE alone runs four per layer and step: q and k, forward and backward)
            config = torch._dynamo.config
            saved = config.recompile_limit, config.fail_on_recompile_limit_hit
            config.recompile_limit, config.fail_on_recompile_limit_hit = max(RECOMPILE_LIMIT, saved[0]), True
            try:
                return graph(*args)
            finally:
                config.recompile_limit, config.fail_on_recompile_limit_hit = saved

        run.graph = graph
        _compiled[fn] = run
    return _compiled[fn]

