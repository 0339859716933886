"""The shared attention kernel (localrl/kernels.py) gives both sides of the rig one kernel: on CUDA the
trainer's unpadded call (no mask, `is_causal`) and the engine's (an explicit mask) run the same pinned
kernel on the same mask, so their outputs are bit-identical; on a CPU the same holds for the fp32 path."""

import pytest
import torch
import torch.nn.functional as F

from localrl import kernels

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs it)")


def qkv(device, q_len=24, k_len=24, heads=8, kv_heads=2):
    gen = torch.Generator().manual_seed(0)
    shapes = [(2, heads, q_len, 64), (2, kv_heads, k_len, 64), (2, kv_heads, k_len, 64)]
    return [torch.randn(s, generator=gen).to(device, torch.bfloat16) for s in shapes]


@pytest.mark.parametrize("q_len, k_len", [(24, 24), (5, 24)])
def test_the_causal_mask_is_sdpas_is_causal(q_len, k_len):
    """Bottom-right aligned, as SDPA's `is_causal` and a KV-cache decode (queries are the last q_len)."""
    q, k, v = (t.float() for t in qkv("cpu", q_len, k_len, heads=2))
    mask = kernels.causal_mask(q_len, k_len, "cpu")
    assert mask.sum() < mask.numel() and bool(mask[-1].all())
    explicit = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len))
    assert torch.equal(explicit, want)
    if q_len == k_len:
        assert torch.equal(explicit, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_both_call_forms_agree_on_the_cpu():
    q, k, v = qkv("cpu")
    mask = kernels.causal_mask(24, 24, "cpu")[None, None].expand(2, 1, 24, 24)
    trainer = kernels.attention(q, k, v, None, True, 0.125)
    engine = kernels.attention(q, k, v, mask, False, 0.125)
    assert torch.equal(trainer, engine) and not torch.equal(trainer, kernels.attention(q, k, v, None, False, 0.125))


@pytest.mark.cuda
@CUDA
def test_both_call_forms_run_one_kernel_on_cuda():
    """Unpinned, `is_causal` without a mask takes flash attention and an explicit mask the
    memory-efficient kernel: the two differ in last bits (what the pin removes)."""
    q, k, v = qkv("cuda", 512, 512)
    mask = kernels.causal_mask(512, 512, "cuda")[None, None].expand(2, 1, 512, 512)
    trainer = kernels.attention(q, k, v, None, True, 0.125)
    engine = kernels.attention(q, k, v, mask, False, 0.125)
    assert torch.equal(trainer, engine)
    k2, v2 = (t.repeat_interleave(4, dim=1) for t in (k, v))
    flash = F.scaled_dot_product_attention(q, k2, v2, is_causal=True, scale=0.125)
    print(f"flash vs the pinned kernel: {(flash != trainer).float().mean().item():.2%} of elements differ")
