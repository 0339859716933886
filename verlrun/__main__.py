"""`python -m verlrun {prepare-data,stage-model,train,overrides,preflight,plan,check-env}`; all read the
experiment config."""

from __future__ import annotations

import argparse
import sys

from rla import cells


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

    plan = sub.add_parser("plan", help="memory plan (token budgets) and disk of the grid, as Markdown tables")
    plan.add_argument("--config", required=True)

    env = sub.add_parser("check-env", help="resolve a conda env's pip section for Linux x86-64 with wheels only")
    env.add_argument("env_file", help="e.g. envs/verl-gpu.yaml")
    env.add_argument("--python-version", default="3.12")
    env.add_argument("--glibc", default="2.31", help="the nodes' glibc (manylinux tags up to it)")
    env.add_argument("--index-url", default="https://pypi.org/simple", help="the main index pip uses")

    args = parser.parse_args(argv)
    if args.command == "check-env":
        from verlrun.envcheck import main as check_env

        return check_env(args.env_file, args.python_version, args.glibc, args.index_url)
    from rla.config import load as load_config

    try:
        cfg = load_config(args.config)
        if args.command in ("preflight", "plan"):
            from rla.config import verl_settings

            if verl_settings(cfg)["platform"] == "cpu":
                raise ValueError(f"{args.config}: verl.platform = 'cpu'; `{args.command}` checks GPU nodes and plans GPU "
                                 f"memory (platform cuda); a CPU profile needs neither")
        if args.command == "preflight":
            from verlrun.preflight import main as preflight

            return preflight(cfg, *([args.partitions] if args.partitions else []))
        if args.command == "stage-model":
            from verlrun.models import StagingError, stage

            try:
                print(stage(cfg, args.model))
            except StagingError as err:
                print(f"error: {err}", file=sys.stderr)
                return 1
            return 0
        if args.command == "plan":
            from verlrun.plan import tables

            print(tables(cfg))
            return 0
        if args.command == "prepare-data":
            from verlrun.data import prepare

            if "data" not in cfg:
                raise ValueError(f"{args.config} has no 'data' section (train/test sources for the verl backend)")
            prepare(cfg["data"], args.out)
            return 0
        from rla.cells import Cell

        cell = Cell.of(cfg, args.model, args.ablation, args.seed, args.out, args.data, args.steps)
        if args.command == "overrides":
            from verlrun.overrides import build_overrides

            print("\n".join(build_overrides(cell)))
            return 0
        from verlrun.launch import train as run_cell

        return run_cell(cell, dry_run=args.dry_run)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
