"""studies.probe.report on hand-made probe tables: Shapley shares, errors, and no backend import."""

import itertools

import pandas as pd
import pytest

from studies._shared.names import ENGINE_ORDER
from studies._shared.shares import region_shares
from studies.probe.report import run
from rla.names import REGIONS, subset_name
from tests.standalone import run_report_alone



def synthetic_subsets(value_of) -> pd.DataFrame:
    rows = []
    for k in range(4):
        for combo in itertools.combinations(REGIONS, k):
            rows.append({"setting": subset_name(combo), "regions": ",".join(combo) or "none",
                         "reduction": "eager", "reference": "engine_forward", "mean_abs_dlogprob": value_of(set(combo))})
    rows.append({"setting": ENGINE_ORDER, "regions": ",".join(REGIONS), "reduction": "inductor_cpu",
                 "reference": "engine_forward", "mean_abs_dlogprob": 0.0})
    frame = pd.DataFrame(rows)
    for column in ("n_tokens", "max_abs_dlogprob", "k3_kl", "probs_diff_mean", "frac_identical"):
        frame[column] = 1.0
    return frame


def test_additive_effects_give_each_region_its_own_reduction():
    effect = {"rope": 1.0, "swiglu": 2.0, "rmsnorm": 4.0}
    frame = synthetic_subsets(lambda s: 10.0 - sum(effect[r] for r in s))
    shares = region_shares(frame).set_index("component")
    for region, e in effect.items():
        assert shares.loc[region, "reduction"] == pytest.approx(e)
        assert shares.loc[region, "share"] == pytest.approx(e / 10)
    assert shares.loc["summation order", "reduction"] == pytest.approx(3.0)  # all (3) -> all + order (0)
    assert shares.loc["remaining", "reduction"] == 0
    assert shares["reduction"].sum() == pytest.approx(10.0)


def test_an_interaction_is_split_between_the_regions_that_need_each_other():
    # only rope and rmsnorm together remove 6; everything else does nothing
    frame = synthetic_subsets(lambda s: 8.0 - (6.0 if {"rope", "rmsnorm"} <= s else 0.0))
    shares = region_shares(frame).set_index("component")["reduction"]
    assert shares["rope"] == pytest.approx(3.0) and shares["rmsnorm"] == pytest.approx(3.0)
    assert shares["swiglu"] == pytest.approx(0.0)
    assert shares.sum() == pytest.approx(8.0)


def test_missing_subset_is_named():
    frame = synthetic_subsets(lambda s: 1.0)
    frame = frame[frame["setting"] != "rope+swiglu"]
    with pytest.raises(ValueError, match=r"lacks the setting\(s\) \['rope,swiglu'\]"):
        region_shares(frame)


def test_missing_probe_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no probe results under"):
        run(tmp_path, tmp_path / "fig")


def test_analysis_probe_runs_without_any_backend(tmp_path):
    """`python -m studies report probe` reads CSV files only: no torch, localrl or patches import."""
    probe_dir = tmp_path / "probe" / "m"
    probe_dir.mkdir(parents=True)
    synthetic_subsets(lambda s: 1.0 - 0.25 * len(s)).to_csv(probe_dir / "subsets.csv", index=False)
    settings = ["none", "rope", "all", ENGINE_ORDER]
    pd.DataFrame([{"setting": s, "layer": i, "stage": st, "rel_l2": 0.0 if i == 0 else 0.1 / (j + 1),
                   "frac_identical": 1.0 if i == 0 else 0.5, "max_abs": 0.0, "n_values": 10}
                  for j, s in enumerate(settings) for i, st in enumerate(["embedding", "layer", "logits"])]
                 ).to_csv(probe_dir / "layers.csv", index=False)
    pd.DataFrame([{"setting": s, "p_low": lo, "p_high": hi, "n_tokens": 5, "mean_abs_dlogprob": 0.01}
                  for s in settings for lo, hi in [(0.0, 0.5), (0.5, 1.0)]]).to_csv(probe_dir / "by_probability.csv",
                                                                                    index=False)
    pd.DataFrame([{"setting": s, "scope": sc, "position_low": p, "n_tokens": 5, "mean_abs_dlogprob": 0.01}
                  for s in settings for sc in ("response", "sequence") for p in (0, 16)]
                 ).to_csv(probe_dir / "by_position.csv", index=False)
    done = run_report_alone("probe", "--probe", tmp_path / "probe", "--out", tmp_path / "fig")
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout
    assert (tmp_path / "tables" / "probe_subsets.csv").exists()
    shares = pd.read_csv(tmp_path / "tables" / "probe_shares.csv")
    assert shares["reduction"].sum() == pytest.approx(1.0)
    assert "| rope |" in (tmp_path / "tables" / "probe.md").read_text()


def test_treatment_rows_are_not_region_subsets():
    """compile / fp16 rows align no region (regions 'none'): they must not stand in for the stock subset."""
    frame = synthetic_subsets(lambda s: 10.0 - len(s)).assign(treatment="")
    treated = frame[frame["setting"] == "none"].assign(setting="compile", treatment="compile", mean_abs_dlogprob=99.0)
    shares = region_shares(pd.concat([frame, treated], ignore_index=True))
    pd.testing.assert_frame_equal(shares, region_shares(frame))
    assert shares.loc[shares["component"] == "rope", "share"].item() == pytest.approx(0.1)
