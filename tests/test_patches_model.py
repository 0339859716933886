"""Whole tiny Qwen2 / Qwen3 models: the training forward (HF + patches, target `vllm`) against the
local engine, which compiles the model piece by piece as vLLM does on a GPU (same GEMM and attention
kernels on both sides, engine formulations in the pieces).

What `all` can reach depends on the machine: the RMSNorm variances are sums, and whether the eager
side adds in the engine kernel's order depends on the code Inductor generates here (vector width,
tiling, which inputs a fused kernel reads). So no constant from another CPU is asserted. The claims are
relations measured here: with the better of the two summation orders (`reduction`), `all` is closer to
the engine than every other subset of the regions and matches more tokens bit for bit; the residual's
rounding (the target) is measurable; stock is far off. The numbers are printed (`pytest -s`).
"""

import itertools

import pytest
import torch

import patches
from localrl import kernels
from localrl.engine.model import EngineModel
from tests.model_factory import tiny_model, to_bf16_fsdp_style
from tests.numerics import inductor_isa

ARCHS = ["qwen2", "qwen3"]


def token_logprobs(logits, ids):
    return torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


@pytest.fixture(scope="module", params=ARCHS)
def pair(request):
    """(arch, training model in bf16 with fp32 buffers on the shared kernels, engine, batch, the
    engine's logprobs of the batch)."""
    model = tiny_model(request.param)
    engine = EngineModel(model.config)
    engine.load_hf_weights(model.state_dict())
    train = kernels.use_local_kernels(to_bf16_fsdp_style(model))
    ids = torch.randint(0, 256, (4, 96), generator=torch.Generator().manual_seed(7))
    ref = token_logprobs(engine(ids, torch.arange(ids.shape[1]).expand_as(ids)), ids)
    return request.param, train, engine, ids, ref


def mismatch(train, ids, ref, spec, **kw):
    with patches.aligned(spec, **kw), torch.no_grad():
        d = token_logprobs(train(ids).logits, ids) - ref
    return d.abs().mean().item(), (d == 0).float().mean().item()


def best(train, ids, ref, spec, **kw):
    """(mean |d logprob|, bit-equal share, reduction) with the better of the two summation orders."""
    runs = [(*mismatch(train, ids, ref, spec, reduction=r, **kw), r) for r in patches.REDUCTIONS]
    return min(runs)


# every subset of the regions: "none", each region, each pair, "all"
SUBSETS = ["none"] + [c for k in (1, 2) for c in itertools.combinations(patches.REGIONS, k)] + ["all"]


def test_mismatch_per_ablation(pair):
    """`all` against every other subset of the regions, pairs included: a subset that leaves one region stock
    keeps that region's rounding-location mismatch (15-40% of its elements on every token, whatever the
    CPU), `all` only the summation order's flips (~2^-16 of the norm outputs per last-bit difference: 0 to
    26% of the tokens reached here, by ISA). So `all` must be nearer and bit-identical on more tokens than
    every strict subset; a region that `all` failed to align would make it equal to a pair."""
    arch, train, _, ids, ref = pair
    err, same = {}, {}
    for subset in SUBSETS:
        name = subset if isinstance(subset, str) else "+".join(subset)
        for reduction in patches.REDUCTIONS:
            e, b = mismatch(train, ids, ref, subset, target="vllm", reduction=reduction)
            print(f"{arch} {inductor_isa()} {reduction:12s} {name:15s} mean |d logprob| {e:.2e}  bit-identical {b:.1%}")
            if name not in err or e < err[name]:
                err[name], same[name] = e, b
    # holds on every ISA: stock's rounding locations differ on every token (0-3% bit-identical, docs/results.md)
    assert err["none"] > 0 and same["none"] < 0.5
    others = [a for a in err if a != "all"]
    assert all(err["all"] < err[a] for a in others), err
    assert all(same["all"] > same[a] for a in others), same


def test_the_target_is_what_makes_it_match(pair):
    """The same regions rounding the residual like vLLM's CPU build (never) instead of like the GPU
    graph (once per layer) move off the piecewise engine: the residual's rounding is measurable."""
    arch, train, _, ids, ref = pair
    gpu = best(train, ids, ref, "all", target="vllm")
    cpu = best(train, ids, ref, "all", target="vllm-cpu")
    none = best(train, ids, ref, "none")
    print(f"{arch}: all, target vllm {gpu[0]:.2e} ({gpu[1]:.1%} bit-equal), target vllm-cpu {cpu[0]:.2e} "
          f"({cpu[1]:.1%}); stock {none[0]:.2e}")
    # measured: target vllm bit-exact with AVX-512 code; 12x (Qwen2) and 7x (Qwen3) apart with AVX2 forced. The
    # right target's remainder is summation order, which depends on the ISA; the wrong target's is the
    # residual's rounding (the engine stores it in BF16 once per layer, vllm-cpu never), the same on every
    # ISA: 44-50% of stock's mismatch with either ISA (docs/numerics.md). So: the right target is nearer, and
    # the wrong one is off by a large share of stock's.
    assert cpu[0] > gpu[0] and cpu[1] < gpu[1]
    assert cpu[0] > none[0] / 4


