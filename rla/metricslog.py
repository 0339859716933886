"""verl's file-logger format, read one way by every package: one JSON line per step,
`{"step": N, "data": {metric: value}}`. A running cell writes `metrics.running.jsonl`; `metrics.jsonl`
appears, written at once, when it has finished its steps (so a workflow never takes a stopped cell's
lines for a finished one); a resumed verl cell keeps earlier runs' lines as `metrics.part-NNN.jsonl`
(docs/running.md). A bad line is skipped with a `LogWarning` naming file and line (docs/reference.md).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

METRICS = "metrics.jsonl"
RUNNING = "metrics.running.jsonl"
PART_GLOB = "metrics.part-*.jsonl"


class LogWarning(UserWarning):
    """A problem found in a run's log files (the message names the file, and the line if any)."""


def read(path: str | Path, stacklevel: int = 2) -> Iterator[tuple[int, int, dict]]:
    """(line number, step, data) of every good line of one file, in file order."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        warnings.warn(f"{path}: unreadable, skipped ({err})", LogWarning, stacklevel=stacklevel + 1)
        return
    try:
        lines = raw.decode("utf-8").splitlines()  # str parses faster than bytes
    except UnicodeDecodeError:
        lines = raw.splitlines()  # json.loads then reports the bad line itself
    while lines and not lines[-1].strip():
        lines.pop()
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except ValueError as err:  # JSONDecodeError and bad UTF-8 alike
            if not line.strip():
                continue
            why = "truncated last line dropped (a crash mid-write?)" if number == len(lines) else \
                f"malformed line skipped ({err})"
            warnings.warn(f"{path}:{number}: {why}", LogWarning, stacklevel=stacklevel + 1)
            continue
        step = entry.get("step") if isinstance(entry, dict) else None
        data = entry.get("data") if isinstance(entry, dict) else None
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool) or not isinstance(data, dict):
            warnings.warn(f'{path}:{number}: line is not {{"step": <int>, "data": {{...}}}}; skipped',
                          LogWarning, stacklevel=stacklevel + 1)
            continue
        yield number, step, data


def cell_files(cell_dir: str | Path) -> list[Path]:
    """A cell's metrics files in reading order: parts by name, then `metrics.jsonl` - or, for a cell
    that has not finished, `metrics.running.jsonl`."""
    cell_dir = Path(cell_dir)
    files = sorted(cell_dir.glob(PART_GLOB))
    for name in (METRICS, RUNNING):
        if (cell_dir / name).exists():
            return files + [cell_dir / name]
    return files
