#!/usr/bin/env bash
# The collapse search's stress setting on one GPU, in at most 9 minutes wall-clock, compilation and
# warm start included (experiments/gpu_stress.yaml: bigger models, longer responses, larger batches
# than the CPU affords):
#   1. data, then the warm start of every model (fp32 on the GPU), side by side
#   2. one 1-step cell per model with `all`: compiles the engine's Triton kernels and the fused aligned
#      regions once, into Inductor's on-disk cache, so the cells of stage 3 start warm
#   3. every cell (model x ablation x seed) side by side on the GPU, each stopped at the deadline
#      (SIGTERM: the cell saves a checkpoint, its metrics stay in metrics.running.jsonl; rerunning
#      resumes it); beside them
#      the mismatch at the published Qwen2.5-1.5B / Qwen3-1.7B shapes with 4096-token responses
#      (python -m studies run scaling --factors shape --real; random weights), written point by point
#   4. stability table, summary and figures (python -m analysis all)
# Everything - config, data, models, runs, logs, tables, figures, stage times - goes to $OUT.
#
#   OUT=/path benchmarks/gpu_stress.sh                  # on the GPU machine (LOCALRL_DEVICE=cuda)
#   benchmarks/gpu_stress.sh --device cpu --quick       # dry run on a CPU: tiny models, 2 steps
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_stress}
PYTHON=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}   # the whole script
ANALYSIS_S=${ANALYSIS_S:-60}  # kept back for stage 4
start=$(date +%s)

device=cuda; quick=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=${2:-}; shift 2 || shift ;;
    --quick) quick=--quick; shift ;;
    *) echo "gpu_stress.sh: unknown argument '$1'; allowed: --device cpu|cuda|cuda:N, --quick" >&2; exit 2 ;;
  esac
done
case "$device" in
  cpu|cuda|cuda:[0-9]*) ;;
  *) echo "gpu_stress.sh: --device '$device' is not allowed; allowed: cpu, cuda, cuda:N" >&2; exit 2 ;;
esac
export LOCALRL_DEVICE=$device PYTHONUNBUFFERED=1 WANDB_MODE=disabled

# What the stages import and a bare GPU image may lack (the rig uses verl's own advantages, losses and
# mismatch metrics, and verl imports ray; metrics lines are written with orjson): named in one line within
# seconds, instead of a traceback a minute in.
missing=$("$PYTHON" - 2>/dev/null <<'PY'
import importlib
needed = ["torch", "transformers", "tokenizers", "verl", "ray", "orjson", "pandas", "pyarrow", "yaml",
          "matplotlib", "seaborn"]
missing = []
for name in needed:
    try:
        importlib.import_module(name)
    except Exception:  # absent, or present but broken (verl without ray)
        missing.append(name)
print(" ".join(missing))
PY
) || missing="python ($PYTHON did not run)"
if [ -n "$missing" ]; then
  echo "gpu_stress.sh: $PYTHON cannot import: $missing (it needs torch, transformers, tokenizers, verl, ray, orjson, pandas, pyarrow, pyyaml, matplotlib, seaborn)" >&2
  exit 1
fi
mkdir -p "$OUT/logs"

left() {  # seconds to the deadline, at least 1 (`timeout 0` would mean no limit at all)
  local l=$(( start + BUDGET_S - ANALYSIS_S - $(date +%s) ))
  [ "$l" -lt 1 ] && l=1
  echo "$l"
}
stage() { echo "$1	$(( $(date +%s) - start ))" >> "$OUT/stages.tsv"; echo "[gpu_stress] $(( $(date +%s) - start )) s: $1"; }
: > "$OUT/stages.tsv"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "capability", torch.backends.cpu.get_cpu_capability())'
  "$PYTHON" -c 'import triton; print("triton", triton.__version__)' 2>/dev/null || echo "triton missing"
  echo "device $device ${quick:-full}"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

