"""Gather this record's recipe-budget runs (T 1.5) into runs.json.gz, beside `../2026-12-05-recipe-budget-xeon/`'s
(T 1) they pair with:
each process's `/usr/bin/time -v`, our train summaries, Model Optimizer's out.json, each eval (with its per-prompt
records) and the prompt-by-prompt comparisons (benchmarks/bench_trainers_paired.py).

    python benchmarks/records/eagle3-smollm2/2026-12-05-teacher-recipe-budget/assemble.py XEON_DIR RUN_DIR OUT.json

Run from the repository root. XEON_DIR holds `../2026-12-05-recipe-budget-xeon/`'s pair.sh runs (modelopt-s0/, ours-s0/, ours-s1/, prep-s*.log);
RUN_DIR this record's: pair.sh's modelopt-s1/ and ours-t15-s0/, t15.sh's ours-t15-s1/ and ours-t15-s2/, each
NAME with NAME.log (time -v) and eval-NAME/.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import eval_record as evaluation
from benchmarks.records import paired, time_v, write_json

XEON, HERE = (
    "2026-12-05-recipe-budget-xeon",
    "2026-12-05-teacher-recipe-budget",
)  # the records the runs are of

xeon_dir, run_dir, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

tokens = {
    s: json.loads((xeon_dir / f"prep-s{s}.log").read_text().strip().splitlines()[-1])["tokens"]
    for s in (0, 1)
}
runs = {}
for record, folder, seed in ((XEON, xeon_dir, 0), (HERE, run_dir, 1)):
    mo = json.loads((folder / f"modelopt-s{seed}" / "out.json").read_text())
    losses = [h["loss"] for h in mo["log_history"] if "loss" in h]
    runs[f"modelopt-s{seed}"] = {
        "record": record,
        "trainer": "Model Optimizer 0.47.0, lr 2e-3 and a 10% warm-up (2026-12-02-recipe-budget/modelopt_job.py)",
        "seed": seed,
        **time_v(folder / f"modelopt-s{seed}.log"),
        "loop_s": mo["seconds"]["train"],
        "global_step": mo["global_step"],
        "loss_first_last": [losses[0], losses[-1]],
        "overrides": json.loads((folder / f"modelopt-s{seed}" / "job.json").read_text())["overrides"],
    }
for record, folder, name, seed, extra in (
    (XEON, xeon_dir, "ours-s0", 0, []),
    (XEON, xeon_dir, "ours-s1", 1, []),
    (HERE, run_dir, "ours-t15-s0", 0, ["eagle3_teacher_temperature=1.5"]),
    (HERE, run_dir, "ours-t15-s1", 1, ["eagle3_teacher_temperature=1.5"]),
    (HERE, run_dir, "ours-t15-s2", 2, ["eagle3_teacher_temperature=1.5"]),
):
    if not (folder / name / "train_summary.json").exists():
        continue
    summary = json.loads((folder / name / "train_summary.json").read_text())
    runs[name] = {
        "record": record,
        "trainer": "specheads, recipes/smollm2-135m/eagle3.yaml as it was on 2026-12-05 (T 1)",
        "seed": seed,
        "overrides": [f"seed={seed}", *extra],
        **time_v(folder / f"{name}.log"),
        "loop_s": summary["wall_seconds"],
        "train_summary": summary,
    }
for name, r in runs.items():
    folder = xeon_dir if r["record"] == XEON else run_dir
    r["tokens_seen"] = tokens.get(r["seed"])  # seed 2's rows were not counted apart
    r["eval"] = evaluation(folder / f"eval-{name}")
    if r["tokens_seen"]:
        r["tokens_per_s"] = round(r["tokens_seen"] / r["wall_s"], 1)


def pair(a: list[str], b: list[str]) -> dict:
    return paired([{"per_prompt": runs[n]["eval"]["per_prompt"]} for n in a],
                  [{"per_prompt": runs[n]["eval"]["per_prompt"]} for n in b])  # fmt: skip


t15 = [n for n in runs if n.startswith("ours-t15-")]
t15_paired = [n for n in t15 if not n.endswith("s2")]
comparisons = {
    "ours-t15-s0 vs ours-s0": pair(["ours-t15-s0"], ["ours-s0"]),
    "ours-t15-s0 vs modelopt-s0": pair(["ours-t15-s0"], ["modelopt-s0"]),
    "ours-s1 vs modelopt-s1": pair(["ours-s1"], ["modelopt-s1"]),
    "ours s0+s1 vs modelopt s0+s1": pair(["ours-s0", "ours-s1"], ["modelopt-s0", "modelopt-s1"]),
}
if "ours-t15-s1" in runs:
    comparisons["ours-t15-s1 vs ours-s1"] = pair(["ours-t15-s1"], ["ours-s1"])
    comparisons["ours-t15-s1 vs modelopt-s1"] = pair(["ours-t15-s1"], ["modelopt-s1"])
    comparisons["ours-t15 s0+s1 vs ours s0+s1"] = pair(t15_paired, ["ours-s0", "ours-s1"])
    comparisons["ours-t15 s0+s1 vs modelopt s0+s1"] = pair(t15_paired, ["modelopt-s0", "modelopt-s1"])
if len(t15) == 3:
    comparisons["ours-t15 s0+s1+s2 vs modelopt s0+s1"] = pair(t15, ["modelopt-s0", "modelopt-s1"])
    comparisons["ours-t15 s0+s1+s2 vs ours s0+s1"] = pair(t15, ["ours-s0", "ours-s1"])
result = {"machine": "2-core Intel Xeon (AVX512-BF16, AMX-BF16), fp32, one thread a process", "date": "2026-12-05",
          "budget": {"steps": 200, "batch": 8, "tokens_seen": tokens}, "runs": runs, "paired": comparisons}  # fmt: skip
write_json(out, result)
for name, r in runs.items():
    print(name, round(r["eval"]["mean_accept_length"], 3), r["eval"]["identical_to_baseline"], r["wall_s"],
          r.get("tokens_per_s"), r["peak_rss_mib"], r.get("train_summary", {}).get("eval_seconds"))  # fmt: skip
for k, v in comparisons.items():
    print(k, {x: round(y, 4) if isinstance(y, float) else y for x, y in v.items()})
