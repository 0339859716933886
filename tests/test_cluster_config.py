"""What verl's FSDP engine would use for the FP16 baseline, and what the cluster profiles promise."""

from __future__ import annotations

import inspect
import re
from types import SimpleNamespace

import pytest
import torch
import yaml

from rla.config import load as load_config
from verlrun.overrides import build_overrides, compose
from tests.test_verlrun import PAPER, REPO
from tests.test_workflow import copy_workflow, snakemake
from rla.cells import Cell


def engine_precision(cfg):
    """param, reduce and buffer dtypes and the grad scaler verl's FSDPEngine builds from this config:
    the actor's engine config as verl's worker gets it, read with the engine's own lines."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_dtypes import PrecisionType
    from verl.workers.engine.fsdp import transformer_impl

    source = inspect.getsource(transformer_impl.FSDPEngine._build_fsdp_module)
    # The lines mirrored below; a verl that reads precision elsewhere fails this test.
    assert 'mixed_precision_config = self.engine_config.mixed_precision' in source
    assert 'mixed_precision_config.get("param_dtype", "bf16")' in source
    assert "if param_dtype == torch.float16:" in source and "ShardedGradScaler" in source
    engine = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).engine
    mixed = engine.mixed_precision
    assert mixed is not None, "without mixed_precision verl's engine falls back to bf16"
    param = PrecisionType.to_dtype(mixed.get("param_dtype", "bf16"))
    return SimpleNamespace(param=param, reduce=PrecisionType.to_dtype(mixed.get("reduce_dtype", "fp32")),
                           buffer=PrecisionType.to_dtype(mixed.get("buffer_dtype", "fp32")),
                           scaler=param == torch.float16, master=PrecisionType.to_dtype(engine.model_dtype))


@pytest.mark.parametrize("dtype,expected", [("float16", torch.float16), ("bfloat16", torch.bfloat16)])
def test_rl_dtype_reaches_the_fsdp_engine_and_vllm(dtype, expected, tmp_path):
    paper = load_config(PAPER)
    cfg = {**paper, "rl": {**paper["rl"], "dtype": dtype}}
    composed = compose(build_overrides(Cell.of(cfg, "qwen3-1.7b", "all", 0, tmp_path, tmp_path)))
    precision = engine_precision(composed)
    assert precision.param == expected and precision.reduce == torch.float32 and precision.buffer == torch.float32
    assert precision.master == torch.float32
    assert precision.scaler == (expected == torch.float16)  # verl's ShardedGradScaler: loss scaling for FP16
    assert composed.actor_rollout_ref.rollout.dtype == dtype


def test_an_unknown_dtype_names_the_allowed_ones(tmp_path):
    paper = load_config(PAPER)
    with pytest.raises(ValueError, match="rl.dtype = 'fp8' is not allowed; allowed: bfloat16, float16"):
        build_overrides(Cell.of({**paper, "rl": {**paper["rl"], "dtype": "fp8"}}, "qwen3-8b", "none", 0, tmp_path, tmp_path))


# ---------------------------------------------------------------------------------------------
# Profiles

def test_both_profiles_switch_conda_on_and_the_gpu_env_is_used_by_verl_rules():
    for name in ("slurm", "local"):
        profile = yaml.safe_load((REPO / f"profiles/{name}/config.yaml").read_text())
        assert profile["software-deployment-method"] == "conda", name
    common = (REPO / "workflows/rules/common.smk").read_text()
    # Without conda the rules would put the interpreter running Snakemake first on PATH.
    assert "DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method" in common


def _dry_run_jobs(work, *args):
    out = snakemake(work, *args, "--dry-run")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = []
    for block in out.stdout.split("\n\n"):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        resources = re.search(r"resources: (.*)", block)
        wildcards = re.search(r"wildcards: (.*)", block)
        if rule and resources:
            jobs.append({"rule": rule.group(1), "wildcards": dict(kv.split("=") for kv in wildcards.group(1).split(", ")) if wildcards else {},
                         "resources": dict(kv.split("=", 1) for kv in resources.group(1).split(", ")),
                         "threads": int(re.search(r"threads: (\d+)", block).group(1)) if "threads:" in block else 1})
    return jobs


def test_the_slurm_profile_submits_each_paper_cell_to_one_node_with_its_resources(tmp_path, conda_on_path):
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    work = copy_workflow(tmp_path / "wf")
    paper = load_config(work / "experiments/paper.yaml")
    jobs = [j for j in _dry_run_jobs(work, "--configfile", "experiments/paper.yaml", "--workflow-profile", "profiles/slurm")
            if j["rule"] == "train"]
    assert len(jobs) == 36
    for job in jobs:
        spec = paper["model_specs"][job["wildcards"]["model"]]
        want = {**paper["resources"]["train"], **spec.get("resources", {})}
        res = job["resources"]
        assert (int(res["gpu"]), int(res["nodes"])) == (paper["verl"]["n_gpus_per_node"], 1)
        assert (int(res["mem_mb"]), int(res["runtime"])) == (want["mem_mb"], want["runtime"])
        # What the SLURM plugin makes of them.
        resources = {k: (int(v) if v.isdigit() else v) for k, v in res.items()}
        fake = SimpleNamespace(resources=SimpleNamespace(get=resources.get, **resources), threads=job["threads"],
                               is_group=lambda: False, name="train")
        params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "", "partition": " -p gpu", "workdir": None}
        call = get_submit_command(fake, params) + set_gres_string(fake)
        assert "--nodes=1" in call and "--gpus=8" in call
        assert f"--mem {want['mem_mb']}" in call and f"-t {want['runtime']}" in call


def test_the_partition_file_parses_with_the_plugin_and_holds_every_cell():
    from snakemake_executor_plugin_slurm.partitions import read_partition_file

    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    partitions = {p.name: p.limits for p in read_partition_file(REPO / profile["slurm-partition-config"])}
    paper = load_config(PAPER)
    for model in paper["models"]:
        want = {**paper["resources"]["train"], **paper["model_specs"][model].get("resources", {})}
        assert any(l.max_gpu >= 8 and l.max_mem_mb >= want["mem_mb"] and l.max_runtime >= want["runtime"]
                   for l in partitions.values()), model
