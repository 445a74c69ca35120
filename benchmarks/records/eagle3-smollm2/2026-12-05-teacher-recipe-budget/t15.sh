#!/bin/bash
# Ours with eagle3_teacher_temperature=1.5 at the SmolLM2 EAGLE-3 recipe's budget, seed SEED, one thread, then
# decoded with per-prompt records (seeds 1 and 2 ran side by side; neither beside Model Optimizer).
#
#   bash benchmarks/records/eagle3-smollm2/2026-12-05-teacher-recipe-budget/t15.sh RUN_DIR DATA SEED
#
# Run from the repository root after pair.sh (it reads RUN_DIR/mt-bench-eval.jsonl).
# The script that ran, tidied to take its folders as arguments.
set -euo pipefail
R=$(realpath "$1"); DATA=$(realpath "$2"); S=$3
/usr/bin/time -v specheads train recipes/smollm2-135m/eagle3.yaml "data=[$DATA]" seed="$S" eagle3_teacher_temperature=1.5 \
  output_dir="$R/ours-t15-s$S" --threads 1 > "$R/ours-t15-s$S.log" 2>&1
specheads eval --target smollm2 --heads "$R/ours-t15-s$S" --prompts "$R/mt-bench-eval.jsonl" --tree dynamic-16 \
  --dtype float32 --num-prompts 32 --max-new-tokens 64 --threads 1 --out "$R/eval-ours-t15-s$S" > "$R/eval-ours-t15-s$S.log" 2>&1
