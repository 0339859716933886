"""Model shapes: Qwen-proportioned ones at any width, the paper grid's models and a shape's HF config."""

from __future__ import annotations

from dataclasses import dataclass

from tinyqwen import models

ARCHS = ("qwen2", "qwen3")


@dataclass(frozen=True)
class Shape:
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float = 1e6

    @property
    def parameters(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.intermediate) + 2 * self.vocab * self.hidden


# Qwen ratios: head_dim 128 once the width allows it (hidden/4 below); Qwen2.5-1.5B has 12 query heads
# for 2 KV heads (6:1) and an intermediate of 5.83 x hidden; Qwen3-1.7B 2:1 and 3 x hidden.
KV_RATIO = {"qwen2": 6, "qwen3": 2}
FFN_RATIO = {"qwen2": 8960 / 1536, "qwen3": 3.0}


def qwen_shape(arch: str, hidden: int, layers: int, vocab: int) -> Shape:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; allowed: {list(ARCHS)}")
    if hidden < 16 or hidden % 16:
        raise ValueError(f"hidden {hidden} must be a multiple of 16 (>= 16)")
    head_dim = min(128, hidden // 4)
    heads = hidden // head_dim
    kv = max(1, heads // KV_RATIO[arch])
    while heads % kv:
        kv -= 1
    inter = int(round(FFN_RATIO[arch] * hidden / 64)) * 64
    return Shape(arch, layers, hidden, heads, kv, head_dim, inter, vocab)


def shape_of(arch: str, dims: dict, vocab: int, rope_theta: float = 1e6) -> Shape:
    """A Shape from a transformers-style spec (experiments' model_specs, tinyqwen.models.REAL_SHAPES)."""
    return Shape(arch, dims["num_hidden_layers"], dims["hidden_size"], dims["num_attention_heads"],
                 dims["num_key_value_heads"], dims["head_dim"], dims["intermediate_size"], vocab, rope_theta)


# The paper grid's four models (experiments/paper.yaml): (arch, vocabulary, RoPE theta) of their Hub
# config.json, widths from REAL_SHAPES; weights random.
PAPER_SHAPES = {name: shape_of(arch, models.REAL_SHAPES[name], vocab, theta) for name, (arch, vocab, theta) in {
    "r1-distill-qwen-1.5b": ("qwen2", 151936, 1e4),
    "qwen2.5-math-7b": ("qwen2", 152064, 1e4),
    "qwen3-1.7b": ("qwen3", 151936, 1e6),
    "qwen3-8b": ("qwen3", 151936, 1e6),
}.items()}
# a dry run's shape: the widths of check_fused.py and bench_regions.py --quick (each region kernel compiles once)
QUICK_SHAPES = {"tiny-qwen3": Shape("qwen3", 2, 256, 4, 2, 64, 512, 512, 1e6)}


def hf_config(shape: Shape, max_positions: int):
    return models.qwen_config(shape.arch, shape.vocab, shape.rope_theta, max_positions, hidden_size=shape.hidden,
                              num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                              num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                              intermediate_size=shape.intermediate, pad_token_id=0, eos_token_id=None,
                              bos_token_id=None)
