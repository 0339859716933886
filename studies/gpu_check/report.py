"""The GPU check's runs as tables: what `benchmarks/gpu_check.sh` measured on a GPU machine.

The measurement runs on the GPU machine with its own Python (no Snakemake there): each run's folder in
`studies/gpu_check/runs/` is what one call returned (`summary.json` with the machine, versions, commit and
command; every step's JSON and log). This report reads those folders and writes one table per step, each
row naming its run; `runs.csv` holds each run's provenance. The second check's steps (preflight, gemm, long,
kernels, determinism, cost) have tables of their own (`long` two: overall and per position bin), written
once a run has them; every k3 there is against both of the engine's references, its prefill
(`engine_forward`) and its sampling logprobs (`engine_sampling`). Torch-free.

    python -m studies report gpu_check --runs studies/gpu_check/runs --out results/studies/gpu_check/report

A new run: `benchmarks/gpu_check.sh` on the GPU machine returns gpu-check-gpu.tar.gz; unpack it here
(`tar xzf gpu-check-gpu.tar.gz && mv gpu-check-gpu studies/gpu_check/runs/<gpu>-<commit>`) and
`snakemake --cores 2 gpu_check` makes the tables anew (a new run folder is a new input).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.output import report_parser, to_markdown, write_tables

RUNS = "studies/gpu_check/runs"
VERDICTS = ("bit-equal", "last-bit", "order", "rounding")  # best to worst (benchmarks/check_fused.py)


def _read(folder: Path, step: str) -> dict | None:
    path = folder / f"{step}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def run_row(name: str, summary: dict) -> dict:
    env = summary["environment"]
    row = {"run": name, **{k: env.get(k) for k in ("commit", "command", "date_utc", "device_name", "nvidia_smi", "cuda",
                                                    "torch", "triton", "transformers", "liger_kernel", "python")}}
    for step, result in summary["steps"].items():
        row[f"{step}_status"], row[f"{step}_s"] = result["status"], round(result["seconds"], 1)
    return row


def fused_rows(name: str, report: dict) -> list[dict]:
    out = []
    for r in report["rows"]:
        for comparison in ("fused_vs_engine", "eager_vs_engine", "stock_vs_engine", "fused_vs_eager_grads"):
            for output, c in enumerate(r[comparison]):
                out.append({"run": name, "model": r["model"], "region": r["region"], "comparison": comparison,
                            "output": output, "differing": c["differing"], "of": c["of"],
                            "share": c["differing"] / c["of"], "max_ulp": c["max_ulp"],
                            "max_row_ulp": c.get("max_row_ulp"), "verdict": c["verdict"], "passed": r["passed"]})
    return out


def model_rows(name: str, report: dict) -> list[dict]:
    keep = ("model", "layers", "hidden", "vocab", "n_seq", "prompt_len", "response_len", "target", "attention",
            "regions", "impl", "reference", "n_tokens", "k3", "mean_abs_dlogprob", "bit_equal")
    digests = ("responses_digest", "engine_logprobs_digest")  # absent from the runs made before they were kept
    rows = [{"run": name, **{k: r[k] for k in keep}, **{k: r.get(k) for k in digests}} for r in report["rows"]]
    stock = {(r["model"], r["reference"]): r["k3"] for r in rows if r["regions"] == "none"}
    return [{**r, "stock k3 / k3": stock[(r["model"], r["reference"])] / r["k3"]} for r in rows]


def check_rows(name: str, folder: Path) -> list[dict]:
    rows = []
    if epilogue := _read(folder, "epilogue"):
        for graph in ("vllm_graph", "every_user_pointwise"):
            rows.append({"run": name, "check": f"epilogue: qkv bias, {graph}", "result": epilogue[graph]["bias"]})
    if model := _read(folder, "model"):
        for m in model["roundmaps"]:
            verdict = "as target" if m["matches"] else "differs from"
            rows.append({"run": name, "check": f"rounding map of {m['model']}'s {m['graphs']} Triton graphs",
                         "result": f"{verdict} {model['target']}"})
    if tests := _read(folder, "cuda-tests"):
        rows += [{"run": name, "check": t["nodeid"], "result": t["outcome"]} for t in tests["tests"]]
    return rows


def region_rows(name: str, report: dict) -> list[dict]:
    keep = ("model", "arch", "case", "impl", "time_ms", "time_x_stock", "saved_bytes", "saved_x_stock", "peak_bytes",
            "peak_x_stock", "GBps", "device_ms", "device_ops")
    return [{"run": name, **{k: r.get(k) for k in keep}, "copy_GBps": report["copy_GBps"]} for r in report["rows"]]


# ---- the second check's steps (studies/gpu_check/check_<step>.py): {"parts": {...}} each

REFERENCES = ("engine_forward", "engine_sampling")  # the engine's prefill logprobs; its decode (sampling) ones
MISMATCH = ("k3", "mean_abs_dlogprob", "bit_equal")


def _parts(report: dict) -> dict:
    return report.get("parts", {})


def _both_references(row: dict) -> dict:
    """`<reference>/<metric>` of a step's row as `<reference>_<metric>` columns, every reference present."""
    return {f"{ref}_{m}": row.get(f"{ref}/{m}") for ref in REFERENCES for m in MISMATCH}


