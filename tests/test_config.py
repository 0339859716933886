"""One configuration layer (rla.config, rla.names) for both backends and the workflow."""

import dataclasses

import pytest
import yaml

from rla import config, names, reference
from rla.config import ConfigError
from tests.test_workflow import REPO

TINY, PAPER = config.load(REPO / "experiments/tiny.yaml"), config.load(REPO / "experiments/paper.yaml")


def test_every_experiment_config_passes_its_backends_checks():
    for cfg in (TINY, PAPER, config.load(REPO / "experiments/micro.yaml")):
        for model in cfg["models"]:
            config.model_spec(cfg, model, cfg["backend"])
            config.rl_settings(cfg, cfg["backend"], model)


@pytest.mark.parametrize("key, value, message", [
    ("lr", "0.001", r"rl.lr = '0.001' \(str\) is invalid: it must be a number > 0"),
    ("prompts_per_step", 0, r"rl.prompts_per_step = 0 \(int\) is invalid: it must be a positive integer"),
    ("loss_agg_mode", "mean", r"rl.loss_agg_mode = 'mean' is not allowed; allowed: token-mean, "),
    ("betas", [0.9], r"rl.betas = \[0.9\] \(list\) is invalid: it must be two numbers in \[0, 1\)"),
    ("learning_rate", 1e-4, r"unknown rl setting\(s\) \['learning_rate'\]; allowed: .*lr,"),
    ("micro_batch_size_per_gpu", 2, r"\(micro_batch_size_per_gpu: not a setting of the local backend\)"),
])
def test_bad_values_and_keys_name_key_value_and_allowed(key, value, message):
    with pytest.raises(ConfigError, match=message):
        config.rl_settings({**TINY, "rl": {**TINY["rl"], key: value}}, "local")


def test_one_meaning_per_key_in_both_backends():
    """A key both backends read has one default; the local trainer's mini-batch is verl's size in prompts."""
    local, verl = config.rl_settings({"rl": {}}, "local"), config.rl_settings({"rl": {}}, "verl")
    assert {k: v for k, v in local.items() if k in verl} == {k: v for k, v in verl.items() if k in local}
    rl = config.rl_settings(TINY, "local")
    assert rl["prompts_per_step"] // rl["ppo_mini_batch_size"] == 2  # two optimizer steps per RL step
    with pytest.raises(ConfigError, match="must divide rl.prompts_per_step = 8"):
        config.rl_settings({"rl": {"prompts_per_step": 8, "ppo_mini_batch_size": 3}}, "local")


def test_per_model_rl_and_cluster_shape():
    rl = config.rl_settings(PAPER, "verl", "qwen2.5-math-7b")
    assert rl["max_response_length"] == 3072 and config.rl_settings(PAPER, "verl")["max_response_length"] == 8192
    assert config.verl_settings(PAPER, "qwen3-8b")["rollout_tp"] == 2


def test_the_schema_names_what_rla_names_holds():
    schema = yaml.safe_load((REPO / "workflows/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["ablations"]["items"]["enum"] == list(names.ABLATIONS)
    assert set(names.SECTIONS) <= set(schema["properties"])
    assert names.subset_name(("swiglu", "rope")) == "rope+swiglu" and names.subset_name(names.REGIONS) == "all"


def test_the_settings_reference_is_generated_from_the_tables():
    page = (REPO / "docs/reference/config.md").read_text()
    assert page == reference.page(), "docs/reference/config.md is stale: python -m rla.reference > docs/reference/config.md"
    for section, keys, _ in reference.SECTIONS:
        assert f"## `{section}`" in page and all(f"| `{name}` |" in page for name in keys)


def test_the_staleness_check_sees_a_changed_setting(monkeypatch):
    """The check above can fail: a setting whose help, default or identity changes changes the page."""
    before = reference.page()
    key = config.RL["checkpoint_every"]
    for changed in (dataclasses.replace(key, help="another meaning"), dataclasses.replace(key, default=7),
                    dataclasses.replace(key, identity=True)):
        monkeypatch.setitem(config.RL, "checkpoint_every", changed)
        assert reference.page() != before


def test_identity_flags_keep_only_what_a_cell_computes():
    rl = config.rl_settings({}, "verl")
    kept = config.identity_of(rl, config.RL)
    assert set(rl) - set(kept) == {"checkpoint_every", "keep_checkpoints"}
    engine = config.engine_settings({})
    assert config.identity_of(engine, config.ENGINE) == {"name": "auto", "target": "auto"}


def test_one_key_settings_are_written_as_verl_values():
    rl = config.rl_settings({"rl": {"lr": 1, "betas": [0, 0.5], "prompts_per_step": 4}}, "verl")
    written = config.verl_overrides(rl, config.RL)
    assert written[config.A + "actor.optim.lr"] == 1.0 and isinstance(written[config.A + "actor.optim.lr"], float)
    assert written[config.A + "actor.optim.betas"] == [0.0, 0.5] and written["data.train_batch_size"] == 4
    several = [v for key in config.RL.values() if len(key.verl) > 1 for v in key.verl]
    assert several and not set(several) & set(written)  # derived by hand (verlrun.overrides)
