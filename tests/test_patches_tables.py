"""A target is a table of where values are stored: a table that stores a value inside a region gets it
rounded there, as eager code rounds it. With every value stored, each region - and a whole model under
every spec - computes what stock transformers computes, bit for bit."""


import pytest
import torch
import torch.nn.functional as F

import patches
from patches import rmsnorm, rope, swiglu
from patches.targets import EAGER
from tests.model_factory import tiny_model, to_bf16_fsdp_style
from tests.numerics import stock_rms_norm

BF16 = torch.bfloat16


def _bf16(*shape, seed, scale=3.0):
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(BF16)


def _cos_sin(tokens, head_dim, seed=0):
    angles = torch.arange(tokens)[:, None] * (1e4 ** -(torch.arange(0, head_dim, 2) / head_dim))[None]
    angles = torch.cat((angles, angles), dim=-1)  # HF's layout: duplicated halves
    return angles.cos().to(BF16)[None, None], angles.sin().to(BF16)[None, None]


def stock_rope(x, cos, sin):
    """transformers' `q * cos + rotate_half(q) * sin` (modeling_qwen2.apply_rotary_pos_emb) in BF16."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@pytest.fixture
def inputs():
    x = _bf16(2, 4, 96, 64, seed=1)
    cos, sin = _cos_sin(96, 64)
    return x, cos, sin


def test_rope_with_its_products_stored_is_stocks(inputs):
    x, cos, sin = inputs
    with patches.aligned("rope", target=EAGER, impl="eager"):
        assert torch.equal(rope.Rope.apply(x, cos, sin), stock_rope(x, cos, sin))
    with patches.aligned("rope", target="vllm", impl="eager"):  # the engine's table: not stock's
        assert not torch.equal(rope.Rope.apply(x, cos, sin), stock_rope(x, cos, sin))


def test_qk_norm_and_rope_with_every_value_stored_are_stocks(inputs):
    x, cos, sin = inputs
    weight = (1 + 0.3 * torch.randn(64, generator=torch.Generator().manual_seed(2))).to(BF16)
    stock = stock_rope(stock_rms_norm(x, weight, 1e-6), cos, sin)
    with patches.aligned("rope", target=EAGER, impl="eager"):
        assert torch.equal(rope.NormRope.apply(x, weight, cos, sin, 1e-6), stock)
    with patches.aligned("rope", target="vllm", impl="eager"):
        assert not torch.equal(rope.NormRope.apply(x, weight, cos, sin, 1e-6), stock)


def test_swiglu_with_silu_stored_is_stocks():
    gate, up = _bf16(300, 512, seed=3), _bf16(300, 512, seed=4)
    with patches.aligned("swiglu", target=EAGER, impl="eager"):
        assert torch.equal(swiglu.swiglu(gate, up), F.silu(gate) * up)
    with patches.aligned("swiglu", target="vllm", impl="eager"):
        assert not torch.equal(swiglu.swiglu(gate, up), F.silu(gate) * up)


def test_norms_with_their_values_stored_are_stocks():
    x, residual = _bf16(64, 256, seed=5), _bf16(64, 256, seed=6)
    weight = (1 + 0.3 * torch.randn(256, generator=torch.Generator().manual_seed(7))).to(BF16)
    with patches.aligned("rmsnorm", target=EAGER, impl="eager"):
        assert torch.equal(rmsnorm.rms_norm(x, weight, 1e-6), stock_rms_norm(x, weight, 1e-6))
        normed, total = rmsnorm.add_rms_norm(x, residual, weight, 1e-6)
        assert torch.equal(total.to(BF16), x + residual) and torch.equal(total, (x + residual).float())
        assert torch.equal(normed, stock_rms_norm(x + residual, weight, 1e-6))
    with patches.aligned("rmsnorm", target="vllm", impl="eager"):
        normed, total = rmsnorm.add_rms_norm(x, residual, weight, 1e-6)
        assert not torch.equal(normed, stock_rms_norm(x + residual, weight, 1e-6))
        assert not torch.equal(total, (x + residual).float())  # the engine keeps the sum in FP32


@pytest.mark.parametrize("impl, reduction", [("fused", "eager"), ("eager", "inductor_cpu")])
def test_a_stored_value_inside_a_kernel_runs_eager_only(inputs, impl, reduction):
    """Inductor elides a downcast that is only upcast again: compiled kernels cannot keep such a rounding."""
    x, cos, sin = inputs
    with patches.aligned("rope", target=EAGER, impl=impl, reduction=reduction):
        with pytest.raises(ValueError, match="stores qk_norm.normalized, .*rope.product.* use impl='eager'"):
            rope.Rope.apply(x, cos, sin)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_whole_model_under_the_every_value_stored_table_is_stock(arch):
    """Stock transformers is the table with every value stored: under it, every spec gives stock's logits
    bit for bit (BF16 weights, FP32 buffers, as FSDP keeps them); under an engine's table it does not."""
    model = to_bf16_fsdp_style(tiny_model(arch))
    ids = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stock = model(ids).logits
        for spec in ("rope", "swiglu", "rmsnorm", "all"):
            with patches.aligned(spec, target=EAGER, impl="eager"):
                assert torch.equal(model(ids).logits, stock), spec
            with patches.aligned(spec, target="vllm", impl="eager"):
                assert not torch.equal(model(ids).logits, stock), spec
