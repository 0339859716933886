# Config validation, paths and functions shared by every stage.
import os
import re
import shlex
import sys
from pathlib import Path

import yaml
from snakemake.utils import validate
from snakemake_interface_executor_plugins.settings import DeploymentMethod

ABLATIONS = ["none", "rope", "swiglu", "rmsnorm", "all"]
BACKEND_MODULES = {"local": "localrl", "verl": "verlrun"}
CPU_ENV = "../../envs/cpu.yaml"
GPU_ENV = "../../envs/verl-gpu.yaml"


def _normalize_cli_values(cfg):
    """`--config seeds=[0,1] steps=200` hands list items over as strings and a single value
    without a list: turn them into what the schema describes."""
    for key in ("models", "ablations", "seeds"):
        if key in cfg and not isinstance(cfg[key], (list, tuple)):
            cfg[key] = [cfg[key]]
    if "seeds" in cfg:
        cfg["seeds"] = [int(s) if isinstance(s, str) and s.strip().isdigit() else s for s in cfg["seeds"]]
    if isinstance(cfg.get("steps"), str) and cfg["steps"].strip().isdigit():
        cfg["steps"] = int(cfg["steps"])


def _check_cross_references(cfg):
    """What a JSON schema cannot say: names that must exist elsewhere in the config."""
    specs = cfg["model_specs"]
    unknown = [m for m in cfg["models"] if m not in specs]
    if unknown:
        raise ValueError(f"models {unknown} have no entry in model_specs; defined: {sorted(specs)}")
    if cfg["backend"] == "verl":
        if "data" not in cfg:
            raise ValueError("backend 'verl' needs a 'data' section (train/test sources)")
        no_path = [m for m in cfg["models"] if not specs[m].get("path")]
        if no_path:
            raise ValueError(f"backend 'verl' needs model_specs.<model>.path (HF name or local dir); missing for {no_path}")
    elif "task" not in cfg:
        raise ValueError("backend 'local' needs a 'task' section")


_normalize_cli_values(config)
validate(config, schema="../schemas/config.schema.yaml", set_default=True)
_check_cross_references(config)

BACKEND = config["backend"]
BACKEND_MODULE = BACKEND_MODULES[BACKEND]
PROFILE = config["profile"]
RESULTS = config["results_dir"].rstrip("/")
RUNS = f"{RESULTS}/runs"
TABLES = f"{RESULTS}/tables"
LOGS = f"{RESULTS}/logs"
DATA = f"{RESULTS}/data/{PROFILE}"
FIGURES = f"{config['figures_dir'].rstrip('/')}/{PROFILE}"
TRAIN_ENV = GPU_ENV if BACKEND == "verl" else CPU_ENV
# The CLIs read a config file; this one holds the validated config including --config values.
CONFIG_FILE = f"{RESULTS}/configs/{PROFILE}.yaml"


def _write_resolved_config(cfg, path):
    """Write only when the content changes (jobs on a cluster re-read the workflow)."""
    text = yaml.safe_dump(dict(cfg), sort_keys=False)
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


_write_resolved_config(config, CONFIG_FILE)

# Without conda, `python` in a job is the interpreter running Snakemake (e.g. .venv/bin/python),
# also when Snakemake was started as .venv/bin/snakemake without activating the venv.
if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
    shell.prefix(f"set -euo pipefail; export PATH={shlex.quote(os.path.dirname(sys.executable))}:\"$PATH\"; ")


wildcard_constraints:
    model="|".join(re.escape(m) for m in config["model_specs"]),
    ablation="|".join(ABLATIONS),
    seed=r"\d+",


def cell_dir(model, ablation, seed):
    return f"{RUNS}/{model}/{ablation}/seed{seed}"


def grid_metrics():
    """metrics.jsonl of every cell of the configured grid."""
    return [
        f"{cell_dir(m, a, s)}/metrics.jsonl"
        for m in config["models"]
        for a in config["ablations"]
        for s in config["seeds"]
    ]


def probe_targets():
    if BACKEND == "local" and config["probe"]:
        return [f"{RESULTS}/probe/{m}" for m in config["models"]]
    return []


def probe_figure_targets():
    return [f"{TABLES}/probe_subsets.csv"] if probe_targets() else []


def all_targets():
    return grid_metrics() + [
        f"{TABLES}/metrics.parquet",
        f"{TABLES}/stability.csv",
        f"{TABLES}/summary.csv",
    ] + probe_targets() + probe_figure_targets()


def data_settings():
    """The config section the prepared data depends on (provenance of prepare_data)."""
    return config.get("data") if BACKEND == "verl" else config.get("task")


def cell_settings(model):
    """Everything one training cell depends on besides its wildcards (provenance of train):
    changing these reruns the cell; adding seeds or models does not touch existing cells."""
    return {
        "backend": BACKEND,
        "model": config["model_specs"][model],
        "rl": config.get("rl"),
        "verl": config.get("verl") if BACKEND == "verl" else None,
    }


def train_inputs(wildcards):
    inputs = {"train": f"{DATA}/train.parquet", "test": f"{DATA}/test.parquet"}
    if BACKEND == "local":
        inputs["model"] = f"{RESULTS}/models/{wildcards.model}"
    return inputs


def runs_root(metrics_file):
    """results/runs from results/runs/<model>/<ablation>/seed<S>/metrics.jsonl."""
    return str(Path(metrics_file).parents[3])


def train_resources():
    return config["resources"]["train"]


def train_gpus(wildcards):
    """GPUs one cell holds: all of its verl nodes' GPUs; the local backend runs on CPU."""
    if BACKEND != "verl":
        return train_resources().get("gpu", 0)
    spec = config["model_specs"][wildcards.model]
    verl = config.get("verl") or {}
    nodes = spec.get("nnodes", verl.get("nnodes", 1))
    return nodes * spec.get("n_gpus_per_node", verl.get("n_gpus_per_node", 8))
