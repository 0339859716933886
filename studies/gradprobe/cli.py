"""The gradient probe's command: `python -m studies run gradprobe --plan PLAN --out DIR` runs a
pre-registered plan's points (`python -m studies report gradprobe` judges them: studies/gradprobe/judge.py)."""

from __future__ import annotations

import argparse
import sys

import torch

from studies.gradprobe.plan import run_plan


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies run gradprobe",
                                description="policy-gradient error of each setting against an exact training side")
    p.add_argument("--plan", required=True, help="a pre-registered plan (experiments/gradprobe.yaml)")
    p.add_argument("--points", help="only these points (comma-separated names)")
    p.add_argument("--out", required=True, help="output dir: one folder per point under it")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    torch.set_num_threads(1)  # one process per core
    return run_plan(args.plan, args.out, args.points, log)
