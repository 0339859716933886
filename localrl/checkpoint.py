"""Checkpoints of a cell (weights, optimizer, RNG and data-order state; docs/running.md: "One cell,
reruns and progress") and stop-on-signal. `checkpoints/step_NNNNNN.pt` is written atomically; older ones
are pruned after a successful save.
"""

from __future__ import annotations

import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from rla.files import atomic_path


def rng_state(generators: dict[str, torch.Generator]) -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "generators": {k: g.get_state() for k, g in generators.items()}}


def set_rng_state(state: dict, generators: dict[str, torch.Generator]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    for k, g in generators.items():
        g.set_state(state["generators"][k])


def save(ckpt_dir: str | Path, step: int, state: dict, keep: int = 1) -> Path:
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step_{step:06d}.pt"
    with atomic_path(path) as tmp:
        torch.save({"step": step, **state}, tmp)
    for old in _oldest_first(ckpt_dir)[:-keep]:
        old.unlink()
    return path


def _oldest_first(ckpt_dir: str | Path) -> list[Path]:
    return sorted(Path(ckpt_dir).glob("step_[0-9]*.pt"))  # the step is zero-padded: names sort as steps


def load_latest(ckpt_dir: str | Path) -> dict | None:
    found = _oldest_first(ckpt_dir)
    return torch.load(found[-1], weights_only=False) if found else None


class StopFlag:
    """SIGTERM/SIGINT set a flag (the loop finishes its step, checkpoints and exits non-zero), acknowledged
    at once on stderr with `describe()`: a step can take long, the first one compiles."""

    def __init__(self, describe=lambda: "finishing the current step"):
        self.signum: int | None = None
        self.describe = describe
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = signum
        print(f"received {signal.Signals(signum).name}: {self.describe()}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    @property
    def requested(self) -> bool:
        return self.signum is not None
