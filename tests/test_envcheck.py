"""check-env on a local package index (no network): wheels pass; a package without a wheel for the
target fails the check."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from verlrun import envcheck
from tests.test_verlrun import REPO


def _wheel(directory: Path, name: str, version: str, tag: str = "py3-none-any", requires: tuple[str, ...] = ()) -> None:
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(directory / f"{name}-{version}-{tag}.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", meta)
        whl.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        whl.writestr(f"{info}/RECORD", "")


def _sdist(directory: Path, name: str, version: str) -> None:
    with tarfile.open(directory / f"{name}-{version}.tar.gz", "w:gz") as tar:
        data = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
        entry = tarfile.TarInfo(f"{name}-{version}/PKG-INFO")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """A PEP 503 index: alpha (wheel) needs beta (source only), gamma (absent) and delta (a
    cp312 linux_x86_64 wheel, as verl's prebuilt flash-attn is tagged)."""
    files = tmp_path / "files"
    files.mkdir()
    _wheel(files, "alpha", "1.0", requires=("beta>=1", "gamma==2.0", "delta==3.0"))
    _sdist(files, "beta", "1.5")
    _wheel(files, "delta", "3.0", tag="cp312-cp312-linux_x86_64")
    _wheel(files, "delta", "3.0", tag="cp311-cp311-linux_x86_64")
    simple = tmp_path / "simple"
    for project in ("alpha", "beta", "delta"):
        (simple / project).mkdir(parents=True)
        links = "".join(f'<a href="{p.as_uri()}">{p.name}</a>\n' for p in files.iterdir() if p.name.startswith(project))
        (simple / project / "index.html").write_text(f"<html><body>{links}</body></html>")
    # Only this index: not the machine's pip configuration.
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    return simple


def _env_file(tmp_path: Path, pip: list[str]) -> Path:
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump({"channels": ["conda-forge"], "dependencies": ["python=3.12", "pip", {"pip": pip}]}))
    return path


def _check(index: Path, tmp_path: Path, pip: list[str], *args: str) -> subprocess.CompletedProcess:
    env = _env_file(tmp_path, pip)
    command = [sys.executable, "-m", "verlrun", "check-env", str(env), "--index-url", index.as_uri(), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_wheels_only_pass_and_each_wheel_is_listed(index, tmp_path):
    good = _check(index, tmp_path, ["delta==3.0"])
    assert good.returncode == 0, good.stdout + good.stderr
    assert "WHEEL  delta" in good.stdout and "delta-3.0-cp312-cp312-linux_x86_64.whl" in good.stdout
    assert "1 packages resolve to wheels for CPython 3.12" in good.stdout


def test_a_package_without_a_wheel_for_the_target_fails_with_pips_message(index, tmp_path):
    bad = _check(index, tmp_path, ["--only-binary=delta", "alpha==1.0"])
    assert bad.returncode == 1 and "no wheel-only resolution" in bad.stdout
    assert "beta" in bad.stdout or "gamma" in bad.stdout  # pip names the first it cannot place
    # delta has no CPython 3.10 wheel
    other = _check(index, tmp_path, ["delta==3.0"], "--python-version", "3.10")
    assert other.returncode == 1 and "delta" in other.stdout


def test_the_gpu_environment_pins_what_verl_needs():
    options, requirements = envcheck.pip_section(REPO / "envs/verl-gpu.yaml")
    env = yaml.safe_load((REPO / "envs/verl-gpu.yaml").read_text())
    assert "python=3.12" in env["dependencies"]  # the prebuilt flash-attn wheel is cp312 only
    assert "verl[vllm,fsdp]==0.9.1" in requirements and "flash-attn==2.8.3" in requirements
    # The V1 trainer's TransferQueue, the release the CPU environment runs.
    nodeps = (REPO / "envs/requirements-nodeps.txt").read_text().splitlines()
    assert [r for r in requirements if r.startswith("TransferQueue")] == [l for l in nodeps if l.startswith("TransferQueue")]
    assert "--only-binary=flash-attn" in options  # never compile it
    assert any("verl-wheelhouse" in o for o in options)
