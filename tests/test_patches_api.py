"""The public API of `patches`: specs, apply/remove/aligned, coverage checks, the verl plugin."""

import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

import patches
from tests.model_factory import tiny_model, to_bf16_fsdp_style

STOCK = {
    (modeling_qwen2, "apply_rotary_pos_emb"): modeling_qwen2.apply_rotary_pos_emb,
    (modeling_qwen2.Qwen2MLP, "forward"): modeling_qwen2.Qwen2MLP.forward,
    (modeling_qwen2.Qwen2DecoderLayer, "forward"): modeling_qwen2.Qwen2DecoderLayer.forward,
    (modeling_qwen2.Qwen2RMSNorm, "forward"): modeling_qwen2.Qwen2RMSNorm.forward,
    (modeling_qwen2.Qwen2RotaryEmbedding, "forward"): modeling_qwen2.Qwen2RotaryEmbedding.forward,
    (modeling_qwen3.Qwen3Attention, "forward"): modeling_qwen3.Qwen3Attention.forward,
    (modeling_qwen3.Qwen3MLP, "forward"): modeling_qwen3.Qwen3MLP.forward,
}


def test_names():
    assert patches.REGIONS == ("rope", "swiglu", "rmsnorm")
    assert patches.ABLATIONS == {"none": (), "rope": ("rope",), "swiglu": ("swiglu",), "rmsnorm": ("rmsnorm",),
                                 "all": ("rope", "swiglu", "rmsnorm")}


@pytest.mark.parametrize("spec, want", [
    ("none", set()), ("", set()), (None, set()), ("all", {"rope", "swiglu", "rmsnorm"}), ("rope", {"rope"}),
    ("rope, swiglu", {"rope", "swiglu"}), (("rmsnorm",), {"rmsnorm"}), (["rope", "rmsnorm"], {"rope", "rmsnorm"}),
])
def test_apply_specs(spec, want):
    assert patches.apply(spec) == frozenset(want) == patches.active()


@pytest.mark.parametrize("spec", ["ropee", "rope,swigl", ["rope", "everything"], 3, "all,rope"])
def test_bad_spec_names_value_and_allowed(spec):
    patches.apply("rope")
    with pytest.raises(ValueError) as err:
        patches.apply(spec)
    msg = str(err.value)
    assert "rope, swiglu, rmsnorm" in msg and "none" in msg
    bad = {"ropee": "'ropee'", "rope,swigl": "'swigl'", 3: "3", "all,rope": "'all'"}.get(spec if not isinstance(spec, list) else None, "'everything'")
    assert bad in msg
    assert patches.active() == {"rope"}  # a bad spec changes nothing


def test_bad_reduction():
    with pytest.raises(ValueError, match="'fast'.*eager, inductor_cpu"):
        patches.apply("all", reduction="fast")


def test_apply_is_idempotent_and_switches():
    patches.apply("all")
    patches.apply("all")
    assert modeling_qwen2.Qwen2MLP.forward is not STOCK[(modeling_qwen2.Qwen2MLP, "forward")]
    patches.apply("rope")
    assert modeling_qwen2.Qwen2MLP.forward is STOCK[(modeling_qwen2.Qwen2MLP, "forward")]
    assert modeling_qwen2.apply_rotary_pos_emb is not STOCK[(modeling_qwen2, "apply_rotary_pos_emb")]
    patches.remove()
    assert all(getattr(owner, attr) is fn for (owner, attr), fn in STOCK.items())
    assert not hasattr(modeling_qwen2.Qwen2RMSNorm, "_rla_stock_forward")


def test_aligned_restores_previous_state():
    patches.apply("swiglu")
    with patches.aligned("all") as regions:
        assert regions == patches.active() == {"rope", "swiglu", "rmsnorm"}
    assert patches.active() == {"swiglu"}
    with pytest.raises(RuntimeError), patches.aligned("rope"):
        raise RuntimeError
    assert patches.active() == {"swiglu"}


def test_models_built_before_and_after_apply_are_aligned():
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    before = to_bf16_fsdp_style(tiny_model("qwen2", seed=3))
    with torch.no_grad():
        stock = before(ids).logits
        patches.apply("all")
        after = to_bf16_fsdp_style(tiny_model("qwen2", seed=3))
        a, b = before(ids).logits, after(ids).logits
    assert torch.equal(a, b) and not torch.equal(a, stock)


def test_check_model_accepts_qwen():
    assert patches.check_model(tiny_model("qwen2")) == "qwen2"
    assert patches.check_model(tiny_model("qwen3")) == "qwen3"


def test_check_model_rejects_uncovered_models():
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(patches.UnsupportedModelError, match="LlamaDecoderLayer"):
        patches.check_model(llama)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             moe_intermediate_size=32, num_experts=2, num_experts_per_tok=1,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             head_dim=16))
    with pytest.raises(patches.UnsupportedModelError, match="Qwen3MoeDecoderLayer"):
        patches.check_model(moe)


# ---- verl plugin ----------------------------------------------------------------------------------

