"""Command line: ``python -m analysis {collect,stability,plots,all} --runs DIR ...`` read a grid's run
logs (the studies' own reports are ``python -m studies report NAME``)."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

from analysis import collapse
from analysis.config import AnalysisConfig, load_config
from analysis.figures import make_figures
from analysis.load import Run, load_runs, tidy_table
from analysis.output import to_markdown
from analysis.tables import summarize
from rla.files import atomic_path, write_csv, write_text

log = logging.getLogger("analysis")


def _default_tables(runs_dir: str) -> Path:
    """``results/runs`` -> ``results/tables`` (the suite's layout)."""
    return Path(runs_dir).resolve().parent / "tables"


def collect(runs: list[Run], out: Path) -> None:
    table = tidy_table(runs)
    with atomic_path(out) as tmp:  # written atomically, as every file (rla.files)
        table.to_parquet(tmp, index=False, engine="pyarrow")
    log.info("wrote %s (%d rows, %d runs, %d non-finite values)", out, len(table), len(runs),
             int((~table["finite"]).sum()))


def stability(runs: list[Run], cfg: AnalysisConfig, out: Path):
    table = collapse.stability_table(runs, cfg.collapse)
    write_csv(table, out)
    log.info("wrote %s: %d of %d runs collapsed", out, int(table["collapsed"].sum()), len(table))
    return table


def plots(runs: list[Run], cfg: AnalysisConfig, figures_dir: Path, tables_dir: Path, stability_table=None) -> None:
    if stability_table is None:
        stability_table = collapse.stability_table(runs, cfg.collapse)
    make_figures(runs, stability_table, cfg, figures_dir)
    summary = summarize(stability_table, cfg.models, cfg.ablations)
    write_csv(summary, tables_dir / "summary.csv")
    write_text(tables_dir / "summary.md", to_markdown(summary))
    log.info("wrote %s/summary.{csv,md}", tables_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--runs", required=True, help="runs directory laid out {model}/{ablation}/seed{N}/")
        p.add_argument("--config", help="experiment config (its collapse: section and model/ablation order)")
        p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")

    p = sub.add_parser("collect", help="all metrics as one tidy parquet table")
    common(p)
    p.add_argument("--out", required=True,
                   help="parquet file (run, model, ablation, seed, step, metric, value, finite)")

    p = sub.add_parser("stability", help="collapse verdict per run (CSV)")
    common(p)
    p.add_argument("--out", required=True, help="CSV file")

    p = sub.add_parser("plots", help="figures (PNG + PDF) and the model x ablation summary table")
    common(p)
    p.add_argument("--out", required=True, help="figures directory, e.g. figures/tiny")
    p.add_argument("--tables", help="where summary.{csv,md} go (default: <runs>/../tables)")

    p = sub.add_parser("all", help="collect + stability + plots with one read of the logs")
    common(p)
    p.add_argument("--tables", help="tables directory (default: <runs>/../tables)")
    p.add_argument("--figures", required=True, help="figures directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if getattr(args, "quiet", False) else logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    # Data warnings name the file and line themselves: print them without the source-code echo.
    original_format = warnings.formatwarning
    warnings.formatwarning = lambda message, *_args, **_kw: f"warning: {message}\n"
    try:
        return _run(args)
    finally:
        warnings.formatwarning = original_format


def _run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
        runs = load_runs(args.runs)
        if args.command == "collect":
            collect(runs, Path(args.out))
        elif args.command == "stability":
            stability(runs, cfg, Path(args.out))
        elif args.command == "plots":
            tables = Path(args.tables) if args.tables else _default_tables(args.runs)
            plots(runs, cfg, Path(args.out), tables)
        elif args.command == "all":
            tables = Path(args.tables) if args.tables else _default_tables(args.runs)
            collect(runs, tables / "metrics.parquet")
            table = stability(runs, cfg, tables / "stability.csv")
            plots(runs, cfg, Path(args.figures), tables, table)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
