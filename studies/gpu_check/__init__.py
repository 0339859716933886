"""The GPU check's runs (benchmarks/gpu_check.sh on a GPU machine) as tables: report.py."""
