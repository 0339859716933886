"""Run `python -m analysis ...` in a fresh interpreter and report which backends it imported."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("torch", "verl", "localrl", "patches", "transformers")

_CODE = (
    "import runpy, sys\n"
    "sys.argv = ['analysis', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('analysis', run_name='__main__')\n"
    "except SystemExit as stop:\n    assert stop.code == 0, stop.code\n"
    f"print('LOADED', sorted(m for m in {BACKENDS!r} if m in sys.modules))\n"
)


def run_analysis_alone(*args: str) -> subprocess.CompletedProcess:
    """stdout ends with `LOADED [...]`: the backends the run imported (none expected)."""
    return subprocess.run([sys.executable, "-c", _CODE, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