mapfile -t plan < <("$PYTHON" benchmarks/gpu_stress_config.py $quick --results "$OUT" --out "$OUT/config.yaml")
[ "${#plan[@]}" -eq 4 ] || { echo "gpu_stress.sh: could not write $OUT/config.yaml" >&2; exit 1; }
read -r -a models <<< "${plan[0]}"; read -r -a ablations <<< "${plan[1]}"; read -r -a seeds <<< "${plan[2]}"
steps=${plan[3]}
cfg="$OUT/config.yaml"
echo "[gpu_stress] models ${models[*]}; ablations ${ablations[*]}; seeds ${seeds[*]}; up to $steps steps"

"$PYTHON" -m localrl prepare-data --config "$cfg" --out "$OUT/data" > "$OUT/logs/prepare_data.log" 2>&1 \
  || { echo "gpu_stress.sh: prepare-data failed, see $OUT/logs/prepare_data.log" >&2; exit 1; }
stage data

for m in "${models[@]}"; do
  timeout "$(left)" "$PYTHON" -m localrl warmstart --config "$cfg" --model "$m" --data "$OUT/data" \
    --out "$OUT/models/$m" > "$OUT/logs/warmstart-$m.log" 2>&1 &
done
wait
for m in "${models[@]}"; do
  [ -f "$OUT/models/$m/config.json" ] || { echo "gpu_stress.sh: warm start of $m failed, see $OUT/logs/warmstart-$m.log" >&2; exit 1; }
  grep -h "greedy solve rate" "$OUT/logs/warmstart-$m.log"
done
stage warmstart

train() {  # model ablation seed steps out
  timeout -s TERM -k 30 "$(left)" "$PYTHON" -m localrl train --config "$cfg" --model "$1" --ablation "$2" \
    --seed "$3" --steps "$4" --out "$5" --data "$OUT/data" --model-dir "$OUT/models/$1"
}

if [ -z "$quick" ]; then
  for m in "${models[@]}"; do train "$m" all 0 1 "$OUT/compile/$m" > "$OUT/logs/compile-$m.log" 2>&1 & done
  wait
  stage compile
fi

if [ -z "$quick" ]; then scaling_args=(--factors shape --real --real-length "${REAL_LENGTH:-4096}")
else scaling_args=(--factors shape --archs qwen3 --quick); fi
timeout -s TERM "$(left)" "$PYTHON" -m studies run scaling --out "$OUT/scaling" "${scaling_args[@]}" \
  > "$OUT/logs/scaling.log" 2>&1 &
for m in "${models[@]}"; do for a in "${ablations[@]}"; do for s in "${seeds[@]}"; do
  mkdir -p "$OUT/logs/train/$m/$a"
  ( train "$m" "$a" "$s" "$steps" "$OUT/runs/$m/$a/seed$s" > "$OUT/logs/train/$m/$a/seed$s.log" 2>&1
    echo "$m	$a	$s	$?" >> "$OUT/cells.tsv" ) &
done; done; done
wait
stage train
# exit status per cell: 0 finished, 143 stopped at the deadline (checkpoint kept), anything else failed
sort "$OUT/cells.tsv" | awk -F'\t' '{print "[gpu_stress] cell " $1 "/" $2 "/seed" $3 ": exit " $4}'

"$PYTHON" -m analysis all --runs "$OUT/runs" --config "$cfg" --tables "$OUT/tables" --figures "$OUT/figures" \
  > "$OUT/logs/analysis.log" 2>&1 || { echo "gpu_stress.sh: analysis failed, see $OUT/logs/analysis.log" >&2; exit 1; }
stage analysis
cat "$OUT/tables/summary.md"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv 2>/dev/null >> "$OUT/env.txt"
failed=$(awk -F'\t' '$4 != 0 && $4 != 143' "$OUT/cells.tsv" | wc -l)
echo "[gpu_stress] done in $(( $(date +%s) - start )) s; $failed failed cell(s); results in $OUT"
[ "$failed" -eq 0 ]
