"""The diagnosis, step by step (docs/patches.md, "Diagnosing your own run"): weights, the engine against
itself, the mismatch as the RL loop sees it per region subset, the layer trace, the verdict, the report."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

import patches
from patches.targets import TARGETS

from diagnose import checkpoint, engine as engines, layers, metrics, prompts as prompt_files, tap, training, verdict
from diagnose import weights as weight_check
from diagnose.errors import DiagnoseError

TARGET_CHOICES = ("auto", *TARGETS)
TRACE_PROMPTS = 4  # prompts traced layer by layer unless told: the tap copies every layer's q/k/v/out
DEFAULTS = dict(prompts=None, threshold=verdict.DEFAULT_THRESHOLD, target="auto", n_prompts=32, max_new_tokens=64,
                seed=0, small_batch=1, trace_prompts=None, reduction="eager", position_bin=16, kv_cache_gib=1,
                engine_model=None)


@dataclass
class Result:
    out: Path
    stopped_at: str | None  # "weights" when the engine's weights differ; None when every step ran
    verdict: dict | None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    # the layer trace's values, kept in memory only: "samples" (prompt, tokens), "engine" and each spec's
    # per-sequence {value: (layers, positions, heads, head_dim)}
    traced: dict = field(default_factory=dict)


def positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DiagnoseError(f"{name} {value!r}: allowed: a positive integer")
    return value


def check_options(o: dict) -> dict:
    """Every option checked before anything loads; a DiagnoseError names the first bad one."""
    o = {**DEFAULTS, **o}
    unknown = sorted(set(o) - set(DEFAULTS) - {"checkpoint", "out"})
    if unknown:
        raise DiagnoseError(f"unknown option(s) {', '.join(unknown)}; allowed: {', '.join(DEFAULTS)}")
    o["threshold"] = verdict.check_threshold(o["threshold"])
    if not (o["target"] in TARGET_CHOICES or isinstance(o["target"], patches.targets.Target)):
        raise DiagnoseError(f"target {o['target']!r}; allowed: {', '.join(TARGET_CHOICES)}")
    if o["reduction"] not in patches.REDUCTIONS:
        raise DiagnoseError(f"reduction {o['reduction']!r}; allowed: {', '.join(patches.REDUCTIONS)}")
    for name in ("n_prompts", "max_new_tokens", "small_batch", "position_bin", "kv_cache_gib"):
        positive(name, o[name])
    if o["trace_prompts"] is None:
        o["trace_prompts"] = min(TRACE_PROMPTS, o["n_prompts"])
    if not isinstance(o["trace_prompts"], int) or not 0 <= o["trace_prompts"] <= o["n_prompts"]:
        raise DiagnoseError(f"trace_prompts {o['trace_prompts']!r}; allowed: 0..n_prompts ({o['n_prompts']})")
    if o["small_batch"] > o["n_prompts"]:
        raise DiagnoseError(f"small_batch {o['small_batch']} exceeds n_prompts {o['n_prompts']}; allowed: "
                            f"1..{o['n_prompts']}")
    return o


def resolve_target(target, platform: str, log):
    """A Target table: `auto` reads the running engine's build off its compiled graph (patches.engine_table)."""
    if target != "auto":
        return patches.targets.resolve(target)
    from patches import engine_table

    return engine_table.auto_target(engine_table.EngineConfig(device=platform), log=log)


def load_prompts(o: dict, config) -> list[list[int]]:
    if o["prompts"] is not None:
        found = prompt_files.from_file(o["prompts"], o["checkpoint"], o["n_prompts"])
        if len(found) < o["n_prompts"]:
            raise DiagnoseError(f"prompts {o['prompts']}: {len(found)} rows, fewer than n_prompts {o['n_prompts']}")
        return found
    special = {t for t in (config.eos_token_id, getattr(config, "bos_token_id", None), config.pad_token_id)
               if isinstance(t, int)}
    return prompt_files.random_prompts(config.vocab_size, special, o["n_prompts"], o["seed"])


def eos_of(config) -> int | None:
    eos = config.eos_token_id
    return eos[0] if isinstance(eos, list) else eos


