"""A verl cell's identity, and what a launch does with the cell folder (the policy is `rla.cells`).

verl resumes from `trainer.default_local_dir` whatever wrote it (`resume_mode=auto`), so the launcher
checks first: the identity of the cell that wrote the folder is kept in `identity.json`, the last
checkpointed step in verl's own tracker file.
"""

from __future__ import annotations

import json
from pathlib import Path

from rla import cells, files
from rla.config import RL, identity_of
from verlrun import metrics

IDENTITY_FILE = "identity.json"
TRACKER = "checkpoints/latest_checkpointed_iteration.txt"  # verl's, in trainer.default_local_dir


def identity(cell: cells.Cell, rl: dict, verl: dict, spec: dict) -> dict:
    """What the cell's results depend on (besides `steps`), given its checked settings. Data not
    prepared yet (a dry run) counts as its own value: the real launch then sees a change and starts
    the cell fresh."""
    splits = [cell.data / "train.parquet", cell.data / "test.parquet"]
    return cells.canonical({
        "backend": "verl", "model": cell.model, "model_spec": spec, "ablation": cell.ablation, "seed": cell.seed,
        "rl": identity_of(rl, RL), "verl": verl,
        "data": cells.fingerprint(*splits) if all(p.exists() for p in splits) else "not prepared",
    })


def decide(cell_dir: Path, new: dict, steps: int) -> cells.Plan:
    recorded = cell_dir / IDENTITY_FILE
    old = json.loads(recorded.read_text()) if recorded.exists() else {}
    tracker = cell_dir / TRACKER
    done = int(tracker.read_text().strip() or 0) if tracker.exists() else 0
    has_results = any((cell_dir / name).exists() for name in ("metrics.jsonl", "checkpoints", "metrics.parts"))
    return cells.plan(old.get("identity"), old.get("steps"), done, has_results, new, steps)


def prepare(cell_dir: Path, plan: cells.Plan, new: dict, steps: int) -> Path | None:
    """Carry out `plan`: move an incompatible folder aside, record the identity. Returns the moved-to path."""
    moved = cells.move_aside(cell_dir) if plan.action == "replace" and cell_dir.exists() else None
    if moved is not None:
        metrics.restore(moved)
    cell_dir.mkdir(parents=True, exist_ok=True)
    files.write_text(cell_dir / IDENTITY_FILE, json.dumps({"identity": new, "steps": steps}, indent=1,
                                                          sort_keys=True) + "\n")
    return moved
