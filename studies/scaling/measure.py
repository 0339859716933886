"""Mismatch scaling: the training-vs-engine mismatch as one factor grows (`FACTORS`), the others at a
base. Setup, factors and metrics: studies/scaling/page.md; options: --help."""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import patches
from localrl import Engine, rig_device as default_device
from rla.config import ConfigError
from rla.files import write_csv
from studies._shared.mismatch import binned, mismatch_summary, response_tokens
from studies._shared.names import ENGINE_ORDER
from studies._shared.random_models import Point, base_point, build_model, cast_copy, matched_scale, sample
from studies._shared.scored import LOG_POSITION_EDGES, Layout, entropy_per_token
from studies._shared.settings import Setting, log, probe_settings, run_settings
from studies._shared.shapes import ARCHS, qwen_shape, shape_of
from studies._shared.sides import Forward, Sides, engine_forward, on_cpu, setting_forwards, strict_recompiles, \
    train_forward
from studies._shared.vllm_cpu import tiny_grid_shapes
from tinyqwen import models

FACTORS = ("depth", "width", "vocab", "length", "sharpness", "attention", "qk_bias", "update", "shape")
MASTER_KEPT_BELOW = 10**9  # parameters: above, the master is cast in place (no FP16 settings)


# Published configurations (config.json of Qwen/Qwen2.5-1.5B and Qwen/Qwen3-1.7B: the rig's REAL_SHAPES);
# weights random.
REAL_SHAPES = {name: shape_of(arch, models.REAL_SHAPES[name], 151936)
               for name, arch in (("qwen2.5-1.5b", "qwen2"), ("qwen3-1.7b", "qwen3"))}
# The tiny grid's models (experiments/tiny.yaml), random weights, its 384-token vocabulary.
TINY_SHAPES = {name: shape_of(spec["arch"], spec, 384, models.ROPE_THETA)
               for name, spec in tiny_grid_shapes().items()}


def factor_points(factor: str, arch: str, big: bool = False, real: bool = False,
                  base: Point | None = None, real_length: int = 128) -> list[Point]:
    """The points of one factor, each differing from `base` (default `base_point`) in that factor only.
    `big` adds the expensive end of each ladder; `real` adds the published real shapes to `shape`."""
    base = base or base_point(arch)
    s = base.shape

    def at(value, **kw):
        return replace(base, factor=factor, value=float(value), **kw)

    if factor == "depth":
        return [at(n, shape=replace(s, layers=n)) for n in (2, 4, 8, 16) + ((28,) if big else ())]
    if factor == "width":
        # logits grow as sqrt(hidden) at a fixed output-layer scale: keep their scale (and so the
        # sharpness, its own factor) fixed, so that this ladder measures width alone
        widths = (64, 128, 256, 512, 1024) + ((1536, 2048) if big else ())
        return [at(h, shape=qwen_shape(arch, h, s.layers, s.vocab), logit_scale=matched_scale(base, h))
                for h in widths]
    if factor == "vocab":
        return [at(v, shape=replace(s, vocab=v)) for v in (384, 4096, 32768) + ((151936,) if big else ())]
    if factor == "length":
        # fewer sequences at the longest responses (attention memory); the CSV holds n_seq per point
        lengths = (16, 64, 256, 1024) + ((4096,) if big else ())
        return [at(r, response_len=r, n_seq=16 if r <= 1024 else 4) for r in lengths]
    if factor == "sharpness":
        return [at(x, logit_scale=x) for x in (1, 4, 16, 32, 64)]
    if factor == "attention":
        return [at(x, attn_scale=x) for x in (1, 2, 3, 4, 6, 8)]
    if factor == "qk_bias":
        return [at(b, qk_bias=b) for b in (0.25, 0.5, 1, 2, 4)] if arch == "qwen2" else []  # Qwen3 has none
    if factor == "update":
        # relative weight-update sizes around an AdamW step at lr 1e-6..1e-4 on weights of ~0.02
        return [at(u, update=u) for u in (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)]
    if factor == "shape":  # value 1: tiny grid, 2: real shape, 3: real shape at the base's output scale
        pts = [replace(base, factor="shape", value=1.0, shape=shp, shape_name=name, response_len=20,
                       logit_scale=matched_scale(base, shp.hidden))
               for name, shp in TINY_SHAPES.items() if shp.arch == arch]
        if real:
            name, shp = next((n, x) for n, x in REAL_SHAPES.items() if x.arch == arch)
            real_point = replace(base, factor="shape", shape=shp, shape_name=name, n_seq=4, response_len=real_length)
            pts += [replace(real_point, value=2.0, logit_scale=matched_scale(base, shp.hidden)),
                    replace(real_point, value=3.0)]
        return pts
    raise ValueError(f"unknown factor {factor!r}; allowed: {list(FACTORS)}")


