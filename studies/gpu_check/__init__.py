"""The GPU check's runs (benchmarks/gpu_check.sh on a GPU machine) as tables: report.py. The second check's
steps, which benchmarks/gpu_check.py runs as modules: check_preflight.py ... check_cost.py (their shared
command line and report: check_common.py; the model pair they score on: testbed.py)."""
