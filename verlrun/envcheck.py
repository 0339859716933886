"""Check, without a GPU, that a conda environment's pip section installs from wheels only: pip's own
`install --dry-run --only-binary=:all:` for the nodes' platform (docs/running.md, "Environment")."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

PYPI = "https://pypi.org/simple"


def pip_section(env_file: str | Path) -> tuple[list[str], list[str]]:
    """(pip options, requirements) of an environment file's `pip:` list."""
    env = yaml.safe_load(Path(env_file).read_text())
    section = next((d["pip"] for d in env.get("dependencies", []) if isinstance(d, dict) and "pip" in d), None)
    if section is None:
        raise ValueError(f"{env_file}: no pip section under dependencies")
    options = [str(x) for x in section if str(x).startswith("-")]
    return [a for o in options for a in o.split(None, 1)], [str(x) for x in section if not str(x).startswith("-")]


def pip_target(python_version: str, glibc: str) -> list[str]:
    """pip's options for a Linux x86-64 node: every platform tag such a pip accepts (older manylinux
    tags, their legacy aliases and plain linux_x86_64, how the prebuilt flash-attn wheel is tagged)."""
    minor = int(glibc.split(".")[1])
    platforms = ([f"manylinux_2_{m}_x86_64" for m in range(minor, 4, -1)]
                 + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"])
    abi = "cp" + python_version.replace(".", "")
    return [*(arg for p in platforms for arg in ("--platform", p)), "--python-version", python_version,
            "--implementation", "cp", "--abi", abi]


def main(env_file: str, python_version: str = "3.12", glibc: str = "2.31", main_index: str = PYPI) -> int:
    """Print the wheel pip picks for each package and exit 0, or pip's own error (the first package
    without a wheel for the target) and exit 1."""
    options, requirements = pip_section(env_file)
    # The check itself asks for wheels only, everywhere.
    options = [o for o in options if not o.startswith(("--only-binary", "--prefer-binary"))]
    if not any(o in ("-i", "--index-url") for o in options):
        options = ["--index-url", main_index, *options]
    target = f"CPython {python_version}, Linux x86-64, glibc {glibc}"
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
             *pip_target(python_version, glibc), "--target", str(Path(tmp) / "t"), "--report", str(report),
             "--timeout", "30", "--retries", "1", *options, *requirements], capture_output=True, text=True)
        if result.returncode != 0:
            print(result.stderr[-3000:], end="")
            print(f"check-env: pip found no wheel-only resolution for {target} (its message above)")
            return 1
        installs = json.loads(report.read_text())["install"]
    for item in sorted(installs, key=lambda item: item["metadata"]["name"].lower()):
        wheel = item["download_info"]["url"].rsplit("/", 1)[-1]
        print(f"WHEEL  {item['metadata']['name']:<28} {item['metadata']['version']}  {wheel}")
    print(f"check-env: {len(installs)} packages resolve to wheels for {target}")
    return 0
