"""A fresh process with a fresh vLLM engine: `python -m tests.vllm_worker MODEL_DIR PROMPTS_JSON OUT_PT`.

Starts `localrl.vllm_engine.VllmEngine` on the checkpoint, runs `tests.vllm_setup.engine_results` on
the prompts and saves them, with whether the engine loaded a compile saved before (`loaded_compile`)
(tests/test_vllm_engine.py compares them with another process's)."""

import json
import sys

import torch


def main(model_dir: str, prompts_json: str, out: str) -> None:
    torch.set_num_threads(1)
    from localrl.vllm_engine import VllmEngine
    from tests.vllm_setup import engine_results
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = VllmEngine(model_dir, tok.eos_token_id, tok.pad_token_id, log=lambda m: print(m, file=sys.stderr))
    results = engine_results(engine, json.load(open(prompts_json)))
    torch.save({**results, "loaded_compile": engine.loaded_compile}, out)
    engine.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
