"""Tables and figures of the mismatch probe from its CSV files only (studies/probe/page.md): each region's
Shapley share of the stock mismatch (`region_shares`), the tables across models and, with more than one
model, the figure ``probe_subsets``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from rla.names import FORWARD_TREATMENTS
from studies._shared.names import ENGINE_ORDER, MAIN_REFERENCE, SAMPLING_REFERENCE
from studies._shared.shares import SETTING_ORDER, region_shares, training_settings
from analysis import figures
from analysis.output import read_checked, report_parser, to_markdown, write_tables
from analysis.style import ABLATION_COLORS

log = logging.getLogger(__name__)

PAIR_COLOR = "#999999"
COLORS = {**ABLATION_COLORS, ENGINE_ORDER: "#004D40"}  # a darker "all": the same regions, the engine's order
LABELS = {ENGINE_ORDER: "all + engine\nsummation order", "fp16": "fp16\n(both sides)"}
METRICS = ["mean_abs_dlogprob", "max_abs_dlogprob", "k3_kl", "probs_diff_mean", "frac_identical"]
REQUIRED = ["setting", "regions", "reduction", "reference", "n_tokens", *METRICS]


def find_probes(root: str | Path) -> dict[str, Path]:
    """{model: dir}: ``root`` itself if it is a probe directory, else its subdirectories that are."""
    root = Path(root)
    if (root / "subsets.csv").exists():
        return {root.name: root}
    found = {p.name: p for p in sorted(root.iterdir()) if (p / "subsets.csv").exists()}
    if not found:
        raise FileNotFoundError(f"no probe results under {root}: expected {root}/MODEL/subsets.csv")
    return found


def subsets_table(subsets: pd.DataFrame) -> pd.DataFrame:
    """People's view: the main reference's metrics per setting, plus the sampling reference's mean."""
    main = training_settings(subsets, MAIN_REFERENCE)
    stock = main.loc[main["setting"] == "none", "mean_abs_dlogprob"]
    table = main[["setting", *METRICS]].copy()
    table.insert(2, "vs_none", table["mean_abs_dlogprob"] / stock.iloc[0] if len(stock) else np.nan)
    sampling = training_settings(subsets, SAMPLING_REFERENCE).set_index("setting")
    if len(sampling):
        table["mean_abs_dlogprob_vs_sampling"] = table["setting"].map(sampling["mean_abs_dlogprob"])
        table["k3_kl_vs_sampling"] = table["setting"].map(sampling["k3_kl"])
    return table


def markdown_report(subsets: pd.DataFrame, title: str) -> str:
    main = training_settings(subsets)
    n_tokens = int(main["n_tokens"].iloc[0]) if len(main) else 0
    parts = [f"# Mismatch probe: {title}\n",
             f"{n_tokens} response tokens. Main reference: the engine's full forward of prompt + response "
             "(`engine_forward`); `*_vs_sampling`: against the logprobs the engine returned while sampling.\n",
             to_markdown(subsets_table(subsets))]
    engine_row = subsets[(subsets["setting"] == MAIN_REFERENCE) & (subsets["reference"] == SAMPLING_REFERENCE)]
    if len(engine_row):
        r = engine_row.iloc[0]
        parts.append(f"\nThe engine's own forward against its sampling logprobs (prefill vs KV-cache decode, "
                     f"beyond any training-side alignment): mean |d logprob| {r['mean_abs_dlogprob']:.3g}, "
                     f"bit-identical {r['frac_identical']:.1%}.\n")
    if "target" in subsets:  # a probe against vLLM: the other target's rows, and which engine
        engines = subsets["engine"].dropna().unique() if "engine" in subsets else []
        if len(engines):
            parts.insert(1, f"Engine: {', '.join(map(str, engines))}; training side rounding like target "
                            f"{', '.join(sorted(set(main['target'].dropna())))}.\n")
        other = subsets[(subsets["reference"] == MAIN_REFERENCE) & subsets["setting"].str.contains("@", na=False)]
        if len(other):
            parts += ["\n## The other alignment target (subsets with rmsnorm; the targets differ only in where the "
                      "residual stream is stored)\n",
                      to_markdown(other[["setting", *METRICS]].reset_index(drop=True))]
    try:
        shares = region_shares(subsets)
    except ValueError as err:
        parts.append(f"\nNo region shares: {err}\n")
    else:
        parts += ["\n## Shares of the stock mean |d logprob| (Shapley over the subsets)\n",
                  to_markdown(shares)]
    return "\n".join(parts)


