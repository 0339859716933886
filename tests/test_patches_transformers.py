"""A patched model still behaves like a transformers model wherever users look: hidden states,
generation outputs, and a clear refusal of what the patches do not implement."""

import pytest
import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

import patches
from tests.model_factory import tiny_model, to_bf16_fsdp_style

SETTINGS = [(spec, target) for spec in ("rope", "swiglu", "rmsnorm", "all") for target in patches.TARGETS]
DECODING = {
    "greedy": dict(do_sample=False),
    "sample": dict(do_sample=True, top_k=0),
    "beam": dict(num_beams=2, do_sample=False),
    "assisted": dict(do_sample=False),  # the assistant is the model itself
}


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def model(request):
    m = to_bf16_fsdp_style(tiny_model(request.param))
    m.generation_config.pad_token_id = 0
    return m


def _relative(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("spec, target", SETTINGS)
def test_hidden_states_have_stock_shape_and_values(model, spec, target):
    """One residual-stream tensor of width hidden per layer, in the activation dtype, close to stock's
    (they differ by the rounding the regions move: a few tenths of a percent, never a wrong tensor);
    the last one is the final norm's output, as transformers reports it."""
    ids = torch.randint(2, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stock = model(ids, output_hidden_states=True)
        with patches.aligned(spec, target=target):
            aligned = model(ids, output_hidden_states=True)
            as_tuple = model(ids, output_hidden_states=True, return_dict=False, use_cache=False)
    assert len(aligned.hidden_states) == len(stock.hidden_states) == model.config.num_hidden_layers + 1
    for a, s in zip(aligned.hidden_states, stock.hidden_states):
        assert a.shape == s.shape and a.dtype == s.dtype
        # holds on every ISA: the difference is bf16 rounding moved (2^-9 relative each), the same size on every
        # CPU; measured at most 1.05e-2 over these settings here
        assert _relative(a, s) < 0.03
    assert torch.equal(aligned.hidden_states[0], stock.hidden_states[0])  # the embedding: no region touches it
    assert torch.equal(as_tuple[1][2], aligned.hidden_states[2])  # return_dict=False: the same tuple
    differs = sum(not torch.equal(a, s) for a, s in zip(aligned.hidden_states[1:], stock.hidden_states[1:]))
    assert differs > 0  # the regions did act


@pytest.mark.parametrize("spec, target", SETTINGS)
def test_every_replaced_function_has_stocks_signature(model, spec, target):
    """What `inspect.signature` sees (transformers' Trainer keeps only dataset columns that are forward
    parameters; generation and PEFT read it too) is stock's, for every function a region replaces."""
    import inspect

    from patches.registry import FAMILIES

    from patches import rmsnorm

    stock_fn = {(owner, attr): getattr(owner, attr) for family in FAMILIES.values()
                for owner, attr, _ in family.replacements(patches.REGIONS) if not attr.startswith("_rla")}
    model_sig = inspect.signature(model.model.forward)
    with patches.aligned(spec, target=target):
        replaced = {key: getattr(*key) for key in stock_fn}
        assert all(inspect.signature(fn) == inspect.signature(stock_fn[key]) for key, fn in replaced.items())
        assert inspect.signature(model.model.forward) == model_sig and "input_ids" in model_sig.parameters
        changed = [key for key, fn in replaced.items() if fn is not stock_fn[key]]
    assert changed  # the regions did replace functions, whose signatures were compared
    assert inspect.signature(rmsnorm.model_forward) != model_sig  # the replacement's own: (*args, **kwargs)


@pytest.mark.parametrize("spec", ["rmsnorm", "all"])
def test_hidden_states_of_chosen_layers(model, spec):
    """transformers' output recording of chosen layers (`output_hidden_states=[indices]`): the others None."""
    ids = torch.randint(2, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stock = model(ids, output_hidden_states=[0, 2]).hidden_states
        with patches.aligned(spec):
            aligned = model(ids, output_hidden_states=[0, 2]).hidden_states
    assert [t is None for t in aligned] == [t is None for t in stock] and stock[1] is None
    for s, a in zip(stock, aligned):
        if s is not None:
            assert a.shape == s.shape and a.dtype == s.dtype and _relative(a, s) < 0.03


def test_hidden_states_are_the_streams_rounded(model):
    """With the rmsnorm region a layer carries the FP32 stream; the reported hidden state is that
    stream rounded once - what the next layer's residual is on `vllm` - not a width-2h pair."""
    ids = torch.randint(2, 256, (1, 16), generator=torch.Generator().manual_seed(2))
    seen = []
    layer = model.model.layers[1]
    handle = layer.register_forward_hook(lambda m, a, out: seen.append(out))
    try:
        with patches.aligned("rmsnorm"), torch.no_grad():
            out = model(ids, output_hidden_states=True)
    finally:
        handle.remove()
    from patches import stream

    carried = stream.unpack(seen[0], model.config.hidden_size)
    assert seen[0].shape[-1] == 2 * model.config.hidden_size and carried.dtype == torch.float32
    assert torch.equal(out.hidden_states[2], carried.to(torch.bfloat16))


@pytest.mark.parametrize("asked", ["argument", "config"])
def test_return_dict_false_gives_stocks_tuple(model, asked):
    """The rmsnorm region wraps Qwen2Model/Qwen3Model.forward (to report hidden states as stock does):
    `return_dict=False`, passed or set in the config, still gives stock's tuple, element by element."""
    ids = torch.randint(2, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    kwargs = {"return_dict": False} if asked == "argument" else {}
    model.config.return_dict = asked != "config"
    try:
        with torch.no_grad():
            stock = model.model(ids, output_hidden_states=True, **kwargs)
            with patches.aligned("rmsnorm"):
                aligned = model.model(ids, output_hidden_states=True, **kwargs)
                as_dict = model.model(ids, output_hidden_states=True, return_dict=True)
    finally:
        model.config.return_dict = True
    assert type(stock) is type(aligned) is tuple and len(aligned) == len(stock) == 3
    assert aligned[0].shape == stock[0].shape and not torch.equal(aligned[0], stock[0])  # the region acted
    # the values are the aligned model's own, bit for bit (a relative bound against stock measured 0.9-1.0e-2
    # here: rounding, whose exact size varies with the machine's GEMM)
    assert torch.equal(aligned[0], as_dict.last_hidden_state)
    assert all(torch.equal(t, d) for t, d in zip(aligned[2], as_dict.hidden_states))
    assert [t.shape for t in aligned[2]] == [t.shape for t in stock[2]]  # hidden states, width hidden


def test_hidden_states_take_gradients_like_any_output(model):
    """A loss on an intermediate hidden state (a probe, a distillation term) backpropagates correctly:
    the gradient equals the one through the stream itself, added in FP32 to the next layer's."""
    ids = torch.randint(2, 256, (1, 16), generator=torch.Generator().manual_seed(3))
    probe = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(4))

    def grads(loss_of):
        model.zero_grad(set_to_none=True)
        with patches.aligned("all"):
            out = model(ids, output_hidden_states=True)
            loss_of(out).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    both = grads(lambda o: o.logits.float().logsumexp(-1).mean() + (o.hidden_states[2].float() @ probe).mean())
    only_logits = grads(lambda o: o.logits.float().logsumexp(-1).mean())
    only_hidden = grads(lambda o: (o.hidden_states[2].float() @ probe).mean())
    model.zero_grad(set_to_none=True)
    layer0 = "model.layers.0.mlp.down_proj.weight"  # before the probed layer: reached by both terms
    assert not torch.equal(both[layer0], only_logits[layer0])
    # additive up to bf16 rounding of the weight gradients (bit-cast garbage would be off by orders)
    summed = only_logits[layer0].float() + only_hidden[layer0].float()
    # holds on every ISA: three bf16-rounded gradients (~1e-3 relative rounding error each) and the bf16
    # activation gradients between them; measured 3.6e-3 (Qwen2) and 4.2e-3 (Qwen3) here
    assert _relative(both[layer0], summed) < 0.01
    assert all(torch.isfinite(g).all() for g in both.values())


@pytest.mark.parametrize("decoding", DECODING)
@pytest.mark.parametrize("spec, target", [("all", t) for t in patches.TARGETS] + [("rmsnorm", "vllm")])
def test_generation_outputs(model, decoding, spec, target):
    """transformers' generation utilities with hidden states (`return_dict_in_generate`): stock shapes,
    and the same tokens as the aligned model's own forward chooses (greedy)."""
    ids = torch.randint(2, 256, (1 if decoding == "assisted" else 2, 8), generator=torch.Generator().manual_seed(5))
    kwargs = dict(DECODING[decoding], max_new_tokens=4, output_hidden_states=True, return_dict_in_generate=True)
    if decoding == "assisted":
        kwargs["assistant_model"] = model
    with torch.no_grad():
        torch.manual_seed(0)
        stock = model.generate(ids, **kwargs)
        with patches.aligned(spec, target=target):
            torch.manual_seed(0)
            out = model.generate(ids, **kwargs)
            first = model(ids).logits[:, -1].argmax(-1)
    assert len(out.hidden_states) == len(stock.hidden_states)
    for step_a, step_s in zip(out.hidden_states, stock.hidden_states):
        assert [t.shape for t in step_a] == [t.shape for t in step_s]
        assert all(t.shape[-1] == model.config.hidden_size for t in step_a)
    if decoding in ("greedy", "assisted"):
        assert torch.equal(out.sequences[:, ids.shape[1]], first)


# ---- refusals ----------------------------------------------------------------------------------

def test_a_non_silu_activation_is_refused(model):
    arch = model.config.model_type
    gelu = to_bf16_fsdp_style(tiny_model(arch, hidden_act="gelu"))
    ids = torch.randint(2, 256, (1, 8))
    refusal = r"^Qwen[23]MLP: hidden_act 'gelu'.*supported: silu, swish\)$"
    with patches.aligned("swiglu"):
        with pytest.raises(patches.UnsupportedModelError, match=refusal):
            gelu(ids)  # a model built before apply: refused at its first forward, naming the module
        with pytest.raises(patches.UnsupportedModelError, match=refusal):
            tiny_model(arch, hidden_act="gelu")  # built while applied: refused where it is built
    with patches.aligned(("rope", "rmsnorm")):  # regions that do not read the activation build it
        assert tiny_model(arch, hidden_act="gelu").config.hidden_act == "gelu"


def test_a_model_loaded_while_applied_is_checked(tmp_path):
    """from_pretrained, as the local trainer and verl's workers load a model, goes through the same
    check as a model built in place: refused for the regions that cannot cover it, built for the others."""
    from transformers import AutoModelForCausalLM

    tiny_model("qwen2", hidden_act="gelu").save_pretrained(tmp_path)
    with patches.aligned("swiglu"), pytest.raises(patches.UnsupportedModelError, match=r"^Qwen2MLP: hidden_act 'gelu'"):
        AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    with patches.aligned("rope"):
        assert AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).config.hidden_act == "gelu"


def test_a_scaling_without_an_aligned_table_is_refused(model):
    """llama3 scaling: vLLM has a table for it, the aligned RoPE does not (no Qwen config uses it)."""
    arch = model.config.model_type
    scaled = {"rope_type": "llama3", "factor": 2.0, "rope_theta": 1e6, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    built_before = tiny_model(arch, rope_parameters=scaled)
    with patches.aligned("rope"):
        refusal = (r"^Qwen[23]RotaryEmbedding: rope_type 'llama3' is not covered by the aligned RoPE "
                   r"\(it implements vLLM's tables for default, linear, dynamic, yarn\); leave the rope region off "
                   r"for this model$")
        with pytest.raises(patches.UnsupportedModelError, match=refusal):
            built_before(torch.randint(2, 256, (1, 8)))
        with pytest.raises(patches.UnsupportedModelError, match=refusal):
            tiny_model(arch, rope_parameters=scaled)
    with patches.aligned(("swiglu", "rmsnorm")):
        assert tiny_model(arch, rope_parameters=scaled).model.rotary_emb.rope_type == "llama3"


def test_partial_rotary_factor_is_ignored_by_stock_and_aligned_alike(model):
    """Qwen2/Qwen3's default RoPE rotates the whole head whatever `partial_rotary_factor` says (every
    checked transformers release), so the aligned rotation, which does too, is not refused."""
    arch = model.config.model_type
    half = to_bf16_fsdp_style(tiny_model(arch, partial_rotary_factor=0.5))
    whole = to_bf16_fsdp_style(tiny_model(arch))  # the same weights (the same seed), no partial_rotary_factor
    assert half.model.rotary_emb.inv_freq.numel() == half.config.head_dim // 2  # every pair of dims rotates
    ids = torch.randint(2, 256, (1, 8))
    with torch.no_grad():
        stock = half(ids).logits
        with patches.aligned("rope"):
            aligned, aligned_whole = half(ids).logits, whole(ids).logits
        stock_whole = whole(ids).logits
    # the factor changes nothing, stock or aligned, bit for bit (not a bound on the size of the rounding the
    # region moves: that varies with the machine's GEMM), and the region acted
    assert torch.equal(stock, stock_whole) and torch.equal(aligned, aligned_whole)
    assert not torch.equal(aligned, stock)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_qwen3_attention_keeps_stocks_attention(attn):
    """The rope patch replaces Qwen3Attention.forward (q/k norm fused into the rotation); the attention
    call stays stock's: the configured implementation, its scaling, and its dropout while training.
    FP32 weights round nothing to BF16, so with the same dropout seed the two sides are equal bit for
    bit; another seed's masks move the logits (so dropout is on and the comparison can fail)."""
    from patches.rope import qwen3_attention_forward

    model = tiny_model("qwen3", attn_implementation=attn, attention_dropout=0.5).train()
    ids = torch.randint(2, 256, (2, 16), generator=torch.Generator().manual_seed(0))

    def logits(seed):
        torch.manual_seed(seed)
        return model(ids).logits.detach()

    stock, other_masks = logits(1), logits(2)
    with patches.aligned("rope"):
        assert type(model.model.layers[0].self_attn).forward.__code__ is qwen3_attention_forward.__code__
        aligned = logits(1)
    assert torch.equal(aligned, stock)
    # holds on every ISA: other masks zero other halves of the attention weights, an O(1) change (1.2 here)
    assert (other_masks - stock).abs().max() > 0.1


@pytest.mark.parametrize("arch, spec", [("qwen3", "rope"), ("qwen2", "rmsnorm"), ("qwen3", "all")])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_attention_function_gets_what_stock_hands_it(arch, spec, training):
    """The rope patch replaces Qwen3's attention forward, the rmsnorm patch the decoder layer that
    calls it: every argument but q/k/v still reaches the attention function as stock passes it -
    scaling, dropout (0 in eval), a sliding layer's window, and what the caller passes through
    (position_ids: packed sequences reach flash attention this way): recorded by an attention
    function of our own."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    calls = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        calls.append({k: ("tensor", tuple(v.shape)) if torch.is_tensor(v) else v for k, v in kwargs.items()})
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("rla_recording", recording)
    model = tiny_model(arch, attn_implementation="rla_recording", attention_dropout=0.5, use_sliding_window=True,
                       sliding_window=8, max_window_layers=2).train(training)
    ids = torch.randint(2, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    position_ids = torch.arange(16).expand(2, 16)
    model(ids, position_ids=position_ids, rla_marker=1)  # a caller's keyword (verl: flash attention's cu_seq_lens)
    stock, calls[:] = list(calls), []
    with patches.aligned(spec):
        model(ids, position_ids=position_ids, rla_marker=1)
    assert calls == stock and len(stock) == 4 and "use_cache" in stock[0] and stock[0]["rla_marker"] == 1
    assert [c["sliding_window"] for c in stock] == [None, None, 8, 8] and stock[0]["position_ids"][0] == "tensor"
    assert {c["dropout"] for c in stock} == {0.5 if training else 0.0}


@pytest.mark.parametrize("make", [
    lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                               moe_intermediate_size=32, num_experts=2, num_experts_per_tok=1,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                               head_dim=16)),
    lambda: Qwen2MoeForCausalLM(Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                               moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                               num_experts=2, num_experts_per_tok=1, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1)),
], ids=["qwen3-moe", "qwen2-moe"])
def test_a_moe_model_is_refused_where_it_is_built(make):
    """No aligned forward runs in an MoE model (other classes): it would silently train stock."""
    make()  # fine without the patches
    with patches.aligned("all"), pytest.raises(patches.UnsupportedModelError, match=r"Moe.*not covered"):
        make()


def test_stock_behaviour_after_remove_is_unchanged(model):
    """After remove(): stock outputs bit for bit, gelu and scaled-RoPE models build and run again."""
    ids = torch.randint(2, 256, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = model(ids, output_hidden_states=True)
        with patches.aligned("all", target="vllm-cpu"):
            model(ids)
        after = model(ids, output_hidden_states=True)
    assert torch.equal(before.logits, after.logits)
    assert all(torch.equal(a, b) for a, b in zip(before.hidden_states, after.hidden_states))
    tiny_model(model.config.model_type, hidden_act="gelu")(ids)
