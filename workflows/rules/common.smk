# Config validation, paths and functions shared by every stage.
import hashlib
import os
import re
import shlex
import sys
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate
from snakemake_interface_executor_plugins.settings import DeploymentMethod

import studies as declared_studies
from studies import STUDIES
from rla import config as settings
from rla import files
from rla import layout
from rla import names
from rla.names import ABLATIONS
import verlrun.models as staging

STUDY_ROOT = declared_studies.HERE.parent  # the repository the studies are declared in
# the studies the grid runs on each of its models (their study.yaml's `per_model:`)
PER_MODEL = {name: s.workflow["per_model"] for name, s in STUDIES.items() if "per_model" in s.workflow}
CPU_ENV = "../../envs/cpu.yaml"
SCHEMA = "../schemas/config.schema.yaml"
CLI = workflow.config_settings.config  # the --config values, as Snakemake parsed them
CONFIG_FILES = [os.path.relpath(f) for f in workflow.config_settings.configfiles] or ["experiments/tiny.yaml"]


def _typed(value):
    """--config 'verl={nnodes: 2}' hands nested values over as strings: type them as YAML would."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if not isinstance(value, str):
        return value
    for parse in (int, float):
        try:
            return parse(value)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(value.strip().lower(), value)


def _normalize_cli_values(cfg):
    """--config 'seeds=[0,1]' hands list items over as strings and a single value without a list."""
    settings.lay(cfg, _typed(CLI))
    for key in ("models", "ablations", "seeds"):
        if key in cfg and not isinstance(cfg[key], (list, tuple)):
            cfg[key] = [cfg[key]]


def _origin(path):
    """Where a config value came from: the --config option or the config file(s)."""
    return "--config" if path and path[0] in CLI else " + ".join(CONFIG_FILES)


def _check_schema(cfg):
    """The schema's verdict in a few lines: the key, the value, what is allowed, where it came from
    (Snakemake's own message is followed by the whole schema and config)."""
    schema = yaml.safe_load(Path(workflow.source_path(SCHEMA)).read_text())
    lines = []
    for error in sorted(Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(e.path))[:5]:
        where = ".".join(str(p) for p in error.path) or "config"
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            unknown = sorted(set(error.instance) - set(allowed))
            lines.append(f"unknown key(s) {unknown} in {where} (from {_origin(list(error.path) + unknown)}); "
                         f"allowed: {', '.join(allowed)}")
        else:  # an enum's message names the allowed values
            lines.append(f"{where} = {error.instance!r} (from {_origin(list(error.path))}): {error.message}")
    if lines:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(lines))


def _check_sections(cfg):
    """What a JSON schema cannot say: names that must exist elsewhere in the config, and every
    section's keys and values, checked as the backend's CLIs check them (rla.config)."""
    specs, backend = cfg["model_specs"], cfg["backend"]
    if unknown := [m for m in cfg["models"] if m not in specs]:
        raise WorkflowError(f"models {unknown} have no entry in model_specs; defined: {sorted(specs)}")
    if backend == "verl":
        if local := [a for a in cfg["ablations"] if names.local_only(a)]:
            raise WorkflowError(f"ablations {local} run on the local backend only (from {_origin(['ablations'])}); "
                                f"{names.TREATMENTS['engine_order']}")
    needed = "data" if backend == "verl" else "task"
    if needed not in cfg:
        raise WorkflowError(f"backend {backend!r} needs a {needed!r} section")
    checks = {"model_specs": lambda m: settings.model_spec(cfg, m, backend),
              "rl": lambda m: settings.rl_settings(cfg, backend, m),
              "engine": lambda m: settings.engine_settings(cfg, backend),
              "collapse": lambda m: settings.collapse_settings(cfg),
              **({"verl": lambda m: settings.verl_settings(cfg, m), "data": lambda m: settings.data_settings(cfg)}
                 if backend == "verl" else {"warmstart": lambda m: settings.warmstart_settings(cfg),
                                            "task": lambda m: settings.task_settings(cfg.get("task"))})}
    for section, check in checks.items():
        for model in cfg["models"]:
            try:
                check(model)
            except settings.ConfigError as err:
                raise WorkflowError(f"invalid config (from {_origin([section])}):\n  {err}") from None


if not workflow.modifier.namespace:  # a grid study's module (named) gets its config files alone, as they are
    _normalize_cli_values(config)
_check_schema(config)
validate(config, schema=SCHEMA, set_default=True)
_check_sections(config)

BACKEND = config["backend"]
BACKEND_MODULE = {"local": "localrl", "verl": "verlrun"}[BACKEND]
PROFILE = config["profile"]
RESULTS = str(layout.results_dir(config))  # each profile its own
RUNS = str(layout.runs_dir(config))
TABLES = str(layout.tables_dir(config))
LOGS = str(layout.logs_dir(config))
DATA = str(layout.data_dir(config))
FIGURES = f"{config['figures_dir'].rstrip('/')}/{PROFILE}"
# verl cells run on GPUs (envs/verl-gpu.yaml) unless the profile says verl.platform: cpu
# (vLLM's CPU build, envs/cpu.yaml); the local backend runs on CPU.
PLATFORM = settings.verl_settings(config)["platform"] if BACKEND == "verl" else "cpu"
TRAIN_ENV = "../../envs/verl-gpu.yaml" if PLATFORM == "cuda" else CPU_ENV
TRAIN_RESOURCES = config["resources"]["train"]


