"""diagnose's per-token statistics and prompt files, on inputs whose answers are known."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from diagnose import metrics, prompts


def _frame():
    rng = np.random.default_rng(0)
    got = [list(rng.normal(-2, 1, n)) for n in (5, 9, 3, 7)]
    ref = [list(np.asarray(g) + rng.normal(0, 0.01, len(g))) for g in got]
    ref[0][2] = got[0][2]  # one bit-equal token
    return got, ref, metrics.tokens(got, ref, [4, 6, 2, 5])


def test_the_statistics_are_the_definitions():
    got, ref, frame = _frame()
    d = np.concatenate([np.asarray(g) - np.asarray(r) for g, r in zip(got, ref)])
    out = metrics.summary(frame, len(got))
    assert out["k3"] == pytest.approx(np.mean(np.exp(d) - 1 - d), rel=1e-12)
    assert out["mean_abs_dlogprob"] == pytest.approx(np.abs(d).mean(), rel=1e-12)
    assert out["bit_equal"] == 1 / len(d) and out["tokens"] == len(d)
    sums = [np.sum(np.asarray(g) - np.asarray(r)) for g, r in zip(got, ref)]
    assert out["seq_logratio_var"] == pytest.approx(np.var(sums, ddof=1), rel=1e-12)
    for name in metrics.STATISTICS:
        assert out[f"{name}_low"] <= out[name] <= out[f"{name}_high"]
    assert out["k3_low"] < out["k3_high"]  # sequences differ: the interval has width


def test_identical_sequences_give_an_interval_of_no_width():
    frame = metrics.tokens([[-1.0, -2.0]] * 5, [[-1.5, -2.0]] * 5, [3] * 5)
    out = metrics.summary(frame, 5)
    assert out["k3_low"] == out["k3"] == out["k3_high"] and out["bit_equal"] == 0.5


def test_positions_and_probability_bins():
    _, _, frame = _frame()
    by_pos = metrics.by_position(frame, 4)
    assert by_pos["tokens"].sum() == len(frame) and by_pos["share_of_abs_dlogprob"].sum() == pytest.approx(1)
    assert (by_pos["position_high"] - by_pos["position_low"] == 3).all()
    assert frame["position"].min() == 2 and frame["position"].max() == 6 + 9 - 1  # prompt length onward
    by_p = metrics.by_probability(frame)
    assert by_p["tokens"].sum() == len(frame) and (by_p["p_low"] < by_p["p_high"]).all()


def test_prompt_files_as_token_ids(tmp_path):
    rows = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet")
    for name in ("p.jsonl", "p.parquet"):
        assert prompts.from_file(tmp_path / name, tmp_path, 2) == [[5, 6, 7], [8, 9]]


def test_prompt_files_as_text_and_chat(tmp_path):
    from tinyqwen.tokenizer import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.save_pretrained(tmp_path)
    (tmp_path / "text.jsonl").write_text(json.dumps({"prompt": "12+3"}) + "\n")
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "12+3"}]}) + "\n")
    ids = tok("12+3")["input_ids"]
    assert prompts.from_file(tmp_path / "text.jsonl", tmp_path, 1) == [ids]
    assert prompts.from_file(tmp_path / "chat.jsonl", tmp_path, 1) == [
        list(tok.apply_chat_template([{"role": "user", "content": "12+3"}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False))]


def test_random_prompts_avoid_special_tokens():
    got = prompts.random_prompts(16, {0, 1}, 50, seed=3)
    assert all(8 <= len(p) < 25 for p in got) and not {0, 1} & {t for p in got for t in p}
    assert got == prompts.random_prompts(16, {0, 1}, 50, seed=3) != prompts.random_prompts(16, {0, 1}, 50, seed=4)
