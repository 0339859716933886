"""Command line of the local backend: prepare-data, warmstart, train (docs/running.md: "The embedded
default"). The studies that use the rig are `python -m studies`.
"""

from __future__ import annotations

import argparse
import sys

import torch

from localrl.inductor_isa_check import remember_isa_checks
from localrl.run import train_cell
from localrl.warmstart import warmstart
from rla import cells, layout
from rla.config import ConfigError, load
from tinyqwen.data import write_splits
from tinyqwen.task import TaskSettings


COMMANDS = {  # a bad value in the config: a ConfigError naming it
    "prepare-data": lambda args, cfg: write_splits(TaskSettings.from_config(cfg.get("task") or {}), args.out),
    "warmstart": lambda args, cfg: warmstart(cfg, args.model, args.data or layout.data_dir(cfg), args.out),
    "train": lambda args, cfg: train_cell(
        cells.Cell.of(cfg, args.model, args.ablation, args.seed, args.out, args.data, args.steps), args.model_dir),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m localrl", description="Local CPU backend of the RL suite.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("prepare-data", help="write train/test parquet (verl schema)")
    d.add_argument("--config", required=True)
    d.add_argument("--out", required=True)

    w = sub.add_parser("warmstart", help="supervised warm start of one tiny model")
    w.add_argument("--config", required=True)
    w.add_argument("--model", required=True)
    w.add_argument("--data", help="data dir (default: {results_dir}/data)")
    w.add_argument("--out", required=True)

    t = sub.add_parser("train", help="run (or resume) one grid cell")
    cells.add_arguments(t)
    t.add_argument("--model-dir", help="warm-started model (default: {results_dir}/models/{model})")
    for sp in (d, w, t):
        sp.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # One thread per process: small ops with a second thread waiting on a busy core run many
    # times slower; run cells side by side instead (snakemake --cores N).
    torch.set_num_threads(args.threads)
    remember_isa_checks()  # before the first compile
    try:
        cfg = load(args.config)
        COMMANDS[args.command](args, cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
