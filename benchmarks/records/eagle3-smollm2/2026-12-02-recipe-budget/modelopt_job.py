"""Model Optimizer's EAGLE-3 job at the SmolLM2 EAGLE-3 recipe's budget, for tests/consumers/modelopt_train.py.

    python benchmarks/records/eagle3-smollm2/2026-12-02-recipe-budget/modelopt_job.py ROWS.jsonl WORK SEED SEQ_LEN DRAFT_VOCAB

Run from the repository root. One epoch over ROWS (prep_rows.py's 1,600) at batch 8 is the recipe's 200 steps
of 8. It is the bench's job (benchmarks/bench_trainers_modelopt.py: its recipe with the bench's changes for this
CPU) with the bench's best variant, lr 2e-3 and a 10% warm-up, which are also our recipe's. training_seq_len
is SEQ_LEN (it pads every row to it; the bench gives it --max-length), and DRAFT_VOCAB is the size of its
draft vocabulary (its calibration takes at most the rows' distinct tokens).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.bench_trainers_modelopt import eagle3_budget, modelopt_job, recipe_eagle3
from specheads.builders.named_targets import resolve_target

rows, work, seed, seq_len, vocab = Path(sys.argv[1]), Path(sys.argv[2]), *map(int, sys.argv[3:6])
budget = eagle3_budget(sum(1 for _ in rows.open()), 1, 8)
layers, _ = recipe_eagle3(Path("recipes/smollm2-135m/eagle3.yaml"))  # the layers ours fuses: HF 2, 15, 27
ctx = {"target": Path(resolve_target("smollm2")), "rows_path": rows.resolve(), "eagle3_layers": layers,
       "max_length": seq_len}  # fmt: skip
work.mkdir(parents=True)
job = modelopt_job(ctx, work.resolve(), budget, seed, "lr 2e-3+warmup 10%", vocab)
(work / "job.json").write_text(json.dumps(job, indent=1))
print(f"{budget['steps']} steps of {budget['batch']}:", *job["overrides"], sep="\n  ")
