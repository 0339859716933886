"""What a (re)run does with a cell folder (rla.cells): resume only the same cell, never lose results."""

import pytest

from rla import cells

ID = {"backend": "local", "model": "m", "ablation": "rope", "seed": 0, "rl": {"lr": 1e-4, "betas": (0.9, 0.999)}}


@pytest.mark.parametrize("done, old_steps, steps, action", [
    (0, 60, 60, "restart"),     # died before its first checkpoint: the same lines come out again
    (40, 60, 60, "resume"),     # preempted
    (40, 60, 100, "resume"),    # preempted, and more steps asked for
    (60, 60, 100, "continue"),  # finished, more steps asked for
    (60, 60, 60, "replace"),    # finished and run again (snakemake --force): train again, keep the old
    (60, 60, 30, "replace"),    # fewer steps than already trained
])
def test_same_identity(done, old_steps, steps, action):
    plan = cells.plan(cells.canonical(ID), old_steps, done, True, ID, steps)
    assert plan.action == action, plan
    assert plan.restores == (action in ("resume", "continue"))


def test_another_configuration_is_moved_aside_naming_what_changed():
    new = {**ID, "ablation": "all", "rl": {**ID["rl"], "lr": 1e-3}}
    plan = cells.plan(cells.canonical(ID), 60, 40, True, new, 60)
    assert plan.action == "replace"
    assert "ablation: 'rope' -> 'all'" in plan.message and "rl.lr: 0.0001 -> 0.001" in plan.message


def test_unknown_and_empty_folders():
    assert cells.plan(None, None, 0, True, ID, 60).action == "replace"  # results of unknown identity
    assert cells.plan(None, None, 0, False, ID, 60).action == "fresh"


def test_move_aside_keeps_everything_under_a_new_name(tmp_path):
    cell = tmp_path / "seed0"
    (cell / "checkpoints").mkdir(parents=True)
    (cell / "metrics.jsonl").write_text("line\n")
    first = cells.move_aside(cell)
    cell.mkdir()
    second = cells.move_aside(cell)
    assert not cell.exists() and first != second
    assert first.name.startswith("seed0.replaced-") and (first / "metrics.jsonl").read_text() == "line\n"


def test_fingerprint_follows_the_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 10)
    b.write_bytes(b"x" * 10)
    assert cells.fingerprint(a) == cells.fingerprint(b)
    b.write_bytes(b"x" * 9 + b"y")
    assert cells.fingerprint(a) != cells.fingerprint(b)


def test_a_cell_fills_in_its_defaults_and_absolute_paths(tmp_path, monkeypatch):
    from rla.cells import Cell

    monkeypatch.chdir(tmp_path)
    cfg = {"profile": "p", "steps": 7}
    cell = Cell.of(cfg, "qwen2-s", "rope", "3", "runs/x")
    assert (cell.out, cell.data) == (tmp_path / "runs/x", tmp_path / "results/p/data")
    assert (cell.seed, cell.steps, cell.name) == (3, 7, "qwen2-s-rope-seed3")
    assert Cell.of(cfg, "m", "none", 0, "o", "d", steps=2).steps == 2