def adam_like_update(master, size: float, seed: int) -> None:
    """An AdamW-shaped step in place: each weight moves by `size` x its tensor's RMS, in a random sign (Adam's
    normalised update has magnitude ~lr in every coordinate)."""
    if size == 0:
        return
    gen = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for p in master.parameters():
            sign = torch.randint(0, 2, p.shape, generator=gen).to(device=p.device, dtype=p.dtype) * 2 - 1
            p.add_(sign * (size * p.pow(2).mean().sqrt()))


def _settings(device: torch.device, fp16: bool) -> list[Setting]:
    """The probe's settings; `fp16` only with the fp32 master at hand, all+engine_order on the CPU only (that
    order is Inductor's C++ loop: no eager code reproduces a Triton kernel's order)."""
    return [s for s in probe_settings()
            if (device.type == "cpu" or s.name != ENGINE_ORDER) and (fp16 or s.dtype == torch.bfloat16)]


def token_metrics(train: Forward, ref: Forward, layout: Layout) -> dict:
    """The per-point metrics over response tokens; d = logp_train - logp_engine."""
    summary = mismatch_summary(train.logprobs, ref.logprobs, layout)
    sel = layout.response
    d = (train.logprobs - ref.logprobs).double()
    d_tok = d[sel]
    k3 = torch.expm1(d_tok) - d_tok
    seq = torch.where(sel, d, 0.0).sum(1)  # sequence-level log-ratio: sum over the response
    h_train, h_ref = (entropy_per_token(f.logits, sel).double() for f in (train, ref))
    return {**summary, "k3_max": k3.max().item(), "signed_mean_dlogprob": d_tok.mean().item(),
            "signed_mean_se": (d_tok.std() / math.sqrt(d_tok.numel())).item(),
            "dlogprob_var": d_tok.var().item(),  # per token; x response length = the sequence variance if independent
            "seq_logratio_mean": seq.mean().item(),
            "seq_logratio_var": seq.var().item() if seq.numel() > 1 else float("nan"),
            "seq_logratio_abs_mean": seq.abs().mean().item(),
            "frac_abs_d_gt_1e-2": (d_tok.abs() > 1e-2).double().mean().item(),
            "frac_abs_d_gt_1e-1": (d_tok.abs() > 1e-1).double().mean().item(), "entropy_engine": h_ref.mean().item(),
            "entropy_diff": (h_train - h_ref).mean().item(),  # < 0: the trainer is sharper than the engine
            "entropy_diff_se": ((h_train - h_ref).std() / math.sqrt(h_ref.numel())).item()}


def position_bins(tokens: pd.DataFrame) -> pd.DataFrame:
    """dlogprob against position in log-spaced bins (responses reach thousands of tokens)."""
    edges = np.asarray(LOG_POSITION_EDGES)
    index = np.clip(np.searchsorted(edges, tokens["position"].to_numpy(), side="right") - 1, 0, len(edges) - 2)
    out = binned(tokens.assign(bin=index), "bin")
    out.insert(1, "position_low", edges[out["bin"]])
    out.insert(2, "position_high", edges[out["bin"] + 1] - 1)
    return out.drop(columns="bin")


@dataclass
class PointResult:
    rows: list[dict]
    by_position: pd.DataFrame
    by_probability: pd.DataFrame


def describe(point: Point) -> dict:
    """The point's fields, its shape's spelled out in their place after `shape_name`, then `parameters`."""
    fields = asdict(point)
    shape = fields.pop("shape")
    head = {k: fields.pop(k) for k in ("factor", "value", "shape_name")}
    return {**head, **shape, "parameters": point.shape.parameters, **fields}