def preflight_rows(name: str, report: dict) -> list[dict]:
    parts = _parts(report)
    rows = [{"run": name, "item": f"version: {k}", "value": str(v)} for k, v in parts.get("versions", {}).items()]
    rows += [{"run": name, "item": f"SDPA backend: {k}", "value": v} for k, v in parts.get("sdpa_backends", {}).items()]
    if flag := parts.get("reduced_precision"):
        rows.append({"run": name, "item": "allow_bf16_reduced_precision_reduction",
                     "value": f"{flag['allow_bf16_reduced_precision_reduction']} (applies to {flag['applies']})"})
    if norm := parts.get("norm_cast"):
        c = norm["compiled_vs_eager"]
        rows.append({"run": name, "item": f"compiled {norm['expression']} against eager",
                     "value": f"{norm['verdict']}: {c['differing']} of {c['of']} differ "
                              f"(emulate_precision_casts {norm['emulate_precision_casts']})"})
    return rows


def gemm_rows(name: str, report: dict) -> list[dict]:
    parts = _parts(report)
    keep = ("model", "reduced_precision", "projection", "rows", "differing", "of", "bit_equal")
    rows = [{"run": name, "comparison": "row 0 against 1 row", **{k: r[k] for k in keep}}
            for r in parts.get("row_invariance", [])]
    rows += [{"run": name, "comparison": f"merged {r['group']} against separate", **{k: r[k] for k in keep}}
             for r in parts.get("merged_vs_separate", [])]
    return rows


def long_rows(name: str, report: dict) -> list[dict]:
    keep = ("model", "layers", "scale", "logit_scale", "dtype", "regions", "impl", "n_seq", "response_len",
            "entropy_engine", "finite_share")
    return [{"run": name, **{k: r.get(k) for k in keep}, **_both_references(r),
             "n_tokens": r.get("engine_forward/n_tokens")} for r in _parts(report).get("rows", [])]


def position_rows(name: str, report: dict) -> list[dict]:
    keep = ("model", "scale", "dtype", "regions", "impl", "position_low", "position_high", "n_tokens",
            "entropy_engine")
    return [{"run": name, **{k: r[k] for k in keep},
             **{f"{ref}_{m}": r[f"{ref}/{m}"] for ref in REFERENCES for m in ("k3", "mean_abs_dlogprob")}}
            for r in _parts(report).get("by_position", [])]


def kernels_rows(name: str, report: dict) -> list[dict]:
    keep = ("model", "layers", "n_seq", "prompt_len", "response_len", "entropy_engine", "train_attention",
            "regions", "impl")
    kernels = report.get("kernels", {})
    return [{"run": name, **{k: r[k] for k in keep}, "train_kernel": kernels.get(r["train_attention"]),
             "engine_kernel": kernels.get("engine_kernel"), **_both_references(r)}
            for r in _parts(report).get("rows", [])]


DIGESTS = ("responses", "engine_sampling", "engine_forward", "train_none", "train_all")


def determinism_rows(name: str, report: dict) -> list[dict]:
    return [{"run": name, "pair": c["pair"], **{d: c.get(d) for d in DIGESTS}, "all_equal": c.get("all_equal"),
             "skipped": c.get("skipped")} for c in _parts(report).get("comparisons", [])]


