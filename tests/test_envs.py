"""The CPU environment is the same on both routes: the venv (`make`, envs/requirements-*.txt) and
Snakemake's conda (`--sdm conda`, envs/cpu.yaml and its post-deploy script)."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from verlrun.envcheck import pip_section

REPO = Path(__file__).resolve().parent.parent


def requirements(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_the_conda_env_lists_the_cpu_requirements():
    options, listed = pip_section(REPO / "envs/cpu.yaml")
    assert listed[0] == "torch==2.13.0" and "https://download.pytorch.org/whl/cpu" in options
    assert listed[1:] == requirements(REPO / "envs/requirements-cpu.txt")


def test_the_post_deploy_script_installs_the_no_deps_requirements_without_their_requirements():
    script = (REPO / "envs/cpu.post-deploy.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash") and (REPO / "envs/cpu.post-deploy.sh").stat().st_mode & 0o111
    command = " ".join(l.rstrip("\\").strip() for l in script.splitlines() if l and not l.startswith(("#", "set ")))
    words = shlex.split(command)
    assert words[:5] == ["python", "-m", "pip", "install", "--no-deps"]
    assert words[5:] == requirements(REPO / "envs/requirements-nodeps.txt")
    # Snakemake finds it next to the env file (<env>.post-deploy.sh) and runs it in the new environment.
    assert yaml.safe_load((REPO / "envs/cpu.yaml").read_text())["dependencies"][0] == "python=3.11"
