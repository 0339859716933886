"""The aligned RoPE's cos/sin under every scaling it implements equal vLLM's own table for that scaling,
built by vLLM's `get_rope` from the same config (vLLM's CPU build, imported, not run as an engine), bit
for bit at every position the table holds."""

import pytest
import torch

import patches
from patches import rope
from tests.model_factory import tiny_config

vllm_rope = pytest.importorskip("vllm.model_executor.layers.rotary_embedding", reason="needs vLLM's CPU build")

MAX_POS = 2048
SCALINGS = {
    "default": {},
    "linear": {"factor": 2.5},
    "dynamic": {"factor": 4.0},
    "dynamic-trained": {"factor": 2.0, "max_trained_positions": 1024},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 512},
    "yarn-mscale": {"factor": 4.0, "original_max_position_embeddings": 512, "mscale": 0.707, "mscale_all_dim": 1.0,
                    "beta_fast": 16, "beta_slow": 2},
}


def rotary(arch: str, rope_parameters: dict):
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    cfg = tiny_config(arch, head_dim=64, max_position_embeddings=MAX_POS)
    cfg.rope_parameters = rope_parameters
    module = modeling_qwen2.Qwen2RotaryEmbedding if arch == "qwen2" else modeling_qwen3.Qwen3RotaryEmbedding
    return module(cfg)


def engine_table(rope_parameters: dict) -> torch.Tensor:
    from vllm.config import VllmConfig, set_current_vllm_config

    vllm_rope._ROPE_DICT.clear()
    with set_current_vllm_config(VllmConfig()):  # vLLM's modules are built inside a config
        return vllm_rope.get_rope(64, MAX_POS, True, dict(rope_parameters), torch.bfloat16).cos_sin_cache


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("name", SCALINGS)
def test_aligned_cos_sin_are_vllms_table(arch, name):
    params = {"rope_type": name.split("-")[0], "rope_theta": 1e6, **SCALINGS[name]}
    table = engine_table(params)
    pos = torch.arange(table.shape[0])[None]
    emb = rotary(arch, params)
    with patches.aligned("rope"):
        cos, sin = emb(torch.zeros(1, dtype=torch.bfloat16), pos)
    want_cos, want_sin = table.chunk(2, dim=-1)
    assert torch.equal(cos[0, :, :32], want_cos) and torch.equal(sin[0, :, :32], want_sin)
    assert torch.equal(cos[0, :, 32:], want_cos)  # HF's layout: the half repeated
    if name == "linear":  # transformers divides inv_freq by the factor, vLLM the position
        stock_cos, _ = emb(torch.zeros(1, dtype=torch.bfloat16), pos)
        differ = (stock_cos[0, :, :32] != want_cos).float().mean().item()
        print(f"linear: stock cos differs from vLLM's table on {differ:.2%}")
        assert differ > 0  # a last-bit angle difference flips a bf16 rounding now and then (0.1% here)


def test_a_yarn_config_without_its_original_length_is_refused_naming_it():
    params = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 512}
    emb = rotary("qwen3", params)
    del emb.config.rope_parameters["original_max_position_embeddings"]
    with patches.aligned("rope"), pytest.raises(patches.UnsupportedModelError,
                                                 match=r"rope_parameters\['original_max_position_embeddings'\]"):
        emb(torch.zeros(1, dtype=torch.bfloat16), torch.arange(4)[None])
    assert set(rope.ENGINE_ROPES) == {"default", "linear", "dynamic", "yarn"}


@pytest.fixture
def dynamic_unseen(monkeypatch):
    monkeypatch.setattr(rope, "_dynamic_seen", set())


@pytest.mark.parametrize("name", ["dynamic", "dynamic-trained"])
def test_a_dynamic_config_whose_table_is_the_installed_vllms_is_warned_about_not_refused(name, dynamic_unseen):
    emb = rotary("qwen2", {"rope_type": "dynamic", "rope_theta": 1e6, **SCALINGS[name]})
    with patches.aligned("rope"), pytest.warns(rope.DynamicRopeWarning, match=r"^rope_parameters\['rope_type'\] = "
                                                                               r"'dynamic' \(with factor = "):
        emb(torch.zeros(1, dtype=torch.bfloat16), torch.arange(4)[None])


def test_a_dynamic_config_is_refused_where_the_installed_vllm_builds_another_table(dynamic_unseen, monkeypatch):
    # an engine whose dynamic table is the unscaled one: the base no longer grows by the factor
    monkeypatch.setattr(vllm_rope.DynamicNTKScalingRotaryEmbedding, "_compute_cos_sin_cache",
                        vllm_rope.RotaryEmbedding._compute_cos_sin_cache)
    emb = rotary("qwen3", {"rope_type": "dynamic", "rope_theta": 1e6, **SCALINGS["dynamic-trained"]})
    with patches.aligned("rope"), pytest.raises(
            patches.UnsupportedModelError,
            match=r"^rope_parameters\['rope_type'\] = 'dynamic': the installed vLLM \S+ builds another cos/sin table "
                  r"for this config than the aligned RoPE \(they differ in \d+\.\d% of entries\), whose base is "
                  r"rope_theta \* \(factor \* max_position_embeddings / max_trained_positions - \(factor - 1\)\)"):
        emb(torch.zeros(1, dtype=torch.bfloat16), torch.arange(4)[None])
