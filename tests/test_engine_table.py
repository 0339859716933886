"""target="auto": the table is read off vLLM as installed, compiled with the rollout's engine config, and a
configuration whose roundings the map cannot attribute is refused, naming the setting and what avoids it.

The reads compile vLLM-CPU (up to its graph: about 20 s a family on 2 cores), so they are `make test-long`'s;
the refusals that need no compile and the config checks run in `make test`."""

import json
import subprocess
import sys

import pytest
import torch

import patches
from localrl.vllm_support import unavailable_reason
from patches import engine_table
from patches.engine_table import EngineConfig, EngineNotReadable
from patches.targets import TARGETS
from tests.model_factory import tiny_model, to_bf16_fsdp_style

needs_vllm = pytest.mark.skipif(unavailable_reason() is not None, reason=f"vLLM cannot run here: {unavailable_reason()}")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLA_TABLE_CACHE", str(tmp_path / "tables"))
    return tmp_path / "tables"


@pytest.mark.parametrize("text, named", [
    ('{"devic": "cuda"}', "devic"), ('{"device": "tpu"}', "tpu"), ('{"tensor_parallel_size": 0}', "0"),
    ('{"compilation_config": 3}', "compilation_config 3"), ("{not json", "RLA_ENGINE_CONFIG"),
])
def test_a_bad_engine_config_is_refused_naming_the_value(text, named, monkeypatch):
    monkeypatch.setenv(engine_table.ENGINE_CONFIG_ENV, text)
    with pytest.raises(ValueError, match=named):
        EngineConfig.from_env()


@pytest.mark.parametrize("config, setting, avoid", [
    ({"enforce_eager": True}, "enforce_eager=True", "enforce_eager=False"),
    ({"compilation_config": {"mode": 0}}, "mode=0", "enforce_eager=False"),
    ({"device": "cuda", "tensor_parallel_size": 2}, "tensor_parallel_size=2", "fuse_allreduce_rms=False"),
    ({"compilation_config": {"pass_config": {"enable_qk_norm_rope_fusion": True}}}, "enable_qk_norm_rope_fusion",
     "enable_qk_norm_rope_fusion=False"),
])
def test_settings_the_map_cannot_attribute_are_refused_before_compiling(config, setting, avoid, cache, monkeypatch):
    before = patches.apply("rope", target="vllm-cpu")
    monkeypatch.setenv(engine_table.ENGINE_CONFIG_ENV, json.dumps(config))
    with pytest.raises(EngineNotReadable, match="avoid") as err:
        patches.apply("all", target="auto")
    assert setting in str(err.value) and avoid in str(err.value)
    assert not cache.exists() or not list(cache.glob("*.json"))  # nothing compiled, nothing cached
    assert patches.active() == before and patches.active_target() == "vllm-cpu"
    patches.remove()


def test_tensor_parallel_without_the_fusion_is_read_at_one_rank():
    config = EngineConfig.parse({"device": "cuda", "tensor_parallel_size": 2,
                                 "compilation_config": {"pass_config": {"fuse_allreduce_rms": False}}})
    assert engine_table.refusal(config) is None


def test_a_killed_read_leaves_nothing_behind_and_a_cached_table_is_used(cache, monkeypatch):
    """The cache holds complete tables only, keyed by (vLLM version, config, family, device kind)."""
    config = EngineConfig()
    reads = []

    def fake_read(path, family, config, version, log):
        reads.append(family)
        path.write_text(json.dumps({"stores": {v: TARGETS["vllm-cpu"].stores[v] for v in engine_table.FAMILY_VALUES[family]}}))

    monkeypatch.setattr(engine_table, "read_family", fake_read)
    monkeypatch.setattr(engine_table, "vllm_version", lambda: "vllm 0.0-test")
    first = engine_table.auto_target(config, log=lambda msg: None)
    assert first.stores == TARGETS["vllm-cpu"].stores and first.name == "auto:vllm-cpu"
    assert engine_table.auto_target(config, log=lambda msg: None) == first and sorted(reads) == ["qwen2", "qwen3"]
    engine_table.auto_target(EngineConfig(device="cuda"), log=lambda msg: None)  # another config: read again
    assert sorted(reads) == ["qwen2", "qwen2", "qwen3", "qwen3"]


# ---- the real engine: vLLM-CPU compiled under the hook ---------------------------------------------------

def auto(config: dict):
    """The table `auto` reads for `config`, through the command line a user runs (a fresh process)."""
    proc = subprocess.run([sys.executable, "-m", "patches.engine_table", "--config", json.dumps(config)],
                          capture_output=True, text=True, timeout=900)
    return proc