def engine_self(samples, prefill, small) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The engine against itself: its sampling logprobs against its own prefill of the same tokens; the
    same requests decoded at a smaller batch, over each response's tokens up to where the two runs sample
    differently."""
    rows, frames = [], []
    lengths = [len(s.prompt) for s in samples]
    frame = metrics.tokens(prefill, [s.logprobs for s in samples], lengths)
    rows.append({"comparison": "prefill_vs_sampling", **metrics.summary(frame, len(samples))})
    frames.append(frame.assign(comparison="prefill_vs_sampling"))
    common, diverged = [], 0
    for a, b in zip(samples, small):
        n = 0
        while n < min(len(a.tokens), len(b.tokens)) and a.tokens[n] == b.tokens[n]:
            n += 1
        diverged += a.tokens != b.tokens
        common.append(n)
    frame = metrics.tokens([b.logprobs[:n] for b, n in zip(small, common)],
                           [a.logprobs[:n] for a, n in zip(samples, common)], lengths)
    rows.append({"comparison": "small_batch_vs_batch", **metrics.summary(frame, len(samples)),
                 "sequences_sampled_differently": diverged})
    frames.append(frame.assign(comparison="small_batch_vs_batch"))
    return pd.DataFrame(rows), pd.concat(frames, ignore_index=True)


def mismatch(model, samples, prefill, target, reduction, position_bin, advance) -> dict[str, pd.DataFrame]:
    """Each spec's training-side logprobs of the engine's tokens, against the engine's sampling logprobs
    (what the RL loop compares) and its own prefill."""
    rows, positions, probabilities, scored = [], [], [], {}
    lengths = [len(s.prompt) for s in samples]
    for spec in training.SPECS:
        with training.numerics(spec, target, reduction):
            got = []
            for s in samples:
                got.append(training.score(model, s.prompt, s.tokens))
                advance(1)
        scored[spec] = got
        for reference, ref in ((verdict.SAMPLING, [s.logprobs for s in samples]), (verdict.PREFILL, prefill)):
            frame = metrics.tokens(got, ref, lengths)
            rows.append({"spec": spec, "reference": reference, **metrics.summary(frame, len(samples))})
            if reference == verdict.SAMPLING:
                positions.append(metrics.by_position(frame, position_bin).assign(spec=spec))
                probabilities.append(metrics.by_probability(frame).assign(spec=spec))
    return {"mismatch": pd.DataFrame(rows), "by_position": pd.concat(positions, ignore_index=True),
            "by_probability": pd.concat(probabilities, ignore_index=True),
            "logprobs": pd.DataFrame([{"spec": spec, "sequence": i, "logprobs": lp}
                                      for spec, got in scored.items() for i, lp in enumerate(got)])}


def trace(engine, model, prompts, o, target, eos, advance, kept: dict) -> dict[str, pd.DataFrame]:
    """The layer trace of the first `trace_prompts` prompts, each decoded alone with the attention tap."""
    engine_values, samples = [], []
    with tap.engine_tap(engine) as calls:
        for i, p in enumerate(prompts[:o["trace_prompts"]]):
            calls.clear()
            samples += engines.sample(engine, [p], o["max_new_tokens"], o["seed"] + 1 + i, 1, eos)
            engine_values.append(tap.assemble(calls))
            advance(1)
    kept.update(samples=samples, engine=engine_values)
    table, firsts = [], []
    for spec in training.SPECS:
        values = []
        with training.numerics(spec, target, o["reduction"]), tap.training_tap(model) as recorded:
            for s in samples:
                recorded.clear()
                training.score(model, s.prompt, s.tokens)
                values.append(tap.by_layer(recorded))
                advance(1)
        kept[spec] = values
        t, f = layers.compare(engine_values, values, spec)
        table += t
        firsts += f
    firsts = pd.DataFrame(firsts)
    return {"layers": pd.DataFrame(table), "first_divergence": firsts, "first_summary": layers.first_summary(firsts)}


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
    n, k = len(prompts), o["trace_prompts"]
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
            "engine": engine.describe(), "engine loads": str(engine_dir), "prompts": o["prompts"] or
            f"{n} random token-id prompts (seed {o['seed']})", "prompts used": n,
            "max new tokens": o["max_new_tokens"], "batches": f"{n} and {o['small_batch']}",
            "threshold": f"{o['threshold']:g}", "reduction": o["reduction"], "seed": o["seed"]}}
        bar.set_description("1/5 weights")
        bar.total = len(list(engine.loaded_model().parameters()))
        weights = weight_check.compare(engine, checkpoint_dir, advance)
        tables = {"weights": weights.table}
        if len(weights.differing):
            bar.close()
            return finish(out, run_info, tables, None, "weights", started)
        target = resolve_target(o["target"], engine.platform, log)
        run_info["settings"]["target"] = f"{target.name} ({'read off the engine' if o['target'] == 'auto' else 'named'})"
        traced = k if engine.platform == "cpu" else 0
        bar.total += 2 * n + 1 + len(training.SPECS) * n + traced * (1 + len(training.SPECS))
        bar.set_description("2/5 engine vs itself")
        samples = engines.sample(engine, prompts, o["max_new_tokens"], o["seed"], n, eos, advance)
        prefill = engines.prefill_logprobs(engine, samples)
        advance(1)
        small = engines.sample(engine, prompts, o["max_new_tokens"], o["seed"], o["small_batch"], eos, advance)
        tables["engine_self"], _ = engine_self(samples, prefill, small)
        tables["samples"] = pd.DataFrame([{"sequence": i, "prompt": s.prompt, "tokens": s.tokens,
                                           "sampling_logprobs": s.logprobs, "prefill_logprobs": p}
                                          for i, (s, p) in enumerate(zip(samples, prefill))])
        bar.set_description("3/5 training side")
        model = training.load(checkpoint_dir)
        scored = mismatch(model, samples, prefill, target, o["reduction"], o["position_bin"], advance)
        tables.update(scored)
        firsts, kept = None, {}
        if traced:
            bar.set_description("4/5 layer trace")
            tables.update(trace(engine, model, prompts, o, target, eos, advance, kept))
            firsts = tables["first_summary"]
        else:
            log(f"layer trace skipped: the attention tap reads vLLM-CPU only (this engine: {engine.describe()})")
        bar.set_description("5/5 verdict")
        decided = verdict.decide(tables["mismatch"], tables["engine_self"], target.name, o["threshold"],
                                 tables["by_position"], tables["by_probability"], firsts)
        bar.close()
        result = finish(out, run_info, tables, decided, None, started)
        result.traced = kept
        return result
    finally:
        bar.close()
        if owned:
            engine.close()


def finish(out: Path, run_info: dict, tables: dict, decided: dict | None, stopped: str | None,
           started: float) -> Result:
    from diagnose.summary import write

    run_info["settings"]["wall time"] = f"{time.perf_counter() - started:.0f} s"
    # ru_maxrss is in KiB on Linux: the process's peak resident memory, engine and training side together
    run_info["settings"]["peak memory"] = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    write(out, run_info, tables, decided, stopped)
    return Result(out, stopped, decided, tables)
