"""The fused (compiled) implementation of the aligned regions against the eager one, on this CPU.

Claim: same rounding locations, so the two agree bit for bit - forward outputs and every input
gradient - once the eager side adds in Inductor's order (reduction="inductor_cpu": the RMSNorm
variance, the backward's row sums, and the weight gradient's sum over tokens). With torch's own
order only the reductions may differ, by one bf16 ulp on a few elements (counted and bounded).
Every comparison also shows that the stock HF path differs, so a test that passes is not comparing
a function with itself.
"""

import pytest
import torch

import patches
from patches import _precision, fused, rmsnorm, rope, swiglu
from tests.model_factory import tiny_model, to_bf16_fsdp_style
from tests.numerics import max_ulp
from tests.test_patches_backward import CASES, saved_bytes

# Two sizes per region; each width (last dim) is a separate compiled kernel, tokens and heads vary freely.
SIZES = {
    "rope": [dict(tokens=7, heads=4, head_dim=64), dict(tokens=96, heads=12, head_dim=128)],
    "qk_norm_rope": [dict(tokens=7, heads=4, head_dim=64), dict(tokens=96, heads=12, head_dim=128)],
    "swiglu": [dict(tokens=7, inter=512), dict(tokens=96, inter=4864)],
    "add_rmsnorm": [dict(tokens=7, hidden=256), dict(tokens=96, hidden=1536)],
    "rmsnorm": [dict(tokens=7, hidden=256), dict(tokens=96, hidden=1536)],
}
CASE_IDS = [(region, i) for region in SIZES for i in range(len(SIZES[region]))]


def run(fn, inputs, upstream):
    """Outputs and input gradients of `fn` for the given upstream gradients."""
    inputs = tuple(t.detach().requires_grad_() for t in inputs)
    outs = fn(*inputs)
    torch.autograd.backward(outs, upstream)
    return [o.detach() for o in outs], [t.grad for t in inputs]


def case(region, i):
    inputs, stock, aligned = CASES[region](torch.bfloat16, **SIZES[region][i])
    gen = torch.Generator().manual_seed(11 + i)
    upstream = [torch.randn(o.shape, generator=gen).to(torch.bfloat16) for o in stock(*inputs)]
    return inputs, stock, aligned, upstream


def with_impl(impl, reduction, fn, *args):
    with _precision.using(impl, reduction):
        return fn(*args)


def share_differing(a, b):
    return (a != b).float().mean().item()


# The fused add + norm kernel also writes the FP32 sum (the stream), which the engine's kernel (writing a
# BF16 residual) does not: Inductor may then order the variance differently from the eager side's
# engine-order sums, on a few rows by one ulp.
ORDER_OF_ITS_OWN = ("add_rmsnorm",)


# (forward, backward) of every region, by name: what the fused implementation compiles
REGION_FUNCTIONS = {
    "rope": (rope.rope_forward, rope.rope_backward),
    "qk_norm_rope": (rope.norm_rope_forward, rope.norm_rope_backward),
    "swiglu": (swiglu.swiglu_forward, swiglu.swiglu_backward),
    "rmsnorm": (rmsnorm.rms_norm_forward, rmsnorm.rms_norm_backward),
    "add_rmsnorm": (rmsnorm.add_rms_norm_forward, rmsnorm.add_rms_norm_backward),
}


def compiled_runs(region) -> int:
    forward, backward = REGION_FUNCTIONS[region]
    return fused.RUNS[forward.__name__] + fused.RUNS[backward.__name__]


@pytest.mark.parametrize("region, size", CASE_IDS)
def test_fused_equals_eager_bitwise(region, size):
    inputs, stock, aligned, upstream = case(region, size)
    before = compiled_runs(region)
    eager_outs, eager_grads = with_impl("eager", "inductor_cpu", run, aligned, inputs, upstream)
    assert compiled_runs(region) == before  # eager ran no compiled region code
    forward, backward = REGION_FUNCTIONS[region]
    runs_before = fused.RUNS[forward.__name__], fused.RUNS[backward.__name__]
    fused_outs, fused_grads = with_impl("fused", "inductor_cpu", run, aligned, inputs, upstream)
    # the forward and the backward each ran compiled, once (RUNS counts calls of the compiled graphs)
    assert (fused.RUNS[forward.__name__], fused.RUNS[backward.__name__]) == (runs_before[0] + 1, runs_before[1] + 1)
    stock_outs, stock_grads = run(stock, inputs, upstream)
    for e, f in zip(eager_outs + eager_grads, fused_outs + fused_grads):
        assert f.dtype == e.dtype and f.shape == e.shape
        if region in ORDER_OF_ITS_OWN:  # as with torch's order: outputs and input gradients 1 ulp, dw 4
            # holds on every ISA: another summation order moves an fp32 sum by a few last bits, which flips a
            # bf16 rounding (1 ulp) on ~2^-16 of the elements per bit (1% is ~100x that); 0 here with AVX-512
            assert (f != e).float().mean() <= 0.01 and max_ulp(f, e) <= (4 if f.dim() == 1 else 1)
        else:
            assert torch.equal(f, e), f"{int((f != e).sum())} of {f.numel()} elements differ"
    out_diff = share_differing(stock_outs[0], fused_outs[0])
    grad_diff = share_differing(stock_grads[0], fused_grads[0])
    print(f"{region} {SIZES[region][size]}: fused == eager; stock differs on {out_diff:.1%} of outputs, "
          f"{grad_diff:.1%} of input gradients")
    # holds on every ISA: stock rounds at other places (several roundings against one), which changes 15-40% of
    # the elements (docs/numerics.md) whatever the CPU; an ISA changes a last fp32 bit on ~2^-16 of them
    assert out_diff > 0.01 and grad_diff > 0.01


