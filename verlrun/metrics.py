"""Keep every step's metrics across resumed verl runs.

verl's file logger opens `$VERL_FILE_LOGGER_PATH` with "wb", so a resumed run would truncate the
steps logged before the restart. Before each launch the existing `metrics.jsonl` moves to the next
`metrics.part-NNN.jsonl`; after the run all parts and the new file merge back into `metrics.jsonl`
in step order, and the merged parts move to `metrics.parts/` (kept, out of the readers' way).

Merging: files are read oldest first and a later file wins for every step it logged. A resumed run
restarts from its last checkpoint, so records of an earlier file from the resumed run's first step
on belong to an abandoned trajectory and are dropped as well, not just the duplicated steps.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

METRICS = "metrics.jsonl"
ARCHIVE = "metrics.parts"
PART_RE = re.compile(r"^metrics\.part-(\d{3,})\.jsonl$")


def _part_number(path: Path) -> int:
    return int(PART_RE.match(path.name).group(1))


def part_files(cell_dir: str | Path) -> list[Path]:
    """Parts waiting to be merged, oldest first."""
    parts = [p for p in Path(cell_dir).glob("metrics.part-*.jsonl") if PART_RE.match(p.name)]
    return sorted(parts, key=_part_number)


def next_part_path(cell_dir: str | Path) -> Path:
    """The next free part name; numbers continue past the archived ones."""
    cell_dir = Path(cell_dir)
    taken = part_files(cell_dir) + [p for p in (cell_dir / ARCHIVE).glob("metrics.part-*.jsonl") if PART_RE.match(p.name)]
    number = max((_part_number(p) for p in taken), default=-1) + 1
    return cell_dir / f"metrics.part-{number:03d}.jsonl"


def rotate(cell_dir: str | Path) -> Path | None:
    """Move a non-empty `metrics.jsonl` to the next part so the next launch cannot truncate it.
    Returns the part written, or None when there was nothing to keep."""
    current = Path(cell_dir) / METRICS
    if not current.exists():
        return None
    if current.stat().st_size == 0:
        current.unlink()
        return None
    target = next_part_path(cell_dir)
    os.replace(current, target)
    return target


def read_records(path: str | Path) -> list[dict]:
    """Records of one file-logger file; a torn last line (a killed run) is skipped."""
    with open(path) as f:
        lines = f.read().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            raise ValueError(f"{path}:{number}: not a JSON line: {line[:80]!r}") from None
        if not isinstance(record, dict) or "step" not in record or "data" not in record:
            raise ValueError(f"{path}:{number}: expected {{'step': N, 'data': {{...}}}}, got {line[:80]!r}")
        records.append(record)
    return records


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


def merge(cell_dir: str | Path) -> Path | None:
    """Merge all parts and `metrics.jsonl` into `metrics.jsonl` (written atomically), then archive
    the parts. Returns the merged file, or None when the cell has no metrics at all."""
    cell_dir = Path(cell_dir)
    parts = part_files(cell_dir)
    current = cell_dir / METRICS
    sources = parts + ([current] if current.exists() else [])
    if not sources:
        return None
    merged = merge_records([read_records(s) for s in sources])
    tmp = cell_dir / f".{METRICS}.tmp"
    with open(tmp, "w") as f:
        for record in merged:
            f.write(json.dumps(record) + "\n")
    os.replace(tmp, current)
    if parts:
        (cell_dir / ARCHIVE).mkdir(exist_ok=True)
        for part in parts:
            os.replace(part, cell_dir / ARCHIVE / part.name)
    return current
