"""Writing files without losing what was there: write a temporary file beside the target, then rename.

Temporary files come from `mkstemp`, which creates them with mode 0600; the final file gets the mode
a plain `open(..., "w")` would give it (0666 minus the umask), so results stay readable to the group
on a shared cluster.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `target`; it replaces `target` only if the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_bytes(target: str | Path, data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_csv(frame, target: str | Path) -> None:
    """A pandas DataFrame as CSV without its index, atomically (rla needs no pandas: duck-typed)."""
    with atomic_path(target) as tmp:
        frame.to_csv(tmp, index=False)


def write_text(target: str | Path, text: str) -> Path:
    return write_bytes(target, text.encode())
