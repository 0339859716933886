"""Diagnose a user's own run: their Qwen2/Qwen2.5/Qwen3 checkpoint against the vLLM they roll out with
(docs/patches.md, "Diagnosing your own run"). `python -m diagnose CHECKPOINT_DIR --out DIR`, or `run`."""

from diagnose.errors import DiagnoseError
from diagnose.options import DEFAULTS
from diagnose.run import Result, run

__all__ = ["run", "Result", "DiagnoseError", "DEFAULTS"]
