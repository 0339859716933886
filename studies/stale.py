"""Which publications are stale: the study's code changed after the commit its provenance names.

A study's code is its folder's Python files (not its page, not what it published), its experiment config,
and every project module its measurement and report import, followed import by import (function-level
imports included), each compared with the provenance commit (`git diff --name-only COMMIT -- FILES`, the
working tree on the right). A Python file whose code is the same but for its docstrings, comments and layout
(equal ASTs without docstrings) has not changed: what runs is the same. Torch-free: it reads source files and
git, never imports the study.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import localrl
from studies import STUDIES
from studies.provenance import PROVENANCE

ROOT = Path(__file__).resolve().parents[1]
# The top-level packages of this project: an import of any other name is a dependency, not its code.
PACKAGES = ("analysis", "benchmarks", "localrl", "patches", "rla", "studies", "tinyqwen", "verlrun")


@dataclass(frozen=True)
class Publication:
    study: str
    folder: str  # from the repository's root: studies/NAME/published[/KIND]
    commit: str  # the provenance's commit ("unknown" where it names none)
    changed: tuple[str, ...]  # the study's code files that differ from that commit, or that it lacks

    @property
    def stale(self) -> bool:
        return bool(self.changed)

    @property
    def status(self) -> str:
        """`current at abc1234`, or `stale: N files since abc1234` (the study's code files that changed)."""
        n, short = len(self.changed), self.commit[:7]
        return f"stale: {n} file{'s' * (n > 1)} since {short}" if n else f"current at {short}"


def module_file(module: str, root: Path) -> Path | None:
    """The source file of a dotted project module (a package's __init__.py), or None outside the project."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = root / module.replace(".", "/")
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)


@cache
def imported_modules(path: Path, root: Path) -> frozenset[str]:
    """The dotted names a source file imports, relative imports resolved, each `from M import name` also
    tried as the submodule M.name."""
    package = ".".join(path.relative_to(root).parent.parts)  # what its relative imports start from
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
            if base == "localrl":  # a front-door name: the submodule that defines it
                found.update(f"localrl.{localrl.FRONT_DOOR[a.name].partition(':')[0]}" for a in node.names
                             if a.name in localrl.FRONT_DOOR)
    return frozenset(found)


def code_files(study: str, root: Path = ROOT) -> list[str]:
    """The files whose content makes `study`'s numbers, from the repository's root, sorted."""
    entry = STUDIES[study]
    folder = root / entry.folder
    todo = [p for p in folder.rglob("*.py") if "published" not in p.parts and "runs" not in p.parts]
    todo += [module_file(module, root) for module in (*entry.code, entry.measure, entry.report) if module]
    seen = set()
    while todo:
        if (path := todo.pop()) in seen or path is None:  # None: a module outside the project
            continue
        seen.add(path)
        for parts in (module.split(".") for module in imported_modules(path, root)):
            # importing a.b.c runs a/__init__.py and a/b/__init__.py too
            todo += [module_file(".".join(parts[:depth]), root) for depth in range(1, len(parts) + 1)]
    files = {str(p.relative_to(root)) for p in seen}
    if entry.config:
        files.add(entry.config)
    return sorted(files)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)


def _code(text: str) -> str:
    """What a module runs: its AST without docstrings (comments and layout are not in an AST)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _same_code(root: Path, commit: str, file: str) -> bool:
    """Whether a Python file runs the same code in the working tree as at `commit`."""
    then, now = _git(root, "show", f"{commit}:{file}"), root / file
    if not file.endswith(".py") or then.returncode or not now.is_file():
        return False
    try:
        return _code(then.stdout) == _code(now.read_text())
    except SyntaxError:
        return False


@cache
def _publications(root: Path, _state: str) -> tuple[Publication, ...]:
    found = []
    for name in STUDIES:
        files = code_files(name, root)
        for record in sorted((root / STUDIES[name].published).rglob(PROVENANCE)):
            commit = json.loads(record.read_text()).get("commit", "unknown")
            diff = _git(root, "diff", "--name-only", commit, "--", *files)
            # a commit this history lacks: nothing says the code is the same
            changed = tuple(files) if diff.returncode else tuple(
                sorted(f for f in set(diff.stdout.split()) if not _same_code(root, commit, f)))
            found.append(Publication(name, str(record.parent.relative_to(root)), commit, changed))
    return tuple(found)


def publications(root: Path = ROOT) -> list[Publication]:
    """Every publication (one per provenance.json) with the study code that changed since its commit."""
    root = Path(root).resolve()
    # computed once per state of the checkout: its commit and the files changed in the working tree
    state = _git(root, "rev-parse", "HEAD").stdout + _git(root, "diff", "HEAD", "--name-only").stdout
    return list(_publications(root, state))


def publication(folder: str, root: Path = ROOT) -> Publication:
    """The publication in `folder` (studies/NAME/published[/KIND]), or a KeyError naming those there are."""
    found = {p.folder: p for p in publications(root)}
    if folder not in found:
        raise KeyError(f"no publication in {folder}; there are: {', '.join(found)}")
    return found[folder]
