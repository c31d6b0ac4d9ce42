#!/usr/bin/env bash
# The prepared GPU check (docs/gpu.md): one command, at most 9 minutes on one GPU, JSON per stage into OUTDIR.
#
#   bash scripts/gpu_wheels.sh                 # once, where the package index is reachable: fills .whl/
#   bash scripts/gpu_check.sh OUTDIR           # on the GPU machine (repo root, .whl/ carried, no network needed);
#                                              # OUTDIR/00_results.tgz holds every result in one file
#   bash scripts/gpu_check.sh --cpu-smoke OUTDIR   # every stage at tiny size on CPU (CI), DeepSpeed skipped
#   bash scripts/gpu_check.sh --skip-timed OUTDIR  # stages 0 and 2-4 only: a rerun after the benchmarks were kept
#
# Stages (each with its own time cap, its log OUTDIR/<stage>.log, its JSON OUTDIR/<stage>.json; a failure is
# recorded in OUTDIR/summary.json and the next stage still runs):
#   0 versions          install .whl/ into a target folder, print versions and `pip list`; fails fast
#   1 overhead_cuda     python -m benchmarks.overhead (step time vs TRL's GRPOTrainer, A/A floor)
#     loss_overhead_cuda  python -m benchmarks.loss_overhead (each objective's loss + backward vs TRL's)
#   then, concurrently (nothing timed; each process records its own peak memory):
#   2 train_bf16_gc     every method 10 steps in bf16 with gradient checkpointing
#     train_lora        the same with LoRA
#   3 deepspeed_zero2/3 every method 5 steps under accelerate launch with examples/accelerate_configs/ (ZeRO-3 as
#                       two processes, deepspeed_zero3_0/1, half the methods each)
#   4 main_job          accelerate launch examples/train_echo.py: held-out accuracy before/after
#     compare           trl-groupopt compare, 2 methods x 2 seeds on the embedded policy, on the GPU(s) found
set -uo pipefail
cd "$(dirname "$0")/.."

smoke=0 timed=1
while [ "${1:-}" = "--cpu-smoke" ] || [ "${1:-}" = "--skip-timed" ]; do
  if [ "$1" = "--cpu-smoke" ]; then smoke=1; else timed=0; fi
  shift
