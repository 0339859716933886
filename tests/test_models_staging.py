"""Staging models once, at a pinned revision, from a fake Hub (a local directory; no network):
complete copies are used offline, partial or broken ones fail in the staging step."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from verlrun import models
from rla.config import load as load_config
from tests.test_verlrun import PAPER, REPO

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    """<hub>/<repo id>/<revision>/: a tiny Qwen2 with sharded safetensors and a tokenizer."""
    import transformers

    from tinyqwen.tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("hub")
    snapshot = root / "org/tiny-qwen" / REVISION
    config = transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=96, vocab_size=300)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(snapshot, max_shard_size="60KB")
    build_tokenizer().save_pretrained(snapshot)
    assert (snapshot / "model.safetensors.index.json").exists()
    return root


def fake_snapshot_download(hub: Path, skip: str | None = None, calls: list | None = None):
    """huggingface_hub.snapshot_download's signature, served from `hub`; `skip` drops matching files."""
    def download(repo_id, revision, local_dir, allow_patterns):
        if calls is not None:
            calls.append((repo_id, revision))
        source = hub / repo_id / revision
        if not source.is_dir():
            raise FileNotFoundError(f"Revision Not Found for url {repo_id}@{revision}")
        for path in source.rglob("*"):
            name = path.relative_to(source).as_posix()
            if path.is_file() and any(fnmatch.fnmatch(name, p) for p in allow_patterns) and not (skip and fnmatch.fnmatch(name, skip)):
                (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, Path(local_dir) / name)
        return local_dir
    return download


def config_for(tmp_path: Path, revision: str = REVISION, path: str = "org/tiny-qwen") -> dict:
    return {"results_dir": str(tmp_path / "results"), "verl": {"models_dir": str(tmp_path / "models")},
            "model_specs": {"tiny": {"path": path, "revision": revision}}}


def test_a_staged_model_is_complete_pinned_and_loads_offline(hub, tmp_path, monkeypatch):
    cfg = config_for(tmp_path)
    calls = []
    dest = models.stage(cfg, "tiny", download=fake_snapshot_download(hub, calls=calls))
    assert dest == tmp_path / "models/tiny" and models.is_staged(cfg, "tiny")
    assert models.check_complete(dest) == []
    assert not list(tmp_path.joinpath("models").glob(".*partial"))
    # Staged once: a second call downloads nothing.
    models.stage(cfg, "tiny", download=fake_snapshot_download(hub, calls=calls))
    assert calls == [("org/tiny-qwen", REVISION)]
    # What a cell does: load from the local path with the Hub off.
    code = ("import transformers; m = transformers.AutoModelForCausalLM.from_pretrained(r'%s');"
            "t = transformers.AutoTokenizer.from_pretrained(r'%s'); print(sum(p.numel() for p in m.parameters()))" % (dest, dest))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and int(out.stdout.split()[-1]) > 0, out.stderr[-2000:]


def test_a_missing_shard_fails_in_staging_and_leaves_nothing_behind(hub, tmp_path):
    cfg = config_for(tmp_path)
    with pytest.raises(models.StagingError, match=r"tiny: the download of org/tiny-qwen@0123.*incomplete: model-00002-of-\d+\.safetensors missing"):
        models.stage(cfg, "tiny", download=fake_snapshot_download(hub, skip="model-00002-*"))
    assert not (tmp_path / "models/tiny").exists() and not models.is_staged(cfg, "tiny")


def test_a_truncated_shard_or_missing_tokenizer_is_reported(hub, tmp_path):
    snapshot = hub / "org/tiny-qwen" / REVISION
    copy = tmp_path / "copy"
    shutil.copytree(snapshot, copy)
    shard = sorted(copy.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    (copy / "tokenizer.json").unlink()
    (copy / "vocab.json").unlink(missing_ok=True)
    problems = models.check_complete(copy)
    assert any("truncated" in p and shard.name in p for p in problems)
    assert any("tokenizer missing" in p for p in problems)


def test_download_errors_and_unpinned_revisions_are_clear(hub, tmp_path):
    cfg = config_for(tmp_path, revision="f" * 40)
    with pytest.raises(models.StagingError, match=r"downloading org/tiny-qwen@f{40} failed: FileNotFoundError"):
        models.stage(cfg, "tiny", download=fake_snapshot_download(hub))
    for revision in ("main", None, "abc123"):
        with pytest.raises(ValueError, match=r"model_specs.tiny: .*40-character commit hash \(got '(main|none|abc123)'\)"):
            models.hub_source(config_for(tmp_path, revision=revision), "tiny")


def test_a_new_revision_is_staged_again(hub, tmp_path):
    other = "a" * 40
    shutil.copytree(hub / "org/tiny-qwen" / REVISION, hub / "org/tiny-qwen" / other, dirs_exist_ok=True)
    models.stage(config_for(tmp_path), "tiny", download=fake_snapshot_download(hub))
    moved = config_for(tmp_path, revision=other)
    assert not models.is_staged(moved, "tiny")
    calls = []
    models.stage(moved, "tiny", download=fake_snapshot_download(hub, calls=calls))
    assert calls == [("org/tiny-qwen", other)] and models.is_staged(moved, "tiny")


def test_stage_uses_huggingface_hub_snapshot_download(hub, tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download(hub))
    assert models.is_staged(config_for(tmp_path), "tiny") is False
    models.stage(config_for(tmp_path), "tiny")
    assert models.is_staged(config_for(tmp_path), "tiny")


def test_a_local_directory_is_used_as_it_is(hub, tmp_path):
    snapshot = hub / "org/tiny-qwen" / REVISION
    cfg = config_for(tmp_path, path=str(snapshot), revision=None)
    assert models.hub_source(cfg, "tiny") is None and models.local_path(cfg, "tiny") == snapshot
    assert models.stage(cfg, "tiny", download=None) == snapshot


def test_every_paper_model_is_pinned_and_staged_under_models_dir():
    paper = load_config(PAPER)
    for model in paper["models"]:
        repo, revision = models.hub_source(paper, model)
        assert repo == paper["model_specs"][model]["path"] and len(revision) == 40
        assert models.local_path(paper, model) == Path(paper["verl"]["models_dir"]) / model


def test_the_workflow_stages_each_paper_model_once_on_the_submitting_node(tmp_path):
    from tests.test_workflow import copy_workflow, plan, snakemake

    work = copy_workflow(tmp_path)
    paper = yaml.safe_load((work / "experiments/paper.yaml").read_text())
    assert plan(work, "--configfile", "experiments/paper.yaml")["stage_model"] == len(paper["models"])
    out = snakemake(work, "--configfile", "experiments/paper.yaml", "--dry-run")
    for model in paper["models"]:
        assert f"output: {paper['verl']['models_dir']}/{model}\n" in out.stdout
    # Each cell waits for its model; the rule runs where Snakemake runs (internet), not in a job.
    assert out.stdout.count(f"{paper['verl']['models_dir']}/qwen3-8b,") + out.stdout.count(f"{paper['verl']['models_dir']}/qwen3-8b\n") >= 1 + 9
    assert "localrule: True" in (REPO / "workflows/rules/grid.smk").read_text()