@pytest.mark.long
@needs_vllm
def test_auto_reads_the_cpu_builds_table_and_the_gpu_splits(tmp_path):
    """vLLM-CPU as installed (one graph) is `vllm-cpu`; the same code split at attention as on a GPU is
    `vllm` - two different tables from one reader, so the reader is not answering by name."""
    cpu = auto({"device": "cpu"})
    assert cpu.returncode == 0 and "target: auto:vllm-cpu" in cpu.stdout, cpu.stderr[-3000:]
    gpu = auto({"device": "cuda"})
    assert gpu.returncode == 0 and "target: auto:vllm" in gpu.stdout and "auto:vllm-cpu" not in gpu.stdout, \
        gpu.stderr[-3000:]
    assert "residual.layer_output      stored as BF16" in gpu.stdout
    assert "residual.layer_output      kept in FP32" in cpu.stdout
    # a second call reads nothing: the table is cached
    again = auto({"device": "cpu"})
    assert again.returncode == 0 and "reading" not in again.stderr


# vLLM-CPU's graphs of a two-layer model, read in a child process (the hook and vLLM's state stay there)
READ_MAP = """
import json, sys, tempfile
from patches import engine_table
with tempfile.TemporaryDirectory() as tmp:
    engine_table.family_config(sys.argv[1]).save_pretrained(tmp)
    graphs = engine_table.vllm_graphs(tmp, stop_at_whole_model=sys.argv[2] == "stop")
    stores = [[n.name, n.op, str(n.stored)] for g in graphs for n in g.nodes]
    print(json.dumps([len(graphs), engine_table.rounding_map(graphs), stores]))
"""


@pytest.mark.long
@needs_vllm
def test_the_read_that_stops_at_the_whole_models_graph_misses_no_graph():
    """vllm_graphs stops the compile once the graph of every layer is recorded (the kernels' build and the
    engine's warm-up cannot move a store); run to the engine's start, vLLM-CPU compiles no other graph,
    and both reads find every node stored as the other does."""
    runs = {how: subprocess.Popen([sys.executable, "-c", READ_MAP, "qwen3", how], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for how in ("stop", "full")}
    found = {}
    for how, proc in runs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        found[how] = json.loads(out.strip().splitlines()[-1])
    assert found["stop"][0] == found["full"][0] == 1
    assert found["stop"][1:] == found["full"][1:] and found["stop"][1]


@pytest.mark.long
@needs_vllm
def test_a_region_inside_a_custom_kernel_is_refused_naming_the_setting():
    proc = auto({"compilation_config": {"custom_ops": ["all"]}})
    assert proc.returncode == 2
    message = proc.stderr.strip().splitlines()[-1]
    assert "custom_ops=['all']" in message and "rope.out" in message and "_C.rotary_embedding" in message
    assert "custom_ops = ['none']" in message


@pytest.mark.long
@needs_vllm
def test_the_auto_table_patches_as_its_named_target_does():
    """patches.apply(target="auto") on vLLM-CPU rounds as `vllm-cpu`: the same logits, bit for bit."""
    model = to_bf16_fsdp_style(tiny_model("qwen3", seed=3))
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(4))
    outs = {}
    for target in ("auto", "vllm-cpu", "vllm"):
        with patches.aligned("all", target=target, impl="eager"), torch.no_grad():
            outs[target] = model(ids).logits
    assert torch.equal(outs["auto"], outs["vllm-cpu"])
    assert not torch.equal(outs["auto"], outs["vllm"])  # the other table: the comparison can fail


def _norm_tail(x, w):
    """vLLM's RMSNorm tail (vllm/ir/ops/layernorm.py): `x.to(weight.dtype) * weight` on an FP32 x."""
    x = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    return x.to(w.dtype) * w


@pytest.mark.parametrize("emulate", [False, True])
def test_the_map_reads_roundings_at_casts_inductor_keeps(emulate):
    """emulate_precision_casts: Inductor rounds the BF16 cast inside the fused kernel, as eager does,
    and the map says so; without it the value stays in FP32 - and the compiled output shows which."""
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = (1 + 0.3 * torch.randn(96, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    torch._dynamo.reset()
    with torch._inductor.config.patch(emulate_precision_casts=emulate), engine_table.capture() as graphs:
        compiled = torch.compile(_norm_tail, fullgraph=True)(x, w)
    [cast] = [n for g in graphs for n in g.nodes if n.op == "convert_element_type" and n.dtype == torch.bfloat16]
    assert cast.stored is None and cast.rounded_inline == emulate
    assert torch.equal(compiled, _norm_tail(x, w)) == emulate  # eager rounds the cast: only emulation matches it


@pytest.mark.long
@needs_vllm
def test_with_emulated_casts_the_engine_rounds_every_value_and_the_patches_take_its_table():
    """vLLM-CPU with emulate_precision_casts keeps eager's casts: `auto` reads every value rounded but the
    norm's input (an edge, from vLLM's source: the unrounded sum), a table no named target has."""
    from patches.targets import VALUES

    proc = auto({"compilation_config": {"inductor_compile_config": {"emulate_precision_casts": True}}})
    assert proc.returncode == 0 and "target: auto:read" in proc.stdout, proc.stderr[-3000:]
    for value in VALUES:
        kept = value == "residual.norm_input"
        assert f"{value:26s} {'kept in FP32' if kept else 'stored as BF16'}" in proc.stdout, value
