"""What the reports write: markdown tables, CSV files with their markdown views, and their command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from rla.files import write_csv, write_text


def to_markdown(frame: pd.DataFrame, float_format: str = "{:.4g}") -> str:
    """A GitHub-style markdown table (no extra dependency); missing values print as an empty cell."""

    def cell(value) -> str:
        if value is None or value is pd.NA or (isinstance(value, float) and value != value):
            return ""
        if isinstance(value, float):
            return float_format.format(value)
        return str(value).replace("|", "\\|")

    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def read_checked(path: Path, required: list[str], **options) -> pd.DataFrame:
    """A CSV file (`options` for pd.read_csv), with an error naming the `required` columns it lacks."""
    frame = pd.read_csv(path, **options)
    if missing := [c for c in required if c not in frame.columns]:
        raise ValueError(f"{path} lacks column(s) {missing}; expected at least {required}")
    return frame


def write_tables(out_dir: str | Path, tables: dict[str, pd.DataFrame | str]) -> None:
    """Each table into `out_dir` under its file name: a frame as CSV, a text (a markdown view) as it is."""
    for name, table in tables.items():
        if isinstance(table, str):
            write_text(Path(out_dir) / name, table)
        else:
            write_csv(table, Path(out_dir) / name)
    print(f"wrote {', '.join(tables)} in {out_dir}", file=sys.stderr)


def report_parser(name: str, doc: str, **required: str) -> argparse.ArgumentParser:
    """`python -m studies report NAME`'s options: the first paragraph of `doc` describes it, and each keyword
    is a required path option (`--KEY`, its help the value)."""
    p = argparse.ArgumentParser(prog=f"python -m studies report {name}", description=doc.split("\n\n")[0])
    for key, text in required.items():
        p.add_argument(f"--{key}", type=Path, required=True, help=text)
    return p
