"""Tables for people (markdown) and data (parquet, written atomically: `rla.files`, as every file)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rla.files import atomic_path


def write_parquet(frame: pd.DataFrame, target: str | Path) -> None:
    with atomic_path(target) as tmp:
        frame.to_parquet(tmp, index=False, engine="pyarrow")


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
