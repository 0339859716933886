"""The studies room: one declaration per study (its study.yaml) and one command, every study a Snakemake target, published outputs with
their provenance, and the rooms' import rules (no circle, nothing imports a study, no private function
called from another module, reports without torch)."""

import ast
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from studies import STUDIES
from studies.provenance import PROVENANCE, publish

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "benchmarks", "localrl", "patches", "rla", "studies", "tinyqwen", "verlrun")
REQUIRED = {"probe", "scaling", "gradprobe", "geo_rs", "calibration", "stress", "treatments", "vllm_alignment"}


def test_list_prints_one_json_object_per_study():
    out = subprocess.run([sys.executable, "-m", "studies", "list"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert REQUIRED <= {r["name"] for r in rows} and len(rows) == len(STUDIES)
    for row in rows:
        assert row["target"] == row["name"] and row["outputs"] == [f"{row['folder']}/published"]


def test_the_listed_studies_are_the_declared_folders():
    """Each folder of studies/ with a study.yaml is a study, each variant a subfolder of its parent's, each
    with its page; nothing else is."""
    out = subprocess.run([sys.executable, "-m", "studies", "list"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    declared = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "studies").glob("*/study.yaml")}
    assert {r["folder"] for r in rows if not r["variant_of"]} == declared
    for row in rows:
        assert (ROOT / row["folder"] / "page.md").is_file(), row["name"]
        if row["variant_of"]:
            assert Path(row["folder"]).parent == Path(STUDIES[row["variant_of"]].folder)


def test_a_bad_declaration_names_its_file_key_and_the_allowed_values(tmp_path):
    from studies import declared

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "study.yaml").write_text("summary: s\npublish: {sources: [a]}\nper_machin: true\n")
    with pytest.raises(ValueError, match=r"x/study.yaml: unknown key\(s\) \['per_machin'\] in \(top\); allowed: .*per_machine"):
        declared(tmp_path)
    (tmp_path / "x" / "study.yaml").write_text("summary: s\npublish: {sources: [a]}\nsteps: {m: {shell: x, threads: many}}\n")
    with pytest.raises(ValueError, match=r"x/study.yaml: steps.m.threads = 'many'"):
        declared(tmp_path)
    (tmp_path / "x" / "study.yaml").write_text("summary: s\npublish: {sources: [a]}\nsettings: {o: []}\nmicro: {p: []}\n")
    with pytest.raises(ValueError, match=r"x/study.yaml: micro key\(s\) \['p'\] of 'x' are no settings of it; its settings: o"):
        declared(tmp_path)


def test_every_study_target_plans():
    """`snakemake -n` plans every study's target from the repository root (one process for all; each
    publishing rule forced, so that a study published in this checkout is planned too)."""
    done = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "2", *STUDIES, "--forcerun",
                           *STUDIES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in STUDIES:  # each target's publish rule is in the plan
        assert f"rule {name}:" in done.stdout + done.stderr, name
    # the grid studies' grids are jobs of this DAG (modules), not a Snakemake run inside a job
    commands = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("Shell command:")]
    assert commands and not [c for c in commands if "snakemake --" in c.replace("'snakemake --cores N", "")]
    assert "rule geo_rs_grid_train:" in done.stdout + done.stderr


def test_the_studies_rules_name_no_study():
    """The studies' rules are made from their declarations: no study is named in them (the grid's own rules
    name its config's keys, `probe` among them, and its default config, experiments/tiny.yaml)."""
    text = "\n".join((ROOT / "workflows/rules" / f).read_text() for f in ("studies.smk", "declarations.smk"))
    words = set(re.findall(r"\w+", text))
    assert not sorted(set(STUDIES) & words)


