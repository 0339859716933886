"""What the second GPU check's steps (check_preflight.py ... check_cost.py, run as modules) share: one command line
(--device, --quick, --out), a JSON report rewritten after every part (a step stopped at its time limit
leaves what it measured), and bitwise comparisons that refuse all-zero inputs (two zero tensors are equal
whatever the kernels do).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from studies._shared.shapes import PAPER_SHAPES, QUICK_SHAPES

MODELS = ("r1-distill-qwen-1.5b", "qwen3-8b")  # the paper's two shapes


def step_args(doc: str, argv, *hidden: str) -> tuple[argparse.Namespace, torch.device]:
    """The step's command line (`hidden`: flags of its own child processes) and its checked device."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny shapes and lengths: a dry run")
    p.add_argument("--out", type=Path, required=True, help="JSON path (rewritten after each part)")
    for flag in hidden:
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device visible to torch; allowed here: --device cpu")
    return args, torch.device(args.device)


def shapes(quick: bool) -> dict:
    return dict(QUICK_SHAPES) if quick else {n: PAPER_SHAPES[n] for n in MODELS}


def empty_cache(device: torch.device) -> None:
    """Give the freed blocks of a model back before the next one is built (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Report:
    """One step's JSON: a head (device, versions, conditions) and named parts, each written to disk as
    soon as it is measured; `lists` name the parts that grow a row at a time."""

    def __init__(self, args: argparse.Namespace, step: str, device: torch.device, lists=(), **head):
        self.path, self.start = args.out, time.perf_counter()
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.data = {"step": step, "device": name, "torch": torch.__version__, "quick": args.quick, **head,
                     "parts": {part: [] for part in lists}}
        self.parts = self.data["parts"]
        self.write()

    def add(self, part: str, value) -> None:
        self.parts[part] = value
        self.write()

    def extend(self, part: str, rows: list[dict]) -> None:
        self.parts[part] += rows
        self.write()

    def write(self) -> None:
        self.data["seconds"] = round(time.perf_counter() - self.start, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")


def bit_compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Elements of `a` and `b` compared bit for bit (their raw bytes, so -0.0 != 0.0 and NaNs by payload).
    Refuses a pair where either side is all zeros: such a comparison says nothing about the kernels."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"bit_compare: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}")
    if not (a.count_nonzero() and b.count_nonzero()):
        raise ValueError("bit_compare: an all-zero operand proves nothing")
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    differing = int((a.contiguous().view(ints) != b.contiguous().view(ints)).sum())
    return {"bit_equal": differing == 0, "differing": differing, "of": a.numel()}