@pytest.mark.parametrize("region", ["add_rmsnorm", "rmsnorm", "qk_norm_rope"])
def test_fused_vs_eager_with_torch_summation_order(region):
    """torch's own order: a reduction may flip a rounding. Per-row results (outputs, input gradients)
    stay within 1 bf16 ulp; the weight gradient - a sum over all tokens, with cancellation - within 4."""
    inputs, _, aligned, upstream = case(region, 1)
    eager = with_impl("eager", "eager", run, aligned, inputs, upstream)
    fusd = with_impl("fused", "eager", run, aligned, inputs, upstream)
    tensors = list(zip(eager[0] + eager[1], fusd[0] + fusd[1]))
    for k, (e, f) in enumerate(tensors):
        differ = e != f
        worst = max_ulp(f, e)
        print(f"{region} tensor {k}: {int(differ.sum())} of {e.numel()} differ, max {worst:.2g} ulp")
        # holds on every ISA: torch's and Inductor's sums differ in the last fp32 bits on some rows (how many
        # depends on the vector width), and a last-bit difference flips a bf16 rounding, by 1 ulp, on ~2^-16 of
        # the elements: measured 0-3 of 6k-344k (docs/numerics.md), 1% is far above either ISA's share
        assert differ.float().mean() <= 0.01
        assert worst <= (4 if k == len(tensors) - 1 else 1)  # the last one is the weight gradient


def test_one_kernel_per_width():
    """Token and head counts are dynamic (a new sequence length reuses the kernel); the width is static
    (a new head_dim compiles a new one, vectorized with no symbolic tail)."""
    forward = fused.compiled(rope.rope_forward)

    def call(heads, tokens, head_dim):
        x = torch.randn(1, heads, tokens, head_dim).to(torch.bfloat16)
        cos, sin = torch.randn(2, 1, 1, tokens, head_dim).to(torch.bfloat16)
        assert torch.equal(forward(x, cos, sin), rope.rope_forward(x, cos, sin))

    call(3, 5, 48)  # head_dim 48: used by no other test
    with torch._dynamo.config.patch(error_on_recompile=True):
        call(4, 9, 48)
        call(2, 130, 48)
        with pytest.raises(torch._dynamo.exc.RecompileError):
            call(4, 9, 80)
    call(4, 9, 80)  # compiled anew; automatic dynamic would now make the width symbolic ...
    with torch._dynamo.config.patch(error_on_recompile=True), pytest.raises(torch._dynamo.exc.RecompileError):
        call(4, 9, 112)  # ... but it stays static: a third width compiles a kernel of its own too


@pytest.mark.parametrize("region", SIZES)
def test_fused_saves_what_eager_saves(region):
    inputs, _, aligned, _ = case(region, 1)
    eager = with_impl("eager", "eager", saved_bytes, aligned, inputs)
    fusd = with_impl("fused", "eager", saved_bytes, aligned, inputs)
    assert fusd == eager > 0


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_whole_model_fused_matches_eager(arch):
    """A tiny bf16 model (fp32 buffers) with all regions aligned: the fused and the eager implementations
    round at the same places, so they are far closer to each other than either is to stock; what is left
    is the fused add + norm's own summation order (ORDER_OF_ITS_OWN)."""
    model = to_bf16_fsdp_style(tiny_model(arch))
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(3))

    def step(spec, impl="eager"):
        model.zero_grad(set_to_none=True)
        with patches.aligned(spec, reduction="inductor_cpu", impl=impl):
            logits = model(ids).logits
        torch.log_softmax(logits.float(), -1).mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    def distance(a, b):
        return (a.float() - b.float()).norm().item()

    stock_logits, stock_grads = step("none")
    eager_logits, eager_grads = step("all")
    before = sum(fused.RUNS.values())
    fused_logits, fused_grads = step("all", "fused")
    assert sum(fused.RUNS.values()) > before + 2 * model.config.num_hidden_layers  # compiled code ran, per layer
    print(f"{arch}: logits differing, fused vs eager {share_differing(fused_logits, eager_logits):.2%}, stock vs "
          f"eager {share_differing(stock_logits, eager_logits):.2%}; L2 distance, fused vs eager "
          f"{distance(fused_logits, eager_logits):.3g}, stock vs eager {distance(stock_logits, eager_logits):.3g}")
    # Distances, not shares of differing logits: one flipped rounding early in a sequence reaches every later
    # token through attention, so the share (0% with AVX-512 code, 11.5% for Qwen2 with AVX2 forced, ~80% for
    # stock) depends on where the machine's summation order flips one, while the size does not: the fused
    # kernel's order flips a bf16 rounding on ~2^-16 of the norm outputs, stock's rounding locations 15-40% of
    # the elements of every region, and errors grow as the square root of the flips: 3x on every ISA.
    assert distance(fused_logits, eager_logits) * 3 < distance(stock_logits, eager_logits)
    for name in eager_grads:  # every parameter's gradient: fused is nearer to eager than stock is, measured here
        e, f, s = eager_grads[name], fused_grads[name], stock_grads[name]
        assert distance(f, e) <= distance(s, e), name


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_whole_model_fused_equals_eager_without_the_add_norm(arch):
    """rope and swiglu (Qwen3's q/k norms included): no add + norm kernel, so fused == eager bit for bit,
    logits and every parameter gradient."""
    model = to_bf16_fsdp_style(tiny_model(arch))
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(4))

    def step(impl):
        model.zero_grad(set_to_none=True)
        with patches.aligned("rope,swiglu", reduction="inductor_cpu", impl=impl):
            logits = model(ids).logits
        torch.log_softmax(logits.float(), -1).mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    eager_logits, eager_grads = step("eager")
    fused_logits, fused_grads = step("fused")
    assert torch.equal(fused_logits, eager_logits)
    assert not [n for n in eager_grads if not torch.equal(eager_grads[n], fused_grads[n])]


