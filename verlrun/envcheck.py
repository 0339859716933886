"""Check, without a GPU, that a conda environment's pip section installs from wheels only: pip's own
`--dry-run --only-binary=:all:` resolution for the target, with a stand-in wheel for each package it cannot
place so that every one is listed (docs/running.md, "Environment")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

PYPI = "https://pypi.org/simple"
# What a verl cell imports besides verl, vLLM and torch, which the environment must resolve to: verl
# 0.9.1's default V1 trainer needs TransferQueue (verl/trainer/main_ppo.py: `import transfer_queue`).
REQUIRED = ("TransferQueue",)
UNPLACED_RE = re.compile(r"(?:No matching distribution found for|satisfies the requirement) ([^\s(]+(?: ?[<>=!~]=?[^\s(]+)?)")
MAX_ROUNDS = 40


@dataclass(frozen=True)
class Target:
    """A Linux x86-64 machine: glibc `glibc` and CPython `python_version`."""

    python_version: str = "3.12"
    glibc: str = "2.31"  # vllm 0.24's llguidance has x86-64 wheels for glibc >= 2.31 only

    def platforms(self) -> list[str]:
        # Everything such a pip accepts: older manylinux tags, their legacy aliases and plain
        # linux_x86_64 (how the prebuilt flash-attn wheel is tagged).
        minor = int(self.glibc.split(".")[1])
        return ([f"manylinux_2_{m}_x86_64" for m in range(minor, 4, -1)]
                + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"])

    def pip_args(self) -> list[str]:
        abi = "cp" + self.python_version.replace(".", "")
        platforms = [arg for p in self.platforms() for arg in ("--platform", p)]
        return [*platforms, "--python-version", self.python_version, "--implementation", "cp", "--abi", abi]

    def tags(self) -> set[str]:
        version = tuple(int(x) for x in self.python_version.split("."))
        tags = list(cpython_tags(version, platforms=self.platforms())) + list(compatible_tags(version, platforms=self.platforms()))
        return {str(t) for t in tags}


@dataclass
class Finding:
    kind: str      # WHEEL, SOURCE, MISSING, UNCHECKED, UNREACHABLE
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.kind:<11} {self.name:<28} {self.detail}"


def pip_section(env_file: str | Path) -> tuple[list[str], list[str]]:
    """(pip options, requirements) of an environment file's `pip:` list."""
    env = yaml.safe_load(Path(env_file).read_text())
    section = next((d["pip"] for d in env.get("dependencies", []) if isinstance(d, dict) and "pip" in d), None)
    if section is None:
        raise ValueError(f"{env_file}: no pip section under dependencies")
    options = [str(x) for x in section if str(x).startswith("-")]
    return [a for o in options for a in o.split(None, 1)], [str(x) for x in section if not str(x).startswith("-")]


def index_urls(options: list[str], main: str) -> list[str]:
    extra = [options[i + 1] for i, o in enumerate(options[:-1]) if o in ("--extra-index-url", "-i", "--index-url")]
    main = next((options[i + 1] for i, o in enumerate(options[:-1]) if o in ("-i", "--index-url")), main)
    return list(dict.fromkeys([main, *extra]))


def _page(url: str) -> str:
    """A directory on a file:// index serves its index.html, as pip reads it."""
    return url + "index.html" if url.startswith("file:") else url


def reachable(url: str, timeout: float = 15) -> bool:
    if url.startswith("file:"):
        return Path(urllib.request.url2pathname(url.removeprefix("file:"))).is_dir()
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=timeout):
            return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.files: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href") or ""
            self.files.append(href.split("#", 1)[0].rsplit("/", 1)[-1])


def index_files(index: str, name: str, timeout: float = 30) -> list[str] | None:
    """File names a PEP 503 index lists for a project ([] = none), or None when unreachable."""
    url = f"{index.rstrip('/')}/{canonicalize_name(name)}/"
    if url.startswith("file:") and not Path(urllib.request.url2pathname(_page(url).removeprefix("file:"))).is_file():
        return []
    try:
        with urllib.request.urlopen(_page(url), timeout=timeout) as page:
            parser = _Links()
            parser.feed(page.read().decode("utf-8", "replace"))
            return parser.files
    except urllib.error.HTTPError as err:
        return [] if err.code == 404 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def classify(requirement: str, indexes: list[str], target: Target) -> Finding:
    """SOURCE, MISSING or UNCHECKED for a requirement pip could not place as a wheel."""
    req = Requirement(requirement)
    tags = target.tags()
    sdists, wheels, unreachable = set(), set(), []
    for index in indexes:
        files = index_files(index, req.name)
        if files is None:
            unreachable.append(index)
            continue
        for filename in files:
            try:
                if filename.endswith(".whl"):
                    _, version, _, file_tags = parse_wheel_filename(filename)
                    if req.specifier.contains(version, prereleases=True) and {str(t) for t in file_tags} & tags:
                        wheels.add(str(version))
                elif filename.endswith((".tar.gz", ".zip")):
                    _, version = parse_sdist_filename(filename)
                    if req.specifier.contains(version, prereleases=True):
                        sdists.add(str(version))
            except ValueError:
                continue
    where = f"; not checked on {', '.join(unreachable)} (unreachable)" if unreachable else ""
    if sdists and not wheels:
        return Finding("SOURCE", req.name, f"{req.specifier or 'any'}: only source distributions ({', '.join(sorted(sdists))}){where}")
    if unreachable:
        return Finding("UNCHECKED", req.name, f"{req.specifier or 'any'}: no wheel for the target on the reachable indexes{where}")
    return Finding("MISSING", req.name, f"{req.specifier or 'any'}: the indexes have no file for this version and target")


