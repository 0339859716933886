"""Stage each model once, at a pinned revision, into a local directory the cells read offline
(docs/running.md, "Model staging"), or build a `build:` model there (no download). verl copies only
`hdfs://` paths to local disk; a Hub id would make every rank of every cell download the model, and
offline compute nodes fail."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from rla import layout
from rla.config import model_spec

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MARKER = ".staged.json"
# Weights, configs and tokenizer files; not the original PyTorch .bin copies some repos also carry.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py"]


class StagingError(RuntimeError):
    """A model could not be staged, or a staged copy is incomplete."""


def models_dir(cfg: dict) -> Path:
    """Where staged models live: `verl.models_dir`, else <results_dir>/hf_models. On a cluster,
    put it on a file system every compute node mounts."""
    verl = cfg.get("verl") or {}
    return Path(verl.get("models_dir") or layout.results_dir(cfg) / "hf_models")


def build_spec(cfg: dict, model: str) -> dict | None:
    """The `build:` spec of a model built here (None: a Hub or local model)."""
    return model_spec(cfg, model, "verl").get("build") or None


def hub_source(cfg: dict, model: str) -> tuple[str, str] | None:
    """(repo id, pinned commit) of a model that must be downloaded; None when `path` is a local
    directory, which the cells use as it is, or the model is built here."""
    spec = model_spec(cfg, model, "verl")
    if spec.get("build"):
        return None
    path = str(spec["path"])
    if os.path.isdir(path) or not HUB_ID_RE.match(path):
        return None
    revision = str(spec.get("revision") or "")
    if not COMMIT_RE.match(revision):
        raise ValueError(
            f"model_specs.{model}: Hub model {path!r} needs `revision:` pinned to a 40-character commit "
            f"hash (got {revision or 'none'!r}); branch names like 'main' move"
        )
    return path, revision


def needs_staging(cfg: dict, model: str) -> bool:
    """Whether the stage_model rule makes the model's directory (a Hub model or one built here)."""
    return hub_source(cfg, model) is not None or build_spec(cfg, model) is not None


def local_path(cfg: dict, model: str) -> Path:
    """The directory verl loads the model from: the staged copy, or the spec's local `path`."""
    if not needs_staging(cfg, model):
        return Path(model_spec(cfg, model, "verl")["path"])
    return models_dir(cfg) / model


def check_complete(directory: str | Path) -> list[str]:
    """What is missing or broken in a model directory ([] = complete): config, tokenizer, and every
    weight shard named by the index, each one whole."""
    import safetensors  # here: the DAG imports this module (workflows/rules/common.smk), and needs none of it

    directory = Path(directory)
    if not directory.is_dir():
        return [f"{directory}: no such directory"]
    problems = []
    if not (directory / "config.json").is_file():
        problems.append("config.json missing")
    if not (directory / "tokenizer.json").is_file() and not (directory / "vocab.json").is_file():
        problems.append("tokenizer missing (tokenizer.json or vocab.json)")
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    for shard in shards:
        path = directory / shard
        if not path.is_file():
            problems.append(f"{shard} missing")
            continue
        try:  # safetensors' own reading: header, JSON, every tensor's bytes present
            with safetensors.safe_open(path, "np"):
                pass
        except Exception as err:
            problems.append(f"{path.name}: truncated or unreadable ({path.stat().st_size} bytes): {err}")
    return problems


def is_staged(cfg: dict, model: str) -> bool:
    """The staged copy exists, is complete and is of the pinned revision."""
    source, built = hub_source(cfg, model), build_spec(cfg, model)
    directory = local_path(cfg, model)
    if source is None and built is None:
        return not check_complete(directory)
    marker = directory / MARKER
    if not marker.is_file() or check_complete(directory):
        return False
    recorded = json.loads(marker.read_text())
    return recorded.get("build") == built if built is not None else recorded.get("revision") == source[1]


def build(spec: dict, out_dir: str | Path) -> None:
    """A tiny random Qwen model from a `build:` spec, with the task's tokenizer and chat template."""
    # here: the DAG imports this module (workflows/rules/common.smk); torch and transformers load where a model is built
    from tinyqwen.models import build_model
    from tinyqwen.task import CHAT_TEMPLATE
    from tinyqwen.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    model = build_model({k: v for k, v in spec.items() if k != "seed"}, tokenizer, int(spec.get("seed", 0)))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def stage(cfg: dict, model: str, download=None) -> Path:
    """Download the model at its pinned revision into models_dir/<model>, or build it there from its
    `build:` spec. `download` defaults to huggingface_hub.snapshot_download; tests pass a stand-in.
    The copy is made in a temporary directory beside it, checked, marked and renamed into place
    (atomically: a crash leaves the previous copy or none)."""
    source, built = hub_source(cfg, model), build_spec(cfg, model)
    dest = local_path(cfg, model)
    if source is None and built is None:
        problems = check_complete(dest)
        if problems:
            raise StagingError(f"{model}: local model directory {dest} is incomplete: {'; '.join(problems)}")
        return dest
    if is_staged(cfg, model):
        return dest
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if built is not None:
        what, marker = f"{model}: the model built", {"build": built}
        build(built, tmp)
    else:
        repo, revision = source
        what, marker = f"{model}: the download of {repo}@{revision}", {"repo": repo, "revision": revision}
        if download is None:
            from huggingface_hub import snapshot_download as download  # here: the DAG imports this module
        try:
            download(repo_id=repo, revision=revision, local_dir=str(tmp), allow_patterns=ALLOW_PATTERNS)
        except Exception as err:  # network, auth, unknown revision: one clear line, not a traceback in 8 ranks
            shutil.rmtree(tmp, ignore_errors=True)
            raise StagingError(f"{model}: downloading {repo}@{revision} failed: {type(err).__name__}: {err}") from err
    problems = check_complete(tmp)
    if problems:
        raise StagingError(f"{what} into {tmp} is incomplete: {'; '.join(problems)}")
    shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
    (tmp / MARKER).write_text(json.dumps(marker) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest
