"""Bounded checkpoints: pruning across restarts keeps what verl resumes from (the launcher driving a
stand-in script that saves checkpoints as verl does; it is not verl); disk per cell and grid."""

from __future__ import annotations

import sys

import pytest

from verlrun import checkpoints, disk, launch
from rla.cells import Cell
from rla.config import load as load_config
from tests.test_verlrun import PAPER


def _save(ckpt_dir, step, tracked=True):
    (ckpt_dir / f"global_step_{step}" / "actor").mkdir(parents=True)
    (ckpt_dir / f"global_step_{step}" / "data.pt").write_text("x")
    if tracked:
        (ckpt_dir / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_prune_keeps_the_newest_and_the_resume_point(tmp_path):
    for step in (25, 50, 75, 100):
        _save(tmp_path, step)
    _save(tmp_path, 125, tracked=False)  # killed while saving: verl writes its tracker last
    removed = checkpoints.prune(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["global_step_125", "global_step_25", "global_step_50"]
    assert checkpoints.saved_steps(tmp_path) == [75, 100]
    # verl's own lookup still finds the checkpoint to resume from.
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    assert find_latest_ckpt_path(str(tmp_path)).endswith("global_step_100")
    assert checkpoints.prune(tmp_path, 1) and checkpoints.saved_steps(tmp_path) == [100]
    assert checkpoints.prune(tmp_path, None) == [] and checkpoints.saved_steps(tmp_path) == [100]
    with pytest.raises(ValueError, match="keep=0.*>= 1"):
        checkpoints.prune(tmp_path, 0)


STAND_IN_VERL = """
import json, os, sys
from pathlib import Path
ckpt = Path(sys.argv[1])
first, last = int(sys.argv[2]), int(sys.argv[3])
with open(ckpt.parent / "seen_at_start.txt", "a") as seen:  # what this (re)started run found
    seen.write(" ".join(sorted(p.name for p in ckpt.glob("global_step_*"))) + "\\n")
with open(os.environ["VERL_FILE_LOGGER_PATH"], "wb") as f:
    for step in range(first, last + 1):
        f.write(json.dumps({"step": step, "data": {}}).encode() + b"\\n")
        if step % 2 == 0:   # save_freq 2, and verl never prunes what an earlier process saved
            (ckpt / f"global_step_{step}").mkdir(parents=True, exist_ok=True)
            (ckpt / "latest_checkpointed_iteration.txt").write_text(str(step))
"""


def test_the_launcher_bounds_checkpoints_across_a_restart_of_a_stand_in_verl(tmp_path, monkeypatch):
    paper = load_config(PAPER)
    script = tmp_path / "stand_in_verl.py"
    script.write_text(STAND_IN_VERL)
    cell = tmp_path / "cell"
    runs = iter([(1, 8), (9, 14)])

    def fake_command(overrides, cell_dir):
        first, last = next(runs)
        return [sys.executable, str(script), str(cell / "checkpoints"), str(first), str(last)]

    monkeypatch.setattr(launch, "command", fake_command)
    monkeypatch.setattr(launch, "compose", lambda overrides: None)
    monkeypatch.setattr(launch, "check_model", lambda cfg, model: None)
    for _ in range(2):
        assert launch.train(Cell.of(paper, "qwen3-8b", "none", 0, cell, tmp_path / "data")) == 0
        assert checkpoints.saved_steps(cell / "checkpoints")[-1] == checkpoints.latest_step(cell / "checkpoints")
        assert len(checkpoints.saved_steps(cell / "checkpoints")) == paper["rl"]["keep_checkpoints"]
    # The restart starts with its resume point only.
    assert (cell / "seen_at_start.txt").read_text().splitlines() == ["", "global_step_8"]


def test_a_cell_without_its_staged_model_fails_before_launching(tmp_path):
    paper = {**load_config(PAPER), "verl": {**load_config(PAPER)["verl"], "models_dir": str(tmp_path / "none")}}
    with pytest.raises(FileNotFoundError, match=r"'qwen3-8b' is not staged.*stage-model"):
        launch.check_model(paper, "qwen3-8b")


def test_disk_per_cell_and_grid_are_bounded_by_keep_checkpoints():
    paper = load_config(PAPER)
    rows = {r["model"]: r for r in disk.grid_rows(paper)}
    eight = rows["qwen3-8b"]
    assert eight["checkpoint"] / 1e9 == pytest.approx(98, abs=1)  # 12 bytes x 8.19 B parameters
    assert eight["checkpoints_per_cell"] == max(paper["rl"]["keep_checkpoints"], 2) + 1
    assert eight["cell"] == eight["checkpoints_per_cell"] * eight["checkpoint"] + disk.SMALL_FILES
    assert disk.grid_bytes(paper) == sum(r["cells"] * r["cell"] + r["staged_model"] for r in rows.values())
    keep_all = {**paper, "rl": {**paper["rl"], "keep_checkpoints": None}}
    assert disk.cell_bytes(keep_all, "qwen3-8b") > 6 * disk.cell_bytes(paper, "qwen3-8b")
    assert disk.checkpoints_at_peak(None, 500, 25) == 20 and disk.checkpoints_at_peak(1, 500, 25) == 3


def test_a_bad_keep_checkpoints_names_the_allowed_values(tmp_path):
    from verlrun.overrides import build_overrides

    paper = load_config(PAPER)
    bad = {**paper, "rl": {**paper["rl"], "keep_checkpoints": 0}}
    with pytest.raises(ValueError, match=r"rl.keep_checkpoints = 0 \(int\) is invalid: it must be a positive integer, or null"):
        build_overrides(Cell.of(bad, "qwen3-8b", "none", 0, tmp_path, tmp_path))