def measure(point: Point, log=print) -> PointResult:
    """All settings at one point; with `point.update`, the same tokens are scored again after an update
    and each row gets the correlation of its per-token errors before and after."""
    strict_recompiles()  # every new width is a new compiled graph of each engine piece
    device = default_device()
    max_positions = point.prompt_len + point.response_len
    master = build_model(point, max_positions).to(device)  # initialised on the CPU: the same weights anywhere
    # Both sides' FP16 copies need the fp32 master; the real shapes (a billion parameters and more)
    # have no room for a second copy and are measured in BF16 only.
    keep_master = bool(point.update) or point.shape.parameters < MASTER_KEPT_BELOW
    model = cast_copy(master, keep_master=keep_master)
    engine = Engine(model.config, eos_id=-1, pad_id=0, max_positions=max_positions, device=device)
    engine.load_weights({k: v for k, v in model.state_dict().items() if v.dtype == torch.bfloat16})
    start = time.perf_counter()
    layout = Layout.from_rollout(sample(engine, point))
    inputs = (layout.ids, layout.mask, layout.positions)
    refs = {torch.bfloat16: on_cpu(engine_forward(engine.model, *inputs))}
    t_sample = time.perf_counter() - start

    settings = _settings(device, fp16=keep_master)
    sides = Sides(model, engine, master if keep_master else None)
    rows, pos_frames, prob_frames, errors = [], [], [], {}

    def step(setting: Setting, train_model, engine_model) -> None:
        train, ref = setting_forwards(setting.dtype, train_model, engine_model, layout, refs)
        tokens, by_probability = response_tokens(setting.name, train.logprobs, ref.logprobs, layout)
        errors[setting.name] = (train.logprobs - ref.logprobs)[layout.response].double()
        rows.append({"setting": setting.name, "regions": ",".join(setting.regions) or "none",
                     "reduction": setting.reduction,
                     "stock_regions": ",".join(r for r in patches.REGIONS if r not in setting.regions) or "none",
                     **token_metrics(train, ref, layout)})
        pos_frames.append(position_bins(tokens).assign(setting=setting.name))
        prob_frames.append(by_probability)

    run_settings(settings, sides, step, log=lambda line: None)  # one line per point, below

    if point.update:
        old = [p.clone() for p in model.parameters()]
        adam_like_update(master, point.update, point.seed)
        with torch.no_grad():  # the updated master into the same bf16 compute copy
            for p, m in zip(model.parameters(), master.parameters()):
                p.copy_(m)
        changed = sum(int((p != o).sum()) for p, o in zip(model.parameters(), old)) / sum(o.numel() for o in old)
        del old
        engine.load_weights({k: v for k, v in model.state_dict().items() if v.dtype == torch.bfloat16})
        ref2 = on_cpu(engine_forward(engine.model, *inputs))
        for row, setting in zip(rows, settings):
            corr = unchanged = float("nan")
            if setting.dtype == torch.bfloat16:  # persistence is measured on the BF16 pair only
                train = on_cpu(train_forward(model, *inputs, setting))
                after = (train.logprobs - ref2.logprobs)[layout.response].double()
                before = errors[setting.name]
                if before.std() > 0 and after.std() > 0:
                    corr = float(np.corrcoef(before.numpy(), after.numpy())[0, 1])
                unchanged = (before == after).double().mean().item()
            row.update(persistence_corr=corr, frac_error_unchanged=unchanged, frac_bf16_weights_changed=changed)

    out_rows = [{**describe(point), **row} for row in rows]
    none = next(r for r in out_rows if r["setting"] == "none")
    log(f"{point.factor}={point.value:g} {point.shape_name or point.shape.arch} "
        f"(L{point.shape.layers} h{point.shape.hidden} V{point.shape.vocab} R{point.response_len}): "
        f"none |d| {none['mean_abs_dlogprob']:.2e} k3 {none['k3_kl']:.2e} H {none['entropy_engine']:.2f}; "
        f"all |d| {next(r for r in out_rows if r['setting'] == 'all')['mean_abs_dlogprob']:.2e} "
        f"(sampling {t_sample:.1f} s)")
    keys = {"factor": point.factor, "value": point.value, "arch": point.shape.arch, "shape_name": point.shape_name}
    pos, prob = (pd.concat(frames, ignore_index=True).assign(**keys) for frames in (pos_frames, prob_frames))
    return PointResult(out_rows, pos, prob)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies run scaling",
                                description="training-engine mismatch against depth, width, vocabulary, ...")
    p.add_argument("--out", required=True, help="output dir: mismatch_scaling.csv, *_by_position.csv, ...")
    p.add_argument("--factors", default=",".join(FACTORS),
                   help=f"comma-separated, from {', '.join(FACTORS)}")
    p.add_argument("--archs", default="qwen2,qwen3", help=f"comma-separated, from {', '.join(ARCHS)}")
    p.add_argument("--big", action="store_true", help="add the expensive end of each ladder (28 layers, "
                   "hidden 1536/2048, vocabulary 151936, 4096-token responses)")
    p.add_argument("--real", action="store_true", help="add the published Qwen2.5-1.5B / Qwen3-1.7B shapes "
                   "(random weights; ~8 GiB of memory, minutes per forward on one core)")
    p.add_argument("--real-length", type=int, default=128,
                   help="response tokens of the real-shape points (default 128; 4096 on a GPU)")
    p.add_argument("--quick", action="store_true", help="two small points per factor, short responses (tests)")
    p.add_argument("--append", action="store_true", help="keep the tables already in --out and measure only "
                   "the points they lack (e.g. a later --big --real run)")
    return p