def cost_rows(name: str, report: dict) -> list[dict]:
    keep = ("model", "layers", "tokens", "impl", "step_s", "time_x_stock", "peak_bytes", "peak_x_stock", "skipped")
    return [{"run": name, **{k: r.get(k) for k in keep}, "gradient_checkpointing": report.get("gradient_checkpointing")}
            for r in _parts(report).get("rows", [])]


STEP_ROWS = {"fused.csv": ("fused", fused_rows), "model.csv": ("model", model_rows),
             "regions.csv": ("regions", region_rows), "preflight.csv": ("preflight", preflight_rows),
             "gemm.csv": ("gemm", gemm_rows), "long.csv": ("long", long_rows),
             "long_positions.csv": ("long", position_rows), "kernels.csv": ("kernels", kernels_rows),
             "determinism.csv": ("determinism", determinism_rows), "cost.csv": ("cost", cost_rows)}


def tables(runs: Path) -> dict[str, pd.DataFrame]:
    folders = sorted(p for p in runs.iterdir() if (p / "summary.json").is_file())
    if not folders:
        raise SystemExit(f"--runs {runs}: no run folder with a summary.json (what benchmarks/gpu_check.sh returns)")
    found = {t: [] for t in VIEWS}
    for folder in folders:
        found["runs.csv"].append(run_row(folder.name, json.loads((folder / "summary.json").read_text())))
        found["checks.csv"] += check_rows(folder.name, folder)
        for table, (step, rows) in STEP_ROWS.items():  # the tables of one step's JSON each
            if report := _read(folder, step):
                found[table] += rows(folder.name, report)
    return {t: pd.DataFrame(rows) for t, rows in found.items()}


def fused_view(fused: pd.DataFrame) -> pd.DataFrame:
    """One row per run, model and region; per comparison its worst output: verdict, share differing, and the
    largest difference in ulps of its row's scale (absent before the check measured it)."""
    def cell(rows: pd.DataFrame) -> str:
        worst = rows.loc[rows["verdict"].map(VERDICTS.index).idxmax()]
        if worst["verdict"] == "bit-equal":
            return "bit-equal"
        row_ulp = rows["max_row_ulp"].max()
        return (f"{worst['verdict']}: {rows['share'].max():.4%} differ, max {rows['max_ulp'].max()} ulp"
                + ("" if pd.isna(row_ulp) else f" ({row_ulp:.2g} ulp at its row's scale)"))

    keys = ["run", "model", "region"]
    view = fused.groupby(keys + ["comparison"], sort=False).apply(cell, include_groups=False).unstack("comparison")
    view = view[["fused_vs_engine", "eager_vs_engine", "stock_vs_engine", "fused_vs_eager_grads"]].reset_index()
    return view.merge(fused.groupby(keys, sort=False)["passed"].first().reset_index(), on=keys)


def model_view(model: pd.DataFrame) -> pd.DataFrame:
    """Against the engine's forward: k3, |d logprob|, bit-equal share, and stock's k3 over each setting's."""
    rows = model[model["reference"] == "engine_forward"]
    return rows[["run", "model", "layers", "regions", "impl", "n_tokens", "k3", "mean_abs_dlogprob", "bit_equal",
                 "stock k3 / k3"]]


def regions_view(regions: pd.DataFrame) -> pd.DataFrame:
    """Wall time per forward+backward step, and (where the run measured it) the GPU's busy time in it: a case
    whose busy time is a small part of its wall time waits on its host launching kernels."""
    columns = ["run", "model", "case", "impl", "time_ms", "time_x_stock", "device_ms", "device_ops", "saved_x_stock",
               "peak_x_stock"]
    view = regions.reindex(columns=columns)
    view.insert(4, "saved_MiB", regions["saved_bytes"] / 2**20)
    return view