# The validated config (with the --config values) for the jobs' CLIs, named by its content: a later run with
# other values writes another file, never the one running jobs read. It lives with Snakemake's own metadata,
# so a dry run writes nothing under the results directory.
_text = yaml.safe_dump({**config, "results_dir": RESULTS}, sort_keys=False)
CONFIG_FILE = f".snakemake/configs/{PROFILE}-{hashlib.sha256(_text.encode()).hexdigest()[:12]}.yaml"
if not Path(CONFIG_FILE).exists():
    files.write_text(CONFIG_FILE, _text)


# Jobs find the file in $RLA_CONFIG, not in params: a config change reruns only the jobs whose own settings
# (params) changed. Each command that reads it exports it first (configured(...)): the shell prefix is one for
# the whole run, and a grid study's rules (a module: workflows/rules/studies.smk) read their own file.
def configured(command):
    return f"export RLA_CONFIG={shlex.quote(CONFIG_FILE)}; {command}"


_prefix = "set -euo pipefail; "
# Without conda, `python` in a job is the interpreter running Snakemake (e.g. .venv/bin/python),
# also when Snakemake was started as .venv/bin/snakemake without activating the venv.
if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
    _prefix += f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:\"$PATH\"; "
shell.prefix(_prefix)


wildcard_constraints:
    model="|".join(re.escape(m) for m in config["model_specs"]),
    ablation="|".join(re.escape(a) for a in ABLATIONS),
    seed=r"\d+",


GRID_CELLS = [(m, a, s) for m in config["models"] for a in config["ablations"] for s in config["seeds"]]


def grid_metrics():
    return [f"{layout.cell_dir(config, m, a, s)}/metrics.jsonl" for m, a, s in GRID_CELLS]


def train_benchmarks():  # the train rule's `benchmark:` of each cell
    return [f"{RESULTS}/benchmarks/train/{m}/{a}/seed{s}.tsv" for m, a, s in GRID_CELLS]


def per_model_targets(name=None):
    """The per-model studies' folders of each grid model (`name`: that study's only), where the config turns
    them on (local backend)."""
    if BACKEND != "local":
        return []
    return [f"{RESULTS}/{n}/{m}" for n in PER_MODEL if config.get(n) and n == (name or n) for m in config["models"]]


def per_model_command(text, name):
    """A declared per-model command with the grid's folders filled; Snakemake's own placeholders kept."""
    return (text.replace("{folder}", f"{RESULTS}/{name}").replace("{figures}", FIGURES)
            .replace("{tables}", TABLES))


def per_model_tables():
    return [f"{TABLES}/{how['table']}" for n, how in PER_MODEL.items() if per_model_targets(n)]


def all_targets():
    return (grid_metrics() + [f"{TABLES}/{name}" for name in ("metrics.parquet", "stability.csv", "summary.csv")]
            + per_model_targets() + per_model_tables())


def cell_settings(model):
    """Everything one training cell depends on besides its wildcards (provenance of train):
    changing these reruns the cell; adding seeds or models does not touch existing cells."""
    return {
        "backend": BACKEND,
        "model": config["model_specs"][model],
        "rl": config.get("rl"),
        "engine": settings.identity_of(settings.engine_settings(config), settings.ENGINE) if BACKEND == "local" else None,
        "verl": config.get("verl") if BACKEND == "verl" else None,
    }


def runs_root(metrics_file):
    """results/<profile>/runs from .../runs/<model>/<ablation>/seed<S>/metrics.jsonl."""
    return str(Path(metrics_file).parents[3])


# one training cell: what it reads and the scheduler resources it gets (the model's `resources` in
# model_specs, else the config's resources.train; one node unless the model asks for more)
def cell_inputs(wildcards):
    """The data, and the cell's model: warm-started (local backend) or staged, downloaded or built here
    (verl backend; none for a local `path`)."""
    inputs = {"train": f"{DATA}/train.parquet", "test": f"{DATA}/test.parquet"}
    if BACKEND == "local":
        inputs["model"] = str(layout.model_dir(config, wildcards.model))
    elif staging.needs_staging(config, wildcards.model):
        inputs["hf_model"] = str(staging.local_path(config, wildcards.model))
    return inputs


def cell_resource(name):
    return lambda wildcards: (config["model_specs"][wildcards.model].get("resources") or {}).get(
        name, TRAIN_RESOURCES[name])


def cell_nodes(wildcards):
    return settings.verl_settings(config, wildcards.model)["nnodes"] if BACKEND == "verl" else 1


def train_gpus(wildcards):
    """GPUs one cell holds: all of its verl nodes' GPUs; the local backend and verl on a CPU hold none."""
    if BACKEND != "verl":
        return TRAIN_RESOURCES.get("gpu", 0)
    verl = settings.verl_settings(config, wildcards.model)
    return 0 if PLATFORM == "cpu" else verl["nnodes"] * verl["n_gpus_per_node"]
