#!/usr/bin/env bash
# The GPU check in one call, with the machine's own Python (python3, or $PYTHON): torch with Triton and
# transformers; no vLLM, verl, ray or orjson needed. A budget of 480 s on one H200 for the first check's
# steps (the default), 540 s for the second's (--steps preflight,gemm,long,kernels,determinism,cost),
# compilation included; what each measures, and in which order: benchmarks/gpu_check.py. Writes one summary
# (gpu-check-<tag>.md), each step's JSON and one archive (gpu-check-<tag>.tar.gz) to $OUT, else
# benchmarks/results/gpu-check, rewritten after every step.
#
# RLA_COMMIT=<commit> names the commit in the summary where the copied tree has no .git. Wheels put in
# benchmarks/wheels/ (ignored by git; Liger-Kernel's, say) are installed for the steps, without dependencies.
#
#   benchmarks/gpu_check.sh                                   # on the GPU machine
#   benchmarks/gpu_check.sh --steps preflight,gemm,long,kernels,determinism,cost    # the second check
#   PYTHON=.venv/bin/python benchmarks/gpu_check.sh --device cpu --quick      # a dry run on a CPU
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" > /dev/null; then
  echo "gpu_check: no Python at PYTHON=$PYTHON" >&2
  exit 1
fi
export PYTHONUNBUFFERED=1
exec "$PYTHON" benchmarks/gpu_check.py "$@"
