"""benchmarks/bench_regions.py and check_fused.py: the written-out stock formulas are transformers' own,
and a smoke run writes the report the README quotes."""

import json

import pytest
import torch
from transformers.models.qwen2 import modeling_qwen2

from benchmarks import bench_regions, check_fused
from tests.numerics import stock_rms_norm


def test_stock_formulas_equal_transformers():
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(40, 256, generator=gen)).to(torch.bfloat16)
    norm = modeling_qwen2.Qwen2RMSNorm(256, eps=bench_regions.EPS).to(torch.bfloat16)
    norm.weight.data.copy_((1 + 0.3 * torch.randn(256, generator=gen)).to(torch.bfloat16))
    assert torch.equal(stock_rms_norm(x, norm.weight, bench_regions.EPS), norm(x))
    assert bench_regions.stock_rope is modeling_qwen2.apply_rotary_pos_emb


def test_bad_arguments_name_the_allowed_values(capsys):
    with pytest.raises(SystemExit):
        bench_regions.parse_args(["--cases", "rope,mlp"])
    assert "mlp" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_regions.parse_args(["--impls", "aligned-fused"])
    assert "stock" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_benchmark_writes_rows_and_ratios(tmp_path):
    out = tmp_path / "regions.json"
    assert bench_regions.main(["--device", "cpu", "--quick", "--out", str(out), "--cases", "swiglu,add_rmsnorm"]) == 0
    report = json.loads(out.read_text())
    rows = {(r["case"], r["impl"]): r for r in report["rows"]}
    assert set(rows) == {(c, i) for c in ("swiglu", "add_rmsnorm") for i in ("stock", "aligned-eager", "aligned-fused")}
    for (case, impl), row in rows.items():
        assert row["time_ms"] > 0 and row["saved_bytes"] > 0 and row["GBps"] > 0
        assert row["saved_x_stock"] <= 1.0  # aligned regions save no more than stock
    assert rows[("swiglu", "stock")]["time_x_stock"] == 1.0
    assert len(rows[("swiglu", "aligned-fused")]["time_x_stock_runs"]) == report["settings"]["repeats"]


@pytest.mark.slow
def test_fused_check_dry_run(tmp_path):
    out = tmp_path / "check.json"
    assert check_fused.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passed"] and len(report["rows"]) == 5
    assert all(r["stock_vs_engine"][0]["differing"] > 0 for r in report["rows"])  # the check can fail