class _OnDevice:
    """Stands in for a tensor on `device` (kernel() reads only `.device`): no GPU needed."""

    def __init__(self, device):
        self.device = torch.device(device)


@pytest.mark.parametrize("impl, device, want_fused", [
    ("auto", "cpu", False), ("auto", "cuda", True), ("eager", "cpu", False), ("eager", "cuda", False),
    ("fused", "cpu", True), ("fused", "cuda", True),
])
def test_dispatch_picks_what_impl_says(impl, device, want_fused):
    """kernel() hands back the compiled graph exactly where the implementation says, and that graph is
    a torch.compile'd one."""
    fn = rope.rope_forward
    with _precision.using(impl):
        got = _precision.kernel(fn, _OnDevice(device))
    assert (got is fused.compiled(fn)) == want_fused and (got is fn) == (not want_fused)
    if want_fused:
        assert getattr(got.graph, "_torchdynamo_orig_callable", None) is fn


def test_impl_selection():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # a device object needs no GPU
    assert _precision.impl() == "auto"
    assert not _precision.uses_fused(cpu) and _precision.uses_fused(cuda)
    patches.apply("all", impl="fused")
    assert _precision.uses_fused(cpu)
    with patches.aligned("rope", impl="eager"):
        assert not _precision.uses_fused(cuda)
    assert _precision.impl() == "fused" and patches.active() == {"rope", "swiglu", "rmsnorm"}
    patches.remove()
    assert _precision.impl() == "auto"


def test_bad_impl_names_value_and_allowed():
    patches.apply("rope", impl="eager")
    with pytest.raises(ValueError, match="^unknown implementation 'triton'; allowed: auto, eager, fused$"):
        patches.apply("all", impl="triton")
    assert patches.active() == {"rope"} and _precision.impl() == "eager"  # a bad value changes nothing


def test_using_refuses_a_bad_value_and_changes_nothing():
    with _precision.using("fused", "inductor_cpu"):
        for impl, reduction, refusal in (("eager", "fast", "reduction order 'fast'; allowed: eager, inductor_cpu, vllm_cpu_graph"),
                                         ("triton", "eager", "implementation 'triton'; allowed: auto, eager, fused")):
            with pytest.raises(ValueError, match=f"^unknown {refusal}$"):
                with _precision.using(impl, reduction):
                    pass
            assert (_precision.impl(), _precision.reduction()) == ("fused", "inductor_cpu")


def test_a_graph_break_in_a_region_function_is_an_error():
    """A region function runs as one graph: one Dynamo would split (part of it eager, with its own
    rounding between the pieces) is refused, not run in pieces."""
    def breaks(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    with pytest.raises(torch._dynamo.exc.Unsupported, match="graph_break"):
        fused.compiled(breaks)(torch.ones(4, 8))


def test_region_functions_compile_past_torchs_recompile_limit_and_stop_loudly_at_their_own(monkeypatch):
    """One graph per width: a process running several models passes torch's default limit (8), and
    past a limit Dynamo would run the function eagerly (other kernels, other last bits). The fused
    path raises the limit within its own calls and makes reaching it an error, whatever the process set."""
    monkeypatch.setattr(fused, "RECOMPILE_LIMIT", 2)

    def doubled(x):
        return x * 2

    run = fused.compiled(doubled)
    # (torch's own context manager: monkeypatch's undo would delete the config entry)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        for width in (8, 16):  # the second width is past the process's limit of 1
            assert torch.equal(run(torch.ones(3, width)), torch.full((3, width), 2.0))
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            run(torch.ones(3, 24))
        assert torch._dynamo.config.recompile_limit == 1 and not torch._dynamo.config.fail_on_recompile_limit_hit
