"""Gather the 2026-12-06 ablation into ablation.json.gz: the recipe with its loss on the assistant's
tokens alone (`loss_on=assistant`, so its draft vocabulary is counted over them too), seeds 0 and 1, against the
recipe as it ships on the same seeds (../2026-12-05-teacher-recipe-budget) and Model Optimizer's five seeds (../2026-12-05-recipe-budget-xeon,
teacher-recipe-budget and side-by-side), prompt by prompt.

    python benchmarks/records/eagle3-smollm2/2026-12-06-teacher-columns/ablation.py RUN_DIR OUT.json

Run from the repository root. RUN_DIR holds answer-s0/ and answer-s1/ (each `specheads train ... seed=N
loss_on=assistant`, one thread each, side by side), their .log files (time -v) and eval-answer-sN/.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import eval_record, paired, read_json, time_v, write_json

HERE = Path(__file__).parent
run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])


def earlier(folder: str) -> dict:
    return read_json(HERE.parent / folder / "runs.json")["runs"]


runs = {}
for seed in (0, 1):
    name = f"answer-s{seed}"
    runs[name] = {
        "overrides": [f"seed={seed}", "loss_on=assistant"],
        **time_v(run_dir / f"{name}.log"),
        "train_summary": json.loads((run_dir / name / "train_summary.json").read_text()),
        "eval": eval_record(run_dir / f"eval-{name}"),
    }
teacher, xeon, side = (
    earlier("2026-12-05-teacher-recipe-budget"),
    earlier("2026-12-05-recipe-budget-xeon"),
    earlier("2026-12-05-side-by-side"),
)
recipe = [teacher["ours-t15-s0"], teacher["ours-t15-s1"]]
modelopt = [
    xeon["modelopt-s0"],
    teacher["modelopt-s1"],
    side["modelopt-s2"],
    side["modelopt-s3"],
    side["modelopt-s4"],
]
answers = [runs["answer-s0"], runs["answer-s1"]]


def lines(rows: list[dict]) -> list[dict]:
    return [{"per_prompt": r["eval"]["per_prompt"]} for r in rows]


result = {
    "machine": "2-core Intel Xeon (AVX512-BF16, AMX-BF16), fp32, one thread a process, the two runs side by side",
    "date": "2026-12-06",
    "runs": runs,
    "tau": {
        "loss_on=assistant": [r["eval"]["mean_accept_length"] for r in answers],
        "the recipe (loss on every token), seeds 0-1": [r["eval"]["mean_accept_length"] for r in recipe],
        "Model Optimizer, seeds 0-4": [r["eval"]["mean_accept_length"] for r in modelopt],
    },
    "paired": {
        "loss_on=assistant vs the recipe, seeds 0-1": paired(lines(answers), lines(recipe)),
        "loss_on=assistant seeds 0-1 vs Model Optimizer seeds 0-4": paired(lines(answers), lines(modelopt)),
    },
}
write_json(out, result)
for name, r in runs.items():
    s = r["train_summary"]
    print(name, round(r["eval"]["mean_accept_length"], 4), r["eval"]["identical_to_baseline"], r["wall_s"],
          round(s["step_seconds"], 2), s["eval_seconds"], r["peak_rss_mib"])  # fmt: skip
print(json.dumps(result["tau"]))
for k, v in result["paired"].items():
    print(k, {x: round(y, 4) if isinstance(y, float) else y for x, y in v.items()})
