"""Figures of the grid (PNG + PDF in one folder), one palette for the ablations everywhere: ``score``,
``mismatch``, ``dynamics``, ``collapse_heatmap`` (what each shows: docs/reference.md, "Reading the figures").

Log-scale panels average seeds in log space (geometric mean, interval in log space) and leave out
values <= 0, which a log axis cannot show. Long runs are binned to at most ``MAX_POINTS`` steps
after smoothing (:func:`analysis.series.bin_steps`). A metric no run logged loses its panel, with a
:class:`FigureWarning`.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed (laptop, cluster node, CI)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.config import AnalysisConfig  # noqa: E402
from analysis.load import Run  # noqa: E402
from analysis.series import bin_steps, finite_series, mean_ci, smooth, trailing_mean  # noqa: E402
from analysis.style import ablation_order, ablation_palette, apply_theme, order  # noqa: E402
from rla.files import atomic_path  # noqa: E402

log = logging.getLogger(__name__)

PANEL_SIZE = (3.4, 2.5)  # inches per panel
MAX_COLUMNS = 4
MAX_POINTS = 500  # most steps per line after binning
FORMATS = ("png", "pdf")
# No creation date (PDF) and no version stamp: the same logs give the same bytes.
REPRODUCIBLE_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Creator": None, "Producer": None}}


class FigureWarning(UserWarning):
    """A panel or figure left out (metric not logged)."""


@dataclass(frozen=True)
class Panel:
    metric: str
    label: str
    log_scale: bool = False


SCORE = Panel("critic/score/mean", "score (smoothed)")
MISMATCH = (
    Panel("rollout_corr/k3_kl", "k3 KL(rollout || train)", log_scale=True),
    Panel("training/rollout_probs_diff_mean", "mean |p_rollout - p_train|"),
)
DYNAMICS = (
    Panel("actor/grad_norm", "grad norm", log_scale=True),
    Panel("actor/entropy", "entropy"),
    Panel("response_length/mean", "response length"),
)


def smoothed_frame(runs: list[Run], metrics: list[str], window: int) -> pd.DataFrame:
    """Per-seed smoothed finite values of ``metrics``, long: run, model, ablation, seed, metric, step, value."""
    columns = {name: [] for name in ["run", "model", "ablation", "seed", "metric", "step", "value"]}
    for run in runs:
        for metric in metrics:
            if metric not in run.wide.columns:
                continue
            values = run.wide[metric].to_numpy()
            finite = np.isfinite(values)
            n = int(finite.sum())
            if not n:
                continue
            for key, value in (("run", run.run_id), ("model", run.model), ("ablation", run.ablation),
                               ("seed", run.seed), ("metric", metric)):
                columns[key].append(np.repeat(value, n))
            columns["step"].append(run.wide.index.to_numpy()[finite])
            columns["value"].append(trailing_mean(values[finite], window))
    return pd.DataFrame({k: np.concatenate(v) if v else [] for k, v in columns.items()})


@dataclass
class Layout:
    models: list[str]
    ablations: list[str]
    palette: dict[str, str]


def _layout(runs: list[Run], cfg: AnalysisConfig) -> Layout:
    models = order({r.model for r in runs}, cfg.models)
    ablations = ablation_order({r.ablation for r in runs}, cfg.ablations)
    return Layout(models, ablations, ablation_palette(ablations))


def _prepare(data: pd.DataFrame, panel: Panel) -> tuple[dict, dict]:
    """(per-seed lines, mean + CI) for one metric in display units, split by (model, ablation)."""
    data = data[data["metric"] == panel.metric]
    if panel.log_scale:
        data = data[data["value"] > 0].assign(value=lambda d: np.log10(d["value"]))
    per_seed = bin_steps(data, MAX_POINTS, by=["model", "ablation", "run"])
    agg = mean_ci(per_seed, ["model", "ablation", "step"], "value")
    if panel.log_scale:
        per_seed = per_seed.assign(value=10 ** per_seed["value"])
        agg[["mean", "low", "high"]] = 10 ** agg[["mean", "low", "high"]]
    # Split once into dicts: filtering the frames per panel and line was a hot spot.
    return tuple({cell: rows for cell, rows in frame.groupby(["model", "ablation"], observed=True, sort=False)}
                 for frame in (per_seed, agg))


def _draw_panel(ax, per_seed: dict, agg: dict, model: str, layout: Layout) -> bool:
    """Draw one model's lines; returns False when the model logged nothing for this metric.
    ``per_seed`` and ``agg`` map (model, ablation) to that cell's rows (see :func:`_prepare`)."""
    drawn = False
    for ablation in layout.ablations:
        colour = layout.palette[ablation]
        seeds = per_seed.get((model, ablation))
        if seeds is not None:  # all seeds of a cell as one artist: much faster to draw
            lines = [np.column_stack([g["step"].to_numpy(), g["value"].to_numpy()])
                     for _, g in seeds.groupby("run", observed=True, sort=False)]
            ax.add_collection(LineCollection(lines, colors=colour, linewidths=0.6, alpha=0.35))
        mean = agg.get((model, ablation))
        if mean is None:
            continue
        drawn = True
        ax.fill_between(mean["step"].to_numpy(), mean["low"].to_numpy(), mean["high"].to_numpy(),
                        color=colour, alpha=0.2, lw=0)
        ax.plot(mean["step"].to_numpy(), mean["mean"].to_numpy(), color=colour, lw=1.6, label=ablation)
    if not drawn:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="0.5")
    return drawn


