"""Read run logs (verl file-logger format) into tidy tables.

Layout: ``{runs}/{model}/{ablation}/seed{seed}/``, read through :func:`rla.metricslog.cell_files`
(``metrics.jsonl`` or ``metrics.running.jsonl``, after earlier parts ``metrics.part-*.jsonl`` of a resumed
run); a step logged twice is replaced as a whole by its later record. Cells moved aside by a rerun
(``seed0.replaced-<time>``) are not read. What happens to damaged logs: docs/reference.md; every problem is a
:class:`LogWarning` naming the file and line. Non-numeric values are dropped; ``null`` (orjson's NaN and
+-inf) is read as NaN and kept, flagged in the tidy table's ``finite`` column.

Speed: each line costs one ``json.loads``; values are gathered into flat lists and converted to
numpy once per run, never row by row through pandas.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from rla import metricslog
from rla.cells import REPLACED
from rla.metricslog import LogWarning

log = logging.getLogger(__name__)

SEED_DIR = re.compile(r"^seed(\d+)$")


@dataclass
class Run:
    """One grid cell's metrics: ``wide`` has one row per step (index ``step``), one column per metric."""

    model: str
    ablation: str
    seed: int
    wide: pd.DataFrame
    long: pd.DataFrame  # columns step, metric, value: only values that were logged

    @property
    def run_id(self) -> str:
        return f"{self.model}/{self.ablation}/seed{self.seed}"

    @property
    def steps(self) -> int:
        return len(self.wide.index)


