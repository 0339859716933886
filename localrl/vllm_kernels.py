"""vLLM-CPU's own attention and GEMM kernels on a transformers model's forward: what they contribute to
the mismatch, forward only (vLLM has no backward for them; studies/leftover/page.md). The GEMMs are not
batch-invariant: with `steps=True`, inside `fed_as`, each row is computed in a product of as many rows as
the engine's step that computed it had. Checked against vllm-cpu 0.32.0 (v1/attention/backends/cpu_attn.py,
model_executor/layers/utils.py).
"""

from __future__ import annotations

import contextlib
import math
import platform
from dataclasses import dataclass

import torch
from torch import nn

from localrl.kernels import causal_mask, may_attend, register_attention

ENGINE_ATTENTION_NAME = "vllm_cpu_kernel"
BLOCK_SIZE = 128  # vLLM-CPU's default KV block (platforms/cpu.py); the kernel's result does not depend on it


def attention_isa() -> str:
    """The ISA vLLM-CPU's attention backend picks here for BF16 and head sizes that are multiples of 32
    (its `_get_attn_isa`, x86 only: on ARM it picks other kernels, not reproduced here)."""
    if platform.machine() != "x86_64":
        raise RuntimeError(f"vLLM-CPU's attention ISA on {platform.machine()} is not reproduced here; allowed: x86_64")
    # AMX tiles need the process's permission (Linux arch_prctl) before the first tile instruction;
    # vLLM's engine gets it from oneDNN's first AMX GEMM, a bare attention call would not have it.
    if torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx():
        return "amx"
    return "vec"


def engine_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention interface: vLLM-CPU's kernel, a causal prefill of each unpadded sequence."""
    from vllm import _custom_ops as ops  # vLLM: optional, its kernels called only where they run
    from vllm import envs

    batch, heads, tokens, head_dim = query.shape
    if attention_mask is not None:
        if not torch.equal(may_attend(attention_mask).expand(batch, 1, tokens, tokens)[:, 0],
                           causal_mask(tokens, tokens, None).expand(batch, -1, -1)):
            raise ValueError("engine_attention computes causal attention over whole sequences: "
                             "a padded or packed batch is not supported; score one sequence at a time")
    isa = attention_isa()
    kv_heads = key.shape[1]
    blocks = math.ceil(tokens / BLOCK_SIZE)
    outputs = []
    for b in range(batch):
        q, k, v = (t[b].transpose(0, 1).contiguous() for t in (query, key, value))  # (T, heads, D)
        cache = torch.zeros(blocks, kv_heads, 2 * BLOCK_SIZE, head_dim, dtype=query.dtype)
        key_cache, value_cache = cache.chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, torch.arange(tokens), isa)
        starts = torch.tensor([0, tokens], dtype=torch.int32)
        lengths = torch.tensor([tokens], dtype=torch.int32)
        schedule = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=1, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, seq_lens=lengths,
            dtype=query.dtype, query_start_loc=starts, causal=True, sliding_window_size=-1, isa=isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV)
        out = torch.empty(tokens, heads, head_dim, dtype=query.dtype)
        ops.cpu_attention_with_kv_cache(
            query=q, key_cache=key_cache, value_cache=value_cache, output=out, query_start_loc=starts,
            seq_lens=lengths, scale=float(module.scaling if scaling is None else scaling), causal=True,
            alibi_slopes=None, sliding_window=-1, block_table=torch.arange(blocks, dtype=torch.int32)[None],
            softcap=0.0, scheduler_metadata=schedule, s_aux=None)
        outputs.append(out)
    return torch.stack(outputs), None


def use_engine_attention(model: nn.Module) -> nn.Module:
    return register_attention(model, ENGINE_ATTENTION_NAME, engine_attention)


