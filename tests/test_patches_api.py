"""The public API of `patches`: specs, apply/remove/aligned, coverage checks, the verl plugin."""

import sys
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen3MoeConfig, Qwen3MoeForCausalLM
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
    (modeling_qwen2.Qwen2Model, "forward"): modeling_qwen2.Qwen2Model.forward,
    (modeling_qwen3.Qwen3Model, "forward"): modeling_qwen3.Qwen3Model.forward,
    (PreTrainedModel, "post_init"): PreTrainedModel.post_init,
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
    assert "use an ablation (none, rope, swiglu, rmsnorm, all), a region (rope, swiglu, rmsnorm), a comma" in msg
    bad = {"ropee": "'ropee'", "rope,swigl": "'swigl'", 3: "3", "all,rope": "'all'"}.get(spec if not isinstance(spec, list) else None, "'everything'")
    assert bad in msg
    assert patches.active() == {"rope"}  # a bad spec changes nothing


def test_bad_reduction():
    with pytest.raises(ValueError, match="^unknown reduction order 'fast'; allowed: eager, inductor_cpu, vllm_cpu_graph$"):
        patches.apply("all", reduction="fast")


def test_targets():
    assert tuple(patches.TARGETS) == ("vllm", "vllm-cpu") and patches.DEFAULT_TARGET == "vllm"
    assert patches.apply("all") and patches.active_target() == "vllm"
    patches.apply("all", target="vllm-cpu")
    assert patches.active_target() == "vllm-cpu"
    with patches.aligned("rope", target="vllm"):
        assert patches.active_target() == "vllm"
    assert patches.active_target() == "vllm-cpu" and patches.active() == set(patches.REGIONS)
    patches.remove()
    assert patches.active_target() == "vllm"


def test_bad_target_names_value_and_allowed():
    patches.apply("rope", target="vllm-cpu")
    with pytest.raises(ValueError, match="unknown alignment target 'gpu'; allowed: vllm, vllm-cpu"):
        patches.apply("all", target="gpu")
    assert patches.active() == {"rope"} and patches.active_target() == "vllm-cpu"  # a bad value changes nothing


def test_the_targets_differ_only_in_the_layer_output():
    from patches.targets import TARGETS, VALUES

    gpu, cpu = TARGETS["vllm"].stores, TARGETS["vllm-cpu"].stores
    assert set(gpu) == set(cpu) == set(VALUES)
    assert {v for v in VALUES if gpu[v] != cpu[v]} == {"residual.layer_output"}
    assert TARGETS["vllm"].rounds_layer_output and not TARGETS["vllm-cpu"].rounds_layer_output


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
    assert patches.active() == frozenset() and isinstance(patches.active(), frozenset)


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


SUPPORTED = "supported: Qwen2DecoderLayer, Qwen3DecoderLayer"


def test_check_model_rejects_uncovered_models():
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(patches.UnsupportedModelError,
                       match=f"^LlamaForCausalLM: LlamaDecoderLayer with LlamaMLP is not covered by the alignment "
                             f"patches; {SUPPORTED} with their dense SiLU MLPs$"):
        patches.check_model(llama)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             moe_intermediate_size=32, num_experts=2, num_experts_per_tok=1,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             head_dim=16))
    with pytest.raises(patches.UnsupportedModelError,
                       match="^Qwen3MoeForCausalLM: Qwen3MoeDecoderLayer with Qwen3MoeSparseMoeBlock is not covered"):
        patches.check_model(moe)
    with pytest.raises(patches.UnsupportedModelError,
                       match=f"^Linear has no decoder layers the patches know; {SUPPORTED}$"):
        patches.check_model(torch.nn.Linear(2, 2))
    no_mlp = tiny_model("qwen2")
    del no_mlp.model.layers[0].mlp  # a decoder layer of a known class, rebuilt without its MLP
    with pytest.raises(patches.UnsupportedModelError, match="^Qwen2ForCausalLM: Qwen2DecoderLayer with NoneType is "):
        patches.check_model(no_mlp)


