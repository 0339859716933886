"""The training side against the real engine: vLLM's CPU build samples, HF + patches teacher-forces
(studies/vllm_alignment/page.md)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from localrl import Engine, unavailable_reason
from studies._shared.scoring import grid, training_model
from studies._shared.vllm_cpu import (NEW_TOKENS, PROMPTS, SHAPES, header, kept_checkpoint, make_checkpoint, prompts,
                                      sample_in_child)


def sample_with_local_engine(model_dir: str, n_prompts: int = PROMPTS) -> dict:
    """The local engine's samples, scored against its own full forward of prompt + response (as vLLM's decode
    logprobs equal its prompt_logprobs); its decode differs from that by `decode_vs_prefill`."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = Engine(model.config, eos_id=-1, pad_id=0)  # no eos: every response has NEW_TOKENS tokens
    engine.load_weights(model.state_dict())
    ps = prompts(n=n_prompts)
    roll = engine.generate(ps, NEW_TOKENS, generator=torch.Generator().manual_seed(0))
    responses = roll.responses.tolist()
    prefill = []
    for p, r in zip(ps, responses):
        logits = engine.model(torch.tensor([p + r]), torch.arange(len(p + r))[None])[0].float()
        prefill.append(torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p + r) - 1), r].tolist())
    decode = torch.tensor([row[:NEW_TOKENS].tolist() for row in roll.logprobs]).double()
    gap = (decode - torch.tensor(prefill).double()).abs().mean().item()
    return {"prompts": ps, "responses": responses, "logprobs": prefill, "decode_vs_prefill": gap}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run vllm_alignment", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--prompts", type=int, default=PROMPTS, help=f"prompts per shape (default {PROMPTS})")
    args = p.parse_args(argv)
    reason = unavailable_reason()
    results = {**header("vllm_alignment", argv), "prompts": args.prompts, "new_tokens": NEW_TOKENS, "shapes": {}}
    for name in args.shapes:
        with tempfile.TemporaryDirectory() as tmp:
            make_checkpoint(SHAPES[name], tmp)
            entry = {"shape": SHAPES[name]}
            if reason is None:
                model_dir = kept_checkpoint(tmp)
                samples = sample_in_child(model_dir, args.prompts)
                import vllm  # vLLM is optional: this study records its local-engine rows without it

                entry["vllm"] = {"version": vllm.__version__, "startup_s": samples["startup_s"], "rows": {}}
                for kernels in ("hf", "attention"):
                    entry["vllm"]["rows"][kernels] = grid(training_model(model_dir, kernels), samples, ("vllm",),
                                                          "vllm-cpu")
                    print_rows(f"{name} vs vLLM-CPU, training attention {kernels}", entry["vllm"]["rows"][kernels])
            else:
                entry["vllm"] = {"skipped": reason}
                print(f"{name}: vLLM-CPU not run: {reason}")
            if "rope_parameters" in SHAPES[name]:
                entry["local"] = {"skipped": "the local engine builds the default RoPE table only"}
            else:
                samples = sample_with_local_engine(tmp, args.prompts)
                entry["local"] = {"decode_vs_prefill_mean_abs": samples["decode_vs_prefill"],
                                  "rows": grid(training_model(tmp, "local"), samples, ("vllm-cpu",), "vllm")}
                print_rows(f"{name} vs the local engine (piecewise), shared kernels", entry["local"]["rows"])
            results["shapes"][name] = entry
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"  {'setting':22s} {'order':12s} {'k3':>9s} {'mean|d|':>9s} {'max|d|':>9s} {'bit-equal':>9s}")
    for r in rows:
        print(f"  {r['spec'] + ' / ' + r['target']:22s} {r['reduction']:12s} {r['k3']:9.2e} {r['mean_abs']:9.2e} "
              f"{r['max_abs']:9.2e} {r['bit_equal']:9.1%}")


if __name__ == "__main__":
    sys.exit(main())
