"""The mismatch scaling study (`python -m studies run scaling`): points, metrics and the command line."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from studies._shared.random_models import base_point, build_model
from studies._shared.shapes import qwen_shape
from studies.scaling import measure as scaling
from studies.__main__ import main as studies_main


def test_qwen_ratios_give_the_published_shapes():
    assert qwen_shape("qwen2", 1536, 28, 151936) == scaling.REAL_SHAPES["qwen2.5-1.5b"]
    assert qwen_shape("qwen3", 2048, 28, 151936) == scaling.REAL_SHAPES["qwen3-1.7b"]
    with pytest.raises(ValueError, match="unknown arch 'llama'"):
        qwen_shape("llama", 256, 2, 384)


FACTOR_FIELDS = {  # what each factor may change besides its own name and value
    "depth": {"layers", "parameters"},
    "width": {"hidden", "heads", "kv_heads", "head_dim", "intermediate", "parameters", "logit_scale"},
    "vocab": {"vocab", "parameters"},
    "length": {"response_len", "n_seq"},
    "sharpness": {"logit_scale"},
    "attention": {"attn_scale"},
    "qk_bias": {"qk_bias"},
    "update": {"update"},
}


@pytest.mark.parametrize("factor", sorted(FACTOR_FIELDS))
def test_each_factor_changes_only_its_own_settings(factor):
    base = scaling.describe(base_point("qwen2"))
    points = scaling.factor_points(factor, "qwen2", big=True)
    assert len(points) >= 4
    changed = set()
    for point in points:
        described = scaling.describe(point)
        changed |= {k for k in base if k not in ("factor", "value") and described[k] != base[k]}
    assert changed and changed <= FACTOR_FIELDS[factor]
    # the base value is on every ladder but the output/attention/update ones start from their neutral value
    assert len({p.value for p in points}) == len(points)


def test_width_keeps_the_logit_scale():
    """The final norm's output has unit RMS: logit spread ~ output scale x sqrt(hidden), kept fixed."""
    for point in scaling.factor_points("width", "qwen3", big=True):
        assert point.logit_scale * point.shape.hidden ** 0.5 == pytest.approx(16.0 * 256 ** 0.5)


def test_attention_scale_acts_where_each_arch_sets_the_scores():
    """Qwen3 normalises q and k per head, so its q/k-norm weights carry the scale; Qwen2 its projections.
    Everything else stays the model of the base point."""
    import torch

    for arch, scaled in (("qwen2", ("q_proj.weight", "k_proj.weight")), ("qwen3", ("q_norm.weight", "k_norm.weight"))):
        base = scaling.quick_base(arch)
        a = dict(build_model(base, 32).named_parameters())
        b = dict(build_model(replace(base, attn_scale=3.0), 32).named_parameters())
        for name, p in a.items():
            assert torch.equal(b[name], 3.0 * p if name.endswith(scaled) else p), name
    bias = dict(build_model(replace(scaling.quick_base("qwen2"), qk_bias=2.0), 32).named_parameters())
    plain = dict(build_model(scaling.quick_base("qwen2"), 32).named_parameters())
    assert bias["model.layers.0.self_attn.k_proj.bias"].std() > 1.0
    assert torch.equal(bias["model.layers.0.mlp.up_proj.weight"], plain["model.layers.0.mlp.up_proj.weight"])


def test_bad_factor_and_arch_are_named(capsys):
    assert studies_main(["run", "scaling", "--out", "unused", "--factors", "depth,colour"]) == 2
    err = capsys.readouterr().err
    assert "colour" in err and "allowed: depth, width" in err
    assert studies_main(["run", "scaling", "--out", "unused", "--archs", "gpt2"]) == 2
    assert "gpt2" in capsys.readouterr().err


@pytest.fixture(scope="module")
def measured():
    """One small point with a weight update: every setting, with persistence columns. At the quick ladders'
    shapes and lengths, so that this and the scaling study's micro run (studies/scaling/study.yaml, in
    `make test`) compile the same kernels, once."""
    point = replace(scaling.quick_base("qwen3"), factor="update", value=1e-2, update=1e-2)
    result = scaling.measure(point, log=lambda msg: None)
    return point, pd.DataFrame(result.rows).set_index("setting"), result


@pytest.mark.slow
def test_every_region_subset_is_scored_and_alignment_reduces_the_mismatch(measured):
    _, rows, _ = measured
    assert len(rows) == 11  # 8 region subsets, the engine's summation order, compile, fp16
    assert {"none", "rope", "swiglu", "rmsnorm", "all", "all+engine_order", "compile", "fp16"} <= set(rows.index)
    none, all_ = rows.loc["none"], rows.loc["all"]
    # holds on every ISA: stock's mismatch is rounding locations (IEEE elementwise arithmetic, the same on every
    # CPU): 1.8e-3 - 5.1e-3 per token at the tiny shapes, 0-3% bit-identical (docs/numerics.md, docs/results.md)
    assert none["mean_abs_dlogprob"] > 1e-4 and none["frac_identical"] < 0.5
    # holds on every ISA: against the local engine `all` leaves summation order only: 0-0.1% of stock's mismatch
    # with AVX-512 code, 4-7% with AVX2 forced (docs/numerics.md)
    assert all_["mean_abs_dlogprob"] < 0.5 * none["mean_abs_dlogprob"]
    assert rows.loc["swiglu+rmsnorm", "stock_regions"] == "rope"
    # fp16 is both sides in FP16 against the FP16 engine (3 more mantissa bits), not the BF16 pair again:
    # rounding errors 8x smaller on every ISA (8x in |d logprob| in the RL loop, docs/results.md): below half
    assert 0 < rows.loc["fp16", "mean_abs_dlogprob"] < 0.5 * none["mean_abs_dlogprob"]
    assert 0 < rows.loc["compile", "mean_abs_dlogprob"] != none["mean_abs_dlogprob"]


