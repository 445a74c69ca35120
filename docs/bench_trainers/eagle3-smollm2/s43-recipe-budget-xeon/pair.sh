#!/bin/bash
# Model Optimizer and our recipe side by side at the SmolLM2 EAGLE-3 recipe's budget, one thread each, both under
# the glibc settings ours sets for itself, then each head decoded with per-prompt records.
#
#   bash docs/bench_trainers/eagle3-smollm2/s43-recipe-budget-xeon/pair.sh RUN_DIR DATA SEED [OVERRIDE...]
#
# Run from the repository root. DATA is the recipe's distilled data (its header's command); OVERRIDEs go to ours.
set -euo pipefail
R=$(realpath "$1"); DATA=$(realpath "$2"); S=$3; shift 3
S29=docs/bench_trainers/eagle3-smollm2/s29-recipe-budget
mkdir -p "$R"
python $S29/prep_rows.py "$DATA" "$R/rows-s$S.jsonl" "$S" | tee "$R/prep-s$S.log"
python $S29/modelopt_job.py "$R/rows-s$S.jsonl" "$R/modelopt-s$S" "$S" 336 8116
ENV=$(python -c "import sys; sys.path.insert(0, 'tests/consumers'); import modelopt_env; print(modelopt_env.ensure_env())")
export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1125899906842624
uptime
PYTHONPATH=$ENV HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 /usr/bin/time -v python tests/consumers/modelopt_train.py \
  "$R/modelopt-s$S/job.json" > "$R/modelopt-s$S.log" 2>&1 &
/usr/bin/time -v specheads train recipes/smollm2-135m/eagle3.yaml "data=[$DATA]" seed="$S" "$@" \
  output_dir="$R/ours-s$S" --threads 1 > "$R/ours-s$S.log" 2>&1 &
wait
uptime
specheads import-heads --format eagle3 --checkpoint "$R/modelopt-s$S/export" --target smollm2 --out "$R/modelopt-s$S/native"
# the bench's 32 MT-Bench first turns (`--eval-prompts 32`: one a category in turn)
python -c "import sys; sys.path.insert(0, 'scripts'); from pathlib import Path; from bench_trainers_jobs import eval_prompts; eval_prompts('smollm2', Path(sys.argv[1]), 32)" "$R"
for h in "modelopt-s$S/native" "ours-s$S"; do
  specheads eval --target smollm2 --heads "$R/$h" --prompts "$R/mt-bench-eval.jsonl" --tree dynamic-16 --dtype float32 \
    --num-prompts 32 --max-new-tokens 64 --threads 1 --out "$R/eval-${h%%/*}" > "$R/eval-${h%%/*}.log" 2>&1 &
done
wait