def test_unpadded_packed_sequences(pair):
    """verl's remove-padding layout: one row (1, total_tokens), position_ids restarting per sequence."""
    arch, train, engine, ids, _ = pair
    lengths = [40, 25, 31]
    packed = torch.cat([ids[i, :n] for i, n in enumerate(lengths)])[None]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    block_causal = (seq[:, None] == seq[None, :]) & torch.ones(len(seq), len(seq), dtype=torch.bool).tril()
    want = token_logprobs(engine(packed, position_ids, mask=block_causal[None, None]), packed)
    aligned = {}
    for reduction in patches.REDUCTIONS:
        with patches.aligned("all", reduction=reduction), torch.no_grad():
            aligned[reduction] = token_logprobs(train(packed, position_ids=position_ids, use_cache=False).logits, packed)
    with torch.no_grad():
        stock = token_logprobs(train(packed, position_ids=position_ids, use_cache=False).logits, packed)
    # the first token of each later sequence is predicted across a boundary: not a real pair
    keep = torch.ones(packed.shape[1] - 1, dtype=torch.bool)
    keep[torch.cumsum(torch.tensor(lengths), 0)[:-1] - 1] = False
    a, a_same = min(((aligned[r] - want)[0, keep].abs().mean(), ((aligned[r] - want)[0, keep] == 0).float().mean())
                    for r in aligned)
    s, s_same = (stock - want)[0, keep].abs().mean(), ((stock - want)[0, keep] == 0).float().mean()
    # the same tokens, unpacked: one row each, positions from 0
    single = [token_logprobs(engine(ids[i:i + 1, :n], torch.arange(n)[None]), ids[i:i + 1, :n])[0] for i, n in
              enumerate(lengths)]
    print(f"{arch} packed: mean |d logprob| stock {s:.2e}, aligned {a:.2e}; bit-identical stock {s_same:.1%}, "
          f"aligned {a_same:.1%}")
    # A packing the aligned side got wrong (positions, mask) would be off by far more than stock's rounding.
    # No fixed factor: what `all` leaves is summation order, 0 with AVX-512 code and up to 1/15 of stock's with
    # AVX2 forced (docs/numerics.md), and where an order flip lands decides how much; so nearer than stock and
    # more tokens bit-identical (stock's rounding locations differ on every token, on every ISA).
    assert a < s and a_same > s_same
    assert torch.equal(want[0, keep], torch.cat(single))  # the engine itself treats packing as separate rows


def test_remove_restores_stock_bit_for_bit(pair):
    _, train, _, ids, _ = pair
    with torch.no_grad():
        before = train(ids).logits
        patches.apply("all")
        during = train(ids).logits
        patches.remove()
        after = train(ids).logits
    assert torch.equal(before, after)
    assert not torch.equal(before, during)


@pytest.mark.parametrize("target", patches.TARGETS)
def test_training_step_gradients_flow(pair, target):
    """A backward through the aligned model reaches every parameter with finite gradients that differ
    from stock's (the aligned backward is not the stock one)."""
    _, train, _, ids, _ = pair

    def grads(spec):
        train.zero_grad()
        with patches.aligned(spec, target=target):
            (-token_logprobs(train(ids).logits, ids).mean()).backward()
        return {n: p.grad.clone() for n, p in train.named_parameters()}

    stock, aligned = grads("none"), grads("all")
    train.zero_grad()
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in aligned.values())
    differ = [n for n in aligned if not torch.equal(aligned[n], stock[n])]
    # holds on every ISA: every gradient flows through an aligned region, where stock rounds elsewhere on
    # 15-40% of the elements; an ISA moves a last fp32 bit on ~2^-16 of them
    assert len(differ) > 0.9 * len(aligned)


@pytest.mark.parametrize("named", ["vllm", "vllm-cpu"])
def test_a_target_is_its_table_not_its_name(pair, named):
    """A Target under another name with a named target's table gives that target's logits bit for bit;
    with the other target's table it does not (the comparison can fail)."""
    from dataclasses import replace

    from patches.targets import TARGETS

    arch, train, _, ids, _ = pair
    other = next(t for t in TARGETS if t != named)

    def logits(target):
        with patches.aligned("all", target=target), torch.no_grad():
            return train(ids).logits

    mine = replace(TARGETS[named], name="my-engine", engine="an engine of mine")
    assert torch.equal(logits(mine), logits(named))
    assert not torch.equal(logits(replace(TARGETS[other], name="my-engine")), logits(named))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_graphs_order_sums_from_a_layers_addends_and_keeps_the_gradients(arch):
    """reduction="vllm_cpu_graph" sums each input norm from the previous layer's output and the stream before
    it (kept on the packed stream), and the post-attention norms where vLLM-CPU's graph stores the stream (read
    off the graph compiled here) at the FP32 tiling: other sums of the
    same values, so logits and gradients stay within summation-order distance of "inductor_cpu"'s, and
    they do differ somewhere (the other order is in use)."""
    model = to_bf16_fsdp_style(tiny_model(arch))
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(5))

    def step(reduction):
        model.zero_grad(set_to_none=True)
        with patches.aligned("all", target="vllm-cpu", reduction=reduction):
            logits = model(ids).logits
        torch.log_softmax(logits.float(), -1).mean().backward()
        return logits.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}

    alone_logits, alone_grads = step("inductor_cpu")
    graph_logits, graph_grads = step("vllm_cpu_graph")
    assert (graph_logits - alone_logits).norm() <= 1e-2 * alone_logits.norm()
    for name, grad in alone_grads.items():
        assert (graph_grads[name] - grad).norm() <= 2e-2 * grad.norm() + 1e-6, name
    differs = not torch.equal(graph_logits, alone_logits) or any(
        not torch.equal(graph_grads[n], g) for n, g in alone_grads.items())
    assert differs
