"""The aligned regions' cost: forward + backward time and bytes saved for backward of stock HF eager,
aligned-eager and aligned-fused, per region and per decoder layer (the benchmark is
`benchmarks/bench_regions.py`, which the GPU check shares; this study runs it through the DAG and
publishes its record per machine kind)."""