def find_run_dirs(runs_dir: str | Path) -> list[Path]:
    """All ``{model}/{ablation}/seed{N}`` directories under ``runs_dir``, sorted."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"runs directory not found: {runs_dir}")
    found = []
    for cell in sorted(runs_dir.glob("*/*/*")):
        if not cell.is_dir():
            continue
        if SEED_DIR.match(cell.name):
            found.append(cell)
        elif REPLACED in cell.name:  # a cell's earlier run, moved aside by a rerun (rla.cells)
            log.info("%s: an earlier run moved aside; not read", cell)
        elif (cell / metricslog.METRICS).exists():
            warnings.warn(
                f"{cell}: has a {metricslog.METRICS} but its name is not seed<N>; skipped "
                "(expected {model}/{ablation}/seed<N>/)",
                LogWarning,
                stacklevel=2,
            )
    return found


def _to_floats(values: list) -> tuple[np.ndarray, np.ndarray | None]:
    """Logged values as float64, and a mask of the kept ones (None: all kept).

    ``None`` (orjson's NaN/inf) becomes NaN; non-numeric values (strings, lists) are not kept.
    """
    try:
        floats = np.array(values, dtype=np.float64)
        if floats.shape == (len(values),):  # equal-length lists would give a 2-D array
            return floats, None
    except (TypeError, ValueError):
        pass
    keep = np.array([v is None or isinstance(v, (int, float)) for v in values], dtype=bool)
    floats = np.array([math.nan if v is None else float(v) for v, k in zip(values, keep) if k],
                      dtype=np.float64)
    return floats, keep


def _flatten(records: dict[int, dict]) -> tuple[list[int], list[int], list, list[str]]:
    """(steps, metric codes, values, metric names) of all records, in step order."""
    names: dict[str, int] = {}
    codes_of: dict[tuple, list[int]] = {}  # most lines log the same keys: look them up once
    steps, codes, values = [], [], []
    for step in sorted(records):
        data = records[step]
        keys = tuple(data)
        key_codes = codes_of.get(keys)
        if key_codes is None:
            key_codes = codes_of[keys] = [names.setdefault(k, len(names)) for k in keys]
        steps.extend([step] * len(keys))
        codes.extend(key_codes)
        values.extend(data.values())
    return steps, codes, values, list(names)


def load_run(run_dir: str | Path) -> Run:
    """Read one cell directory ``.../{model}/{ablation}/seed{N}``."""
    run_dir = Path(run_dir)
    match = SEED_DIR.match(run_dir.name)
    if match is None:
        raise ValueError(f"{run_dir}: the run directory must be named seed<N>")
    model, ablation, seed = run_dir.parent.parent.name, run_dir.parent.name, int(match.group(1))

    records: dict[int, dict] = {}  # step -> data; a later line replaces an earlier one
    origins: dict[int, str] = {}  # step -> "file:line"
    files = metricslog.cell_files(run_dir)
    for path in files:
        for number, step, data in metricslog.read(path, stacklevel=3):
            records[step] = data
            origins[step] = f"{path}:{number}"

    steps_list, codes_list, values, names = _flatten(records)
    floats, keep = _to_floats(values)
    steps = np.array(steps_list, dtype=np.int64)
    codes = np.array(codes_list, dtype=np.int32)
    if keep is not None:
        dropped = sorted({names[c] for c in codes[~keep]})
        warnings.warn(f"{run_dir}: non-numeric values dropped for metric(s): {', '.join(dropped)}",
                      LogWarning, stacklevel=2)
        steps, codes = steps[keep], codes[keep]

    long = pd.DataFrame({
        "step": steps,
        "metric": pd.Categorical.from_codes(codes, categories=pd.Index(names, dtype=str)),
        "value": floats,
    })
    if keep is not None:
        long["metric"] = long["metric"].cat.remove_unused_categories()
    wide = _widen(steps, codes, names, floats, sorted(records))

    if not records:
        if not files:
            where, why = run_dir, "no metrics file"
        else:
            where = ", ".join(str(p) for p in files)
            why = "empty file" if all(p.stat().st_size == 0 for p in files) else "no readable step"
        warnings.warn(f"{where}: run has no data ({why}); reported with steps=0 (no_data)", LogWarning,
                      stacklevel=2)
    else:
        bad = ~np.isfinite(floats)
        if bad.any():
            bad_names = sorted({names[c] for c in codes[bad]})
            first = origins[int(steps[bad].min())]
            warnings.warn(
                f"{first}: {int(bad.sum())} non-finite value(s) kept and flagged, in: {', '.join(bad_names)} "
                "(first at this line)",
                LogWarning,
                stacklevel=2,
            )
    return Run(model=model, ablation=ablation, seed=seed, wide=wide, long=long)


def _widen(steps: np.ndarray, codes: np.ndarray, names: list[str], values: np.ndarray,
           all_steps: list[int]) -> pd.DataFrame:
    """Scatter (step, metric, value) triples into a step x metric frame (NaN where not logged)."""
    index = pd.Index(all_steps, dtype=np.int64, name="step")
    grid = np.full((len(index), len(names)), np.nan)
    grid[index.get_indexer(steps), codes] = values
    logged = np.bincount(codes, minlength=len(names)) > 0  # a metric whose values were all dropped has no column
    order = np.array([i for i in np.argsort(names, kind="stable") if logged[i]], dtype=int)
    columns = pd.Index([names[i] for i in order], dtype=object, name="metric")
    return pd.DataFrame(grid[:, order], index=index, columns=columns)


def load_runs(runs_dir: str | Path) -> list[Run]:
    """Every run under ``runs_dir``; raises when there is none."""
    run_dirs = find_run_dirs(runs_dir)
    if not run_dirs:
        raise FileNotFoundError(
            f"no runs found under {runs_dir} (expected {{model}}/{{ablation}}/seed<N>/{metricslog.METRICS})"
        )
    runs = []
    for i, run_dir in enumerate(run_dirs, start=1):
        runs.append(load_run(run_dir))
        if i % 10 == 0 or i == len(run_dirs):
            log.info("loaded %d/%d runs", i, len(run_dirs))
    return runs


def tidy_table(runs: list[Run]) -> pd.DataFrame:
    """One long table: run, model, ablation, seed, step, metric, value, finite (categorical labels)."""
    sizes = np.array([len(run.long) for run in runs], dtype=np.int64)
    which = np.repeat(np.arange(len(runs)), sizes)  # row -> run position

    def label(values: list[str]) -> pd.Categorical:
        categories = sorted(set(values))
        position = {name: i for i, name in enumerate(categories)}
        return pd.Categorical.from_codes(np.array([position[v] for v in values], dtype=np.int32)[which]
                                         if len(runs) else np.array([], dtype=np.int32), categories=categories)

    metric = union_categoricals([run.long["metric"] for run in runs], sort_categories=True) if runs \
        else pd.Categorical([])
    value = np.concatenate([run.long["value"].to_numpy() for run in runs]) if runs else np.array([])
    return pd.DataFrame({
        "run": label([run.run_id for run in runs]),
        "model": label([run.model for run in runs]),
        "ablation": label([run.ablation for run in runs]),
        "seed": np.repeat(np.array([run.seed for run in runs], dtype=np.int64), sizes),
        "step": np.concatenate([run.long["step"].to_numpy() for run in runs]) if runs else np.array([], np.int64),
        "metric": metric,
        "value": value,
        "finite": np.isfinite(value),
    })
