"""Shared set-up of the tests that run a warm-started tiny model (the local rig's and vLLM's): the skip
marker of vLLM with its reason, a reduced config, and the model (built once per session by the
`warm_model` fixture in conftest.py; `vllm_model` is the same model where vLLM runs)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from localrl.engines import vllm_unavailable
from rla.config import load as load_config

MODEL = "qwen2-s"
# Test problems the warm start is judged on (tests/test_localrl_rl.py): enough that its solve rate is told
# from an untrained model's by far more than chance (the test says by how much).
EVAL_SIZE = 400
# The metrics every RL step logs under verl's names (localrl.metrics).
REQUIRED = (
    "rollout_corr/k3_kl", "rollout_corr/kl", "rollout_corr/log_ppl_abs_diff",
    "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
    "training/rollout_actor_probs_pearson_corr", "critic/score/mean", "actor/entropy", "actor/grad_norm",
    "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_loss", "response_length/mean",
    "timing_s/gen", "timing_s/update", "timing_s/step",
)
REASON = vllm_unavailable("cpu")
requires_vllm = pytest.mark.skipif(REASON is not None, reason=f"vLLM cannot run here: {REASON}")


def reduced_config(engine: str = "vllm") -> dict:
    """tiny.yaml with less data, a shorter warm start and small RL steps."""
    cfg = load_config(Path(__file__).resolve().parents[1] / "experiments/tiny.yaml")
    cfg["task"].update({"n_train": 400, "n_test": EVAL_SIZE})
    cfg["warmstart"] = {"steps": 200, "batch_size": 32, "lr": 5.0e-3, "eval_size": EVAL_SIZE}
    cfg["rl"].update({"prompts_per_step": 4, "samples_per_prompt": 4, "test_every": 2, "test_size": 8,
                      "checkpoint_every": 2})
    cfg["engine"] = {"name": engine}
    return cfg


def build(root: Path) -> dict:
    """The reduced config's data and warm-started model under `root`, made unless already there."""
    from tinyqwen.data import write_splits
    from tinyqwen.task import TaskSettings
    from localrl.warmstart import warmstart

    cfg = reduced_config()
    done = root / "model" / "warmstart.json"  # written last, with the model (localrl.warmstart)
    if not done.exists():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            write_splits(TaskSettings.from_config(cfg["task"]), root / "data")
            warmstart(cfg, MODEL, root / "data", root / "model")
        finally:
            torch.set_num_threads(threads)
    return {"cfg": cfg, "data": root / "data", "model": root / "model", "root": root,
            "summary": json.loads(done.read_text())}


def prompts(setup: dict, n: int, split: str = "train") -> tuple[object, list[list[int]]]:
    from transformers import AutoTokenizer

    from tinyqwen.data import load_split
    from tinyqwen.task import render_prompt

    tok = AutoTokenizer.from_pretrained(setup["model"])
    frame = load_split(setup["data"], split).iloc[:n]
    return tok, [tok(render_prompt(list(p)))["input_ids"] for p in frame["prompt"]]


def perturbed_checkpoint(model_dir: Path, out: Path, scale: float = 0.05, seed: int = 7) -> dict[str, torch.Tensor]:
    """A copy of the checkpoint with every weight perturbed, saved with BF16-exact values (so a fresh
    engine loads exactly these BF16 weights); returns them as BF16 tensors under HF names."""
    import shutil

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((p * (1 + scale * torch.randn(p.shape, generator=g))).to(torch.bfloat16).float())
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out / name)
    return {k: v.to(torch.bfloat16) for k, v in copy.deepcopy(model.state_dict()).items()}


def engine_results(engine, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    """What the determinism and weight-sync tests compare bit for bit: two seeded rollouts (temperature
    0.8, so the processed logprobs are not the raw ones) and the engine's full forward of prompt + response."""
    out = {}
    for seed in (11, 12):
        r = engine.generate(prompts, 20, 0.8, torch.Generator().manual_seed(seed))
        out.update({f"responses{seed}": r.responses, f"mask{seed}": r.response_mask, f"logprobs{seed}": r.logprobs})
    sequences = [p + r[m].tolist() for p, r, m in zip(prompts, out["responses11"], out["mask11"])]
    out["forward"] = torch.cat(engine.prompt_logprobs(sequences))
    return out
