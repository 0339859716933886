"""The shared task, its splits and tokenizer (tinyqwen), and the local backend's config checks (fast: no
model training)."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from rla.cells import Cell
from rla.config import ConfigError
from rla.config import load as load_config
from tinyqwen.data import COLUMNS, write_splits
from localrl.run import resolve
from tinyqwen.task import TaskSettings, chat_messages, make_split, render_prompt, score

CONFIG = "experiments/tiny.yaml"
SMALL = TaskSettings(seed=7, n_train=300, n_test=40, max_ops=3)


def _replay(solution: str) -> int:
    """Recompute a reference solution's chain and check every step's arithmetic."""
    steps, answer = solution.split(" #### ")
    value = None
    for a, op, b, c in re.findall(r"(\d+)([+\-*])(\d+)=(\d+)", steps):
        a, b, c = int(a), int(b), int(c)
        assert value is None or a == value, solution
        assert c == {"+": a + b, "-": a - b, "*": a * b}[op], solution
        value = c
    assert str(value) == answer
    return value


def test_task_is_deterministic_and_correct():
    a, b = make_split(SMALL, "train"), make_split(SMALL, "train")
    assert a == b
    other = make_split(TaskSettings(seed=8, n_train=300, n_test=40, max_ops=3), "train")
    assert [p.question for p in a] != [p.question for p in other]
    assert make_split(SMALL, "test")[0] != a[0]  # splits are different streams
    for p in a:
        assert _replay(p.solution) == int(p.answer) > 0
    n_ops = {p.solution.count("=") for p in a}
    assert n_ops == {1, 2, 3}


def test_reward_uses_verl_strict_gsm8k_scorer():
    p = make_split(SMALL, "train")[0]
    assert score(p.solution, p.answer) == 1.0
    wrong = str(int(p.answer) + 1)
    assert score(f"1+1=2 #### {wrong}", p.answer) == 0.0
    assert score(p.answer, p.answer) == 0.0  # strict: the number must follow "#### "
    assert score(f"#### 3 #### {p.answer}", p.answer) == 1.0  # the last marked answer counts


def test_bad_task_settings_are_named():
    with pytest.raises(ValueError, match="max_opz"):
        TaskSettings.from_config({"max_opz": 3})
    with pytest.raises(ValueError, match="min_ops"):
        TaskSettings.from_config({"min_ops": 3, "max_ops": 2})


def test_parquet_has_verl_schema(tmp_path):
    from verl.utils.reward_score import default_compute_score

    paths = write_splits(SMALL, tmp_path)
    train = pd.read_parquet(paths["train"])
    assert list(train.columns) == COLUMNS
    assert len(train) == SMALL.n_train and len(pd.read_parquet(paths["test"])) == SMALL.n_test
    row = train.iloc[0]
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    (message,) = list(row["prompt"])
    assert message["role"] == "user" and "####" in message["content"]
    assert row["reward_model"]["style"] == "rule"
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0
    # verl's own dispatch (by data_source) scores the stored reference solution as correct.
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], row["extra_info"]["answer"], truth) == 1.0
    assert default_compute_score(row["data_source"], "#### 0", truth) == 0.0


def test_tokenizer_round_trips_and_survives_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    from tinyqwen.models import model_config
    from tinyqwen.tokenizer import build_tokenizer

    tok = build_tokenizer()
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"
    texts = [render_prompt(chat_messages(p.question)) + p.solution for p in make_split(SMALL, "train")]
    spec = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 16, "intermediate_size": 64}
    for arch in ("qwen2", "qwen3"):
        out = tmp_path / arch
        model_config({"arch": arch, **spec}, tok).save_pretrained(out)
        tok.save_pretrained(out)
        loaded = AutoTokenizer.from_pretrained(out)
        for text in texts:
            ids = loaded(text)["input_ids"]
            assert ids == tok(text)["input_ids"]
            assert loaded.decode(ids) == text
        assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    # words are single tokens: the tokenizer is not merely byte-level
    assert len(tok(" apples")["input_ids"]) == 1


def test_bad_config_values_name_value_and_allowed():
    cfg = load_config(CONFIG)
    with pytest.raises(ConfigError, match=r"unknown model 'qwen9'.*qwen2-s"):
        resolve(Cell.of(cfg, "qwen9", "none", 0, "out", steps=5))
    with pytest.raises(ConfigError, match=r"unknown ablation 'ropee'; allowed: none, rope"):
        Cell.of(cfg, "qwen2-s", "ropee", 0, "out", steps=5)
    with pytest.raises(ConfigError, match=r"steps must be an integer >= 1, got 0"):
        Cell.of(cfg, "qwen2-s", "none", 0, "out", steps=0)
    with pytest.raises(ConfigError, match=r"seed must be an integer >= 0, got -1"):
        Cell.of(cfg, "qwen2-s", "none", -1, "out")
    bad = {**cfg, "rl": {**cfg["rl"], "ppo_mini_batch_size": 0}}
    with pytest.raises(ConfigError, match=r"rl.ppo_mini_batch_size"):
        resolve(Cell.of(bad, "qwen2-s", "none", 0, "out", steps=5))
    bad = {**cfg, "rl": {**cfg["rl"], "lr_typo": 1.0}}
    with pytest.raises(ConfigError, match=r"lr_typo"):
        resolve(Cell.of(bad, "qwen2-s", "none", 0, "out", steps=5))
    config = resolve(Cell.of(cfg, "qwen3-m", "all", 3, "out"))
    assert config["steps"] == cfg["steps"] and config["model_spec"]["arch"] == "qwen3" and config["seed"] == 3


def test_cli_bad_value_errors_before_touching_the_cell(tmp_path, capsys):
    from localrl.__main__ import main

    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n')
    for args in (["--ablation", "bogus", "--steps", "3"], ["--ablation", "none", "--steps", "-1"]):
        rc = main(["train", "--config", CONFIG, "--model", "qwen2-s", "--seed", "0", "--out", str(cell), *args])
        assert rc == 2
    err = capsys.readouterr().err
    assert "unknown ablation 'bogus'" in err and "got -1" in err
    assert sorted(p.name for p in cell.iterdir()) == ["metrics.jsonl"]
    assert (cell / "metrics.jsonl").read_text() == '{"step": 1, "data": {}}\n'
