"""python -m studies run kernels [--repeats N] --out FILE.json: `benchmarks/bench_regions.py` on this
machine's CPU shapes (its options: --help), its record written to FILE.json."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from benchmarks import bench_regions

    return bench_regions.main(argv)
