#!/bin/bash
# Model Optimizer and our recipe side by side at the SmolLM2 EAGLE-3 recipe's budget, one thread each, both under
# the glibc settings ours sets for itself, then each head decoded with per-prompt records: ../2026-12-05-side-by-side/'s
# pair.sh with one seed for both (the script that ran here had its steps inline; they are the same steps).
#
#   bash benchmarks/records/eagle3-smollm2/2026-12-05-recipe-budget-xeon/pair.sh RUN_DIR DATA SEED [OVERRIDE...]
#
# Run from the repository root. DATA is the recipe's distilled data (its header's command); OVERRIDEs go to ours.
# The recipe trained at eagle3_teacher_temperature 1 then (1.5 since 2026-12-05): pass
# eagle3_teacher_temperature=1.0 to train as it did.
set -euo pipefail
exec bash benchmarks/records/eagle3-smollm2/2026-12-05-side-by-side/pair.sh "$1" "$2" "$3" "$3" ours "${@:4}"
