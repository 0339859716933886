"""The verl backend without running verl's trainer: overrides against verl's own composed config, the
launcher driving a stand-in script in verl's place (`stand_in_verl`: it writes verl's file-logger
format and exits; it is not verl), metrics across resumes, data preparation on a shipped fixture.
verl's real trainer runs in tests/test_verl_cpu.py (`make test-verl`)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from verlrun import launch, memory, metrics, models
from rla.config import ConfigError
from rla.config import load as load_config
from rla.names import ABLATIONS
from verlrun.data import prepare, to_verl_rows
from verlrun.overrides import build_overrides, compose
from rla.cells import Cell

REPO = Path(__file__).resolve().parent.parent
PAPER = REPO / "experiments/paper.yaml"
FIXTURE = REPO / "tests/fixtures/gsm8k"


@pytest.fixture(scope="module")
def paper():
    return load_config(PAPER)


# ---------------------------------------------------------------------------------------------
# Overrides composed against verl's installed Hydra config


@pytest.mark.long  # 36 cells through verl's Hydra config: 45 s on 2 AVX2 cores
def test_every_paper_cell_composes_and_validates(paper, tmp_path):
    from omegaconf import OmegaConf

    cells = list(itertools.product(paper["models"], paper["ablations"], paper["seeds"]))
    assert len(cells) == 4 * len(paper["ablations"]) * len(paper["seeds"])
    for model, ablation, seed in cells:
        cell = tmp_path / "runs" / model / ablation / f"seed{seed}"
        cfg = compose(build_overrides(Cell.of(paper, model, ablation, seed, cell, tmp_path / "data")))
        env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
        assert env.RLA_REGIONS == ",".join(ABLATIONS[ablation].regions)
        assert Path(env.VERL_FILE_LOGGER_PATH) == cell.resolve() / "metrics.running.jsonl"
        assert Path(cfg.trainer.default_local_dir) == cell.resolve() / "checkpoints"
        assert cfg.trainer.resume_mode == "auto"
        assert all(part in cfg.trainer.experiment_name for part in (model, ablation, f"seed{seed}"))
        assert "file" in cfg.trainer.logger and "console" in cfg.trainer.logger
        assert cfg.algorithm.adv_estimator == "grpo"
        # verl reads the staged local copy, never the Hub id, and the Hub is off in every worker.
        assert cfg.actor_rollout_ref.model.path == str(models.local_path(paper, model).resolve())
        assert Path(cfg.actor_rollout_ref.model.path).is_absolute()
        assert env.HF_HUB_OFFLINE == "1" and env.TRANSFORMERS_OFFLINE == "1"
        assert cfg.actor_rollout_ref.model.external_lib == "patches.verl_plugin"
        # The GPU grid: the alignment rounds like the rollout engine as configured (target auto, its config
        # handed on); FSDP2 and flash-attn 2 on every cell.
        assert env.RLA_TARGET == "auto" and "VERL_PLATFORM" not in env and cfg.trainer.device == "cuda"
        assert json.loads(env.RLA_ENGINE_CONFIG)["tensor_parallel_size"] == cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
        # The layout the memory plan models (verlrun.memory): FSDP2, resharded after forward, no offload.
        fsdp = cfg.actor_rollout_ref.actor.fsdp_config
        assert cfg.actor_rollout_ref.actor.strategy == memory.STRATEGY == "fsdp2"
        assert fsdp.reshard_after_forward and not fsdp.param_offload and not fsdp.optimizer_offload
        assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "flash_attention_2"
        assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.rollout.calculate_log_probs
        assert cfg.actor_rollout_ref.rollout.top_p == 1 and cfg.actor_rollout_ref.rollout.top_k == -1
        # Dynamic batches: one token budget for the update and the old-log-prob pass (no reference
        # policy without a KL term).
        dynamic = {cfg.actor_rollout_ref.actor.use_dynamic_bsz, cfg.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz}
        budgets = {cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu, cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu}
        assert dynamic == {True} and len(budgets) == 1
        assert budgets.pop() >= cfg.data.max_prompt_length + cfg.data.max_response_length
        assert cfg.trainer.max_actor_ckpt_to_keep == paper["rl"]["keep_checkpoints"]
        assert cfg.actor_rollout_ref.rollout.dtype == paper["rl"]["dtype"]
        assert {cfg.data.seed, cfg.actor_rollout_ref.rollout.seed, cfg.actor_rollout_ref.actor.data_loader_seed} == {seed}
        assert cfg.trainer.total_training_steps == paper["steps"]
        assert OmegaConf.to_container(cfg.actor_rollout_ref.actor.optim.betas) == paper["rl"]["betas"]


def test_per_model_settings_win_over_the_global_ones(paper, tmp_path):
    model = next(m for m, spec in paper["model_specs"].items() if (spec.get("rl") or {}).get("max_response_length"))
    cfg = compose(build_overrides(Cell.of(paper, model, "none", 0, tmp_path, tmp_path)))
    assert cfg.data.max_response_length == paper["model_specs"][model]["rl"]["max_response_length"]
    assert cfg.data.max_response_length != paper["rl"]["max_response_length"]
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == paper["model_specs"][model]["rollout_tp"]


def test_a_mistyped_key_fails_to_compose(paper, tmp_path):
    from hydra.errors import ConfigCompositionException

    overrides = build_overrides(Cell.of(paper, paper["models"][0], "all", 0, tmp_path, tmp_path))
    with pytest.raises(ConfigCompositionException, match="calculate_log_prob"):
        compose(overrides + ["actor_rollout_ref.rollout.calculate_log_prob=True"])
    # The same through the config's escape hatch.
    bad = {**paper, "verl": {**paper["verl"], "overrides": ["trainer.nnode=2"]}}
    with pytest.raises(ConfigCompositionException, match="nnode"):
        compose(build_overrides(Cell.of(bad, paper["models"][0], "all", 0, tmp_path, tmp_path)))


def test_an_inconsistent_batch_fails_verl_validation(paper, tmp_path):
    # 3 prompts x 3 samples = 9 responses cannot be split over 8 GPUs.
    bad = {**paper, "rl": {**paper["rl"], "prompts_per_step": 3, "samples_per_prompt": 3, "ppo_mini_batch_size": 3}}
    with pytest.raises(AssertionError, match="divisible"):
        compose(build_overrides(Cell.of(bad, paper["models"][0], "none", 0, tmp_path, tmp_path)))


def test_unknown_names_fail_with_the_allowed_ones(paper, tmp_path):
    with pytest.raises(ValueError, match="'ropee'.*none, rope, swiglu, rmsnorm, all"):
        build_overrides(Cell.of(paper, paper["models"][0], "ropee", 0, tmp_path, tmp_path))
    with pytest.raises(ValueError, match="qwen9"):
        build_overrides(Cell.of(paper, "qwen9", "none", 0, tmp_path, tmp_path))


# ---------------------------------------------------------------------------------------------
# Metrics across resumes (fake files; verl's logger truncates its file on restart)


def _log(path: Path, steps, tag: str, torn: bool = False) -> None:
    with open(path, "w") as f:  # "w" like verl's "wb": a restart truncates
        for step in steps:
            f.write(json.dumps({"step": step, "data": {"critic/score/mean": step / 10, "run": tag}}) + "\n")
        if torn:
            f.write('{"step": 99, "da')


def _steps(path: Path) -> list[tuple[int, str]]:
    return [(r["step"], r["data"]["run"]) for r in map(json.loads, path.read_text().splitlines())]


def test_resumed_runs_merge_in_step_order_with_later_records_winning(tmp_path, recwarn):
    _log(tmp_path / "metrics.running.jsonl", range(1, 6), "first", torn=True)
    assert [p.name for p in metrics.rotate(tmp_path)] == ["metrics.part-000.jsonl"]
    assert not (tmp_path / "metrics.running.jsonl").exists()
    _log(tmp_path / "metrics.running.jsonl", range(4, 9), "second")  # resumed from the step-3 checkpoint
    merged = metrics.merge(tmp_path)
    assert _steps(merged) == [(1, "first"), (2, "first"), (3, "first")] + [(s, "second") for s in range(4, 9)]
    assert "metrics.part-000.jsonl:6: truncated last line dropped" in str(recwarn.pop().message)
    # The merged parts are archived, not deleted, and numbering continues past them.
    assert (tmp_path / "metrics.parts/metrics.part-000.jsonl").exists()
    assert (tmp_path / "metrics.parts/metrics.part-001.jsonl").exists()
    assert metrics.part_files(tmp_path) == [] and not (tmp_path / "metrics.running.jsonl").exists()
    # A finished cell continued to more steps: its metrics.jsonl is the oldest part of the next merge.
    _log(tmp_path / "metrics.running.jsonl", range(9, 11), "third")
    assert [p.name for p in metrics.rotate(tmp_path)] == ["metrics.part-002.jsonl", "metrics.part-003.jsonl"]
    assert _steps(metrics.merge(tmp_path))[-3:] == [(8, "second"), (9, "third"), (10, "third")]


def test_an_abandoned_tail_is_dropped(tmp_path):
    # Run one logged to step 10 but checkpointed at 5; run two resumed there and stopped at 7.
    _log(tmp_path / "metrics.part-000.jsonl", range(1, 11), "first")
    _log(tmp_path / "metrics.running.jsonl", range(6, 8), "second")
    assert _steps(metrics.merge(tmp_path)) == [(s, "first") for s in range(1, 6)] + [(6, "second"), (7, "second")]


def test_a_broken_line_inside_a_file_is_skipped_with_a_warning(tmp_path):
    (tmp_path / "metrics.running.jsonl").write_text('{"step": 1, "data": {}}\nnot json\n{"step": 2, "data": {}}\n')
    with pytest.warns(UserWarning, match=r"metrics.part-000.jsonl:2: malformed line skipped"):
        merged = metrics.merge(tmp_path)
    assert [json.loads(line)["step"] for line in merged.read_text().splitlines()] == [1, 2]


STAND_IN_VERL = """
import json, os, sys
path = os.environ["VERL_FILE_LOGGER_PATH"]
first, last, status = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with open(path, "wb") as f:
    for step in range(first, last + 1):
        f.write(json.dumps({"step": step, "data": {"launch": first}}).encode() + b"\\n")
