"""benchmarks/gpu_check.sh as the GPU machine meets it: the image's Python without vLLM, verl, ray,
orjson or snakemake. Its CPU dry run (--device cpu --quick) runs every step's code; the summary gives a
value or a reason for every measurement, and what comes back fits the machine's limits (8 files, 2
folders deep). And the check's k3 is verl's."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from studies.scaling import check_model

ROOT = Path(__file__).resolve().parents[1]

# What the GPU machine's image lacks.
ABSENT = ("vllm", "verl", "ray", "orjson", "snakemake")


def without_absent_packages(path: Path) -> Path:
    """A PYTHONPATH entry that makes the GPU image's absent packages unimportable here: each one a
    stand-in ahead of site-packages that fails to import."""
    for name in ABSENT:
        (path / name).mkdir(parents=True)
        (path / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    return path


@pytest.mark.parametrize("argv, names", [(["--steps", "fused,nope"], "--steps: unknown nope; allowed: fused"),
                                         (["--limit", "regions=0"], "--limit regions=0: want STEP=SECONDS"),
                                         (["--limit", "nope=5"], "--limit nope=5: want STEP=SECONDS")])
def test_bad_steps_and_limits_are_named(argv, names, capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cpu", *argv])
    assert names in capsys.readouterr().err


@pytest.mark.extended  # 1.5-3.5 min on 2 cores: `make test-extended`
def test_dry_run_without_vllm_verl_ray_orjson_snakemake(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
           "PYTHONPATH": str(without_absent_packages(tmp_path / "blocked"))}
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--device", "cpu", "--quick",  # the bare image:
                           "--wheels", str(tmp_path / "no-wheels")], cwd=ROOT, env=env,  # no extra wheels
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == ["fused.json", "gpu-check-cpu-quick.md", "gpu-check-cpu-quick.tar.gz",
                                             "model.json", "regions.json"]  # and each step's JSON that ran
    assert all(len(p.relative_to(out).parts) <= 3 for p in files)  # at most 2 folders deep
    with tarfile.open(out / "gpu-check-cpu-quick.tar.gz") as tar:
        tar.extractall(tmp_path / "archive", filter="data")
    work = tmp_path / "archive/gpu-check-cpu-quick"
    summary = json.loads((work / "summary.json").read_text())
    steps = summary["steps"]
    assert list(steps) == ["fused", "model", "epilogue", "cuda-tests", "regions"]
    for name, step in steps.items():  # every row a value or a reason
        assert step["rows"] and all(isinstance(v, str) and v for v in step["rows"].values()), name
    # on a CPU: every step but the GPU-only one measured; the GPU-only rows name why not
    assert {n: s["status"] for n, s in steps.items() if s["status"] != "done"} == {
        "epilogue": "skipped on a CPU: Inductor's pass that could move the bias out of the GEMM runs for GPUs only",
        "cuda-tests": "skipped on a CPU: they are skipped here, as in every CPU run of the suite"}
    assert steps["regions"]["rows"]["liger (every case)"] == "skipped: Liger's kernels are Triton: CUDA only"
    table = (out / "gpu-check-cpu-quick.md").read_text()
    assert all(f"| {name} | {key} | {value} |" in table for name, s in steps.items() for key, value in s["rows"].items())

    fused = json.loads((work / "fused.json").read_text())
    assert fused["passed"] and [r["region"] for r in fused["rows"]] == ["qk_norm_rope", "swiglu", "add_rmsnorm"]
    assert all(r["stock_vs_engine"][0]["verdict"] == "rounding" for r in fused["rows"])  # the check can fail
    model = json.loads((work / "model.json").read_text())
    k3 = {(r["regions"], r["impl"]): r["k3"] for r in model["rows"] if r["reference"] == "engine_forward"}
    assert set(k3) == set(check_model.SETTINGS)
    # stock rounds 15-40% of every region's elements elsewhere; `all` differs only in summation order
    assert k3[("none", "-")] > 0 and k3[("all", "eager")] < 0.1 * k3[("none", "-")]
    assert model["roundmaps"][0]["matches"] and "residual" in " ".join(model["roundmaps"][0]["values"])
    regions = json.loads((work / "regions.json").read_text())
    layers = {(r["arch"], r["impl"]): r for r in regions["rows"] if r["case"] == "decoder_layer"}
    assert set(layers) == {(a, i) for a in ("qwen2", "qwen3") for i in ("stock", "aligned-eager", "aligned-fused")}
    assert all(r["time_ms"] > 0 and r["saved_x_stock"] <= 1.0 for r in layers.values())


def test_the_checks_k3_is_verls():
    """check_model's own k3, |d| and bit-equal share (the GPU image has no verl) against verl's helpers
    through the probe's summary, on logprobs with exact ties and masked tokens."""
    from studies._shared.mismatch import mismatch_summary
    from studies._shared.scored import Layout, token_mismatch

    gen = torch.Generator().manual_seed(0)
    ref = -torch.rand(4, 9, generator=gen) * 3
    train = ref + 1e-2 * torch.randn(4, 9, generator=gen) * (torch.rand(4, 9, generator=gen) > 0.3)
    response = torch.zeros(4, 9, dtype=torch.bool)
    response[:, 3:] = torch.rand(4, 6, generator=gen) > 0.2
    response[:, 3] = True
    layout = Layout(ids=None, mask=None, positions=None, response=response, sequence=None, sampling=None,
                          responses=torch.ones(4, 6, dtype=torch.long), response_cols=slice(3, 9))
    verl = mismatch_summary(train, ref, layout)
    ours = token_mismatch(train, ref, response)
    assert ours["n_tokens"] == verl["n_tokens"] and 0 < ours["bit_equal"] < 1
    assert abs(ours["k3"] - verl["k3_kl"]) <= 1e-6 * verl["k3_kl"]
    assert ours["mean_abs_dlogprob"] == verl["mean_abs_dlogprob"] and ours["bit_equal"] == verl["frac_identical"]
    assert token_mismatch(train + 1e-3, ref, response)["k3"] > 0  # the measure moves


def test_the_cuda_tests_step_finds_every_cuda_test_and_runs_without_the_absent_packages(tmp_path):
    marked = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                    if re.search(r"^@pytest\.mark\.cuda$", p.read_text(), re.MULTILINE))
    assert marked == sorted(gpu_check.CUDA_TESTS)
    env = {**os.environ, "PYTHONPATH": str(without_absent_packages(tmp_path / "blocked"))}
    done = subprocess.run([sys.executable, "benchmarks/cuda_tests.py", "--out", str(tmp_path / "t.json"),
                           *gpu_check.CUDA_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    tests = json.loads((tmp_path / "t.json").read_text())["tests"]
    assert len(tests) >= 3 and all(t["outcome"] == ("passed" if torch.cuda.is_available() else "skipped")
                                   for t in tests)

