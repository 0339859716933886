"""The patches against the real engine: vLLM's CPU build samples, HF + patches teacher-forces
(benchmarks/bench_vllm_alignment.py measures the full table). Claims, measured here: with
`target="vllm-cpu"` and attention computed as vLLM-CPU computes it, `all` is far closer to vLLM than
stock and than any other setting, and the GPU target (which rounds the residual once per layer) is
not what the CPU build does. Where vLLM-CPU runs its AVX-512 kernels (whose attention equals FP32
attention rounded once) most tokens are bit-equal; elsewhere only the ordering is claimed."""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import bench_vllm_alignment as bench
from localrl.vllm_support import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"vLLM cannot run here: {unavailable_reason()}")


@pytest.fixture(scope="module", params=["qwen2-256", "qwen3-256"])
def sampled(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    bench.make_checkpoint(bench.SHAPES[request.param], str(path))
    out = path / "vllm.json"
    proc = subprocess.run([sys.executable, bench.__file__, "--sample", str(path), str(out)], capture_output=True,
                          text=True, timeout=900)
    assert out.exists(), proc.stderr[-3000:]
    return request.param, str(path), json.loads(out.read_text())


def best(model, samples, spec, target):
    return min((bench.score(model, samples, spec, target, r) for r in ("eager", "inductor_cpu")), key=lambda s: s["k3"])


def test_all_with_the_cpu_target_matches_vllm_cpu(sampled):
    name, model_dir, samples = sampled
    matched = bench.training_model(model_dir, "attention")
    rows = {spec: best(matched, samples, spec, "vllm-cpu") for spec in bench.SUBSETS}
    gpu_target = best(matched, samples, "all", "vllm")
    hf_attention = best(bench.training_model(model_dir, "hf"), samples, "all", "vllm-cpu")
    for spec, r in rows.items():
        print(f"{name} {spec:8s} k3 {r['k3']:.2e} bit-equal {r['bit_equal']:.1%}")
    print(f"{name} all/vllm k3 {gpu_target['k3']:.2e}; all/vllm-cpu with SDPA k3 {hf_attention['k3']:.2e}")
    assert rows["none"]["k3"] > 0
    assert rows["all"]["k3"] * 20 <= rows["none"]["k3"]
    assert all(rows["all"]["k3"] < r["k3"] and rows["all"]["bit_equal"] > r["bit_equal"]
               for spec, r in rows.items() if spec != "all")
    assert rows["all"]["k3"] * 3 < gpu_target["k3"]  # the residual rounding of the GPU graph is not vLLM-CPU's
    assert rows["all"]["k3"] < hf_attention["k3"]     # SDPA in bf16 is a mismatch of its own
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert rows["all"]["bit_equal"] > 0.5
