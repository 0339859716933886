"""Steps 2 to 4 on the engine's samples: the engine against itself, the training side's mismatch per
spec, the layer trace."""

from __future__ import annotations

import pandas as pd

from diagnose import engine as engines, layers, metrics, tap, training, verdict


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
    with tap.engine_tap(engine.loaded_model(), engine.version, engine.platform) as calls:
        for i, p in enumerate(prompts[:o["trace_prompts"]]):
            calls.clear()
            samples += engines.sample(engine, [p], o["max_new_tokens"], o["seed"] + 1 + i, 1, eos)
            engine_values.append(tap.per_request(calls, 1)[0])
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
