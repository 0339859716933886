"""Per-GPU memory of a verl FSDP2 actor, and the token budget that fits a GPU (docs/running.md, "Memory plan",
says what each phase holds). An estimate written from what verl 0.9.1's FSDP engine keeps on a GPU, not a
measurement; the margin covers its error. `apply_fsdp2` (verl/utils/fsdp_utils.py:573) shards each decoder
layer, then the root module, which stays unsharded all step; one layer is gathered and the next prefetched."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
STRATEGY = "fsdp2"  # the layout this plan models; verlrun.overrides writes it for every cell


@dataclass(frozen=True)
class Shape:
    """The numbers of a Qwen2 / Qwen3 `config.json` that the estimate needs."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    head_dim: int | None = None
    attention_bias: bool = False  # Qwen2: q/k/v biases
    qk_norm: bool = False         # Qwen3: RMSNorm on q and k per head

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def layer_params(self) -> int:
        h, hd = self.hidden_size, self.head_size
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        attention = h * (q + 2 * kv) + q * h + ((q + 2 * kv) if self.attention_bias else 0)
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h + (2 * hd if self.qk_norm else 0)
        return attention + mlp + norms

    def embedding_params(self) -> int:
        """Input embedding plus the LM head unless tied (FSDP's root unit: unsharded all step)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def params(self) -> int:
        return self.num_hidden_layers * self.layer_params() + self.embedding_params() + self.hidden_size


# The paper grid's models, copied from each repository's config.json (the planner must work before
# any download). A model_specs entry may give its own `shape:` for other models.
KNOWN_SHAPES: dict[str, Shape] = {
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": Shape(1536, 28, 12, 2, 8960, 151936, attention_bias=True),
    "Qwen/Qwen2.5-Math-7B": Shape(3584, 28, 28, 4, 18944, 152064, attention_bias=True),
    "Qwen/Qwen3-1.7B": Shape(2048, 28, 16, 8, 6144, 151936, tie_word_embeddings=True, head_dim=128, qk_norm=True),
    "Qwen/Qwen3-8B": Shape(4096, 36, 32, 8, 12288, 151936, head_dim=128, qk_norm=True),
}


def shape_of(spec: dict) -> Shape:
    """The Shape of a model_specs entry: its own `shape:` or the table above by `repo` / `path`."""
    if spec.get("shape"):
        return Shape(**spec["shape"])
    for key in ("repo", "path"):
        if spec.get(key) in KNOWN_SHAPES:
            return KNOWN_SHAPES[spec[key]]
    raise ValueError(
        f"no shape known for model {spec.get('repo') or spec.get('path')!r}: add `shape:` (hidden_size, "
        f"num_hidden_layers, ...) to its model_specs entry; known: {', '.join(KNOWN_SHAPES)}"
    )


@dataclass(frozen=True)
class Setup:
    """The cell's hardware and the settings that change memory."""

    gpus: int = 8                      # FSDP shards over every GPU of the cell
    gpu_gib: float = 80.0
    margin: float = 0.15               # fraction of the GPU never planned for
    overhead_gib: float = 6.0          # CUDA context, NCCL buffers, allocator fragmentation, vLLM asleep
    vllm_utilization: float = 0.6      # rollout.gpu_memory_utilization
    entropy_chunk: int = 2048          # fsdp_config.entropy_from_logits_chunk_size (chunking on)

    def usable_bytes(self) -> float:
        return self.gpu_gib * GIB * (1 - self.margin) - self.overhead_gib * GIB


def _activations(shape: Shape, tokens: int) -> dict[str, float]:
    h, hd, i = shape.hidden_size, shape.head_size, shape.intermediate_size
    q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd
    kept = tokens * h * 2 * 2 * shape.num_hidden_layers  # the rmsnorm alignment's BF16 pair (2 x hidden) per layer
    # One layer recomputed in backward: norm outputs, q/k/v, attention and o-proj outputs, gate,
    # up, SiLU and product (BF16), and gradients of about the same size.
    one_layer = tokens * (4 * h + 2 * q + 2 * kv + 4 * i) * 2 * 2
    return {"checkpointed layer inputs": kept, "one recomputed layer + grads": one_layer}


