"""The recipe with its teacher at T 2 in place of 1.5 (seeds 0 and 1, side by side), decoded on all 80 MT-Bench
first turns, set against the recipe's own heads of the same seeds and against Model Optimizer's five (runs.json.gz).

    python benchmarks/records/eagle3-smollm2/2026-12-06-mt80/teacher_t2.py OUT.json RUN_DIR

Run from the repository root after assemble.py. RUN_DIR holds `ours-t2-sS/` (`specheads train
recipes/smollm2-135m/eagle3.yaml data=[DATA] seed=S eagle3_teacher_temperature=2.0 output_dir=RUN_DIR/ours-t2-sS
--threads 1`, S = 0 and 1, side by side) and `eval80-ours-t2-sS/` (`specheads eval` as in README.md, on all 80
first turns: `--prompts` the 80-line file, `--num-prompts 80`).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import eval_record, paired, read_json, write_json

HERE = Path(__file__).parent
out, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
runs = read_json(HERE / "runs.json")["runs"]
t2 = {s: eval_record(run_dir / f"eval80-ours-t2-s{s}") for s in (0, 1)}
summaries = {s: json.loads((run_dir / f"ours-t2-s{s}" / "train_summary.json").read_text()) for s in (0, 1)}
ids48 = set(runs["ours-t15-s0"]["per_prompt_48"])


def line(names: list[str], part: str = "mt80") -> list[dict]:
    keys = ("per_prompt_32", "per_prompt_48") if part == "mt80" else ("per_prompt_48",)
    return [{"per_prompt": {k: v for key in keys for k, v in runs[n][key].items()}} for n in names]


ours_t2 = [{"per_prompt": ev["per_prompt"]} for ev in t2.values()]
ours_t2_48 = [{"per_prompt": {k: v for k, v in r["per_prompt"].items() if k in ids48}} for r in ours_t2]
result = {
    "runs": {f"ours-t2-s{s}": {**ev, "step_seconds": summaries[s]["step_seconds"]} for s, ev in t2.items()},
    "recipe_same_seeds": {f"ours-t15-s{s}": runs[f"ours-t15-s{s}"]["mt80"]["tau"] for s in (0, 1)},
    "paired": {
        "t2_over_recipe_mt80": paired(ours_t2, line(["ours-t15-s0", "ours-t15-s1"])),
        "t2_over_recipe_mt48": paired(ours_t2_48, line(["ours-t15-s0", "ours-t15-s1"], "mt48")),
        "t2_over_modelopt_mt80": paired(ours_t2, line([f"modelopt-s{s}" for s in range(5)])),
    },
}
write_json(out, result)
for name, r in result["runs"].items():
    print(
        name,
        round(r["mean_accept_length"], 4),
        r["identical_to_baseline"],
        [round(a, 3) for a in r["accept_rate_per_depth"][:3]],
    )
print("recipe_same_seeds", result["recipe_same_seeds"])
for key, p in result["paired"].items():
    print(key, {k: round(v, 4) if isinstance(v, float) else v for k, v in p.items()})
