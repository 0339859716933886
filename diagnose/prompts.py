"""The prompts the engine samples from: the user's file (JSONL or parquet), or seeded random token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import torch
from transformers import AutoTokenizer

from diagnose.errors import DiagnoseError

FORMATS = (".jsonl", ".parquet")
# one of these fields per row, in this order of preference: token ids, chat messages, or text
TOKEN_FIELDS = ("prompt_token_ids", "input_ids")
CHAT_FIELDS = ("messages", "prompt")
RANDOM_LENGTHS = (8, 25)  # random prompts' token counts, low inclusive, high exclusive (the studies' own)


def read_rows(path: str | Path) -> list[dict]:
    """The file's rows as dicts; a DiagnoseError for an unknown format or an unreadable file."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise DiagnoseError(f"prompts {path}: unknown format {path.suffix or '(no suffix)'!r}; allowed: "
                            f"{', '.join(FORMATS)} (rows with one of {', '.join(TOKEN_FIELDS + CHAT_FIELDS)})")
    if not path.is_file():
        raise DiagnoseError(f"prompts {path}: no such file")
    try:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        else:
            rows = pd.read_parquet(path).to_dict("records")
    except Exception as err:  # a malformed file: which one and why
        raise DiagnoseError(f"prompts {path}: does not read as {path.suffix[1:]}: {type(err).__name__}") from None
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise DiagnoseError(f"prompts {path}: no rows of objects")
    return rows


def as_list(value):
    """parquet gives numpy arrays where JSON gives lists."""
    return value.tolist() if hasattr(value, "tolist") else value


def tokenize(row: dict, tokenizer, where: str) -> list[int]:
    for field in TOKEN_FIELDS:
        if field in row:
            ids = as_list(row[field])
            if not ids or not all(isinstance(t, int) for t in ids):
                raise DiagnoseError(f"{where}: {field} must be a non-empty list of token ids")
            return ids
    for field in CHAT_FIELDS:
        if field not in row:
            continue
        value = as_list(row[field])
        if tokenizer is None:
            raise DiagnoseError(f"{where}: {field} needs the checkpoint's tokenizer, which does not load")
        if isinstance(value, str):
            return tokenizer(value)["input_ids"]
        if isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
            if not getattr(tokenizer, "chat_template", None):
                raise DiagnoseError(f"{where}: chat messages, but the checkpoint's tokenizer has no chat template; "
                                    "give the prompt as text or token ids")
            return list(tokenizer.apply_chat_template(value, add_generation_prompt=True, tokenize=True,
                                                      return_dict=False))
        raise DiagnoseError(f"{where}: {field} must be text or a list of chat messages ({{role, content}})")
    raise DiagnoseError(f"{where}: none of the fields {', '.join(TOKEN_FIELDS + CHAT_FIELDS)}")


def from_file(path: str | Path, checkpoint: str | Path, n: int) -> list[list[int]]:
    """The first `n` prompts of the file, as token ids."""
    rows = read_rows(path)
    tokenizer = None
    if any(field in rows[0] for field in CHAT_FIELDS) and not any(field in rows[0] for field in TOKEN_FIELDS):
        try:
            tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        except Exception:  # no tokenizer files: only token-id prompts can be used
            tokenizer = None
    return [tokenize(row, tokenizer, f"prompts {path}, row {i + 1}") for i, row in enumerate(rows[:n])]


def random_prompts(vocab_size: int, special: set[int], n: int, seed: int) -> list[list[int]]:
    """`n` seeded prompts of random token ids, none of them a special token (eos, bos, pad)."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(vocab_size) if t not in special])
    return [allowed[torch.randint(0, len(allowed), (int(torch.randint(*RANDOM_LENGTHS, (1,), generator=g)),),
                                  generator=g)].tolist() for _ in range(n)]
