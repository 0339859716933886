"""Tables for people: markdown."""

from __future__ import annotations

import pandas as pd


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