def test_metrics_are_consistent(measured):
    point, rows, _ = measured
    none = rows.loc["none"]
    assert none["n_tokens"] == point.n_seq * point.response_len
    # every response has full length (no eos), so the sequence sum's mean = R x the token mean
    assert none["seq_logratio_mean"] == pytest.approx(point.response_len * none["signed_mean_dlogprob"], rel=1e-9)
    assert none["k3_max"] >= none["k3_kl"] > 0
    assert 0 <= none["frac_abs_d_gt_1e-1"] <= none["frac_abs_d_gt_1e-2"] <= 1
    assert none["max_abs_dlogprob"] >= none["mean_abs_dlogprob"]
    # Shapley efficiency: the components add up to the stock value (float64 sums; tolerance for rounding)
    from studies.scaling.report import point_shares

    shares = point_shares(rows.reset_index()).iloc[0]
    parts = shares[["share_rope", "share_swiglu", "share_rmsnorm", "share_summation_order", "share_remaining"]]
    assert parts.sum() == pytest.approx(1.0, abs=1e-9) and (parts[["share_rope", "share_rmsnorm"]] > 0).all()


def test_update_measures_error_persistence(measured):
    _, rows, _ = measured
    none = rows.loc["none"]
    assert 0 < none["frac_bf16_weights_changed"] < 1
    assert -1 <= none["persistence_corr"] <= 1
    assert none["frac_error_unchanged"] < 1  # a 1% update changes the rounding pattern


def test_binned_tables_hold_signed_and_absolute_errors(measured):
    point, _, result = measured
    pos, prob = result.by_position, result.by_probability
    for frame in (pos, prob):
        assert {"setting", "mean_dlogprob", "mean_abs_dlogprob", "n_tokens", "factor", "arch"} <= set(frame.columns)
        per_setting = frame.groupby("setting")["n_tokens"].sum()
        assert (per_setting == point.n_seq * point.response_len).all()
    none = pos[pos["setting"] == "none"]
    assert (none["mean_abs_dlogprob"] >= none["mean_dlogprob"].abs()).all()


@pytest.mark.long  # the command line's compiles: 40 s on 2 AVX2 cores
def test_command_line_writes_the_tables(tmp_path):
    assert studies_main(["run", "scaling", "--out", str(tmp_path), "--factors", "sharpness", "--archs", "qwen3",
                         "--quick"]) == 0
    table = pd.read_csv(tmp_path / "mismatch_scaling.csv")
    assert set(table["value"]) == {1.0, 4.0} and set(table["factor"]) == {"sharpness"}
    # a sharper output layer lowers the entropy per token
    entropy = table[table["setting"] == "none"].set_index("value")["entropy_engine"]
    assert entropy[4.0] < entropy[1.0]
    for name in ("by_position", "by_probability"):
        assert (tmp_path / f"mismatch_scaling_{name}.csv").exists()
    assert np.isfinite(table["mean_abs_dlogprob"]).all()


@pytest.mark.long  # two runs of the command line: 40 s on 2 AVX2 cores
def test_append_measures_only_missing_points(tmp_path, capsys):
    args = ["run", "scaling", "--out", str(tmp_path), "--archs", "qwen3", "--quick"]
    assert studies_main([*args, "--factors", "sharpness"]) == 0
    first = pd.read_csv(tmp_path / "mismatch_scaling.csv")
    assert studies_main([*args, "--factors", "sharpness,depth", "--append"]) == 0
    assert "2 point(s) already in" in capsys.readouterr().err
    both = pd.read_csv(tmp_path / "mismatch_scaling.csv")
    assert sorted(set(both["factor"])) == ["depth", "sharpness"]
    assert len(both) == 2 * len(first)
    pd.testing.assert_frame_equal(both[both["factor"] == "sharpness"].reset_index(drop=True), first, check_dtype=False)


def test_tiny_shapes_are_the_tiny_grids_models():
    import yaml

    from tests.standalone import ROOT

    specs = yaml.safe_load((ROOT / "experiments/tiny.yaml").read_text())["model_specs"]
    assert set(scaling.TINY_SHAPES) == set(specs)
    for name, shape in scaling.TINY_SHAPES.items():
        spec = specs[name]
        assert (shape.arch, shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim,
                shape.intermediate) == (spec["arch"], spec["num_hidden_layers"], spec["hidden_size"],
                                        spec["num_attention_heads"], spec["num_key_value_heads"], spec["head_dim"],
                                        spec["intermediate_size"])
