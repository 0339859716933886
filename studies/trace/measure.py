"""Layer by layer, where the training side and vLLM-CPU first differ, and how the difference grows
(studies/trace/page.md): both sides' attention ops tapped (diagnose/tap.py), compared with the engine's decode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

import patches
from diagnose.tap import VALUES, by_layer, engine_tap, per_request, training_tap
from localrl import attention_isa
from rla.files import write_text
from studies._shared.scoring import training_model
from studies._shared.vllm_cpu import (NEW_TOKENS, VERSIONS, engine, in_child, kept_checkpoint, kept_points,
                                      make_checkpoint, point_options, prompts, sample_in_child, sampling, start)
from studies.provenance import commit
from tinyqwen.models import HIDDEN_256

ENGINE_PREFILL = "engine_prefill"
# the training side's settings: (training kernels, region subset, summation order, region implementation)
SETTINGS = {
    "stock": ("hf", "none", "eager", "eager"),
    "all": ("attention", "all", "inductor_cpu", "eager"),  # the depth study's goal condition
    # the same with a trainable attention rounding where vLLM-CPU's AMX kernel does (localrl/amx_attention.py)
    "all_amx_rounding": ("amx_rounding", "all", "inductor_cpu", "eager"),
    # and with vLLM-CPU's GEMMs
    "all_amx_rounding_engine_gemm": ("amx_rounding_engine_gemm", "all", "inductor_cpu", "eager"),
    "all_engine_kernels": ("engine", "all", "inductor_cpu", "eager"),  # with vLLM-CPU's own attention and GEMMs
    # the same, the regions compiled by Inductor (patches' impl="fused"): the same rounding locations
    "all_engine_kernels_fused": ("engine", "all", "inductor_cpu", "fused"),
}
# two training sides compared with each other, as the engine with one: (setting, its reference setting)
PAIRS = {"fused_vs_eager": ("all_engine_kernels_fused", "all_engine_kernels")}
LAYERS, PROMPTS = 28, 32
BATCHES = (32, 8, 4, 1)  # the engine's decode batch sizes (32: all prompts at once, as the other studies sample)


def engine_side(model_dir: str, out: str, n_prompts: int, prompt_seed: int, batch: int) -> None:
    """Run in a fresh process: vLLM-CPU samples the prompts `batch` at a time, then prefills each prompt +
    response alone; both passes' attention values and logprobs go to `out` (torch.save)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the tap sees the engine's calls in this process
    # vLLM is optional: this module imports without it
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sample, prefill = sampling(), SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    ps = prompts(seed=prompt_seed, n=n_prompts)
    llm = engine(model_dir)
    with engine_tap(llm.apply_model(lambda model: model)[0], vllm.__version__, "cpu") as calls:
        sampled, decode = [], []
        for chunk in (ps[i:i + batch] for i in range(0, len(ps), batch)):
            calls.clear()
            sampled += [o.outputs[0] for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in chunk], sample,
                                                           use_tqdm=False)]
            decode += per_request(calls, len(chunk))
        sequences = []
        for p, o, values in zip(ps, sampled, decode):
            response = list(o.token_ids)
            calls.clear()
            forced = llm.generate([TokensPrompt(prompt_token_ids=p + response)], prefill, use_tqdm=False)[0]
            sequences.append({
                "prompt": p, "response": response,
                "decode_logprobs": [lp[t].logprob for t, lp in zip(response, o.logprobs)],
                "prefill_logprobs": [forced.prompt_logprobs[len(p) + i][t].logprob for i, t in enumerate(response)],
                "decode": values, "prefill": per_request(calls, 1)[0]})
    torch.save(sequences, out)


def engine_in_child(model_dir: str, n_prompts: int, prompt_seed: int, batch: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "engine.pt"
        in_child("studies.trace.measure", "--engine", model_dir, out, "--prompts", n_prompts, "--prompt-seed",
                 prompt_seed, "--batch", batch)
        return torch.load(out)


@torch.no_grad()
def training_side(model, sequences: list[dict], spec: str, reduction: str, impl: str) -> list[dict]:
    traced = []
    with patches.aligned(spec, target="vllm-cpu", reduction=reduction, impl=impl), training_tap(model) as calls:
        for s in sequences:
            p, r = s["prompt"], s["response"]
            calls.clear()
            logits = model(torch.tensor([p + r])).logits[0].float()
            lp = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) + len(r) - 1), torch.tensor(r)]
            traced.append({"values": by_layer(calls), "logprobs": lp.tolist()})
    return traced


