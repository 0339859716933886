"""Imports at the top of the module that uses them: a function-level import of the suite's own packages is
rare (at most MAX_PROJECT over every module outside tests/ and docs/), and every function-level import says
why on its line or the line above (a run of imports: its first). Read off the source, nothing imported."""

import ast
import io
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = {"localrl", "studies", "patches", "rla", "tinyqwen", "analysis", "verlrun", "diagnose", "benchmarks"}
SKIPPED = {"tests", "docs", "build"}  # tests import inside tests on purpose; docs and a package build hold no modules of the suite
MAX_PROJECT = 30


def sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in SKIPPED
                  and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(ROOT).parts))


def function_imports(text: str) -> list[tuple[int, bool, bool]]:
    """(line, of the suite's own packages, says why) for every import inside a function."""
    commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                 if tok.type == tokenize.COMMENT}
    found = []

    def own(node) -> bool:
        if isinstance(node, ast.ImportFrom):
            return node.level > 0 or (node.module or "").split(".")[0] in PROJECT
        return any(alias.name.split(".")[0] in PROJECT for alias in node.names)

    def says_why(stmt) -> bool:
        return any(n in commented for n in range(stmt.lineno - 1, stmt.end_lineno + 1))

    def visit(node, in_function: bool) -> None:
        """The statement lists under `node` (imports are statements; a run of them shares its first's why)."""
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            first = None
            for stmt in getattr(node, field, None) or []:
                if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    first = None
                    visit(stmt, inside)
                    continue
                first = first or stmt
                if inside:
                    found.append((stmt.lineno, own(stmt), says_why(stmt) or says_why(first)))

    visit(ast.parse(text), False)
    return found


def scan() -> dict[str, list[tuple[int, bool, bool]]]:
    return {str(p.relative_to(ROOT)): found for p in sources() if (found := function_imports(p.read_text()))}


def test_few_function_level_imports_of_the_suite():
    own = [(path, line) for path, found in scan().items() for line, is_own, _ in found if is_own]
    by_folder = Counter(path.split("/")[0] for path, _ in own)
    assert len(own) <= MAX_PROJECT, (f"{len(own)} function-level imports of the suite's own packages (at most "
                                     f"{MAX_PROJECT}): {dict(by_folder.most_common())}; move them to the top of "
                                     "their module: " + ", ".join(f"{p}:{n}" for p, n in own))


def test_every_function_level_import_says_why():
    silent = [f"{path}:{line}" for path, found in scan().items() for line, _, why in found if not why]
    assert not silent, "function-level imports with no comment on their line or the line above: " + ", ".join(silent)


def test_it_sees_both():
    snippet = '''
import os


def f():
    from localrl import kernels
    import json  # here: a reason
    from . import sibling
    return os, kernels, json, sibling


def g():
    try:  # vLLM: optional
        import vllm
        from vllm import LLM
    except ImportError:
        return None
    return lambda: vllm, LLM


class C:
    def method(self):
        # here: a reason above
        import yaml

        return yaml
'''
    assert function_imports(snippet) == [(6, True, False), (7, False, True), (8, True, True), (14, False, True),
                                         (15, False, True), (24, False, True)]
