"""Analysis settings read from the experiment config.

Only two things are taken from the config file: the ``collapse:`` section (thresholds of the
collapse definition in :mod:`analysis.collapse`) and the ``models`` / ``ablations`` lists (the order
of panels and legend entries). Everything else in the file belongs to other stages and is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rla import config as rla_config
from rla.config import COLLAPSE, collapse_settings, settings_class


class CollapseConfig(settings_class("CollapseConfig", "collapse", COLLAPSE)):
    """Thresholds of the collapse definition (:mod:`analysis.collapse`): a field per key of
    `rla.config.COLLAPSE`, with its default and check."""

    @classmethod
    def from_mapping(cls, section: dict[str, Any] | None) -> "CollapseConfig":
        """Build from a config's ``collapse:`` mapping; unknown keys are an error, missing keys default."""
        return cls(**collapse_settings({"collapse": section}))


@dataclass(frozen=True)
class AnalysisConfig:
    """What the analysis needs from an experiment config."""

    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    models: tuple[str, ...] = ()
    ablations: tuple[str, ...] = ()


def load_config(path: str | Path | None) -> AnalysisConfig:
    """Read the analysis settings from an experiment config file (defaults when ``path`` is None)."""
    if path is None:
        return AnalysisConfig()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    raw = rla_config.load(path)
    try:
        collapse = CollapseConfig.from_mapping(raw.get("collapse"))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from err
    return AnalysisConfig(
        collapse=collapse,
        models=tuple(str(m) for m in raw.get("models") or ()),
        ablations=tuple(str(a) for a in raw.get("ablations") or ()),
    )
