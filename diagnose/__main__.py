"""`python -m diagnose CHECKPOINT_DIR --out DIR [options]`: bad input is one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import sys

from diagnose.errors import DiagnoseError
from diagnose.options import DEFAULTS, TARGET_CHOICES, TRACE_PROMPTS
from diagnose.run import run
from diagnose.verdict import DEFAULT_THRESHOLD, THRESHOLD_SOURCE


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        print(f"diagnose: {message}", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m diagnose", description="Diagnose the training-inference mismatch of a Qwen2 / Qwen2.5 "
                                                      "/ Qwen3 checkpoint against your vLLM.")
    p.add_argument("checkpoint", help="a Hugging Face checkpoint directory (config.json + safetensors)")
    p.add_argument("--out", required=True, help="the report folder (summary.md, figure, *.parquet)")
    p.add_argument("--prompts", help="prompts: .jsonl or .parquet, rows with prompt_token_ids, messages or prompt "
                                     "(default: random token ids)")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"k3 above which the verdict says the mismatch matters (default {DEFAULT_THRESHOLD}: "
                        f"{THRESHOLD_SOURCE})")
    p.add_argument("--target", default="auto", help=f"what the aligned regions round like: {', '.join(TARGET_CHOICES)} "
                                                    "(auto: read off the installed engine's compiled graph)")
    p.add_argument("--n-prompts", type=int, default=DEFAULTS["n_prompts"], help="prompts sampled (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULTS["max_new_tokens"],
                   help="response length limit (default %(default)s; sampling stops at eos)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="prompt choice and sampling seeds")
    p.add_argument("--small-batch", type=int, default=DEFAULTS["small_batch"],
                   help="the second decode batch size of the engine's self-check (default %(default)s)")
    p.add_argument("--trace-prompts", type=int, help=f"prompts traced layer by layer (default {TRACE_PROMPTS}, at "
                                                      "most --n-prompts; 0: no trace)")
    p.add_argument("--reduction", default=DEFAULTS["reduction"], help="the norms' summation order on the training "
                                                                       "side (patches.REDUCTIONS; default eager)")
    p.add_argument("--position-bin", type=int, default=DEFAULTS["position_bin"], help="positions per bin")
    p.add_argument("--kv-cache-gib", type=int, default=DEFAULTS["kv_cache_gib"], help="vLLM-CPU's KV cache (GiB)")
    p.add_argument("--engine-model", help="the directory the engine loads, if not CHECKPOINT_DIR (e.g. the weights "
                                          "your trainer exported for the engine)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    checkpoint, out = args.pop("checkpoint"), args.pop("out")
    try:
        result = run(checkpoint, out, **args)
    except DiagnoseError as err:
        print(f"diagnose: {err}", file=sys.stderr)
        return 2
    print(f"wrote {result.out / 'summary.md'}" + (f" (stopped at {result.stopped_at})" if result.stopped_at else ""))
    return 1 if result.stopped_at else 0


if __name__ == "__main__":
    sys.exit(main())