def _collapse_points(runs: list[Run], stability: pd.DataFrame, window: int, metric: str) -> pd.DataFrame:
    """Where to mark each collapse on the score panel: (model, ablation, step, smoothed score there)."""
    by_run = {r.run_id: r for r in runs}
    points = []
    for row in stability[stability["collapsed"]].itertuples(index=False):
        run = by_run.get(row.run)
        series = smooth(finite_series(run.wide, metric), window) if run is not None else pd.Series()
        before = series[series.index <= row.collapse_step]
        if before.empty:
            continue
        points.append({"model": row.model, "ablation": row.ablation, "step": int(row.collapse_step),
                       "value": float(before.iloc[-1])})
    return pd.DataFrame(points, columns=["model", "ablation", "step", "value"])


def _grid(n_rows: int, n_models: int):
    """Panels with fixed margins (in inches) and a legend column on the right.

    Fixed margins instead of constrained layout: constrained layout measures every tick label at
    each save and was most of the plotting time. Rows share y (same metric), so only the first
    column carries y tick labels; columns share x, so only the bottom row carries x tick labels.
    """
    wrap = n_rows == 1
    cols = min(n_models, MAX_COLUMNS) if wrap else n_models
    rows = math.ceil(n_models / cols) if wrap else n_rows
    left, right, top, bottom, legend = 0.85, 0.15, 0.35, 0.55, 1.2
    gap_w, gap_h = 0.15, 0.4 if wrap else 0.15
    width = left + cols * PANEL_SIZE[0] + (cols - 1) * gap_w + legend + right
    height = top + rows * PANEL_SIZE[1] + (rows - 1) * gap_h + bottom
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), sharex=True,
                             sharey="all" if wrap else "row", squeeze=False)
    fig.subplots_adjust(left=left / width, right=1 - (legend + right) / width, top=1 - top / height,
                        bottom=bottom / height, wspace=gap_w / PANEL_SIZE[0], hspace=gap_h / PANEL_SIZE[1])
    return fig, axes


def _legend(fig, layout: Layout, with_collapse: bool = False) -> None:
    handles = [plt.Line2D([], [], color=layout.palette[a], lw=2, label=a) for a in layout.ablations]
    if with_collapse:
        handles.append(plt.Line2D([], [], ls="", marker="x", color="k", label="collapse"))
    x = fig.subplotpars.right + 0.1 / fig.get_figwidth()
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(x, fig.subplotpars.top),
               title="ablation", frameon=False)


def subplots(*args, **kwargs):
    """`plt.subplots` in the theme every figure uses (the studies' reports start their figures here)."""
    apply_theme()
    return plt.subplots(*args, **kwargs)


def save_figure(fig, out_dir: str | Path, name: str) -> list[Path]:
    """`name`.png and .pdf in `out_dir`, byte-reproducible, written atomically; closes the figure.
    Every figure of the suite goes through here."""
    out_dir = Path(out_dir)
    written = []
    for fmt in FORMATS:
        target = out_dir / f"{name}.{fmt}"
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=fmt, dpi=150, metadata=REPRODUCIBLE_METADATA[fmt])
        written.append(target)
    plt.close(fig)
    log.info("wrote %s.{%s}", out_dir / name, ",".join(FORMATS))
    return written


def _available(panels: tuple[Panel, ...], runs: list[Run], figure: str) -> list[Panel]:
    logged = set().union(*(r.wide.columns for r in runs)) if runs else set()
    for panel in panels:
        if panel.metric not in logged:
            warnings.warn(f"{figure}: metric {panel.metric!r} not logged by any run; panel skipped",
                          FigureWarning, stacklevel=3)
    return [panel for panel in panels if panel.metric in logged]


