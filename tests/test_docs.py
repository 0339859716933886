"""The README and docs/ link to files and headings that exist (a moved section breaks a test, not a reader)."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The pages as readers see them (docs/templates/ holds what renders the README and docs/results.md).
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "templates" not in p.parts)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#+ ", line):
            found.add(_anchor(line.split(" ", 1)[1]))
    return found


def broken_links(pages) -> list[str]:
    anchors = {page: _anchors(page) for page in pages}
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text()):
            if target.startswith("http"):
                continue
            path = Path(os.path.normpath(page.parent / target)) if target else page
            if not path.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors.get(path, _anchors(path)):
                broken.append(f"{page.name}: {target}#{anchor}")
    return broken


def test_every_link_resolves():
    assert broken_links(PAGES) == []


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n[ok](#title) [gone](#nowhere) [file](missing.md)\n")
    assert broken_links([page]) == ["p.md: #nowhere", "p.md: missing.md"]


def test_the_example_for_other_trainers_runs_aligned():
    """docs/patches.md's "Outside verl" example, run as written: the regions apply (the patched forward runs,
    its gradients flow) and `remove` gives stock back."""
    import patches
    from patches import rmsnorm

    text = (ROOT / "docs/patches.md").read_text().split("## Outside verl", 1)[1]
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    calls = []
    stock_norm = rmsnorm.rms_norm

    def counted(*args, **kwargs):
        calls.append(1)
        return stock_norm(*args, **kwargs)

    rmsnorm.rms_norm = counted
    try:
        scope = {}
        exec(compile(code, "docs/patches.md", "exec"), scope)
    finally:
        rmsnorm.rms_norm = stock_norm
    assert calls and not patches.active()
    assert all(p.grad is not None for p in scope["model"].parameters() if p.requires_grad)
