"""Analysis settings read from the experiment config.

Only two things are taken from the config file: the ``collapse:`` section (thresholds of the
collapse definition in :mod:`analysis.collapse`) and the ``models`` / ``ablations`` lists (the order
of panels and legend entries). Everything else in the file belongs to other stages and is ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rla import config as rla_config


@dataclass(frozen=True)
class CollapseConfig:
    """Thresholds of the collapse definition (see :mod:`analysis.collapse` for their meaning)."""

    smooth_window: int = 5
    min_rise: float = 0.05
    drop_frac: float = 0.5
    patience: int = 5
    k3_kl_threshold: float = 0.01
    score_metric: str = "critic/score/mean"
    k3_metric: str = "rollout_corr/k3_kl"
    nonfinite_metrics: tuple[str, ...] = ("actor/pg_loss", "actor/grad_norm")

    def __post_init__(self) -> None:
        checks = {
            "smooth_window": (self.smooth_window, "an integer >= 1", _is_int(self.smooth_window, 1)),
            "patience": (self.patience, "an integer >= 1", _is_int(self.patience, 1)),
            "min_rise": (self.min_rise, "a number > 0", _is_number(self.min_rise) and self.min_rise > 0),
            "drop_frac": (self.drop_frac, "a number in (0, 1]",
                          _is_number(self.drop_frac) and 0 < self.drop_frac <= 1),
            "k3_kl_threshold": (self.k3_kl_threshold, "a number > 0",
                                _is_number(self.k3_kl_threshold) and self.k3_kl_threshold > 0),
        }
        for key, (value, allowed, ok) in checks.items():
            if not ok:
                raise ValueError(f"collapse.{key} = {value!r} is invalid: it must be {allowed}")
        if isinstance(self.nonfinite_metrics, str) or not all(
            isinstance(m, str) for m in self.nonfinite_metrics
        ):
            raise ValueError(
                f"collapse.nonfinite_metrics = {self.nonfinite_metrics!r} is invalid: "
                "it must be a list of metric names"
            )
        object.__setattr__(self, "nonfinite_metrics", tuple(self.nonfinite_metrics))

    @classmethod
    def from_mapping(cls, section: dict[str, Any] | None) -> "CollapseConfig":
        """Build from a config's ``collapse:`` mapping; unknown keys are an error, missing keys default."""
        section = dict(section or {})
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(section) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown key(s) in the collapse section: {', '.join(unknown)}; "
                f"allowed: {', '.join(allowed)}"
            )
        return cls(**section)


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class AnalysisConfig:
    """What the analysis needs from an experiment config."""

    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    models: tuple[str, ...] = ()
    ablations: tuple[str, ...] = ()
    profile: str | None = None


def load_config(path: str | Path | None) -> AnalysisConfig:
    """Read the analysis settings from an experiment config file (defaults when ``path`` is None)."""
    if path is None:
        return AnalysisConfig()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    raw = rla_config.load(path)
    section = raw.get("collapse")
    if section is not None and not isinstance(section, dict):
        raise ValueError(f"{path}: 'collapse' must be a mapping, got {type(section).__name__}")
    try:
        collapse = CollapseConfig.from_mapping(section)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from err
    return AnalysisConfig(
        collapse=collapse,
        models=tuple(str(m) for m in raw.get("models") or ()),
        ablations=tuple(str(a) for a in raw.get("ablations") or ()),
        profile=raw.get("profile"),
    )
