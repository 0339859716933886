"""localrl/inductor_isa_check.py: a vector-ISA check library that loaded once is not loaded again in a
child Python; one that failed to load is checked again every time, as without the patch."""

from __future__ import annotations

import subprocess

import pytest
from torch._inductor import cpu_vec_isa

from localrl.inductor_isa_check import MARKER, remember_isa_checks


@pytest.fixture
def children(monkeypatch):
    """The child Pythons Inductor starts to load a library: counted, each loading what the test says."""
    started, loads = [], {}

    def run(cmd, **kwargs):
        path = next(p for p in loads if p in cmd[-1])  # the library's path is in the child's code
        started.append(path)
        if not loads[path]:
            raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(cpu_vec_isa.subprocess, "run", run)
    return started, loads


def test_a_library_that_loaded_is_not_loaded_again(tmp_path, children):
    started, loads = children
    assert remember_isa_checks() and remember_isa_checks()  # applied once, however often called
    good, bad = str(tmp_path / "good.so"), str(tmp_path / "bad.so")
    loads.update({good: True, bad: False})
    isa = cpu_vec_isa.VecAVX2()
    assert [isa._probe_load(good) for _ in range(3)] == [True] * 3
    assert started == [good] and (tmp_path / f"good.so{MARKER}").exists()
    assert [isa._probe_load(bad) for _ in range(2)] == [False] * 2
    assert started == [good, bad, bad] and not (tmp_path / f"bad.so{MARKER}").exists()


def test_without_the_marker_every_check_loads(tmp_path, children):
    """The stock behaviour the patch changes: the same test fails with the marker's skip removed."""
    started, loads = children
    remember_isa_checks()
    good = str(tmp_path / "good.so")
    loads[good] = True
    isa = cpu_vec_isa.VecAVX2()
    isa._probe_load(good)
    (tmp_path / f"good.so{MARKER}").unlink()
    isa._probe_load(good)
    assert started == [good, good]