def test_check_model_refuses_what_the_given_regions_do_not_cover():
    """An activation other than SiLU concerns the swiglu region only, a scaled RoPE the rope region only:
    check_model refuses each for its region, with the region's own message, and passes the others."""
    gelu = tiny_model("qwen2", hidden_act="gelu")
    with pytest.raises(patches.UnsupportedModelError,
                       match=r"^Qwen2MLP: hidden_act 'gelu' is not covered by the aligned SwiGLU \(it computes "
                             r"silu\(gate\) \* up; supported: silu, swish\)$"):
        patches.check_model(gelu)  # every region by default
    assert patches.check_model(gelu, ("rope", "rmsnorm")) == "qwen2"
    with pytest.raises(patches.UnsupportedModelError, match="^Qwen2MLP: hidden_act 'gelu'"):
        patches.check_model(gelu, "all")  # a spec as apply takes it
    assert patches.check_model(gelu, "rope,rmsnorm") == "qwen2"
    assert patches.check_model(tiny_model("qwen2", hidden_act="swish"), ("swiglu",)) == "qwen2"
    scaled = tiny_model("qwen3", rope_parameters={"rope_type": "llama3", "factor": 2.0, "rope_theta": 1e6,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 128})
    with pytest.raises(patches.UnsupportedModelError, match=r"^Qwen3RotaryEmbedding: rope_type 'llama3' is not "):
        patches.check_model(scaled, ("rope",))
    assert patches.check_model(scaled, ("swiglu", "rmsnorm")) == "qwen3"


DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e6, "max_trained_positions": 128}


@pytest.fixture
def dynamic_unseen(monkeypatch):
    """No dynamic-scaling config warned about yet, and no vLLM to compare with (tests/test_rope_scalings.py
    compares with vLLM's own table)."""
    from patches import rope

    monkeypatch.setattr(rope, "_dynamic_seen", set())
    monkeypatch.setattr(rope, "_installed_vllm_table", lambda config: None)


def dynamic_warnings(record) -> list[str]:
    from patches.rope import DynamicRopeWarning

    return [str(w.message) for w in record if issubclass(w.category, DynamicRopeWarning)]


def test_a_dynamic_rope_config_is_warned_about_once_naming_the_key_and_the_engines_formula(dynamic_unseen, recwarn):
    ids = torch.arange(6)[None]
    with patches.aligned("rope"):
        for _ in range(2):  # the same config twice, each model built and run twice
            model = tiny_model("qwen2", rope_parameters=dict(DYNAMIC))
            model(ids), model(ids)
    (message,) = dynamic_warnings(recwarn)
    assert message.startswith("rope_parameters['rope_type'] = 'dynamic' (with factor = 4.0): the aligned RoPE builds "
                              "vLLM's table, whose base is fixed once from the config, base = rope_theta * (factor * "
                              "max_position_embeddings / max_trained_positions - (factor - 1)) ** (head_dim / "
                              "(head_dim - 2)) = 1000000.0 * (4.0 * 512 / 128 - (4.0 - 1)) ** (32 / 30) = 1.54243e+07; "
                              "transformers instead grows the base with the sequence")
    with patches.aligned("rope"):  # another dynamic config: warned about too
        tiny_model("qwen3", rope_parameters={**DYNAMIC, "factor": 2.0})
    assert len(dynamic_warnings(recwarn)) == 2 and "(with factor = 2.0)" in dynamic_warnings(recwarn)[1]


def test_no_dynamic_rope_warning_without_the_rope_region_or_the_scaling(dynamic_unseen, recwarn):
    with patches.aligned("swiglu,rmsnorm"):
        tiny_model("qwen2", rope_parameters=dict(DYNAMIC))(torch.arange(6)[None])
    with patches.aligned("rope"):
        tiny_model("qwen2")(torch.arange(6)[None])
    assert dynamic_warnings(recwarn) == []


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


