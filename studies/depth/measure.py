"""python -m studies run depth --out FILE.json [--prompts N]: the vLLM alignment benchmark at 28 layers."""

from __future__ import annotations

DEEP_SHAPES = ["qwen2-256x28", "qwen3-256x28"]


def main(argv: list[str] | None = None) -> int:
    from studies.vllm_alignment import measure

    return measure.main(["--shapes", *DEEP_SHAPES, "--no-local", *(argv or [])])
