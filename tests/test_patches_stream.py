"""The FP32 residual stream between aligned layers, bit-cast into a BF16 tensor (patches/stream.py):
exact both ways, untouched by FSDP2's input casting, and with gradients that add in FP32."""

import os
import socket

import pytest
import torch

import patches
from patches import stream
from tests.model_factory import tiny_model, to_bf16_fsdp_style

WIDTH = 8


def hard_values(n=4096):
    """FP32 values whose low halves, read as BF16, are NaN, Inf, zero and subnormal patterns."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2**31 - 1, (n,), generator=gen, dtype=torch.int64)
    lows = torch.tensor([0x7FC0, 0x7F80, 0xFF81, 0x0000, 0x0001, 0x8000], dtype=torch.int64)
    bits[: len(lows) * 8] = (bits[: len(lows) * 8] & ~0xFFFF) | lows.repeat(8)
    values = bits.to(torch.int32).view(torch.float32)
    return values[torch.isfinite(values)][: (n // 2 // WIDTH) * WIDTH].reshape(-1, WIDTH)


def test_pack_and_unpack_are_exact_and_copy_nothing():
    s = hard_values()
    p = stream.pack(s, torch.bfloat16)
    assert p.dtype == torch.bfloat16 and p.shape == (*s.shape[:-1], 2 * WIDTH)
    assert p.data_ptr() == s.data_ptr()  # a view of the same bytes
    assert stream.is_packed(p, WIDTH) and not stream.is_packed(s, WIDTH)
    assert torch.equal(stream.unpack(p, WIDTH).view(torch.int32), s.view(torch.int32))
    assert torch.equal(stream.unpack(p.clone(), WIDTH).view(torch.int32), s.view(torch.int32))
    assert p.to(torch.bfloat16) is p  # what FSDP2's cast_forward_inputs does to a BF16 input: nothing


def test_other_dtypes_travel_as_they_are():
    s64 = torch.randn(3, WIDTH, dtype=torch.float64)
    assert stream.pack(s64, torch.bfloat16) is s64
    s32 = torch.randn(3, WIDTH)
    assert stream.pack(s32, torch.float32) is s32  # an FP32 model: the stream is its own carrier


@pytest.mark.parametrize("shared", [True, False], ids=["one-view", "two-views"])
def test_gradients_of_two_readers_add_in_fp32(shared):
    """The next layer and a hidden-state reader both read one packed tensor: the stream's gradient is
    the exact FP32 sum of theirs. Two separate bit-cast views would have autograd add their bit-cast
    gradients as BF16: wrong in the low bits (the second case shows that this test can tell)."""
    gen = torch.Generator().manual_seed(1)
    s = torch.randn(16, WIDTH, generator=gen, requires_grad=True)
    w1, w2 = torch.randn(16, WIDTH, generator=gen), torch.randn(16, WIDTH, generator=gen)
    p = stream.pack(s * 1.0, torch.bfloat16)
    a = stream.unpack(p, WIDTH)
    if not shared:
        del p._rla_unpacked  # the next reader makes a view of its own
    b = stream.hidden_state(p, WIDTH)
    ((a * w1).sum() + (b.float() * w2).sum()).backward()
    want = w1 + w2.to(torch.bfloat16).float()  # b's gradient is BF16 (b is a BF16 tensor)
    assert torch.equal(s.grad, want) == shared


def test_every_reader_gets_one_view_in_the_grad_mode_it_reads_in():
    """Readers of one packed tensor share one view while the grad mode they read in matches the view's;
    a reader under no_grad (an eval forward, verl's log-prob pass) gets a view that carries no graph."""
    s = torch.randn(4, WIDTH, requires_grad=True)
    p = stream.pack(s * 1.0, torch.bfloat16)
    view = stream.unpack(p, WIDTH)
    assert view.requires_grad and stream.unpack(p, WIDTH) is view
    with torch.no_grad():
        quiet = stream.unpack(p, WIDTH)
        assert not quiet.requires_grad and stream.unpack(p, WIDTH) is quiet
    detached = stream.pack(s.detach() * 1.0, torch.bfloat16)  # a stream that needs no gradient
    first = stream.unpack(detached, WIDTH)
    assert not first.requires_grad and stream.unpack(detached, WIDTH) is first


def test_gradients_flow_through_the_packed_tensor():
    """Hooks on a layer's output (FSDP's pre-backward all-gather, module backward hooks) see the
    gradient: it passes through the packed tensor, bit-cast."""
    gen = torch.Generator().manual_seed(2)
    s = torch.randn(16, WIDTH, generator=gen, requires_grad=True)
    w = torch.randn(16, WIDTH, generator=gen)
    p = stream.pack(s * 1.0, torch.bfloat16)
    seen = []
    p.register_hook(lambda g: seen.append(g))
    (stream.unpack(p, WIDTH) * w).sum().backward()
    assert len(seen) == 1 and torch.equal(seen[0].view(torch.float32), w)
    assert torch.equal(s.grad, w)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def process_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("target", patches.TARGETS)
def test_fsdp2_with_cast_forward_inputs_keeps_the_stream(process_group, target):
    """FSDP2 as verl configures it (MixedPrecisionPolicy(param_dtype=bf16, cast_forward_inputs=True),
    each decoder layer sharded): the aligned model's logits and gradients are those without FSDP. An
    FP32 stream passed as is would be rounded at every layer input by the cast."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    plain = to_bf16_fsdp_style(tiny_model("qwen2"))
    sharded = tiny_model("qwen2")  # fp32 parameters: FSDP2 casts them to bf16 for compute
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
    for layer in sharded.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(sharded, mp_policy=policy)
    with patches.aligned("all", target=target):
        want = plain(ids).logits
        got = sharded(ids).logits
        got.float().sum().backward()
    assert torch.equal(got, want)
    assert all(p.grad is not None and torch.isfinite(p.grad.full_tensor()).all() for p in sharded.parameters())


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_gradient_checkpointing_still_checkpoints_aligned_layers(arch):
    """transformers' gradient checkpointing runs through each aligned decoder layer (from 5.23 it wraps
    the class's forward, so a replaced forward must be wrapped again) and changes no gradient."""
    from patches.registry import decoder_layers

    model = to_bf16_fsdp_style(tiny_model(arch)).train()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))

    def grads():
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    with patches.aligned("all"):
        want = grads()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        calls = []
        for layer in decoder_layers(model):
            checkpoint = layer._gradient_checkpointing_func
            layer._gradient_checkpointing_func = lambda *a, _c=checkpoint, **k: calls.append(1) or _c(*a, **k)
        got = grads()
    assert len(calls) == len(decoder_layers(model))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