# These import the plugin the way verl's own HFModelConfig does (`external_lib`), in this process; the
# plugin inside verl's real trainer and its Ray workers is tested by `make test-verl`.
def test_plugin_loaded_by_verls_model_config(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("RLA_REGIONS", "rope")
    _hf_model_config(tiny_model_dir)
    assert patches.active() == {"rope"}
    monkeypatch.setenv("RLA_REGIONS", "rope,swiglu,rmsnorm")
    _hf_model_config(tiny_model_dir)
    assert patches.active() == set(patches.REGIONS)


def test_plugin_unset_means_stock(tiny_model_dir, monkeypatch):
    patches.apply("all")
    monkeypatch.delenv("RLA_REGIONS", raising=False)
    _hf_model_config(tiny_model_dir)
    assert patches.active() == frozenset()


def test_plugin_bad_value_fails_loudly(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("RLA_REGIONS", "rope,swigloo")
    with pytest.raises(ValueError, match="RLA_REGIONS='rope,swigloo'.*'swigloo'"):
        _hf_model_config(tiny_model_dir)


def test_plugin_target(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("RLA_REGIONS", "all")
    monkeypatch.setenv("RLA_TARGET", "vllm-cpu")
    _hf_model_config(tiny_model_dir)
    assert patches.active_target() == "vllm-cpu"
    monkeypatch.delenv("RLA_TARGET")
    _hf_model_config(tiny_model_dir)
    assert patches.active_target() == "vllm"
    monkeypatch.setenv("RLA_TARGET", "h200")
    with pytest.raises(ValueError, match="RLA_TARGET='h200'.*'h200'; allowed: vllm, vllm-cpu"):
        _hf_model_config(tiny_model_dir)


def test_plugin_impl(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("RLA_REGIONS", "all")
    monkeypatch.setenv("RLA_IMPL", "eager")
    _hf_model_config(tiny_model_dir)
    assert patches.active() == set(patches.REGIONS) and patches._precision.impl() == "eager"
    monkeypatch.setenv("RLA_IMPL", "turbo")
    with pytest.raises(ValueError, match="RLA_IMPL='turbo'.*'turbo'.*auto, eager, fused"):
        _hf_model_config(tiny_model_dir)


# ---- the transformers source the patches were checked against --------------------------------------

def test_the_installed_transformers_is_a_checked_source():
    from patches.upstream import CHECKED, check_transformers, checked_release, installed_fingerprints

    releases = checked_release(installed_fingerprints())
    assert releases is not None, "the installed transformers' Qwen forwards are not a checked set"
    import transformers

    assert transformers.__version__ in releases.split(", ") and check_transformers() == releases
    assert len(CHECKED) >= 2  # 5.9 (verl's GPU environment) and 5.19 (vllm-cpu's) differ in the rotary code


def test_the_package_admits_every_checked_transformers_release():
    from patches.upstream import CHECKED

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    wanted = {Requirement(r).name: Requirement(r).specifier for r in project["dependencies"]}
    checked = [release for releases in CHECKED for release in releases.split(", ")]
    assert [r for r in checked if r not in wanted["transformers"]] == []
    assert all(s.operator not in ("<", "<=", "==", "~=") for s in wanted["torch"])  # torch unbounded above


def test_a_changed_forward_is_refused_unless_overridden(monkeypatch):
    from patches import upstream

    changed = {fam: dict(fns) for fam, fns in upstream.installed_fingerprints().items()}
    changed["qwen2"]["Qwen2DecoderLayer.forward"] = "0" * 16
    patches.apply("rope")
    monkeypatch.setattr(upstream, "installed_fingerprints", lambda: changed)
    with pytest.raises(RuntimeError, match=r"not a release .*checked.*qwen2:Qwen2DecoderLayer.forward.*RLA_TRANSFORMERS"):
        patches.apply("all")
    assert patches.active() == {"rope"}  # a refused source leaves the current patches in place
    monkeypatch.setenv(upstream.UNCHECKED_ENV, "1")
    assert "unchecked" in upstream.check_transformers()


def test_fingerprints_read_the_source_of_each_function():
    from patches.upstream import fingerprints_of_source

    text = "class Qwen2MLP:\n    def forward(self, x):\n        return x\n"
    same = fingerprints_of_source(text, "Qwen2")
    edited = fingerprints_of_source(text.replace("return x", "return x + 1"), "Qwen2")
    assert same["Qwen2MLP.forward"] != edited["Qwen2MLP.forward"] and same["apply_rotary_pos_emb"] == "missing"


@pytest.mark.parametrize("change, message", [
    ({"rope.out": False}, "rope.out kept in FP32 .* no table can keep it in FP32"),
    ({"swiglu.out": False}, "swiglu.out kept in FP32 .* no table can keep it in FP32"),
    ({"residual.layer_output": "yes"}, "residual.layer_output is 'yes'; allowed: True"),
    ({"rope.sum": True}, "unknown rope.sum"),
])
def test_a_table_the_regions_cannot_compute_is_refused_naming_the_value(change, message):
    from dataclasses import replace

    from patches.targets import TARGETS

    patches.apply("rope", target="vllm-cpu")
    table = replace(TARGETS["vllm"], name="mine", stores={**TARGETS["vllm"].stores, **change})
    with pytest.raises(ValueError, match=f"alignment target 'mine': .*{message}"):
        patches.apply("all", target=table)
    assert patches.active() == {"rope"} and patches.active_target() == "vllm-cpu"  # a refused table changes nothing


def test_a_table_without_a_value_is_refused_naming_it():
    from dataclasses import replace

    from patches.targets import TARGETS

    stores = {k: v for k, v in TARGETS["vllm"].stores.items() if k != "swiglu.silu"}
    with pytest.raises(ValueError, match="missing swiglu.silu"):
        patches.apply("all", target=replace(TARGETS["vllm"], name="mine", stores=stores))


def test_aligned_restores_a_target_given_as_a_table():
    from dataclasses import replace

    from patches.targets import TARGETS

    mine = replace(TARGETS["vllm-cpu"], name="mine")
    patches.apply("all", target=mine)
    with patches.aligned("rope", target="vllm"):
        assert patches.active_target() == "vllm"
    assert patches.active_target() == "mine"
