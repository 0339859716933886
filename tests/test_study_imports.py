"""The studies wing's rooms: a study imports the rig's front door (`localrl`), the shared room
(`studies._shared`), the suite's small packages and the study wing's own tools - never a `localrl`
submodule, never another study. Read off the source (absolute and relative imports), so a breach
fails here before anything runs."""

import ast
from pathlib import Path

import pytest

import localrl

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"


def study_folders() -> list[Path]:
    return sorted(p for p in STUDIES.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")) and any(p.glob("*.py")))


def imported_modules(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in `path`; `from X import name` also yields X.name,
    so that `from localrl import engines` counts as the submodule it is."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def breaches(path: Path, study: str, text: str | None = None) -> list[str]:
    problems = []
    for line, module in imported_modules(path, text):
        parts = module.split(".")
        if parts[0] == "localrl" and len(parts) > 1 and parts[1] not in localrl.FRONT_DOOR:
            problems.append(f"{path.relative_to(ROOT)}:{line} imports the rig's submodule {module}")
        if parts[0] == "studies" and len(parts) > 1 and (STUDIES / parts[1]).is_dir() \
                and not parts[1].startswith("_") and parts[1] != study:
            problems.append(f"{path.relative_to(ROOT)}:{line} imports another study: {module}")
    return problems


@pytest.mark.parametrize("folder", study_folders(), ids=lambda p: p.name)
def test_a_study_imports_the_front_door_and_the_shared_room_only(folder):
    problems = [p for f in sorted(folder.rglob("*.py")) for p in breaches(f, folder.name)]
    assert not problems, "\n".join(problems)


def test_the_shared_room_imports_no_study_and_no_rig_submodule():
    problems = [p for f in sorted((STUDIES / "_shared").rglob("*.py")) for p in breaches(f, "_shared")]
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_breach():
    """The check can fail: another study imported relatively, a rig submodule imported by name; the
    front door and the study's own modules pass."""
    text = ("from ..depth import measure\nfrom localrl import engines\nimport localrl.trainer\n"
            "from localrl import Trainer\nfrom . import report\nfrom studies._shared import __doc__\n")
    problems = breaches(STUDIES / "probe" / "example.py", "probe", text)
    assert [p.split(" imports ")[1] for p in problems] == [
        "another study: studies.depth", "another study: studies.depth.measure",
        "the rig's submodule localrl.engines", "the rig's submodule localrl.trainer"]