def _positive_floor(values: np.ndarray) -> float:
    positive = values[values > 0]
    return float(positive.min()) / 10 if len(positive) else 1e-8


def _bars(ax, main: pd.DataFrame, title: str) -> None:
    values = main["mean_abs_dlogprob"].to_numpy(dtype=float)
    floor = _positive_floor(values)
    x = np.arange(len(main))
    ax.bar(x, np.where(values > 0, values, np.nan), color=[COLORS.get(s, PAIR_COLOR) for s in main["setting"]])
    for xi, v in zip(x, values):
        ax.annotate("0\n(bit-identical)" if v == 0 else f"{v:.1e}", (xi, v if v > 0 else floor * 1.5),
                    ha="center", va="bottom", fontsize=6)
    ax.set_yscale("log")
    ax.set_ylim(floor, values.max() * 4 if values.max() > 0 else 1)
    ax.set_xticks(x, [LABELS.get(s, s) for s in main["setting"]], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("mean |Δ logprob| vs engine")
    ax.set_title(title)


def plot_models(probes: dict[str, pd.DataFrame], out_dir: Path, name: str = "probe_subsets") -> list[Path]:
    """One bar panel per model, shared log axis."""
    fig, axes = figures.subplots(1, len(probes), figsize=(4.2 * len(probes), 3.4), sharey=True,
                                 layout="constrained", squeeze=False)
    for ax, (model, subsets) in zip(axes[0], probes.items()):
        _bars(ax, training_settings(subsets), model)
    all_values = np.concatenate([training_settings(s)["mean_abs_dlogprob"].to_numpy(float) for s in probes.values()])
    axes[0, 0].set_ylim(_positive_floor(all_values), all_values.max() * 4)
    for ax in axes[0, 1:]:
        ax.set_ylabel("")
    return figures.save_figure(fig, out_dir, name)


def run(probe_root: str | Path, figures_dir: str | Path, tables_dir: str | Path | None = None) -> None:
    """The across-models figure into `figures_dir`; combined tables into `tables_dir`
    (default: results/tables for results/probe). The probe directories are only read."""
    probes = find_probes(probe_root)
    if tables_dir is None:  # results/tables for results/probe or results/probe/NAME
        base = Path(probe_root).resolve()
        tables_dir = (base.parent if (base / "subsets.csv").exists() else base).parent / "tables"
    # the subsets.csv of each probe directory: the tables here read no other
    subsets = {model: read_checked(path / "subsets.csv", REQUIRED) for model, path in probes.items()}
    shares = []
    for model, frame in subsets.items():
        try:
            shares.append(region_shares(frame).assign(model=model))
        except ValueError as err:
            log.warning("%s: %s", model, err)
    Path(figures_dir).mkdir(parents=True, exist_ok=True)  # published even with one model (then no figure)
    if len(probes) > 1:
        plot_models(subsets, figures_dir)
    combined = pd.concat([s.assign(model=m) for m, s in subsets.items()], ignore_index=True)
    tables = {"probe_subsets.csv": combined[["model"] + [c for c in combined.columns if c != "model"]]}
    if shares:
        tables["probe_shares.csv"] = pd.concat(shares, ignore_index=True)[["model", "component", "reduction", "share"]]
    tables["probe.md"] = "\n".join(markdown_report(frame, model) for model, frame in subsets.items())
    tables["probe_models.md"] = models_table(combined)
    write_tables(tables_dir, tables)


def models_table(combined: pd.DataFrame) -> str:
    """Setting x model: mean |Δ logprob| against the engine's full forward, with the fraction of response
    tokens bit-identical, for the region subsets and all + the engine's order."""
    main = combined[combined["reference"] == MAIN_REFERENCE]
    main = main[main["setting"].isin(SETTING_ORDER[:-len(FORWARD_TREATMENTS)])]
    cells = main.assign(cell=[f"{m:.2g} ({f:.0%})" for m, f in zip(main["mean_abs_dlogprob"], main["frac_identical"])])
    wide = cells.pivot(index="setting", columns="model", values="cell")
    wide = wide.reindex([s for s in SETTING_ORDER if s in wide.index]).reset_index()
    return to_markdown(wide)


def main(argv: list[str] | None = None) -> int:
    p = report_parser("probe", __doc__, probe="one probe directory, or a directory of them (results/probe)",
                      out="figures directory, e.g. figures/tiny")
    p.add_argument("--tables", help="where probe_subsets.csv, probe_shares.csv and probe.md go "
                   "(default: <probe>/../tables)")
    args = p.parse_args(argv)
    run(args.probe, args.out, args.tables)
    return 0