def compare(got: list[dict], ref: list[dict], got_logprobs: list[list[float]]) -> dict:
    """`got` (each sequence's values) against the engine's decode `ref`, over the decode's positions."""
    layers = ref[0]["decode"]["q"].shape[0]
    # per value and layer: elements equal, elements, squared difference, squared reference
    equal, count, diff2, ref2 = (torch.zeros(len(VALUES), layers, dtype=torch.float64) for _ in range(4))
    positions_differing, positions, first = torch.zeros(layers, dtype=torch.float64), 0, []
    for values, s in zip(got, ref):
        rows = s["decode"]["q"].shape[1]
        differs = torch.zeros(layers, rows, dtype=torch.bool)
        for j, n in enumerate(VALUES):
            a, b = values[n][:, :rows].double(), s["decode"][n].double()
            ne = (a != b).flatten(2)
            equal[j] += (~ne).double().sum((1, 2))
            count[j] += ne[0].numel()
            diff2[j] += (a - b).pow(2).flatten(1).sum(1)
            ref2[j] += b.pow(2).flatten(1).sum(1)
            differs |= ne.any(2)
        positions_differing += differs.double().sum(1)
        positions += rows
        hit = differs.nonzero()
        if len(hit):
            layer, row = (int(x) for x in hit[0])
            which = [n for n in VALUES if not torch.equal(values[n][layer, row], s["decode"][n][layer, row])]
            first.append({"layer": layer, "values": which, "position": row, "in_response": row >= len(s["prompt"])})
        else:
            first.append(None)
    d = torch.tensor([x for row in got_logprobs for x in row], dtype=torch.float64) - torch.tensor(
        [x for s in ref for x in s["decode_logprobs"]], dtype=torch.float64)
    return {"k3": float((torch.exp(d) - 1 - d).mean()), "bit_equal": float((d == 0).double().mean()),
            "mean_abs": float(d.abs().mean()), "first": first,
            "layers": [{"layer": i, "value": n, "bit_equal": float(equal[j, i] / count[j, i]),
                        "rel_l2": float((diff2[j, i] / ref2[j, i]).sqrt()),
                        "positions_differing": float(positions_differing[i] / positions)}
                       for i in range(layers) for j, n in enumerate(VALUES)]}


