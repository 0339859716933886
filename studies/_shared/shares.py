"""Each region's Shapley share of the stock mismatch, from a probe's subsets table (torch-free: the probe's
and the scaling study's reports)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from rla.names import FORWARD_TREATMENTS, REGIONS, subset_name
from studies._shared.names import ENGINE_ORDER, MAIN_REFERENCE, SUBSETS

# every subset of the regions by size, then all + the engine's order and the treatments
SETTING_ORDER = tuple(subset_name(c) for c in SUBSETS) + (ENGINE_ORDER,) + FORWARD_TREATMENTS


def training_settings(subsets: pd.DataFrame, reference: str = MAIN_REFERENCE) -> pd.DataFrame:
    """Rows of the training-side settings against one reference, in the fixed order."""
    rows = subsets[(subsets["reference"] == reference) & subsets["setting"].isin(SETTING_ORDER)]
    return rows.sort_values("setting", key=lambda s: s.map(SETTING_ORDER.index), kind="stable").reset_index(drop=True)


def regions_of(text) -> frozenset[str]:
    """The regions of a table's `regions` cell ("", "none" or NaN: none)."""
    if not isinstance(text, str) or text in ("", "none"):
        return frozenset()
    return frozenset(text.split(","))


def region_shares(subsets: pd.DataFrame, metric: str = "mean_abs_dlogprob",
                  reference: str = MAIN_REFERENCE) -> pd.DataFrame:
    """Each region's Shapley share of the stock `metric`, then the summation order and the rest."""
    rows = training_settings(subsets, reference)
    if "treatment" in rows:  # compile / fp16 rows align no region: not part of the region subsets
        rows = rows[rows["treatment"].fillna("") == ""]
    eager = rows[rows["reduction"] == "eager"]
    value = {regions_of(r): v for r, v in zip(eager["regions"], eager[metric])}
    subsets_needed = [frozenset(c) for c in SUBSETS]
    missing = [",".join(sorted(s)) or "none" for s in subsets_needed if s not in value]
    if missing:
        raise ValueError(f"subsets.csv lacks the setting(s) {missing} (reference {reference!r}); "
                         f"shares need all {len(subsets_needed)} subsets of {', '.join(REGIONS)}")
    n = len(REGIONS)
    stock, aligned = value[frozenset()], value[frozenset(REGIONS)]
    out = []
    for region in REGIONS:
        others = [r for r in REGIONS if r != region]
        phi = sum(math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)  # Shapley weight
                  * (value[frozenset(s)] - value[frozenset(s) | {region}])
                  for k in range(n) for s in itertools.combinations(others, k))
        out.append({"component": region, "reduction": phi})
    order_rows = rows[rows["setting"] == ENGINE_ORDER]
    if len(order_rows):
        rest = float(order_rows[metric].iloc[0])
        out.append({"component": "summation order", "reduction": aligned - rest})
    else:
        rest = aligned
    out.append({"component": "remaining", "reduction": rest})
    table = pd.DataFrame(out)
    table["share"] = table["reduction"] / stock if stock > 0 else np.nan
    return table