@dataclass(frozen=True)
class EngineSteps:
    """How the engine's steps fed one sequence's rows to its GEMMs: the first `prompt` rows in a prefill of
    `prefill_rows` rows, each later row (and every LM head row: one per request a step) in `decode_rows`."""

    prompt: int
    prefill_rows: int
    decode_rows: int

    def runs(self, rows: int, lm_head: bool) -> list[tuple[int, int, int]]:
        """(first row, end, the step's row count) of each run of a sequence's `rows` rows fed together."""
        first = 0 if lm_head else self.prompt
        prefill = [] if lm_head or not self.prompt else [(0, min(self.prompt, rows), self.prefill_rows)]
        return prefill + [(a, min(a + self.decode_rows, rows), self.decode_rows)
                          for a in range(first, rows, self.decode_rows)]


_steps: EngineSteps | None = None


@contextlib.contextmanager
def fed_as(steps: EngineSteps | None):
    """Within: `use_engine_gemms(model, steps=True)` feeds rows as `steps` (None: as one product)."""
    global _steps
    previous, _steps = _steps, steps
    try:
        yield
    finally:
        _steps = previous


def product(gemm, x: torch.Tensor, stepwise: bool, lm_head: bool = False) -> torch.Tensor:
    """`gemm(x)`, or with `stepwise` inside `fed_as`, each row of a sequence in a product of its engine step's
    row count (zero rows around it: a row's product does not depend on the others')."""
    if not stepwise or _steps is None:
        return gemm(x)
    rows = x.reshape(-1, x.shape[-1])
    out = []
    for first, end, size in _steps.runs(len(rows), lm_head):
        if end - first > size:
            raise ValueError(f"{end - first} rows cannot come from a step of {size}: {_steps}")
        padded = rows.new_zeros(size, rows.shape[-1])
        padded[:end - first] = rows[first:end]
        out.append(gemm(padded)[:end - first])
    return torch.cat(out).reshape(*x.shape[:-1], -1)


def _engine_gemm(linear: nn.Linear):
    """`linear`'s product as vLLM-CPU's GEMM computes it."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # vLLM: optional

    dispatch_cpu_unquantized_gemm(linear, remove_weight=False)
    return lambda rows: linear.cpu_linear(rows, linear.weight, linear.bias)


class _MergedProjections:
    """Several nn.Linear of the same input computed as one engine GEMM (vLLM's merged layers); each
    projection's forward returns its slice of the last input's product."""

    def __init__(self, linears: list[nn.Linear], stepwise: bool):
        biases = [lin.bias for lin in linears]
        merged = nn.Linear(linears[0].in_features, sum(lin.out_features for lin in linears),
                           bias=biases[0] is not None, dtype=linears[0].weight.dtype)
        with torch.no_grad():
            merged.weight.copy_(torch.cat([lin.weight for lin in linears]))
            if merged.bias is not None:
                merged.bias.copy_(torch.cat(biases))
        self.gemm, self.sizes, self.stepwise = _engine_gemm(merged), [lin.out_features for lin in linears], stepwise
        self.last_input, self.parts = None, None
        for i, lin in enumerate(linears):
            lin.forward = lambda x, i=i: self.part(x, i)

    def part(self, x: torch.Tensor, i: int) -> torch.Tensor:
        if x is not self.last_input:
            self.last_input = x
            self.parts = product(self.gemm, x, self.stepwise).split(self.sizes, -1)
        return self.parts[i]


def use_engine_gemms(model: nn.Module, steps: bool = False) -> nn.Module:
    """Route every nn.Linear of a Qwen2/Qwen3 transformers model through vLLM-CPU's GEMM, q/k/v and
    gate/up merged as vLLM merges them; with `steps`, fed as the engine's steps fed them (`fed_as`)."""
    attention_isa()  # the AMX permission, for SGL's AMX GEMM
    merged = set()
    for module in model.modules():
        for names in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            group = [getattr(module, n, None) for n in names]
            if all(isinstance(lin, nn.Linear) for lin in group):
                _MergedProjections(group, steps)
                merged.update(group)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module not in merged:
            module.forward = lambda x, gemm=_engine_gemm(module), head=name == "lm_head": product(gemm, x, steps, head)
    model.engine_gemms_stepwise = steps
    return model


def stepwise(model: nn.Module) -> bool:
    return getattr(model, "engine_gemms_stepwise", False)