def breakdown(shape: Shape, tokens: int, setup: Setup, phase: str) -> dict[str, float]:
    """Bytes per GPU, by component, at the peak of `phase` for a micro-batch of `tokens` tokens."""
    p, n, v = shape.params(), setup.gpus, shape.vocab_size
    resident = {"FP32 weights (sharded)": 4 * p / n, "AdamW m, v (sharded)": 8 * p / n}
    if phase == "rollout":
        return {**resident, "vLLM (weights, KV cache)": setup.vllm_utilization * setup.gpu_gib * GIB}
    layer = shape.layer_params()
    if phase == "old_log_prob":
        return {
            **resident,
            "BF16 embedding + LM head (unsharded)": 2 * shape.embedding_params(),
            "BF16 layers in flight (2)": 2 * 2 * layer,
            "one layer's activations": _activations(shape, tokens)["one recomputed layer + grads"] / 2,
            # BF16 logits, a temperature-scaled copy, an FP32 log-softmax temporary (the fallback
            # when flash-attn's cross entropy is absent), and FP32 chunks of softmax for entropy.
            "logits + log-prob temporaries": tokens * v * (2 + 2 + 4),
            "entropy chunk (FP32 x3)": min(tokens, setup.entropy_chunk) * v * 12,
        }
    if phase == "update":
        return {
            **resident,
            "FP32 grads (sharded)": 4 * p / n,
            # Root unit: BF16 params and their BF16 and FP32 (reduce) grads.
            "embedding + LM head (unsharded, + grads)": (2 + 2 + 4) * shape.embedding_params(),
            "BF16 layers in flight (2, + grads)": 2 * (2 + 2 + 4) * layer,
            **_activations(shape, tokens),
            # BF16 logits, scaled copy and gradient, one FP32 temporary of the same size.
            "logits + grad + temporaries": tokens * v * (2 + 2 + 2 + 4),
        }
    raise ValueError(f"unknown phase {phase!r}; allowed: rollout, old_log_prob, update")


PHASES = ("rollout", "old_log_prob", "update")


def peak_bytes(shape: Shape, tokens: int, setup: Setup) -> dict[str, float]:
    """Total bytes per GPU of each phase."""
    return {phase: sum(breakdown(shape, tokens, setup, phase).values()) for phase in PHASES}


def fits(shape: Shape, tokens: int, setup: Setup) -> bool:
    """Both passes fit the usable memory, and the rollout phase fits the whole GPU less the margin."""
    peaks = peak_bytes(shape, tokens, setup)
    rollout_ok = peaks["rollout"] <= setup.gpu_gib * GIB * (1 - setup.margin)
    return rollout_ok and max(peaks["old_log_prob"], peaks["update"]) <= setup.usable_bytes()


def plan_token_budget(shape: Shape, setup: Setup, min_tokens: int, step: int = 1024, cap: int = 65536) -> int:
    """The largest multiple of `step` (at most `cap`) that fits, and at least `min_tokens` (verl
    needs one whole sequence, prompt + response, in a micro-batch). Raises when none fits."""
    first = -(-min_tokens // step) * step
    if not fits(shape, first, setup):
        peaks = peak_bytes(shape, first, setup)
        raise ValueError(
            f"even {first} tokens per micro-batch (one {min_tokens}-token sequence) do not fit a "
            f"{setup.gpu_gib:g} GiB GPU with margin {setup.margin:g}: peaks "
            + ", ".join(f"{k} {b / GIB:.1f} GiB" for k, b in peaks.items())
            + f" against {setup.usable_bytes() / GIB:.1f} GiB usable; use more GPUs, a shorter response or a bigger GPU"
        )
    budget = first
    while budget + step <= cap and fits(shape, budget + step, setup):
        budget += step
    return budget
