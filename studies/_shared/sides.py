"""One forward per side, with its residual stream recorded, both sides' models per dtype (`Sides`) and the
fixed responses they score."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from localrl import Engine, EngineModel, Rollout, compute_copy, prefill_mask, use_local_kernels
from patches import compile as compiled_layers
from patches.stream import hidden_state
from studies._shared.scored import Layout
from studies._shared.settings import Setting, numerics


@dataclass
class Forward:
    logprobs: Tensor         # (B, T-1) fp32: logprob of token t+1 given tokens <= t
    residuals: list[Tensor]  # bf16 residual stream (B, T, hidden): embedding output, then each layer's
    logits: Tensor           # (B, T, vocab) bf16


def next_token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """Raw logprobs (temperature 1) as both sides compute them: fp32 log-softmax of bf16 logits."""
    ids = ids.to(logits.device)
    return torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)


def engine_forward(engine_model, ids: Tensor, mask: Tensor, positions: Tensor) -> Forward:
    engine_model.layer_outputs = []
    try:
        logits = engine_model(ids, positions, prefill_mask(mask.bool()))
        layers = engine_model.layer_outputs
    finally:
        engine_model.layer_outputs = None
    embed = engine_model.weights["embed"][ids.to(engine_model.device)]
    # The engine records each layer's fp32 sum; its residual stream stores that sum in bf16.
    return Forward(next_token_logprobs(logits, ids), [embed] + [h.to(embed.dtype) for h in layers], logits)


@torch.no_grad()
def train_forward(model, ids: Tensor, mask: Tensor, positions: Tensor, setting: Setting | None = None) -> Forward:
    """The training side's forward under `setting` (None: as the model is). Layer outputs from hooks: HF's
    last `hidden_states` entry is the final norm's output."""
    if setting is not None:
        with numerics(model, setting):
            return train_forward(model, ids, mask, positions)
    hidden, dtype = model.config.hidden_size, model.get_input_embeddings().weight.dtype
    recorded: list[Tensor] = []

    def record(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        # With the rmsnorm region a layer returns its fp32 stream, bit-cast: recorded rounded to the
        # activation dtype, as the engine's pieces store the residual.
        recorded.append(hidden_state(out, hidden).to(dtype))

    layers = compiled_layers.decoder_layers(model)
    handles = [layer.register_forward_hook(record) for layer in layers]  # outside a compiled layer
    handles.append(model.get_input_embeddings().register_forward_hook(record))
    try:
        device = next(model.parameters()).device
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                       use_cache=False).logits
    finally:
        for h in handles:
            h.remove()
    # hooks fire in execution order: the embedding first, then each decoder layer
    if len(recorded) != len(handles):
        raise RuntimeError(f"recorded {len(recorded)} residual-stream values, expected {len(handles)}")
    return Forward(next_token_logprobs(logits, ids), recorded, logits)


def on_cpu(forward: Forward) -> Forward:
    """`forward` with its logprobs on the CPU, where a layout's masks are."""
    forward.logprobs = forward.logprobs.cpu()
    return forward


def setting_forwards(dtype, train_model, engine_model, layout: Layout, refs: dict) -> tuple[Forward, Forward]:
    """The training side's forward of `layout` (under the numerics in force) and the engine's at `dtype`, computed
    once per dtype into `refs`; logprobs on the CPU."""
    inputs = layout.ids, layout.mask, layout.positions
    if dtype not in refs:
        refs[dtype] = on_cpu(engine_forward(engine_model, *inputs))
    return on_cpu(train_forward(train_model, *inputs)), refs[dtype]


def strict_recompiles() -> None:
    """Past dynamo's recompile limit (each new shape or dtype) a piece would silently run eagerly (other
    rounding): raise the limit, and fail instead of falling back."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
    torch._dynamo.config.fail_on_recompile_limit_hit = True


def sample_rollout(engine, prompts: list[list[int]], max_new_tokens: int, seed: int) -> Rollout:
    """The fixed responses: sampled once from the engine at temperature 1."""
    return engine.generate(prompts, max_new_tokens, temperature=1.0, generator=torch.Generator().manual_seed(seed))


class Sides:
    """Both sides' models per compute dtype: the given BF16 pair, others built on first use from the master
    weights (as the `fp16` rig's engine gets the trainer's FP16 copy)."""

    def __init__(self, train_model, engine: Engine, master=None):
        self.train = {torch.bfloat16: train_model}
        self.engine = {torch.bfloat16: engine.model}
        self.master, self.max_positions = master, engine.max_positions

    def get(self, dtype: torch.dtype):
        if dtype not in self.train:
            if self.master is None:
                raise ValueError(f"a {dtype} setting needs the fp32 master weights (run_probe(..., master=...))")
            self.train[dtype] = use_local_kernels(compute_copy(self.master, dtype))
            self.engine[dtype] = EngineModel(self.master.config, self.max_positions, dtype, device=self.master.device)
            self.engine[dtype].load_hf_weights(self.master.state_dict())
        return self.train[dtype], self.engine[dtype]
