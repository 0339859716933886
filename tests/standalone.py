"""Run `python -m analysis ...` or `python -m studies report ...` in a fresh interpreter and report which
backends it imported (none: they must run on a laptop with tables copied from a cluster)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("torch", "verl", "localrl", "patches", "transformers")

_CODE = (
    "import runpy, sys\n"
    "module = sys.argv[1]\n"
    "sys.argv = [module, *sys.argv[2:]]\n"
    "try:\n    runpy.run_module(module, run_name='__main__')\n"
    "except SystemExit as stop:\n    assert stop.code == 0, stop.code\n"
    f"print('LOADED', sorted(m for m in {BACKENDS!r} if m in sys.modules))\n"
)


def run_alone(module: str, *args: str) -> subprocess.CompletedProcess:
    """stdout ends with `LOADED [...]`: the backends the run imported (none expected)."""
    return subprocess.run([sys.executable, "-c", _CODE, module, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def run_analysis_alone(*args: str) -> subprocess.CompletedProcess:
    return run_alone("analysis", *args)


def run_report_alone(study: str, *args: str) -> subprocess.CompletedProcess:
    return run_alone("studies", "report", study, *args)
