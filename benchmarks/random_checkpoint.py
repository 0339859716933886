"""A random Qwen2 / Qwen3 checkpoint with the task's tokenizer, for probing an engine at a real shape
without downloading a model: `python -m localrl probe --engine vllm --model DIR` reads it.

    python benchmarks/random_checkpoint.py --arch qwen2 --shape qwen2.5-1.5b --out /tmp/ckpt

HF's init with the GEMM weights scaled x3 (std 0.06) and norm weights spread around 1: at std 0.02 the
distributions are near uniform and the mismatch vanishes into noise (benchmarks/bench_vllm_alignment.py
uses the same recipe). Shapes are localrl.roundmap.SHAPES' (the vocabulary is the tokenizer's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@torch.no_grad()
def sharpen(model) -> None:
    """The recipe: GEMM weights x3 (std 0.06), norm weights 1 + 0.2 N(0, 1) (trained norms are not all ones)."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.add_(0.2 * torch.randn_like(p))
        elif p.dim() == 2:
            p.mul_(3.0)


def write(arch: str, shape: str, out: str | Path, seed: int = 0, device: str = "cpu") -> Path:
    from transformers import AutoModelForCausalLM

    from localrl.roundmap import model_config
    from localrl.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    config = model_config(arch, shape, vocab_size=len(tokenizer))
    config.eos_token_id, config.pad_token_id, config.bos_token_id = (tokenizer.eos_token_id, tokenizer.pad_token_id,
                                                                     None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    sharpen(model)
    out = Path(out)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv=None) -> int:
    from localrl.roundmap import SHAPES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=("qwen2", "qwen3"), required=True)
    p.add_argument("--shape", choices=tuple(SHAPES), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the random init runs (cuda: faster at real shapes)")
    args = p.parse_args(argv)
    print(write(args.arch, args.shape, args.out, args.seed, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
