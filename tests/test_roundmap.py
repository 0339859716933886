"""The rounding map: what each engine's compiled graphs store as BF16 equals what the patches' target
says - read off the local engine's pieces, vLLM's CPU build's one graph and vLLM's own model code
split as on a GPU - and the map tells graphs apart that store differently."""

import json
import subprocess
import sys

import pytest
import torch

from studies.roundmap import measure as roundmap
from patches import engine_table
from localrl.engine import ops
from localrl.engine.model import compile_piece
from localrl.vllm_support import unavailable_reason
from patches.targets import TARGETS, VALUES

needs_vllm = pytest.mark.skipif(unavailable_reason() is not None, reason=f"vLLM cannot run here: {unavailable_reason()}")
ARCHS = ["qwen2", "qwen3"]


def assert_matches(counts, target):
    rows = engine_table.compare(counts, target)
    unread = set(engine_table.FROM_SOURCE) | ({"qk_norm.normalized", "qk_norm.out"} if "qk_norm.out" not in counts else set())
    assert set(rows) >= set(VALUES) - unread
    differing = {value: row for value, row in rows.items() if row[0] != row[1]}
    assert not differing, f"graph vs target {target!r}: {differing}"


@pytest.mark.parametrize("arch", ARCHS)
def test_local_engine_pieces_store_what_target_vllm_says(arch):
    assert_matches(roundmap.derive("local", arch, "tiny"), "vllm")


def run_cli(engine, arch, shape, tmp_path, *args):
    out = tmp_path / f"{engine}-{arch}-{shape}.json"
    proc = subprocess.run([sys.executable, "-m", "studies", "run", "roundmap", "--engine", engine, "--arch", arch,
                           "--shape", shape, "--json", str(out), *args], capture_output=True, text=True, timeout=1500)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    from collections import Counter

    return {k: Counter(v) for k, v in data["counts"].items()}, proc


# vLLM's own graphs (and the local engine's again) at Qwen2.5-1.5B / Qwen3-1.7B widths: Inductor's
# heuristics see real sizes. The first 3 of their 28 layers - the first, an inner and the last, each
# layer's graph being the same code at every depth. A vLLM graph is a fresh compile of a minute or more on
# 2 AVX2 cores, so they are `make test-extended`'s (by hand, not CI's). All 28 layers, 4-13 min a graph:
# `python -m studies run roundmap --engine vllm --arch qwen3 --shape qwen3-1.7b`.
@pytest.mark.extended
@needs_vllm
@pytest.mark.parametrize("engine, arch, shape", [
    ("vllm", "qwen2", "qwen2.5-1.5b"), ("vllm", "qwen3", "qwen3-1.7b"),
    ("vllm-gpu-split", "qwen2", "qwen2.5-1.5b"), ("vllm-gpu-split", "qwen3", "qwen3-1.7b"),
    ("local", "qwen2", "qwen2.5-1.5b"), ("local", "qwen3", "qwen3-1.7b"),
])
def test_the_targets_hold_at_real_widths(engine, arch, shape, tmp_path):
    counts, proc = run_cli(engine, arch, shape, tmp_path, "--layers", "3")
    assert_matches(counts, roundmap.expected_target(engine))
    assert proc.returncode == 0 and "3 layers" in proc.stdout


def test_a_depth_beyond_the_shape_is_refused_naming_it():
    proc = subprocess.run([sys.executable, "-m", "studies", "run", "roundmap", "--shape", "tiny", "--layers", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--layers 5" in proc.stderr and "allowed: 1..4" in proc.stderr
