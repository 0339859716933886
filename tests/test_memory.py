"""The memory plan: parameter counts against real transformers models, the budgets it picks for the
paper grid, and clear errors."""

from __future__ import annotations

import pytest

from verlrun import memory
from rla.config import load as load_config
from verlrun.overrides import memory_setup, token_budget
from tests.test_verlrun import PAPER

GB = 1e9


def _shape_from_config(config: dict) -> memory.Shape:
    """A Shape from the fields of a Hugging Face `config.json` (a dict)."""
    fields = {name: config[name] for name in memory.Shape.__dataclass_fields__ if name in config}
    fields["attention_bias"] = config.get("model_type") == "qwen2"  # always q/k/v biases; its config does not say so
    fields["qk_norm"] = config.get("model_type") == "qwen3"
    return memory.Shape(**fields)


def _tiny(arch: str, **kw):
    import transformers

    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[arch]
    config = cls(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, vocab_size=500, **kw)
    return config, transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("arch,kw", [("qwen2", {"tie_word_embeddings": False}), ("qwen2", {"tie_word_embeddings": True}),
                                     ("qwen3", {"tie_word_embeddings": False, "head_dim": 32}), ("qwen3", {"tie_word_embeddings": True})])
def test_parameter_count_equals_a_real_model(arch, kw):
    config, model = _tiny(arch, **kw)
    shape = _shape_from_config(config.to_dict())
    assert shape.params() == sum(p.numel() for p in model.parameters())


def test_the_paper_models_have_their_published_sizes():
    sizes = {name: shape.params() / GB for name, shape in memory.KNOWN_SHAPES.items()}
    assert sizes["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"] == pytest.approx(1.777, abs=0.001)
    assert sizes["Qwen/Qwen2.5-Math-7B"] == pytest.approx(7.616, abs=0.001)
    assert sizes["Qwen/Qwen3-1.7B"] == pytest.approx(1.72, abs=0.01)
    assert sizes["Qwen/Qwen3-8B"] == pytest.approx(8.19, abs=0.01)


def test_logits_for_a_152k_vocabulary_dominate_the_old_micro_batches():
    shape = memory.KNOWN_SHAPES["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]
    tokens = 4 * (1024 + 8192)  # the former micro-batch of 4 at full length
    old = memory.breakdown(shape, tokens, memory.Setup(), "old_log_prob")
    assert old["logits + log-prob temporaries"] / GB == pytest.approx(tokens * 151936 * 8 / GB)
    assert tokens * 151936 * 2 / GB == pytest.approx(11.2, abs=0.1)  # the BF16 logits alone
    assert not memory.fits(shape, tokens, memory.Setup())


def test_every_paper_model_gets_a_budget_that_fits_and_the_next_step_does_not():
    paper = load_config(PAPER)
    for model in paper["models"]:
        spec = paper["model_specs"][model]
        shape, setup = memory.shape_of(spec), memory_setup(paper, model)
        budget = token_budget(paper, model)
        rl = {**paper["rl"], **(spec.get("rl") or {})}
        assert budget >= rl["max_prompt_length"] + rl["max_response_length"]
        assert memory.fits(shape, budget, setup)
        assert not memory.fits(shape, budget + 1024, setup)
        peaks = memory.peak_bytes(shape, budget, setup)
        assert max(peaks["update"], peaks["old_log_prob"]) <= 80 * memory.GIB * 0.85
        assert peaks["rollout"] <= 80 * memory.GIB * 0.85


def test_memory_grows_with_tokens_and_shrinks_with_gpus():
    shape = memory.KNOWN_SHAPES["Qwen/Qwen3-8B"]
    small, large = (memory.peak_bytes(shape, t, memory.Setup()) for t in (8192, 16384))
    assert all(large[p] >= small[p] for p in memory.PHASES) and large["update"] > small["update"]
    assert memory.peak_bytes(shape, 8192, memory.Setup(gpus=16))["update"] < small["update"]


def test_a_setup_that_cannot_fit_says_why():
    with pytest.raises(ValueError, match=r"9216 tokens.*80 GiB GPU.*GiB usable"):
        memory.plan_token_budget(memory.KNOWN_SHAPES["Qwen/Qwen3-8B"], memory.Setup(gpus=1), 9216)


def test_unknown_models_and_phases_name_the_allowed_ones():
    with pytest.raises(ValueError, match="'org/other'.*shape.*Qwen/Qwen3-8B"):
        memory.shape_of({"path": "org/other"})
    with pytest.raises(ValueError, match="'warmup'.*rollout, old_log_prob, update"):
        memory.breakdown(memory.KNOWN_SHAPES["Qwen/Qwen3-8B"], 1, memory.Setup(), "warmup")
    shape = memory.shape_of({"path": "org/other", "shape": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                             "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 500}})
    assert shape.params() > 0


def test_a_fixed_budget_below_the_longest_sequence_is_rejected():
    paper = load_config(PAPER)
    bad = {**paper, "rl": {**paper["rl"], "max_token_len_per_gpu": 4096}}
    with pytest.raises(ValueError, match=r"max_token_len_per_gpu=4096.*'auto'.*9216"):
        token_budget(bad, "qwen3-8b")
    assert token_budget({**paper, "rl": {**paper["rl"], "max_token_len_per_gpu": 12288}}, "qwen3-8b") == 12288
