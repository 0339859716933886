"""A cell's identity, and what a (re)run of a cell does with what its folder already holds: start fresh,
resume, start over, or move the folder aside to `<cell>.replaced-<time>` and start fresh (docs/running.md,
"One cell, reruns and progress"). Nothing a cell wrote is ever deleted or overwritten by a run of another
configuration."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rla import layout
from rla.config import ConfigError, is_integer
from rla.names import ABLATIONS

REPLACED = ".replaced-"  # suffix of a moved-aside cell folder: `seed0.replaced-20261130-191500`


@dataclass(frozen=True, eq=False)
class Cell:
    """One cell of a config's grid and its folders: what either backend's launcher is handed.
    `Cell.of` checks the ablation, seed and steps, fills in the defaults (the profile's data folder,
    the config's steps) and makes the paths absolute (verl's Hydra changes the working directory)."""

    cfg: dict = field(repr=False)
    model: str
    ablation: str
    seed: int
    out: Path  # the cell folder
    data: Path  # train.parquet and test.parquet
    steps: int

    @classmethod
    def of(cls, cfg: dict, model: str, ablation: str, seed: int, out: str | Path,
           data: str | Path | None = None, steps: int | None = None) -> "Cell":
        if ablation not in ABLATIONS:
            raise ConfigError(f"unknown ablation {ablation!r}; allowed: {', '.join(ABLATIONS)}")
        return cls(cfg, model, ablation, _count("seed", seed, 0), Path(out).resolve(),
                   Path(data if data is not None else layout.data_dir(cfg)).resolve(),
                   _count("steps", cfg.get("steps") if steps is None else steps, 1))

    @property
    def name(self) -> str:
        """One name per cell: verl's experiment_name (and so the wandb run)."""
        return f"{self.model}-{self.ablation}-seed{self.seed}"


def add_arguments(parser) -> None:
    """A cell's command-line arguments, as both backends' `train` take them (`Cell.of`'s)."""
    parser.add_argument("--config", required=True, help="experiment config (YAML)")
    parser.add_argument("--model", required=True, help="a key of model_specs")
    parser.add_argument("--ablation", required=True, help="an ablation of rla.names.ABLATIONS: " + ", ".join(ABLATIONS))
    parser.add_argument("--seed", required=True, type=int)
    parser.add_argument("--out", required=True, help="the cell directory, results/runs/MODEL/ABLATION/seedS")
    parser.add_argument("--data", help="directory with train.parquet and test.parquet (default: <results_dir>/data)")
    parser.add_argument("--steps", type=int, help="RL steps (default: the config's steps)")


def _count(name: str, value, least: int) -> int:
    """An integer >= `least`, also from a wildcard's digits ("3")."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not is_integer(value) or value < least:
        raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def fingerprint(*paths: str | Path) -> str:
    """sha256 (first 16 hex digits) of the files' bytes, in the given order."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def canonical(identity: dict) -> dict:
    """The identity as JSON would give it back (tuples as lists...), so stored and fresh ones compare."""
    return json.loads(json.dumps(identity, sort_keys=True))


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<unset>"), new.get(key, "<unset>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


@dataclass(frozen=True)
class Plan:
    action: str  # fresh | resume | continue | restart | replace
    message: str

    @property
    def restores(self) -> bool:
        """Whether the run goes on from the folder's last checkpoint."""
        return self.action in ("resume", "continue")


def plan(old_identity: dict | None, old_steps: int | None, done: int, has_results: bool, identity: dict,
         steps: int) -> Plan:
    """What a run of `identity` for `steps` steps does with a folder whose last checkpoint is at step
    `done` (0: none), written by `old_identity` for `old_steps` steps (None: unknown)."""
    identity = canonical(identity)
    if old_identity is None:
        if has_results:
            return Plan("replace", "the folder holds results of unknown identity (no identity recorded)")
        return Plan("fresh", "new cell")
    changed = differences(canonical(old_identity), identity)
    if changed:
        return Plan("replace", "the folder holds another configuration's results: " + "; ".join(changed))
    if done == 0:
        return Plan("restart", "no checkpoint yet: starting over")
    if done < steps:
        if old_steps is not None and done >= old_steps:
            return Plan("continue", f"continuing the finished {done}-step cell to {steps} steps")
        return Plan("resume", f"resuming from the checkpoint at step {done} of {steps}")
    if done == steps:
        return Plan("replace", f"the cell already finished all {steps} steps: training it again")
    return Plan("replace", f"its checkpoint (step {done}) is past the {steps} steps asked for")


def move_aside(cell_dir: str | Path) -> Path:
    """Rename the cell folder to `<name>.replaced-<time>`; returns the new path."""
    cell_dir = Path(cell_dir)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = cell_dir.with_name(f"{cell_dir.name}{REPLACED}{stamp}")
    n = 1
    while target.exists():
        target = cell_dir.with_name(f"{cell_dir.name}{REPLACED}{stamp}-{n}")
        n += 1
    os.replace(cell_dir, target)
    return target
