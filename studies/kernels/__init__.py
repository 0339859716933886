"""The aligned regions' cost; the benchmark is `benchmarks/bench_regions.py` (shared with the GPU check)."""
