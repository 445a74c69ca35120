"""Gather the 2026-12-06 pair into runs.json.gz: Model Optimizer seed 0 beside ours seed 0 (the recipe
as it ships, with the held-out evaluations' teacher columns and the loss's gather of 2026-12-06), each
process's `/usr/bin/time -v`, ours' train summary, Model Optimizer's loop time and losses, each eval with its
per-prompt records, tokens/s side by side, and whether each run decoded exactly as the same seed did before
(../2026-12-05-recipe-budget-xeon's Model Optimizer seed 0, ../2026-12-05-teacher-recipe-budget's ours at T 1.5 seed 0: the same steps on every prompt).

    python benchmarks/records/eagle3-smollm2/2026-12-06-teacher-columns/assemble.py RUN_DIR OUT.json

Run from the repository root. RUN_DIR holds pair.sh's runs (modelopt-s0/, ours-t15-s0/, their .log files,
eval-*/ and prep-s0.log, whose last line gives the tokens seed 0 draws: the same rows for both trainers).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import (
    modelopt_record,
    ours_record,
    paired,
    read_json,
    side_by_side,
    with_speeds,
    write_json,
)

HERE = Path(__file__).parent
run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
STEPS = 200
tokens = json.loads((run_dir / "prep-s0.log").read_text().strip().splitlines()[-1])["tokens"]

theirs = modelopt_record(
    run_dir,
    "modelopt-s0",
    tokens,
    record="2026-12-06-teacher-columns",
    trainer="Model Optimizer 0.47.0, lr 2e-3 and a 10% warm-up (2026-12-02-recipe-budget/modelopt_job.py)",
    seed=0,
    beside="ours-t15-s0",
)
ours = ours_record(
    run_dir,
    "ours-t15-s0",
    tokens,
    record="2026-12-06-teacher-columns",
    trainer="specheads, recipes/smollm2-135m/eagle3.yaml as it ships (T 1.5, eval_cache_mib 1024), with the "
    "held-out teacher columns and the loss's gather by indexing (2026-12-06)",
    seed=0,
    beside="modelopt-s0",
    overrides=["seed=0"],
)
runs = {"modelopt-s0": with_speeds(theirs, STEPS), "ours-t15-s0": with_speeds(ours, STEPS)}

before = {
    "modelopt-s0": read_json(HERE.parent / "2026-12-05-recipe-budget-xeon" / "runs.json")["runs"][
        "modelopt-s0"
    ],
    "ours-t15-s0": read_json(HERE.parent / "2026-12-05-teacher-recipe-budget" / "runs.json")["runs"][
        "ours-t15-s0"
    ],
}
side = read_json(HERE.parent / "2026-12-05-side-by-side" / "runs.json")
result = {
    "machine": "2-core Intel Xeon (AVX512-BF16, AMX-BF16), fp32, one thread a process, side by side",
    "date": "2026-12-06",
    "budget": {"steps": STEPS, "batch": 8},
    "runs": runs,
    "side_by_side": side_by_side(runs["ours-t15-s0"], runs["modelopt-s0"]),
    # the same seed's heads decode the same steps on every prompt as before: training did not change
    "same_steps_as_before": {
        name: runs[name]["eval"]["per_prompt"] == before[name]["eval"]["per_prompt"] for name in runs
    },
    "tau_before": {name: before[name]["eval"]["mean_accept_length"] for name in runs},
    "ours_eval_seconds_before": [
        r["train_summary"]["eval_seconds"] for r in side["runs"].values() if "train_summary" in r
    ],
    "side_by_side_before": side["side_by_side"],
    "paired": paired([runs["ours-t15-s0"]["eval"]], [runs["modelopt-s0"]["eval"]]),
}
write_json(out, result)
for name, r in runs.items():
    print(name, round(r["eval"]["mean_accept_length"], 4), r["eval"]["identical_to_baseline"], r["wall_s"],
          r["tokens_per_s"], r["tokens_per_step_s"], r["peak_rss_mib"], r.get("train_summary", {}).get("eval_seconds"),
          r.get("train_summary", {}).get("step_seconds"), r["loop_s"])  # fmt: skip
for key in (
    "side_by_side",
    "same_steps_as_before",
    "tau_before",
    "ours_eval_seconds_before",
    "side_by_side_before",
):
    print(key, json.dumps(result[key]))
print("paired", {k: round(v, 4) if isinstance(v, float) else v for k, v in result["paired"].items()})