print(f"stand-in verl: steps {first}..{last}, regions {os.environ['RLA_REGIONS']!r}", flush=True)
sys.exit(status)
"""


def test_the_launcher_keeps_metrics_across_a_failure_and_a_resume_of_a_stand_in_verl(paper, tmp_path, monkeypatch):
    script = tmp_path / "stand_in_verl.py"
    script.write_text(STAND_IN_VERL)
    runs = iter([(1, 4, 1), (3, 6, 0)])  # crash after step 4, then resume from the step-2 checkpoint

    def stand_in_command(overrides, cell_dir):
        first, last, status = next(runs)
        return [sys.executable, str(script), str(first), str(last), str(status)]

    monkeypatch.setattr(launch, "command", stand_in_command)
    monkeypatch.setattr(launch, "compose", lambda overrides: None)
    monkeypatch.setattr(launch, "check_model", lambda cfg, model: None)
    cell = tmp_path / "runs/m/rope/seed0"
    model = paper["models"][0]
    assert launch.train(Cell.of(paper, model, "rope", 0, cell, tmp_path / "data")) == 1
    # The failed launch left no metrics.jsonl (it exists only for a finished cell) but a part.
    assert not (cell / "metrics.jsonl").exists()
    assert [p.name for p in metrics.part_files(cell)] == ["metrics.part-000.jsonl"]
    assert launch.train(Cell.of(paper, model, "rope", 0, cell, tmp_path / "data")) == 0
    records = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["data"]["launch"]) for r in records] == [(1, 1), (2, 1), (3, 3), (4, 3), (5, 3), (6, 3)]
    log = (cell / "train.log").read_text()
    assert log.count("=== exit status") == 2 and "regions 'rope'" in log


def test_train_dry_run_writes_the_cell_config_and_shows_the_command(tmp_path):
    cell = tmp_path / "runs/qwen3-1.7b/all/seed2"
    out = subprocess.run(
        [sys.executable, "-m", "verlrun", "train", "--config", str(PAPER), "--model", "qwen3-1.7b", "--ablation", "all",
         "--seed", "2", "--out", str(cell), "--data", str(tmp_path / "data"), "--steps", "7", "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load((cell / "config.yaml").read_text())
    assert resolved["cell"]["model"] == "qwen3-1.7b" and resolved["cell"]["seed"] == 2 and resolved["steps"] == 7
    assert resolved["models"] == ["qwen3-1.7b"] and list(resolved["model_specs"]) == ["qwen3-1.7b"]
    assert "trainer.total_training_steps=7" in resolved["cell"]["verl_overrides"]
    log = (cell / "train.log").read_text()
    for text in ("-m verl.trainer.main_ppo", "RLA_REGIONS=rope,swiglu,rmsnorm", "hydra.run.dir=", "trainer.total_training_steps=7"):
        assert text in log and text in out.stdout
    assert not (cell / "metrics.jsonl").exists()


def test_train_rejects_an_unknown_ablation_before_writing(tmp_path):
    cell = tmp_path / "cell"
    out = subprocess.run(
        [sys.executable, "-m", "verlrun", "train", "--config", str(PAPER), "--model", "qwen3-8b", "--ablation", "ropes",
         "--seed", "0", "--out", str(cell), "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 2 and "'ropes'" in out.stderr and "swiglu" in out.stderr
    assert not cell.exists()


# ---------------------------------------------------------------------------------------------
# Data preparation (shipped fixture; nothing is downloaded)


def _fixture_answers(split: str) -> list[str]:
    rows = [json.loads(line) for line in (FIXTURE / f"{split}.jsonl").read_text().splitlines()]
    return [row["answer"].rsplit("####", 1)[1].strip().replace(",", "") for row in rows]


def test_prepare_data_writes_verl_parquet_scored_by_verl(tmp_path):
    from verl.utils.reward_score import default_compute_score

    data = {"format": "gsm8k", "train": {"source": str(FIXTURE)}, "test": {"source": str(FIXTURE), "split": "test"}}
    written = prepare(data, tmp_path)
    for split in ("train", "test"):
        frame = pd.read_parquet(written[split])
        assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        truths = [r["ground_truth"] for r in frame["reward_model"]]
        assert truths == _fixture_answers(split)
        first = frame.iloc[0]
        assert list(first["prompt"][0].keys()) == ["role", "content"] and "####" in first["prompt"][0]["content"]
        # verl's own scorer, chosen by data_source, rewards the right final answer and only it.
        for row in frame.itertuples():
            right = f"Some reasoning.\n#### {row.reward_model['ground_truth']}"
            wrong = f"Some reasoning.\n#### {row.reward_model['ground_truth']}1"
            assert default_compute_score(row.data_source, right, row.reward_model["ground_truth"]) == 1.0
            assert default_compute_score(row.data_source, wrong, row.reward_model["ground_truth"]) == 0.0


def test_prepare_data_cli_on_a_config(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"format": "gsm8k", "train": {"source": str(FIXTURE / "train.jsonl")},
                                            "test": {"source": str(FIXTURE / "test.jsonl")}, "max_train_samples": 4}}))
    out = subprocess.run([sys.executable, "-m", "verlrun", "prepare-data", "--config", str(cfg), "--out", str(tmp_path / "d")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(pd.read_parquet(tmp_path / "d/train.parquet")) == 4
    assert len(pd.read_parquet(tmp_path / "d/test.parquet")) == len(_fixture_answers("test"))


def test_math_style_rows_use_the_last_boxed_answer():
    from verl.utils.reward_score import default_compute_score

    frame = pd.DataFrame({"problem": ["What is $\\frac{1}{2}+\\frac{1}{2}$?", "Solve $x+1=3$."],
                          "solution": ["We get $\\boxed{1}$.", "So $x=\\boxed{2}$, not \\boxed{3}... final \\boxed{2}"]})
    rows = to_verl_rows(frame, "math", "train")
    assert [r["ground_truth"] for r in rows["reward_model"]] == ["1", "2"]
    row = rows.iloc[0]
    assert default_compute_score(row.data_source, "so \\boxed{1}", "1") == 1.0


def test_rows_without_an_answer_are_reported():
    frame = pd.DataFrame({"question": ["a", "b"], "answer": ["#### 3", "no final line"]})
    with pytest.raises(ValueError, match=r"row indices \[1\]"):
        to_verl_rows(frame, "gsm8k", "train")
    with pytest.raises(ValueError, match="'question'"):
        to_verl_rows(pd.DataFrame({"q": ["a"], "answer": ["#### 1"]}), "gsm8k", "train")


def test_a_relaunch_of_a_stand_in_verl_resumes_only_the_same_cell(paper, tmp_path, monkeypatch):
    """verl resumes from whatever checkpoint its folder holds: the launcher checks the cell's identity
    first. A finished cell launched again, or a folder of another ablation, is moved aside."""
    script = tmp_path / "stand_in_verl.py"
    script.write_text(STAND_IN_VERL)
    monkeypatch.setattr(launch, "command", lambda overrides, cell_dir: [sys.executable, str(script), "1", "3", "0"])
    monkeypatch.setattr(launch, "compose", lambda overrides: None)
    monkeypatch.setattr(launch, "check_model", lambda cfg, model: None)
    cell, model = tmp_path / "runs/m/rope/seed0", paper["models"][0]
    assert launch.train(Cell.of(paper, model, "rope", 0, cell, tmp_path / "data", steps=3)) == 0
    (cell / "checkpoints").mkdir()
    (cell / "checkpoints/latest_checkpointed_iteration.txt").write_text("3")
    finished = (cell / "metrics.jsonl").read_bytes()
    # `snakemake --force` deletes the job's output (metrics.jsonl) before it runs the launcher: the
    # folder moved aside gets it back from its archived parts, the same bytes.
    (cell / "metrics.jsonl").unlink()
    assert launch.train(Cell.of(paper, model, "rope", 0, cell, tmp_path / "data", steps=3)) == 0
    moved = [p for p in cell.parent.iterdir() if ".replaced-" in p.name]
    assert len(moved) == 1 and (moved[0] / "metrics.jsonl").read_bytes() == finished
    assert "already finished all 3 steps" in (cell / "train.log").read_text()
    (cell / "checkpoints").mkdir()
    (cell / "checkpoints/latest_checkpointed_iteration.txt").write_text("2")
    other = cell.parent.parent / "all/seed0"
    shutil.copytree(cell, other)
    assert launch.train(Cell.of(paper, model, "all", 0, other, tmp_path / "data", steps=3)) == 0
    assert "ablation: 'rope' -> 'all'" in (other / "train.log").read_text()
    # the same cell with more steps resumes from its checkpoint (nothing moved)
    assert launch.train(Cell.of(paper, model, "rope", 0, cell, tmp_path / "data", steps=5)) == 0
    assert "resuming from the checkpoint at step 2 of 5" in (cell / "train.log").read_text()
    assert len([p for p in cell.parent.iterdir() if ".replaced-" in p.name]) == 1


@pytest.mark.parametrize("dynamic", [True, False])
def test_every_rl_setting_reaches_the_verl_keys_its_table_names(paper, tmp_path, dynamic):
    """rla.config.RL says which verl keys each setting becomes; the overrides set exactly those."""
    from rla.config import RL

    cfg = {**paper, "rl": {**paper["rl"], "use_dynamic_bsz": dynamic}}
    written = {o.split("=", 1)[0].lstrip("+") for o in build_overrides(Cell.of(cfg, paper["models"][0], "all", 0, tmp_path, tmp_path))}
    exclusive = "micro_batch_size_per_gpu" if dynamic else "max_token_len_per_gpu"
    for name, key in RL.items():
        if "verl" in key.backends and name != exclusive:
            missing = [target for target in key.verl if target not in written]
            assert not missing, (name, missing)


# ---------------------------------------------------------------------------------------------
# The CPU profile (experiments/verl-cpu.yaml): verl on this machine with vLLM's CPU build

CPU = REPO / "experiments/verl-cpu.yaml"


@pytest.mark.parametrize("ablation", ["none", "all", "fp16", "compile"])
def test_the_cpu_profile_composes_with_its_platform_and_target(tmp_path, ablation):
    cpu = load_config(CPU)
    cfg = compose(build_overrides(Cell.of(cpu, "qwen2-tiny", ablation, 0, tmp_path / "cell", tmp_path / "data")))
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.RLA_TARGET == "auto" and env.RLA_REGIONS == ",".join(ABLATIONS[ablation].regions)
    assert json.loads(env.RLA_ENGINE_CONFIG) == {"compilation_config": {}, "device": "cpu", "enforce_eager": False,
                                                 "tensor_parallel_size": 1}
    assert env.RLA_TREATMENTS == ("compile" if ablation == "compile" else "")
    assert (env.VERL_PLATFORM, env.VERL_USE_EXTERNAL_MODULES, env.VERL_ENGINE_DEVICE) == ("cpu", "verlrun.cpu_shims", "cuda")
    assert env.VLLM_CPU_KVCACHE_SPACE == "1" and env.VLLM_CPU_OMP_THREADS_BIND == "nobind"
    assert all(isinstance(v, str) for v in env.values())  # Ray's env_vars take strings only
    assert cfg.ray_kwargs.ray_init.num_gpus == 1 and cfg.trainer.n_gpus_per_node == 1 and cfg.trainer.device == "cpu"
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert not cfg.actor_rollout_ref.rollout.enable_sleep_mode and not cfg.actor_rollout_ref.rollout.free_cache_engine
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.rollout.dtype == ("float16" if ablation == "fp16" else "bfloat16")
    # The built model, read from <results_dir>/hf_models.
    assert cfg.actor_rollout_ref.model.path == str((REPO / "results/verl-cpu/hf_models/qwen2-tiny").resolve())


def test_the_target_reaches_the_workers_of_every_profile(paper, tmp_path):
    for target in ("vllm", "vllm-cpu", "auto"):
        cfg = {**paper, "verl": {**paper["verl"], "target": target}}
        env = compose(build_overrides(Cell.of(cfg, "qwen3-8b", "all", 0, tmp_path, tmp_path))).ray_kwargs.ray_init.runtime_env.env_vars
        assert env.RLA_TARGET == target and ("RLA_ENGINE_CONFIG" in env) == (target == "auto")
    with pytest.raises(ValueError, match="verl.target = 'gpu' is not allowed; allowed: auto, vllm, vllm-cpu"):
        build_overrides(Cell.of({**paper, "verl": {**paper["verl"], "target": "gpu"}}, "qwen3-8b", "all", 0, tmp_path, tmp_path))
    with pytest.raises(ValueError, match="verl.platform = 'tpu' is not allowed; allowed: cuda, cpu"):
        build_overrides(Cell.of({**paper, "verl": {**paper["verl"], "platform": "tpu"}}, "qwen3-8b", "all", 0, tmp_path, tmp_path))


def test_a_cpu_cell_runs_one_rank(tmp_path):
    cpu = load_config(CPU)
    bad = {**cpu, "verl": {**cpu["verl"], "n_gpus_per_node": 8}}
    with pytest.raises(ValueError, match="nnodes, n_gpus_per_node and rollout_tp must be 1, got .*'n_gpus_per_node': 8"):
        build_overrides(Cell.of(bad, "qwen2-tiny", "none", 0, tmp_path, tmp_path))


@pytest.mark.parametrize("kl_coef", [0.0, 0.001])
def test_reference_policy_keys_are_written_exactly_when_verl_runs_one(paper, tmp_path, kl_coef):
    from verl.trainer.ppo.utils import need_reference_policy

    cfg = {**paper, "rl": {**paper["rl"], "kl_coef": kl_coef}}
    overrides = build_overrides(Cell.of(cfg, "qwen3-8b", "none", 0, tmp_path, tmp_path))
    written = [o for o in overrides if o.startswith("actor_rollout_ref.ref.")]
    composed = compose(overrides)
    assert need_reference_policy(composed) == (kl_coef > 0) == bool(written)
    if written:
        assert composed.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == \
            composed.actor_rollout_ref.actor.ppo_max_token_len_per_gpu


def test_a_model_spec_has_a_path_or_a_build(tmp_path):
    cpu = load_config(CPU)
    spec = cpu["model_specs"]["qwen2-tiny"]
    for bad, message in [({**spec, "path": "Qwen/Qwen3-8B"}, "not both"), ({}, "not neither"),
                         ({"build": {**spec["build"], "hidden": 3}}, r"unknown model_specs.qwen2-tiny.build key\(s\) \['hidden'\]"),
                         ({"build": {**spec["build"], "arch": "llama"}}, "build.arch = 'llama'; allowed: qwen2, qwen3")]:
        with pytest.raises(ValueError, match=message):
            build_overrides(Cell.of({**cpu, "model_specs": {"qwen2-tiny": bad}}, "qwen2-tiny", "none", 0, tmp_path, tmp_path))


def test_a_built_model_is_staged_once_with_a_chat_template_and_rebuilt_when_its_spec_changes(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from tinyqwen.task import chat_messages, render_prompt

    cpu = {**load_config(CPU), "results_dir": str(tmp_path)}
    path = models.stage(cpu, "qwen2-tiny")
    assert path == tmp_path / "hf_models/qwen2-tiny" and models.is_staged(cpu, "qwen2-tiny")
    config = AutoConfig.from_pretrained(path)
    build = cpu["model_specs"]["qwen2-tiny"]["build"]
    assert (config.hidden_size, config.head_dim, config.num_attention_heads) == (build["hidden_size"], build["head_dim"],
                                                                              build["num_attention_heads"])
    assert config.hidden_size == config.num_attention_heads * config.head_dim and config.head_dim >= 32
    tokenizer = AutoTokenizer.from_pretrained(path)
    messages = chat_messages("Ana has 3 pens. How many pens does Ana have now?")
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == render_prompt(messages)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert models.stage(cpu, "qwen2-tiny") == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    other = {**cpu, "model_specs": {"qwen2-tiny": {"build": {**build, "seed": 1}}}}
    assert not models.is_staged(other, "qwen2-tiny")
    models.stage(other, "qwen2-tiny")
    assert models.is_staged(other, "qwen2-tiny") and not models.is_staged(cpu, "qwen2-tiny")


def test_generated_data_is_the_local_task_in_verls_schema(tmp_path):
    from verl.utils.reward_score import default_compute_score

    cpu = load_config(CPU)
    written = prepare(cpu["data"], tmp_path)
    train, test = (pd.read_parquet(written[s]) for s in ("train", "test"))
    assert (len(train), len(test)) == (cpu["data"]["generate"]["n_train"], cpu["data"]["generate"]["n_test"])
    row = train.iloc[0]
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], f"#### {truth}", truth) == 1.0
    with pytest.raises(ValueError, match="data.generate makes both splits"):
        prepare({**cpu["data"], "train": {"source": str(FIXTURE)}}, tmp_path / "x")


def test_gpu_only_commands_refuse_a_cpu_profile():
    for command in ("plan", "preflight"):
        out = subprocess.run([sys.executable, "-m", "verlrun", command, "--config", str(CPU)], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 2 and "verl.platform = 'cpu'" in out.stderr and command in out.stderr


def test_auto_hands_the_workers_the_rollouts_engine_config(paper, tmp_path):
    """target auto: each cell's workers get RLA_ENGINE_CONFIG from its final overrides; the TP=2 cells
    switch vLLM's fused all-reduce + RMSNorm off, which the table reader would refuse otherwise."""
    from patches import engine_table

    def engine_config(cfg, model):
        [env] = [o for o in build_overrides(Cell.of(cfg, model, "all", 0, tmp_path, tmp_path)) if "RLA_ENGINE_CONFIG=" in o]
        return engine_table.EngineConfig.parse(env.partition("=")[2].strip("'"))

    assert paper["verl"]["target"] == "auto"
    tp2 = [m for m, spec in paper["model_specs"].items() if spec.get("rollout_tp", 1) > 1]
    assert tp2
    for model in paper["models"]:
        config = engine_config(paper, model)
        assert config.device == "cuda" and not config.enforce_eager
        assert config.tensor_parallel_size == paper["model_specs"][model].get("rollout_tp", 1)
        assert engine_table.refusal(config) is None, model
    unfused = {**paper, "model_specs": {m: {**s, "overrides": []} for m, s in paper["model_specs"].items()}}
    assert "tensor_parallel_size=2" in engine_table.refusal(engine_config(unfused, tp2[0]))


