"""Gather the 2026-12-06 runs into runs.json.gz: the SmolLM2 EAGLE-3 recipe with HASS's top-K distillation
(`eagle3_topk_loss=10`) and with `decay=0.65`, each seed decoded on all 80 MT-Bench first turns and set against
the recipe's own heads of the same seeds and against Model Optimizer's five (`../2026-12-06-mt80/runs.json.gz`), prompt by
prompt.

    python benchmarks/records/eagle3-smollm2/2026-12-06-hass/assemble.py OUT.json RUN_DIR

Run from the repository root. RUN_DIR holds `eval80-NAME/` and `NAME/` (with train_summary.json) for each NAME
of VARIANTS (commands in README.md).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import variants_main

# change -> {seed: the head's folder name in RUN_DIR}
VARIANTS = {
    "topk loss 10": {0: "ours-hass-s0", 1: "ours-hass-s1"},
    "decay 0.65": {0: "ours-d065-s0", 1: "ours-d065-s1"},
}

if __name__ == "__main__":
    variants_main(VARIANTS, sys.argv)
