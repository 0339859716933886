"""reduction="vllm_cpu_graph" takes where vLLM-CPU's graph stores the FP32 stream from the graph vLLM compiles
here (patches.engine_table.stream_pattern), once per family and depth, cached on disk; where it cannot be read,
the order is refused naming why and the orders allowed instead. No compile here: the read itself is checked
against the graph in tests/test_patches_vllm.py."""

import json
import subprocess

import pytest
import torch

import patches
from patches import _precision, engine_table
from patches.engine_table import EngineConfig, StreamNotReadable
from tests.model_factory import tiny_model


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLA_TABLE_CACHE", str(tmp_path / "tables"))
    monkeypatch.delenv(engine_table.ENGINE_CONFIG_ENV, raising=False)
    monkeypatch.setattr(engine_table, "installed_vllm", lambda: "vllm 0.0-test")
    yield tmp_path / "tables"
    patches.remove()


def forward(arch="qwen2"):
    with patches.aligned("all", target="vllm-cpu", reduction="vllm_cpu_graph"):
        return tiny_model(arch)(torch.randint(0, 256, (1, 8))).logits


def test_where_vllm_is_not_installed_the_order_is_refused_naming_why_and_the_alternatives(monkeypatch):
    monkeypatch.setattr(engine_table, "installed_vllm", lambda: None)
    with pytest.raises(StreamNotReadable, match="vLLM is not installed here") as err:
        forward()
    assert "'inductor_cpu'" in str(err.value) and "'eager'" in str(err.value)


def test_an_engine_off_the_cpu_is_refused(monkeypatch):
    with pytest.raises(StreamNotReadable, match="device 'cuda'.*allowed instead: reduction 'inductor_cpu'"):
        engine_table.stream_pattern("qwen2", 4, EngineConfig(device="cuda"))


def test_a_failed_read_is_refused_with_the_readers_reason(monkeypatch, cache):
    failed = subprocess.CompletedProcess([], 2, "", "patches.engine_table: vLLM runs on 'cuda' here, not its CPU build\n")
    monkeypatch.setattr(engine_table.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(StreamNotReadable, match="vLLM runs on 'cuda' here.*allowed instead"):
        engine_table.stream_pattern("qwen3", 4, log=lambda msg: None)
    assert not list(cache.glob("stream-*.json"))  # nothing read, nothing cached


def test_a_bad_family_or_depth_is_refused_naming_it():
    with pytest.raises(ValueError, match="'llama' at 4 layers; allowed: qwen2, qwen3"):
        engine_table.stream_pattern("llama", 4)
    with pytest.raises(ValueError, match="'qwen2' at 0 layers"):
        engine_table.stream_pattern("qwen2", 0)


def test_a_pattern_is_read_once_cached_and_forgotten_with_the_patches(monkeypatch):
    """One child process per (family, depth): a second process finds it on disk, the same process in memory;
    `patches.remove` forgets what the process holds, as it undoes the rest."""
    reads = []

    def fake_read(path, family, layers, config, log):
        reads.append((family, layers))
        path.write_text(json.dumps({"stores_stream": [i % 3 == 0 for i in range(layers)]}))

    monkeypatch.setattr(engine_table, "read_stream", fake_read)
    assert engine_table.stream_pattern("qwen2", 4) == (True, False, False, True)
    assert engine_table.stream_pattern("qwen2", 4) == (True, False, False, True) and reads == [("qwen2", 4)]
    forward("qwen3")  # every layer of the model asks; one read for its depth
    assert len(reads) == 2 and reads[1][0] == "qwen3" and _precision._stream_patterns == {}
    config = tiny_model("qwen3").config
    assert [_precision.graph_stores_stream(config, i) for i in range(config.num_hidden_layers)] == [
        i % 3 == 0 for i in range(config.num_hidden_layers)]
    assert len(reads) == 2  # on disk already
    patches.remove()
    assert _precision._stream_patterns == {}