done
if [ $# -ne 1 ]; then
  echo "usage: bash scripts/gpu_check.sh [--cpu-smoke] [--skip-timed] OUTDIR" >&2
  exit 2
fi
mkdir -p "$1" && OUT="$(cd "$1" && pwd)"
: >"$OUT/stages.tsv"
PY="${PYTHON:-python3}"
SITE="${GPU_CHECK_SITE:-/tmp/site}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export WANDB_DISABLED=true PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
start=$(date +%s)

# stage NAME CAP_SECONDS COMMAND...: COMMAND under `timeout` (killed 10 s after its cap), output in NAME.log, one
# line "name rc seconds cap" in stages.tsv.
stage() {
  local name=$1 cap=$2
  shift 2
  local t0 rc
  t0=$(date +%s%N)
  echo "[$(date -u +%H:%M:%S)] $name: started (cap ${cap} s)"
  timeout --kill-after=10 "$cap" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  local seconds
  seconds=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$seconds" "$cap" >>"$OUT/stages.tsv"
  echo "[$(date -u +%H:%M:%S)] $name: rc=$rc in ${seconds} s; last lines:"
  tail -n 4 "$OUT/$name.log" | sed 's/^/    /'
}

# ---- 0: wheels and versions (fail fast)
if [ "$smoke" -eq 0 ]; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "no wheels in .whl/: run 'bash scripts/gpu_wheels.sh' where the package index is reachable" >&2
    exit 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    >"$OUT/install.log" 2>&1 || { echo "installing .whl/ failed:" >&2; tail -n 20 "$OUT/install.log" >&2; exit 1; }
  export PYTHONPATH="$SITE:$PWD"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # smoke: this environment's packages, as CI installs them
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
stage versions 30 "$PY" scripts/gpu_check_stages.py versions "$OUT/versions.json"
cat "$OUT/versions.log"
if ! tail -n 1 "$OUT/stages.tsv" | awk -F'\t' '$2 != 0 { exit 1 }'; then
  "$PY" scripts/gpu_check_stages.py summary "$OUT" || true
  echo "fail fast: a required module does not import (see $OUT/versions.log)" >&2
  exit 1
fi

# ---- 1: the timed benchmarks, alone on the device
if [ "$timed" -eq 0 ]; then
  echo "--skip-timed: stage 1 (overhead_cuda, loss_overhead_cuda) not run"
elif [ "$smoke" -eq 0 ]; then
  stage overhead_cuda 320 "$PY" -m benchmarks.overhead --device cuda --max-minutes 4.7 --output-dir "$OUT"
  stage loss_overhead_cuda 40 "$PY" -m benchmarks.loss_overhead --device cuda --max-seconds 20 --output-dir "$OUT"
else
  stage overhead_smoke 300 "$PY" -m benchmarks.overhead --smoke --output-dir "$OUT"
  stage loss_overhead_smoke 120 "$PY" -m benchmarks.loss_overhead --smoke --output-dir "$OUT"
fi

# ---- 2-4: training runs; concurrent on the GPU (each CPU-bound, about 10-30 GiB), one after another on a CPU
if [ "$smoke" -eq 0 ]; then
  launch_plain="$PY -m accelerate.commands.launch --num_processes 1 --num_machines 1"
  launch="$launch_plain --mixed_precision bf16"
  stage train_bf16_gc 150 "$PY" scripts/gpu_check_stages.py train "$OUT/train_bf16_gc.json" --modes bf16_gc \
    --max-seconds 135 &
  stage train_lora 150 "$PY" scripts/gpu_check_stages.py train "$OUT/train_lora.json" --modes lora --max-seconds 135 &
  stage deepspeed_zero2 150 $launch --main_process_port 29512 \
    --config_file examples/accelerate_configs/deepspeed_zero2.yaml \
    scripts/gpu_check_stages.py train "$OUT/deepspeed_zero2.json" --modes zero2 --max-seconds 135 &
  # ZeRO-3 in two processes, half the methods each: one process's units took 137-151 s (an earlier unit's engine is
  # not freed, and a cold first unit took 57 s), at the 150 s cap
  for k in 0 1; do
    stage deepspeed_zero3_$k 150 $launch --main_process_port $((29513 + 2 * k)) \
      --config_file examples/accelerate_configs/deepspeed_zero3.yaml \
      scripts/gpu_check_stages.py train "$OUT/deepspeed_zero3_$k.json" --modes zero3 --shard $k/2 --max-seconds 135 &
  done
  stage main_job 150 $launch_plain --main_process_port 29516 \
    examples/train_echo.py --output_dir "$OUT/main_job_run" &
  stage compare 150 "$PY" scripts/gpu_check_stages.py compare "$OUT/compare.json" "$OUT/compare_run" &
  wait
else
  stage train_bf16_gc 150 "$PY" scripts/gpu_check_stages.py train "$OUT/train_bf16_gc.json" --modes bf16_gc --smoke
  stage train_lora 150 "$PY" scripts/gpu_check_stages.py train "$OUT/train_lora.json" --modes lora --smoke
  stage deepspeed_zero2 60 "$PY" scripts/gpu_check_stages.py train "$OUT/deepspeed_zero2.json" --modes zero2 --smoke
  for k in 0 1; do
    stage deepspeed_zero3_$k 60 "$PY" scripts/gpu_check_stages.py train "$OUT/deepspeed_zero3_$k.json" --modes zero3 \
      --shard $k/2 --smoke
  done
  stage main_job 240 "$PY" -m accelerate.commands.launch --cpu --num_processes 1 --num_machines 1 --mixed_precision no \
    examples/train_echo.py --output_dir "$OUT/main_job_run" --max_steps 2 --num_eval_examples 8 \
    --heldout_eval_steps 0 --save_strategy no
  stage compare 150 "$PY" scripts/gpu_check_stages.py compare "$OUT/compare.json" "$OUT/compare_run" --smoke
fi
"$PY" scripts/gpu_check_stages.py main-job "$OUT/main_job.json" "$OUT/main_job_run" || true
"$PY" scripts/gpu_check_stages.py summary "$OUT"
# Everything but the main job's weights in one archive, first in OUTDIR's listing: for a machine that returns few files.
archive="$(mktemp -u)"
tar -czf "$archive" -C "$OUT" --exclude '*.safetensors' --exclude 'checkpoint-*' --exclude 00_results.tgz . &&
  mv "$archive" "$OUT/00_results.tgz"
echo "gpu_check: $(($(date +%s) - start)) s in all; results in $OUT (summary.json, and all in 00_results.tgz)"
awk -F'\t' '$2 != 0 { bad = 1 } END { exit bad }' "$OUT/stages.tsv"
