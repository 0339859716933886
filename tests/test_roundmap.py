"""The rounding map: what each engine's compiled graphs store as BF16 equals what the patches' target
says - read off the local engine's pieces, vLLM's CPU build's one graph and vLLM's own model code
split as on a GPU - and the map tells graphs apart that store differently."""

import json
import subprocess
import sys

import pytest
import torch

from localrl import roundmap
from localrl.engine import ops
from localrl.engine.model import compile_piece
from localrl.vllm_support import unavailable_reason
from patches.targets import TARGETS, VALUES

needs_vllm = pytest.mark.skipif(unavailable_reason() is not None, reason=f"vLLM cannot run here: {unavailable_reason()}")
ARCHS = ["qwen2", "qwen3"]


def assert_matches(counts, target):
    rows = roundmap.compare(counts, target)
    assert set(rows) >= set(VALUES) - ({"qk_norm.normalized", "qk_norm.out"} if "qk_norm.out" not in counts else set())
    differing = {value: row for value, row in rows.items() if row[0] != row[1]}
    assert not differing, f"graph vs target {target!r}: {differing}"


@pytest.mark.parametrize("arch", ARCHS)
def test_local_engine_pieces_store_what_target_vllm_says(arch):
    assert_matches(roundmap.derive("local", arch, "tiny"), "vllm")


def run_cli(engine, arch, shape, tmp_path):
    out = tmp_path / f"{engine}-{arch}-{shape}.json"
    proc = subprocess.run([sys.executable, "-m", "localrl.roundmap", "--engine", engine, "--arch", arch,
                           "--shape", shape, "--json", str(out)], capture_output=True, text=True, timeout=1500)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    from collections import Counter

    return {k: Counter(v) for k, v in data["counts"].items()}, proc


@needs_vllm
# Each engine once, each family once, at the tiny shapes: the fast check of the path. Every pair at the real
# 28-layer shapes: test_the_targets_hold_at_real_shapes (make test-long).
@pytest.mark.parametrize("engine, arch", [("vllm", "qwen3"), ("vllm-gpu-split", "qwen2")])
def test_vllms_own_graphs_store_what_the_targets_say(engine, arch, tmp_path):
    counts, proc = run_cli(engine, arch, "tiny", tmp_path)
    assert_matches(counts, roundmap.expected_target(engine))
    assert proc.returncode == 0


@pytest.mark.slow
@pytest.mark.long
@needs_vllm
@pytest.mark.parametrize("engine, arch, shape", [
    ("vllm", "qwen2", "qwen2.5-1.5b"), ("vllm", "qwen3", "qwen3-1.7b"),
    ("vllm-gpu-split", "qwen2", "qwen2.5-1.5b"), ("vllm-gpu-split", "qwen3", "qwen3-1.7b"),
    ("local", "qwen2", "qwen2.5-1.5b"), ("local", "qwen3", "qwen3-1.7b"),
])
def test_the_targets_hold_at_real_shapes(engine, arch, shape, tmp_path):
    """28 layers at Qwen2.5-1.5B / Qwen3-1.7B widths: Inductor's realize heuristics see a bigger graph."""
    counts, _ = run_cli(engine, arch, shape, tmp_path)
    assert_matches(counts, roundmap.expected_target(engine))


def test_the_map_tells_graphs_apart():
    """One region compiled by itself (what a per-region engine does) stores its residual output, which
    neither vLLM graph does after the attention: the map sees it, so a wrong engine fails the test."""
    x, r, w = (torch.randn(8, 64).to(torch.bfloat16) for _ in range(3))
    torch._dynamo.reset()

    def region(x, x_residual, post_attention_layernorm):  # the map reads which norm off the calling line
        return ops.fused_add_rms_norm(x, x_residual, post_attention_layernorm, 1e-6)

    with roundmap.capture() as graphs:
        compile_piece(region, (0, 1))(x, r, w[0])
    found = roundmap.stores(roundmap.rounding_map(graphs))
    assert found["residual.post_attention"] is True
    assert all(t.stores["residual.post_attention"] is False for t in TARGETS.values())


def test_the_map_refuses_emulated_casts():
    """With emulate_precision_casts Inductor rounds inline too: a map of stores would miss those."""
    with torch._inductor.config.patch(emulate_precision_casts=True), pytest.raises(RuntimeError, match="emulate"):
        with roundmap.capture():
            pass
