"""`python -m verlrun {prepare-data,stage-model,train,overrides,preflight,plan,check-env}`; all read the
experiment config."""

from __future__ import annotations

import argparse
import sys

from rla import cells
from rla.config import load as load_config
from rla.config import verl_settings
from verlrun import envcheck, launch, models, plan, preflight
from verlrun.data import prepare
from verlrun.overrides import build_overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verlrun", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    prep = sub.add_parser("prepare-data", help="write train.parquet / test.parquet in verl's schema")
    prep.add_argument("--config", required=True)
    prep.add_argument("--out", required=True)

    train = sub.add_parser("train", help="run (or resume) one cell with verl")
    cells.add_arguments(train)
    train.add_argument("--dry-run", action="store_true", help="write config.yaml and train.log, check the overrides, do not launch")

    show = sub.add_parser("overrides", help="print the cell's Hydra overrides, one per line")
    cells.add_arguments(show)

    stage = sub.add_parser("stage-model", help="download a model at its pinned revision into verl.models_dir")
    stage.add_argument("--config", required=True)
    stage.add_argument("--model", required=True, help="a key of model_specs")

    pre = sub.add_parser("preflight", help="check driver, GPUs, imports, staged models and disk; exit 1 on a failure")
    pre.add_argument("--config", required=True)
    pre.add_argument("--partitions", help="the cluster's partition limits (default: profiles/slurm/partitions.yaml)")

    tables = sub.add_parser("plan", help="memory plan (token budgets) and disk of the grid, as Markdown tables")
    tables.add_argument("--config", required=True)

    env = sub.add_parser("check-env", help="resolve a conda env's pip section for Linux x86-64 with wheels only")
    env.add_argument("env_file", help="e.g. envs/verl-gpu.yaml")
    env.add_argument("--python-version", default="3.12")
    env.add_argument("--glibc", default="2.31", help="the nodes' glibc (manylinux tags up to it)")
    env.add_argument("--index-url", default="https://pypi.org/simple", help="the main index pip uses")

    args = parser.parse_args(argv)
    if args.command == "check-env":
        return envcheck.main(args.env_file, args.python_version, args.glibc, args.index_url)
    try:
        cfg = load_config(args.config)
        if args.command in ("preflight", "plan") and verl_settings(cfg)["platform"] == "cpu":
            raise ValueError(f"{args.config}: verl.platform = 'cpu'; `{args.command}` checks GPU nodes and plans GPU "
                             f"memory (platform cuda); a CPU profile needs neither")
        if args.command == "preflight":
            return preflight.main(cfg, *([args.partitions] if args.partitions else []))
        if args.command == "stage-model":
            print(models.stage(cfg, args.model))
        elif args.command == "plan":
            print(plan.tables(cfg))
        elif args.command == "prepare-data":
            if "data" not in cfg:
                raise ValueError(f"{args.config} has no 'data' section (train/test sources for the verl backend)")
            prepare(cfg["data"], args.out)
        else:
            cell = cells.Cell.of(cfg, args.model, args.ablation, args.seed, args.out, args.data, args.steps)
            if args.command == "train":
                return launch.train(cell, dry_run=args.dry_run)
            print("\n".join(build_overrides(cell)))
        return 0
    except models.StagingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