# ---------------------------------------------------------------------------------------------
# vLLM's batch-invariant mode (verl's full_determinism): another engine than the targets describe


def _with_overrides(cfg: dict, *overrides: str) -> dict:
    return {**cfg, "verl": {**cfg["verl"], "overrides": [*cfg["verl"].get("overrides", []), *overrides]}}


@pytest.mark.parametrize("switch", ["actor_rollout_ref.rollout.full_determinism=True",
                                    "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_BATCH_INVARIANT='1'"])
def test_full_determinism_with_aligned_regions_is_refused_naming_why(paper, tmp_path, monkeypatch, switch):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    cfg, model = _with_overrides(paper, switch), paper["models"][0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(switch)}: verl's full_determinism turns on vLLM's "
                                          r"batch-invariant mode \(VLLM_BATCH_INVARIANT=1\), which the aligned regions "
                                          r"of ablation 'rope' \(rope\) cannot follow: .*RMSNorm through its Triton "
                                          r"kernel \(batch_invariant.py:1035-1083.*Allowed: "):
        build_overrides(Cell.of(cfg, model, "rope", 0, tmp_path, tmp_path))
    assert switch in build_overrides(Cell.of(cfg, model, "none", 0, tmp_path, tmp_path))  # no region: allowed
    switched_off = _with_overrides(cfg, "actor_rollout_ref.rollout.full_determinism=False",
                                   "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_BATCH_INVARIANT='0'")
    build_overrides(Cell.of(switched_off, model, "all", 0, tmp_path, tmp_path))  # the last override wins


def test_batch_invariance_from_the_launching_environment_is_refused_with_regions(paper, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")  # verl forwards it to every worker
    with pytest.raises(ConfigError, match=r"^VLLM_BATCH_INVARIANT=1 in the launching environment: .* 'all' "):
        build_overrides(Cell.of(paper, paper["models"][0], "all", 0, tmp_path, tmp_path))
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    build_overrides(Cell.of(paper, paper["models"][0], "all", 0, tmp_path, tmp_path))
