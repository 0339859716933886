"""transformers' own Qwen2 / Qwen3 model tests under every alignment spec (make test-transformers-models).

    python tests/upstream/run_models.py --src /path/to/transformers [--specs none,rope,swiglu,rmsnorm,all]

Runs `tests/models/qwen2` and `tests/models/qwen3` of a transformers source checkout once per spec,
in this environment (its python and its installed transformers; the checkout gives only its tests),
with one worker and tests/upstream/rla_upstream_plugin.py loaded (what it changes in transformers'
harness: its docstring). Stock ("none") always runs first: it is the reference. Prints a table spec x
passed / failed / skipped and exits 1 if a spec fails a test that stock passes (listing them), 2 if the
checkout is missing or lacks the tests. Not a test module: the suite's `pytest` does not collect it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEST_DIRS = ("tests/models/qwen2", "tests/models/qwen3")
SPECS = ("none", "rope", "swiglu", "rmsnorm", "all")


def refuse(message: str) -> None:
    print(f"make test-transformers-models: {message}", file=sys.stderr)
    sys.exit(2)


def check_checkout(src: str | None) -> Path:
    expected = ("set TRANSFORMERS_SRC to the root of a transformers source checkout (a git clone of "
                "huggingface/transformers, ideally at the tag of the installed release), the folder holding "
                f"{' and '.join(TEST_DIRS)}: make test-transformers-models TRANSFORMERS_SRC=/path/to/transformers")
    if not src:
        refuse(f"TRANSFORMERS_SRC is not set; {expected}")
    root = Path(src).expanduser().resolve()
    if not root.is_dir():
        refuse(f"TRANSFORMERS_SRC={src} is not a folder; {expected}")
    missing = [d for d in TEST_DIRS if not (root / d).is_dir()]
    if missing or not (root / "tests" / "__init__.py").is_file():
        refuse(f"TRANSFORMERS_SRC={src} lacks {', '.join(missing) or 'tests/__init__.py'}; {expected}")
    return root


def run_spec(root: Path, spec: str, target: str, out: Path, deps: list[str],
             extra: list[str]) -> tuple[dict, float, int]:
    junit = out / f"{spec.replace(',', '+')}.xml"
    report = out / f"{spec.replace(',', '+')}.json"
    report.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*deps, str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    command = [sys.executable, "-m", "pytest", "-c", os.devnull, f"--rootdir={root}", "--noconftest",
               "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "rla_upstream_plugin",
               f"--rla-spec={spec}", f"--rla-target={target}", f"--rla-outcomes={report}", f"--junitxml={junit}",
               "-q", "-rfE",
               "-W", "ignore::pytest.PytestUnknownMarkWarning",
               *extra, *TEST_DIRS]
    print(f"== spec {spec}: {' '.join(command)}  (in {root})", flush=True)
    start = time.monotonic()
    status = subprocess.call(command, cwd=root, env=env)
    wall = time.monotonic() - start
    if not report.is_file():
        print(f"spec {spec}: pytest exited {status} without a report", file=sys.stderr)
        sys.exit(status or 1)
    return json.loads(report.read_text()), wall, status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=os.environ.get("TRANSFORMERS_SRC"), help="transformers source checkout")
    parser.add_argument("--specs", default=",".join(SPECS), help="specs to run, ';'-separated when a spec has commas "
                        "(default: none;rope;swiglu;rmsnorm;all, also accepted comma-separated)")
    parser.add_argument("--target", default="vllm")
    parser.add_argument("--out", default=".cache/transformers-models",
                        help="where each spec's outcomes (JSON) and JUnit report go")
    parser.add_argument("--deps", action="append", default=[], help="a folder of test-only packages (PYTHONPATH)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    root = check_checkout(args.src)
    import transformers

    sep = ";" if ";" in args.specs else ","
    specs = [s.strip() for s in args.specs.split(sep) if s.strip()]
    specs = ["none"] + [s for s in specs if s != "none"]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    deps = [str(Path(d).resolve()) for d in args.deps]
    print(f"transformers {transformers.__version__} ({Path(transformers.__file__).parent}); tests from {root}")

    results, walls = {}, {}
    for spec in specs:
        results[spec], walls[spec], _ = run_spec(root, spec, args.target, out, deps, args.pytest_args)

    stock = results["none"]
    regressions = {}
    rows = [("spec", "passed", "failed", "skipped", "stated differences", "failed where stock passes", "wall s")]
    for spec in specs:
        counts = {k: sum(v == k for v in results[spec].values()) for k in ("passed", "failed", "skipped", "differs")}
        new = sorted(t for t, o in results[spec].items() if o == "failed" and stock.get(t) == "passed")
        regressions[spec] = new
        rows.append((spec if spec != "none" else "none (stock)",
                     *(str(counts[k]) for k in ("passed", "failed", "skipped", "differs")),
                     str(len(new)) if spec != "none" else "-", f"{walls[spec]:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"\ntransformers {transformers.__version__}, target {args.target}, tests of {root}:")
    for i, row in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    bad = {s: t for s, t in regressions.items() if t}
    for spec, tests in bad.items():
        print(f"\nspec {spec} fails {len(tests)} test(s) that stock passes:")
        for test in tests:
            print(f"  {test}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
