#!/bin/bash
# Model Optimizer seed MS beside ours seed OS (the recipe as it ships, plus OVERRIDES) at the SmolLM2 EAGLE-3
# recipe's budget, one thread each, under the same glibc settings, then each decoded with per-prompt records.
# The script that ran (as `pair.sh W DATA 2 3 ours-t15`, then `pair.sh W DATA 3 4 ours-t15`, then
# `pair.sh W DATA 4 2 ours-t1 eagle3_teacher_temperature=1.0`).
#
#   bash benchmarks/records/eagle3-smollm2/2026-12-05-side-by-side/pair.sh RUN_DIR DATA MS OS NAME [OVERRIDES...]
#
# Run from the repository root. DATA is the recipe's distilled data (its header's command).
set -euo pipefail
R=$(realpath "$1"); DATA=$(realpath "$2"); MS=$3; OS=$4; NAME=$5; shift 5
BUDGET=benchmarks/records/eagle3-smollm2/2026-12-02-recipe-budget
mkdir -p "$R"
python $BUDGET/prep_rows.py "$DATA" "$R/rows-s$MS.jsonl" "$MS" | tee "$R/prep-s$MS.log"
python $BUDGET/modelopt_job.py "$R/rows-s$MS.jsonl" "$R/modelopt-s$MS" "$MS" 336 8116
ENV=$(python -c "import sys; sys.path.insert(0, 'tests/consumers'); import modelopt_env; print(modelopt_env.ensure_env())")
export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1125899906842624
uptime
PYTHONPATH=$ENV HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 /usr/bin/time -v python tests/consumers/modelopt_train.py \
  "$R/modelopt-s$MS/job.json" > "$R/modelopt-s$MS.log" 2>&1 &
/usr/bin/time -v specheads train recipes/smollm2-135m/eagle3.yaml "data=[$DATA]" seed="$OS" "$@" \
  output_dir="$R/$NAME-s$OS" --threads 1 > "$R/$NAME-s$OS.log" 2>&1 &
wait
uptime
specheads import-heads --format eagle3 --checkpoint "$R/modelopt-s$MS/export" --target smollm2 --out "$R/modelopt-s$MS/native"
[ -f "$R/mt-bench-eval.jsonl" ] || python -c "import sys; from pathlib import Path; from benchmarks.bench_trainers_jobs import eval_prompts; eval_prompts('smollm2', Path(sys.argv[1]), 32)" "$R"
for h in modelopt-s$MS/native $NAME-s$OS; do
  specheads eval --target smollm2 --heads "$R/$h" --prompts "$R/mt-bench-eval.jsonl" --tree dynamic-16 --dtype float32 \
    --num-prompts 32 --max-new-tokens 64 --threads 1 --out "$R/eval-${h%%/*}" > "$R/eval-${h%%/*}.log" 2>&1 &
done
wait
uptime
