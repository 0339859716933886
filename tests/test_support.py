"""The support matrix (docs/support/matrix.yaml, rendered as docs/support.md) names only things that exist."""

from __future__ import annotations

import re
from importlib import import_module

import pytest
import yaml

from studies import STUDIES, pages

ROOT = pages.ROOT
STACKS = yaml.safe_load((ROOT / "docs/support/matrix.yaml").read_text())["stacks"]
STATUSES = {"checked", "refused", "unchecked"}


def missing(reference: str) -> str | None:
    """Why `reference` (a test, make target, study or code) names nothing, or None where it exists."""
    kind, _, name = reference.partition(" ")
    if "::" in reference:
        path, test = reference.split("::")
        file = ROOT / path
        return None if file.is_file() and re.search(rf"^def {test}\(", file.read_text(), re.M) else "no such test"
    if kind == "make":
        return None if re.search(rf"^{name}:", (ROOT / "Makefile").read_text(), re.M) else "no such make target"
    if kind == "study":
        return None if name in STUDIES else "no such study"
    if kind == "code":
        module, _, attr = name.partition(":")
        return None if hasattr(import_module(module), attr) else "no such name"
    return "unknown kind (tests/FILE.py::test, make T, study NAME, code MODULE:NAME)"


@pytest.mark.parametrize("stack", STACKS, ids=[f"{s['transformers']}|{s['vllm']}" for s in STACKS])
def test_each_stack_has_a_status_and_names_what_exists(stack):
    assert stack["status"] in STATUSES
    assert stack["status"] == "unchecked" or stack["by"], "a checked or refused stack names what checked it"
    assert {ref: missing(ref) for ref in stack["by"] if missing(ref)} == {}


def test_a_reference_to_nothing_is_found():
    assert missing("tests/test_support.py::test_no_such_thing") == "no such test"
    assert missing("make no-such-target") == "no such make target"
    assert missing("study nothing") == "no such study"
    assert missing("code patches.upstream:NOTHING") == "no such name"


def test_the_page_lists_the_releases_the_patches_know():
    from patches.upstream import CHECKED

    text = (ROOT / "docs/support.md").read_text()
    releases = [r for key in CHECKED for r in key.split(", ")]
    assert releases and all(f"`{r}`" in text for r in releases)
