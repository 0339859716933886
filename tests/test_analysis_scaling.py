"""studies.scaling.report (`python -m studies report scaling`) on hand-made tables: exponents, byte-reproducible figures, no backend import."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from studies.__main__ import main as studies_main
from studies.scaling import report as scaling
from tests.standalone import run_report_alone

EXPONENT = {"none": 0.5, "rope": 0.4, "swiglu": 0.5, "rmsnorm": 0.3, "all": 2.0}


def synthetic_table() -> pd.DataFrame:
    rows = []
    for arch in ("qwen2", "qwen3"):
        for factor, values in (("depth", [2, 4, 8, 16]), ("width", [64, 128, 256]), ("length", [16, 64, 256])):
            for value in values:
                for setting, a in EXPONENT.items():
                    y = 1e-3 * value ** a
                    rows.append({"factor": factor, "value": float(value), "arch": arch, "setting": setting,
                                 "mean_abs_dlogprob": y, "k3_kl": y * y, "seq_logratio_var": 3 * y,
                                 "frac_abs_d_gt_1e-2": min(1.0, y)})
    return pd.DataFrame(rows)


def synthetic_bins(low_key: str, high_key: str, edges) -> pd.DataFrame:
    """Bins whose mean |d| grows as position^0.5 (for `none`; `all` is flat)."""
    rows = []
    for setting in ("none", "all", "swiglu+rmsnorm", "rope+rmsnorm", "rope+swiglu"):
        for low, high in zip(edges[:-1], edges[1:]):
            mid = (low + high) / 2
            rows.append({"factor": "length", "arch": "qwen2", "value": 256.0, "setting": setting, low_key: low,
                         high_key: high - 1 if low_key == "position_low" else high, "n_tokens": 10,
                         "mean_abs_dlogprob": 1e-3 * (mid ** 0.5 if setting == "none" else 1.0),
                         "mean_dlogprob": -1e-4})
    return pd.DataFrame(rows)


def test_point_shares_give_each_point_its_regions_shapley_shares():
    """Additive effects: each region's share is its own effect over the stock value, per point; the
    compile/fp16 rows (treatments, from the ablation registry) are not region subsets."""
    from tests.test_probe_analysis import synthetic_subsets

    points = []
    for value, effect in ((2.0, {"rope": 1.0, "swiglu": 2.0, "rmsnorm": 4.0}), (4.0, {"rope": 3.0, "swiglu": 0.5,
                                                                                      "rmsnorm": 0.5})):
        frame = synthetic_subsets(lambda s: 10.0 - sum(effect[r] for r in s)).drop(columns="reference")
        frame = pd.concat([frame, pd.DataFrame([{"setting": t, "regions": "none", "reduction": "eager",
                                                 "mean_abs_dlogprob": 99.0, "k3_kl": 1.0} for t in ("compile", "fp16")])])
        points.append(frame.assign(factor="depth", value=value, arch="qwen2", shape_name=np.nan))
    shares = scaling.point_shares(pd.concat(points, ignore_index=True)).set_index("value")
    assert shares.loc[2.0, ["share_rope", "share_swiglu", "share_rmsnorm"]].tolist() == [0.1, 0.2, 0.4]
    assert shares.loc[4.0, ["share_rope", "share_swiglu", "share_rmsnorm"]].tolist() == [0.3, 0.05, 0.05]
    assert shares["share_summation_order"].tolist() == [0.3, 0.6]  # all's value over the stock's
    assert (shares["share_remaining"] == 0).all() and (shares["shape_name"] == "").all()


def test_where_table_measures_growth_with_position():
    pos = synthetic_bins("position_low", "position_high", [0, 16, 32, 64, 128])
    prob = synthetic_bins("p_low", "p_high", [0.0, 0.01, 0.1, 0.5, 0.9, 1.0])
    where = scaling.where_table(pos, prob, {"factor": "length", "arch": "qwen2", "value": 256.0}).set_index("error_of")
    assert where.loc["none", "position_slope"] == pytest.approx(0.5, abs=1e-9)
    assert where.loc["all", "position_slope"] == pytest.approx(0.0, abs=1e-9)
    assert where.loc["rope alone", "setting"] == "swiglu+rmsnorm"


def test_power_laws_give_their_exponents():
    fits = scaling.fit_exponents(synthetic_table())
    none = fits[(fits["setting"] == "none") & (fits["factor"] == "depth") & (fits["arch"] == "qwen2")]
    by_metric = none.set_index("metric")["exponent"]
    assert by_metric["mean_abs_dlogprob"] == pytest.approx(0.5, abs=1e-9)
    assert by_metric["k3_kl"] == pytest.approx(1.0, abs=1e-9)
    all_ = fits[fits["setting"] == "all"].query("metric == 'mean_abs_dlogprob'")["exponent"]
    assert np.allclose(all_, 2.0, rtol=0, atol=1e-9)
    assert (none["r2"] > 0.999).all() and (none["n_points"] == 4).all()


def test_points_that_a_log_scale_cannot_hold_are_left_out_of_fits():
    table = synthetic_table()
    table.loc[(table["setting"] == "all") & (table["value"] == 2), "mean_abs_dlogprob"] = 0.0
    fits = scaling.fit_exponents(table)
    row = fits.query("setting == 'all' and factor == 'depth' and metric == 'mean_abs_dlogprob'").iloc[0]
    assert row["n_points"] == 3 and row["exponent"] == pytest.approx(2.0, abs=1e-9)


def test_figures_are_byte_reproducible(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    synthetic_table().to_csv(tables / "mismatch_scaling.csv", index=False)
    synthetic_bins("position_low", "position_high", [0, 16, 32, 64]).to_csv(
        tables / "mismatch_scaling_by_position.csv", index=False)
    synthetic_bins("p_low", "p_high", [0.0, 0.01, 0.5, 0.9, 1.0]).to_csv(
        tables / "mismatch_scaling_by_probability.csv", index=False)
    for out in ("a", "b"):
        assert scaling.main(["--tables", str(tables), "--out", str(tmp_path / out)]) == 0
    names = {p.name for p in (tmp_path / "a").iterdir()}
    assert {"mismatch_scaling.png", "mismatch_scaling.pdf", "mismatch_where.csv", "mismatch_scaling_fits.csv"} <= names
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert b"CreationDate" not in (tmp_path / "a/mismatch_scaling.pdf").read_bytes()


def test_missing_table_and_columns_are_named(tmp_path, capsys):
    assert studies_main(["report", "scaling", "--tables", str(tmp_path), "--out", str(tmp_path / "f")]) == 2
    assert "mismatch_scaling.csv not found" in capsys.readouterr().err
    synthetic_table().drop(columns="k3_kl").to_csv(tmp_path / "mismatch_scaling.csv", index=False)
    assert studies_main(["report", "scaling", "--tables", str(tmp_path), "--out", str(tmp_path / "f")]) == 2
    assert "k3_kl" in capsys.readouterr().err


def test_runs_without_any_backend(tmp_path):
    synthetic_table().to_csv(tmp_path / "mismatch_scaling.csv", index=False)
    done = run_report_alone("scaling", "--tables", tmp_path, "--out", tmp_path / "figs")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("LOADED []")
    assert np.isfinite(pd.read_csv(tmp_path / "figs/mismatch_scaling_fits.csv")["exponent"]).all()