KEY = ["factor", "value", "arch", "shape_name"]
TABLES = ("mismatch_scaling", "mismatch_scaling_by_position", "mismatch_scaling_by_probability")


def point_key(point: Point) -> tuple:
    return (point.factor, float(point.value), point.shape.arch, point.shape_name)


def _choices(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise ConfigError(f"{flag} {text!r}: unknown {bad or 'empty'}; allowed: {', '.join(allowed)}")
    return items


def quick_base(arch: str) -> Point:
    """A dry run's base: a small model, 4 sequences of 8 + 12 tokens."""
    return Point("base", 0, qwen_shape(arch, 64, 2, 384), n_seq=4, prompt_len=8, response_len=12)


def plan(factors: list[str], archs: list[str], big: bool, real: bool, is_quick: bool,
         real_length: int = 128) -> list[Point]:
    points = []
    for factor in factors:
        for arch in archs:
            if is_quick:  # the first two points of each ladder, around a small base
                points += [replace(p, response_len=min(p.response_len, 24), n_seq=4)
                           for p in factor_points(factor, arch, base=quick_base(arch))[:2]]
            else:
                points += factor_points(factor, arch, big, real, real_length=real_length)
    return points


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)  # one process per core
    factors = _choices(args.factors, FACTORS, "--factors")
    archs = _choices(args.archs, ARCHS, "--archs")
    if args.real_length < 1:
        raise ConfigError(f"--real-length must be a positive number of tokens, got {args.real_length}")
    points = plan(factors, archs, args.big, args.real, args.quick, args.real_length)
    out = Path(args.out)
    kept = {n: pd.read_csv(out / f"{n}.csv", keep_default_na=False, na_values=[""])
            for n in TABLES if args.append and (out / f"{n}.csv").exists()}
    rows = []
    if "mismatch_scaling" in kept:
        done = set(map(tuple, kept["mismatch_scaling"][KEY].fillna("").itertuples(index=False)))
        todo = [p for p in points if point_key(p) not in done]
        log(f"--append: {len(points) - len(todo)} point(s) already in {out}/mismatch_scaling.csv, "
            f"{len(todo)} to measure")
        points = todo
        rows = kept["mismatch_scaling"].to_dict("records")
    pos, prob = ([kept[n]] if n in kept else [] for n in TABLES[1:])
    start = time.perf_counter()
    try:
        for i, point in enumerate(points, 1):
            log(f"[{i}/{len(points)}] {point.factor}={point.value:g} {point.shape.arch} "
                f"({point.shape.parameters / 1e6:.1f}M parameters, {point.n_seq} x {point.response_len} tokens) ...")
            result = measure(point, log)
            rows += result.rows
            pos.append(result.by_position)
            prob.append(result.by_probability)
            # written after every point: a long run that stops keeps what it measured
            write_csv(pd.DataFrame(rows), out / "mismatch_scaling.csv")
            write_csv(pd.concat(pos, ignore_index=True), out / "mismatch_scaling_by_position.csv")
            write_csv(pd.concat(prob, ignore_index=True), out / "mismatch_scaling_by_probability.csv")
    finally:
        patches.remove()
    log(f"{len(points)} points in {time.perf_counter() - start:.0f} s; wrote {out}/mismatch_scaling*.csv")
    return 0