def runs_view(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[["run", "commit", "command", "date_utc", "nvidia_smi", "cuda", "torch", "triton", "transformers",
                 "liger_kernel"]].astype(str)


def gemm_view(gemm: pd.DataFrame) -> pd.DataFrame:
    """Per run, model, comparison, projection and reduction flag: at how many row counts the bits differ,
    and the smallest such row count."""
    keys = ["run", "model", "comparison", "projection", "reduced_precision"]
    differs = ~gemm["bit_equal"].astype(bool)
    moved = gemm.assign(moved_at=gemm["rows"].where(differs), differs=differs)
    return moved.groupby(keys, sort=False).agg(row_counts=("rows", "size"), differing_at=("differs", "sum"),
                                               first_differing_rows=("moved_at", "min"),
                                               max_differing=("differing", "max")).reset_index()


def long_view(long: pd.DataFrame) -> pd.DataFrame:
    """Each setting's k3 against both references, the engine's entropy, and stock's k3 over the setting's
    (the BF16 `none` row of the same scale and reference)."""
    view = long[["run", "model", "scale", "dtype", "regions", "impl", "response_len", "entropy_engine",
                 "engine_forward_k3", "engine_sampling_k3", "engine_forward_mean_abs_dlogprob"]].copy()
    stock = long[(long["dtype"] == "bf16") & (long["regions"] == "none")].set_index(["run", "model", "scale"])
    for ref in REFERENCES:
        base = view.set_index(["run", "model", "scale"]).index.map(stock[f"{ref}_k3"])
        view[f"bf16 stock k3 / k3 ({ref})"] = base.to_numpy() / view[f"{ref}_k3"].to_numpy()
    return view


def positions_view(positions: pd.DataFrame) -> pd.DataFrame:
    """Per run, scale, position bin and reference: each setting's k3 side by side, the engine's entropy
    there, and the share of stock's k3 that `rope` alone removes (1 - rope / none) against `all`'s."""
    keys = ["run", "model", "scale", "position_low", "position_high"]
    frame = positions.assign(setting="k3 " + positions["dtype"] + " " + positions["regions"])
    entropy = frame[frame["dtype"] == "bf16"].groupby(keys, sort=False)["entropy_engine"].first()
    rows = []
    for ref in REFERENCES:
        wide = frame.pivot_table(index=keys, columns="setting", values=f"{ref}_k3", aggfunc="first", sort=False)
        wide.insert(0, "reference", ref)
        wide.insert(1, "entropy_engine", entropy.reindex(wide.index).to_numpy())
        if {"k3 bf16 none", "k3 bf16 rope", "k3 bf16 all"} <= set(wide.columns):
            wide["rope removes"] = 1 - wide["k3 bf16 rope"] / wide["k3 bf16 none"]
            wide["all removes"] = 1 - wide["k3 bf16 all"] / wide["k3 bf16 none"]
        rows.append(wide.reset_index())
    return pd.concat(rows, ignore_index=True)


def kernels_view(kernels: pd.DataFrame) -> pd.DataFrame:
    return kernels[["run", "model", "layers", "train_attention", "regions", "impl", "engine_forward_k3",
                    "engine_sampling_k3", "engine_forward_bit_equal", "engine_sampling_bit_equal", "entropy_engine"]]


def cost_view(cost: pd.DataFrame) -> pd.DataFrame:
    view = cost.reindex(columns=["run", "model", "layers", "tokens", "impl", "step_s", "time_x_stock", "peak_x_stock",
                                 "skipped"])
    view.insert(7, "peak_GiB", cost["peak_bytes"].astype(float) / 2**30 if "peak_bytes" in cost else None)
    return view


# every table, in this order, with its markdown view; a table no run has rows for is not written
VIEWS = {"runs.csv": runs_view, "fused.csv": fused_view, "model.csv": model_view, "checks.csv": lambda frame: frame,
         "regions.csv": regions_view, "preflight.csv": lambda frame: frame, "gemm.csv": gemm_view,
         "long.csv": long_view, "long_positions.csv": positions_view, "kernels.csv": kernels_view,
         "determinism.csv": lambda frame: frame, "cost.csv": cost_view}


def main(argv=None) -> int:
    p = report_parser("gpu_check", __doc__, out="folder for the tables")
    p.add_argument("--runs", type=Path, default=Path(RUNS), help="folder of run folders (default: %(default)s)")
    args = p.parse_args(argv)
    found = tables(args.runs)
    found = {t: frame for t, frame in found.items() if len(frame)}
    views = {t.replace(".csv", ".md"): to_markdown(VIEWS[t](frame)) + "\n" for t, frame in found.items()}
    write_tables(args.out, {**found, **views})
    return 0
