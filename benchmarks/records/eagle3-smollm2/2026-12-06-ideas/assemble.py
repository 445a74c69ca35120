"""Gather the 2026-12-06 runs into runs.json.gz: five settings of the SmolLM2 EAGLE-3 recipe's heads, each
decoded on all 80 MT-Bench first turns and set against the recipe's own heads of the same seeds and against Model
Optimizer's five (`../2026-12-06-mt80/runs.json.gz`).

    python benchmarks/records/eagle3-smollm2/2026-12-06-ideas/assemble.py OUT.json RUN_DIR

Run from the repository root. RUN_DIR holds `eval80-NAME/` for each NAME of VARIANTS (`specheads eval` as in
README.md), and `NAME/` with train_summary.json for the trained ones.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import variants_main

# change -> {seed: the head's folder name in RUN_DIR}
VARIANTS = {
    "logits x0.77": {0: "ours-s0-x0.77"},
    "logits x1.3": {0: "ours-s0-x1.3"},
    "average 160+200": {0: "ours-s0-avg160", 1: "ours-s1-avg160"},
    "decay 1.0": {0: "ours-d1-s0", 1: "ours-d1-s1"},
    "muon_dtype float32": {0: "ours-fp32-s0", 1: "ours-fp32-s1"},
}


if __name__ == "__main__":
    variants_main(VARIANTS, sys.argv)
