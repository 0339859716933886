"""The torch study's environments: one virtualenv per torch release under .envs/torch-RELEASE (ignored by git),
holding that torch, the transformers release the builder runs (so that only torch differs) and what the
study's command line needs; the repository itself is imported from the working tree (`python -m` from its
root), not installed. `installed`, or the release the builder's own torch is, needs no environment: the
builder's interpreter measures it.

    python -m studies.torch_releases.env build 2.15.0     # build (or check) .envs/torch-2.15.0; print its record
    python -m studies.torch_releases.env python 2.15.0    # the interpreter that measures a release

PyPI's torch wheels for Linux are CUDA builds: they do not import without their nvidia-* libraries, so those
are installed too (about 5 GB per environment); Inductor's CPU code does not use them. A machine-wide pip
constraint may cap torch below the newest release: the build lifts it for its own install only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

RELEASES = ("2.11.0", "2.13.0", "2.14.1", "2.15.0")  # the GPU image's, this suite's, vLLM 0.33's, the newest
INSTALLED = "installed"  # whatever torch the builder runs: the micro profile's cell, no environment built
ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / ".envs"
# what `python -m studies run` imports besides torch and transformers
TOOLS = ("pyyaml", "jsonschema")
BUILT = "built"  # written last into an environment whose torch was checked: a half-built one has none


class EnvError(ValueError):
    """A release not offered, or an environment not built."""


def running_release() -> str:
    return metadata.version("torch").split("+")[0]


def _check(release: str) -> None:
    if release != INSTALLED and release not in RELEASES:
        raise EnvError(f"torch release {release!r}; allowed: {', '.join(RELEASES)} or {INSTALLED!r} (the builder's own)")


def uses_builder(release: str) -> bool:
    """Whether the builder's interpreter measures `release` (no environment of its own)."""
    _check(release)
    return release in (INSTALLED, running_release())


def env_dir(release: str) -> Path:
    return ENVS / f"torch-{release}"


def _torch_in(python: Path) -> str | None:
    """The torch release an environment's interpreter imports, None where it does not import one."""
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True)
    return proc.stdout.strip().split("+")[0] if proc.returncode == 0 else None


def _built(release: str) -> bool:
    marker = env_dir(release) / BUILT
    return marker.exists() and marker.read_text().strip() == release


def python(release: str) -> str:
    """The interpreter that measures `release`; an EnvError where its environment is not built."""
    if uses_builder(release):
        return sys.executable
    if not _built(release):
        raise EnvError(f"torch {release}: no environment at {env_dir(release).relative_to(ROOT)} (or its build did "
                       f"not finish); build it: python -m studies.torch_releases.env build {release}")
    return str(env_dir(release) / "bin" / "python")


def build(release: str) -> dict:
    """Build `release`'s environment unless it is built; its record (releases, interpreter)."""
    if uses_builder(release) or _built(release):
        return record(release)
    exe = env_dir(release) / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env_dir(release))], check=True)
    pins = [f"torch=={release}", f"transformers=={metadata.version('transformers')}", *TOOLS]
    # the machine's pip constraint (if any) may cap torch: lifted for this install only, left in place
    subprocess.run([str(exe), "-m", "pip", "install", "--quiet", *pins], check=True,
                   env={**os.environ, "PIP_CONSTRAINT": os.devnull})
    if (found := _torch_in(exe)) != release:
        raise EnvError(f"torch {release}: the environment at {env_dir(release).relative_to(ROOT)} imports torch {found}")
    (env_dir(release) / BUILT).write_text(release + "\n")
    return record(release)


def record(release: str) -> dict:
    """What measures `release`: the interpreter and the releases it imports."""
    exe = python(release)
    code = "import json, sys, torch, transformers; print(json.dumps([sys.version.split()[0], torch.__version__, " \
           "transformers.__version__]))"
    py, torch_version, transformers_version = json.loads(subprocess.run([exe, "-c", code], capture_output=True,
                                                                        text=True, check=True).stdout)
    return {"release": release, "environment": None if uses_builder(release) else str(env_dir(release).relative_to(ROOT)),
            "python": py, "torch": torch_version, "transformers": transformers_version}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.torch_releases.env", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("build", "python"), help="build: make (or check) the environment and print "
                   "its record as JSON; python: print the interpreter that measures the release")
    p.add_argument("release", help=f"{', '.join(RELEASES)} or {INSTALLED}")
    args = p.parse_args(argv)
    try:
        print(json.dumps(build(args.release), indent=1) if args.action == "build" else python(args.release))
    except EnvError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