def test_a_bad_study_name_is_named():
    done = subprocess.run([sys.executable, "-m", "studies", "run", "scalling"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "scalling" in done.stderr and "scaling" in done.stderr


@pytest.mark.parametrize("name, says", [("gpu_check", "measured by benchmarks/gpu_check.sh"),
                                        ("stress", "its grid's Snakemake DAG")])
def test_a_study_without_a_run_step_says_what_measures_it(name, says, capsys):
    from studies.__main__ import main

    assert main(["run", name]) == 2
    assert says in capsys.readouterr().err


def test_run_describes_the_machine_from_the_measuring_process_after_it_ran(tmp_path, monkeypatch):
    """`run NAME --machine FILE`: the study gets its own options alone, and FILE is written once it returned
    (the workflow's measure rules use this instead of a second process)."""
    import studies.__main__ as cli

    seen = []

    def measure(argv):
        seen.append((list(argv), (tmp_path / "machine.json").exists()))
        return 3

    monkeypatch.setitem(sys.modules, STUDIES["depth"].measure, types.SimpleNamespace(main=measure))
    status = cli.main(["run", "depth", "--layers", "4", "--machine", str(tmp_path / "machine.json"), "--out", "x"])
    assert status == 3 and seen == [(["--layers", "4", "--out", "x"], False)]
    record = json.loads((tmp_path / "machine.json").read_text())
    assert record["aten_isa"] and record["inductor_isa"] and record["versions"]["torch"]


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_published_outputs_carry_their_provenance(name):
    folder = ROOT / STUDIES[name].published
    records = sorted(folder.rglob(PROVENANCE))
    assert records, f"{name}: nothing published in {folder}"
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip() == "true"
    for path in records:  # one, or one per machine kind (Study.per_machine)
        record = json.loads(path.read_text())
        assert record["command"] and len(record["commit"]) == 40 and int(record["commit"], 16) >= 0
        if not shallow:  # a shallow clone lacks the older commits
            known = subprocess.run(["git", "cat-file", "-e", f"{record['commit']}^{{commit}}"], cwd=ROOT)
            assert known.returncode == 0, f"{path}: commit {record['commit']} is not a commit of this repository"
        here = path.parent
        on_disk = sorted(str(p.relative_to(here)) for p in here.rglob("*") if p.is_file() and p.name != PROVENANCE)
        assert on_disk == sorted(record["files"]), path
    if STUDIES[name].per_machine:
        assert all(p.parent.parent == folder for p in records)


def test_publish_replaces_the_folder_whole_and_keeps_it_on_failure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], check=True)
    made = tmp_path / "made"
    (made / "sub").mkdir(parents=True)
    (made / "table.csv").write_text("a\n1\n")
    (made / "sub" / "fig.png").write_bytes(b"png")
    (made / "scratch.tmp").write_text("x")
    dest = tmp_path / "published"
    publish([str(made)], dest, command="snakemake x", engine="e", attention="a", machine_file=None,
            benchmarks=[], include=("*.csv", "*.png"))
    record = json.loads((dest / PROVENANCE).read_text())
    assert record["files"] == ["sub/fig.png", "table.csv"] and not (dest / "scratch.tmp").exists()
    assert record["machine"]["cpu"] and record["engine"] == "e" and "uncommitted_changes" in record
    by_kind = publish([str(made)], dest, command="c", engine="e", attention="a", machine_file=None, benchmarks=[],
                      per_machine=True)  # beside the earlier publication, in the machine kind's folder
    assert by_kind.parent.parent == dest and (by_kind.parent / "table.csv").exists() and (dest / "table.csv").exists()
    with pytest.raises(FileNotFoundError, match="missing"):
        publish([str(made), str(tmp_path / "missing")], dest, command="c", engine="e", attention="a",
                machine_file=None, benchmarks=[])
    assert (dest / "table.csv").read_text() == "a\n1\n"  # the earlier publication is still there


def test_the_machine_kind_names_the_isa_and_amx():
    from studies.provenance import machine_class

    assert machine_class({"aten_isa": "AVX512", "inductor_isa": "avx512 avx512_vnni amx_tile"}) == "avx512-amx"
    assert machine_class({"aten_isa": "AVX2", "inductor_isa": "avx2"}) == "avx2"
    assert machine_class({"aten_isa": "AVX512", "gpu": "NVIDIA H200"}) == "cuda"


def _imports(package: str) -> dict[str, set[str]]:
    """{module: project modules it imports, at any depth of the file (also inside functions)}."""
    graph = {}
    for path in (ROOT / package).rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names += [f"{node.module}.{a.name}" for a in node.names]
            found |= {n for n in names if n.split(".")[0] in PACKAGES}
        graph[module] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    modules = set(graph)
    edges = {m: {t for t in ts if t in modules and t != m and not m.startswith(t + ".")} for m, ts in graph.items()}
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in edges[m]:
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(modules):
        if m not in state and (found := visit(m)):
            return found
    return None


@pytest.mark.parametrize("package", ["localrl", "studies", "analysis", "tinyqwen"])
def test_no_import_circle(package):
    assert _cycle(_imports(package)) is None


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_nothing_outside_studies_imports_a_study():
    for package in PACKAGES:
        if package == "studies":
            continue
        bad = {m: sorted(t for t in ts if t.startswith("studies")) for m, ts in _imports(package).items()}
        assert not {m: t for m, t in bad.items() if t}, package


@pytest.mark.parametrize("package, never", [("verlrun", ("localrl",)), ("tinyqwen", ("localrl", "verlrun"))])
def test_the_backends_meet_only_in_what_both_train_on(package, never):
    """The task, tokenizer and model builders both backends need are tinyqwen's: the verl backend imports
    nothing of the rig, and tinyqwen neither backend."""
    bad = {m: sorted(t for t in ts if t.split(".")[0] in never) for m, ts in _imports(package).items()}
    assert not {m: t for m, t in bad.items() if t}


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                    # a package's private module (patches._precision) is its own business; a private name
                    # of another module is not
                    bad += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")
                            and not (ROOT / node.module.replace(".", "/") / f"{a.name}.py").exists()]
    assert not bad


def test_reports_and_judges_import_no_torch():
    reports = sorted({s.report for s in STUDIES.values() if s.report})
    code = ("import importlib, sys\n"
            f"for m in {reports!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'localrl', 'patches', 'vllm') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _outputs(*targets: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--summary", *targets], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return sorted({line.split("\t")[0] for line in done.stdout.splitlines()[1:] if line.strip()})


def _tracked(paths: list[str]) -> list[str]:
    """The paths git would track: not ignored (`git check-ignore` names the ignored ones)."""
    ignored = subprocess.run(["git", "check-ignore", "--stdin"], cwd=ROOT, input="\n".join(paths),
                             capture_output=True, text=True).stdout.split()
    return sorted(set(paths) - set(ignored))


def test_make_run_writes_no_tracked_file():
    """Every file the default target (`make run`) writes is ignored by git, so a run leaves the checkout
    as it was; a study's target writes its tracked folder, which this check does see."""
    outputs = _outputs()
    assert len(outputs) > 20 and not _tracked(outputs)
    assert _tracked(["studies/scaling/published/provenance.json"])  # the check tells tracked from ignored
