"""The second GPU check (benchmarks/gpu_check.py --steps preflight,gemm,long,kernels,determinism,cost):
its planned budget, its dry run on the GPU image's packages, what a call ended by SIGTERM returns, the
study's tables of a committed dry run (both references wherever a k3 is), and the first check's published
tables unchanged."""

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from benchmarks import gpu_check
from studies.gpu_check.check_common import bit_compare
from studies.gpu_check import report

ROOT = Path(__file__).resolve().parents[1]
DRY_RUN = ROOT / "tests/fixtures/gpu_check_runs"  # a CPU dry run's summary.json and step JSONs (--quick)
ABSENT = ("vllm", "verl", "ray", "orjson", "snakemake")


def blocked(path: Path) -> Path:
    """A PYTHONPATH entry that makes the GPU image's absent packages unimportable."""
    for name in ABSENT:
        (path / name).mkdir(parents=True)
        (path / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    return path


def test_the_planned_budget_fits_one_call_and_is_in_the_header():
    limits = {s.name: s.limit_s for s in gpu_check.STEPS if s.name in gpu_check.SECOND}
    assert list(limits) == list(gpu_check.SECOND)
    assert sum(limits.values()) == gpu_check.SECOND_BUDGET_S <= 540
    for name, seconds in limits.items():  # the header says each step's planned time
        assert re.search(rf"^  {name} +{seconds} s ", gpu_check.__doc__, re.MULTILINE), name


def test_an_unknown_step_is_named_with_the_allowed_ones(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cpu", "--steps", "preflight,gemms"])
    err = capsys.readouterr().err
    assert "--steps: unknown gemms; allowed:" in err and all(name in err for name in gpu_check.SECOND)


def test_bit_compare_counts_bits_and_refuses_zeros():
    a = torch.tensor([1.0, -0.0, 3.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 0.0, 3.015625], dtype=torch.bfloat16)  # 3 + 1 ulp
    assert bit_compare(a, b) == {"bit_equal": False, "differing": 2, "of": 3}  # -0.0 is not 0.0 bitwise
    with pytest.raises(ValueError, match="all-zero"):
        bit_compare(torch.zeros(3), torch.zeros(3))


def test_forced_tokens_give_the_sampling_logprobs_bit_for_bit():
    """The decode-path reference of an engine that did not sample (check_long's FP16 engine) is its
    sampling loop fed the tokens: fed its own samples, the BF16 engine gives back its sampling logprobs."""
    from studies.gpu_check import testbed
    from studies._shared.random_models import build_model, gpu_point
    from studies._shared.shapes import qwen_shape

    point = gpu_point("t", qwen_shape("qwen2", 64, 1, 128), n_seq=2, prompt_len=4, response_len=6)
    master = build_model(point, point.prompt_len + point.response_len, torch.device("cpu"))
    _, engine = testbed.pair_of(master, point, torch.device("cpu"))
    layout = testbed.sampled(engine, point)
    replayed = testbed.replayed_sampling(engine, layout)
    assert bit_compare(replayed[layout.response], layout.sampling[layout.response])["bit_equal"]


def test_sigterm_returns_what_was_measured_and_names_the_rest(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(blocked(tmp_path / "blocked"))}
    proc = subprocess.Popen([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--steps",
                             "preflight,gemm", "--wheels", str(tmp_path / "none")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # ended while the first step runs
        if "preflight (limit" in line:
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)
            break
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    summary = (out / "gpu-check-cpu-quick.md").read_text()
    assert f"| preflight | {gpu_check.ENDED} |" in summary
    assert "| gemm | skipped: the call was ended (SIGTERM) before it |" in summary
    assert (out / "gpu-check-cpu-quick.tar.gz").is_file() and not list(out.glob("*.part"))


def test_the_report_makes_the_second_checks_tables_with_both_references(tmp_path):
    assert report.main(["--runs", str(DRY_RUN), "--out", str(tmp_path)]) == 0
    for table in ("preflight", "gemm", "long", "long_positions", "kernels", "determinism", "cost"):
        assert (tmp_path / f"{table}.csv").is_file() and (tmp_path / f"{table}.md").is_file(), table
    for table in ("long", "long_positions", "kernels"):  # every k3 against both references
        frame = pd.read_csv(tmp_path / f"{table}.csv")
        for ref in report.REFERENCES:
            assert frame[f"{ref}_k3"].notna().all() and (frame[f"{ref}_k3"] >= 0).all(), (table, ref)
        text = (tmp_path / f"{table}.md").read_text()
        assert "engine_forward" in text and "engine_sampling" in text, table
    long = pd.read_csv(tmp_path / "long.csv")
    assert set(zip(long["dtype"], long["regions"])) == {("bf16", "none"), ("bf16", "rope"), ("bf16", "all"),
                                                        ("fp16", "none")}
    assert set(long["scale"]) == {"matched", "sharper"} and (long["entropy_engine"] > 0).all()
    kernels = pd.read_csv(tmp_path / "kernels.csv")
    assert set(kernels["train_attention"]) == {"engine_kernel", "sdpa_flash"}
    assert pd.read_csv(tmp_path / "determinism.csv")["all_equal"].notna().all()
    cost = pd.read_csv(tmp_path / "cost.csv")
    assert cost.loc[cost["impl"] == "liger", "skipped"].str.contains("CUDA only").all()
    assert (cost.loc[cost["impl"] != "liger", "step_s"] > 0).all()


def test_the_published_tables_are_unchanged(tmp_path):
    """The first check's runs give the committed tables byte for byte; no table of the second check
    appears without a run of it."""
    published = ROOT / "studies/gpu_check/published"
    assert report.main(["--runs", str(ROOT / report.RUNS), "--out", str(tmp_path)]) == 0
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in published.iterdir() if p.suffix in (".csv", ".md"))
    assert all((tmp_path / name).read_bytes() == (published / name).read_bytes() for name in made)


@pytest.mark.extended  # 5-10 min on 2 shared cores: `make test-extended`
def test_second_dry_run_without_vllm_verl_ray_orjson_snakemake(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": str(blocked(tmp_path / "blocked"))}
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--device", "cpu", "--quick", "--steps",
                           ",".join(gpu_check.SECOND), "--wheels", str(tmp_path / "no-wheels")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= gpu_check.MAX_FILES and all(len(p.relative_to(out).parts) <= 3 for p in files)
    assert sorted(p.name for p in files) == sorted([f"{s}.json" for s in gpu_check.SECOND]
                                                   + ["gpu-check-cpu-quick.md", "gpu-check-cpu-quick.tar.gz"])
    with tarfile.open(out / "gpu-check-cpu-quick.tar.gz") as tar:
        tar.extractall(tmp_path / "archive", filter="data")
    steps = json.loads((tmp_path / "archive/gpu-check-cpu-quick/summary.json").read_text())["steps"]
    assert list(steps) == list(gpu_check.SECOND)
    for name, step in steps.items():  # every row a value or a reason
        assert step["rows"] and all(isinstance(v, str) and v for v in step["rows"].values()), name
    assert sum(s["status"] == "done" for s in steps.values()) >= 4
    table = (out / "gpu-check-cpu-quick.md").read_text()
    assert all(f"| {name} | " in table.split("| step | status | seconds |")[1] for name in steps)  # one row each
