"""Keep every step's metrics across resumed verl runs (docs/running.md, "One cell, reruns and progress"):
verl's file logger opens `$VERL_FILE_LOGGER_PATH` with "wb", so the launcher moves it to a part before
each launch and after a failed one, and merges the parts when verl succeeds.

Merging: a later part wins for every step it logged, and an earlier part's records from the later one's
first step on are dropped too (they belong to the trajectory abandoned at the resumed checkpoint).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rla import files, metricslog
from rla.metricslog import METRICS, RUNNING

ARCHIVE = "metrics.parts"
PART_RE = re.compile(r"^metrics\.part-(\d{3,})\.jsonl$")


def _part_number(path: Path) -> int:
    return int(PART_RE.match(path.name).group(1))


def part_files(directory: str | Path) -> list[Path]:
    """The parts in a cell's folder (waiting to be merged) or in its ARCHIVE (merged), oldest first."""
    return sorted((p for p in Path(directory).glob("metrics.part-*.jsonl") if PART_RE.match(p.name)), key=_part_number)


def next_part_path(cell_dir: str | Path) -> Path:
    """The next free part name; numbers continue past the archived ones."""
    cell_dir = Path(cell_dir)
    taken = part_files(cell_dir) + part_files(cell_dir / ARCHIVE)
    number = max((_part_number(p) for p in taken), default=-1) + 1
    return cell_dir / f"metrics.part-{number:03d}.jsonl"


def rotate(cell_dir: str | Path) -> list[Path]:
    """Move a finished run's `metrics.jsonl`, then the running file, to the next parts (so the next
    launch cannot truncate them). Empty files are removed. Returns the parts written."""
    written = []
    for name in (METRICS, RUNNING):
        current = Path(cell_dir) / name
        if not current.exists():
            continue
        if current.stat().st_size == 0:
            current.unlink()
            continue
        target = next_part_path(cell_dir)
        os.replace(current, target)
        written.append(target)
    return written


def merge_records(sources: list[list[dict]]) -> list[dict]:
    """One record per step, in step order; see the module docstring for which record wins."""
    by_step: dict[int, dict] = {}
    for records in sources:
        if not records:
            continue
        first = min(int(r["step"]) for r in records)
        by_step = {step: r for step, r in by_step.items() if step < first}
        for record in records:
            by_step[int(record["step"])] = record
    return [by_step[step] for step in sorted(by_step)]


def _write_merged(cell_dir: Path, parts: list[Path]) -> Path:
    """`metrics.jsonl` (written atomically) from the parts, merged."""
    merged = merge_records([[{"step": step, "data": data} for _, step, data in metricslog.read(p)] for p in parts])
    return files.write_text(cell_dir / METRICS, "".join(json.dumps(record) + "\n" for record in merged))


def restore(cell_dir: str | Path) -> Path | None:
    """Write back a finished cell's `metrics.jsonl` from its archived parts when the file is gone
    (Snakemake deletes a job's output before it runs it: `--force` on a finished cell), so that the
    folder a rerun moves aside keeps its metrics where readers look. The parts stay archived."""
    cell_dir = Path(cell_dir)
    archived = part_files(cell_dir / ARCHIVE)
    if (cell_dir / METRICS).exists() or not archived:
        return None
    return _write_merged(cell_dir, archived)


def merge(cell_dir: str | Path) -> Path | None:
    """Rotate, then merge all parts into `metrics.jsonl` (written atomically) and archive them.
    Returns the merged file, or None when the cell has no metrics at all."""
    cell_dir = Path(cell_dir)
    rotate(cell_dir)
    parts = part_files(cell_dir)
    if not parts:
        return None
    target = _write_merged(cell_dir, parts)
    (cell_dir / ARCHIVE).mkdir(exist_ok=True)
    for part in parts:
        os.replace(part, cell_dir / ARCHIVE / part.name)
    return target