def stand_in_wheel(directory: Path, requirement: str) -> Path:
    """An empty wheel that satisfies the requirement, so that pip resolves the rest."""
    req = Requirement(requirement)
    candidates = [s.version.rstrip(".*") for s in req.specifier] + [s.version + ".post1" for s in req.specifier] + ["0"]
    version = next((v for v in candidates if req.specifier.contains(v, prereleases=True)), "0")
    name = canonicalize_name(req.name).replace("-", "_")
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {req.name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: envcheck\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def resolve(options: list[str], requirements: list[str], target: Target, stand_ins: Path
            ) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
               *target.pip_args(), "--target", str(Path(tmp) / "t"), "--report", str(Path(tmp) / "report.json"),
               "--timeout", "30", "--retries", "1", "--find-links", str(stand_ins), *options, *requirements]
        result = subprocess.run(cmd, capture_output=True, text=True)
        report = Path(tmp) / "report.json"
        result.report = json.loads(report.read_text()) if report.exists() else None
        return result


def check(env_file: str | Path, target: Target = Target(), main_index: str = PYPI,
          required: tuple[str, ...] = ()) -> list[Finding]:
    """Findings for an environment file; `required` packages must be in its resolution (MISSING if not)."""
    options, requirements = pip_section(env_file)
    # The check itself asks for wheels only, everywhere.
    options = [o for o in options if not o.startswith("--only-binary") and not o.startswith("--prefer-binary")]
    indexes = index_urls(options, main_index)
    if not any(o in ("-i", "--index-url") for o in options):
        options = ["--index-url", main_index, *options]
    findings = [Finding("UNREACHABLE", url, "index of the environment; packages only there cannot be checked")
                for url in indexes if not reachable(url)]
    placed: set[str] = set()
    with tempfile.TemporaryDirectory() as stand_ins:
        for _ in range(MAX_ROUNDS):
            result = resolve(options, requirements, target, Path(stand_ins))
            if result.returncode == 0:
                resolved = set()
                for item in result.report["install"]:
                    meta, url = item["metadata"], item["download_info"]["url"]
                    resolved.add(canonicalize_name(meta["name"]))
                    if Path(stand_ins).as_uri() in url or url.startswith("file://" + stand_ins):
                        continue
                    findings.append(Finding("WHEEL", meta["name"], f"{meta['version']}  {url.rsplit('/', 1)[-1]}"))
                findings += [Finding("MISSING", name, "not in the environment: a verl cell needs it")
                             for name in required if canonicalize_name(name) not in resolved]
                return findings
            match = UNPLACED_RE.search(result.stderr)
            if not match or canonicalize_name(Requirement(match.group(1)).name) in placed:
                raise RuntimeError(f"pip failed for another reason:\n{result.stderr[-3000:]}")
            requirement = match.group(1).replace(" ", "")
            placed.add(canonicalize_name(Requirement(requirement).name))
            findings.append(classify(requirement, indexes, target))
            stand_in_wheel(Path(stand_ins), requirement)
    raise RuntimeError(f"more than {MAX_ROUNDS} packages without a wheel; stopped")


def main(env_file: str, python_version: str, glibc: str, main_index: str) -> int:
    findings = check(env_file, Target(python_version, glibc), main_index, required=REQUIRED)
    for finding in sorted(findings, key=lambda f: (f.kind == "WHEEL", f.kind, f.name)):
        print(finding.line())
    bad = [f for f in findings if f.kind != "WHEEL"]
    wheels = len(findings) - len(bad)
    print(f"check-env: {wheels} packages resolve to wheels for CPython {python_version}, Linux x86-64, glibc {glibc}; "
          + (f"{len(bad)} problems (SOURCE / MISSING / UNCHECKED / UNREACHABLE above)" if bad else "no problems"))
    return 1 if bad else 0
