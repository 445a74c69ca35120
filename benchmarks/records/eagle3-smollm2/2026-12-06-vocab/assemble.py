"""Gather the 2026-12-06 runs into runs.json.gz: the SmolLM2 EAGLE-3 recipe with larger draft vocabularies
(`draft_vocab_size=16384`, `32768`) and with `draft_head_init=target`, each decoded on all 80 MT-Bench first turns
and set against the recipe's own heads of the same seeds and against Model Optimizer's five
(`../2026-12-06-mt80/runs.json.gz`), prompt by prompt.

    python benchmarks/records/eagle3-smollm2/2026-12-06-vocab/assemble.py OUT.json RUN_DIR

Run from the repository root. RUN_DIR holds `eval80-NAME/` and `NAME/` (with train_summary.json) for each NAME
of VARIANTS (commands in README.md).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import variants_main

# change -> {seed: the head's folder name in RUN_DIR}
VARIANTS = {
    "draft_vocab_size 16384": {0: "ours-v16384-s0"},
    "draft_vocab_size 32768": {0: "ours-v32768-s0"},
    "draft_head_init target": {0: "ours-init-s0", 1: "ours-init-s1"},
}

if __name__ == "__main__":
    variants_main(VARIANTS, sys.argv)
