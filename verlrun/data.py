"""GSM8K- and MATH-style problems to verl's parquet schema (or the local task's, generated: `generate`).

Output rows (what verl's RLHFDataset and default reward function read):
`data_source`, `prompt` (chat messages), `ability`, `reward_model: {style: rule, ground_truth}`,
`extra_info`. The ground truth is the bare final answer: GSM8K's `#### <answer>` line (verl's
gsm8k scorer compares it with the response's `#### <answer>`), or MATH's last `\\boxed{}` (verl's
MATH scorer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rla.config import data_settings
from rla.files import atomic_path
from tinyqwen.data import write_splits
from tinyqwen.task import TaskSettings


@dataclass(frozen=True)
class Format:
    question_key: str
    answer_key: str
    data_source: str  # selects verl's scorer in `default_compute_score`
    instruction: str


FORMATS = {
    "gsm8k": Format(
        question_key="question",
        answer_key="answer",
        data_source="openai/gsm8k",
        instruction='Let\'s think step by step and output the final answer after "####".',
    ),
    "math": Format(
        question_key="problem",
        answer_key="solution",
        data_source="DigitalLearningGmbH/MATH-lighteval",
        instruction="Let's think step by step and output the final answer within \\boxed{}.",
    ),
}
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


def read_source(source: str, split: str, name: str | None = None) -> pd.DataFrame:
    """Rows of one split. `source` is a local file, a local directory holding `<split>.jsonl`
    (or .json/.parquet), or a Hugging Face datasets name (downloaded by `datasets`)."""
    path = Path(source)
    if path.is_dir():
        candidates = [path / f"{split}{suffix}" for suffix in LOCAL_SUFFIXES]
        found = [c for c in candidates if c.exists()]
        if not found:
            raise FileNotFoundError(f"{source}: no {' / '.join(c.name for c in candidates)} for split {split!r}")
        path = found[0]
    if path.is_file():
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix in (".jsonl", ".json"):
            return pd.read_json(path, lines=path.suffix == ".jsonl")
        raise ValueError(f"{source}: unsupported file type {path.suffix!r}; use one of {', '.join(LOCAL_SUFFIXES)}")
    if path.is_absolute() or source.startswith((".", "~")) or source.endswith(LOCAL_SUFFIXES):
        raise FileNotFoundError(f"{source}: no such file or directory")
    from datasets import load_dataset  # here: Hugging Face datasets, loaded only for a Hub source

    return load_dataset(source, name, split=split).to_pandas()


def final_answer(text: str, fmt: str) -> str | None:
    """The ground truth from a reference solution, with verl's own extractors."""
    if fmt == "gsm8k":
        from verl.utils.reward_score.gsm8k import extract_solution  # verl: optional, for its own extractors

        return extract_solution(text, method="strict")
    from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed  # verl: optional

    boxed = last_boxed_only_string(text)
    return remove_boxed(boxed) if boxed else None


def to_verl_rows(frame: pd.DataFrame, fmt: str, split: str, instruction: str | None = None) -> pd.DataFrame:
    """Convert a frame of problems; rows without an extractable answer are an error (listed)."""
    spec = FORMATS[fmt]
    missing = [k for k in (spec.question_key, spec.answer_key) if k not in frame.columns]
    if missing:
        raise ValueError(f"{fmt} data needs columns {spec.question_key!r} and {spec.answer_key!r}; missing {missing}; has {list(frame.columns)}")
    instruction = spec.instruction if instruction is None else instruction
    rows, bad = [], []
    for index, row in enumerate(frame.to_dict("records")):
        given = row.get("answer") if fmt == "math" else None  # MATH-500 ships the bare answer next to the solution
        answer = given if isinstance(given, str) and given else final_answer(str(row[spec.answer_key]), fmt)
        if answer is None:
            bad.append(index)
            continue
        question = str(row[spec.question_key]).strip()
        rows.append(
            {
                "data_source": spec.data_source,
                "prompt": [{"role": "user", "content": f"{question} {instruction}".strip()}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, "question": question, "answer": str(row[spec.answer_key])},
            }
        )
    if bad:
        raise ValueError(f"{len(bad)} {split} rows have no final answer in {spec.answer_key!r} (row indices {bad[:10]})")
    return pd.DataFrame(rows)


def prepare(data_cfg: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write `train.parquet` and `test.parquet` for the config's `data` section (checked first:
    `rla.config.DATA`)."""
    data = data_settings({"data": data_cfg})
    if data["generate"] is not None:
        # The generated arithmetic problems (tinyqwen, as the local backend's), in verl's schema: no download.
        return write_splits(TaskSettings.from_config(dict(data["generate"]), "data.generate"), out_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for split in ("train", "test"):
        part = data[split]
        frame = read_source(str(part["source"]), part.get("split", split), part.get("name"))
        if data[f"max_{split}_samples"]:
            frame = frame.head(data[f"max_{split}_samples"])
        rows = to_verl_rows(frame, data["format"], split, data["instruction"])
        written[split] = out_dir / f"{split}.parquet"
        with atomic_path(written[split]) as tmp:  # a crash leaves the previous file or none
            rows.to_parquet(tmp, index=False)
        print(f"{split}: {len(rows)} rows from {part['source']} -> {written[split]}", flush=True)
    return written
