"""A publication is stale when its study's code changed after its provenance commit (studies/stale.py)."""

from __future__ import annotations

import json
import subprocess

from studies import stale
from studies.__main__ import main

ROOT = stale.ROOT


def test_a_studys_code_is_its_folder_its_config_and_what_its_measurement_imports():
    files = stale.code_files("depth")
    assert "studies/depth/measure.py" in files and "experiments/depth.yaml" in files
    assert "patches/__init__.py" in files  # imported through the measurement, not by the study's folder
    assert "localrl/vllm_kernels.py" in files  # behind localrl's front door (`from localrl import attention_isa`)
    assert "studies/depth/page.md" not in files and not any("published" in f for f in files)
    assert "studies/trace/measure.py" not in stale.code_files("roundmap")


def test_every_publication_is_listed_once(capsys):
    found = stale.publications()
    records = sorted(ROOT.glob("studies/**/published/**/provenance.json"))
    assert sorted(p.folder for p in found) == sorted(str(r.parent.relative_to(ROOT)) for r in records)
    assert main(["stale"]) == 0
    assert f"of {len(records)} publications stale" in capsys.readouterr().out


def _git(work, *args):
    return subprocess.run(["git", "-C", str(work), *args], check=True, capture_output=True, text=True).stdout


def test_touching_a_studys_code_in_a_scratch_commit_makes_its_publication_stale(tmp_path):
    work = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(work)], check=True)
    _git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    record = work / "studies/roundmap/published/provenance.json"
    data = json.loads(record.read_text())
    data["commit"] = _git(work, "rev-parse", "HEAD").strip()  # as if published at this commit
    record.write_text(json.dumps(data))
    before = stale.publication("studies/roundmap/published", work)
    assert not before.stale and before.status.startswith("current at")

    measure = work / "studies/roundmap/measure.py"
    text = measure.read_text()
    # a comment, a docstring and another layout: the same code runs
    docstring_end = text.index('"""', 3)
    measure.write_text(text[:docstring_end] + "More words.\n" + text[docstring_end:] + "\n# a comment\n\n\n")
    _git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "reword the measurement")
    assert not stale.publication("studies/roundmap/published", work).stale

    measure.write_text(measure.read_text() + "CHANGED = 1\n")
    _git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "touch the measurement")
    after = stale.publication("studies/roundmap/published", work)
    assert after.changed == ("studies/roundmap/measure.py",) and after.status.startswith("stale: 1 file since")
    other = stale.publication("studies/gpu_check/published", work)
    assert "studies/roundmap/measure.py" not in other.changed  # another study's code is not this one's


def test_a_commit_the_history_lacks_is_stale(tmp_path):
    work = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(work)], check=True)
    record = work / "studies/roundmap/published/provenance.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "commit": "0" * 40}))
    assert stale.publication("studies/roundmap/published", work).changed == tuple(stale.code_files("roundmap", work))
