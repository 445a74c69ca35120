#!/bin/bash
# Model Optimizer seed 1 and ours seed 0 with eagle3_teacher_temperature=1.5 side by side at the SmolLM2 EAGLE-3
# recipe's budget, one thread each, both under the glibc settings ours sets for itself, then each decoded with
# per-prompt records (the pairs they complete: ../2026-12-05-recipe-budget-xeon/'s ours seed 1 and ours seed 0):
# ../2026-12-05-side-by-side/'s pair.sh with these seeds (the script that ran here had its steps inline; the same steps).
#
#   bash benchmarks/records/eagle3-smollm2/2026-12-05-teacher-recipe-budget/pair.sh RUN_DIR DATA
#
# Run from the repository root. DATA is the recipe's distilled data (its header's command).
set -euo pipefail
exec bash benchmarks/records/eagle3-smollm2/2026-12-05-side-by-side/pair.sh "$1" "$2" 1 0 ours-t15 eagle3_teacher_temperature=1.5
