"""The gradient probe's command: `python -m studies run gradprobe` (one point, or a pre-registered plan's
points; `python -m studies report gradprobe` judges them: studies/gradprobe/judge.py)."""

from __future__ import annotations

import argparse
import sys

import torch

from rla.config import ConfigError
from studies.gradprobe.measure import DEFAULT_BATCHES, SETTINGS, PointSpec, run_point, write
from studies.gradprobe.plan import run_plan


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies run gradprobe", description="policy-gradient error of each setting against an exact training side")
    p.add_argument("--config", help="experiment config; --model is one of its model_specs")
    p.add_argument("--model", help="a model of the config (its warm start, or --checkpoint)")
    p.add_argument("--checkpoint", help="an RL checkpoint of that model (a cell's checkpoints/step_N.pt)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--batches", type=int, default=DEFAULT_BATCHES)
    p.add_argument("--max-new-tokens", type=int, help="default: the config's rl.max_response_length")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, from {', '.join(SETTINGS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", help="a pre-registered plan (experiments/gradprobe.yaml): run its points instead")
    p.add_argument("--points", help="with --plan: only these points (comma-separated names)")
    p.add_argument("--out", required=True, help="output dir (with --plan: one folder per point under it)")
    return p


def _settings(text: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in items if t not in SETTINGS]
    if bad or not items:
        raise ConfigError(f"--settings {text!r}: unknown {bad or 'empty'}; allowed: {', '.join(SETTINGS)}")
    return items


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    torch.set_num_threads(1)  # one process per core
    if args.plan:
        return run_plan(args.plan, args.out, args.points, log)
    if not (args.config and args.model):
        raise ConfigError("gradprobe needs --config and --model (or --plan)")
    if args.batches < 2:
        raise ConfigError(f"--batches must be >= 2 (the sampling noise is a spread over batches), got {args.batches}")
    if args.temperature <= 0:
        raise ConfigError(f"--temperature must be > 0, got {args.temperature}")
    spec = PointSpec(args.config, args.model, args.checkpoint, args.temperature, args.batches, args.max_new_tokens,
                     args.seed, _settings(args.settings))
    result = run_point(spec, log)
    for path in write(result, args.out):
        log(f"wrote {path}")
    return 0
