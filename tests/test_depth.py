"""The depth study's parts that need no engine: a ladder rung is the deepest checkpoint's first layers, and
the report pools sequences over seeds with paired intervals (studies/depth). Its DAG path with vLLM-CPU:
tests/test_studies_micro.py."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from studies._shared import ladder


def test_a_rung_is_the_deepest_checkpoints_first_layers(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from studies._shared.vllm_cpu import make_checkpoint
    from studies.depth.measure import truncate
    from tinyqwen.models import HIDDEN_256

    make_checkpoint({"arch": "qwen3", **HIDDEN_256, "num_hidden_layers": 3}, str(tmp_path / "full"), seed=1)
    truncate(str(tmp_path / "full"), 2, str(tmp_path / "rung"))
    full, rung = (load_file(tmp_path / d / "model.safetensors") for d in ("full", "rung"))
    assert AutoConfig.from_pretrained(tmp_path / "rung").num_hidden_layers == 2
    assert set(full) - set(rung) == {k for k in full if k.startswith("model.layers.2.")}
    assert all(torch.equal(full[k], rung[k]) for k in rung)  # embedding, layers 0-1, final norm, LM head


def test_a_stopped_run_resumes_at_the_first_point_it_has_not_measured(tmp_path, monkeypatch, capsys):
    """Each point is kept as measured; a rerun with the same options measures none again, other options
    measure theirs (the engine and the checkpoints are faked: the ladder's bookkeeping alone)."""
    from studies._shared import vllm_cpu
    from studies.depth import measure

    measured = []
    monkeypatch.setattr(vllm_cpu, "unavailable_reason", lambda: None)
    monkeypatch.setattr(vllm_cpu, "make_checkpoint", lambda spec, out, seed=0: None)
    monkeypatch.delenv("RLA_SAMPLE_CACHE", raising=False)  # no checkpoint to keep in the Makefile's store
    monkeypatch.setattr(measure, "truncate", lambda full, layers, out: None)
    monkeypatch.setattr(measure, "measure_point", lambda d, spec, prompts, seed, kernels, log: measured.append(
        (spec["num_hidden_layers"], seed, prompts)) or _entry(spec, seed, prompts, kernels))
    out = tmp_path / "depth.json"
    args = ["--layers", "1", "2", "--archs", "qwen2", "--seeds", "0", "1", "--out", str(out)]
    assert measure.main(args) == 0 and measured == [(1, 0, 32), (2, 0, 32), (1, 1, 32), (2, 1, 32)]
    (out.parent / "depth.json.points/qwen2-256x2-s1.json").unlink()  # as if stopped before its last point
    measured.clear()
    assert measure.main(args) == 0 and measured == [(2, 1, 32)]
    kept = out.parent / "depth.json.points/qwen2-256x1-s0.json"  # as if kept by another commit's code
    point = json.loads(kept.read_text())
    kept.write_text(json.dumps({**point, "code": {**point["code"], "commit": "0" * 40}}))
    measured.clear()
    assert measure.main(args) == 0 and measured == [(1, 0, 32)]
    assert sorted(json.loads(out.read_text())["shapes"]) == ["qwen2-256x1-s0", "qwen2-256x1-s1", "qwen2-256x2-s0",
                                                             "qwen2-256x2-s1"]
    measured.clear()
    assert measure.main(args[:-2] + ["--prompts", "4", "--out", str(out)]) == 0 and len(measured) == 4

    # another folder (a fresh checkout), resuming from the first run's JSON as a published copy: the paper
    # widths and a third seed are measured, the earlier points are not, and they are named; a deeper ladder
    # (other checkpoints) or other options take none of them
    published, elsewhere = tmp_path / "published.json", tmp_path / "fresh" / "depth.json"
    measure.main(args)
    out.replace(published)
    (tmp_path / "provenance.json").write_text(json.dumps({"commit": "0123abc"}))  # as publishing writes it
    measured.clear()
    more = ["--layers", "1", "2", "--archs", "qwen2", "--seeds", "0", "1", "2", "--widths", "--out", str(elsewhere)]
    assert measure.main(more + ["--resume-from", str(published)]) == 0
    assert measured == [(1, 2, 32), (2, 2, 32), (28, 0, 8), (28, 0, 8)]
    earlier = ["qwen2-256x1-s0", "qwen2-256x2-s0", "qwen2-256x1-s1", "qwen2-256x2-s1"]
    both = {"hf": "0123abc", "attention": "0123abc"}
    assert json.loads(elsewhere.read_text())["resumed_from"] == {
        "file": str(published), "points": dict.fromkeys(earlier, both), "kernels": dict.fromkeys(earlier, ["hf", "attention"]),
        "commits": {"0123abc": ["hf", "attention"]}}
    # resumed again from that file as published by a later commit: each point keeps the commit that measured it
    (elsewhere.parent / "provenance.json").write_text(json.dumps({"commit": "4567def"}))
    measured.clear()
    again = tmp_path / "again" / "depth.json"
    assert measure.main(more[:-1] + [str(again), "--resume-from", str(elsewhere)]) == 0 and measured == []
    assert json.loads(again.read_text())["resumed_from"]["points"] == {
        **dict.fromkeys(earlier, both), **dict.fromkeys(["qwen2-256x1-s2", "qwen2-256x2-s2", "qwen2-1536x28",
                                                         "qwen3-2048x28"], {"hf": "4567def", "attention": "4567def"})}
    measured.clear()
    with pytest.raises(SystemExit):  # a path that is not a file is named, and nothing is measured
        measure.main(more + ["--resume-from", str(tmp_path / "nowhere.json")])
    assert "nowhere.json is not a file" in capsys.readouterr().err and measured == []
    for other, points in ((["--layers", "1", "2", "3"], 6), (["--prompts", "4"], 4)):
        measured.clear()
        assert measure.main(args[:-1] + [str(tmp_path / "other.json"), *other, "--resume-from", str(published)]) == 0
        assert len(measured) == points, other


def _entry(spec, seed, prompts, kernels, samples="the engine's"):
    return {"shape": spec, "seed": seed, "wall_s": 1.0,
            "vllm": {"startup_s": 1.0, "samples_sha256": f"{samples} {spec['num_hidden_layers']} {seed} {prompts}",
                     "rows": {k: [{"spec": "all", "k3": len(k)}] for k in kernels}},
            "sequences": {k: [[0.0] * prompts] for k in kernels}}


def test_a_training_kernels_set_is_added_to_measured_points_on_the_same_samples(tmp_path, monkeypatch):
    """Points measured on some kernels sets are measured on the others alone, kept or resumed from a
    published copy; samples that are not the ones the rows were scored on stop the run, by point."""
    from studies._shared import vllm_cpu
    from studies.depth import measure

    measured, samples = [], ["the engine's"]
    monkeypatch.setattr(vllm_cpu, "unavailable_reason", lambda: None)
    monkeypatch.setattr(vllm_cpu, "make_checkpoint", lambda spec, out, seed=0: None)
    monkeypatch.delenv("RLA_SAMPLE_CACHE", raising=False)  # no checkpoint to keep in the Makefile's store
    monkeypatch.setattr(measure, "truncate", lambda full, layers, out: None)
    monkeypatch.setattr(measure, "measure_point", lambda d, spec, prompts, seed, kernels, log: measured.append(
        (spec["num_hidden_layers"], tuple(kernels))) or _entry(spec, seed, prompts, kernels, samples[0]))
    out, published = tmp_path / "depth.json", tmp_path / "published" / "depth.json"
    args = ["--layers", "1", "2", "--archs", "qwen2", "--seeds", "0", "--out", str(out)]
    assert measure.main(args + ["--kernels", "hf", "attention"]) == 0
    measured.clear()
    assert measure.main(args + ["--kernels", "hf", "amx_rounding", "attention"]) == 0
    assert measured == [(1, ("amx_rounding",)), (2, ("amx_rounding",))]
    result = json.loads(out.read_text())
    assert all(list(e["sequences"]) == list(e["vllm"]["rows"]) == ["hf", "amx_rounding", "attention"]
               for e in result["shapes"].values()) and "resumed_from" not in result
    assert measure.main(args + ["--kernels", "attention"]) == 0  # a subset: nothing measured, only it written
    assert all(list(e["sequences"]) == ["attention"] for e in json.loads(out.read_text())["shapes"].values())

    # published, then a fresh folder adds a set: the published sets are named as taken, the new one measured
    measure.main(args + ["--kernels", "hf", "attention"])
    published.parent.mkdir()
    out.replace(published)
    (published.parent / "provenance.json").write_text(json.dumps({"commit": "0123abc"}))
    measured.clear()
    def fresh(folder):
        return ["--layers", "1", "2", "--archs", "qwen2", "--seeds", "0", "--out", str(tmp_path / folder / "depth.json"),
                "--resume-from", str(published), "--kernels", "hf", "attention", "engine"]

    assert measure.main(fresh("fresh")) == 0 and measured == [(1, ("engine",)), (2, ("engine",))]
    assert json.loads((tmp_path / "fresh/depth.json").read_text())["resumed_from"]["kernels"] == {
        "qwen2-256x1-s0": ["hf", "attention"], "qwen2-256x2-s0": ["hf", "attention"]}
    # that file published by a later commit, and a fresh folder adds another set: each set taken keeps the
    # commit that measured it, not the one its point was first taken from
    (tmp_path / "fresh/provenance.json").write_text(json.dumps({"commit": "4567def"}))
    measured.clear()
    later = args[:-1] + [str(tmp_path / "later/depth.json"), "--resume-from", str(tmp_path / "fresh/depth.json"),
                         "--kernels", "hf", "attention", "engine", "engine_steps"]
    assert measure.main(later) == 0 and measured == [(1, ("engine_steps",)), (2, ("engine_steps",))]
    resumed = json.loads((tmp_path / "later/depth.json").read_text())["resumed_from"]
    assert resumed["points"]["qwen2-256x1-s0"] == {"hf": "0123abc", "attention": "0123abc", "engine": "4567def"}
    assert resumed["commits"] == {"0123abc": ["hf", "attention"], "4567def": ["engine"]}

    # a set remeasured (its rows now hold another summation order): measured anew, the others taken
    measured.clear()
    assert measure.main(fresh("again") + ["--remeasure", "attention"]) == 0
    assert measured == [(1, ("attention", "engine")), (2, ("attention", "engine"))]
    assert json.loads((tmp_path / "again/depth.json").read_text())["resumed_from"]["kernels"] == {
        "qwen2-256x1-s0": ["hf"], "qwen2-256x2-s0": ["hf"]}
    with pytest.raises(SystemExit):  # a set it does not measure is named
        measure.main(fresh("again") + ["--remeasure", "local"])

    # the engine's samples changed: the point is named and nothing of its kept file is lost
    samples[0] = "other"
    kept = tmp_path / "depth.json.points/qwen2-256x1-s0.json"
    before = kept.read_text()
    with pytest.raises(RuntimeError, match="qwen2-256x1-s0: vLLM-CPU's samples differ"):
        measure.main(args + ["--kernels", "hf", "amx_rounding_engine_gemm"])
    assert kept.read_text() == before

    # rows published before samples had a digest: one of their sets is scored again and must match
    samples[0] = "the engine's"
    old = json.loads(published.read_text())
    for entry in old["shapes"].values():
        del entry["vllm"]["samples_sha256"]
    published.write_text(json.dumps(old))
    measured.clear()
    assert measure.main(fresh("fresh2")) == 0
    assert measured == [(1, ("engine", "hf")), (2, ("engine", "hf"))]
    for entry in old["shapes"].values():
        entry["vllm"]["rows"]["hf"][0]["k3"] = 0.5
    published.write_text(json.dumps(old))
    with pytest.raises(RuntimeError, match="samples differ"):
        measure.main(fresh("fresh3"))


def _result(seq_sums: dict[tuple[str, int], list[float]], k3: dict[tuple[str, int], float]) -> dict:
    """A measurement with two settings (none, all) at one rung, one attention, per seed."""
    shapes = {}
    for seed in (0, 1):
        rows = [{"spec": spec, "target": "vllm-cpu", "reduction": "eager", "k3": k3[spec, seed], "mean_abs": 1e-3,
                 "max_abs": 1e-2, "bit_equal": 0.5, "tokens": 64, "seq_mean": 0.0, "seq_var": 0.0}
                for spec in ("none", "all")]
        shapes[f"qwen2-256x4-s{seed}"] = {
            "shape": {"arch": "qwen2", "hidden_size": 256, "num_hidden_layers": 4}, "seed": seed,
            "vllm": {"rows": {"hf": rows}}, "sequences": {"hf": [seq_sums["none", seed], seq_sums["all", seed]]}}
    return {"shapes": shapes}


def test_the_ladder_pools_sequences_over_seeds_with_paired_intervals():
    rng = np.random.default_rng(1)
    stock = {s: rng.normal(0, 0.3, 40) for s in (0, 1)}
    sums = {("none", s): stock[s].tolist() for s in (0, 1)}
    sums.update({("all", s): (0.1 * stock[s] + rng.normal(0, 0.01, 40)).tolist() for s in (0, 1)})
    k3 = {("none", 0): 4e-4, ("none", 1): 2e-4, ("all", 0): 1e-5, ("all", 1): 4e-5}
    frame, seqs = ladder.points(_result(sums, k3))
    table = ladder.ladder(frame, seqs).set_index("spec")
    aligned, pooled = table.loc["all"], np.concatenate([sums["all", 0], sums["all", 1]])
    assert aligned["seeds"] == 2 and aligned["sequences"] == 80
    assert aligned["k3"] == pytest.approx(2.5e-5) and aligned["k3_vs_none"] == pytest.approx((40 + 5) / 2)
    assert aligned["seq_var"] == pytest.approx(pooled.var(ddof=1)) and aligned["seq_mean"] == pytest.approx(pooled.mean())
    assert aligned["seq_var_low"] < aligned["seq_var"] < aligned["seq_var_high"]
    # paired: the same sequences in both settings, so the ratio's interval is narrow around 0.011
    assert 0.007 < aligned["seq_var_vs_none_low"] < aligned["seq_var_vs_none"] < aligned["seq_var_vs_none_high"] < 0.016
    assert aligned["seq_var_vs_none_high"] / aligned["seq_var_vs_none_low"] < 1.5
    assert table.loc["none", "seq_var_vs_none"] == 1.0


def test_unpaired_noise_widens_the_ratio_interval():
    """The interval can fail to be narrow: settings whose sequence sums are unrelated give a wide one."""
    rng = np.random.default_rng(2)
    sums = {(spec, s): rng.normal(0, 0.3, 40).tolist() for spec in ("none", "all") for s in (0, 1)}
    k3 = {(spec, s): 1e-4 for spec in ("none", "all") for s in (0, 1)}
    frame, seqs = ladder.points(_result(sums, k3))
    aligned = ladder.ladder(frame, seqs).set_index("spec").loc["all"]
    assert aligned["seq_var_vs_none_high"] / aligned["seq_var_vs_none_low"] > 1.5


def test_a_rows_interval_does_not_move_when_the_table_gains_rows():
    """Each row's bootstrap is seeded by its own key: adding a training kernels set to a published
    measurement leaves every earlier row's interval as it was."""
    rng = np.random.default_rng(3)
    sums = {(spec, s): rng.normal(0, 0.3, 40).tolist() for spec in ("none", "all") for s in (0, 1)}
    k3 = {(spec, s): 1e-4 for spec in ("none", "all") for s in (0, 1)}
    result = _result(sums, k3)
    alone = ladder.ladder(*ladder.points(result))
    for entry in result["shapes"].values():  # another set, sorted before "hf", scored on the same sequences
        entry["vllm"]["rows"]["attention"] = entry["vllm"]["rows"]["hf"]
        entry["sequences"]["attention"] = [[x + 0.5 for x in seq] for seq in entry["sequences"]["hf"]]
    more = ladder.ladder(*ladder.points(result))
    assert len(more) == 2 * len(alone)
    pd.testing.assert_frame_equal(more[more["kernels"] == "hf"].reset_index(drop=True), alone)
    # the seeds differ between rows: two rows of equal sequences but other keys get other intervals
    shifted = more[more["kernels"] == "attention"].reset_index(drop=True)
    assert not np.allclose(shifted["seq_var_low"], alone["seq_var_low"])


def test_a_setting_with_every_logprob_equal_is_infinitely_below_stock():
    """k3 0 (the engine's own logprobs): its ratio to stock's is infinite, not a division error."""
    rng = np.random.default_rng(4)
    sums = {("none", s): rng.normal(0, 0.3, 40).tolist() for s in (0, 1)}
    sums.update({("all", s): [0.0] * 40 for s in (0, 1)})
    k3 = {("none", 0): 4e-4, ("none", 1): 2e-4, ("all", 0): 0.0, ("all", 1): 0.0}
    aligned = ladder.ladder(*ladder.points(_result(sums, k3))).set_index("spec").loc["all"]
    assert aligned["k3"] == 0.0 and aligned["k3_vs_none"] == np.inf and aligned["seq_var"] == 0.0
