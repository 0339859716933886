"""One look for every figure: the ablation palette (from the ablation registry), orders and the theme."""

from __future__ import annotations

import warnings

from rla.names import ABLATIONS

# Each ablation's colour is part of its registry entry (rla.names.ABLATIONS), as is the order.
ABLATION_COLORS: dict[str, str] = {name: entry.color for name, entry in ABLATIONS.items()}
ABLATION_ORDER: tuple[str, ...] = tuple(ABLATION_COLORS)
# Ablations outside the fixed set (a user's own) get these, in order of first appearance.
_EXTRA_COLORS = ("#FB9A99", "#B2DF8A", "#CAB2D6", "#1F78B4", "#777777")


class StyleWarning(UserWarning):
    """An ablation without a fixed colour."""


def order(found: list[str] | set[str], preferred: tuple[str, ...] = ()) -> list[str]:
    """``found`` names ordered: ``preferred`` first (in its order), then the rest sorted."""
    found = set(found)
    head = [name for name in dict.fromkeys(preferred) if name in found]
    return head + sorted(found - set(head))


def ablation_order(found: list[str] | set[str], preferred: tuple[str, ...] = ()) -> list[str]:
    """Ablations in the fixed order (regions, then treatments), then the config's, then others."""
    return order(found, ABLATION_ORDER + tuple(preferred))


def ablation_palette(ablations: list[str]) -> dict[str, str]:
    """Colour per ablation: the fixed mapping, extra colours for names outside it."""
    palette, extra = {}, iter(_EXTRA_COLORS)
    for name in ablations:
        if name in ABLATION_COLORS:
            palette[name] = ABLATION_COLORS[name]
            continue
        colour = next(extra, "#777777")
        warnings.warn(
            f"ablation {name!r} has no fixed colour (fixed: {', '.join(ABLATION_ORDER)}); using {colour}",
            StyleWarning,
            stacklevel=2,
        )
        palette[name] = colour
    return palette


def apply_theme() -> None:
    """The seaborn theme every figure uses."""
    import seaborn as sns  # here: it loads matplotlib's pyplot, which analysis.tables (orders only) need not

    # A fixed title height skips matplotlib's per-draw search for overlapping tick labels.
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.0, rc={"axes.titley": 1.0})
