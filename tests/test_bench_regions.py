"""benchmarks/bench_regions.py and check_fused.py: the written-out stock formulas are transformers' own,
a failure of the suite's own implementations is loud, and the fused check's verdicts tell a last-bit
difference from a moved rounding. (Their dry runs: tests/test_gpu_check.py.)"""

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


def test_a_failing_implementation_of_the_suite_stops_the_benchmark(monkeypatch):
    """Only Liger's kernels (another project's) may fail into a note; the suite's own never drop a row."""
    def prepare(case, impl, args, device):
        raise RuntimeError(f"{impl} broke")

    monkeypatch.setattr(bench_regions, "prepare", prepare)
    monkeypatch.setattr(bench_regions, "time_interleaved", lambda steps, args: {})
    rows, notes = bench_regions.measure(None, ["liger"], None, None)
    assert rows == [] and notes == ["liger: failed: RuntimeError: liger broke"]
    with pytest.raises(RuntimeError, match="aligned-fused broke"):
        bench_regions.measure(None, ["liger", "aligned-fused"], None, None)


def bf16_bits(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int16).view(torch.bfloat16)


def test_fused_check_tells_a_last_bit_from_a_moved_rounding():
    """The verdicts on constructed differences: one element one ulp off (an order of operations), and a
    product rounded to bf16 before an add that the engine keeps in fp32 (a moved rounding)."""
    want = bf16_bits(list(range(16000, 16000 + 4096)))
    assert check_fused.compare(want.clone(), want)["verdict"] == "bit-equal"
    last = want.clone().view(torch.int16)
    last[7] += 1
    assert check_fused.compare(last.view(torch.bfloat16), want) | {"of": 0, "max_row_ulp": 0} == \
        {"differing": 1, "of": 0, "max_ulp": 1, "max_row_ulp": 0, "verdict": "last-bit"}
    # a result near zero (a cancelling difference) many of its own ulps off, a fraction of an ulp of its row's
    # scale: an order of operations; the same many-ulp difference on the row's largest value is not
    near_zero = want.clone().float()
    near_zero[3] = 1e-6
    near_zero = near_zero.to(torch.bfloat16)
    off = near_zero.clone().float()
    off[3] = -1e-6
    row = check_fused.compare(off.to(torch.bfloat16), near_zero)
    assert row["max_ulp"] > 1000 and row["max_row_ulp"] < 1 and row["verdict"] == "order"
    big = want.clone().view(torch.int16)
    big[want.float().abs().argmax()] += 8
    assert check_fused.compare(big.view(torch.bfloat16), want)["verdict"] == "rounding"
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(4096, generator=gen).to(torch.bfloat16).float() for _ in range(3))
    engine = (a * b + c).to(torch.bfloat16)
    moved = ((a * b).to(torch.bfloat16).float() + c).to(torch.bfloat16)
    row = check_fused.compare(moved, engine)
    assert row["verdict"] == "rounding" and row["differing"] > 0.1 * row["of"]
    ok = {"fused_vs_engine": [check_fused.compare(engine, engine)], "eager_vs_engine": [check_fused.compare(engine, engine)],
          "fused_vs_eager_grads": [], "stock_vs_engine": [row]}
    assert check_fused.judge(ok) == []
    assert check_fused.judge({**ok, "fused_vs_engine": [row]})[0].startswith("fused_vs_engine rounding")
    assert "could not see" in check_fused.judge({**ok, "stock_vs_engine": ok["eager_vs_engine"]})[0]
