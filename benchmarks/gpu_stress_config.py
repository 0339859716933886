"""Write the config gpu_stress.sh runs: experiments/gpu_stress.yaml with its results under OUT, or,
with --quick, the same stages shrunk to a dry run of seconds per stage (tiny models, 2 steps)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

QUICK = {
    "models": ["qwen3-g"], "ablations": ["none", "all"], "seeds": [0], "steps": 2,
    "task": {"n_train": 64, "n_test": 16, "min_ops": 1, "max_ops": 1},
    "model_specs": {"qwen3-g": {"arch": "qwen3", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                                "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128}},
    "warmstart": {"steps": 5, "batch_size": 8, "eval_size": 8},
    "rl": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_response_length": 6, "ppo_mini_batch_size": 2,
           "checkpoint_every": 1, "test_every": 0},
}


def merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--profile", default="experiments/gpu_stress.yaml")
    p.add_argument("--results", required=True, help="results_dir of the run (gpu_stress.sh: $OUT)")
    p.add_argument("--out", required=True, help="where to write the config")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    cfg = yaml.safe_load(Path(args.profile).read_text())
    if args.quick:
        cfg = merge(cfg, QUICK)
    cfg["results_dir"] = args.results
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(yaml.safe_dump(cfg, sort_keys=False))
    # one line each for gpu_stress.sh: models, ablations, seeds, steps
    print(" ".join(cfg["models"]), " ".join(cfg["ablations"]), " ".join(map(str, cfg["seeds"])), cfg["steps"], sep="\n")


if __name__ == "__main__":
    main()
