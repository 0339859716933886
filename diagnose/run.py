"""The diagnosis, step by step (docs/patches.md, "Diagnosing your own run"): weights, the engine against
itself, the mismatch as the RL loop sees it per region subset, the layer trace, the verdict, the report."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

import patches
from patches import engine_table
from patches.targets import TARGETS

from diagnose import checkpoint, engine as engines, prompts as prompt_files, steps, tap, training, verdict
from diagnose import weights as weight_check
from diagnose.errors import DiagnoseError
from diagnose.options import check_options
from diagnose.summary import write


@dataclass
class Result:
    out: Path
    stopped_at: str | None  # "weights" when the engine's weights differ; None when every step ran
    verdict: dict | None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    # the layer trace's values, kept in memory only: "samples" (prompt, tokens), "engine" and each spec's
    # per-sequence {value: (layers, positions, heads, head_dim)}
    traced: dict = field(default_factory=dict)


def resolve_target(target, platform: str, log):
    """A Target table: `auto` reads the running engine's build off its compiled graph (patches.engine_table)."""
    if target != "auto":
        return patches.targets.resolve(target)
    return engine_table.auto_target(engine_table.EngineConfig(device=platform), log=log)


def usable_name(target) -> str:
    """The name to pass to `patches.apply`: an auto table's named target where it equals one, else "auto"."""
    named = target.name.removeprefix("auto:")
    return named if named in TARGETS else "auto"


def load_prompts(o: dict, config) -> list[list[int]]:
    if o["prompts"] is not None:
        return prompt_files.from_file(o["prompts"], o["checkpoint"], o["n_prompts"])  # all rows if fewer
    special = {t for t in (config.eos_token_id, getattr(config, "bos_token_id", None), config.pad_token_id)
               if isinstance(t, int)}
    return prompt_files.random_prompts(config.vocab_size, special, o["n_prompts"], o["seed"])


def eos_of(config) -> int | None:
    eos = config.eos_token_id
    return eos[0] if isinstance(eos, list) else eos


def run(checkpoint_dir, out, *, engine=None, **options) -> Result:
    """The diagnosis of `checkpoint_dir` against vLLM, written to `out`. `engine`: a running
    `diagnose.engine.Engine` to diagnose instead of starting one (e.g. after a weight sync); options as
    `python -m diagnose --help` lists them (underscores for dashes)."""
    o = check_options({"checkpoint": checkpoint_dir, "out": out, **options})
    started = time.perf_counter()
    config = checkpoint.check(checkpoint_dir)
    engine_dir = o["engine_model"] or checkpoint_dir
    if o["engine_model"] is not None:
        checkpoint.check(engine_dir)
    prompts = load_prompts(o, config)
    longest = max(map(len, prompts)) + o["max_new_tokens"]
    limit = getattr(config, "max_position_embeddings", longest)
    if longest > limit:
        raise DiagnoseError(f"prompts of up to {longest - o['max_new_tokens']} tokens + max_new_tokens "
                            f"{o['max_new_tokens']} exceed the model's {limit} positions")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eos = eos_of(config)
    n = len(prompts)
    k, o["small_batch"] = min(o["trace_prompts"], n), min(o["small_batch"], n)  # a file may hold fewer prompts
    owned = engine is None
    if owned:
        engine = engines.start(engine_dir, max_model_len=min(limit, -(-longest // 16) * 16), max_num_seqs=n,
                               seed=o["seed"], kv_cache_gib=o["kv_cache_gib"])
    bar = tqdm(total=0, desc="diagnose", unit="step", dynamic_ncols=True, mininterval=1.0)

    def advance(count):
        bar.update(count)

    def log(msg):
        tqdm.write(str(msg))

    try:
        run_info = {"checkpoint": Path(checkpoint_dir).resolve(), "settings": {
            "engine": engine.describe(), "engine loads": str(engine_dir), "prompts": str(o["prompts"] or "") or
            f"{n} random token-id prompts (seed {o['seed']})", "prompts used": n,
            "max new tokens": o["max_new_tokens"], "batches": f"{n} and {o['small_batch']}",
            "threshold": f"{o['threshold']:g}", "reduction": o["reduction"], "seed": o["seed"]}}
        bar.set_description("1/5 weights")
        bar.total = len(list(engine.loaded_model().parameters()))
        weights = weight_check.compare(engine, checkpoint_dir, advance)
        tables = {"weights": weights.table}
        if len(weights.differing):
            return finish(out, run_info, tables, None, "weights", started)
        target = resolve_target(o["target"], engine.platform, log)
        how = "read off the engine" if o["target"] == "auto" else "named"
        run_info["settings"]["target"] = f"{target.name} ({how})"
        no_trace = tap.unavailable(engine.version, engine.platform) if k else "--trace-prompts 0"
        traced = 0 if no_trace else k
        run_info["settings"]["layer trace"] = (f"not run: {no_trace}" if no_trace else
                                               f"{k} prompts, each decoded alone")
        bar.total += 2 * n + 1 + len(training.SPECS) * n + traced * (1 + len(training.SPECS))
        bar.set_description("2/5 engine vs itself")
        samples = engines.sample(engine, prompts, o["max_new_tokens"], o["seed"], n, eos, advance)
        prefill = engines.prefill_logprobs(engine, samples)
        advance(1)
        small = engines.sample(engine, prompts, o["max_new_tokens"], o["seed"], o["small_batch"], eos, advance)
        tables["engine_self"], _ = steps.engine_self(samples, prefill, small)
        tables["samples"] = pd.DataFrame([{"sequence": i, "prompt": s.prompt, "tokens": s.tokens,
                                           "sampling_logprobs": s.logprobs, "prefill_logprobs": p}
                                          for i, (s, p) in enumerate(zip(samples, prefill))])
        bar.set_description("3/5 training side")
        model = training.load(checkpoint_dir)
        scored = steps.mismatch(model, samples, prefill, target, o["reduction"], o["position_bin"], advance)
        tables.update(scored)
        firsts, kept = None, {}
        if traced:
            bar.set_description("4/5 layer trace")
            tables.update(steps.trace(engine, model, prompts, o, target, eos, advance, kept))
            firsts = tables["first_summary"]
        else:
            log(f"layer trace not run: {no_trace}")
        bar.set_description("5/5 verdict")
        decided = verdict.decide(tables["mismatch"], tables["engine_self"], usable_name(target), o["threshold"],
                                 tables["by_position"], tables["by_probability"], firsts)
        result = finish(out, run_info, tables, decided, None, started)
        result.traced = kept
        return result
    finally:
        bar.close()
        if owned:
            engine.close()


def finish(out: Path, run_info: dict, tables: dict, decided: dict | None, stopped: str | None,
           started: float) -> Result:
    run_info["settings"]["wall time"] = f"{time.perf_counter() - started:.0f} s"
    # ru_maxrss is in KiB on Linux: the process's peak resident memory, engine and training side together
    run_info["settings"]["peak memory"] = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    write(out, run_info, tables, decided, stopped)
    return Result(out, stopped, decided, tables)
