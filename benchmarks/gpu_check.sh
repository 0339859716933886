#!/usr/bin/env bash
# The GPU check, in one call (about 6-9 minutes on one H200):
#   1. check_fused.py: fused forward == the engine's compiled formulations (Inductor/Triton), bit for
#      bit, at Qwen2.5-7B and Qwen3-8B shapes; eager-aligned and stock counted against the same reference
#   2. check_epilogue.py: whether Inductor on this GPU keeps Qwen2's q/k/v bias inside the GEMM in
#      vLLM's graph (what the `vllm` target assumes) or moves it into RoPE's kernel
#   3. the rounding map on this GPU: the local engine's pieces compiled by Triton, and vLLM's own
#      graphs where the image has vLLM (python -m localrl.roundmap; each must equal target `vllm`)
#   4. the probe against the image's vLLM, where it has one (python -m localrl probe --engine vllm):
#      a random Qwen2.5-1.5B-shape checkpoint, every region subset and both targets against vLLM's real
#      GPU graph - the first measurement of target `vllm` against the engine it models
#   5. bench_regions.py: forward+backward time and activation memory, stock vs aligned-eager vs
#      aligned-fused (vs Liger if installed), per region and per decoder layer, plus a copy bandwidth
# Needs torch with Triton; transformers only for the decoder-layer rows (skipped, with a note, without).
# Results (JSON, log, environment) go to $OUT, else benchmarks/results.
#
#   benchmarks/gpu_check.sh                           # on the GPU machine
#   benchmarks/gpu_check.sh --device cpu --quick      # dry run on a CPU (a minute or two)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

device=cuda; prev=""
for arg in "$@"; do [ "$prev" = "--device" ] 2>/dev/null && device=$arg; prev=$arg; done
tag=$([ "$device" = cuda ] && echo gpu || echo cpu)
case " $* " in *" --quick "*) tag=$tag-quick ;; esac

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  "$PYTHON" -c 'import triton; print("triton", triton.__version__)' 2>/dev/null || echo "triton missing"
  "$PYTHON" -c 'import transformers; print("transformers", transformers.__version__)' 2>/dev/null || echo "transformers missing"
} > "$OUT/env-$tag.txt" 2>&1
cat "$OUT/env-$tag.txt"

status=0
timeout 240 "$PYTHON" benchmarks/check_fused.py "$@" --out "$OUT/fused-check-$tag.json" 2>&1 | tee "$OUT/check-$tag.log" \
  || status=1
timeout 60 "$PYTHON" benchmarks/check_epilogue.py --device "$device" --out "$OUT/epilogue-$tag.json" 2>&1 \
  | tee "$OUT/epilogue-$tag.log" || status=1
for arch in qwen2 qwen3; do
  timeout 120 "$PYTHON" -m localrl.roundmap --engine local --arch "$arch" --json "$OUT/roundmap-local-$arch-$tag.json" \
    2>&1 | grep -v -i warn | tee -a "$OUT/roundmap-$tag.log" || status=1
  if [ "$device" != cpu ] && "$PYTHON" -c 'import vllm' 2>/dev/null; then
    timeout 240 "$PYTHON" -m localrl.roundmap --engine vllm --arch "$arch" --json "$OUT/roundmap-vllm-$arch-$tag.json" \
      2>&1 | grep -v -i -E "warn|info" | tee -a "$OUT/roundmap-$tag.log" || status=1
  fi
done
if [ "$device" != cpu ] && "$PYTHON" -c 'import vllm' 2>/dev/null; then
  ckpt=$(mktemp -d)
  "$PYTHON" benchmarks/random_checkpoint.py --arch qwen2 --shape qwen2.5-1.5b --out "$ckpt" --device "$device" \
    > /dev/null && LOCALRL_DEVICE=$device timeout 420 "$PYTHON" -m localrl probe --engine vllm --model "$ckpt" \
    --n-prompts 16 --max-new-tokens 256 --out "$OUT/probe-vllm-$tag" 2>&1 | tee "$OUT/probe-$tag.log" \
    || status=1
fi
timeout 420 "$PYTHON" benchmarks/bench_regions.py "$@" --min-run-time 0.3 --out "$OUT/regions-$tag.json" 2>&1 \
  | tee "$OUT/bench-$tag.log" || status=1
echo "gpu_check: exit status $status (results in $OUT)"
exit $status
