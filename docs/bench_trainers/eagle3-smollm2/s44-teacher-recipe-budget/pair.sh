#!/bin/bash
# Model Optimizer seed 1 and ours seed 0 with eagle3_teacher_temperature=1.5 side by side at the SmolLM2 EAGLE-3
# recipe's budget, one thread each, both under the glibc settings ours sets for itself, then each decoded with
# per-prompt records (the pairs they complete: ../s43-recipe-budget-xeon/'s ours seed 1 and ours seed 0).
#
#   bash docs/bench_trainers/eagle3-smollm2/s44-teacher-recipe-budget/pair.sh RUN_DIR DATA
#
# Run from the repository root. DATA is the recipe's distilled data (its header's command).
# The script that ran, tidied to take its folders as arguments (it read s43's rows-s1.jsonl and prompts).
set -euo pipefail
R=$(realpath "$1"); DATA=$(realpath "$2")
S29=docs/bench_trainers/eagle3-smollm2/s29-recipe-budget
mkdir -p "$R"
python $S29/prep_rows.py "$DATA" "$R/rows-s1.jsonl" 1 | tee "$R/prep-s1.log"
python $S29/modelopt_job.py "$R/rows-s1.jsonl" "$R/modelopt-s1" 1 336 8116
ENV=$(python -c "import sys; sys.path.insert(0, 'tests/consumers'); import modelopt_env; print(modelopt_env.ensure_env())")
export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1125899906842624
uptime
PYTHONPATH=$ENV HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 /usr/bin/time -v python tests/consumers/modelopt_train.py \
  "$R/modelopt-s1/job.json" > "$R/modelopt-s1.log" 2>&1 &
/usr/bin/time -v specheads train recipes/smollm2-135m/eagle3.yaml "data=[$DATA]" seed=0 eagle3_teacher_temperature=1.5 \
  output_dir="$R/ours-t15-s0" --threads 1 > "$R/ours-t15-s0.log" 2>&1 &
wait
uptime
specheads import-heads --format eagle3 --checkpoint "$R/modelopt-s1/export" --target smollm2 --out "$R/modelopt-s1/native"
# the bench's 32 MT-Bench first turns (`--eval-prompts 32`: one a category in turn)
python -c "import sys; sys.path.insert(0, 'scripts'); from pathlib import Path; from bench_trainers_jobs import eval_prompts; eval_prompts('smollm2', Path(sys.argv[1]), 32)" "$R"
for h in modelopt-s1/native ours-t15-s0; do
  specheads eval --target smollm2 --heads "$R/$h" --prompts "$R/mt-bench-eval.jsonl" --tree dynamic-16 --dtype float32 \
    --num-prompts 32 --max-new-tokens 64 --threads 1 --out "$R/eval-${h%%/*}" > "$R/eval-${h%%/*}.log" 2>&1 &
done
wait
