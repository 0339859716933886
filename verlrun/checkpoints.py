"""Bounded checkpoints across restarts: what the launcher prunes, since verl prunes only what its running process
saved (docs/running.md, "Disk"). A `global_step_N` newer than the tracked one is an interrupted save (verl writes
its tracker last) and goes too.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

STEP_RE = re.compile(r"^global_step_(\d+)$")


def saved_steps(ckpt_dir: str | Path) -> list[int]:
    """Steps with a `global_step_N` directory, ascending."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in ckpt_dir.iterdir() if p.is_dir() and (m := STEP_RE.match(p.name)))


def latest_step(ckpt_dir: str | Path) -> int | None:
    """The step verl resumes from (its tracker file, read by verl's own function), or None."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path  # verl: optional, its own reader

    path = find_latest_ckpt_path(str(ckpt_dir))
    return int(STEP_RE.match(Path(path).name).group(1)) if path else None


def prune(ckpt_dir: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints, and interrupted saves; never the one
    verl resumes from. `keep=None` deletes nothing. Returns the directories removed."""
    if keep is None:
        return []
    if keep < 1:
        raise ValueError(f"keep={keep!r}; allowed: an integer >= 1, or None to keep every checkpoint")
    ckpt_dir = Path(ckpt_dir)
    latest = latest_step(ckpt_dir)
    steps = saved_steps(ckpt_dir)
    complete = [s for s in steps if latest is not None and s <= latest]
    kept = set(complete[-keep:]) | ({latest} if latest is not None else set())
    removed = []
    for step in steps:
        if step not in kept:
            path = ckpt_dir / f"global_step_{step}"
            shutil.rmtree(path)
            removed.append(path)
    return removed