def metric_figure(runs, cfg: AnalysisConfig, layout: Layout, out_dir: Path, name: str,
                  panels: tuple[Panel, ...], stability: pd.DataFrame | None = None) -> list[Path]:
    """Rows = metrics, columns = models; one metric: the models in rows of MAX_COLUMNS. With ``stability``
    (the score figure) each collapse is marked on its run's line of the first metric."""
    panels = _available(panels, runs, name)
    if not panels:
        warnings.warn(f"{name}: no metric of this figure was logged; figure skipped", FigureWarning,
                      stacklevel=2)
        return []
    data = smoothed_frame(runs, [p.metric for p in panels], cfg.collapse.smooth_window)
    marks = None if stability is None else _collapse_points(runs, stability, cfg.collapse.smooth_window,
                                                             panels[0].metric)
    fig, axes = _grid(len(panels), len(layout.models))
    for row, panel in enumerate(panels):
        per_seed, agg = _prepare(data, panel)
        for col, model in enumerate(layout.models):
            ax = axes.flat[col] if len(panels) == 1 else axes[row, col]
            drawn = _draw_panel(ax, per_seed, agg, model, layout)
            if marks is not None:
                for ablation, pts in marks[marks["model"] == model].groupby("ablation"):
                    ax.scatter(pts["step"], pts["value"], marker="x", s=30, color=layout.palette[ablation],
                               linewidths=1.5, zorder=5)
            if panel.log_scale and drawn:
                ax.set_yscale("log")
                ax.yaxis.set_minor_locator(NullLocator())  # unlabelled minor ticks cost draw time
            if row == 0:
                ax.set_title(model)
            ax.set_ylabel(panel.label if ax.get_subplotspec().is_first_col() else "")
            if row == len(panels) - 1:
                ax.set_xlabel("step")
    for ax in list(axes.flat)[len(panels) * len(layout.models):]:
        ax.set_visible(False)
    _legend(fig, layout, with_collapse=marks is not None and not marks.empty)
    return save_figure(fig, out_dir, name)


def collapse_heatmap(stability: pd.DataFrame, cfg: AnalysisConfig, out_dir: Path) -> list[Path]:
    with_data = stability[stability["steps"] > 0]
    models = order(set(stability["model"]), cfg.models)
    ablations = ablation_order(set(stability["ablation"]), cfg.ablations)
    frac = pd.DataFrame(np.nan, index=models, columns=ablations)
    labels = pd.DataFrame("", index=models, columns=ablations)  # "" = no such run at all
    for model, ablation in stability[["model", "ablation"]].drop_duplicates().itertuples(index=False):
        labels.loc[model, ablation] = "no data"
    for (model, ablation), group in with_data.groupby(["model", "ablation"]):
        n, k = len(group), int(group["collapsed"].sum())
        frac.loc[model, ablation] = k / n
        steps = group["collapse_step"].dropna()
        labels.loc[model, ablation] = f"{k}/{n}" + (f"\n@{steps.median():.0f}" if len(steps) else "")
    fig, ax = plt.subplots(figsize=(1.2 * len(ablations) + 2.2, 0.7 * len(models) + 1.4), layout="constrained")
    sns.heatmap(frac, vmin=0, vmax=1, cmap="Reds", annot=labels.to_numpy(), fmt="", ax=ax,
                cbar_kws={"label": "fraction of seeds collapsed"}, linewidths=0.5, linecolor="white",
                annot_kws={"fontsize": 8})
    ax.set_xlabel("ablation")
    ax.set_ylabel("model")
    ax.set_title("collapsed seeds / seeds  (@ median collapse step)")
    return save_figure(fig, out_dir, "collapse_heatmap")


def make_figures(runs: list[Run], stability: pd.DataFrame, cfg: AnalysisConfig, out_dir: str | Path) -> list[Path]:
    """Write every figure into ``out_dir``; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    apply_theme()
    with_data = [r for r in runs if r.steps > 0]
    layout = _layout(runs, cfg)
    written = []
    written += metric_figure(with_data, cfg, layout, out_dir, "score", (SCORE,), stability)
    written += metric_figure(with_data, cfg, layout, out_dir, "mismatch", MISMATCH)
    written += metric_figure(with_data, cfg, layout, out_dir, "dynamics", DYNAMICS)
    written += collapse_heatmap(stability, cfg, out_dir)
    return written
