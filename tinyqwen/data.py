"""Task splits as verl-schema parquet, the columns verl's GSM8K preparation writes; both backends read
these files.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rla.files import atomic_path
from tinyqwen.task import ABILITY, DATA_SOURCE, TaskSettings, chat_messages, make_split

COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def split_frame(settings: TaskSettings, split: str) -> pd.DataFrame:
    rows = []
    for idx, p in enumerate(make_split(settings, split)):
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": chat_messages(p.question),
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": p.answer},
            "extra_info": {"split": split, "index": idx, "question": p.question, "answer": p.solution},
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def write_splits(settings: TaskSettings, out_dir: str | Path) -> dict[str, Path]:
    """Write train.parquet and test.parquet (atomically: a crash leaves no half-written file)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in ("train", "test"):
        path = out_dir / f"{split}.parquet"
        with atomic_path(path) as tmp:
            split_frame(settings, split).to_parquet(tmp, index=False)
        paths[split] = path
        print(f"wrote {path}")
    return paths


def load_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    path = Path(data_dir) / f"{split}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `python -m localrl prepare-data --out {data_dir}` first")
    return pd.read_parquet(path)
