"""Command line of the local backend.

    python -m localrl prepare-data --config CFG --out results/tiny/data
    python -m localrl warmstart --config CFG --model NAME [--data DIR] --out results/tiny/models/NAME
    python -m localrl train --config CFG --model NAME --ablation ABL --seed S --out DIR [--steps N]
    python -m localrl probe --config CFG --model NAME --out results/tiny/probe/NAME
    python -m localrl probe --engine vllm --model CHECKPOINT_DIR --out DIR     # any Qwen2/2.5/3 checkpoint
    python -m localrl scaling --out results/scaling [--factors ...] [--big] [--real]
    python -m localrl gradprobe --config CFG --model NAME [--checkpoint FILE] [--temperature T] --out DIR
    python -m localrl gradprobe --plan experiments/gradprobe.yaml --out results/gradprobe   # the ladders
"""

from __future__ import annotations

import argparse
import sys

from rla import cells
from rla.config import ConfigError


def _prepare_data(args, cfg):
    from localrl.data import write_splits
    from localrl.task import TaskSettings

    try:
        settings = TaskSettings.from_config(cfg.get("task") or {})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"bad task config: {e}") from None
    write_splits(settings, args.out)


def _warmstart(args, cfg):
    from localrl.warmstart import warmstart
    from rla import layout
    from rla.config import model_spec, warmstart_settings

    model_spec(cfg, args.model, "local")  # fail on an unknown model or setting before any work
    warmstart_settings(cfg)
    warmstart(cfg, args.model, args.data or layout.data_dir(cfg), args.out)


def _train(args, cfg):
    from localrl.run import train_cell

    train_cell(cells.Cell.of(cfg, args.model, args.ablation, args.seed, args.out, args.data, args.steps), args.model_dir)


def _probe(args, cfg):
    from localrl.probe import main as probe

    probe(args, cfg)


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
    from localrl.probe import add_parser as add_probe_parser

    pr = add_probe_parser(sub)
    from localrl.scaling import add_parser as add_scaling_parser

    sc = add_scaling_parser(sub)
    from localrl.gradprobe import add_parser as add_gradprobe_parser

    gp = add_gradprobe_parser(sub)
    for sp in (d, w, t, pr, sc, gp):
        sp.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    from rla.config import ConfigError, load

    args = parser().parse_args(argv)
    import torch

    # One thread per process: small ops with a second thread waiting on a busy core run many
    # times slower; run cells side by side instead (snakemake --cores N).
    torch.set_num_threads(args.threads)
    try:
        if args.command == "scaling":  # random-weight models: no experiment config
            from localrl.scaling import main as scaling

            return scaling(args)
        if args.command == "gradprobe":  # reads its configs itself (a plan names several)
            from localrl.gradprobe import main as gradprobe

            return gradprobe(args)
        cfg = load(args.config) if args.config is not None else None  # probe: --model may be a checkpoint
        {"prepare-data": _prepare_data, "warmstart": _warmstart, "train": _train, "probe": _probe}[args.command](args, cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