@pytest.fixture
def tiny_model_dir(tmp_path):
    """A local tiny Qwen2 checkpoint with a tokenizer, as verl's HFModelConfig loads it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{str(i): i + 2 for i in range(10)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(tmp_path)
    tiny_model("qwen2", vocab_size=len(vocab)).save_pretrained(tmp_path)
    return tmp_path


def _hf_model_config(path):
    from verl.workers.config import HFModelConfig

    sys.modules.pop("patches.verl_plugin", None)  # verl imports it once per process; each test is a new worker
    return HFModelConfig(path=str(path), external_lib="patches.verl_plugin")


def test_verl_plugin_through_verl(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("RLA_REGIONS", "rope")
    _hf_model_config(tiny_model_dir)
    assert patches.active() == {"rope"}
    monkeypatch.setenv("RLA_REGIONS", "rope,swiglu,rmsnorm")
    _hf_model_config(tiny_model_dir)
    assert patches.active() == set(patches.REGIONS)


def test_verl_plugin_unset_means_stock(tiny_model_dir, monkeypatch):
    patches.apply("all")
    monkeypatch.delenv("RLA_REGIONS", raising=False)
    _hf_model_config(tiny_model_dir)
    assert patches.active() == frozenset()


def test_verl_plugin_bad_value_fails_loudly(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("RLA_REGIONS", "rope,swigloo")
    with pytest.raises(ValueError, match="RLA_REGIONS='rope,swigloo'.*'swigloo'"):
        _hf_model_config(tiny_model_dir)


def test_verl_plugin_impl(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("RLA_REGIONS", "all")
    monkeypatch.setenv("RLA_IMPL", "eager")
    _hf_model_config(tiny_model_dir)
    assert patches.active() == set(patches.REGIONS) and patches._precision.impl() == "eager"
    monkeypatch.setenv("RLA_IMPL", "turbo")
    with pytest.raises(ValueError, match="RLA_IMPL='turbo'.*'turbo'.*auto, eager, fused"):
        _hf_model_config(tiny_model_dir)


# The upstream forwards the patches replace (or copy with the regions swapped in), as source text:
# sha256 of each function's source, the same in every transformers release from 5.5.3 to 5.17.0. A
# release that changes one of them fails here, loudly, before a patch silently drops what it changed.
UPSTREAM = {
    "qwen2": {"apply_rotary_pos_emb": "dcce26b5d7674297", "Qwen2RotaryEmbedding.forward": "c718955d8b60e9df",
              "Qwen2MLP.forward": "3997a4458faa14a5", "Qwen2RMSNorm.forward": "0d702ef8d7d8a129",
              "Qwen2DecoderLayer.forward": "2054f855effdaa18", "Qwen2Attention.forward": "c5e7f9c63c52302c"},
    "qwen3": {"apply_rotary_pos_emb": "dcce26b5d7674297", "Qwen3RotaryEmbedding.forward": "c718955d8b60e9df",
              "Qwen3MLP.forward": "3997a4458faa14a5", "Qwen3RMSNorm.forward": "0d702ef8d7d8a129",
              "Qwen3DecoderLayer.forward": "2054f855effdaa18", "Qwen3Attention.forward": "46cd4f9c14cd0e72"},
}


def upstream_fingerprints(module) -> dict[str, str]:
    """sha256 (16 hex digits) of each top-level function's and method's source in a modeling file."""
    import ast
    import hashlib
    import inspect

    text = inspect.getsource(module)
    found = {}
    for node in ast.parse(text).body:
        members = [(node.name, node)] if isinstance(node, ast.FunctionDef) else \
            [(f"{node.name}.{item.name}", item) for item in node.body if isinstance(item, ast.FunctionDef)] \
            if isinstance(node, ast.ClassDef) else []
        for name, fn in members:
            found[name] = hashlib.sha256(ast.get_source_segment(text, fn).encode()).hexdigest()[:16]
    return found


def test_upstream_forwards_are_the_ones_the_patches_were_written_against():
    for module, expected in ((modeling_qwen2, UPSTREAM["qwen2"]), (modeling_qwen3, UPSTREAM["qwen3"])):
        found = upstream_fingerprints(module)
        changed = {name: found.get(name) for name, digest in expected.items() if found.get(name) != digest}
        assert not changed, f"transformers changed {sorted(changed)} in {module.__name__}: re-check the patches"


def test_an_unchecked_transformers_release_is_refused_unless_overridden(monkeypatch):
    from patches.registry import UNCHECKED_ENV, check_transformers

    assert check_transformers("5.10.4") == "5.10.4" and check_transformers("5.17.0") == "5.17.0"
    for version in ("5.4.0", "5.18.0", "6.0.0"):
        with pytest.raises(RuntimeError, match=rf"transformers {version} is not a release .* {UNCHECKED_ENV}=1"):
            check_transformers(version)
    monkeypatch.setenv(UNCHECKED_ENV, "1")
    assert check_transformers("6.0.0") == "6.0.0"


def test_a_refused_release_leaves_the_current_patches_in_place(monkeypatch):
    import transformers

    patches.apply("rope")
    monkeypatch.setattr(transformers, "__version__", "9.0.0")
    with pytest.raises(RuntimeError, match="9.0.0"):
        patches.apply("all")
    assert patches.active() == {"rope"}