def measure_point(model_dir: str, prompts: int, prompt_seed: int, batch: int, settings: list[str], log) -> dict:
    """The engine's decode at `batch` against its prefill, each of `settings` and each pair measured."""
    start = time.perf_counter()
    sequences = engine_in_child(model_dir, prompts, prompt_seed, batch)
    check = None
    if batch >= prompts:  # the untapped sampler samples all prompts at once: the same batch
        untapped = sample_in_child(model_dir, prompts, prompt_seed=prompt_seed)
        tapped_logprobs = [x for s in sequences for x in s["decode_logprobs"]]
        check = {"responses_equal": untapped["responses"] == [s["response"] for s in sequences],
                 "logprobs_bit_equal": sum(a == b for a, b in zip(tapped_logprobs, sum(untapped["logprobs"], [])))
                 / len(tapped_logprobs)}
        log(f"  the tapped engine against the untapped: responses equal {check['responses_equal']}, "
            f"logprobs bit-equal {check['logprobs_bit_equal']:.1%}")
    compared = {ENGINE_PREFILL: compare([s["prefill"] for s in sequences], sequences,
                                        [s["prefill_logprobs"] for s in sequences])}
    traced = {}
    for name in settings:
        kernels, spec, reduction, impl = SETTINGS[name]
        traced[name] = training_side(training_model(model_dir, kernels), sequences, spec, reduction, impl)
        compared[name] = compare([t["values"] for t in traced[name]], sequences, [t["logprobs"] for t in traced[name]])
    pairs = {name: pair for name, pair in PAIRS.items() if set(pair) <= set(settings)}
    for name, (setting, reference) in pairs.items():  # the reference side in the engine's place
        as_engine = [{"prompt": s["prompt"], "decode": t["values"], "decode_logprobs": t["logprobs"]}
                     for s, t in zip(sequences, traced[reference])]
        compared[name] = compare([t["values"] for t in traced[setting]], as_engine,
                                 [t["logprobs"] for t in traced[setting]])
    for name, c in compared.items():
        firsts = [f["layer"] for f in c["first"] if f is not None]
        log(f"  {name:20s} logprobs bit-equal {c['bit_equal']:6.1%}, k3 {c['k3']:.2e}; first differing layer "
            f"{min(firsts, default='-')}..{max(firsts, default='-')} ({len(firsts)}/{len(c['first'])} "
            "sequences differ)")
    return {"untapped": check, "sequences": len(sequences), "tokens": sum(len(s["response"]) for s in sequences),
            "compared": compared, "wall_s": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run trace", description=__doc__.split("\n")[0])
    p.add_argument("--out", help="the JSON file to write")
    p.add_argument("--layers", type=int, default=LAYERS, help=f"decoder layers (default {LAYERS})")
    point_options(p, PROMPTS)
    p.add_argument("--batches", nargs="+", type=int, default=list(BATCHES),
                   help="the engine's decode batch sizes: the prompts are sampled this many at a time (the training "
                        "side is traced at the largest)")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                   help="the training side's settings to trace (default: all; a pair needs both of its own)")
    p.add_argument("--prompt-seed", type=int, default=1234, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=PROMPTS, help=argparse.SUPPRESS)  # the child's
    p.add_argument("--engine", nargs=2, metavar=("MODEL_DIR", "OUT"), help=argparse.SUPPRESS)  # the child's work
    args = p.parse_args(argv)
    if args.engine:
        engine_side(*args.engine, args.prompts, args.prompt_seed, args.batch)
        return 0
    if not args.out:
        p.error("--out is required")
    if bad := [b for b in args.batches if not 1 <= b <= args.prompts]:
        p.error(f"--batches: {bad} outside 1..{args.prompts}; allowed: batch sizes up to --prompts")
    if args.layers < 1:
        p.error(f"--layers: {args.layers} is not a layer count; allowed: a positive integer")
    if (header := start("trace", argv)) is None:
        return 2
    results = {**header, "layers": args.layers, "prompts": args.prompts, "new_tokens": NEW_TOKENS,
               "settings": {n: dict(zip(("kernels", "spec", "reduction", "impl"), SETTINGS[n]))
                            for n in args.settings},
               "pairs": {n: dict(zip(("setting", "reference"), p)) for n, p in PAIRS.items()
                         if set(p) <= set(args.settings)},
               "batches": args.batches, "training_batches": [max(args.batches)],
               "engine_attention_isa": attention_isa(), "points": {}}
    kept, code = kept_points(args.out), commit()
    # seeds outermost: a run stopped early has every architecture and batch at its first seeds
    points = [(f"{arch}-256x{args.layers}-s{seed}-b{batch}", arch, seed, batch) for seed in args.seeds
              for arch in args.archs for batch in args.batches]
    for i, (name, arch, seed, batch) in enumerate(points):
        spec = {"arch": arch, **HIDDEN_256, "num_hidden_layers": args.layers}
        training = batch == max(args.batches)
        made_by = {"spec": spec, "seed": seed, "prompts": args.prompts, "batch": batch,
                   "settings": results["settings"] if training else None,
                   "pairs": results["pairs"] if training else None,
                   **{k: results["machine"].get(k) for k in VERSIONS}, "code": code}  # never older code's
        path = kept / f"{name}.json"
        if path.exists() and (stored := json.loads(path.read_text()))["made_by"] == made_by:
            print(f"[{i + 1}/{len(points)}] {name}: measured already ({path})")
            results["points"][name] = stored["entry"]
            continue
        print(f"[{i + 1}/{len(points)}] {name}")
        with tempfile.TemporaryDirectory() as model_dir:
            make_checkpoint(spec, model_dir, seed=seed)
            entry = {"arch": arch, "seed": seed, "batch": batch, "shape": spec,
                     **measure_point(kept_checkpoint(model_dir), args.prompts, args.prompt_seed + seed, batch,
                                     args.settings if training else [], print)}
        results["points"][name] = entry
        write_text(path, json.dumps({"made_by": made_by, "entry": entry}))  # whole or absent
    Path(args.out).write_text(json.dumps(results) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
