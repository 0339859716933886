"""Run the suite's `cuda`-marked tests in the given modules and write each outcome to a JSON file: the
GPU check's record of what passed on the machine (pytest's own report needs a plugin the image lacks).

    python3 benchmarks/cuda_tests.py --out $OUT/cuda-tests.json tests/test_kernels.py ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Outcomes:
    """A pytest plugin that keeps each test's outcome and, when it did not pass, the reason."""

    def __init__(self):
        self.tests: list[dict] = []

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            entry = {"nodeid": report.nodeid, "outcome": report.outcome}
            if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
                entry["message"] = report.longrepr[2]
            elif report.outcome == "failed":
                entry["message"] = str(report.longrepr).strip().splitlines()[-1][:300]
            self.tests.append(entry)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("modules", nargs="+")
    args = p.parse_args(argv)
    outcomes = Outcomes()
    code = pytest.main(["-q", "-s", "-p", "no:cacheprovider", "-m", "cuda", "--rootdir", str(ROOT), *args.modules],
                       plugins=[outcomes])
    args.out.write_text(json.dumps({"exit_status": int(code), "tests": outcomes.tests}, indent=1))
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
