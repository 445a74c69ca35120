"""Gather the 2026-12-06 pairs into runs.json.gz: Model Optimizer seed S beside ours seed S (the recipe
as it ships), for each pair folder given, each process's `/usr/bin/time -v`, ours' train summary, Model
Optimizer's loop time and losses, each eval with its per-prompt records, tokens/s side by side, and whether each
run decoded exactly as the same seed did before (the earlier runs' runs of that seed: the same steps on every
prompt), with every pair since the held-out evaluations read only the teacher's columns (../2026-12-06-teacher-columns's and these).

    python benchmarks/records/eagle3-smollm2/2026-12-06-pairs/assemble.py OUT.json SEED=RUN_DIR [SEED=RUN_DIR ...]

Run from the repository root. RUN_DIR holds `pair.sh RUN_DIR DATA SEED SEED ours-t15`'s runs (modelopt-sS/,
ours-t15-sS/, their .log files, eval-*/ and prep-sS.log, whose last line gives the tokens seed S draws: the
same rows for both trainers).
"""

import json
import statistics
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
STEPS = 200
# where each seed's run was made before (Model Optimizer's on this Xeon; ours at T 1.5, the recipe's teacher)
BEFORE = {
    ("modelopt", 0): "2026-12-05-recipe-budget-xeon",
    ("modelopt", 1): "2026-12-05-teacher-recipe-budget",
    ("modelopt", 2): "2026-12-05-side-by-side",
    ("modelopt", 3): "2026-12-05-side-by-side",
    ("modelopt", 4): "2026-12-05-side-by-side",
    ("ours-t15", 0): "2026-12-05-teacher-recipe-budget",
    ("ours-t15", 1): "2026-12-05-teacher-recipe-budget",
    ("ours-t15", 2): "2026-12-05-teacher-recipe-budget",
    ("ours-t15", 3): "2026-12-05-side-by-side",
    ("ours-t15", 4): "2026-12-05-side-by-side",
}


def earlier(kind: str, seed: int) -> dict:
    folder = BEFORE[(kind, seed)]
    return read_json(HERE.parent / folder / "runs.json")["runs"][f"{kind}-s{seed}"] | {"record": folder}


def span(pairs: dict, key: str) -> list[float]:
    """[lowest, highest] of one ratio over the pairs."""
    return [min(p[key] for p in pairs.values()), max(p[key] for p in pairs.values())]


out = Path(sys.argv[1])
runs, pairs = {}, {}
for arg in sys.argv[2:]:
    seed, run_dir = arg.split("=", 1)
    seed, run_dir = int(seed), Path(run_dir)
    tokens = json.loads((run_dir / f"prep-s{seed}.log").read_text().strip().splitlines()[-1])["tokens"]
    mo, us = f"modelopt-s{seed}", f"ours-t15-s{seed}"
    theirs = modelopt_record(
        run_dir,
        mo,
        tokens,
        record="2026-12-06-pairs",
        trainer="Model Optimizer 0.47.0, lr 2e-3 and a 10% warm-up (2026-12-02-recipe-budget/modelopt_job.py)",
        seed=seed,
        beside=us,
    )
    ours = ours_record(
        run_dir,
        us,
        tokens,
        record="2026-12-06-pairs",
        trainer="specheads, recipes/smollm2-135m/eagle3.yaml as it ships (T 1.5, the held-out teacher columns)",
        seed=seed,
        beside=mo,
        overrides=[f"seed={seed}"],
    )
    runs[mo], runs[us] = with_speeds(theirs, STEPS), with_speeds(ours, STEPS)
    pairs[f"{us} / {mo}"] = side_by_side(runs[us], runs[mo])

before = {name: earlier(name.rsplit("-s", 1)[0], int(name.rsplit("-s", 1)[1])) for name in runs}
columns = read_json(HERE.parent / "2026-12-06-teacher-columns" / "runs.json")
# every pair whose evaluations read only the teacher's columns (../2026-12-06-teacher-columns made one)
since = {"ours-t15-s0 / modelopt-s0 (2026-12-06-teacher-columns)": columns["side_by_side"]} | pairs
result = {
    "machine": "2-core Intel Xeon (AVX512-BF16, AMX-BF16), fp32, one thread a process, side by side",
    "date": "2026-12-06",
    "budget": {"steps": STEPS, "batch": 8},
    "runs": runs,
    "side_by_side": pairs,
    # the same seed's heads decode the same steps on every prompt as before: training did not change
    "same_steps_as_before": {
        name: runs[name]["eval"]["per_prompt"] == before[name]["eval"]["per_prompt"] for name in runs
    },
    "before": {
        name: {"record": b["record"], "tau": b["eval"]["mean_accept_length"]} for name, b in before.items()
    },
    "since_teacher_columns": {
        "pairs": since,
        "tokens_per_s": span(since, "tokens_per_s"),
        "tokens_per_s_mean": round(statistics.fmean(p["tokens_per_s"] for p in since.values()), 3),
        "steps_tokens_per_s": span(since, "steps_tokens_per_s"),
        "peak_rss": span(since, "peak_rss"),
    },
    "paired": paired(
        [r["eval"] for n, r in runs.items() if n.startswith("ours")],
        [r["eval"] for n, r in runs.items() if n.startswith("modelopt")],
    ),
}
write_json(out, result)
for name, r in runs.items():
    print(name, round(r["eval"]["mean_accept_length"], 4), r["eval"]["identical_to_baseline"], r["wall_s"],
          r["tokens_per_s"], r["tokens_per_step_s"], r["peak_rss_mib"], r.get("train_summary", {}).get("eval_seconds"),
          r.get("train_summary", {}).get("step_seconds"), r["loop_s"])  # fmt: skip
for key in ("side_by_side", "same_steps_as_before", "before", "since_teacher_columns"):
    print(key, json.dumps(result[key]))
print("paired", {k: round(v, 4) if isinstance(v, float) else v for k, v in result["paired"].items()})
