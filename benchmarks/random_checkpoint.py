"""A random Qwen2 / Qwen3 checkpoint with the task's tokenizer, for probing an engine at a real shape
without downloading a model: `python -m studies run probe --engine vllm --model DIR` reads it.

    python benchmarks/random_checkpoint.py --arch qwen2 --shape qwen2.5-1.5b --out /tmp/ckpt

The recipe and the shapes are the rig's (localrl.models.write_random_checkpoint, REAL_SHAPES).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from localrl.models import REAL_SHAPES, write_random_checkpoint  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=("qwen2", "qwen3"), required=True)
    p.add_argument("--shape", choices=tuple(REAL_SHAPES), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the random init runs (cuda: faster at real shapes)")
    args = p.parse_args(argv)
    print(write_random_checkpoint(args.arch, args.shape, args.out, args.seed, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
